//! [`Transform`]: one gradient transformation (optax's `GradientTransformation`), the
//! unit optimizers are built of. It declares per-parameter state [`Slot`]s and per-step
//! host scalars, and emits its update into the step program through an [`Emitter`].

use super::emit::Emitter;
use crate::error::{Error, OptimizerProblem, Result};
use crate::ir::{Location, ValueId};
use crate::train::Schedule;
use std::fmt;

/// One state tensor a transform keeps for a trained parameter: shaped like the
/// parameter (or like it without one dim, for a factored accumulator) and sharded like
/// it on the dims it keeps. The step program names it `<name>(<parameter>)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// `m`, `v`, `momentum`, `v_row`, `v_col`, ...: distinct within an optimizer.
    pub name: &'static str,
    /// The dim of the parameter it lacks (a factored accumulator), if any.
    pub without_dim: Option<usize>,
}

impl Slot {
    /// A slot shaped and sharded like its parameter.
    pub const fn like(name: &'static str) -> Self {
        Slot {
            name,
            without_dim: None,
        }
    }
}

/// A trained parameter as a transform sees it: `update` is the gradient as transformed
/// by the transforms before (the step applies `weight + update` at the end, so a
/// descent direction is negative, as in optax), `state` holds this transform's state
/// values, one per [`Transform::slots`]. [`Transform::update`] replaces both with their
/// new values.
#[derive(Debug, Clone)]
pub struct Param {
    /// The parameter's name (its `%i` if it has none).
    pub name: String,
    /// The parameter's value before the step.
    pub weight: ValueId,
    /// The update so far; replaced by the transformed update.
    pub update: ValueId,
    /// This transform's state, in [`Transform::slots`] order; replaced by the new state.
    pub state: Vec<ValueId>,
    /// Where the parameter is defined: its update nodes are located there.
    pub(crate) location: Location,
}

/// A gradient transformation written in the IR's ops: optax's `init` is
/// [`Transform::slots`] (state starts at zero), optax's `update` is
/// [`Transform::update`]. Hyper-parameters are constants of the step program; values
/// that change per step (a scheduled learning rate, bias corrections) are f32 scalar
/// inputs computed on the host ([`Transform::scalars`]), so a schedule never recompiles.
/// Wrap one in an [`Optimizer`](super::Optimizer) to use it, alone or in a
/// [`chain`](super::chain).
pub trait Transform: fmt::Debug + Send + Sync {
    /// Its name, e.g. `scale_by_adam` (what a checkpoint records of an optimizer).
    fn name(&self) -> String;

    /// Checks the hyper-parameters: an [`Error::Optimizer`] names the first out of
    /// range ([`check_hyper_parameters`] does the usual ones).
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// The state kept for a parameter of shape `shape` (none by default).
    fn slots(&self, _shape: &[usize]) -> Vec<Slot> {
        Vec::new()
    }

    /// Names of the f32 scalar inputs it takes each step (none by default).
    fn scalar_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// The values of [`Transform::scalar_names`] for step `t` (the first step is 1)
    /// under the trainer's `schedule`.
    fn scalars(&self, _t: u64, _schedule: &Schedule) -> Vec<f32> {
        Vec::new()
    }

    /// The learning rate of step `t` if this transform applies one (reported by
    /// [`Trainer::learning_rate`](crate::train::Trainer::learning_rate)).
    fn learning_rate(&self, _t: u64, _schedule: &Schedule) -> Option<f32> {
        None
    }

    /// Emits the update of all trained `params` together (a global norm needs them
    /// all), given the step's `scalars` (one per [`Transform::scalar_names`]): replaces
    /// each [`Param::update`] and [`Param::state`] by its new value.
    fn update(
        &self,
        e: &mut Emitter<'_, '_>,
        params: &mut [Param],
        scalars: &[ValueId],
    ) -> Result<()>;
}

/// An [`Error::Optimizer`] for the first of `checks` — `(name, value, in range, the
/// range)` — that is out of range, naming it and `transform`.
pub fn check_hyper_parameters(
    transform: &dyn fmt::Debug,
    checks: &[(&str, f32, bool, &str)],
) -> Result<()> {
    match checks.iter().find(|c| !c.2) {
        Some((name, value, _, range)) => Err(Error::Optimizer {
            optimizer: format!("{transform:?}"),
            problem: OptimizerProblem::HyperParameter {
                name: name.to_string(),
                value: *value,
                requirement: format!("finite and {range}"),
            },
        }),
        None => Ok(()),
    }
}

/// Whether `x` is finite and `> 0`.
pub(super) fn positive(x: f32) -> bool {
    x > 0.0 && x.is_finite()
}

/// Whether `x` is finite and `>= 0`.
pub(super) fn non_negative(x: f32) -> bool {
    x == 0.0 || positive(x)
}

/// Whether `x` is in `[0, 1)`.
pub(super) fn unit(x: f32) -> bool {
    (0.0..1.0).contains(&x)
}
