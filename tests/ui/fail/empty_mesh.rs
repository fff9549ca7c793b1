use gspmd::prelude::*;

#[gspmd::model(mesh = ())]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
