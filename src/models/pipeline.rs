//! Pipelining as sharding (GSPMD section 3.3): a stack of homogeneous layers whose
//! weights are stacked on a leading *stage* dim split over a mesh axis, run with a
//! shifting buffer inside one [`Builder::scan`](crate::ir::Builder::scan).
//!
//! # The layer contract (stage-vectorised layers)
//!
//! There is no `vmap`: the caller writes the layer once for all stages. A layer function
//! `layer(w, x)` receives
//! - `w`: one tensor per weight, each `[S, ...]` — stage `s`'s weights of the layer it
//!   applies now are `w[k][s]`;
//! - `x`: the activations `[S, mb, ...]` — stage `s`'s microbatch is `x[s]`;
//!
//! and returns `[S, mb, ...]` (the shape of `x`), row `s` computed from `x[s]` and the
//! `w[k][s]` only: stage dims on both sides, e.g. `einsum("sbd,sdf->sbf", x, w)`,
//! elementwise ops, reductions over other dims. It must work for any `S` and `mb`: the
//! un-pipelined reference [`Pipeline::sequential`] calls it with `S = 1` on the whole
//! batch. In-layer sharding (Megatron's split of the hidden dim over `model`, the batch
//! over `data`) comes from the weights' and inputs' annotations as usual.
//!
//! # The schedule
//!
//! Weights are stacked `[S, R, ...]`: `S` stages of `R` layers each, `L = S R` layers.
//! The microbatches enter as `[M, mb, ...]`. The loop state is a buffer `[S, mb, ...]`
//! split over the stage axis on dim 0. Each iteration `t`:
//! 1. stage 0's row is replaced by its next input (a `select` on `iota(S) == 0`: every
//!    device computes its own rows, no communication): microbatch `t` (a
//!    `dynamic_slice` of the inputs by the counter) or, in the circular schedule once
//!    all microbatches have entered, the output that wrapped around from the last
//!    stage;
//! 2. every stage applies its layer(s) to its row;
//! 3. the stage outputs are kept as the scan's per-iteration output (still split over
//!    stages: each device keeps its own);
//! 4. the buffer moves one stage on with `roll(1, 0)`: the one collective-permute of the
//!    iteration.
//!
//! After the loop, the last stage's outputs of the right iterations are sliced out once.
//!
//! - [`Schedule::GPipe`]: stage `s` holds layers `s R .. s R + R` and applies all `R` in
//!   each iteration; `M + S - 1` iterations.
//! - [`Schedule::Circular`]: layer `l` lives on stage `l mod S` as repeat `l div S`
//!   (round-robin); each iteration applies one layer. Stage `s` works at iteration `t`
//!   on item `k = t - s` (microbatch `k mod M`, repeat `k div M`), so it picks its
//!   repeat `r = clamp((t - s) div M, 0, R - 1)`: a stage-split index, applied as the
//!   contraction `einsum("sr,sr..->s..")` of its one-hot with the weights (stage is a
//!   batch dim, the repeat dim whole: no communication; a `take_along_dim` gather
//!   does the same, but the runtime's gather kernel works element by element and is
//!   slower at these sizes); `M R + S - 1` iterations.
//!   The last stage's output of item `k` reaches stage 0 one iteration later but is
//!   needed there only at iteration `k + M`: a queue `[S, M, mb, ...]` (split like
//!   the buffer; only stage 0's row is read) holds it, written and read by
//!   `dynamic_update_slice` / `dynamic_slice` on dim 1 (no communication). Needs
//!   `M >= S`.
//!
//! *Bubbles* are the stage-iterations outside `0 <= t - s < M R'` (`R' = R` circular,
//! 1 GPipe): they compute on the zero initial buffer or on data that never reaches the
//! sliced outputs, so never the loss. Each stage idles `S - 1` of the `M R' + S - 1`
//! iterations ([`Pipeline::bubble_fraction`]): the circular schedule cuts it by
//! running `R` times as many, `R` times shorter, iterations.

use crate::error::Error;
use crate::ir::{Builder, DType, Tensor, einsum};
use crate::params::Params;
use crate::sharding::{DimSharding, Sharding};
use crate::types::Location;

