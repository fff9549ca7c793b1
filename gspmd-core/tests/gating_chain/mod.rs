//! The MoE router's gating chain as a program of its own, shared by `tests/fusion.rs`
//! and the `fusion` bench.

use gspmd_core::ir::{Builder, DType, Program, Tensor};

/// Tokens per group.
pub const SEQ: usize = 16;
/// Experts.
pub const EXPERTS: usize = 4;
/// Slots per expert.
pub const CAPACITY: usize = 12;

/// The shapes of the chain's parameters over `groups` groups: `[G, S, E]` (the
/// logits and the one-hot choices) and `[G, S, E, C]` (the slot masks).
pub fn shapes(groups: usize) -> ([usize; 3], [usize; 4]) {
    ([groups, SEQ, EXPERTS], [groups, SEQ, EXPERTS, CAPACITY])
}

/// The gating chain of `models::moe::top2_gating` in the `gspmd` crate over `groups`
/// groups of [`SEQ`] tokens (the example `train_moe`'s shapes): the gates' softmax over
/// the experts, each token's first and second gate (the gates masked by the one-hot
/// choices `first` and `second`, summed over the experts), their normalisation, and
/// the combine weights `gate1 / norm * route1 + gate2 / norm * route2` over
/// `[G, S, E, C]`. Parameters: `logits`, `first`, `second` (`[G, S, E]`), `route1`,
/// `route2` (`[G, S, E, C]`).
pub fn gating_program(groups: usize) -> Program {
    let (gse, full) = shapes(groups);
    let b = Builder::new("gating");
    let logits = b.parameter("logits", gse, DType::F32);
    let first = b.parameter("first", gse, DType::F32);
    let second = b.parameter("second", gse, DType::F32);
    let route1 = b.parameter("route1", full, DType::F32);
    let route2 = b.parameter("route2", full, DType::F32);
    let gates = logits.softmax(-1);
    let gate1 = gates.mul(&first).sum(&[-1]);
    let gate2 = gates.mul(&second).sum(&[-1]);
    let norm = gate1.add(&gate2).add(&gate1.scalar_like(1e-9));
    let spread = |t: &Tensor| t.broadcast_in_dim(full, &[0, 1]);
    let combine = spread(&gate1.div(&norm))
        .mul(&route1)
        .add(&spread(&gate2.div(&norm)).mul(&route2));
    b.finish(&[&combine]).expect("traces")
}
