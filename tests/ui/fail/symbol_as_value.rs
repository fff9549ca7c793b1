use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>, w: Tensor<D, D>) -> Tensor<B, D> {
    let _scale = 1.0 / (D as f32).sqrt();
    x.matmul(&w)
}

fn main() {}
