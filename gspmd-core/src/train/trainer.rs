//! [`Trainer`]: the host-side training loop. It holds the current parameters and
//! optimizer state as global arrays, runs one step program per call, and feeds the
//! step's outputs back as the next step's inputs.

use super::step::TrainStep;
use crate::error::{Error, Result};
use crate::executable::{Executable, compile};
use crate::ir::{DType, Literal, Program, TensorType};
use crate::runtime::{ThreadMesh, interpret};
use crate::sharding::Mesh;

/// Name of the step count in a [`Trainer::checkpoint`].
pub const STEP_COUNT: &str = "optimizer.step";

/// Where a trainer runs its steps.
pub enum Engine {
    /// The reference interpreter on the global step program: the oracle.
    Reference,
    /// The step compiled for a mesh, run on a thread mesh with global inputs and outputs.
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

    /// Runs `program` (the step this engine was made for) on global `inputs`. The one
    /// place where a step executes.
    fn run(&self, program: &Program, inputs: &[Literal]) -> Result<Vec<Literal>> {
        match self {
            Engine::Reference => interpret(program, inputs),
            Engine::Mesh { exe, threads } => exe.run(threads, inputs),
        }
    }
}

/// Runs training steps of one [`TrainStep`] on one [`Engine`].
///
/// It holds every input of the step program: the trained parameters and their
/// optimizer state (carried from step to step), the data inputs (given anew each step)
/// and the optimizer's scalars (computed on the host for each step).
pub struct Trainer {
    step: TrainStep,
    engine: Engine,
    /// One per input of the step program, in input order.
    inputs: Vec<Literal>,
    steps_done: u64,
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
        Ok(Trainer {
            step,
            engine,
            inputs,
            steps_done: 0,
        })
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
        let scalars = self.step.optimizer.scalars(self.steps_done + 1);
        for (&index, value) in self.step.scalars.iter().zip(scalars) {
            self.inputs[index] = Literal::scalar_f32(value);
        }
        let outputs = self.engine.run(&self.step.program, &self.inputs)?;
        let loss = outputs
            .get(TrainStep::LOSS)
            .and_then(Literal::as_f32)
            .and_then(|a| a.iter().next().copied())
            .ok_or_else(|| Error::TrainerInput {
                name: "loss".into(),
                message: "the step did not return an f32 loss".into(),
            })?;
        let mut outputs: Vec<Option<Literal>> = outputs.into_iter().map(Some).collect();
        for (output, input) in self.step.feedback() {
            if let Some(value) = outputs.get_mut(output).and_then(Option::take) {
                self.inputs[input] = value;
            }
        }
        self.steps_done += 1;
        Ok(loss)
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
    /// order.
    pub fn params(&self) -> Vec<(&str, &Literal)> {
        self.step
            .params
            .iter()
            .map(|p| (p.name.as_str(), &self.inputs[p.input]))
            .collect()
    }

    /// Everything needed to resume: the trained parameters by name, each optimizer
    /// state tensor by its slot name (`m(w1)`, ...) and the step count as an i32 scalar
    /// named [`STEP_COUNT`] (saturating at `i32::MAX`).
    pub fn checkpoint(&self) -> Vec<(String, Literal)> {
        let mut tensors = Vec::new();
        for p in &self.step.params {
            tensors.push((p.name.clone(), self.inputs[p.input].clone()));
            for s in &p.state {
                tensors.push((s.name.clone(), self.inputs[s.input].clone()));
            }
        }
        let count = i32::try_from(self.steps_done).unwrap_or(i32::MAX);
        tensors.push((
            STEP_COUNT.into(),
            Literal::full(&[], DType::I32, f64::from(count)),
        ));
        tensors
    }

    /// Sets the parameters, optimizer state and step count from `tensors` (as
    /// [`Trainer::checkpoint`] gives them; other names are ignored). Every one must be
    /// present and typed as the step program expects, else [`Error::TrainerInput`] and
    /// nothing changes.
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
                let value = find(name)?;
                check(&self.step.program, input, name, value)?;
                updates.push((input, value.clone()));
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
        self.steps_done = steps_done;
        Ok(())
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
