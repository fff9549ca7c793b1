//! The paper's dense Transformer (GSPMD, arXiv 2105.04663, section 5.1 and its dense
//! scaling table) with its 2-D finalized sharding on a mesh `(X, Y)`: every weight split
//! over both axes (`(X, Y)` on its model and hidden/heads dims), activations `[B, S, M]`
//! split `(X, _, Y)`, the FFN's hidden activations `(X, _, Y)`.
//!
//! The layers run under one [`Builder::scan`] over weights stacked `[L, ...]` with the
//! configuration's remat policy ([`Config::remat`]), so a model of 256 layers is one
//! traced layer: tracing, propagation and partitioning take
//! the same time for any depth. Written for compiling and analysing without data (see
//! `examples/paper_scale.rs`); it runs like any program on small sizes.
//!
//! Mixed precision as the paper's: weights (and so their gradients and the optimizer
//! state) are f32, converted to [`Config::dtype`] (bf16 in the paper) inside each
//! layer, and the activations are of that type; the loss is taken in f32. Left out next
//! to the paper's language model: the vocabulary embedding and softmax (the loss is the
//! mean square of the last layer's output) and dropout.

use crate::ir::{Builder, DType, Program, Remat, ScanOptions, Tensor, einsum};
use crate::models::transformer::causal;
use crate::sharding::{Mesh, Sharding};
use crate::train::{Optimizer, TrainStep, step_program};

/// The sizes of one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Layers.
    pub layers: usize,
    /// Model dim `M`.
    pub model: usize,
    /// FFN hidden dim `H`.
    pub hidden: usize,
    /// Attention heads `N`.
    pub heads: usize,
    /// Dim per head `D`.
    pub head_dim: usize,
    /// Sequences per batch `B`.
    pub batch: usize,
    /// Tokens per sequence `S`.
    pub seq: usize,
    /// The activations' element type (the weights are f32).
    pub dtype: DType,
    /// What the layers' scan keeps for the backward pass (the rest it recomputes).
    pub remat: Remat,
}

impl Config {
    /// Trained parameters: per layer `4 M N D` (attention) plus `2 M H` (FFN).
    pub fn params(&self) -> usize {
        self.layers * (4 * self.model * self.heads * self.head_dim + 2 * self.model * self.hidden)
    }
}

/// The mesh `(x, y)` with axes named `x` and `y`.
pub fn mesh(x: usize, y: usize) -> crate::Result<Mesh> {
    Mesh::new([("x", x), ("y", y)])
}

fn sharding(text: &str) -> Sharding {
    text.parse()
        .unwrap_or_else(|e| panic!("the literal sharding {text} parses: {e}"))
}

/// The forward pass: inputs `x: [B, S, M]`, then the stacked weights `wq, wk, wv: [L,
/// M, N, D]`, `wo: [L, N, D, M]`, `w1: [L, M, H]`, `w2: [L, H, M]`; output the loss.
pub fn forward(c: &Config) -> crate::Result<Program> {
    let b = Builder::new("dense_transformer");
    let (l, m, h, n, d) = (c.layers, c.model, c.hidden, c.heads, c.head_dim);
    let param = |name: &str, shape: Vec<usize>, s: &str| {
        b.parameter(name, shape, DType::F32).annotate(sharding(s))
    };
    let x = (b.parameter("x", vec![c.batch, c.seq, m], c.dtype)).annotate(sharding("(x, _, y)"));
    let wq = param("wq", vec![l, m, n, d], "(_, x, y, _)");
    let wk = param("wk", vec![l, m, n, d], "(_, x, y, _)");
    let wv = param("wv", vec![l, m, n, d], "(_, x, y, _)");
    let wo = param("wo", vec![l, n, d, m], "(_, y, _, x)");
    let w1 = param("w1", vec![l, m, h], "(_, x, y)");
    let w2 = param("w2", vec![l, h, m], "(_, y, x)");
    let options = ScanOptions::new().remat(c.remat);
    let (last, _) = b.scan_with(&[wq, wk, wv, wo, w1, w2], &[x], options, |carried, w| {
        (vec![layer(&carried[0], w)], vec![])
    });
    let y = &last[0].convert(DType::F32);
    let loss = (y * y).mean(&[0, 1, 2]);
    b.finish(&[&loss])
}

