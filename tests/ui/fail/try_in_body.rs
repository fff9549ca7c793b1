use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>, w: Tensor<D, D>) -> Tensor<B, D> {
    let h = x.matmul(&w)?;
    h
}

fn main() {}
