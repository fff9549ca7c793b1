use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    let parts = vec![#[shard(data, _)] x.relu(), x.exp()];
    parts[0].clone() + parts[1].clone()
}

fn main() {}
