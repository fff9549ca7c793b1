//! [`Trainer`]: the training loop. It runs one step program per call and feeds the
//! step's new parameters and optimizer state back as the next step's inputs, on any
//! [`Backend`]: the parameters and optimizer state never leave the devices — each
//! device keeps its block of every parameter and state tensor between steps, made there
//! at the start — and only the data goes in and the loss comes out.

use super::data::{Batch, DataLayout};
use super::init::Initializer;
use super::outputs::{Fetch, StepOutput, output_name, request_aux, step_output};
use super::schedule::Schedule;
use super::step::TrainStep;
use crate::error::{Error, InputProblem, RequestProblem, Result};
use crate::executable::{CompileOptions, Executable, compile_for};
use crate::ir::random::{fold_in_data, key_data};
use crate::ir::{Builder, DType, Literal, Program, TensorType};
use crate::runtime::{Backend, Input, Output, Reference, Resident, ThreadMesh};
use crate::sharding::Mesh;

/// Name of the step count in a [`Trainer::checkpoint`].
pub const STEP_COUNT: &str = "optimizer.step";

/// What a [`Trainer`]'s trained parameters start from.
#[derive(Debug, Clone, PartialEq)]
pub enum Initial {
    /// One global array per trained parameter, in [`TrainStep::params`] order (the same
    /// on every process; each keeps its devices' blocks).
    Values(Vec<Literal>),
    /// Drawn by name; each device makes only its blocks.
    Init(Initializer),
}

impl From<Vec<Literal>> for Initial {
    fn from(values: Vec<Literal>) -> Self {
        Initial::Values(values)
    }
}

impl From<Initializer> for Initial {
    fn from(init: Initializer) -> Self {
        Initial::Init(init)
    }
}

impl From<&Initializer> for Initial {
    fn from(init: &Initializer) -> Self {
        Initial::Init(init.clone())
    }
}

/// The device-store key of step input `index` named `name` (carried values only).
fn resident_key(index: usize, name: &str) -> String {
    format!("train/{index}/{name}")
}

/// Runs training steps of one [`TrainStep`] on one [`Backend`].
///
/// It holds the step compiled for the backend, and every input of the step program:
/// the trained parameters and their optimizer state (carried from step to step,
/// resident on the devices), the data inputs (given anew each step) and the
/// optimizer's scalars (computed on the host for each step). On a backend of several
/// processes (MPI ranks), every process drives its own trainer through the same calls.
pub struct Trainer {
    step: TrainStep,
    backend: Box<dyn Backend>,
    /// The step compiled for `backend`.
    exe: Executable,
    /// One per input of the step program, in input order: the data inputs and the
    /// scalars of the next step; the slots of carried inputs are unused.
    inputs: Vec<Literal>,
    /// For each input: its resident key if it is carried from step to step.
    carried: Vec<Option<String>>,
    /// For each output: the input it becomes in the next step.
    feeds: Vec<Option<usize>>,
    steps_done: u64,
    /// The learning rate of each step, as a multiple of the optimizer's.
    schedule: Schedule,
    /// The seed of the step's random keys ([`RNG`](super::RNG)).
    rng_seed: u32,
}

impl Trainer {
    /// A trainer of `step` on `backend`, starting from `initial` ([`Initial`]: one
    /// global array per trained parameter in [`TrainStep::params`] order, or an
    /// [`Initializer`]) with zero optimizer state. The step is compiled for the backend
    /// ([`compile_for`]). An [`Initializer`] and the zero state make each device's
    /// blocks only, on the device's process: no process builds a whole parameter or
    /// state tensor. A wrong count, dtype or shape, or a parameter no initializer rule
    /// names, is an [`Error::TrainerInput`] naming the parameter.
    pub fn new(
        step: TrainStep,
        backend: impl Backend + 'static,
        initial: impl Into<Initial>,
    ) -> Result<Self> {
        Trainer::with_options(step, backend, initial, &CompileOptions::default())
    }

