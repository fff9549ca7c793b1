use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>, x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