/// How layers are placed on stages and scheduled (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Schedule {
    /// Consecutive layers per stage; every stage applies all its layers per iteration.
    GPipe,
    /// Layers round-robin over stages; one layer per stage and iteration.
    Circular,
}

/// A pipeline of `stages * repeats` homogeneous layers over `microbatches`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pipeline {
    /// The schedule.
    pub schedule: Schedule,
    /// `S`: pipeline stages (the size of the stacked weights' and the buffer's dim 0).
    pub stages: usize,
    /// `R`: layers per stage (the stacked weights' dim 1).
    pub repeats: usize,
    /// `M`: microbatches (the inputs' dim 0).
    pub microbatches: usize,
    /// The mesh axis the stage dim is split over.
    pub axis: &'static str,
}

impl Pipeline {
    /// The GPipe schedule of `stages` stages of `repeats` consecutive layers each, over
    /// the mesh axis `stage`.
    pub fn gpipe(stages: usize, repeats: usize, microbatches: usize) -> Self {
        Pipeline {
            schedule: Schedule::GPipe,
            stages,
            repeats,
            microbatches,
            axis: "stage",
        }
    }

    /// The circular schedule of `stages` stages holding `repeats` layers each
    /// round-robin, over the mesh axis `stage`.
    pub fn circular(stages: usize, repeats: usize, microbatches: usize) -> Self {
        Pipeline {
            schedule: Schedule::Circular,
            ..Pipeline::gpipe(stages, repeats, microbatches)
        }
    }

    /// `L = S R`: the number of layers.
    pub fn layers(&self) -> usize {
        self.stages * self.repeats
    }

    /// How many items pass through a stage: `M` (GPipe) or `M R` (circular).
    fn items(&self) -> usize {
        match self.schedule {
            Schedule::GPipe => self.microbatches,
            Schedule::Circular => self.microbatches * self.repeats,
        }
    }

    /// The scan's trip count: `M + S - 1` (GPipe) or `M R + S - 1` (circular).
    pub fn iterations(&self) -> usize {
        self.items() + self.stages.saturating_sub(1)
    }

    /// The microbatch and the layer stage `stage` applies at iteration `t`, `None` in
    /// a bubble. GPipe applies the stage's `R` layers from the one returned.
    pub fn work(&self, t: usize, stage: usize) -> Option<(usize, usize)> {
        let k = t.checked_sub(stage).filter(|&k| k < self.items())?;
        let (m, r) = (k % self.microbatches, k / self.microbatches);
        Some(match self.schedule {
            Schedule::GPipe => (m, stage * self.repeats),
            Schedule::Circular => (m, r * self.stages + stage),
        })
    }

    /// Idle stage-iterations over all stage-iterations: `(S - 1) / iterations`.
    pub fn bubble_fraction(&self) -> f64 {
        self.stages.saturating_sub(1) as f64 / self.iterations().max(1) as f64
    }

    /// Where layer `l` lives: `(stage, repeat)`, its index in the stacked weights.
    pub fn placement(&self, l: usize) -> (usize, usize) {
        match self.schedule {
            Schedule::GPipe => (l / self.repeats, l % self.repeats),
            Schedule::Circular => (l % self.stages, l / self.stages),
        }
    }

