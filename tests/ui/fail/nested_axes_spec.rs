use gspmd::prelude::*;

#[gspmd::model(mesh = (data, model, pipe))]
fn f(#[shard((data, (model, pipe)), _)] x: Tensor<B, D>) -> Tensor<B, D> {
    x
}

fn main() {}
