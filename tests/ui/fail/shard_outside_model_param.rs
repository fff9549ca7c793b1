use gspmd::prelude::*;

fn helper(#[shard(data, _)] x: Tensor) -> Tensor {
    x.relu()
}

fn main() {
    let _ = helper;
}
