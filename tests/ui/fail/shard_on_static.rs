use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>, #[shard(data)] layers: usize) -> Tensor<B, D> {
    let _ = layers;
    x
}

fn main() {}
