//! Clipping the updates: [`clip_by_global_norm`] (all parameters together) and
//! [`clip_by_block_rms`] (each on its own), optax's.

use super::Optimizer;
use super::emit::Emitter;
use super::transform::{Param, Transform, check_hyper_parameters, positive};
use crate::error::Result;
use crate::ir::{BinaryOp, UnaryOp, ValueId};

/// Scales all updates by `max / max(norm, max)`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ClipByGlobalNorm {
    max: f32,
}

/// Scales every update by `max / max(norm, max)` (`max` finite and > 0), where `norm`
/// (named `grad_norm` in the step program) is the 2-norm of all the trained parameters'
/// updates together: optax's `clip_by_global_norm`. First in a chain, it clips the
/// gradients.
pub fn clip_by_global_norm(max: f32) -> Optimizer {
    Optimizer::new(ClipByGlobalNorm { max })
}

impl Transform for ClipByGlobalNorm {
    fn name(&self) -> String {
        "clip_by_global_norm".into()
    }

    fn validate(&self) -> Result<()> {
        check_hyper_parameters(self, &[("max", self.max, positive(self.max), "> 0")])
    }

    fn update(&self, e: &mut Emitter<'_, '_>, params: &mut [Param], _: &[ValueId]) -> Result<()> {
        let mut total = None;
        for p in params.iter() {
            let squares = e.mul(p.update, p.update)?;
            let sum = e.sum_all(squares)?;
            total = Some(match total {
                Some(t) => e.add(t, sum)?,
                None => sum,
            });
        }
        let Some(total) = total else {
            return Ok(());
        };
        let norm = e.unary(UnaryOp::Sqrt, total)?;
        e.name(norm, "grad_norm");
        let max = e.full(&[], self.max)?;
        let denominator = e.binary(BinaryOp::Max, norm, max)?;
        let scale = e.div(max, denominator)?;
        for p in params.iter_mut() {
            p.update = e.mul_scalar(p.update, scale)?;
        }
        Ok(())
    }
}

/// Divides each update by `max(1, rms(update) / threshold)`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ClipByBlockRms {
    threshold: f32,
}

/// Divides each parameter's update `u` by `max(1, rms(u) / threshold)` (`threshold`
/// finite and > 0), so its root mean square is at most `threshold`: optax's
/// `clip_by_block_rms` (Adafactor's update clipping, the paper's `d`).
pub fn clip_by_block_rms(threshold: f32) -> Optimizer {
    Optimizer::new(ClipByBlockRms { threshold })
}

impl Transform for ClipByBlockRms {
    fn name(&self) -> String {
        "clip_by_block_rms".into()
    }

    fn validate(&self) -> Result<()> {
        let threshold = self.threshold;
        check_hyper_parameters(
            self,
            &[("threshold", threshold, positive(threshold), "> 0")],
        )
    }

    fn update(&self, e: &mut Emitter<'_, '_>, params: &mut [Param], _: &[ValueId]) -> Result<()> {
        e.each(params, |e, p| {
            let rms = e.root_mean_square(p.update)?;
            let ratio = e.scale(rms, 1.0 / self.threshold)?;
            let clip = e.max_constant(ratio, 1.0)?;
            p.update = e.div_scalar(p.update, clip)?;
            Ok(())
        })
    }
}
