//! [`MpiMesh`]: a mesh whose devices are the ranks of an MPI job (rank = device id in
//! the mesh's device order), each running the same per-device program as a
//! [`ThreadMesh`](super::ThreadMesh) device, with collectives over MPI.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use mpi::environment::Universe;
use mpi::topology::Communicator as _;

use super::backend::{Backend, Input, Loaded, Output, Resident, Value};
use super::binding::{
    bind_inputs, check_target, donated_keys, global_output, padded_blocks, run_bound,
    trimmed_blocks, unpadded_block,
};
use super::communicator::{Communicator, MpiCommunicator};
use super::device::run_planned;
use super::memory::available_memory;
use super::thread_mesh::{ThreadMesh, panic_message};
use crate::error::{Error, Result};
use crate::ir::Literal;
use crate::sharding::Mesh;

/// This process's device of a mesh whose devices are the ranks of an MPI job, launched
/// with `mpirun -np <devices>`: rank `r` is device `r`.
///
/// Every rank makes its `MpiMesh` and then runs the same programs in the same order
/// (SPMD). Failure contract of [`MpiMesh::run`]: when the program fails or panics on
/// one rank, every rank returns an error at its next collective (or at the end of its
/// program) naming the failing device and its error; ranks that run different programs
/// or meshes get an error at the start of the run; no rank is left waiting. The mesh is
/// usable again afterwards. A rank that dies (a signal, `exit`) is MPI's to report:
/// `mpirun` then ends the job.
///
/// A rank that stops responding (it hangs, or computes for longer than the timeout
/// between two collectives) is detected by the others when they have waited
/// [`MpiMesh::timeout`] at a collective: MPI cannot take back what they sent, so the
/// first of them prints where it waited and which ranks did not come, and ends the job
/// with `MPI_Abort` (every rank exits non-zero).
///
/// Resident values: like a [`ThreadMesh`]'s devices, each rank keeps its block of the
/// values stored under a key (see [`Backend::store_blocks`] and [`Backend::execute`])
/// between runs, so training steps move only data in and the loss out.
///
/// MPI is initialised by the first `MpiMesh` of a process and finalised when its last
/// one is dropped, after telling the other ranks it leaves (those still running
/// programs on it get an error at their next collective); a process may hold several
/// meshes at once (each with its own communicator), all on the thread that made the
/// first. Every rank makes and drops its meshes in the same order.
pub struct MpiMesh {
    communicator: MpiCommunicator,
    memory_limit: usize,
    /// This rank's block of each resident value, by key.
    store: RefCell<HashMap<String, Literal>>,
    /// Global type and sharding of each resident value, by key (the same on every rank).
    residents: RefCell<HashMap<String, Resident>>,
    /// Dropped last: the last mesh finalises MPI after its communicator is freed.
    _environment: Rc<Universe>,
}

thread_local! {
    /// This process's MPI environment once initialised (upgradable while an
    /// [`MpiMesh`] holds it, dead once MPI was finalised).
    static ENVIRONMENT: RefCell<Option<Weak<Universe>>> = const { RefCell::new(None) };
}

/// The MPI environment of the process: the meshes' one, initialising MPI if no mesh
/// holds it; an [`Error::MpiMesh`] if MPI was finalised already (every mesh dropped) or
/// initialised outside gspmd.
fn environment() -> Result<Rc<Universe>> {
    let known = ENVIRONMENT.with_borrow(|e| e.as_ref().map(Weak::upgrade));
    if let Some(known) = known {
        return known.ok_or_else(|| {
            Error::MpiMesh(
                "MPI was finalised when the last MpiMesh of this process was dropped: keep one \
             alive while others are made"
                    .into(),
            )
        });
    }
    let universe = mpi::initialize().ok_or_else(|| {
        Error::MpiMesh("MPI is initialised already in this process, outside gspmd".into())
    })?;
    let universe = Rc::new(universe);
    ENVIRONMENT.set(Some(Rc::downgrade(&universe)));
    Ok(universe)
}