    /// [`Trainer::new`] with the step compiled with `options` (see
    /// [`compile_with`](crate::compile_with): e.g. a memory limit, which gathered
    /// weights to keep for the backward pass, or the donated inputs: with
    /// `donated: step.carried()` each step updates the parameters and optimizer state in
    /// place, holding one copy of them instead of the old and the new, but a step that
    /// fails loses them — the trainer must then be restored, say from a checkpoint).
    pub fn with_options(
        step: TrainStep,
        backend: impl Backend + 'static,
        initial: impl Into<Initial>,
        options: &CompileOptions,
    ) -> Result<Self> {
        let initial = initial.into();
        if let Initial::Values(values) = &initial
            && values.len() != step.params.len()
        {
            return Err(Error::TrainerInput {
                name: "initial parameters".into(),
                problem: InputProblem::Count {
                    expected: step.params.len(),
                    given: values.len(),
                },
            });
        }
        let exe = compile_for(&step.program, &backend, options)?;
        let mut carried = vec![None; step.program.params.len()];
        let mut feeds = vec![None; step.program.outputs.len()];
        for (output, input) in step.feedback() {
            let name = step
                .program
                .node(step.program.params[input])
                .name
                .clone()
                .unwrap_or_default();
            carried[input] = Some(resident_key(input, &name));
            feeds[output] = Some(input);
        }
        // Data and scalars start as zeros (set per step); carried inputs live on the
        // devices (an empty placeholder here).
        let inputs: Vec<Literal> = (step.program.params.iter().zip(&carried))
            .map(|(&p, key)| {
                let ty = step.program.ty(p);
                match key {
                    Some(_) => Literal::full(&[0], ty.dtype, 0.0),
                    None => Literal::full(&ty.shape, ty.dtype, 0.0),
                }
            })
            .collect();
        let trainer = Trainer {
            step,
            backend: Box::new(backend),
            exe,
            inputs,
            carried,
            feeds,
            steps_done: 0,
            schedule: Schedule::Constant,
            rng_seed: 0,
        };
        trainer.place_initial(&initial)?;
        Ok(trainer)
    }

    /// Puts every carried input on the devices: the trained parameters from `initial`,
    /// the optimizer state as zeros.
    fn place_initial(&self, initial: &Initial) -> Result<()> {
        let program = &self.step.program;
        for (index, key) in self.carried.iter().enumerate() {
            let Some(key) = key else { continue };
            let ty = program.ty(program.params[index]);
            let sharding = &self.exe.spmd().inputs[index].1;
            let param = self.step.params.iter().find(|p| p.input == index);
            match (initial, param) {
                (Initial::Values(values), Some(p)) => {
                    let position = (self.step.params.iter())
                        .position(|q| q.input == p.input)
                        .unwrap_or_default();
                    let value = &values[position];
                    check(program, index, &p.name, value)?;
                    self.backend.upload(key, value, sharding)?;
                }
                _ => {
                    let mesh = self.backend.mesh();
                    let blocks = (self.backend.local_devices())
                        .map(|d| {
                            let block = sharding.device_block(mesh, &ty.shape, d);
                            match (initial, param) {
                                (Initial::Init(init), Some(p)) => {
                                    Ok(init.block(&p.name, &ty.shape, &block)?.convert(ty.dtype))
                                }
                                _ => {
                                    let sizes: Vec<usize> = block.iter().map(|b| b.1).collect();
                                    Ok(Literal::full(&sizes, ty.dtype, 0.0))
                                }
                            }
                        })
                        .collect::<Result<Vec<Literal>>>()?;
                    let resident = Resident {
                        ty: ty.clone(),
                        sharding: sharding.clone(),
                    };
                    self.backend.store_blocks(key, resident, blocks)?;
                }
            }
        }
        Ok(())
    }

