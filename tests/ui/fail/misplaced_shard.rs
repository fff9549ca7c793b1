use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    let y = x.relu();
    #[shard(data, _)]
    y
}

fn main() {}
