use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(#[shard(data, _, name = hidden)] x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
