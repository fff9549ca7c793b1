use gspmd::prelude::*;

#[gspmd::model(mesh = (data), out = (data))]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
