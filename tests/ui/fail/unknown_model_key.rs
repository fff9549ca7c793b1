use gspmd::prelude::*;

#[gspmd::model(mesh = (data), axes = (model))]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
