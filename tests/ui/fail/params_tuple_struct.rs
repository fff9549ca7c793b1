use gspmd::prelude::*;

#[gspmd::params(mesh = (data))]
struct Weights(Tensor<D, F>);

fn main() {}
