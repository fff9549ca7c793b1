use gspmd::prelude::*;

#[gspmd::model(mesh = (data))]
struct Model {
    x: Tensor,
}

fn main() {}
