use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f<'a>(x: Tensor<B, D>, label: &'a str) -> Tensor<B, D> {
    x.named(label)
}

fn main() {}
