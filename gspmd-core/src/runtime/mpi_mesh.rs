//! [`MpiMesh`]: a mesh whose devices are the ranks of an MPI job (rank = device id in
//! the mesh's device order), each running the same per-device program as a
//! [`ThreadMesh`](super::ThreadMesh) device, with collectives over MPI.

use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use mpi::environment::Universe;
use mpi::topology::Communicator as _;

use super::communicator::{Communicator, MpiCommunicator};
use super::device::run_planned;
use super::memory::available_memory;
use super::plan::PlannedProgram;
use super::spmd::{Input, Output, Value, assemble_resident, resident_blocks, run_bound};
use super::thread_mesh::{Resident, ThreadMesh, panic_message};
use crate::error::{Error, Result};
use crate::ir::Literal;
use crate::partition::SpmdProgram;
use crate::sharding::{Mesh, Sharding};

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
/// values uploaded or stored under a key (see [`MpiMesh::upload`] and
/// [`SpmdProgram::execute_mpi`]) between runs, so training steps move only data in and
/// the loss out.
///
/// One `MpiMesh` per process: it initialises MPI, and dropping it finalises MPI, after
/// telling the other ranks it leaves (those still running programs get an error at
/// their next collective).
pub struct MpiMesh {
    communicator: MpiCommunicator,
    memory_limit: usize,
    /// This rank's block of each resident value, by key.
    store: RefCell<HashMap<String, Literal>>,
    /// Global type and sharding of each resident value, by key (the same on every rank).
    residents: RefCell<HashMap<String, Resident>>,
    /// Dropped last: finalises MPI after the communicators are freed.
    universe: Universe,
}

impl MpiMesh {
    /// Initialises MPI and joins `mesh` as the device of this rank; an
    /// [`Error::MpiMesh`] if MPI was initialised already or the job's rank count is not
    /// the mesh's device count. The memory limit is an equal share of the host's
    /// [`available_memory`] per rank of the job.
    pub fn new(mesh: Mesh) -> Result<Self> {
        Self::init()?.reshape(mesh)
    }

    /// Initialises MPI and joins the one-axis mesh `(rank = <ranks of the job>)`, to
    /// [`reshape`](MpiMesh::reshape) once the rank count is known; an
    /// [`Error::MpiMesh`] if MPI was initialised already.
    pub fn init() -> Result<Self> {
        let universe = mpi::initialize()
            .ok_or_else(|| Error::MpiMesh("MPI is initialised already in this process".into()))?;
        let world = universe.world();
        let ranks = usize::try_from(world.size()).unwrap_or_default();
        let mesh = Mesh::new([("rank", ranks)])?;
        Ok(MpiMesh {
            communicator: MpiCommunicator::new(world, Arc::new(mesh), ThreadMesh::DEFAULT_TIMEOUT),
            memory_limit: available_memory() / ranks.max(1),
            store: RefCell::new(HashMap::new()),
            residents: RefCell::new(HashMap::new()),
            universe,
        })
    }

    /// The same ranks as the devices of `mesh` instead, which must have one device per
    /// rank (else an [`Error::MpiMesh`] naming the `mpirun -np` to use): to run
    /// programs compiled for another mesh shape (MPI is initialised once per process).
    /// Every rank reshapes at the same point of its program. Resident values are
    /// dropped (their blocks belong to the old shape); the timeout is kept.
    pub fn reshape(mut self, mesh: Mesh) -> Result<Self> {
        let old = self.mesh();
        if let Some(rank) = self.communicator.has_left() {
            return Err(Error::MpiMesh(format!(
                "device {rank} has left mesh {old}: cannot reshape it"
            )));
        }
        if mesh.num_devices() != old.num_devices() {
            return Err(Error::MpiMesh(format!(
                "{} MPI ranks for mesh {mesh} of {} devices: launch with mpirun -np {}",
                old.num_devices(),
                mesh.num_devices(),
                mesh.num_devices()
            )));
        }
        let timeout = self.communicator.timeout();
        self.communicator = MpiCommunicator::new(self.universe.world(), Arc::new(mesh), timeout);
        self.store.get_mut().clear();
        self.residents.get_mut().clear();
        Ok(self)
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

    /// The resident value stored under `key`, if any.
    pub fn resident(&self, key: &str) -> Option<Resident> {
        self.residents.borrow().get(key).cloned()
    }

    /// Puts this rank's block of the global `value` under `key`, sharded as `sharding`
    /// (replacing what was there); every rank uploads the same value.
    pub fn upload(&self, key: &str, value: &Literal, sharding: &Sharding) -> Result<()> {
        let device = self.device();
        let (resident, blocks) =
            resident_blocks(self.mesh(), key, value, sharding, device..device + 1)?;
        let block = blocks.into_iter().next().ok_or_else(|| {
            Error::MpiMesh(format!("upload `{key}`: no block for device {device}"))
        })?;
        self.store.borrow_mut().insert(key.to_string(), block);
        self.residents
            .borrow_mut()
            .insert(key.to_string(), resident);
        Ok(())
    }

    /// The global value resident under `key`, gathered from every rank's block; every
    /// rank fetches it at the same point and gets all of it.
    pub fn fetch(&self, key: &str) -> Result<Literal> {
        let (resident, block) = self.run(&format!("the fetch of `{key}`"), |_| {
            let resident = self.resident(key);
            let block = self.store.borrow().get(key).cloned();
            resident.zip(block).ok_or_else(|| {
                Error::MpiMesh(format!(
                    "device {} holds no resident value `{key}`",
                    self.device()
                ))
            })
        })?;
        let blocks = self.communicator.gather_world(block)?;
        assemble_resident(self.mesh(), &resident, blocks)
    }

    /// What `decode` makes of the bytes that `read` gives on device 0, on every rank,
    /// which all call this at the same point with the same `place` (a name for the
    /// meetings): only device 0 calls `read` (a file only it can see, say), then decodes
    /// the bytes, in a run; its error is every rank's error. Then it broadcasts the bytes
    /// and every other rank decodes them, in a second run (an error of one is every
    /// rank's).
    pub fn read_on_first<T>(
        &self,
        place: &str,
        read: impl FnOnce() -> Result<Vec<u8>>,
        decode: impl Fn(&[u8]) -> Result<T>,
    ) -> Result<T> {
        let first = self.run(&format!("the reading of {place}"), |comm| {
            if comm.device() != 0 {
                return Ok(None);
            }
            let bytes = read()?;
            let value = decode(&bytes)?;
            Ok(Some((bytes, value)))
        })?;
        self.run(&format!("the sending of {place}"), |_| match first {
            Some((bytes, value)) => {
                self.communicator.broadcast_bytes(place, bytes)?;
                Ok(value)
            }
            None => decode(&self.communicator.broadcast_bytes(place, Vec::new())?),
        })
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
    /// Leaves the mesh before MPI is finalised: a rank still running programs gets an
    /// error at its next collective rather than waiting for this one (which would wait
    /// in `MPI_Finalize` for it).
    fn drop(&mut self) {
        self.communicator.leave();
    }
}

impl std::fmt::Debug for MpiMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiMesh(device {} of {})", self.device(), self.mesh())
    }
}