    /// Runs the `L` layers over the microbatches `xs: [M, mb, ...]` with the pipeline
    /// schedule, the weights stacked `[S, R, ...]`; returns the outputs `[M, mb, ...]`.
    /// `layer` follows the [layer contract](self#the-layer-contract-stage-vectorised-layers)
    /// and is traced once, in the body of one scan of [`Pipeline::iterations`]
    /// iterations.
    ///
    /// Errors ([`Error::Shape`] of op `pipeline` at the caller's line; the inputs are
    /// returned in place of the outputs): no stage, repeat or microbatch; inputs of
    /// rank below 2 or whose dim 0 is not `M`; a weight whose leading dims are not
    /// `[S, R]`; the circular schedule with `M < S`; a layer whose output is not shaped
    /// like its input.
    #[track_caller]
    pub fn run(
        &self,
        weights: &[Tensor],
        xs: &Tensor,
        layer: impl Fn(&[Tensor], &Tensor) -> Tensor,
    ) -> Tensor {
        let location = Location::caller();
        if let Err(message) = self.check(weights, xs) {
            return fail(xs, location, message);
        }
        let b = xs.builder();
        let (s, m) = (self.stages, self.microbatches);
        let mut row = xs.shape().to_vec();
        row[0] = s;
        let mut init = vec![self.stage_split(&b.full(row.clone(), xs.dtype(), 0.0))];
        if self.schedule == Schedule::Circular {
            let mut queue = row.clone();
            queue.insert(1, m);
            init.push(self.stage_split(&b.full(queue, xs.dtype(), 0.0)));
        }
        let counter = b.iota([self.iterations()], 0, DType::I32);
        let (_, ys) = b.scan(&[counter], &init, |carry, x| {
            let t = &x[0];
            let entering = self.stage0_input(xs, t, carry.get(1));
            let state = stage_mask(&carry[0].builder(), 0, &row, 0).select(&entering, &carry[0]);
            let out = self.apply(weights, &state, t, &layer, location);
            let shifted = self.stage_split(&out.roll(1, 0));
            let mut next = vec![shifted.clone()];
            if let Some(queue) = carry.get(1) {
                next.push(self.enqueue(queue, &shifted, t));
            }
            (next, vec![out])
        });
        // Item `k` leaves the last stage at iteration `k + S - 1`; the last round's
        // items are the outputs: the iterations are sliced (each device its own
        // stage's), then the last stage's row is picked by summing the rows masked to
        // it over the stage dim (one all-reduce, of `M` microbatches only).
        let start = self.items() - m + s - 1;
        let last = ys[0].slice_axis(0, start, start + m);
        let kept = stage_mask(&b, s - 1, last.shape(), 1).select(&last, &last.scalar_like(0.0));
        kept.sum(&[1])
    }

    /// What is wrong with running on `weights` and `xs`, if anything.
    fn check(&self, weights: &[Tensor], xs: &Tensor) -> Result<(), String> {
        let (s, r, m) = (self.stages, self.repeats, self.microbatches);
        if s == 0 || r == 0 || m == 0 {
            return Err(format!(
                "needs at least one stage, repeat and microbatch, got {s}, {r} and {m}"
            ));
        }
        if xs.rank() < 2 || xs.shape()[0] != m {
            return Err(format!(
                "the inputs must be [microbatches = {m}, microbatch, ...], got {}",
                xs.ty()
            ));
        }
        if let Some(w) = weights.iter().find(|w| w.shape().get(..2) != Some(&[s, r])) {
            return Err(format!(
                "a weight must be stacked [stages = {s}, repeats = {r}, ...], got {}",
                w.ty()
            ));
        }
        if self.schedule == Schedule::Circular && m < s {
            return Err(format!(
                "the circular schedule needs at least as many microbatches as stages, got {m} < {s}"
            ));
        }
        Ok(())
    }

    /// `t` annotated with its dim 0 split over the stage axis (other dims open).
    fn stage_split(&self, t: &Tensor) -> Tensor {
        let dims = (0..t.rank()).map(|d| match d {
            0 => DimSharding::open([self.axis]),
            _ => DimSharding::open(Vec::<String>::new()),
        });
        t.shard(Sharding::new(dims))
    }

    /// What stage 0 takes at iteration `t`, broadcast to the buffer `[S, mb, ...]`:
    /// microbatch `t` while `t < M`, then (circular) the queue's entry `t mod M`.
    fn stage0_input(&self, xs: &Tensor, t: &Tensor, queue: Option<&Tensor>) -> Tensor {
        let rank = xs.rank();
        let zero = t.scalar_like(0.0);
        let mut starts = vec![t];
        starts.extend(std::iter::repeat_n(&zero, rank - 1));
        let mut one = xs.shape().to_vec();
        one[0] = 1;
        let mut row = xs.shape().to_vec();
        row[0] = self.stages;
        let fresh = xs
            .dynamic_slice(&starts, &one)
            .broadcast_in_dim(row.clone(), &(0..rank).collect::<Vec<_>>());
        let Some(queue) = queue else {
            return fresh;
        };
        let m = t.scalar_like(self.microbatches as f64);
        let slot = t.rem(&m);
        let mut starts = vec![&zero, &slot];
        starts.extend(std::iter::repeat_n(&zero, rank - 1));
        let mut block = queue.shape().to_vec();
        block[1] = 1;
        let queued = queue.dynamic_slice(&starts, &block).reshape(row.clone());
        t.lt(&m).broadcast_in_dim(row, &[]).select(&fresh, &queued)
    }

