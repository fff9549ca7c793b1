use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<i32, B>) -> Tensor<B, i32> {
    x
}

fn main() {}
