//! Stochastic gradient descent: [`Sgd`], with heavy-ball momentum by [`trace`].

use super::Optimizer;
use super::chain::Chain;
use super::emit::Emitter;
use super::scale::scale_by_learning_rate;
use super::transform::{Param, Slot, Transform, check_hyper_parameters, unit};
use crate::error::Result;
use crate::ir::ValueId;

/// `b = decay b + update; update = b`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Trace {
    decay: f32,
}

/// Heavy-ball momentum (optax's `trace` without Nesterov): keeps `momentum` (slot
/// name) `b = decay * b + update` and passes `b` on; `decay` in `[0, 1)`.
pub fn trace(decay: f32) -> Optimizer {
    Optimizer::new(Trace { decay })
}

impl Transform for Trace {
    fn name(&self) -> String {
        "trace".into()
    }

    fn validate(&self) -> Result<()> {
        check_hyper_parameters(
            self,
            &[("momentum", self.decay, unit(self.decay), "in [0, 1)")],
        )
    }

    fn slots(&self, _: &[usize]) -> Vec<Slot> {
        vec![Slot::like("momentum")]
    }

    fn update(&self, e: &mut Emitter<'_, '_>, params: &mut [Param], _: &[ValueId]) -> Result<()> {
        e.each(params, |e, p| {
            let kept = e.scale(p.state[0], self.decay)?;
            p.update = e.add(kept, p.update)?;
            p.state = vec![p.update];
            Ok(())
        })
    }
}

/// SGD (optax's `sgd` and PyTorch's `SGD` without dampening or Nesterov):
/// `b = momentum b + g; w = w - lr(t) b`, and with `momentum == 0` no state and
/// `w = w - lr(t) g`. The chain `[trace(momentum), scale_by_learning_rate(lr)]`, named
/// `sgd`. Defaults as optax: none (both given).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sgd {
    /// Learning rate, > 0.
    pub lr: f32,
    /// Momentum coefficient in `[0, 1)`; 0: none.
    pub momentum: f32,
}

impl From<Sgd> for Optimizer {
    fn from(sgd: Sgd) -> Self {
        let momentum = (sgd.momentum != 0.0).then(|| trace(sgd.momentum));
        let parts = momentum.into_iter().chain([scale_by_learning_rate(sgd.lr)]);
        Chain::named("sgd", parts.collect())
    }
}