    /// The queue with the shifted buffer written at slot `(t - S + 1) mod M`: stage 0's
    /// row there is item `t - S + 1`, out of the last stage at iteration `t`.
    fn enqueue(&self, queue: &Tensor, shifted: &Tensor, t: &Tensor) -> Tensor {
        let m = self.microbatches as i64;
        let lag = (self.stages as i64 - 1).rem_euclid(m);
        let slot = (t + (m - lag) as f32).rem(&t.scalar_like(m as f64));
        let zero = t.scalar_like(0.0);
        let mut starts = vec![&zero, &slot];
        starts.extend(std::iter::repeat_n(&zero, shifted.rank() - 1));
        let mut block = shifted.shape().to_vec();
        block.insert(1, 1);
        queue.dynamic_update_slice(&shifted.reshape(block), &starts)
    }

    /// Every stage applies its layer(s) of iteration `t` to its row of `state`.
    fn apply(
        &self,
        weights: &[Tensor],
        state: &Tensor,
        t: &Tensor,
        layer: &impl Fn(&[Tensor], &Tensor) -> Tensor,
        location: Location,
    ) -> Tensor {
        let mut x = state.clone();
        let rounds = match self.schedule {
            Schedule::GPipe => self.repeats,
            Schedule::Circular => 1,
        };
        for r in 0..rounds {
            let w: Vec<Tensor> = match self.schedule {
                Schedule::GPipe => weights.iter().map(|w| repeat(w, r)).collect(),
                Schedule::Circular => self.current_repeat(weights, t),
            };
            match layer_step(layer, &w, &x) {
                Ok(out) => x = out,
                Err(message) => return fail(state, location, message),
            }
        }
        x
    }

    /// Each stage's weights `[S, ...]` of its repeat at iteration `t`:
    /// `clamp((t - s) div M, 0, R - 1)` for stage `s`, picked per stage by a one-hot
    /// contraction over the repeat dim.
    fn current_repeat(&self, weights: &[Tensor], t: &Tensor) -> Vec<Tensor> {
        let stage = t.builder().iota([self.stages], 0, DType::I32);
        // `t - s` is clamped at 0 before the (truncating) division: a floor division.
        let r = (t.sub(&stage).max(&t.scalar_like(0.0)))
            .div(&t.scalar_like(self.microbatches as f64))
            .min(&t.scalar_like((self.repeats - 1) as f64));
        let sr = [self.stages, self.repeats];
        let one_hot = (t.builder().iota(sr, 1, DType::I32))
            .eq(&r.broadcast_in_dim(sr, &[0]))
            .convert(DType::F32);
        weights
            .iter()
            .map(|w| {
                let rest: String = ('a'..='p').take(w.rank() - 2).collect();
                einsum(&format!("sr,sr{rest}->s{rest}"), &one_hot, w)
            })
            .collect()
    }

    /// The same layers applied one after the other to the whole batch, without
    /// pipelining (the reference): layer `l` uses the weights at
    /// [`Pipeline::placement`]`(l)`, `layer` is called with `S = 1` on `[1, M mb, ...]`.
    /// Returns `[M, mb, ...]`. Errors as [`Pipeline::run`].
    #[track_caller]
    pub fn sequential(
        &self,
        weights: &[Tensor],
        xs: &Tensor,
        layer: impl Fn(&[Tensor], &Tensor) -> Tensor,
    ) -> Tensor {
        let location = Location::caller();
        if let Err(message) = self.check(weights, xs) {
            return fail(xs, location, message);
        }
        let mut batch = xs.shape()[1..].to_vec();
        batch[0] *= self.microbatches;
        batch.insert(0, 1);
        let mut x = xs.reshape(batch);
        for l in 0..self.layers() {
            let (s, r) = self.placement(l);
            let w: Vec<Tensor> = weights
                .iter()
                .map(|w| repeat(&w.slice_axis(0, s, s + 1), r))
                .collect();
            match layer_step(&layer, &w, &x) {
                Ok(out) => x = out,
                Err(message) => return fail(xs, location, message),
            }
        }
        x.reshape(xs.shape().to_vec())
    }
}

