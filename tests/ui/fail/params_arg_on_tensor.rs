use gspmd::prelude::*;

#[gspmd::params(mesh = (data))]
struct Weights {
    w: Tensor<D, D>,
}

#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>, #[params(D)] w: Tensor<D, D>, #[params(D, D)] p: &Weights) -> Tensor<B, D> {
    x.matmul(&w).matmul(&p.w)
}

fn main() {}
