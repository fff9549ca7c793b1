use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(pair: (Tensor<B, D>, Tensor<B, D>)) -> Tensor<B, D> {
    pair.0 + pair.1
}

fn main() {}
