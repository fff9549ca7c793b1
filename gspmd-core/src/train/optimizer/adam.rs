//! Adam's moments ([`scale_by_adam`]) and [`AdamW`], Adam with decoupled weight decay.

use super::Optimizer;
use super::chain::Chain;
use super::decay::{Mask, add_decayed_weights};
use super::emit::Emitter;
use super::scale::scale_by_learning_rate;
use super::transform::{Param, Slot, Transform, check_hyper_parameters, positive, unit};
use crate::error::Result;
use crate::ir::{UnaryOp, ValueId};
use crate::train::Schedule;

/// Adam's bias-corrected moment ratio.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ScaleByAdam {
    beta1: f32,
    beta2: f32,
    eps: f32,
}

/// Adam's direction (optax's `scale_by_adam` with `eps_root = 0`): at step
/// `t = 1, 2, ..` keeps `m = b1 m + (1 - b1) u` and `v = b2 v + (1 - b2) u^2` (slots
/// `m`, `v`) and passes on `(m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)`. The bias
/// corrections `1 - b^t` are scalar inputs (`bias_correction1`, `bias_correction2`)
/// computed on the host in f64. `beta1`, `beta2` in `[0, 1)`, `eps > 0`.
pub fn scale_by_adam(beta1: f32, beta2: f32, eps: f32) -> Optimizer {
    Optimizer::new(ScaleByAdam { beta1, beta2, eps })
}

impl Transform for ScaleByAdam {
    fn name(&self) -> String {
        "scale_by_adam".into()
    }

    fn validate(&self) -> Result<()> {
        let ScaleByAdam { beta1, beta2, eps } = *self;
        check_hyper_parameters(
            self,
            &[
                ("beta1", beta1, unit(beta1), "in [0, 1)"),
                ("beta2", beta2, unit(beta2), "in [0, 1)"),
                ("eps", eps, positive(eps), "> 0"),
            ],
        )
    }

    fn slots(&self, _: &[usize]) -> Vec<Slot> {
        vec![Slot::like("m"), Slot::like("v")]
    }

    fn scalar_names(&self) -> Vec<String> {
        vec!["bias_correction1".into(), "bias_correction2".into()]
    }

    fn scalars(&self, t: u64, _: &Schedule) -> Vec<f32> {
        let correction = |beta: f32| (1.0 - f64::from(beta).powf(t as f64)) as f32;
        vec![correction(self.beta1), correction(self.beta2)]
    }

    fn update(
        &self,
        e: &mut Emitter<'_, '_>,
        params: &mut [Param],
        scalars: &[ValueId],
    ) -> Result<()> {
        let ScaleByAdam { beta1, beta2, eps } = *self;
        let (correction1, correction2) = (scalars[0], scalars[1]);
        e.each(params, |e, p| {
            let (g, m, v) = (p.update, p.state[0], p.state[1]);
            let m_kept = e.scale(m, beta1)?;
            let m_new = e.scale(g, 1.0 - beta1)?;
            let m = e.add(m_kept, m_new)?;
            let g2 = e.mul(g, g)?;
            let v_kept = e.scale(v, beta2)?;
            let v_new = e.scale(g2, 1.0 - beta2)?;
            let v = e.add(v_kept, v_new)?;
            let m_hat = e.div_scalar(m, correction1)?;
            let v_hat = e.div_scalar(v, correction2)?;
            let root = e.unary(UnaryOp::Sqrt, v_hat)?;
            let denominator = e.add_constant(root, eps)?;
            p.update = e.div(m_hat, denominator)?;
            p.state = vec![m, v];
            Ok(())
        })
    }
}

/// AdamW (Loshchilov & Hutter; optax's `adamw`): at step `t = 1, 2, ..`
/// `m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;`
/// `w = w - lr(t) ((m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd w)`, the decay
/// only on the parameters `mask` selects. The chain `[scale_by_adam(beta1, beta2,
/// eps), add_decayed_weights(weight_decay, mask), scale_by_learning_rate(lr)]`, named
/// `adamw`. Defaults ([`AdamW::new`]) are optax's; optax's `eps_root`, `mu_dtype` and
/// `nesterov` are not offered (as their defaults: 0, f32, off).
#[derive(Debug, Clone, PartialEq)]
pub struct AdamW {
    /// Learning rate, > 0.
    pub lr: f32,
    /// Decay of the first moment `m`, in `[0, 1)`; 0.9.
    pub beta1: f32,
    /// Decay of the second moment `v`, in `[0, 1)`; 0.999.
    pub beta2: f32,
    /// Added to `sqrt(v_hat)`, > 0; 1e-8.
    pub eps: f32,
    /// Decoupled weight decay, `>= 0`; 1e-4.
    pub weight_decay: f32,
    /// The parameters that decay; all.
    pub mask: Mask,
}

impl AdamW {
    /// AdamW with learning rate `lr` and optax's defaults: `beta1 = 0.9`,
    /// `beta2 = 0.999`, `eps = 1e-8`, `weight_decay = 1e-4` on every parameter.
    pub fn new(lr: f32) -> Self {
        AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-4,
            mask: Mask::All,
        }
    }
}

impl From<AdamW> for Optimizer {
    fn from(adamw: AdamW) -> Self {
        let parts = vec![
            scale_by_adam(adamw.beta1, adamw.beta2, adamw.eps),
            add_decayed_weights(adamw.weight_decay, adamw.mask),
            scale_by_learning_rate(adamw.lr),
        ];
        Chain::named("adamw", parts)
    }
}
