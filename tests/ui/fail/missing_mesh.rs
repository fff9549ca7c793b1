use gspmd::prelude::*;

#[gspmd::model]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
