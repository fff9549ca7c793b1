//! [`step_program`]: one training step as ONE program — forward, backward (by
//! [`grad`]) and the optimizer update — so that propagation and partitioning see the
//! whole step, and optimizer state is sharded like its parameter.

use super::accumulate::accumulated_loss;
use super::names::Trainable;
use super::optimizer::{Emitter, Optimizer, Param};
use super::outputs::{AuxOutput, select_aux};
use crate::autodiff::grad;
use crate::error::{Error, InputProblem, RequestProblem, Result};
use crate::ir::Appender;
use crate::ir::{DType, Literal, Program, TensorType, ValueId, verify};
use crate::sharding::Sharding;
use crate::simplify::eliminate_dead_code;

/// One optimizer state tensor of a trained parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSlot {
    /// `<slot>(<parameter>)`, e.g. `m(w1)`: the name of its input (and checkpoint key).
    pub name: String,
    /// Its input index in the step program.
    pub input: usize,
    /// The output index of its next value (named `new(<name>)`).
    pub output: usize,
}

/// A parameter the step updates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainedParam {
    /// The model parameter's name (its `%i` if it has none).
    pub name: String,
    /// Its input index: the same in the model and the step program.
    pub input: usize,
    /// The output index of its updated value (named `new(<name>)`).
    pub output: usize,
    /// Its optimizer state, one per [`Optimizer::state_slots`].
    pub state: Vec<StateSlot>,
}

/// Options of [`step_program_with`] beyond the optimizer (gradient clipping and
/// weight-decay masks are parts of the optimizer:
/// [`clip_by_global_norm`](super::clip_by_global_norm), [`Mask`](super::Mask)).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepOptions {
    /// Accumulate the gradients over this many microbatches: every data input (each
    /// model parameter that is not trained) takes a leading dim of this size, one
    /// microbatch per index, and the step's loss is the mean of the microbatches'
    /// losses, computed by a `scan` (one microbatch's activations alive at a time; its
    /// reverse pass sums the gradients). `None`: one batch.
    pub accumulate: Option<usize>,
    /// Glob patterns of the model outputs besides the loss that the step also returns
    /// (JAX's `has_aux`), by [`output_name`](super::output_name): e.g. `["accuracy"]`,
    /// or `["*"]` for all. Each is the forward value (not differentiated), sharded as
    /// the model annotates it. A pattern matching no such output is an
    /// [`Error::TrainRequest`]; so are aux outputs together with `accumulate`. Empty:
    /// the step returns the loss only and drops what only the other outputs need.
    pub aux: Vec<String>,
}

/// A training step program and what its inputs and outputs are.
///
/// Inputs: the model's parameters at their model indices (trained ones and data), then
/// the optimizer state of each trained parameter (in `params` order, slots in
/// [`Optimizer::state_slots`] order), then the optimizer's scalars
/// ([`Optimizer::scalar_inputs`]). Outputs: the loss (output 0), the updated trained
/// parameters (in `params` order), then the new optimizer state (in input order), then
/// the [`TrainStep::aux`] outputs. Feeding output [`TrainStep::feedback`]`.0` back as
/// input `.1` gives the next step's inputs.
#[derive(Debug, Clone)]
pub struct TrainStep {
    /// The step program.
    pub program: Program,
    /// The optimizer it applies.
    pub optimizer: Optimizer,
    /// The trained parameters, in the order they were asked for.
    pub params: Vec<TrainedParam>,
    /// Input indices of the model parameters that are not trained (data, targets,
    /// frozen weights), in index order: given anew each step.
    pub data: Vec<usize>,
    /// Input indices of the optimizer's per-step scalars.
    pub scalars: Vec<usize>,
    /// The options it was built with.
    pub options: StepOptions,
    /// The aux outputs ([`StepOptions::aux`]), in model output order.
    pub aux: Vec<AuxOutput>,
    /// Input index of the model's random key (the parameter named [`RNG`]), if it has
    /// one: not data, the trainer gives it a new key each step.
    pub rng: Option<usize>,
}

