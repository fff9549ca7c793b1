//! [`chain`]: transforms applied one after the other (optax's `chain`), each to the
//! updates the one before produced, each with its own state and scalars.

use super::Optimizer;
use super::emit::Emitter;
use super::transform::{Param, Slot, Transform};
use crate::error::{Error, OptimizerProblem, Result};
use crate::ir::ValueId;
use crate::train::Schedule;

/// Transforms in order, under a name (`chain(..)` or an optimizer's, e.g. `adamw`).
#[derive(Debug)]
pub(super) struct Chain {
    name: String,
    parts: Vec<Optimizer>,
}

/// `parts` applied in order: the state slots and scalars of the chain are theirs, in
/// order. Its name is `chain(<names of parts>)`.
pub fn chain(parts: impl IntoIterator<Item = Optimizer>) -> Optimizer {
    let parts: Vec<Optimizer> = parts.into_iter().collect();
    let names: Vec<String> = parts.iter().map(Optimizer::name).collect();
    Chain::named(&format!("chain({})", names.join(", ")), parts)
}

impl Chain {
    /// `parts` chained under `name`.
    pub(super) fn named(name: &str, parts: Vec<Optimizer>) -> Optimizer {
        Optimizer::new(Chain {
            name: name.to_string(),
            parts,
        })
    }
}

impl Transform for Chain {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn validate(&self) -> Result<()> {
        self.parts.iter().try_for_each(Optimizer::validate)
    }

    fn slots(&self, shape: &[usize]) -> Vec<Slot> {
        (self.parts.iter())
            .flat_map(|p| p.transform().slots(shape))
            .collect()
    }

    fn scalar_names(&self) -> Vec<String> {
        (self.parts.iter())
            .flat_map(|p| p.transform().scalar_names())
            .collect()
    }

    fn scalars(&self, t: u64, schedule: &Schedule) -> Vec<f32> {
        (self.parts.iter())
            .flat_map(|p| p.transform().scalars(t, schedule))
            .collect()
    }

    fn learning_rate(&self, t: u64, schedule: &Schedule) -> Option<f32> {
        (self.parts.iter()).find_map(|p| p.transform().learning_rate(t, schedule))
    }

    fn update(
        &self,
        e: &mut Emitter<'_, '_>,
        params: &mut [Param],
        scalars: &[ValueId],
    ) -> Result<()> {
        let mut scalars = scalars;
        // Where each parameter's next part's state starts in its chain state.
        let mut offsets = vec![0; params.len()];
        let all_state: Vec<Vec<ValueId>> = params.iter().map(|p| p.state.clone()).collect();
        let mut new_state: Vec<Vec<ValueId>> = vec![Vec::new(); params.len()];
        for part in &self.parts {
            let count = part.transform().scalar_names().len();
            let Some((mine, rest)) = scalars.split_at_checked(count) else {
                return Err(Error::Optimizer {
                    optimizer: self.name.clone(),
                    problem: OptimizerProblem::Internal {
                        reason: format!("{} scalars for the chain", scalars.len()),
                    },
                });
            };
            scalars = rest;
            let mut views: Vec<Param> = Vec::with_capacity(params.len());
            for ((p, offset), state) in params.iter().zip(&mut offsets).zip(&all_state) {
                let slots = part.transform().slots(&e.shape(p.weight)).len();
                let end = *offset + slots;
                let Some(state) = state.get(*offset..end) else {
                    return Err(Error::Optimizer {
                        optimizer: self.name.clone(),
                        problem: OptimizerProblem::Internal {
                            reason: format!("too few state values for `{}`", p.name),
                        },
                    });
                };
                views.push(Param {
                    state: state.to_vec(),
                    ..p.clone()
                });
                *offset = end;
            }
            part.apply(e, &mut views, mine)?;
            for ((p, view), new) in params.iter_mut().zip(views).zip(&mut new_state) {
                p.update = view.update;
                new.extend(view.state);
            }
        }
        for (p, new) in params.iter_mut().zip(new_state) {
            p.state = new;
        }
        Ok(())
    }
}