    /// The inputs and outputs of a step: carried values resident, data inputs as
    /// `blocks` (per data input, the blocks of this process's devices) if given, the
    /// other inputs and the loss global, the aux outputs as blocks (no gather; the
    /// caller sets those it wants).
    fn resident_io<'a>(
        &'a self,
        blocks: Option<&'a [Vec<Literal>]>,
    ) -> (Vec<Input<'a>>, Vec<Output>) {
        let data_position = |index: usize| self.step.data.iter().position(|&d| d == index);
        let inputs = (self.inputs.iter().zip(&self.carried).enumerate())
            .map(
                |(index, (value, key))| match (key, blocks.zip(data_position(index))) {
                    (Some(key), _) => Input::Resident(key),
                    (None, Some((blocks, j))) => Input::Shards(&blocks[j]),
                    (None, None) => Input::Global(value),
                },
            )
            .collect();
        let outputs = (self.feeds.iter().enumerate())
            .map(
                |(k, feed)| match feed.and_then(|input| self.carried[input].clone()) {
                    Some(key) => Output::Resident(key),
                    None if k == TrainStep::LOSS => Output::Global,
                    None => Output::Shards,
                },
            )
            .collect();
        (inputs, outputs)
    }

    /// A trainer on the [`Reference`] interpreter: the oracle.
    pub fn reference(step: TrainStep, initial: impl Into<Initial>) -> Result<Self> {
        Trainer::new(step, Reference::new(), initial)
    }

    /// A trainer whose step is compiled for `mesh` and run on a new [`ThreadMesh`] of
    /// it.
    pub fn on_mesh(step: TrainStep, mesh: Mesh, initial: impl Into<Initial>) -> Result<Self> {
        Trainer::new(step, ThreadMesh::new(mesh)?, initial)
    }

    /// [`Trainer::on_mesh`] with the step compiled with `options` (see
    /// [`Trainer::with_options`]).
    pub fn on_mesh_with(
        step: TrainStep,
        mesh: Mesh,
        initial: impl Into<Initial>,
        options: &CompileOptions,
    ) -> Result<Self> {
        Trainer::with_options(step, ThreadMesh::new(mesh)?, initial, options)
    }

    /// Runs one step with `data` (one global array per [`TrainStep::data`] input, in
    /// that order; the same on every process) and returns the loss before the update.
    /// On success the parameters and optimizer state are the step's outputs; on error
    /// they are unchanged, unless the step donates them (see [`Trainer::with_options`]):
    /// then they are gone and the next step is an [`Error::Input`] naming them.
    pub fn step(&mut self, data: &[Literal]) -> Result<f32> {
        self.set_data(data)?;
        Ok(self.run(None, &[])?.loss)
    }

    /// [`Trainer::step`] with a [`Batch`]: global arrays, or the blocks of this
    /// process's devices (as [`Dataset::batches`](super::Dataset::batches) cuts them
    /// for [`Trainer::data_layout`]), bound to each device without a global batch.
    pub fn step_batch(&mut self, batch: &Batch) -> Result<f32> {
        Ok(self.step_with(batch, &[])?.loss)
    }

    /// [`Trainer::step_batch`] returning the loss and every aux output of the step
    /// ([`TrainStep::aux`]) assembled on the host: `loss, aux = step(batch)` of a JAX
    /// step built with `has_aux`.
    pub fn step_with_aux(&mut self, batch: &Batch) -> Result<StepOutput> {
        let names: Vec<String> = self.step.aux.iter().map(|a| a.name.clone()).collect();
        let asked: Vec<(&str, Fetch)> = (names.iter())
            .map(|n| (n.as_str(), Fetch::Global))
            .collect();
        self.step_with(batch, &asked)
    }

    /// [`Trainer::step_batch`] returning the loss and the aux outputs named in `aux`,
    /// each as its [`Fetch`] asks (assembled, or this process's devices' blocks); the
    /// step's other aux outputs are not gathered. A name the step does not return is an
    /// [`Error::UnknownOutput`] (and no step runs).
    pub fn step_with(&mut self, batch: &Batch, aux: &[(&str, Fetch)]) -> Result<StepOutput> {
        match batch {
            Batch::Global(data) => {
                self.set_data(data)?;
                self.run(None, aux)
            }
            Batch::Blocks(blocks) => {
                self.check_data_count(blocks.len())?;
                self.run(Some(blocks), aux)
            }
        }
    }

    /// Sets the data inputs of the next step to `data` (one global array per
    /// [`TrainStep::data`] input).
    fn set_data(&mut self, data: &[Literal]) -> Result<()> {
        self.check_data_count(data.len())?;
        for (&index, value) in self.step.data.iter().zip(data) {
            self.inputs[index] = value.clone();
        }
        Ok(())
    }

    /// Where the data inputs go: the mesh, each data input's sharding and this
    /// process's devices.
    pub fn data_layout(&self) -> DataLayout {
        let spmd = self.exe.spmd();
        DataLayout {
            mesh: spmd.mesh.clone(),
            shardings: (self.step.data.iter())
                .map(|&i| spmd.inputs[i].1.clone())
                .collect(),
            devices: self.backend.local_devices(),
        }
    }

    /// An [`Error::TrainerInput`] unless `count` data inputs were given.
    fn check_data_count(&self, count: usize) -> Result<()> {
        if count != self.step.data.len() {
            return Err(Error::TrainerInput {
                name: "data".into(),
                problem: InputProblem::Count {
                    expected: self.step.data.len(),
                    given: count,
                },
            });
        }
        Ok(())
    }

    /// Runs the step on the data set in `inputs`, or on `blocks` (per data input, the
    /// blocks of this process's devices) if given, returning the `aux` outputs asked.
    fn run(
        &mut self,
        blocks: Option<&[Vec<Literal>]>,
        aux: &[(&str, Fetch)],
    ) -> Result<StepOutput> {
        let t = self.steps_done + 1;
        let scalars = (self.step.optimizer).scalars(t, &self.schedule);
        for (&index, value) in self.step.scalars.iter().zip(scalars) {
            self.inputs[index] = Literal::scalar_f32(value);
        }
        if let Some(index) = self.step.rng {
            // Counts wrap at 2^32 steps, as JAX's fold_in of a u32.
            self.inputs[index] = fold_in_data(&key_data(self.rng_seed), t as u32)?;
        }
        let (inputs, mut outputs) = self.resident_io(blocks);
        let available: Vec<(String, usize)> = (self.step.aux.iter())
            .map(|a| (a.name.clone(), a.output))
            .collect();
        let indices = request_aux(&self.step.program.name, &available, aux, &mut outputs)?;
        let values = self.exe.execute(&*self.backend, &inputs, &outputs)?;
        let output = step_output(values, TrainStep::LOSS, aux, &indices)?;
        self.steps_done += 1;
        Ok(output)
    }

    /// The same trainer with the learning rate of step `t` set to the optimizer's
    /// `lr` times `schedule.factor(t)` (the step program is not rebuilt: the learning
    /// rate is one of its inputs). A bad schedule is an [`Error::Optimizer`].
    pub fn with_schedule(mut self, schedule: Schedule) -> Result<Self> {
        schedule.validate()?;
        self.schedule = schedule;
        Ok(self)
    }

    /// The same trainer with the step's random keys ([`RNG`](super::RNG)) drawn from `seed` (0 by
    /// default): step `t` gets `fold_in(key(seed), t)`, so the same seed and step give
    /// the same dropout on every backend and mesh, and after a restored checkpoint.
    pub fn with_rng_seed(mut self, seed: u32) -> Self {
        self.rng_seed = seed;
        self
    }

    /// The learning rate the next step will use (`None` if the optimizer applies none).
    pub fn learning_rate(&self) -> Option<f32> {
        (self.step.optimizer).learning_rate(self.steps_done + 1, &self.schedule)
    }

    /// The step program and its layout.
    pub fn train_step(&self) -> &TrainStep {
        &self.step
    }

    /// The step compiled for the backend (its report, memory and cost analyses).
    pub fn executable(&self) -> &Executable {
        &self.exe
    }

    /// The backend the steps run on (to run other programs on its devices, which hold
    /// the trainer's resident values).
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// The backend, to run other programs on its devices once training is done.
    pub fn into_backend(self) -> Box<dyn Backend> {
        self.backend
    }

    /// Number of steps run (or restored from a checkpoint).
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// Sets the step count (a checkpoint's).
    pub(super) fn set_steps_done(&mut self, steps: u64) {
        self.steps_done = steps;
    }

    /// The resident key of carried input `index`, if it is one.
    pub(super) fn carried_key(&self, index: usize) -> Option<&str> {
        self.carried.get(index).and_then(Option::as_deref)
    }

    /// The current global value of carried input `index`, assembled on every process
    /// from the devices' blocks.
    fn carried_value(&self, index: usize) -> Result<Literal> {
        match self.carried_key(index) {
            Some(key) => self.backend.fetch(key),
            None => Ok(self.inputs[index].clone()),
        }
    }

    /// The current value of each trained parameter, by name, in [`TrainStep::params`]
    /// order, assembled from the devices on every process.
    pub fn params(&self) -> Result<Vec<(String, Literal)>> {
        self.step
            .params
            .iter()
            .map(|p| Ok((p.name.clone(), self.carried_value(p.input)?)))
            .collect()
    }

    /// Everything needed to resume, assembled on every process: the trained
    /// parameters by name, each optimizer state tensor by its slot name (`m(w1)`, ...)
    /// and the step count as an i32 scalar named [`STEP_COUNT`] (saturating at
    /// `i32::MAX`).
    pub fn checkpoint(&self) -> Result<Vec<(String, Literal)>> {
        let mut tensors = Vec::new();
        for p in &self.step.params {
            tensors.push((p.name.clone(), self.carried_value(p.input)?));
            for s in &p.state {
                tensors.push((s.name.clone(), self.carried_value(s.input)?));
            }
        }
        let count = i32::try_from(self.steps_done).unwrap_or(i32::MAX);
        tensors.push((
            STEP_COUNT.into(),
            Literal::full(&[], DType::I32, f64::from(count)),
        ));
        Ok(tensors)
    }

    /// Sets the parameters, optimizer state and step count from `tensors` (as
    /// [`Trainer::checkpoint`] gives them, the same on every process; other names are
    /// ignored). Every one must be present and typed as the step program expects (a
    /// float tensor of another float dtype is converted: f32 weights load into bf16
    /// parameters), else [`Error::TrainerInput`] and nothing changes.
    pub fn restore(&mut self, tensors: &[(String, Literal)]) -> Result<()> {
        let find = |name: &str| {
            tensors
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .ok_or_else(|| Error::TrainerInput {
                    name: name.to_string(),
                    problem: InputProblem::Missing,
                })
        };
        let mut updates = Vec::new();
        for p in &self.step.params {
            let slots = std::iter::once((p.input, &p.name))
                .chain(p.state.iter().map(|s| (s.input, &s.name)));
            for (input, name) in slots {
                let value = float_to_fit(&self.step.program, input, find(name)?);
                check(&self.step.program, input, name, &value)?;
                updates.push((input, value));
            }
        }
        let steps_done = step_count(find(STEP_COUNT)?)?;
        for (input, value) in updates {
            if let Some(key) = self.carried_key(input) {
                let sharding = &self.exe.spmd().inputs[input].1;
                self.backend.upload(key, &value, sharding)?;
            }
        }
        self.steps_done = steps_done;
        Ok(())
    }
}

