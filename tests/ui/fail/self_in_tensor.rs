use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<Self, D>) -> Tensor<Self, D> {
    x
}

fn main() {}