/// What an input of a training step program is ([`StepInput::role`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InputRole {
    /// Trained parameter [`TrainStep::params`]`[param]`, carried from step to step.
    Trained {
        /// Its position in [`TrainStep::params`].
        param: usize,
    },
    /// Optimizer state slot `slot` of trained parameter `param`, carried from step to
    /// step.
    State {
        /// The trained parameter's position in [`TrainStep::params`].
        param: usize,
        /// The slot's position in its [`TrainedParam::state`].
        slot: usize,
    },
    /// A data input ([`TrainStep::data`]): given anew each step.
    Data,
    /// One of the optimizer's per-step scalars ([`TrainStep::scalars`]: the learning
    /// rate, ...), computed by a [`Trainer`](super::Trainer) for each step.
    Scalar,
    /// The step's random key ([`RNG`]).
    Rng,
}

/// One input of a training step program, as [`TrainStep::inputs`] describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepInput {
    /// Its position among the program's parameters.
    pub index: usize,
    /// Its name (the model parameter's, a state slot's `m(w)`, a scalar's
    /// `learning_rate`); `#i` for a parameter without one.
    pub name: String,
    /// Its type.
    pub ty: TensorType,
    /// What it is.
    pub role: InputRole,
}

/// The name of a model parameter that is the step's random key (an `i32[2]` key of
/// [`crate::ir::random`], e.g. for dropout): like Flax's `rngs`, the trainer feeds it,
/// not the data — at step `t` (counted from 1, restored with a checkpoint) the key
/// `fold_in(key(seed), t)` ([`crate::ir::random::fold_in_data`]) of the trainer's seed
/// ([`Trainer::with_rng_seed`](super::Trainer::with_rng_seed)), so that every step draws
/// anew and the same on every mesh; the model splits or folds it per layer.
pub const RNG: &str = "rng";

impl TrainStep {
    /// Output index of the loss.
    pub const LOSS: usize = 0;

    /// `(output, input)` pairs: the outputs that become the next step's inputs.
    pub fn feedback(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.params.iter().flat_map(|p| {
            std::iter::once((p.output, p.input)).chain(p.state.iter().map(|s| (s.output, s.input)))
        })
    }

    /// Every input of the step program, in input order: its index, name, type and
    /// [`InputRole`]. The program's inputs are exactly these; feeding it (with
    /// [`Executable::run`](crate::Executable::run), or arranged by name with
    /// [`TrainStep::feed`]) checks each value against them.
    pub fn inputs(&self) -> Vec<StepInput> {
        let program = &self.program;
        (program.params.iter().enumerate())
            .map(|(index, &p)| {
                let node = program.node(p);
                StepInput {
                    index,
                    name: node.name.clone().unwrap_or_else(|| format!("#{index}")),
                    ty: node.ty.clone(),
                    role: self.role(index),
                }
            })
            .collect()
    }

    /// The role of input `index` ([`InputRole::Data`] for an index no other role has).
    fn role(&self, index: usize) -> InputRole {
        for (param, p) in self.params.iter().enumerate() {
            if p.input == index {
                return InputRole::Trained { param };
            }
            if let Some(slot) = p.state.iter().position(|s| s.input == index) {
                return InputRole::State { param, slot };
            }
        }
        if self.scalars.contains(&index) {
            InputRole::Scalar
        } else if self.rng == Some(index) {
            InputRole::Rng
        } else {
            InputRole::Data
        }
    }

