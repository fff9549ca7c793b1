use gspmd::prelude::*;

#[gspmd::params]
struct Weights {
    #[shard(data, _)]
    w: Tensor<D, F>,
}

fn main() {}
