use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    #[shard(data, _)]
    let (a, b) = (x.relu(), x.exp());
    a + b
}

fn main() {}
