use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>) -> Tensor<B, E> {
    x
}

fn main() {}