/// A bool tensor of `shape` whose dim `dim` is the stage dim, true at stage `stage`
/// (traced in `b`: loop-invariant, one bool per stage until broadcast).
fn stage_mask(b: &Builder, stage: usize, shape: &[usize], dim: usize) -> Tensor {
    let index = b.iota([shape[dim]], 0, DType::I32);
    index
        .eq(&index.scalar_like(stage as f64))
        .broadcast_in_dim(shape.to_vec(), &[dim])
}

/// `layer(w, x)`, or what is wrong if it does not return `x`'s type.
fn layer_step(
    layer: &impl Fn(&[Tensor], &Tensor) -> Tensor,
    w: &[Tensor],
    x: &Tensor,
) -> Result<Tensor, String> {
    let out = layer(w, x);
    match out.ty() == x.ty() {
        true => Ok(out),
        false => Err(format!(
            "the layer must return its input's type {}, got {}",
            x.ty(),
            out.ty()
        )),
    }
}

/// Repeat `r` of stacked weights `[S, R, ...]`: `[S, ...]`.
fn repeat(w: &Tensor, r: usize) -> Tensor {
    let mut rest = w.shape().to_vec();
    rest.remove(1);
    w.slice_axis(1, r, r + 1).reshape(rest)
}

/// Records the pipeline's error `message` at `location` (unless `like` is poisoned: its
/// error is recorded already) and returns `like` in place of the result.
fn fail(like: &Tensor, location: Location, message: String) -> Tensor {
    if like.id().is_some() {
        like.builder().record_error(Error::Shape {
            op: "pipeline",
            location,
            message,
        });
    }
    like.clone()
}

/// A stage-vectorised residual MLP layer (Megatron's in-layer split when `F` is split
/// over `model`): `x + relu(x w1) w2` per stage, with `x: [S, B, D]`, `w = [w1: [S, D,
/// F], w2: [S, F, D]]`.
pub fn mlp_layer(w: &[Tensor], x: &Tensor) -> Tensor {
    let hidden = einsum("sbd,sdf->sbf", x, &w[0]).relu();
    x + &einsum("sbf,sfd->sbd", &hidden, &w[1])
}

/// The weights of [`mlp_stack()`]: `L = S R` [`mlp_layer`]s stacked `[S, R, ...]`, the
/// stage dim over `stage` and the hidden dim over `model`; [`Pipeline::run`] takes its
/// leaves, `[w1, w2]`.
#[crate::params(mesh = (stage, model))]
pub struct MlpStages {
    /// Into the hidden dim.
    #[shard(stage, _, _, model)]
    pub w1: Tensor<S, R, D, F>,
    /// Out of the hidden dim.
    #[shard(stage, _, model, _)]
    pub w2: Tensor<S, R, F, D>,
}

/// `L = S R` [`mlp_layer`]s over the microbatches `x: [M, B, D]` (`B` per microbatch),
/// weights [`MlpStages`]: with `pipelined`, [`Pipeline::run`]; without, the same layers
/// one after the other ([`Pipeline::sequential`]), the reference.
#[crate::model(mesh = (stage, model))]
pub fn mlp_stack(
    #[shard(_, _, _)] x: Tensor<M, B, D>,
    #[params(S, R, D, F)] w: &MlpStages,
    pipeline: Pipeline,
    pipelined: bool,
) -> Tensor<M, B, D> {
    let weights = w.leaves();
    if pipelined {
        pipeline.run(&weights, &x, mlp_layer)
    } else {
        pipeline.sequential(&weights, &x, mlp_layer)
    }
}

/// The mean squared error of [`mlp_stack()`]'s outputs against `y: [M, B, D]`.
#[crate::model(mesh = (stage, model))]
pub fn mlp_loss(
    #[shard(_, _, _)] x: Tensor<M, B, D>,
    #[shard(_, _, _)] y: Tensor<M, B, D>,
    #[params(S, R, D, F)] w: &MlpStages,
    pipeline: Pipeline,
    pipelined: bool,
) -> Tensor {
    mlp_stack(x, w, pipeline, pipelined).mse(&y)
}