/// The step count a checkpoint's [`STEP_COUNT`] tensor holds: a non-negative i32
/// scalar, else an [`Error::TrainerInput`].
pub(super) fn step_count(count: &Literal) -> Result<u64> {
    count
        .as_i32()
        .filter(|a| a.ndim() == 0)
        .and_then(|a| a.iter().next().copied())
        .and_then(|c| u64::try_from(c).ok())
        .ok_or_else(|| Error::TrainerInput {
            name: STEP_COUNT.into(),
            problem: InputProblem::Invalid {
                reason: format!(
                    "expected a non-negative i32 scalar, got {}",
                    TensorType::new(count.shape(), count.dtype())
                ),
            },
        })
}

/// `value` converted to the dtype of input `index` of `program` when both are floats
/// (an f32 checkpoint restored into bf16 parameters, or back), else `value`.
fn float_to_fit(program: &Program, index: usize, value: &Literal) -> Literal {
    let want = program.ty(program.params[index]).dtype;
    if want.is_float() && value.dtype().is_float() {
        value.convert(want)
    } else {
        value.clone()
    }
}

/// Checks that `value` has the type of input `index` of `program`.
fn check(program: &Program, index: usize, name: &str, value: &Literal) -> Result<()> {
    let want = program.ty(program.params[index]);
    if value.dtype() != want.dtype || value.shape() != want.shape {
        return Err(Error::TrainerInput {
            name: name.to_string(),
            problem: InputProblem::Type {
                expected: want.clone(),
                given: TensorType::new(value.shape(), value.dtype()),
            },
        });
    }
    Ok(())
}

