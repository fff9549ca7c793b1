use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, 1.5>) -> Tensor {
    x.sum(&[0, 1])
}

fn main() {}
