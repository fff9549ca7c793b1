use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    #[shard(data)]
    let n: usize = x.rank();
    x * n as f32
}

fn main() {}
