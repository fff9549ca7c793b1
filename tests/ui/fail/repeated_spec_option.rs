use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(#[shard(data, _, priority = 1, priority = 2)] x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
