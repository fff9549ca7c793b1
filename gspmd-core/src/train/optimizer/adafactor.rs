//! Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear
//! Memory Cost"): [`scale_by_factored_rms`], [`scale_by_adafactor_step`] and the
//! optimizer [`Adafactor`].
//!
//! For a weight of rank >= 2 whose last two dims are both at least
//! `min_dim_size_to_factor`, the second moment is kept factored over those dims: a row
//! accumulator (the weight's shape without its last dim) and a column accumulator
//! (without its second-to-last dim). Each keeps the weight's sharding on the dims it
//! keeps, so the state is sharded like the weight's dims.

use super::Optimizer;
use super::chain::Chain;
use super::clip::clip_by_block_rms;
use super::decay::{Mask, add_decayed_weights};
use super::emit::Emitter;
use super::scale::scale;
use super::transform::{Param, Slot, Transform, check_hyper_parameters, positive};
use crate::error::Result;
use crate::ir::{UnaryOp, ValueId};
use crate::train::Schedule;

/// The update over the square root of a (factored) second moment.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ScaleByFactoredRms {
    decay_rate: f32,
    eps: f32,
    min_dim_size_to_factor: usize,
}

/// Adafactor's second-moment scaling (optax's `scale_by_factored_rms`, the paper's
/// Algorithms 4 and 5): at step `t = 1, 2, ..` with `beta_t = 1 - t^(-decay_rate)` (a
/// scalar input, `second_moment_decay`) and `s = u^2 + eps`: for a factored weight
/// (see the module), `r = beta_t r + (1 - beta_t) mean_last(s)`,
/// `c = beta_t c + (1 - beta_t) mean_second_last(s)` (slots `v_row`, `v_col`) and
/// `v = r c / mean_last(r)` broadcast back; else `v = beta_t v + (1 - beta_t) s` (slot
/// `v`). Passes on `u / sqrt(v)`. `decay_rate` in `(0, 1]`, `eps > 0`.
pub fn scale_by_factored_rms(
    decay_rate: f32,
    eps: f32,
    min_dim_size_to_factor: usize,
) -> Optimizer {
    Optimizer::new(ScaleByFactoredRms {
        decay_rate,
        eps,
        min_dim_size_to_factor,
    })
}

impl ScaleByFactoredRms {
    fn factored(&self, shape: &[usize]) -> bool {
        let rank = shape.len();
        rank >= 2
            && shape[rank - 2..]
                .iter()
                .all(|&d| d >= self.min_dim_size_to_factor)
    }
}

impl Transform for ScaleByFactoredRms {
    fn name(&self) -> String {
        "scale_by_factored_rms".into()
    }

    fn validate(&self) -> Result<()> {
        let (rate, eps) = (self.decay_rate, self.eps);
        check_hyper_parameters(
            self,
            &[
                (
                    "decay_rate",
                    rate,
                    positive(rate) && rate <= 1.0,
                    "in (0, 1]",
                ),
                ("eps", eps, positive(eps), "> 0"),
            ],
        )
    }

    fn slots(&self, shape: &[usize]) -> Vec<Slot> {
        if !self.factored(shape) {
            return vec![Slot::like("v")];
        }
        let rank = shape.len();
        vec![
            Slot {
                name: "v_row",
                without_dim: Some(rank - 1),
            },
            Slot {
                name: "v_col",
                without_dim: Some(rank - 2),
            },
        ]
    }

    fn scalar_names(&self) -> Vec<String> {
        vec!["second_moment_decay".into()]
    }

    fn scalars(&self, t: u64, _: &Schedule) -> Vec<f32> {
        vec![(1.0 - (t as f64).powf(-f64::from(self.decay_rate))) as f32]
    }

