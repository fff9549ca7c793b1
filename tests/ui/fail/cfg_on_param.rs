use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>, #[cfg(any())] w: Tensor<D, D>) -> Tensor<B, D> {
    x
}

fn main() {}
