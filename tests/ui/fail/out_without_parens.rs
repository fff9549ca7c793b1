use gspmd::prelude::*;

#[gspmd::model(mesh = (data), out = data)]
fn f(x: Tensor<B>) -> Tensor<B> {
    x
}

fn main() {}
