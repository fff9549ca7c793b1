use gspmd::prelude::*;

#[gspmd::model(mesh = (data, model))]
fn f(
    #[shard(model:(1)1, _)] a: Tensor<B, D>,
    #[shard(model:(0)2, _)] b: Tensor<B, D>,
    #[shard(model, model:(1)2)] c: Tensor<B, D>,
    #[shard((model:(1)4, model:(2)2), _)] d: Tensor<B, D>,
    #[shard(batch:(1)2, _)] e: Tensor<B, D>,
    #[shard(_, _, unreduced = (model:(1)2))] g: Tensor<B, D>,
    #[shard(model:2, _)] h: Tensor<B, D>,
) -> Tensor<B, D> {
    &(&(&a + &b) + &(&c + &d)) + &(&e + &(&g + &h))
}

fn main() {}