    /// The step program's inputs, in input order, from values given by name
    /// ([`TrainStep::inputs`]' names): each input must be given exactly once, with its
    /// type. A missing input is an [`Error::Input`] with [`InputProblem::Missing`]
    /// naming it (no value is made up for it), a value of another shape or dtype one
    /// with [`InputProblem::Type`]; a name given twice is [`InputProblem::Repeated`],
    /// a name the step has no input of [`InputProblem::Unknown`] (with the index one
    /// past the inputs).
    pub fn feed<'a>(
        &self,
        named: impl IntoIterator<Item = (&'a str, Literal)>,
    ) -> Result<Vec<Literal>> {
        let inputs = self.inputs();
        let error = |index: usize, name: &str, problem| Error::Input {
            index,
            name: name.to_string(),
            problem,
        };
        let mut values: Vec<Option<Literal>> = vec![None; inputs.len()];
        for (name, value) in named {
            let Some(input) = inputs.iter().find(|i| i.name == name) else {
                let available = inputs.iter().map(|i| i.name.clone()).collect();
                return Err(error(
                    inputs.len(),
                    name,
                    InputProblem::Unknown { available },
                ));
            };
            let given = TensorType::new(value.shape(), value.dtype());
            if given != input.ty {
                let expected = input.ty.clone();
                let problem = InputProblem::Type { expected, given };
                return Err(error(input.index, name, problem));
            }
            if values[input.index].replace(value).is_some() {
                return Err(error(input.index, name, InputProblem::Repeated));
            }
        }
        (values.into_iter().zip(&inputs))
            .map(|(value, input)| {
                value.ok_or_else(|| error(input.index, &input.name, InputProblem::Missing))
            })
            .collect()
    }

    /// The inputs carried from step to step (the trained parameters and their
    /// optimizer state), ascending: what a training step donates
    /// ([`CompileOptions::donated`](crate::CompileOptions::donated)) so that it updates
    /// them in place.
    pub fn carried(&self) -> Vec<usize> {
        let mut inputs: Vec<usize> = self.feedback().map(|(_, input)| input).collect();
        inputs.sort_unstable();
        inputs
    }
}

/// Builds the training step of `model`: the gradient of its output number `loss` (an f32
/// scalar) with respect to the `trained` parameters (f32, distinct; chosen by name
/// patterns, `&["layers.*"]`, or by index, `&[3, 4]`: [`Trainable`]), and the update of
/// each by `optimizer`.
///
/// For each trained parameter, the optimizer state tensors are new parameters shaped
/// like it (or like it without one dim, for a factored accumulator) and carrying its
/// annotation (without that dim), so the state is sharded like the weight. The
/// updated parameter and state pass through a `sharding_constraint` with that
/// annotation (none if the parameter has none), so they come out sharded like the
/// inputs they replace. Update nodes are located at their parameter's source line. The
/// model's other outputs are outputs of the step only if [`StepOptions::aux`] asks for
/// them (see [`step_program_with`]); nodes that only the others use are dropped.
///
/// Errors: [`Error::Optimizer`] for bad hyper-parameters, [`Error::TrainRequest`] for
/// an empty or repeated `trained` list, a pattern that matches nothing or a model
/// parameter named like an input the step adds (a state slot `m(w)`, a scalar
/// `learning_rate`, with accumulation the loop's `loss_sum`), and `grad`'s errors ([`Error::GradRequest`]: an
/// index out of range, a loss that is not an f32 scalar, a non-f32 trained parameter).
pub fn step_program(
    model: &Program,
    loss: usize,
    trained: impl Into<Trainable>,
    optimizer: &Optimizer,
) -> Result<TrainStep> {
    step_program_with(model, loss, trained, optimizer, &StepOptions::default())
}

