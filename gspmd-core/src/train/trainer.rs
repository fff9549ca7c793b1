//! [`Trainer`]: the training loop. It runs one step program per call and feeds the
//! step's new parameters and optimizer state back as the next step's inputs. On a mesh
//! (of threads or of MPI ranks) they never leave the devices: each device keeps its
//! block of every parameter and state tensor between steps, and only the data goes in
//! and the loss comes out.

use super::data::{Batch, DataLayout};
use super::init::Initializer;
use super::schedule::Schedule;
use super::step::TrainStep;
use crate::error::{Error, Result};
use crate::executable::{CompileOptions, Executable, compile, compile_with};
use crate::ir::{DType, Literal, Program, TensorType};
use crate::runtime::{Input, Output, ThreadMesh, Value, interpret};
use crate::sharding::Mesh;

/// Name of the step count in a [`Trainer::checkpoint`].
pub const STEP_COUNT: &str = "optimizer.step";

/// Where a trainer runs its steps.
pub enum Engine {
    /// The reference interpreter on the global step program: the oracle. Parameters and
    /// state are host arrays.
    Reference,
    /// The step compiled for a mesh and run on a thread mesh. Parameters and state stay
    /// resident on the devices between steps.
    Mesh {
        /// The compiled step.
        exe: Box<Executable>,
        /// The devices.
        threads: ThreadMesh,
    },
    /// The step compiled for a mesh and run on the ranks of an MPI job, one per device,
    /// every rank driving its own trainer through the same calls. Each rank keeps its
    /// blocks of the parameters and state between steps; [`Trainer::checkpoint`] and
    /// [`Trainer::params`] gather them on every rank (save on one rank), and
    /// [`Trainer::restore`] cuts each rank's blocks from the tensors given on every rank.
    #[cfg(feature = "mpi")]
    Mpi {
        /// The compiled step.
        exe: Box<Executable>,
        /// This rank's device.
        mesh: crate::runtime::MpiMesh,
    },
}

impl Engine {
    /// Compiles `program` for `mesh` and starts the mesh's threads.
    pub fn mesh(program: &Program, mesh: Mesh) -> Result<Self> {
        Engine::mesh_with(program, mesh, &CompileOptions::default())
    }

    /// [`Engine::mesh`] compiled with `options` (see [`compile_with`]).
    pub fn mesh_with(program: &Program, mesh: Mesh, options: &CompileOptions) -> Result<Self> {
        let exe = Box::new(compile_with(program, &mesh, options)?);
        let threads = ThreadMesh::new(mesh)?;
        Ok(Engine::Mesh { exe, threads })
    }

    /// Compiles `program` for `mesh` and makes the ranks of `mpi` its devices (see
    /// [`MpiMesh::reshape`](crate::runtime::MpiMesh::reshape)); every rank calls it.
    #[cfg(feature = "mpi")]
    pub fn mpi(program: &Program, mesh: Mesh, mpi: crate::runtime::MpiMesh) -> Result<Self> {
        let exe = Box::new(compile(program, &mesh)?);
        let mesh = mpi.reshape(mesh)?;
        Ok(Engine::Mpi { exe, mesh })
    }

    /// The compiled step on a mesh (of threads or ranks); `None` on the interpreter.
    fn executable(&self) -> Option<&Executable> {
        match self {
            Engine::Reference => None,
            Engine::Mesh { exe, .. } => Some(exe),
            #[cfg(feature = "mpi")]
            Engine::Mpi { exe, .. } => Some(exe),
        }
    }

    /// Runs `exe` (compiled for this engine's mesh) on its devices; on the interpreter
    /// an [`Error::TrainerInput`].
    fn execute(
        &self,
        exe: &Executable,
        inputs: &[Input],
        outputs: &[Output],
    ) -> Result<Vec<Value>> {
        match self {
            Engine::Reference => Err(Error::TrainerInput {
                name: exe.spmd().program.name.clone(),
                message: "a partitioned program given to the reference interpreter".into(),
            }),
            Engine::Mesh { threads, .. } => exe.execute(threads, inputs, outputs),
            #[cfg(feature = "mpi")]
            Engine::Mpi { mesh, .. } => exe.execute_mpi(mesh, inputs, outputs),
        }
    }
}

