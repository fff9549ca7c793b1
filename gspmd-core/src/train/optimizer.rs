//! [`Optimizer`]: the update rules, emitted as IR into the step program so that they are
//! propagated and partitioned with the forward and backward passes.
//!
//! Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear
//! Memory Cost") keeps, for a weight of rank >= 2, the second moment factored over its
//! last two dims: a row accumulator (the weight's shape without its last dim) and a
//! column accumulator (without its second-to-last dim). Each keeps the weight's
//! sharding on the dims it keeps, so the state is sharded like the weight's dims.

use super::schedule::Schedule;
use crate::error::{Error, Result};
use crate::ir::Appender;
use crate::ir::{BinaryOp, UnaryOp, ValueId};

/// An optimizer and its hyper-parameters. The per-step values — the learning rate
/// (`lr` times a [`Schedule`]'s factor) and Adam's bias corrections — are f32 scalar
/// inputs of the step program computed on the host ([`Optimizer::scalars`]), so a
/// schedule needs no recompile; the other hyper-parameters are constants of the
/// program.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Optimizer {
    /// Stochastic gradient descent with heavy-ball momentum (PyTorch's `SGD` without
    /// dampening or Nesterov): `b = momentum * b + g; w = w - lr * b`. With
    /// `momentum == 0` there is no state and the update is `w = w - lr * g`.
    Sgd {
        /// Learning rate.
        lr: f32,
        /// Momentum coefficient in `[0, 1)`.
        momentum: f32,
    },
    /// Adam with decoupled weight decay (Loshchilov & Hutter; PyTorch's `AdamW`), at
    /// step `t = 1, 2, ..`:
    /// `w = w (1 - lr wd); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;`
    /// `w = w - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)`.
    AdamW {
        /// Learning rate.
        lr: f32,
        /// Decay of the first moment `m`, in `[0, 1)`.
        beta1: f32,
        /// Decay of the second moment `v`, in `[0, 1)`.
        beta2: f32,
        /// Added to `sqrt(v_hat)`; positive.
        eps: f32,
        /// Decoupled weight decay, `>= 0`.
        weight_decay: f32,
    },
    /// Adafactor (the paper's Algorithms 4 and 5 without momentum; the shape of
    /// optax's `adafactor` with `momentum = None`, factoring the last two dims as the
    /// paper's and T5's implementations do). At step `t = 1, 2, ..` with gradient `g`:
    /// `beta2_t = 1 - t^(-decay_rate)`; `s = g^2 + eps1`;
    /// for a weight of rank >= 2, `r = beta2_t r + (1 - beta2_t) mean_last(s)`,
    /// `c = beta2_t c + (1 - beta2_t) mean_second_last(s)`,
    /// `v = r c / mean_last(r)` (broadcast back); for rank < 2,
    /// `v = beta2_t v + (1 - beta2_t) s`. Then `u = g / sqrt(v)`,
    /// `u = u / max(1, rms(u) / clip_threshold)`, and with
    /// `rho = lr * schedule` (or `min(lr, 1/sqrt(t)) * schedule` with `relative_step`)
    /// and `alpha = rho * max(eps2, rms(w))` (or `rho` without `scale_parameter`):
    /// `w = w (1 - rho weight_decay) - alpha u`.
    Adafactor {
        /// Learning rate; with `relative_step`, the cap of the relative step size.
        lr: f32,
        /// The paper's relative step `min(lr, 1/sqrt(t))` in place of `lr`.
        relative_step: bool,
        /// Scale the step by the weight's root mean square (at least `eps2`).
        scale_parameter: bool,
        /// Exponent of the second-moment decay `1 - t^(-decay_rate)`, in `(0, 1]`
        /// (the paper's 0.8).
        decay_rate: f32,
        /// The update's root mean square is clipped to this (the paper's `d = 1`); > 0.
        clip_threshold: f32,
        /// Added to the squared gradient (the paper's 1e-30); > 0.
        eps1: f32,
        /// Lower bound of the weight scale (the paper's 1e-3); > 0.
        eps2: f32,
        /// Decoupled weight decay, `>= 0`, scaled by the step's `rho`.
        weight_decay: f32,
    },
}

/// One optimizer state tensor of a weight: its slot name and the weight's dim it does
/// not have (`None`: shaped like the weight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// `m`, `v`, `momentum`, `v_row`, `v_col`.
    pub name: &'static str,
    /// The dim of the weight it lacks (a factored accumulator), if any.
    pub without_dim: Option<usize>,
}

impl Slot {
    const fn like(name: &'static str) -> Self {
        Slot {
            name,
            without_dim: None,
        }
    }
}

