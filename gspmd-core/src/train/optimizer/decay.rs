//! [`add_decayed_weights`] (decoupled weight decay, optax's) over the parameters a
//! [`Mask`] of name patterns selects.

use super::Optimizer;
use super::emit::Emitter;
use super::transform::{Param, Transform, check_hyper_parameters, non_negative};
use crate::error::{Error, OptimizerProblem, Result};
use crate::ir::ValueId;
use crate::train::names::{glob_match, glob_match_any};

/// Which trained parameters a transform applies to, by name patterns
/// ([`glob_match`](crate::train::glob_match)). A pattern that matches no trained
/// parameter is an [`Error::Optimizer`] when the step is built (a misspelt pattern
/// would otherwise silently select nothing).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mask {
    /// Every parameter.
    #[default]
    All,
    /// The parameters matching one of these patterns.
    Only(Vec<String>),
    /// The parameters matching none of these patterns, e.g. `["*.bias", "*.scale"]`
    /// (biases and norm scales, which are usually not decayed).
    Except(Vec<String>),
}

impl Mask {
    /// `Except(patterns)`.
    pub fn except<S: AsRef<str>>(patterns: &[S]) -> Self {
        Mask::Except(patterns.iter().map(|p| p.as_ref().to_string()).collect())
    }

    /// `Only(patterns)`.
    pub fn only<S: AsRef<str>>(patterns: &[S]) -> Self {
        Mask::Only(patterns.iter().map(|p| p.as_ref().to_string()).collect())
    }

    /// Whether the parameter named `name` is selected.
    pub fn selects(&self, name: &str) -> bool {
        match self {
            Mask::All => true,
            Mask::Only(patterns) => glob_match_any(patterns, name),
            Mask::Except(patterns) => !glob_match_any(patterns, name),
        }
    }

    /// An [`Error::Optimizer`] (naming `owner`) for a pattern that matches none of
    /// `params`.
    pub(super) fn check(&self, owner: &dyn std::fmt::Debug, params: &[Param]) -> Result<()> {
        let (Mask::Only(patterns) | Mask::Except(patterns)) = self else {
            return Ok(());
        };
        match (patterns.iter()).find(|p| !params.iter().any(|q| glob_match(p, &q.name))) {
            Some(unused) => Err(Error::Optimizer {
                optimizer: format!("{owner:?}"),
                problem: OptimizerProblem::UnusedMask {
                    pattern: unused.clone(),
                },
            }),
            None => Ok(()),
        }
    }
}

/// `update + weight_decay * w` for the parameters `mask` selects.
#[derive(Debug, Clone, PartialEq)]
struct AddDecayedWeights {
    weight_decay: f32,
    mask: Mask,
}

/// Adds `weight_decay * w` (`weight_decay >= 0`) to the update of each parameter `w`
/// that `mask` selects: decoupled weight decay when it comes before the learning-rate
/// scaling (optax's `add_decayed_weights`). A decay of 0 emits nothing.
pub fn add_decayed_weights(weight_decay: f32, mask: Mask) -> Optimizer {
    Optimizer::new(AddDecayedWeights { weight_decay, mask })
}

impl Transform for AddDecayedWeights {
    fn name(&self) -> String {
        "add_decayed_weights".into()
    }

    fn validate(&self) -> Result<()> {
        let wd = self.weight_decay;
        check_hyper_parameters(self, &[("weight_decay", wd, non_negative(wd), ">= 0")])
    }

    fn update(&self, e: &mut Emitter<'_, '_>, params: &mut [Param], _: &[ValueId]) -> Result<()> {
        self.mask.check(self, params)?;
        if self.weight_decay == 0.0 {
            return Ok(());
        }
        e.each(params, |e, p| {
            if self.mask.selects(&p.name) {
                let decay = e.scale(p.weight, self.weight_decay)?;
                p.update = e.add(p.update, decay)?;
            }
            Ok(())
        })
    }
}
