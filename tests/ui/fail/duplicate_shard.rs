use gspmd::prelude::*;

#[gspmd::model(mesh = (data, model))]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    #[shard(data, _)]
    #[shard(_, model)]
    let y = x.relu();
    y
}

fn main() {}
