use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f<const N: usize>(x: Tensor<B, N>) -> Tensor<B, N> {
    x
}

fn main() {}
