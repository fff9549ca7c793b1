use gspmd::prelude::*;

fn helper(x: &Tensor) -> Tensor {
    #[shard(data, _)]
    let h = x.relu();
    h
}

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    helper(&x)
}

fn main() {}
