use gspmd::prelude::*;

/// Megatron MLP.
#[gspmd::model(mesh = (data, model))]
pub fn mlp(
    #[shard(data, _)] x: Tensor<B, D>,
    #[shard(_, model)] w1: Tensor<D, F>,
    #[shard(model, _)] w2: Tensor<F, D>,
) -> Tensor<B, D> {
    #[shard(data, model)]
    let h = x.matmul(&w1).relu();
    h.matmul(&w2)
}

#[test]
fn scratch() {
    let p = mlp::trace(mlp::Dims { B: 8, D: 16, F: 64 }).unwrap();
    println!("{p}");
    let p = mlp::trace_shapes(&[&[8, 16], &[16, 64], &[64, 16]]).unwrap();
    println!("{p}");
    println!("{}", mlp::trace_shapes(&[&[8, 16], &[17, 64], &[64, 16]]).unwrap_err());
}
