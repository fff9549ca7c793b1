use gspmd::prelude::*;

// Found at any depth of a macro call's tokens, and removed from them.
#[gspmd::model(mesh = (data))]
fn f(x: Tensor<B, D>) -> Tensor<B, D> {
    println!("{:?}", vec![(#[shard(data, _)] x.relu()).rank()]);
    x
}

fn main() {}
