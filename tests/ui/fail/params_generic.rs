use gspmd::prelude::*;

#[gspmd::params(mesh = (data))]
struct Weights<T> {
    w: Tensor<D, F>,
    extra: T,
}

fn main() {}
