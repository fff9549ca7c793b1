use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor) -> Tensor<> {
    x.sum(&[0, 1])
}

fn main() {}