/// A model's forward program (its loss, no update) compiled once for a [`Trainer`]'s
/// backend, to compute a validation loss and the model's other outputs, by name, on
/// held-out data ([`Trainer::evaluate`], [`Trainer::evaluate_with`]).
pub struct Evaluator {
    model: Program,
    loss: usize,
    /// The model's other outputs: [`output_name`] and output index.
    aux: Vec<(String, usize)>,
    /// The model compiled for the trainer's backend.
    exe: Executable,
    /// For each trained parameter the model shards otherwise than the step: its input
    /// index and the program resharding it on the devices (from the step's sharding
    /// to the model's).
    reshards: Vec<(usize, Executable)>,
}

/// The device-store key under which [`Trainer::evaluate`] keeps input `index` resharded
/// for the model.
fn resharded_key(index: usize) -> String {
    format!("evaluate/{index}")
}

impl Trainer {
    /// An [`Evaluator`] of `model` (the program the step was built from) and its output
    /// `loss`, compiled for the trainer's backend (once), with a resharding program
    /// for each trained parameter the model shards otherwise than the step.
    pub fn evaluator(&self, model: &Program, loss: usize) -> Result<Evaluator> {
        if loss >= model.outputs.len() || model.params.len() > self.step.program.params.len() {
            return Err(Error::TrainRequest {
                program: model.name.clone(),
                problem: RequestProblem::NotTheStepsModel {
                    loss,
                    outputs: model.outputs.len(),
                    params: model.params.len(),
                },
            });
        }
        let backend = &*self.backend;
        let exe = compile_for(model, backend, &CompileOptions::default())?;
        let (step_inputs, model_inputs) = (&self.exe.spmd().inputs, &exe.spmd().inputs);
        let mut reshards = Vec::new();
        for index in 0..model.params.len() {
            if self.carried_key(index).is_some() && step_inputs[index] != model_inputs[index] {
                let (ty, from) = &step_inputs[index];
                let b = Builder::new("reshard");
                let x = b
                    .parameter("x", ty.shape.clone(), ty.dtype)
                    .annotate(from.clone());
                let y = x.shard(model_inputs[index].1.clone());
                let program = b.finish(&[&y])?;
                reshards.push((
                    index,
                    compile_for(&program, backend, &CompileOptions::default())?,
                ));
            }
        }
        let aux = (0..model.outputs.len())
            .filter(|&i| i != loss)
            .map(|i| (output_name(model, i), i))
            .collect();
        Ok(Evaluator {
            model: model.clone(),
            loss,
            aux,
            exe,
            reshards,
        })
    }

