//! A GRU cell under `scan` whose new hidden state is both the next carry and the
//! per-step output (JAX's `return h, h`), trained with `gspmd::train` on a 2x2
//! [`ThreadMesh`] and on the [`Reference`] backend: the losses agree step by step
//! and fall. The backward body takes the two cotangents of the one value as two
//! parameters and adds them up.
//!
//! Tolerance between the mesh and the reference: |got - want| <= 1e-5 * max(1, |want|)
//! (f32 sums in another order).

use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::train::{Optimizer, Trainer, step_program};

/// A GRU over `T` steps of a batch split over `data`, its hidden units over `model`;
/// the loss is the mean squared error of every step's hidden state against `targets`.
#[gspmd::model(mesh = (data, model))]
fn gru(
    #[shard(_, data, _)] xs: Tensor<T, B, D>,
    #[shard(_, data, model)] targets: Tensor<T, B, H>,
    #[shard(data, model)] h0: Tensor<B, H>,
    #[shard(_, model)] wz: Tensor<D, H>,
    #[shard(_, model)] uz: Tensor<H, H>,
    #[shard(_, model)] wr: Tensor<D, H>,
    #[shard(_, model)] ur: Tensor<H, H>,
    #[shard(_, model)] wn: Tensor<D, H>,
    #[shard(_, model)] un: Tensor<H, H>,
) -> Tensor {
    let b = xs.builder();
    let (_, hs) = b.scan(&[xs], &[h0], |c, x| {
        let (h, x) = (&c[0], &x[0]);
        let z = x.matmul(&wz).add(&h.matmul(&uz)).logistic();
        let r = x.matmul(&wr).add(&h.matmul(&ur)).logistic();
        let n = x.matmul(&wn).add(&r.mul(h).matmul(&un)).tanh();
        let h_new = h.add(&z.mul(&n.sub(h)));
        (vec![h_new.clone()], vec![h_new])
    });
    hs[0].mse(&targets)
}

const DIMS: gru::Dims = gru::Dims {
    T: 4,
    B: 4,
    D: 6,
    H: 8,
};
const WEIGHTS: [&str; 6] = ["wz", "uz", "wr", "ur", "wn", "un"];

/// A deterministic f32 array of `shape`, values in `[-scale, scale)`, different for
/// each `seed`.
fn values(shape: &[usize], seed: usize, scale: f32) -> Literal {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| scale * (((i * 37 + seed * 101) % 61) as f32 / 30.5 - 1.0))
        .collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
}

fn initial() -> Vec<Literal> {
    let (d, h) = (DIMS.D, DIMS.H);
    (0..6)
        .map(|i| match i % 2 {
            0 => values(&[d, h], 10 + i, 0.4),
            _ => values(&[h, h], 10 + i, 0.3),
        })
        .collect()
}

/// One fixed batch (inputs, targets, initial hidden state): the losses fall as the GRU fits it.
fn batch() -> Vec<Literal> {
    vec![
        values(&[DIMS.T, DIMS.B, DIMS.D], 1, 1.0),
        values(&[DIMS.T, DIMS.B, DIMS.H], 2, 0.5),
        values(&[DIMS.B, DIMS.H], 3, 0.5),
    ]
}

#[test]
fn gru_returning_its_carry_as_its_output_trains_on_the_mesh_as_on_the_reference() {
    let model = gru::trace(DIMS).unwrap();
    let step = step_program(&model, 0, &WEIGHTS, &Optimizer::adamw(0.05)).unwrap();
    let mesh = gru::mesh([2, 2]).unwrap();
    let mut on_mesh = Trainer::on_mesh(step.clone(), mesh, initial()).unwrap();
    let mut reference = Trainer::reference(step, initial()).unwrap();
    let mut losses = Vec::new();
    for k in 0..5 {
        let got = on_mesh.step(&batch()).unwrap();
        let want = reference.step(&batch()).unwrap();
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "step {k}: loss {got} on the mesh, {want} on the reference"
        );
        losses.push(want);
    }
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "losses do not fall: {losses:?}"
    );
}
