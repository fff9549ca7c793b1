use gspmd::prelude::*;

#[gspmd::params(mesh = (data, model))]
struct Weights {
    #[shard(data, model, _)]
    w: Tensor<D, F>,
}

fn main() {}
