//! [`scale`] by a constant and [`scale_by_learning_rate`] (optax's, with the sign
//! flipped for descent).

use super::emit::Emitter;
use super::transform::{Param, Transform, check_hyper_parameters, positive};
use super::{Mask, Optimizer};
use crate::error::Result;
use crate::ir::{UnaryOp, ValueId};
use crate::train::Schedule;

/// `update * factor` for the parameters `mask` selects.
#[derive(Debug, Clone, PartialEq)]
struct Scale {
    factor: f32,
    mask: Mask,
}

/// Multiplies the updates by the constant `factor` (finite); `scale(-1.0)` turns an
/// ascent direction into the descent the step applies (exactly: it emits a negation).
pub fn scale(factor: f32) -> Optimizer {
    scale_masked(factor, Mask::All)
}

/// [`scale`] of the updates of the parameters `mask` selects only (optax's
/// `masked(scale(factor), mask)`): per-parameter learning rates, such as μP's
/// `1 / fan_in` for hidden weights, are a chain of these before
/// [`scale_by_learning_rate`].
pub fn scale_masked(factor: f32, mask: Mask) -> Optimizer {
    Optimizer::new(Scale { factor, mask })
}

impl Transform for Scale {
    fn name(&self) -> String {
        "scale".into()
    }

    fn validate(&self) -> Result<()> {
        let factor = self.factor;
        check_hyper_parameters(self, &[("factor", factor, factor.is_finite(), "real")])
    }

    fn update(&self, e: &mut Emitter<'_, '_>, params: &mut [Param], _: &[ValueId]) -> Result<()> {
        self.mask.check(self, params)?;
        e.each(params, |e, p| {
            if !self.mask.selects(&p.name) {
                return Ok(());
            }
            p.update = match self.factor {
                -1.0 => e.unary(UnaryOp::Neg, p.update)?,
                factor => e.scale(p.update, factor)?,
            };
            Ok(())
        })
    }
}

/// `update * -lr(t)` where `lr(t) = lr * schedule.factor(t)` is a scalar input
/// (`learning_rate`) computed on the host.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ScaleByLearningRate {
    lr: f32,
}

/// Multiplies the updates by minus the learning rate of the step: `lr` (> 0) times the
/// trainer's [`Schedule`] factor, an f32 input of the step (`learning_rate`, holding
/// `-lr(t)`), so a schedule never recompiles. optax's `scale_by_learning_rate` with
/// `flip_sign = True`; optax's `scale_by_schedule` is the trainer's
/// [`Schedule`] here.
pub fn scale_by_learning_rate(lr: f32) -> Optimizer {
    Optimizer::new(ScaleByLearningRate { lr })
}

impl Transform for ScaleByLearningRate {
    fn name(&self) -> String {
        "scale_by_learning_rate".into()
    }

    fn validate(&self) -> Result<()> {
        check_hyper_parameters(self, &[("lr", self.lr, positive(self.lr), "> 0")])
    }

    fn scalar_names(&self) -> Vec<String> {
        vec!["learning_rate".into()]
    }

    fn scalars(&self, t: u64, schedule: &Schedule) -> Vec<f32> {
        vec![-self.lr * schedule.factor(t)]
    }

    fn learning_rate(&self, t: u64, schedule: &Schedule) -> Option<f32> {
        Some(self.lr * schedule.factor(t))
    }

    fn update(
        &self,
        e: &mut Emitter<'_, '_>,
        params: &mut [Param],
        scalars: &[ValueId],
    ) -> Result<()> {
        let rate = scalars[0];
        e.each(params, |e, p| {
            p.update = e.mul_scalar(p.update, rate)?;
            Ok(())
        })
    }
}