/// [`step_program`] with `options` (gradient accumulation, aux outputs). Accumulation
/// over 0 microbatches, or together with aux outputs, is an [`Error::TrainRequest`].
pub fn step_program_with(
    model: &Program,
    loss: usize,
    trained: impl Into<Trainable>,
    optimizer: &Optimizer,
    options: &StepOptions,
) -> Result<TrainStep> {
    optimizer.validate()?;
    let trained = &trained.into().resolve(model)?[..];
    let request = |problem: RequestProblem| Error::TrainRequest {
        program: model.name.clone(),
        problem,
    };
    if trained.is_empty() {
        return Err(request(RequestProblem::NothingTrained));
    }
    if let Some((i, &p)) = trained
        .iter()
        .enumerate()
        .find(|(i, p)| trained[..*i].contains(p))
    {
        return Err(request(RequestProblem::RepeatedParameter {
            index: p,
            at: i,
        }));
    }
    let rng = rng_input(model)?;
    if rng.is_some() && options.accumulate.is_some() {
        return Err(request(RequestProblem::NotWithAccumulation {
            what: "a random key (`rng`)",
            why: "the microbatches would need a key each",
        }));
    }
    if !options.aux.is_empty() && options.accumulate.is_some() {
        return Err(request(RequestProblem::NotWithAccumulation {
            what: "aux outputs",
            why: "the step has one loss for all microbatches but no aux output of them",
        }));
    }
    let accumulated;
    let (model, loss) = match options.accumulate {
        None => (model, loss),
        Some(k) => {
            if k == 0 {
                return Err(request(RequestProblem::ZeroMicrobatches));
            }
            if let Some(&p) = trained.iter().find(|&&p| p >= model.params.len()) {
                return Err(request(RequestProblem::NoSuchParameter {
                    index: p,
                    params: model.params.len(),
                }));
            }
            if loss >= model.outputs.len() {
                return Err(request(RequestProblem::NoSuchOutput {
                    index: loss,
                    outputs: model.outputs.len(),
                }));
            }
            accumulated = accumulated_loss(model, loss, trained, k)?;
            (&accumulated, 0)
        }
    };
    let mut program = grad(model, loss, trained)?;
    program.name = format!("train_step_{}", model.name);
    let loss_value = program.outputs[loss];
    // Aux outputs: forward values of the gradient program (only the loss has a
    // reverse pass), returned after the update's outputs.
    let aux_values: Vec<(String, ValueId)> = select_aux(model, loss, &options.aux)?
        .into_iter()
        .map(|(name, i)| (name, program.outputs[i]))
        .collect();
    let gradients = program.outputs[model.outputs.len()..].to_vec();
    let weights: Vec<ValueId> = trained.iter().map(|&i| program.params[i]).collect();
    let names: Vec<String> = weights
        .iter()
        .map(|&w| {
            program
                .node(w)
                .name
                .clone()
                .unwrap_or_else(|| w.to_string())
        })
        .collect();

    let mut a = Appender::new(&mut program, "training step");
    let mut params = Vec::with_capacity(trained.len());
    let mut new_params = Vec::with_capacity(trained.len());
    let mut new_state = Vec::new();
    // State inputs first (all of them, in order), then the scalars, then the updates.
    // Outputs: the loss, the new parameters, then the new state in input order.
    let mut state_inputs = Vec::with_capacity(trained.len());
    let mut state_output = 1 + trained.len();
    for (i, ((&input, &w), name)) in trained.iter().zip(&weights).zip(&names).enumerate() {
        let (ty, annotation, location) = a.describe(w);
        a.location = location;
        let mut state = Vec::new();
        let mut values = Vec::new();
        for slot in optimizer.state_slots(&ty.shape)? {
            let slot_name = format!("{}({name})", slot.name);
            let (ty, annotation) = match slot.without_dim {
                None => (ty.clone(), annotation.clone()),
                Some(d) => {
                    let mut shape = ty.shape.clone();
                    shape.remove(d);
                    let annotation = annotation.as_ref().map(|s| without_dim(s, d));
                    (TensorType::new(shape, ty.dtype), annotation)
                }
            };
            let added = || format!("the optimizer's state `{}` of `{name}`", slot.name);
            name_is_free(model, &slot_name, added)?;
            let (index, v) = a.parameter(slot_name.clone(), ty, annotation);
            state.push(StateSlot {
                name: slot_name,
                input: index,
                output: state_output,
            });
            state_output += 1;
            values.push(v);
        }
        state_inputs.push(values);
        params.push(TrainedParam {
            name: name.clone(),
            input,
            output: 1 + i,
            state,
        });
    }
    let (scalars, scalar_values): (Vec<usize>, Vec<ValueId>) = (optimizer.scalar_inputs())
        .into_iter()
        .map(|s| {
            name_is_free(model, &s, || "an optimizer scalar".into())?;
            Ok(a.parameter(s, TensorType::new([], DType::F32), None))
        })
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    // The transforms see every parameter at once (a global norm needs them all); nodes
    // not of one parameter are located at the loss.
    let mut updates: Vec<Param> = (names.iter().zip(&weights).zip(&gradients))
        .zip(&state_inputs)
        .map(|(((name, &w), &g), state)| Param {
            name: name.clone(),
            weight: w,
            update: g,
            state: state.clone(),
            location: a.describe(w).2,
        })
        .collect();
    a.location = a.describe(loss_value).2;
    optimizer.apply(&mut Emitter::new(&mut a), &mut updates, &scalar_values)?;
    for ((p, &w), (update, state)) in
        (params.iter().zip(&weights)).zip(updates.iter().zip(&state_inputs))
    {
        let (_, annotation, location) = a.describe(w);
        a.location = location;
        // optax's `apply_updates`: the update already points downhill.
        let w_new = a.add(w, update.update)?;
        let w_new = a.constrain(w_new, annotation.clone())?;
        a.name(w_new, format!("new({})", p.name));
        new_params.push(w_new);
        for ((slot, &s), &old) in p.state.iter().zip(&update.state).zip(state) {
            let s = a.constrain(s, a.describe(old).1)?;
            a.name(s, format!("new({})", slot.name));
            new_state.push(s);
        }
    }

    program.outputs = std::iter::once(loss_value)
        .chain(new_params)
        .chain(new_state)
        .collect();
    let aux = (aux_values.into_iter())
        .map(|(name, v)| {
            program.outputs.push(v);
            let output = program.outputs.len() - 1;
            AuxOutput { name, output }
        })
        .collect();
    verify(&program)?;
    let program = eliminate_dead_code(&program);
    let data = (0..model.params.len())
        .filter(|i| !trained.contains(i) && rng != Some(*i))
        .collect();
    Ok(TrainStep {
        program,
        optimizer: optimizer.clone(),
        params,
        data,
        scalars,
        options: options.clone(),
        aux,
        rng,
    })
}