    fn update(
        &self,
        e: &mut Emitter<'_, '_>,
        params: &mut [Param],
        scalars: &[ValueId],
    ) -> Result<()> {
        let keep = scalars[0];
        e.each(params, |e, p| {
            let g = p.update;
            let shape = e.shape(g);
            let rank = shape.len();
            let g2 = e.mul(g, g)?;
            let squares = e.add_constant(g2, self.eps)?;
            let renew = e.rsub(1.0, keep)?;
            // `acc beta + new (1 - beta)`.
            let moving = |e: &mut Emitter<'_, '_>, acc: ValueId, new: ValueId| {
                let kept = e.mul_scalar(acc, keep)?;
                let added = e.mul_scalar(new, renew)?;
                e.add(kept, added)
            };
            let v = if let &[row, col] = &p.state[..] {
                let (last, second) = (rank - 1, rank - 2);
                let row_mean = e.mean_over(squares, last)?;
                let col_mean = e.mean_over(squares, second)?;
                let row = moving(e, row, row_mean)?;
                let col = moving(e, col, col_mean)?;
                let row_scale = e.mean_over(row, second)?;
                let all_but = |skip: usize| (0..rank).filter(|&d| d != skip).collect::<Vec<_>>();
                let r = e.broadcast(row, &shape, &all_but(last))?;
                let c = e.broadcast(col, &shape, &all_but(second))?;
                let lead: Vec<usize> = (0..second).collect();
                let m = e.broadcast(row_scale, &shape, &lead)?;
                let rc = e.mul(r, c)?;
                p.state = vec![row, col];
                e.div(rc, m)?
            } else {
                let v = moving(e, p.state[0], squares)?;
                p.state = vec![v];
                v
            };
            let inverse_root = e.unary(UnaryOp::Rsqrt, v)?;
            p.update = e.mul(g, inverse_root)?;
            Ok(())
        })
    }
}

/// Adafactor's step size.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ScaleByAdafactorStep {
    lr: f32,
    relative_step: bool,
    scale_parameter: bool,
    eps: f32,
}

/// Multiplies each update by Adafactor's step size `alpha = rho(t) * max(eps, rms(w))`
/// (or `rho(t)` without `scale_parameter`), where `rho(t) = lr * schedule.factor(t)`,
/// or with `relative_step` the paper's `min(lr, 1/sqrt(t)) * schedule.factor(t)`: a
/// scalar input (`learning_rate`). optax's `scale_by_learning_rate(flip_sign=False)`
/// then `scale_by_param_block_rms(eps)`, as one factor formed before it multiplies the
/// update (the paper's `alpha_t`). No sign flip: follow it with `scale(-1.0)`.
/// `lr > 0`, `eps > 0`.
pub fn scale_by_adafactor_step(
    lr: f32,
    relative_step: bool,
    scale_parameter: bool,
    eps: f32,
) -> Optimizer {
    Optimizer::new(ScaleByAdafactorStep {
        lr,
        relative_step,
        scale_parameter,
        eps,
    })
}

impl Transform for ScaleByAdafactorStep {
    fn name(&self) -> String {
        "scale_by_adafactor_step".into()
    }

    fn validate(&self) -> Result<()> {
        let (lr, eps) = (self.lr, self.eps);
        check_hyper_parameters(
            self,
            &[
                ("lr", lr, positive(lr), "> 0"),
                ("eps2", eps, positive(eps), "> 0"),
            ],
        )
    }

    fn scalar_names(&self) -> Vec<String> {
        vec!["learning_rate".into()]
    }

    fn scalars(&self, t: u64, schedule: &Schedule) -> Vec<f32> {
        self.learning_rate(t, schedule).into_iter().collect()
    }

    fn learning_rate(&self, t: u64, schedule: &Schedule) -> Option<f32> {
        let peak = match self.relative_step {
            true => self.lr.min((1.0 / (t as f64).sqrt()) as f32),
            false => self.lr,
        };
        Some(peak * schedule.factor(t))
    }

