use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(#[shard] x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