/// The index of `model`'s parameter named [`RNG`], if any; an [`Error::TrainRequest`]
/// unless it is an `i32[2]` key.
fn rng_input(model: &Program) -> Result<Option<usize>> {
    let Some(index) =
        (model.params.iter()).position(|&p| model.node(p).name.as_deref() == Some(RNG))
    else {
        return Ok(None);
    };
    let ty = model.ty(model.params[index]);
    if ty.dtype != DType::I32 || ty.shape[..] != [2] {
        return Err(Error::TrainRequest {
            program: model.name.clone(),
            problem: RequestProblem::RandomKey {
                index,
                name: RNG,
                ty: ty.clone(),
            },
        });
    }
    Ok(Some(index))
}

/// An [`Error::TrainRequest`] if `model` has a parameter named `name`, the name of an
/// input the step adds (`added` says which): the user's parameter and where it was
/// declared are named, not only the step's input.
pub(super) fn name_is_free(
    model: &Program,
    name: &str,
    added: impl FnOnce() -> String,
) -> Result<()> {
    let mut params = model.params.iter().map(|&p| model.node(p));
    match params.find(|node| node.name.as_deref() == Some(name)) {
        Some(node) => Err(Error::TrainRequest {
            program: model.name.clone(),
            problem: RequestProblem::ReservedName {
                name: name.to_string(),
                location: node.location,
                added: added(),
            },
        }),
        None => Ok(()),
    }
}

/// `sharding` without dim `dim` (the sharding of a factored accumulator).
fn without_dim(sharding: &Sharding, dim: usize) -> Sharding {
    let mut s = sharding.clone();
    s.dims.remove(dim);
    s
}