/// What a [`Trainer`]'s trained parameters start from.
#[derive(Debug, Clone, PartialEq)]
pub enum Initial {
    /// One global array per trained parameter, in [`TrainStep::params`] order.
    Values(Vec<Literal>),
    /// Drawn by name; on a mesh each device makes only its blocks.
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

/// Runs training steps of one [`TrainStep`] on one [`Engine`].
///
/// It holds every input of the step program: the trained parameters and their
/// optimizer state (carried from step to step), the data inputs (given anew each step)
/// and the optimizer's scalars (computed on the host for each step).
pub struct Trainer {
    step: TrainStep,
    engine: Engine,
    /// One per input of the step program, in input order. On a mesh, the carried
    /// inputs (parameters and state) live on the devices and their slots here are
    /// unused.
    inputs: Vec<Literal>,
    /// For each input: its resident key if it is carried from step to step.
    carried: Vec<Option<String>>,
    /// For each output: the input it becomes in the next step.
    feeds: Vec<Option<usize>>,
    steps_done: u64,
    /// The learning rate of each step, as a multiple of the optimizer's.
    schedule: Schedule,
}

impl Trainer {
    /// A trainer starting from `initial` ([`Initial`]: one global array per trained
    /// parameter in [`TrainStep::params`] order, or an [`Initializer`]) with zero
    /// optimizer state. On a mesh an [`Initializer`] and the zero state make each
    /// device's blocks only (no global array on the host). A wrong count, dtype or
    /// shape, or a parameter no initializer rule names, is an [`Error::TrainerInput`]
    /// naming the parameter.
    pub fn new(step: TrainStep, engine: Engine, initial: impl Into<Initial>) -> Result<Self> {
        let initial = initial.into();
        if let Initial::Values(values) = &initial
            && values.len() != step.params.len()
        {
            return Err(Error::TrainerInput {
                name: "initial parameters".into(),
                message: format!(
                    "{} trained parameters but {} initial values",
                    step.params.len(),
                    values.len()
                ),
            });
        }
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
        let on_mesh = matches!(engine, Engine::Mesh { .. });
        // Data and scalars start as zeros (set per step); carried inputs live on the
        // devices on a mesh (an empty placeholder here), else on the host.
        let mut inputs: Vec<Literal> = (step.program.params.iter().zip(&carried))
            .map(|(&p, key)| {
                let ty = step.program.ty(p);
                match key {
                    Some(_) if on_mesh => Literal::full(&[0], ty.dtype, 0.0),
                    _ => Literal::full(&ty.shape, ty.dtype, 0.0),
                }
            })
            .collect();
        let mut given = vec![false; inputs.len()];
        match &initial {
            Initial::Values(values) => {
                for (p, value) in step.params.iter().zip(values) {
                    check(&step.program, p.input, &p.name, value)?;
                    inputs[p.input] = value.clone();
                    given[p.input] = true;
                }
            }
            Initial::Init(init) if !on_mesh => {
                for p in &step.params {
                    let shape = &step.program.ty(step.program.params[p.input]).shape;
                    inputs[p.input] = init.global(&p.name, shape)?;
                }
            }
            Initial::Init(_) => {}
        }
        if let Engine::Mesh { exe, threads } = &engine {
            let init = match &initial {
                Initial::Init(init) => Some(init),
                Initial::Values(_) => None,
            };
            for (index, key) in carried.iter().enumerate() {
                let Some(key) = key else { continue };
                let sharding = &exe.spmd().inputs[index].1;
                if given[index] {
                    threads.upload(key, &inputs[index], sharding)?;
                    continue;
                }
                let ty = step.program.ty(step.program.params[index]);
                let param = step.params.iter().find(|p| p.input == index);
                let blocks = (0..threads.mesh().num_devices())
                    .map(|d| {
                        let block = sharding.device_block(threads.mesh(), &ty.shape, d);
                        match (init, param) {
                            (Some(init), Some(p)) => init.block(&p.name, &ty.shape, &block),
                            _ => {
                                let sizes: Vec<usize> = block.iter().map(|b| b.1).collect();
                                Ok(Literal::full(&sizes, ty.dtype, 0.0))
                            }
                        }
                    })
                    .collect::<Result<Vec<Literal>>>()?;
                threads.upload_blocks(key, ty, sharding, blocks)?;
            }
        }
        let trainer = Trainer {
            step,
            engine,
            inputs,
            carried,
            feeds,
            steps_done: 0,
            schedule: Schedule::Constant,
        };
        // On MPI every rank made the global values above; each keeps its blocks.
        #[cfg(feature = "mpi")]
        if matches!(trainer.engine, Engine::Mpi { .. }) {
            trainer.upload_carried()?;
        }
        Ok(trainer)
    }

