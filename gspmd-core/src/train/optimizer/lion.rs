//! Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"):
//! [`scale_by_lion`] and the optimizer [`Lion`].

use super::Optimizer;
use super::chain::Chain;
use super::decay::{Mask, add_decayed_weights};
use super::emit::Emitter;
use super::scale::scale_by_learning_rate;
use super::transform::{Param, Slot, Transform, check_hyper_parameters, unit};
use crate::error::Result;
use crate::ir::{UnaryOp, ValueId};

/// The sign of an interpolated momentum.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ScaleByLion {
    beta1: f32,
    beta2: f32,
}

/// Lion's direction (optax's `scale_by_lion`): passes on `sign(b1 m + (1 - b1) u)` and
/// keeps `m = b2 m + (1 - b2) u` (slot `m`); `beta1`, `beta2` in `[0, 1)`.
pub fn scale_by_lion(beta1: f32, beta2: f32) -> Optimizer {
    Optimizer::new(ScaleByLion { beta1, beta2 })
}

impl Transform for ScaleByLion {
    fn name(&self) -> String {
        "scale_by_lion".into()
    }

    fn validate(&self) -> Result<()> {
        let ScaleByLion { beta1, beta2 } = *self;
        check_hyper_parameters(
            self,
            &[
                ("beta1", beta1, unit(beta1), "in [0, 1)"),
                ("beta2", beta2, unit(beta2), "in [0, 1)"),
            ],
        )
    }

    fn slots(&self, _: &[usize]) -> Vec<Slot> {
        vec![Slot::like("m")]
    }

    fn update(&self, e: &mut Emitter<'_, '_>, params: &mut [Param], _: &[ValueId]) -> Result<()> {
        let ScaleByLion { beta1, beta2 } = *self;
        e.each(params, |e, p| {
            let (g, m) = (p.update, p.state[0]);
            let m_kept = e.scale(m, beta1)?;
            let g_part = e.scale(g, 1.0 - beta1)?;
            let interpolated = e.add(m_kept, g_part)?;
            p.update = e.unary(UnaryOp::Sign, interpolated)?;
            let m_kept = e.scale(m, beta2)?;
            let g_part = e.scale(g, 1.0 - beta2)?;
            p.state = vec![e.add(m_kept, g_part)?];
            Ok(())
        })
    }
}

/// Lion (optax's `lion`): `c = b1 m + (1 - b1) g; w = w - lr(t) (sign(c) + wd w);`
/// `m = b2 m + (1 - b2) g`, the decay only on the parameters `mask` selects. The chain
/// `[scale_by_lion(beta1, beta2), add_decayed_weights(weight_decay, mask),
/// scale_by_learning_rate(lr)]`, named `lion`. One state tensor per parameter (Adam
/// keeps two). Defaults ([`Lion::new`]) are optax's; its `mu_dtype` is not offered (f32).
#[derive(Debug, Clone, PartialEq)]
pub struct Lion {
    /// Learning rate, > 0 (typically 3-10x below AdamW's).
    pub lr: f32,
    /// Interpolation of the update's momentum, in `[0, 1)`; 0.9.
    pub beta1: f32,
    /// Decay of the kept momentum `m`, in `[0, 1)`; 0.99.
    pub beta2: f32,
    /// Decoupled weight decay, `>= 0`; 1e-3.
    pub weight_decay: f32,
    /// The parameters that decay; all.
    pub mask: Mask,
}

impl Lion {
    /// Lion with learning rate `lr` and optax's defaults: `beta1 = 0.9`,
    /// `beta2 = 0.99`, `weight_decay = 1e-3` on every parameter.
    pub fn new(lr: f32) -> Self {
        Lion {
            lr,
            beta1: 0.9,
            beta2: 0.99,
            weight_decay: 1e-3,
            mask: Mask::All,
        }
    }
}

impl From<Lion> for Optimizer {
    fn from(lion: Lion) -> Self {
        let parts = vec![
            scale_by_lion(lion.beta1, lion.beta2),
            add_decayed_weights(lion.weight_decay, lion.mask),
            scale_by_learning_rate(lion.lr),
        ];
        Chain::named("lion", parts)
    }
}
