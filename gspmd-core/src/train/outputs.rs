//! Aux outputs (JAX's `has_aux`): model outputs besides the loss — accuracy, logits,
//! router load — that a training step ([`StepOptions::aux`](super::StepOptions::aux))
//! or an evaluation ([`Trainer::evaluate_with`](super::Trainer::evaluate_with)) also
//! returns, by name. Only the loss is differentiated; an aux output is a plain forward
//! value, sharded as the model annotates it.
//!
//! A caller asks for each aux output it wants ([`Fetch`]): assembled on the host, or as
//! the blocks of its process's devices. An aux output it does not ask for costs no
//! gather (its blocks are dropped where they are).

use super::names::glob_match;
use crate::error::{Error, InputProblem, RequestProblem, Result};
use crate::ir::{Literal, Program};
use crate::runtime::{Output, Value};

/// The name of output `index` of `model`: its value's name (`.named("accuracy")`, a
/// `#[shard] let accuracy = ..` binding, `out = [(.., name = "..")]`), else
/// `output<index>`.
pub fn output_name(model: &Program, index: usize) -> String {
    model
        .outputs
        .get(index)
        .and_then(|&v| model.node(v).name.clone())
        .unwrap_or_else(|| format!("output{index}"))
}

/// An aux output of a [`TrainStep`](super::TrainStep).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuxOutput {
    /// Its name ([`output_name`] of the model output).
    pub name: String,
    /// Its output index in the step program.
    pub output: usize,
}

/// The model outputs other than `loss` whose names match one of `patterns`
/// ([`glob_match`]), in output order, as `(name, model output index)`. Errors
/// ([`Error::TrainRequest`]): a pattern that matches no such output, or two matched
/// outputs of one name.
pub(super) fn select_aux(
    model: &Program,
    loss: usize,
    patterns: &[String],
) -> Result<Vec<(String, usize)>> {
    let request = |problem: RequestProblem| Error::TrainRequest {
        program: model.name.clone(),
        problem,
    };
    let candidates: Vec<(String, usize)> = (0..model.outputs.len())
        .filter(|&i| i != loss)
        .map(|i| (output_name(model, i), i))
        .collect();
    if let Some(unused) = patterns
        .iter()
        .find(|p| !candidates.iter().any(|(n, _)| glob_match(p, n)))
    {
        return Err(request(RequestProblem::UnmatchedAux {
            pattern: unused.clone(),
            names: candidates.iter().map(|(n, _)| n.clone()).collect(),
        }));
    }
    let selected: Vec<(String, usize)> = candidates
        .into_iter()
        .filter(|(n, _)| patterns.iter().any(|p| glob_match(p, n)))
        .collect();
    if let Some((i, (name, _))) = (selected.iter().enumerate())
        .find(|(i, (name, _))| selected[..*i].iter().any(|(n, _)| n == name))
    {
        let first = selected.iter().find(|(n, _)| n == name).map_or(0, |s| s.1);
        return Err(request(RequestProblem::RepeatedAux {
            first,
            second: selected[i].1,
            name: name.clone(),
        }));
    }
    Ok(selected)
}

/// How a caller wants an aux output back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fetch {
    /// Assembled into the global array on every process (gathered when sharded).
    #[default]
    Global,
    /// The blocks of this process's devices, as they reside (no gather; for an
    /// unreduced output, each device's partial value, as [`Output::Shards`]).
    Blocks,
}

/// What a training step or an evaluation returns: the loss and the aux outputs asked
/// for, by name, in the order asked ([`Value::Global`] for [`Fetch::Global`],
/// [`Value::Shards`] for [`Fetch::Blocks`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// The loss (before the step's update).
    pub loss: f32,
    /// The aux outputs asked for.
    pub aux: Vec<(String, Value)>,
}

impl StepOutput {
    /// The aux output `name`, if it was asked for.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.aux.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The global array of aux output `name`, if it was asked for with
    /// [`Fetch::Global`].
    pub fn global(&self, name: &str) -> Option<&Literal> {
        match self.get(name)? {
            Value::Global(literal) => Some(literal),
            _ => None,
        }
    }
}

/// Sets the request of each `asked` output in `outputs` as its [`Fetch`] says, where
/// `available` are the run's named outputs (name, output index; the first of a
/// repeated name); returns the output index of each, in order. A name not `available`
/// is an [`Error::UnknownOutput`] of `program`; a name asked twice an
/// [`Error::TrainerInput`].
pub(super) fn request_aux(
    program: &str,
    available: &[(String, usize)],
    asked: &[(&str, Fetch)],
    outputs: &mut [Output],
) -> Result<Vec<usize>> {
    if let Some((_, (name, _))) =
        (asked.iter().enumerate()).find(|(i, (name, _))| asked[..*i].iter().any(|(n, _)| n == name))
    {
        return Err(Error::TrainerInput {
            name: (*name).to_string(),
            problem: InputProblem::Repeated,
        });
    }
    asked
        .iter()
        .map(|&(name, fetch)| {
            let Some(&(_, index)) = available.iter().find(|(n, _)| n == name) else {
                return Err(Error::UnknownOutput {
                    program: program.to_string(),
                    name: name.to_string(),
                    available: available.iter().map(|(n, _)| n.clone()).collect(),
                });
            };
            outputs[index] = match fetch {
                Fetch::Global => Output::Global,
                Fetch::Blocks => Output::Shards,
            };
            Ok(index)
        })
        .collect()
}

/// The loss (output `loss`, an assembled f32 scalar) and the `asked` aux outputs (at
/// output `indices`, as [`request_aux`] gives them) of a run's `values`.
pub(super) fn step_output(
    mut values: Vec<Value>,
    loss: usize,
    asked: &[(&str, Fetch)],
    indices: &[usize],
) -> Result<StepOutput> {
    let aux = (asked.iter().zip(indices))
        .map(|(&(name, _), &i)| {
            let value = std::mem::replace(&mut values[i], Value::Resident);
            (name.to_string(), value)
        })
        .collect();
    let loss = values.into_iter().nth(loss).and_then(Value::into_global);
    let loss = (loss.as_ref())
        .and_then(Literal::as_f32)
        .and_then(|a| a.iter().next().copied())
        .ok_or_else(|| Error::TrainerInput {
            name: "loss".into(),
            problem: InputProblem::Invalid {
                reason: "the step did not return an f32 loss".into(),
            },
        })?;
    Ok(StepOutput { loss, aux })
}