impl MpiMesh {
    /// Joins `mesh` as the device of this rank (initialising MPI if no other mesh of
    /// the process has); an [`Error::MpiMesh`] if the job's rank count is not the mesh's
    /// device count (naming the `mpirun -np` to use). Every rank makes it at the same
    /// point. The memory limit is an equal share of the host's [`available_memory`] per
    /// rank of the job; the timeout is [`ThreadMesh::DEFAULT_TIMEOUT`].
    pub fn new(mesh: Mesh) -> Result<Self> {
        let environment = environment()?;
        let world = environment.world();
        let ranks = usize::try_from(world.size()).unwrap_or_default();
        if mesh.num_devices() != ranks {
            return Err(Error::MpiMesh(format!(
                "{ranks} MPI ranks for mesh {mesh} of {} devices: launch with mpirun -np {}",
                mesh.num_devices(),
                mesh.num_devices()
            )));
        }
        Ok(MpiMesh {
            communicator: MpiCommunicator::new(
                world.duplicate(),
                Arc::new(mesh),
                ThreadMesh::DEFAULT_TIMEOUT,
            ),
            memory_limit: available_memory() / ranks.max(1),
            store: RefCell::new(HashMap::new()),
            residents: RefCell::new(HashMap::new()),
            _environment: environment,
        })
    }

    /// The one-axis mesh `(rank = <ranks of the job>)`, to learn the rank count (and
    /// [`reshape`](MpiMesh::reshape) or make other meshes, keeping MPI initialised).
    pub fn init() -> Result<Self> {
        // Held until the mesh holds it: dropping the last holder finalises MPI.
        let environment = environment()?;
        let ranks = usize::try_from(environment.world().size()).unwrap_or_default();
        MpiMesh::new(Mesh::new([("rank", ranks)])?)
    }

    /// The same ranks as the devices of `mesh` instead, which must have one device per
    /// rank (else an [`Error::MpiMesh`]), with this mesh's timeout and memory limit:
    /// to run programs compiled for another mesh shape. Every rank reshapes at the same
    /// point of its program. Resident values are dropped (their blocks belong to the
    /// old shape).
    pub fn reshape(self, mesh: Mesh) -> Result<Self> {
        if let Some(rank) = self.communicator.has_left() {
            return Err(Error::MpiMesh(format!(
                "device {rank} has left mesh {}: cannot reshape it",
                self.mesh()
            )));
        }
        let new = MpiMesh::new(mesh)?.with_timeout(self.timeout());
        Ok(new.with_memory_limit(self.memory_limit))
    }

    /// This rank's device id.
    pub fn device(&self) -> usize {
        self.communicator.device()
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        self.communicator.mesh()
    }

    /// This mesh with this device's runtime limited to `bytes` of live values.
    pub fn with_memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// The bytes of live values this device's runtime may hold.
    pub fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// This mesh with ranks waiting at most `timeout` at a collective for the others
    /// before ending the job (see the type's docs); the default is
    /// [`ThreadMesh::DEFAULT_TIMEOUT`].
    pub fn with_timeout(self, timeout: Duration) -> Self {
        self.communicator.set_timeout(timeout);
        self
    }

    /// How long a rank waits at a collective for the others before ending the job.
    pub fn timeout(&self) -> Duration {
        self.communicator.timeout()
    }

    /// Runs `program` on this rank, as every rank does at the same time: first checks
    /// that every rank runs the program of the same `fingerprint` (a mismatch is an
    /// [`Error::Collective`] with a census, on every rank), then runs it with this
    /// device's communicator, then meets every rank at the end. See the type's failure
    /// contract.
    pub fn run<T>(
        &self,
        fingerprint: &str,
        program: impl FnOnce(&dyn Communicator) -> Result<T>,
    ) -> Result<T> {
        let comm = &self.communicator;
        let device = comm.device();
        comm.meet(&format!("the start of {fingerprint}"))?;
        let result = match catch_unwind(AssertUnwindSafe(|| program(comm))) {
            Ok(Ok(output)) => comm.meet("the end of its program").map(|()| output),
            Ok(Err(error)) => Err(error),
            Err(payload) => Err(Error::DevicePanicked {
                device,
                message: panic_message(payload.as_ref()),
            }),
        };
        if let Err(error) = &result {
            comm.fail(error);
        }
        result
    }
}

impl Drop for MpiMesh {
    /// Leaves the mesh (before MPI is finalised, if this is the last mesh): a rank
    /// still running programs on it gets an error at its next collective rather than
    /// waiting for this one (which would wait in `MPI_Finalize` for it).
    fn drop(&mut self) {
        self.communicator.leave();
    }
}

impl std::fmt::Debug for MpiMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiMesh(device {} of {})", self.device(), self.mesh())
    }
}