    /// On a mesh, puts every carried input's host value on the devices.
    fn upload_carried(&self) -> Result<()> {
        for (index, key) in self.carried.iter().enumerate() {
            let Some(key) = key else { continue };
            let value = &self.inputs[index];
            match &self.engine {
                Engine::Reference => {}
                Engine::Mesh { exe, threads } => {
                    threads.upload(key, value, &exe.spmd().inputs[index].1)?;
                }
                #[cfg(feature = "mpi")]
                Engine::Mpi { exe, mesh } => {
                    mesh.upload(key, value, &exe.spmd().inputs[index].1)?
                }
            }
        }
        Ok(())
    }

    /// The current global value of carried input `index` (fetched from the devices on
    /// a mesh).
    fn carried_value(&self, index: usize) -> Result<Literal> {
        match (&self.engine, &self.carried[index]) {
            (Engine::Mesh { threads, .. }, Some(key)) => threads.fetch(key),
            #[cfg(feature = "mpi")]
            (Engine::Mpi { mesh, .. }, Some(key)) => mesh.fetch(key),
            _ => Ok(self.inputs[index].clone()),
        }
    }

    /// The inputs and outputs of a step on a mesh: carried values resident, data
    /// inputs as `blocks` (per data input, each device's block) if given, the rest
    /// global.
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
        let outputs = (self.feeds.iter())
            .map(
                |feed| match feed.and_then(|input| self.carried[input].clone()) {
                    Some(key) => Output::Resident(key),
                    None => Output::Global,
                },
            )
            .collect();
        (inputs, outputs)
    }

    /// A trainer on the reference interpreter.
    pub fn reference(step: TrainStep, initial: impl Into<Initial>) -> Result<Self> {
        Trainer::new(step, Engine::Reference, initial)
    }

    /// A trainer whose step is compiled for `mesh` and run on its threads.
    pub fn on_mesh(step: TrainStep, mesh: Mesh, initial: impl Into<Initial>) -> Result<Self> {
        let engine = Engine::mesh(&step.program, mesh)?;
        Trainer::new(step, engine, initial)
    }

    /// [`Trainer::on_mesh`] with the step compiled with `options` (see [`compile_with`]:
    /// e.g. a memory limit, or which gathered weights to keep for the backward pass).
    pub fn on_mesh_with(
        step: TrainStep,
        mesh: Mesh,
        initial: impl Into<Initial>,
        options: &CompileOptions,
    ) -> Result<Self> {
        let engine = Engine::mesh_with(&step.program, mesh, options)?;
        Trainer::new(step, engine, initial)
    }

    /// A trainer whose step is compiled for `mesh` and run on the ranks of `mpi`, one
    /// per device: every rank of the job calls it with the same arguments, then makes
    /// the same calls on its trainer (see [`Engine::Mpi`]).
    #[cfg(feature = "mpi")]
    pub fn on_mpi(
        step: TrainStep,
        mesh: Mesh,
        mpi: crate::runtime::MpiMesh,
        initial: impl Into<Initial>,
    ) -> Result<Self> {
        let engine = Engine::mpi(&step.program, mesh, mpi)?;
        Trainer::new(step, engine, initial)
    }

    /// Runs one step with `data` (one global array per [`TrainStep::data`] input, in
    /// that order) and returns the loss before the update. On success the parameters
    /// and optimizer state are the step's outputs; on error they are unchanged.
    pub fn step(&mut self, data: &[Literal]) -> Result<f32> {
        self.check_data_count(data.len())?;
        for (&index, value) in self.step.data.iter().zip(data) {
            self.inputs[index] = value.clone();
        }
        self.run(None)
    }

    /// [`Trainer::step`] with a [`Batch`]: global arrays, or on a mesh each device's
    /// blocks (as [`Dataset::batches`](super::Dataset::batches) cuts them for
    /// [`Trainer::data_layout`]), bound to each device without a global batch. Blocks
    /// on the reference interpreter are an [`Error::TrainerInput`].
    pub fn step_batch(&mut self, batch: &Batch) -> Result<f32> {
        match batch {
            Batch::Global(data) => self.step(data),
            Batch::Blocks(blocks) => {
                self.check_data_count(blocks.len())?;
                if matches!(self.engine, Engine::Reference) {
                    return Err(Error::TrainerInput {
                        name: "data".into(),
                        message: "per-device blocks given to a trainer without a mesh".into(),
                    });
                }
                self.run(Some(blocks))
            }
        }
    }

