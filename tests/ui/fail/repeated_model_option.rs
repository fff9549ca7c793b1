use gspmd::prelude::*;

#[gspmd::model(mesh = (data), mesh = (model))]
fn f(x: Tensor<B>) -> Tensor<B> {
    x
}

fn main() {}
