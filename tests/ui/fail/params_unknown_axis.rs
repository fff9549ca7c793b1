use gspmd::prelude::*;

#[gspmd::params(mesh = (data, model))]
struct Weights {
    #[shard(data, expert)]
    w: Tensor<D, F>,
}

fn main() {}