impl SpmdProgram {
    /// [`SpmdProgram::run`] on an MPI mesh: every rank passes the same global `inputs`
    /// and gets every global output. Ranks that run different programs (or meshes) get
    /// an error at the start, and any failure is an error on every rank (see
    /// [`MpiMesh`]).
    pub fn run_mpi(&self, mesh: &MpiMesh, inputs: &[Literal]) -> Result<Vec<Literal>> {
        let planned = PlannedProgram::new(self.program.clone());
        self.run_mpi_planned(&planned, &self.fingerprint(), mesh, inputs)
    }

    /// [`SpmdProgram::run_mpi`] with `planned`, the plan of [`SpmdProgram::program`],
    /// and `fingerprint`, its [`SpmdProgram::fingerprint`].
    pub(crate) fn run_mpi_planned(
        &self,
        planned: &PlannedProgram,
        fingerprint: &str,
        mesh: &MpiMesh,
        inputs: &[Literal],
    ) -> Result<Vec<Literal>> {
        let inputs: Vec<Input> = inputs.iter().map(Input::Global).collect();
        let outputs = vec![Output::Global; self.outputs.len()];
        let values = self.execute_mpi_planned(planned, fingerprint, mesh, &inputs, &outputs)?;
        Ok(values.into_iter().filter_map(Value::into_global).collect())
    }

    /// [`SpmdProgram::execute`] on an MPI mesh: every rank passes the same `inputs` and
    /// `outputs` (global inputs and shards whole, resident ones by key) and gets every
    /// global output and every device's shards; resident outputs replace this rank's
    /// block, on every rank or (when the run fails) on none. Plans the program for this
    /// run; [`Executable::execute_mpi`](crate::Executable::execute_mpi) reuses one plan.
    pub fn execute_mpi(
        &self,
        mesh: &MpiMesh,
        inputs: &[Input],
        outputs: &[Output],
    ) -> Result<Vec<Value>> {
        let planned = PlannedProgram::new(self.program.clone());
        self.execute_mpi_planned(&planned, &self.fingerprint(), mesh, inputs, outputs)
    }

    /// [`SpmdProgram::execute_mpi`] with `planned`, the plan of
    /// [`SpmdProgram::program`], and `fingerprint`, its [`SpmdProgram::fingerprint`].
    pub(crate) fn execute_mpi_planned(
        &self,
        planned: &PlannedProgram,
        fingerprint: &str,
        mesh: &MpiMesh,
        inputs: &[Input],
        outputs: &[Output],
    ) -> Result<Vec<Value>> {
        let device = mesh.device();
        // Every check is inside the run, so that a rank failing one tells the others.
        let locals = mesh.run(fingerprint, |comm| {
            self.check_target(mesh.mesh(), outputs.len())?;
            let mut binds = self.bind_inputs(
                &|key| mesh.resident(key).map(Arc::new),
                inputs,
                device..device + 1,
            )?;
            let mine = binds.pop().unwrap_or_default();
            run_bound(device, mine, &mut mesh.store.borrow_mut(), |locals| {
                run_planned(
                    &planned.program,
                    &planned.plan,
                    comm,
                    locals,
                    mesh.memory_limit(),
                )
            })
        })?;
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
                    let blocks = mesh.communicator.gather_world(block)?;
                    Value::Shards(self.trimmed_blocks(k, blocks.into_iter().map(Some).collect())?)
                }
                Output::Global => {
                    let blocks = mesh.communicator.gather_world(block)?;
                    Value::Global(self.global_output(k, blocks.into_iter().map(Some).collect())?)
                }
            });
        }
        for (k, key, block) in resident {
            let (ty, sharding) = self.outputs[k].clone();
            mesh.store.borrow_mut().insert(key.clone(), block);
            (mesh.residents.borrow_mut()).insert(key.clone(), Resident { ty, sharding });
        }
        Ok(values)
    }

    /// `program <hash> on mesh <mesh>`: a hash of the per-device program, its mesh and
    /// its global inputs and outputs, equal on ranks that run the same program.
    pub(crate) fn fingerprint(&self) -> String {
        let mut hasher = DefaultHasher::new();
        format!("{}{:?}{:?}", self.program, self.inputs, self.outputs).hash(&mut hasher);
        format!("program {:016x} on mesh {}", hasher.finish(), self.mesh)
    }
}