    /// Where the data inputs go on a mesh: the mesh and each data input's sharding
    /// (`None` on the reference interpreter).
    pub fn data_layout(&self) -> Option<DataLayout> {
        let exe = self.engine.executable()?;
        Some(DataLayout {
            mesh: exe.spmd().mesh.clone(),
            shardings: (self.step.data.iter())
                .map(|&i| exe.spmd().inputs[i].1.clone())
                .collect(),
        })
    }

    /// An [`Error::TrainerInput`] unless `count` data inputs were given.
    fn check_data_count(&self, count: usize) -> Result<()> {
        if count != self.step.data.len() {
            return Err(Error::TrainerInput {
                name: "data".into(),
                message: format!(
                    "the step takes {} data inputs but {count} were given",
                    self.step.data.len(),
                ),
            });
        }
        Ok(())
    }

    /// Runs the step on the data set in `inputs`, or, on a mesh, on `blocks` (per data
    /// input, each device's block) if given.
    fn run(&mut self, blocks: Option<&[Vec<Literal>]>) -> Result<f32> {
        let scalars = (self.step.optimizer).scalars(self.steps_done + 1, &self.schedule);
        for (&index, value) in self.step.scalars.iter().zip(scalars) {
            self.inputs[index] = Literal::scalar_f32(value);
        }
        let loss = match &self.engine {
            Engine::Reference => {
                let outputs = interpret(&self.step.program, &self.inputs)?;
                let loss = loss_of(outputs.get(TrainStep::LOSS))?;
                for (output, value) in outputs.into_iter().enumerate() {
                    if let Some(input) = self.feeds[output] {
                        self.inputs[input] = value;
                    }
                }
                loss
            }
            engine => {
                let exe = engine
                    .executable()
                    .expect("a mesh engine has an executable");
                let (inputs, outputs) = self.resident_io(blocks);
                global_loss(engine.execute(exe, &inputs, &outputs)?)?
            }
        };
        self.steps_done += 1;
        Ok(loss)
    }

    /// The same trainer with the learning rate of step `t` set to the optimizer's
    /// `lr` times `schedule.factor(t)` (the step program is not rebuilt: the learning
    /// rate is one of its inputs). A bad schedule is an [`Error::Optimizer`].
    pub fn with_schedule(mut self, schedule: Schedule) -> Result<Self> {
        schedule.validate()?;
        self.schedule = schedule;
        Ok(self)
    }

    /// The learning rate the next step will use.
    pub fn learning_rate(&self) -> f32 {
        self.step.optimizer.lr() * self.schedule.factor(self.steps_done + 1)
    }

    /// The step program and its layout.
    pub fn train_step(&self) -> &TrainStep {
        &self.step
    }

    /// The engine the steps run on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine, to run other programs on its devices once training is done (on MPI,
    /// the one `MpiMesh` of the process).
    pub fn into_engine(self) -> Engine {
        self.engine
    }

    /// Number of steps run (or restored from a checkpoint).
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// The current value of each trained parameter, by name, in [`TrainStep::params`]
    /// order (fetched from the devices on a mesh).
    pub fn params(&self) -> Result<Vec<(String, Literal)>> {
        self.step
            .params
            .iter()
            .map(|p| Ok((p.name.clone(), self.carried_value(p.input)?)))
            .collect()
    }

    /// Everything needed to resume: the trained parameters by name, each optimizer
    /// state tensor by its slot name (`m(w1)`, ...) and the step count as an i32 scalar
    /// named [`STEP_COUNT`] (saturating at `i32::MAX`).
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
    /// [`Trainer::checkpoint`] gives them; other names are ignored). Every one must be
    /// present and typed as the step program expects (a float tensor of another float
    /// dtype is converted: f32 weights load into bf16 parameters), else
    /// [`Error::TrainerInput`] and nothing changes.
    pub fn restore(&mut self, tensors: &[(String, Literal)]) -> Result<()> {
        let find = |name: &str| {
            tensors
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .ok_or_else(|| Error::TrainerInput {
                    name: name.to_string(),
                    message: "missing from the checkpoint".into(),
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
        let count = find(STEP_COUNT)?;
        let steps_done = count
            .as_i32()
            .filter(|a| a.ndim() == 0)
            .and_then(|a| a.iter().next().copied())
            .and_then(|c| u64::try_from(c).ok())
            .ok_or_else(|| Error::TrainerInput {
                name: STEP_COUNT.into(),
                message: format!(
                    "expected a non-negative i32 scalar, got {}{:?}",
                    count.dtype(),
                    count.shape()
                ),
            })?;
        for (input, value) in updates {
            self.inputs[input] = value;
        }
        self.upload_carried()?;
        self.steps_done = steps_done;
        Ok(())
    }
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
            message: format!(
                "expected {want}, got {}",
                TensorType::new(value.shape(), value.dtype())
            ),
        });
    }
    Ok(())
}

