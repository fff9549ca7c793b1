use gspmd::prelude::*;

#[gspmd::model(mesh = (data, model))]
fn f(#[shard((data, model), data)] x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
