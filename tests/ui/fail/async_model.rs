use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
async fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
