//! What the training-step benches share: deterministic inputs and the AdamW step of a
//! traced loss with its initial weights.

use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::train::{Optimizer, TrainStep, step_program};

/// An f32 array of `shape` whose element `k` (row-major) is `f(k)`.
pub fn literal(shape: &[usize], f: impl Fn(usize) -> f32) -> Literal {
    let n: usize = shape.iter().product();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(f).collect()).expect("shape fits"))
}

/// The AdamW (lr 1e-3) training step of `model`'s loss (result 0), training every
/// float parameter from `first_trained` on (not the language model's key `rng`), and
/// deterministic initial weights in `±0.1`.
pub fn adamw_step(model: &Program, first_trained: usize) -> (TrainStep, Vec<Literal>) {
    let trained: Vec<usize> = (first_trained..model.params.len())
        .filter(|&i| model.ty(model.params[i]).dtype == DType::F32)
        .collect();
    let step = step_program(model, 0, &trained, &Optimizer::adamw(1e-3)).expect("builds");
    let initial = trained
        .iter()
        .map(|&i| {
            literal(&model.ty(model.params[i]).shape, |k| {
                ((k * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.2
            })
        })
        .collect();
    (step, initial)
}
