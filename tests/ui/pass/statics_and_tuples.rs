//! Static arguments, tuple results with `out = [..]`, a model calling another model,
//! `pub` visibility, doc comments and `cfg` kept.
use gspmd::prelude::*;

/// A layer: `x w + b`.
#[gspmd::model(mesh = (data))]
pub fn layer(x: Tensor<B, D>, w: Tensor<D, D>) -> Tensor<B, D> {
    x.matmul(&w)
}

#[gspmd::model(mesh = (data), out = [(data, _), (_)])]
pub(crate) fn stack(
    #[shard(data, _)] x: Tensor<B, D>,
    w: Tensor<D, D>,
    layers: usize,
    scale: f32,
) -> (Tensor<B, D>, Tensor<B>) {
    let mut h = x;
    for _ in 0..layers {
        h = layer(h, w.clone()) * scale;
    }
    let rows = h.sum(&[1]);
    (h, rows)
}

#[cfg(any())]
#[gspmd::model(mesh = (data))]
fn disabled(x: Tensor<B>) -> Tensor<B> {
    x
}

fn main() {
    let p = stack::trace(stack::Dims { B: 4, D: 8 }, 3, 0.5).unwrap();
    let dots = p.nodes.iter().filter(|n| n.op.name() == "dot_general").count();
    assert_eq!(dots, 3);
    assert_eq!(p.outputs.len(), 2);
    let q = stack::trace_shapes(&[&[4, 8], &[8, 8]], 3, 0.5).unwrap();
    assert_eq!(p, q);
    let mesh = stack::mesh([2]).unwrap();
    assert_eq!(mesh.num_devices(), 2);
    assert!(layer::trace(layer::Dims { B: 2, D: 2 }).is_ok());
}
