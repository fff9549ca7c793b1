use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, -1>) -> Tensor<B> {
    x.sum(&[1])
}

fn main() {}
