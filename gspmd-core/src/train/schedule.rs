//! [`Schedule`]: the learning rate of each step as a multiple of the optimizer's `lr`.
//! The step program takes the learning rate as an input (`learning_rate`), so a
//! schedule runs without recompiling: the [`Trainer`](super::Trainer) computes each
//! step's value on the host.

use crate::error::{Error, OptimizerProblem, Result};

/// How the learning rate changes with the step `t = 1, 2, ..`: `lr(t) = lr * factor(t)`
/// (optax's `warmup_cosine_decay_schedule` and `linear_schedule` shapes).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub enum Schedule {
    /// `factor(t) = 1`.
    #[default]
    Constant,
    /// Linear warm-up over the first `warmup` steps (`factor(t) = t / warmup`), then a
    /// half cosine from 1 down to `final_fraction` at step `total`, constant after.
    WarmupCosine {
        /// Steps of linear warm-up (0: none).
        warmup: u64,
        /// The step at which the decay ends; above `warmup`.
        total: u64,
        /// The factor at and after `total`, in `[0, 1]`.
        final_fraction: f32,
    },
    /// Linear warm-up as [`Schedule::WarmupCosine`], then a straight line from 1 down
    /// to `final_fraction` at step `total`, constant after.
    WarmupLinear {
        /// Steps of linear warm-up (0: none).
        warmup: u64,
        /// The step at which the decay ends; above `warmup`.
        total: u64,
        /// The factor at and after `total`, in `[0, 1]`.
        final_fraction: f32,
    },
}

impl Schedule {
    /// The factor of step `t` (the first step is 1), computed in f64.
    pub fn factor(&self, t: u64) -> f32 {
        let (warmup, total, last, cosine) = match *self {
            Schedule::Constant => return 1.0,
            Schedule::WarmupCosine {
                warmup,
                total,
                final_fraction,
            } => (warmup, total, final_fraction, true),
            Schedule::WarmupLinear {
                warmup,
                total,
                final_fraction,
            } => (warmup, total, final_fraction, false),
        };
        if t < warmup {
            return (t as f64 / warmup as f64) as f32;
        }
        let progress = ((t - warmup) as f64 / (total - warmup) as f64).min(1.0);
        let shape = if cosine {
            0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        } else {
            1.0 - progress
        };
        let last = f64::from(last);
        (last + (1.0 - last) * shape) as f32
    }

    /// Checks the schedule: `total` above `warmup`, `final_fraction` in `[0, 1]`
    /// ([`Error::Optimizer`] otherwise).
    pub fn validate(&self) -> Result<()> {
        let (Schedule::WarmupCosine {
            warmup,
            total,
            final_fraction,
        }
        | Schedule::WarmupLinear {
            warmup,
            total,
            final_fraction,
        }) = *self
        else {
            return Ok(());
        };
        let (name, value, requirement) = if total <= warmup {
            ("total", total as f32, format!("above warmup = {warmup}"))
        } else if !(0.0..=1.0).contains(&final_fraction) {
            ("final_fraction", final_fraction, "in [0, 1]".to_string())
        } else {
            return Ok(());
        };
        Err(Error::Optimizer {
            optimizer: format!("{self:?}"),
            problem: OptimizerProblem::HyperParameter {
                name: name.into(),
                value,
                requirement,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_decay_reaches_the_final_fraction() {
        let cosine = Schedule::WarmupCosine {
            warmup: 4,
            total: 14,
            final_fraction: 0.1,
        };
        let linear = Schedule::WarmupLinear {
            warmup: 4,
            total: 14,
            final_fraction: 0.1,
        };
        for s in [cosine, linear] {
            assert_eq!([1, 2, 3].map(|t| s.factor(t)), [0.25, 0.5, 0.75]);
            assert_eq!(s.factor(4), 1.0);
            assert!((s.factor(14) - 0.1).abs() < 1e-7 && (s.factor(100) - 0.1).abs() < 1e-7);
        }
        // Halfway through the decay: cosine and line both at (1 + 0.1) / 2.
        assert!((cosine.factor(9) - 0.55).abs() < 1e-6);
        assert!((linear.factor(9) - 0.55).abs() < 1e-6);
        // A quarter of the way: the cosine is still above the line.
        assert!(cosine.factor(6) > linear.factor(6) + 0.05);
        assert_eq!(Schedule::Constant.factor(7), 1.0);
    }

    #[test]
    fn bad_schedules_are_typed_errors() {
        let bad = [
            Schedule::WarmupCosine {
                warmup: 10,
                total: 10,
                final_fraction: 0.0,
            },
            Schedule::WarmupLinear {
                warmup: 0,
                total: 5,
                final_fraction: 1.5,
            },
        ];
        for s in bad {
            assert!(
                matches!(s.validate(), Err(Error::Optimizer { .. })),
                "{s:?}"
            );
        }
        assert!(Schedule::Constant.validate().is_ok());
    }
}
