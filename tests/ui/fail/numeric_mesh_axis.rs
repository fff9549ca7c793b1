use gspmd::prelude::*;

#[gspmd::model(mesh = (0, 1))]
fn f(x: Tensor<B>) -> Tensor<B> {
    x
}

fn main() {}
