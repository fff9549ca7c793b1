use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D, f64>) -> Tensor<B, D> {
    x
}

fn main() {}
