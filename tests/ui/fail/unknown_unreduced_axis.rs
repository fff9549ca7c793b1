use gspmd::prelude::*;

#[gspmd::model(mesh = (data, model))]
fn f(x: Tensor<B, D>, w: Tensor<D, F>) -> Tensor<B, F> {
    #[shard(data, _, unreduced = (tensor))]
    let y = x.matmul(&w);
    y
}

fn main() {}
