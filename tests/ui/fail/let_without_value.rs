use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    #[shard(data, _)]
    let y;
    y = x.relu();
    y
}

fn main() {}
