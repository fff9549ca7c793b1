use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    let h: Tensor<B, D> = x.relu();
    h
}

fn main() {}