/// The loss from a mesh step's outputs: [`loss_of`] the global one at
/// [`TrainStep::LOSS`].
fn global_loss(values: Vec<Value>) -> Result<f32> {
    let loss = values.into_iter().nth(TrainStep::LOSS);
    loss_of(loss.and_then(Value::into_global).as_ref())
}

/// The loss from the step's output, which must be an f32 scalar.
fn loss_of(output: Option<&Literal>) -> Result<f32> {
    output
        .and_then(Literal::as_f32)
        .and_then(|a| a.iter().next().copied())
        .ok_or_else(|| Error::TrainerInput {
            name: "loss".into(),
            message: "the step did not return an f32 loss".into(),
        })
}

/// A model's forward program (its loss, no update) compiled once for a [`Trainer`]'s
/// engine, to compute a validation loss on held-out data
/// ([`Trainer::evaluate`]).
pub struct Evaluator {
    model: Program,
    loss: usize,
    /// The compiled model on a mesh.
    exe: Option<Box<Executable>>,
}

impl Trainer {
    /// An [`Evaluator`] of `model` (the program the step was built from) and its output
    /// `loss`: compiled for the trainer's mesh (once), or run on the interpreter.
    pub fn evaluator(&self, model: &Program, loss: usize) -> Result<Evaluator> {
        let exe = match self.engine.executable() {
            Some(exe) => Some(Box::new(compile(model, &exe.spmd().mesh)?)),
            None => None,
        };
        if loss >= model.outputs.len() || model.params.len() > self.step.program.params.len() {
            return Err(Error::TrainRequest {
                program: model.name.clone(),
                message: format!(
                    "output {loss} of a model with {} outputs and {} parameters is not the \
                     loss of this step's model",
                    model.outputs.len(),
                    model.params.len()
                ),
            });
        }
        Ok(Evaluator {
            model: model.clone(),
            loss,
            exe,
        })
    }

    /// The loss of `eval`'s model on `data` (one global array per [`TrainStep::data`]
    /// input, in that order, shaped as the model's — without an accumulation dim) with
    /// the current parameters, which are not changed. On a mesh a parameter sharded
    /// alike in both programs is read where it resides; any other is fetched.
    pub fn evaluate(&self, eval: &Evaluator, data: &[Literal]) -> Result<f32> {
        self.check_data_count(data.len())?;
        let data_position = |index: usize| self.step.data.iter().position(|&d| d == index);
        match (self.engine.executable(), &eval.exe) {
            (Some(exe), Some(model_exe)) => {
                let n = eval.model.params.len();
                // A trained parameter is read in place if both programs shard it alike,
                // else fetched (assembled on the host) and given as a global array.
                let resident = |index: usize| {
                    self.carried[index]
                        .as_deref()
                        .filter(|_| exe.spmd().inputs[index] == model_exe.spmd().inputs[index])
                };
                let fetched: Vec<Option<Literal>> = (0..n)
                    .map(|i| match (data_position(i), resident(i)) {
                        (None, None) => self.carried_value(i).map(Some),
                        _ => Ok(None),
                    })
                    .collect::<Result<_>>()?;
                let inputs: Vec<Input> = (0..n)
                    .map(|i| match (data_position(i), &fetched[i]) {
                        (Some(j), _) => Input::Global(&data[j]),
                        (None, Some(value)) => Input::Global(value),
                        (None, None) => Input::Resident(resident(i).unwrap_or_default()),
                    })
                    .collect();
                let outputs = vec![Output::Global; eval.model.outputs.len()];
                let values = self.engine.execute(model_exe, &inputs, &outputs)?;
                let loss = values
                    .into_iter()
                    .nth(eval.loss)
                    .and_then(Value::into_global);
                loss_of(loss.as_ref())
            }
            _ => {
                let inputs: Vec<Literal> = (0..eval.model.params.len())
                    .map(|index| match data_position(index) {
                        Some(j) => Ok(data[j].clone()),
                        None => self.carried_value(index),
                    })
                    .collect::<Result<_>>()?;
                let outputs = interpret(&eval.model, &inputs)?;
                loss_of(outputs.get(eval.loss))
            }
        }
    }
}
