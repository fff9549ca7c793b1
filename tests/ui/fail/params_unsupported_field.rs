use gspmd::prelude::*;

#[gspmd::params(mesh = (data))]
struct Weights {
    w: Tensor<D, F>,
    rate: f32,
    maybe: Option<Tensor<D>>,
}

fn main() {}