impl Optimizer {
    /// AdamW with learning rate `lr`, `beta1 = 0.9`, `beta2 = 0.99`, `eps = 1e-8` and no
    /// weight decay: the setting of the examples and benches.
    pub fn adamw(lr: f32) -> Self {
        Optimizer::AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }

    /// Adafactor with the paper's settings: relative step capped at `lr` (the paper's
    /// 1e-2), the weight-scaled step, `decay_rate = 0.8`, `clip_threshold = 1`,
    /// `eps1 = 1e-30`, `eps2 = 1e-3`, no weight decay.
    pub fn adafactor(lr: f32) -> Self {
        Optimizer::Adafactor {
            lr,
            relative_step: true,
            scale_parameter: true,
            decay_rate: 0.8,
            clip_threshold: 1.0,
            eps1: 1e-30,
            eps2: 1e-3,
            weight_decay: 0.0,
        }
    }

    /// The state tensors kept for a trained parameter of shape `shape`, each sharded
    /// like it on the dims it keeps: none for plain SGD, `momentum` for SGD with
    /// momentum, `m` and `v` for AdamW; for Adafactor `v_row` (without the last dim)
    /// and `v_col` (without the second-to-last) for rank >= 2, else `v`. The step
    /// program names them `<slot>(<parameter>)`.
    pub fn state_slots(&self, shape: &[usize]) -> Vec<Slot> {
        match self {
            Optimizer::Sgd { momentum, .. } if *momentum == 0.0 => vec![],
            Optimizer::Sgd { .. } => vec![Slot::like("momentum")],
            Optimizer::AdamW { .. } => vec![Slot::like("m"), Slot::like("v")],
            Optimizer::Adafactor { .. } if shape.len() < 2 => vec![Slot::like("v")],
            Optimizer::Adafactor { .. } => vec![
                Slot {
                    name: "v_row",
                    without_dim: Some(shape.len() - 1),
                },
                Slot {
                    name: "v_col",
                    without_dim: Some(shape.len() - 2),
                },
            ],
        }
    }

