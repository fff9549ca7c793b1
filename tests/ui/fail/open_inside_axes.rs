use gspmd::prelude::*;

#[gspmd::model(mesh = (data, model))]
fn f(#[shard((data, ?), _)] x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
