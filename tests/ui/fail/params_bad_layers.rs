use gspmd::prelude::*;

#[gspmd::params(mesh = (data))]
struct Layer {
    w: Tensor<D, D>,
}

#[gspmd::params(mesh = (data))]
struct Weights {
    blocks: Vec<Layer>,
    layers: Stacked<Layer, L, M>,
    more: Vec<Layer, "two">,
}

fn main() {}
