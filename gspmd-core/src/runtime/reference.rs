//! [`Reference`]: the reference interpreter as a [`Backend`]: one device, one process,
//! global programs run as written (unpartitioned) on the calling thread, with the
//! interpreter's kernels and checks. The oracle of every differential test, now usable
//! wherever a backend is (a trainer, an evaluator, checkpoints).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::backend::{Backend, Input, Loaded, Output, Resident, Value};
use super::binding::{
    bind_inputs, check_target, donated_keys, global_output, padded_blocks, run_bound,
};
use super::deadline::{self, DeadlineGuard};
use super::interpreter::{eval_kernel, execute};
use super::memory::available_memory;
use crate::error::{Error, InputProblem, Result};
use crate::ir::Literal;
use crate::sharding::Mesh;

/// The reference interpreter as a backend: one device holding every value whole.
///
/// Programs are not partitioned for it ([`Backend::partitions`] is `false`): an
/// [`Executable`](crate::Executable) for it ([`compile_for`](crate::compile_for)) is the
/// global program as written ([`SpmdProgram::whole`](crate::partition::SpmdProgram::whole)), run by the evaluation loop of
/// [`interpret`](super::interpret), so SPMD ops are runtime errors as there.
#[derive(Debug)]
pub struct Reference {
    mesh: Mesh,
    memory_limit: usize,
    /// How long a run may take, if bounded.
    deadline: Option<Duration>,
    /// Each resident value, whole, by key.
    values: Mutex<HashMap<String, Literal>>,
    /// What each resident value is, by key.
    residents: Mutex<HashMap<String, Resident>>,
}

impl Default for Reference {
    fn default() -> Self {
        Reference::new()
    }
}

impl Reference {
    /// The interpreter, its live values limited to the host's [`available_memory`].
    pub fn new() -> Self {
        Reference {
            mesh: Mesh::new(Vec::<(String, usize)>::new()).unwrap_or_else(|_| unreachable!()),
            memory_limit: available_memory(),
            deadline: None,
            values: Mutex::new(HashMap::new()),
            residents: Mutex::new(HashMap::new()),
        }
    }

    /// This interpreter with its live values limited to `bytes` (an
    /// [`Error::OutOfMemory`] beyond).
    pub fn with_memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// This interpreter with each run cancelled once it has taken `deadline` (`None`,
    /// the default: unbounded): the run returns [`Error::DeadlineExceeded`] naming the
    /// node it was at and its loop iteration. Zero is an [`Error::ZeroDuration`].
    pub fn with_deadline(mut self, deadline: impl Into<Option<Duration>>) -> Result<Self> {
        self.deadline = (deadline.into())
            .map(|d| deadline::positive("Reference::with_deadline", d))
            .transpose()?;
        Ok(self)
    }

    fn values(&self) -> MutexGuard<'_, HashMap<String, Literal>> {
        self.values.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn residents(&self) -> MutexGuard<'_, HashMap<String, Resident>> {
        self.residents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Backend for Reference {
    fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    fn partitions(&self) -> bool {
        false
    }

    fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    fn execute(
        &self,
        program: &Arc<Loaded>,
        inputs: &[Input],
        outputs: &[Output],
    ) -> Result<Vec<Value>> {
        let spmd = program.spmd();
        check_target(spmd, &self.mesh, outputs.len())?;
        let mut binds = bind_inputs(spmd, &|key| self.resident(key), inputs, 0..1)?;
        let binds = binds.pop().unwrap_or_default();
        let mut values = self.values();
        let plan = &program.plan;
        let _deadline = DeadlineGuard::start(Instant::now(), self.deadline);
        let outs = run_bound(0, binds, &mut values, &plan.donated, |locals| {
            execute(&spmd.program, plan, locals, self.memory_limit, eval_kernel)
        });
        // Donated resident inputs are consumed, whatever the run's result.
        for key in donated_keys(plan, inputs) {
            self.residents().remove(key);
        }
        let outs = outs?;
        (outs.into_iter().enumerate().zip(outputs))
            .map(|((k, out), mode)| match mode {
                Output::Resident(key) => {
                    let (ty, sharding) = spmd.outputs[k].clone();
                    values.insert(key.clone(), out);
                    self.residents()
                        .insert(key.clone(), Resident { ty, sharding });
                    Ok(Value::Resident)
                }
                Output::Shards => Ok(Value::Shards(vec![out])),
                Output::Global => Ok(Value::Global(global_output(spmd, k, vec![out])?)),
            })
            .collect()
    }

    fn resident(&self, key: &str) -> Option<Resident> {
        self.residents().get(key).cloned()
    }

    fn store_blocks(&self, key: &str, resident: Resident, blocks: Vec<Literal>) -> Result<()> {
        let mut blocks = padded_blocks(&self.mesh, key, &resident, blocks, 0..1)?;
        let value = blocks.pop().ok_or_else(|| Error::Input {
            index: 0,
            name: key.to_string(),
            problem: InputProblem::ShardCount {
                expected: 1,
                given: 0,
            },
        })?;
        self.values().insert(key.to_string(), value);
        self.residents().insert(key.to_string(), resident);
        Ok(())
    }

    fn local_blocks(&self, key: &str) -> Result<Vec<Literal>> {
        (self.values().get(key))
            .map(|value| vec![value.clone()])
            .ok_or_else(|| Error::MissingResident {
                device: 0,
                key: key.to_string(),
            })
    }

    fn remove(&self, key: &str) -> Result<()> {
        self.values().remove(key);
        self.residents().remove(key);
        Ok(())
    }
}
