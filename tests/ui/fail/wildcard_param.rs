use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>, _: Tensor<D>) -> Tensor<B, D> {
    x
}

fn main() {}