    /// Names of the f32 scalar inputs the step program takes each step.
    pub fn scalar_inputs(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd { .. } => &["learning_rate"],
            Optimizer::AdamW { .. } => &["learning_rate", "bias_correction1", "bias_correction2"],
            Optimizer::Adafactor { .. } => &["learning_rate", "second_moment_decay"],
        }
    }

    /// The peak learning rate (what a [`Schedule`] scales).
    pub fn lr(&self) -> f32 {
        match *self {
            Optimizer::Sgd { lr, .. }
            | Optimizer::AdamW { lr, .. }
            | Optimizer::Adafactor { lr, .. } => lr,
        }
    }

    /// The learning rate of step `t` under `schedule`: `lr * schedule.factor(t)`; for
    /// Adafactor with `relative_step`, `min(lr, 1/sqrt(t)) * schedule.factor(t)`.
    pub fn learning_rate(&self, t: u64, schedule: &Schedule) -> f32 {
        let peak = match *self {
            Optimizer::Adafactor {
                lr,
                relative_step: true,
                ..
            } => lr.min((1.0 / (t as f64).sqrt()) as f32),
            _ => self.lr(),
        };
        peak * schedule.factor(t)
    }

    /// Values of [`Optimizer::scalar_inputs`] for step `t` (the first step is 1): the
    /// [`Optimizer::learning_rate`]; for AdamW also `1 - beta1^t` and `1 - beta2^t`;
    /// for Adafactor `beta2_t = 1 - t^(-decay_rate)`; computed in f64.
    pub fn scalars(&self, t: u64, schedule: &Schedule) -> Vec<f32> {
        let lr = self.learning_rate(t, schedule);
        match *self {
            Optimizer::Sgd { .. } => vec![lr],
            Optimizer::AdamW { beta1, beta2, .. } => {
                let correction = |beta: f32| (1.0 - f64::from(beta).powf(t as f64)) as f32;
                vec![lr, correction(beta1), correction(beta2)]
            }
            Optimizer::Adafactor { decay_rate, .. } => {
                vec![lr, (1.0 - (t as f64).powf(-f64::from(decay_rate))) as f32]
            }
        }
    }

    /// The weight decay coefficient (0 for SGD).
    pub fn weight_decay(&self) -> f32 {
        match *self {
            Optimizer::Sgd { .. } => 0.0,
            Optimizer::AdamW { weight_decay, .. } | Optimizer::Adafactor { weight_decay, .. } => {
                weight_decay
            }
        }
    }

    /// Checks the hyper-parameters: finite, learning rate positive, betas and momentum
    /// in `[0, 1)`, `eps > 0`, `weight_decay >= 0`; for Adafactor `decay_rate` in
    /// `(0, 1]`, `clip_threshold`, `eps1`, `eps2 > 0`. The first one out of range is an
    /// [`Error::Optimizer`].
    pub fn validate(&self) -> Result<()> {
        let unit = |x: f32| (0.0..1.0).contains(&x);
        let positive = |x: f32| x > 0.0 && x.is_finite();
        let non_negative = |name, x: f32| (name, x, x == 0.0 || positive(x), ">= 0");
        // (name, value, in range, the range)
        let checks = match *self {
            Optimizer::Sgd { lr, momentum } => vec![
                ("lr", lr, positive(lr), "> 0"),
                ("momentum", momentum, unit(momentum), "in [0, 1)"),
            ],
            Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => vec![
                ("lr", lr, positive(lr), "> 0"),
                ("beta1", beta1, unit(beta1), "in [0, 1)"),
                ("beta2", beta2, unit(beta2), "in [0, 1)"),
                ("eps", eps, positive(eps), "> 0"),
                non_negative("weight_decay", weight_decay),
            ],
            Optimizer::Adafactor {
                lr,
                decay_rate,
                clip_threshold,
                eps1,
                eps2,
                weight_decay,
                ..
            } => vec![
                ("lr", lr, positive(lr), "> 0"),
                (
                    "decay_rate",
                    decay_rate,
                    positive(decay_rate) && decay_rate <= 1.0,
                    "in (0, 1]",
                ),
                (
                    "clip_threshold",
                    clip_threshold,
                    positive(clip_threshold),
                    "> 0",
                ),
                ("eps1", eps1, positive(eps1), "> 0"),
                ("eps2", eps2, positive(eps2), "> 0"),
                non_negative("weight_decay", weight_decay),
            ],
        };
        match checks.into_iter().find(|c| !c.2) {
            Some((name, value, _, range)) => Err(Error::Optimizer {
                optimizer: format!("{self:?}"),
                message: format!("{name} = {value} must be finite and {range}"),
            }),
            None => Ok(()),
        }
    }

    /// Appends the update of parameter `w` with gradient `g`, state `state` (one value
    /// per [`Optimizer::state_slots`]) and the step's `scalars` (one per
    /// [`Optimizer::scalar_inputs`]); `decay`: whether weight decay applies to `w`.
    /// Returns the new parameter and the new state.
    pub(super) fn emit_update(
        &self,
        a: &mut Appender<'_>,
        w: ValueId,
        g: ValueId,
        state: &[ValueId],
        scalars: &[ValueId],
        decay: bool,
    ) -> Result<(ValueId, Vec<ValueId>)> {
        let (w_new, state) = match (*self, state, scalars) {
            (Optimizer::Sgd { .. }, [], &[lr]) => {
                let step = a.mul_scalar(g, lr)?;
                (a.binary(BinaryOp::Sub, w, step)?, Vec::new())
            }
            (Optimizer::Sgd { momentum, .. }, &[b], &[lr]) => {
                let decayed = a.scale(b, momentum)?;
                let b = a.binary(BinaryOp::Add, decayed, g)?;
                let step = a.mul_scalar(b, lr)?;
                (a.binary(BinaryOp::Sub, w, step)?, vec![b])
            }
            (
                Optimizer::AdamW {
                    beta1, beta2, eps, ..
                },
                &[m, v],
                &[lr, correction1, correction2],
            ) => {
                let m_kept = a.scale(m, beta1)?;
                let m_new = a.scale(g, 1.0 - beta1)?;
                let m = a.binary(BinaryOp::Add, m_kept, m_new)?;
                let g2 = a.binary(BinaryOp::Mul, g, g)?;
                let v_kept = a.scale(v, beta2)?;
                let v_new = a.scale(g2, 1.0 - beta2)?;
                let v = a.binary(BinaryOp::Add, v_kept, v_new)?;
                let m_hat = a.div_scalar(m, correction1)?;
                let v_hat = a.div_scalar(v, correction2)?;
                let root = a.unary(UnaryOp::Sqrt, v_hat)?;
                let denom = a.add_constant(root, eps)?;
                let direction = a.binary(BinaryOp::Div, m_hat, denom)?;
                let step = a.mul_scalar(direction, lr)?;
                let decayed = self.decayed(a, w, lr, decay)?;
                (a.binary(BinaryOp::Sub, decayed, step)?, vec![m, v])
            }
            (Optimizer::Adafactor { .. }, _, &[lr, beta])
                if state.len() == 1 + usize::from(a.ty(w).rank() >= 2) =>
            {
                self.emit_adafactor(a, w, g, state, lr, beta, decay)?
            }
            _ => {
                return Err(Error::Optimizer {
                    optimizer: format!("{self:?}"),
                    message: format!(
                        "internal: {} state values and {} scalars given to the update",
                        state.len(),
                        scalars.len()
                    ),
                });
            }
        };
        Ok((w_new, state))
    }

    /// `w (1 - lr weight_decay)`, or `w` when `decay` is off or the decay is 0.
    fn decayed(
        &self,
        a: &mut Appender<'_>,
        w: ValueId,
        lr: ValueId,
        decay: bool,
    ) -> Result<ValueId> {
        let weight_decay = self.weight_decay();
        if !decay || weight_decay == 0.0 {
            return Ok(w);
        }
        let rate = a.scale(lr, weight_decay)?;
        let kept = a.rsub(1.0, rate)?;
        a.mul_scalar(w, kept)
    }

    /// Adafactor's update (see [`Optimizer::Adafactor`]): `state` is `[v_row, v_col]`
    /// for a weight of rank >= 2, else `[v]`; `beta` is the step's second-moment decay.
    #[allow(clippy::too_many_arguments)]
    fn emit_adafactor(
        &self,
        a: &mut Appender<'_>,
        w: ValueId,
        g: ValueId,
        state: &[ValueId],
        lr: ValueId,
        beta: ValueId,
        decay: bool,
    ) -> Result<(ValueId, Vec<ValueId>)> {
        let Optimizer::Adafactor {
            scale_parameter,
            clip_threshold,
            eps1,
            eps2,
            ..
        } = *self
        else {
            return Err(Error::Optimizer {
                optimizer: format!("{self:?}"),
                message: "internal: Adafactor's update asked of another optimizer".into(),
            });
        };
        let shape = a.shape(w);
        let rank = shape.len();
        let g2 = a.mul(g, g)?;
        let squares = a.add_constant(g2, eps1)?;
        let keep = beta;
        let renew = a.rsub(1.0, beta)?;
        // `acc beta + new (1 - beta)`.
        let moving = |a: &mut Appender<'_>, acc: ValueId, new: ValueId| -> Result<ValueId> {
            let kept = a.mul_scalar(acc, keep)?;
            let added = a.mul_scalar(new, renew)?;
            a.add(kept, added)
        };
        let (v, new_state) = if let &[row, col] = state {
            let (last, second) = (rank - 1, rank - 2);
            let row_mean = mean_over(a, squares, last, shape[last])?;
            let col_mean = mean_over(a, squares, second, shape[second])?;
            let row = moving(a, row, row_mean)?;
            let col = moving(a, col, col_mean)?;
            let row_scale = mean_over(a, row, second, shape[second])?;
            let all_but = |skip: usize| (0..rank).filter(|&d| d != skip).collect::<Vec<_>>();
            let r = a.broadcast(row, &shape, &all_but(last))?;
            let c = a.broadcast(col, &shape, &all_but(second))?;
            let lead: Vec<usize> = (0..second).collect();
            let m = a.broadcast(row_scale, &shape, &lead)?;
            let rc = a.mul(r, c)?;
            (a.div(rc, m)?, vec![row, col])
        } else {
            let v = moving(a, state[0], squares)?;
            (v, vec![v])
        };
        let inverse_root = a.unary(UnaryOp::Rsqrt, v)?;
        let u = a.mul(g, inverse_root)?;
        let rms_u = root_mean_square(a, u)?;
        let ratio = a.scale(rms_u, 1.0 / clip_threshold)?;
        let one = a.full(&[], a.ty(ratio).dtype, 1.0)?;
        let clip = a.binary(BinaryOp::Max, ratio, one)?;
        let u = a.div_scalar(u, clip)?;
        let alpha = if scale_parameter {
            let rms_w = root_mean_square(a, w)?;
            let floor = a.full(&[], a.ty(rms_w).dtype, eps2)?;
            let scale = a.binary(BinaryOp::Max, rms_w, floor)?;
            a.mul(lr, scale)?
        } else {
            lr
        };
        let step = a.mul_scalar(u, alpha)?;
        let decayed = self.decayed(a, w, lr, decay)?;
        Ok((a.sub(decayed, step)?, new_state))
    }
}

/// The mean of `x` over dim `dim` of size `size` (the dim removed).
fn mean_over(a: &mut Appender<'_>, x: ValueId, dim: usize, size: usize) -> Result<ValueId> {
    let sum = a.reduce_sum(x, &[dim])?;
    a.scale(sum, 1.0 / size as f32)
}

/// `sqrt(mean(x^2))` over all elements: an f32 scalar.
fn root_mean_square(a: &mut Appender<'_>, x: ValueId) -> Result<ValueId> {
    let count: usize = a.shape(x).iter().product();
    let squares = a.mul(x, x)?;
    let sum = a.sum_all(squares)?;
    let mean = a.scale(sum, 1.0 / count.max(1) as f32)?;
    a.unary(UnaryOp::Sqrt, mean)
}