    /// The loss of `eval`'s model on `data` (one global array per [`TrainStep::data`]
    /// input, in that order, shaped as the model's — without an accumulation dim) with
    /// the current parameters, which are not changed. A parameter sharded alike in both
    /// programs is read where it resides; any other is resharded on the devices (no
    /// process holds more than its devices' blocks) and dropped afterwards.
    pub fn evaluate(&self, eval: &Evaluator, data: &[Literal]) -> Result<f32> {
        Ok(self.evaluate_with(eval, data, &[])?.loss)
    }

    /// [`Trainer::evaluate`] returning the loss and every other output of the model,
    /// by [`output_name`], assembled on the host.
    pub fn evaluate_with_aux(&self, eval: &Evaluator, data: &[Literal]) -> Result<StepOutput> {
        let asked: Vec<(&str, Fetch)> = (eval.aux.iter())
            .map(|(n, _)| (n.as_str(), Fetch::Global))
            .collect();
        self.evaluate_with(eval, data, &asked)
    }

    /// [`Trainer::evaluate`] returning the loss and the model outputs named in `aux`
    /// (by [`output_name`]), each as its [`Fetch`] asks; the model's other outputs are
    /// not gathered. A name the model's outputs (the loss aside) do not have is an
    /// [`Error::UnknownOutput`].
    pub fn evaluate_with(
        &self,
        eval: &Evaluator,
        data: &[Literal],
        aux: &[(&str, Fetch)],
    ) -> Result<StepOutput> {
        self.check_data_count(data.len())?;
        let mut outputs = vec![Output::Shards; eval.model.outputs.len()];
        outputs[eval.loss] = Output::Global;
        let indices = request_aux(&eval.model.name, &eval.aux, aux, &mut outputs)?;
        let backend = &*self.backend;
        for (index, reshard) in &eval.reshards {
            let from = self.carried_key(*index).unwrap_or_default();
            let to = Output::Resident(resharded_key(*index));
            reshard.execute(backend, &[Input::Resident(from)], &[to])?;
        }
        let data_position = |index: usize| self.step.data.iter().position(|&d| d == index);
        let keys: Vec<Option<String>> = (0..eval.model.params.len())
            .map(|i| match eval.reshards.iter().any(|(j, _)| *j == i) {
                true => Some(resharded_key(i)),
                false => self.carried_key(i).map(str::to_string),
            })
            .collect();
        let inputs: Vec<Input> = (keys.iter().enumerate())
            .map(|(i, key)| match (data_position(i), key) {
                (Some(j), _) => Input::Global(&data[j]),
                (None, Some(key)) => Input::Resident(key),
                (None, None) => Input::Global(&self.inputs[i]),
            })
            .collect();
        let values = eval.exe.execute(backend, &inputs, &outputs);
        for (index, _) in &eval.reshards {
            backend.remove(&resharded_key(*index))?;
        }
        step_output(values?, eval.loss, aux, &indices)
    }
}