impl Backend for MpiMesh {
    fn mesh(&self) -> &Mesh {
        self.communicator.mesh()
    }

    fn process(&self) -> (usize, usize) {
        (self.device(), self.mesh().num_devices())
    }

    fn local_devices(&self) -> Range<usize> {
        self.device()..self.device() + 1
    }

    fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// Every rank passes the same `inputs` and `outputs` (global inputs whole, resident
    /// ones by key, shards of its own device) and gets every global output; resident
    /// outputs replace this rank's block, on every rank or (when the run fails) on
    /// none. Ranks that run different programs (or meshes) get an error at the start,
    /// and any failure is an error on every rank.
    fn execute(
        &self,
        program: &Arc<Loaded>,
        inputs: &[Input],
        outputs: &[Output],
    ) -> Result<Vec<Value>> {
        let spmd = program.spmd();
        let devices = self.local_devices();
        let device = self.device();
        // Every check is inside the run, so that a rank failing one tells the others.
        let locals = self.run(program.fingerprint(), |comm| {
            check_target(spmd, self.mesh(), outputs.len())?;
            let mut binds = bind_inputs(spmd, &|key| self.resident(key), inputs, devices.clone())?;
            let mine = binds.pop().unwrap_or_default();
            let donated = &program.plan.donated;
            run_bound(
                device,
                mine,
                &mut self.store.borrow_mut(),
                donated,
                |locals| {
                    run_planned(
                        &spmd.program,
                        &program.plan,
                        comm,
                        locals,
                        self.memory_limit,
                    )
                },
            )
        });
        // Donated resident inputs are consumed, whatever the run's result.
        for key in donated_keys(&program.plan, inputs) {
            self.residents.borrow_mut().remove(key);
        }
        let locals = locals?;
        // Every rank succeeded: gather the outputs that leave the devices, then (once
        // every gathering succeeded too) store the resident ones.
        let mut values = Vec::with_capacity(outputs.len());
        let mut resident = Vec::new();
        for (k, (block, mode)) in locals.into_iter().zip(outputs).enumerate() {
            values.push(match mode {
                Output::Resident(key) => {
                    resident.push((k, key, block));
                    Value::Resident
                }
                Output::Shards => {
                    Value::Shards(trimmed_blocks(spmd, k, vec![block], devices.clone())?)
                }
                Output::Global => {
                    let blocks = self.communicator.gather_world(block)?;
                    Value::Global(global_output(spmd, k, blocks)?)
                }
            });
        }
        for (k, key, block) in resident {
            let (ty, sharding) = spmd.outputs[k].clone();
            self.store.borrow_mut().insert(key.clone(), block);
            (self.residents.borrow_mut()).insert(key.clone(), Resident { ty, sharding });
        }
        Ok(values)
    }

    fn resident(&self, key: &str) -> Option<Resident> {
        self.residents.borrow().get(key).cloned()
    }

    /// Keeps this rank's block; no communication (every rank stores its own).
    fn store_blocks(&self, key: &str, resident: Resident, blocks: Vec<Literal>) -> Result<()> {
        let mut blocks = padded_blocks(self.mesh(), key, &resident, blocks, self.local_devices())?;
        let block = blocks.pop().ok_or_else(|| {
            Error::MpiMesh(format!(
                "store `{key}`: no block for device {}",
                self.device()
            ))
        })?;
        self.store.borrow_mut().insert(key.to_string(), block);
        self.residents
            .borrow_mut()
            .insert(key.to_string(), resident);
        Ok(())
    }

    fn local_blocks(&self, key: &str) -> Result<Vec<Literal>> {
        let device = self.device();
        let resident = self.resident(key);
        let block = self.store.borrow().get(key).cloned();
        let (resident, block) = resident.zip(block).ok_or_else(|| {
            Error::MpiMesh(format!("device {device} holds no resident value `{key}`"))
        })?;
        Ok(vec![unpadded_block(self.mesh(), &resident, device, block)?])
    }

    fn remove(&self, key: &str) -> Result<()> {
        self.store.borrow_mut().remove(key);
        self.residents.borrow_mut().remove(key);
        Ok(())
    }

    fn all_gather_bytes(&self, place: &str, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        self.communicator.all_gather_bytes(place, bytes)
    }

    fn together(&self, place: &str, work: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.run(place, |_| work())
    }
}
