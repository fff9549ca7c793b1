use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>, n: usize) -> Tensor<B, D>
where
    usize: Copy,
{
    let _ = n;
    x
}

fn main() {}
