use gspmd::prelude::*;

// All problems are reported at once, and the function is still emitted: the type
// error in the body (`x.rank()` is not a tensor) is reported too.
#[gspmd::model(mesh = (data, model))]
fn f(#[shard(dta, _, _)] x: Tensor<B, D>, #[shard(model, model)] w: Tensor<D, F>) -> Tensor<B, F> {
    let y: Tensor = x.rank();
    y.matmul(&w)
}

fn main() {}
