use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f<T: Clone>(x: Tensor<B, D>, t: T) -> Tensor<B, D> {
    let _ = t.clone();
    x
}

fn main() {}
