//! Optimizers as chains of gradient transformations (optax's design), emitted as IR into
//! the step program so that they are propagated and partitioned with the forward and
//! backward passes, and their state is sharded like the parameters.
//!
//! - `transform`: the [`Transform`] trait (state [`Slot`]s, host scalars, the update)
//!   and the [`Param`] it updates; `emit`: the [`Emitter`] it writes IR with.
//! - `chain`: [`chain`] of transforms.
//! - `scale`: [`scale`], [`scale_masked`], [`scale_by_learning_rate`]; `decay`: [`add_decayed_weights`]
//!   with a [`Mask`] of parameter names; `clip`: [`clip_by_global_norm`],
//!   [`clip_by_block_rms`].
//! - The optimizers, each a named chain of the above and its own scaling:
//!   `sgd` ([`Sgd`], [`trace`]), `adam` ([`AdamW`], [`scale_by_adam`]), `lion`
//!   ([`Lion`], [`scale_by_lion`]), `adafactor` ([`Adafactor`],
//!   [`scale_by_factored_rms`], [`scale_by_adafactor_step`]).

mod adafactor;
mod adam;
mod chain;
mod clip;
mod decay;
mod emit;
mod lion;
mod scale;
mod sgd;
mod transform;

pub use adafactor::{Adafactor, scale_by_adafactor_step, scale_by_factored_rms};
pub use adam::{AdamW, scale_by_adam};
pub use chain::chain;
pub use clip::{clip_by_block_rms, clip_by_global_norm};
pub use decay::{Mask, add_decayed_weights};
pub use emit::Emitter;
pub use lion::{Lion, scale_by_lion};
pub use scale::{scale, scale_by_learning_rate, scale_masked};
pub use sgd::{Sgd, trace};
pub use transform::{Param, Slot, Transform, check_hyper_parameters};

use super::schedule::Schedule;
use crate::error::{Error, OptimizerProblem, Result};
use crate::ir::ValueId;
use std::fmt;
use std::sync::Arc;

/// An optimizer: a shared [`Transform`] — one of the optimizers ([`Optimizer::adamw`],
/// [`AdamW`], [`Sgd`], [`Lion`], [`Adafactor`]), a single transform, a [`chain`] of
/// them, or a user's own ([`Optimizer::new`]). The step applies `w + update`, where
/// `update` is the gradient after the transform (negative along the gradient: the
/// learning-rate scaling flips the sign, as optax's does).
#[derive(Clone)]
pub struct Optimizer(Arc<dyn Transform>);

impl fmt::Debug for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<&Optimizer> for Optimizer {
    fn from(optimizer: &Optimizer) -> Self {
        optimizer.clone()
    }
}

impl Optimizer {
    /// `transform` as an optimizer (or a part of a [`chain`]).
    pub fn new(transform: impl Transform + 'static) -> Self {
        Optimizer(Arc::new(transform))
    }

    /// SGD with learning rate `lr` and heavy-ball `momentum` (0: none); see [`Sgd`].
    pub fn sgd(lr: f32, momentum: f32) -> Self {
        Sgd { lr, momentum }.into()
    }

    /// AdamW with learning rate `lr` and optax's defaults ([`AdamW::new`]).
    pub fn adamw(lr: f32) -> Self {
        AdamW::new(lr).into()
    }

    /// Lion with learning rate `lr` and optax's defaults ([`Lion::new`]).
    pub fn lion(lr: f32) -> Self {
        Lion::new(lr).into()
    }

    /// Adafactor with learning rate `lr` and optax's defaults ([`Adafactor::new`]).
    pub fn adafactor(lr: f32) -> Self {
        Adafactor::new(lr).into()
    }

    /// The transform.
    pub fn transform(&self) -> &dyn Transform {
        &*self.0
    }

    /// Its name ([`Transform::name`]): `sgd`, `adamw`, `lion`, `adafactor`, `chain(..)`.
    pub fn name(&self) -> String {
        self.0.name()
    }

    /// Checks the hyper-parameters ([`Transform::validate`]): an [`Error::Optimizer`]
    /// names the first out of range.
    pub fn validate(&self) -> Result<()> {
        self.0.validate()
    }

    /// The state tensors kept for a trained parameter of shape `shape`
    /// ([`Transform::slots`]). Two slots of one name are an [`Error::Optimizer`] (their
    /// inputs, `<slot>(<parameter>)`, would clash).
    pub fn state_slots(&self, shape: &[usize]) -> Result<Vec<Slot>> {
        let slots = self.0.slots(shape);
        if let Some((_, slot)) =
            (slots.iter().enumerate()).find(|(i, s)| slots[..*i].iter().any(|t| t.name == s.name))
        {
            return Err(Error::Optimizer {
                optimizer: format!("{self:?}"),
                problem: OptimizerProblem::RepeatedSlot {
                    slot: slot.name.to_string(),
                },
            });
        }
        Ok(slots)
    }

    /// Names of the f32 scalar inputs the step program takes each step.
    pub fn scalar_inputs(&self) -> Vec<String> {
        self.0.scalar_names()
    }

    /// Values of [`Optimizer::scalar_inputs`] for step `t` (the first step is 1) under
    /// `schedule`.
    pub fn scalars(&self, t: u64, schedule: &Schedule) -> Vec<f32> {
        self.0.scalars(t, schedule)
    }

    /// The learning rate of step `t` under `schedule`, if the optimizer applies one.
    pub fn learning_rate(&self, t: u64, schedule: &Schedule) -> Option<f32> {
        self.0.learning_rate(t, schedule)
    }

    /// Emits the update ([`Transform::update`]), checking that it keeps one state
    /// value per slot and was given one scalar per name.
    pub(crate) fn apply(
        &self,
        e: &mut Emitter<'_, '_>,
        params: &mut [Param],
        scalars: &[ValueId],
    ) -> Result<()> {
        let internal = |reason: String| Error::Optimizer {
            optimizer: format!("{self:?}"),
            problem: OptimizerProblem::Internal { reason },
        };
        let names = self.0.scalar_names().len();
        if scalars.len() != names {
            return Err(internal(format!(
                "{} scalars given for {names} scalar inputs",
                scalars.len()
            )));
        }
        self.0.update(e, params, scalars)?;
        for p in params.iter() {
            let slots = self.0.slots(&e.shape(p.weight)).len();
            if p.state.len() != slots {
                return Err(internal(format!(
                    "the update left {} state values for `{}`'s {slots} slots",
                    p.state.len(),
                    p.name
                )));
            }
        }
        Ok(())
    }
}
