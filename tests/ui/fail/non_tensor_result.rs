use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>) -> usize {
    x.rank()
}

fn main() {}