    fn update(
        &self,
        e: &mut Emitter<'_, '_>,
        params: &mut [Param],
        scalars: &[ValueId],
    ) -> Result<()> {
        let rho = scalars[0];
        e.each(params, |e, p| {
            let alpha = if self.scale_parameter {
                let rms = e.root_mean_square(p.weight)?;
                let scale = e.max_constant(rms, self.eps)?;
                e.mul(rho, scale)?
            } else {
                rho
            };
            p.update = e.mul_scalar(p.update, alpha)?;
            Ok(())
        })
    }
}

/// Adafactor (optax's `adafactor` with `momentum = None`):
/// `u = clip(g / sqrt(v))` with `v` the (factored) second moment and the update's RMS
/// clipped to `clip_threshold`; `w = w - alpha(t) u - weight_decay w` on the parameters
/// `mask` selects (the decay, as optax's `weight_decay_rate`, not scaled by the step
/// size). The chain `[scale_by_factored_rms(decay_rate, eps1, min_dim_size_to_factor),
/// clip_by_block_rms(clip_threshold), scale_by_adafactor_step(lr, relative_step,
/// scale_parameter, eps2), add_decayed_weights(weight_decay, mask), scale(-1)]`, named
/// `adafactor`.
///
/// Defaults ([`Adafactor::new`]) are optax's. Where it differs from optax: `lr` is
/// required (optax's `None` means no learning-rate scaling); `relative_step` (off by
/// default) is the paper's, not optax's; the factored dims are the last two (optax
/// factors the two largest), and a dim counts when both are at least
/// `min_dim_size_to_factor` (the same when the last two are the largest); optax's
/// `decay_offset` (0), `momentum`, `dtype_momentum` and `factored` (use a huge
/// `min_dim_size_to_factor` to turn factoring off) are not offered.
#[derive(Debug, Clone, PartialEq)]
pub struct Adafactor {
    /// Learning rate, > 0; with `relative_step`, the cap of the relative step size.
    pub lr: f32,
    /// The paper's relative step `min(lr, 1/sqrt(t))` in place of `lr`; off.
    pub relative_step: bool,
    /// Scale the step by the weight's root mean square (at least `eps2`); on.
    pub scale_parameter: bool,
    /// Exponent of the second-moment decay `1 - t^(-decay_rate)`, in `(0, 1]`; 0.8.
    pub decay_rate: f32,
    /// The update's root mean square is clipped to this (the paper's `d`), > 0; 1.
    pub clip_threshold: f32,
    /// Added to the squared gradient, > 0; 1e-30.
    pub eps1: f32,
    /// Lower bound of the weight scale, > 0; 1e-3.
    pub eps2: f32,
    /// Weight decay, `>= 0`, not scaled by the step size; 0.
    pub weight_decay: f32,
    /// The parameters that decay; all.
    pub mask: Mask,
    /// Factor the second moment of weights whose last two dims both have at least this
    /// size; 128.
    pub min_dim_size_to_factor: usize,
}

impl Adafactor {
    /// Adafactor with learning rate `lr` and optax's defaults: no relative step, the
    /// weight-scaled step, `decay_rate = 0.8`, `clip_threshold = 1`, `eps1 = 1e-30`,
    /// `eps2 = 1e-3`, no weight decay, factoring dims of at least 128.
    pub fn new(lr: f32) -> Self {
        Adafactor {
            lr,
            relative_step: false,
            scale_parameter: true,
            decay_rate: 0.8,
            clip_threshold: 1.0,
            eps1: 1e-30,
            eps2: 1e-3,
            weight_decay: 0.0,
            mask: Mask::All,
            min_dim_size_to_factor: 128,
        }
    }
}

impl From<Adafactor> for Optimizer {
    fn from(a: Adafactor) -> Self {
        let parts = vec![
            scale_by_factored_rms(a.decay_rate, a.eps1, a.min_dim_size_to_factor),
            clip_by_block_rms(a.clip_threshold),
            scale_by_adafactor_step(a.lr, a.relative_step, a.scale_parameter, a.eps2),
            add_decayed_weights(a.weight_decay, a.mask),
            scale(-1.0),
        ];
        Chain::named("adafactor", parts)
    }
}
