//! [`Trainer`]: the training loop. It runs one step program per call and feeds the
//! step's new parameters and optimizer state back as the next step's inputs. On a mesh
//! they never leave the devices: each device keeps its block of every parameter and
//! state tensor between steps, and only the data goes in and the loss comes out.

use super::schedule::Schedule;
use super::step::TrainStep;
use crate::error::{Error, Result};
use crate::executable::{Executable, compile};
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
}

impl Engine {
    /// Compiles `program` for `mesh` and starts the mesh's threads.
    pub fn mesh(program: &Program, mesh: Mesh) -> Result<Self> {
        let exe = Box::new(compile(program, &mesh)?);
        let threads = ThreadMesh::new(mesh)?;
        Ok(Engine::Mesh { exe, threads })
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
    /// A trainer starting from `initial` (one global array per trained parameter, in
    /// [`TrainStep::params`] order) with zero optimizer state. A wrong count, dtype or
    /// shape is an [`Error::TrainerInput`] naming the parameter.
    pub fn new(step: TrainStep, engine: Engine, initial: Vec<Literal>) -> Result<Self> {
        if initial.len() != step.params.len() {
            return Err(Error::TrainerInput {
                name: "initial parameters".into(),
                message: format!(
                    "{} trained parameters but {} initial values",
                    step.params.len(),
                    initial.len()
                ),
            });
        }
        // Every input starts as zeros of its type; data and scalars are set per step.
        let mut inputs: Vec<Literal> = step
            .program
            .params
            .iter()
            .map(|&p| {
                let ty = step.program.ty(p);
                Literal::full(&ty.shape, ty.dtype, 0.0)
            })
            .collect();
        for (p, value) in step.params.iter().zip(initial) {
            check(&step.program, p.input, &p.name, &value)?;
            inputs[p.input] = value;
        }
        let mut carried = vec![None; inputs.len()];
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
        let mut trainer = Trainer {
            step,
            engine,
            inputs,
            carried,
            feeds,
            steps_done: 0,
            schedule: Schedule::Constant,
        };
        trainer.upload_carried()?;
        Ok(trainer)
    }

    /// On a mesh, puts every carried input's host value on the devices.
    fn upload_carried(&mut self) -> Result<()> {
        if let Engine::Mesh { exe, threads } = &self.engine {
            for (index, key) in self.carried.iter().enumerate() {
                if let Some(key) = key {
                    threads.upload(key, &self.inputs[index], &exe.spmd.inputs[index].1)?;
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
            _ => Ok(self.inputs[index].clone()),
        }
    }

    /// A trainer on the reference interpreter.
    pub fn reference(step: TrainStep, initial: Vec<Literal>) -> Result<Self> {
        Trainer::new(step, Engine::Reference, initial)
    }

    /// A trainer whose step is compiled for `mesh` and run on its threads.
    pub fn on_mesh(step: TrainStep, mesh: Mesh, initial: Vec<Literal>) -> Result<Self> {
        let engine = Engine::mesh(&step.program, mesh)?;
        Trainer::new(step, engine, initial)
    }

    /// Runs one step with `data` (one global array per [`TrainStep::data`] input, in
    /// that order) and returns the loss before the update. On success the parameters
    /// and optimizer state are the step's outputs; on error they are unchanged.
    pub fn step(&mut self, data: &[Literal]) -> Result<f32> {
        if data.len() != self.step.data.len() {
            return Err(Error::TrainerInput {
                name: "data".into(),
                message: format!(
                    "the step takes {} data inputs but {} were given",
                    self.step.data.len(),
                    data.len()
                ),
            });
        }
        for (&index, value) in self.step.data.iter().zip(data) {
            self.inputs[index] = value.clone();
        }
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
            Engine::Mesh { exe, threads } => {
                let inputs: Vec<Input> = (self.inputs.iter().zip(&self.carried))
                    .map(|(value, key)| match key {
                        Some(key) => Input::Resident(key),
                        None => Input::Global(value),
                    })
                    .collect();
                let outputs: Vec<Output> = (self.feeds.iter())
                    .map(
                        |feed| match feed.and_then(|input| self.carried[input].clone()) {
                            Some(key) => Output::Resident(key),
                            None => Output::Global,
                        },
                    )
                    .collect();
                let values = exe.execute(threads, &inputs, &outputs)?;
                let loss = values
                    .into_iter()
                    .nth(TrainStep::LOSS)
                    .and_then(Value::into_global);
                loss_of(loss.as_ref())?
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
