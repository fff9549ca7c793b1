//! [`Optimizer`]: the update rules, emitted as IR into the step program so that they are
//! propagated and partitioned with the forward and backward passes.

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

    /// Names of the state tensors kept per trained parameter, each shaped and sharded
    /// like it: none for plain SGD, `momentum` for SGD with momentum, `m` and `v` for
    /// AdamW. The step program names them `<slot>(<parameter>)`.
    pub fn state_slots(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd { momentum, .. } if *momentum == 0.0 => &[],
            Optimizer::Sgd { .. } => &["momentum"],
            Optimizer::AdamW { .. } => &["m", "v"],
        }
    }

    /// Names of the f32 scalar inputs the step program takes each step.
    pub fn scalar_inputs(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd { .. } => &["learning_rate"],
            Optimizer::AdamW { .. } => &["learning_rate", "bias_correction1", "bias_correction2"],
        }
    }

    /// The peak learning rate (what a [`Schedule`] scales).
    pub fn lr(&self) -> f32 {
        match *self {
            Optimizer::Sgd { lr, .. } | Optimizer::AdamW { lr, .. } => lr,
        }
    }

    /// Values of [`Optimizer::scalar_inputs`] for step `t` (the first step is 1): the
    /// learning rate `lr * schedule.factor(t)`; for AdamW also `1 - beta1^t` and
    /// `1 - beta2^t`, computed in f64.
    pub fn scalars(&self, t: u64, schedule: &Schedule) -> Vec<f32> {
        let lr = self.lr() * schedule.factor(t);
        match *self {
            Optimizer::Sgd { .. } => vec![lr],
            Optimizer::AdamW { beta1, beta2, .. } => {
                let correction = |beta: f32| (1.0 - f64::from(beta).powf(t as f64)) as f32;
                vec![lr, correction(beta1), correction(beta2)]
            }
        }
    }

    /// Checks the hyper-parameters: finite, learning rate positive, betas and momentum
    /// in `[0, 1)`, `eps > 0`, `weight_decay >= 0`. The first one out of range is an
    /// [`Error::Optimizer`].
    pub fn validate(&self) -> Result<()> {
        let unit = |x: f32| (0.0..1.0).contains(&x);
        let positive = |x: f32| x > 0.0 && x.is_finite();
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
                (
                    "weight_decay",
                    weight_decay,
                    weight_decay == 0.0 || positive(weight_decay),
                    ">= 0",
                ),
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
    /// [`Optimizer::scalar_inputs`]). Returns the new parameter and the new state.
    pub(super) fn emit_update(
        &self,
        a: &mut Appender<'_>,
        w: ValueId,
        g: ValueId,
        state: &[ValueId],
        scalars: &[ValueId],
    ) -> Result<(ValueId, Vec<ValueId>)> {
        match (*self, state, scalars) {
            (Optimizer::Sgd { .. }, [], &[lr]) => {
                let step = a.mul_scalar(g, lr)?;
                Ok((a.binary(BinaryOp::Sub, w, step)?, Vec::new()))
            }
            (Optimizer::Sgd { momentum, .. }, &[b], &[lr]) => {
                let decayed = a.scale(b, momentum)?;
                let b = a.binary(BinaryOp::Add, decayed, g)?;
                let step = a.mul_scalar(b, lr)?;
                Ok((a.binary(BinaryOp::Sub, w, step)?, vec![b]))
            }
            (
                Optimizer::AdamW {
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                    ..
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
                let decayed = if weight_decay == 0.0 {
                    w
                } else {
                    let decay = a.scale(lr, weight_decay)?;
                    let kept = a.rsub(1.0, decay)?;
                    a.mul_scalar(w, kept)?
                };
                Ok((a.binary(BinaryOp::Sub, decayed, step)?, vec![m, v]))
            }
            _ => Err(Error::Optimizer {
                optimizer: format!("{self:?}"),
                message: format!(
                    "internal: {} state values and {} scalars given to the update",
                    state.len(),
                    scalars.len()
                ),
            }),
        }
    }
}