/// One pre-norm layer on `x: [B, S, M]` with its weights `w = [wq, wk, wv, wo, w1, w2]`,
/// computed in `x`'s dtype. Each weight goes through a sharding constraint of its own
/// sharding, so that its gradient is constrained alike: reduce-scattered in each
/// iteration of the backward scan, not kept whole for every layer.
fn layer(x: &Tensor, w: &[Tensor]) -> Tensor {
    let pin = |t: Tensor, s: &str| t.shard(sharding(s));
    let split = [
        "(x, y, _)",
        "(x, y, _)",
        "(x, y, _)",
        "(y, _, x)",
        "(x, y)",
        "(y, x)",
    ];
    let w: Vec<Tensor> = w
        .iter()
        .zip(split)
        .map(|(t, s)| pin(t.clone(), s).convert(x.dtype()))
        .collect();
    let a = x.layer_norm(-1, 1e-5);
    let q = pin(einsum("bsm,mnd->bnsd", &a, &w[0]), "(x, y, _, _)");
    let k = pin(einsum("btm,mnd->bntd", &a, &w[1]), "(x, y, _, _)");
    let v = pin(einsum("btm,mnd->bntd", &a, &w[2]), "(x, y, _, _)");
    let scale = 1.0 / (q.shape()[3] as f32).sqrt();
    let scores = causal(&(einsum("bnsd,bntd->bnst", &q, &k) * scale));
    let context = einsum("bnst,bntd->bnsd", &scores.softmax(-1), &v);
    let attended = pin(x + &einsum("bnsd,ndm->bsm", &context, &w[3]), "(x, _, y)");
    let hidden = pin(
        einsum("bsm,mh->bsh", &attended.layer_norm(-1, 1e-5), &w[4]).gelu(),
        "(x, _, y)",
    );
    pin(
        &attended + &einsum("bsh,hm->bsm", &hidden, &w[5]),
        "(x, _, y)",
    )
}

/// The training step of [`forward`]: plain SGD (no optimizer state), every weight
/// trained.
pub fn step(c: &Config) -> crate::Result<TrainStep> {
    step_with(c, &Optimizer::sgd(1e-3, 0.0))
}

/// The training step of [`forward`] with `optimizer` (the paper's: Adafactor, its
/// second moments factored), every weight trained.
pub fn step_with(c: &Config, optimizer: &Optimizer) -> crate::Result<TrainStep> {
    let model = forward(c)?;
    step_program(&model, 0, &[1, 2, 3, 4, 5, 6], optimizer)
}

/// One model compiled on the mesh `(x, y)`: what one device holds and receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// Size of the first mesh axis.
    pub x: usize,
    /// Size of the second mesh axis.
    pub y: usize,
    /// Peak bytes per device.
    pub memory: usize,
    /// Bytes received per device per step.
    pub bytes: usize,
}

/// The paper's scaling claims checked on one model across meshes, each as a failure
/// message (none if they hold within `tolerance`, relative):
/// - memory is O(1/XY): memory x devices is the same at every point as at the first;
/// - communication is O(1/X) + O(1/Y): the bytes fit `a/X + b/Y` at every point, each
///   term with its ring algorithm's factor — `a (1 - 1/Y) / X` (collectives over `Y` of
///   values split over `X`: activations) plus `b (1 - 1/X) / Y` (over `X` of values
///   split over `Y`: weights) — with `a, b >= 0` fitted by least squares on the
///   relative error.
pub fn scaling_failures(points: &[Point], tolerance: f64) -> Vec<String> {
    let mut failures = Vec::new();
    let Some(first) = points.first() else {
        return failures;
    };
    let total = |p: &Point| (p.memory * p.x * p.y) as f64;
    for p in points {
        let ratio = total(p) / total(first);
        if (ratio - 1.0).abs() > tolerance {
            failures.push(format!(
                "memory x devices on ({}, {}) is {ratio:.3} times that on ({}, {}): not O(1/XY)",
                p.x, p.y, first.x, first.y
            ));
        }
    }
    // Least squares of sum_i (a u_i + b v_i - 1)^2 with u = (1 - 1/Y)/(X bytes) and
    // v = (1 - 1/X)/(Y bytes).
    let rows: Vec<(f64, f64)> = (points.iter())
        .map(|p| {
            let (x, y, bytes) = (p.x as f64, p.y as f64, p.bytes.max(1) as f64);
            ((1.0 - 1.0 / y) / (x * bytes), (1.0 - 1.0 / x) / (y * bytes))
        })
        .collect();
    let (mut uu, mut uv, mut vv, mut u1, mut v1) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(u, v) in &rows {
        (uu, uv, vv, u1, v1) = (uu + u * u, uv + u * v, vv + v * v, u1 + u, v1 + v);
    }
    let det = uu * vv - uv * uv;
    let (a, b) = if det.abs() > f64::EPSILON * uu * vv {
        ((u1 * vv - v1 * uv) / det, (v1 * uu - u1 * uv) / det)
    } else {
        (f64::NAN, f64::NAN)
    };
    if !(a >= 0.0 && b >= 0.0) {
        failures.push(format!(
            "bytes per device do not fit a/X + b/Y with a, b >= 0 (a = {a:.3e}, b = {b:.3e})"
        ));
        return failures;
    }
    for (p, &(u, v)) in points.iter().zip(&rows) {
        let fit = a * u + b * v;
        if (fit - 1.0).abs() > tolerance {
            failures.push(format!(
                "bytes per device on ({}, {}) are {} but a/X + b/Y gives {:.0}: not O(1/X) + O(1/Y)",
                p.x,
                p.y,
                p.bytes,
                fit * p.bytes as f64
            ));
        }
    }
    failures
}
