//! [`MpiMesh`]: a mesh whose devices are the ranks of an MPI job (rank = device id in
//! the mesh's device order), each running the same per-device program as a
//! [`ThreadMesh`](super::ThreadMesh) device, with collectives over MPI.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use mpi::environment::Universe;
use mpi::topology::Communicator as _;

use super::communicator::{Communicator, MpiCommunicator};
use super::device::run_on_device;
use super::memory::available_memory;
use super::thread_mesh::panic_message;
use crate::error::{Error, Result};
use crate::ir::Literal;
use crate::partition::SpmdProgram;
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
/// One `MpiMesh` per process: it initialises MPI, and dropping it finalises MPI, after
/// telling the other ranks it leaves (those still running programs get an error at
/// their next collective).
pub struct MpiMesh {
    communicator: MpiCommunicator,
    memory_limit: usize,
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
            communicator: MpiCommunicator::new(world, Arc::new(mesh)),
            memory_limit: available_memory() / ranks.max(1),
            universe,
        })
    }

    /// The same ranks as the devices of `mesh` instead, which must have one device per
    /// rank (else an [`Error::MpiMesh`] naming the `mpirun -np` to use): to run
    /// programs compiled for another mesh shape (MPI is initialised once per process).
    /// Every rank reshapes at the same point of its program.
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
        self.communicator = MpiCommunicator::new(self.universe.world(), Arc::new(mesh));
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
        let device = mesh.device();
        // Every check is inside the run, so that a rank failing one tells the others.
        let outputs = mesh.run(&self.fingerprint(), |comm| {
            if mesh.mesh() != &self.mesh {
                return Err(Error::WrongMesh {
                    partitioned_for: self.mesh.to_string(),
                    given: mesh.mesh().to_string(),
                });
            }
            self.check_input_count(inputs.len())?;
            let locals = (inputs.iter().enumerate())
                .map(|(index, lit)| self.global_input_block(index, lit, device))
                .collect::<Result<Vec<Literal>>>()?;
            run_on_device(&self.program, comm, &locals, mesh.memory_limit())
        })?;
        (outputs.into_iter().enumerate())
            .map(|(k, block)| {
                let blocks = mesh.communicator.gather_world(block)?;
                self.global_output(k, blocks.into_iter().map(Some).collect())
            })
            .collect()
    }

    /// `program <hash> on mesh <mesh>`: a hash of the per-device program, its mesh and
    /// its global inputs and outputs, equal on ranks that run the same program.
    fn fingerprint(&self) -> String {
        let mut hasher = DefaultHasher::new();
        format!("{}{:?}{:?}", self.program, self.inputs, self.outputs).hash(&mut hasher);
        format!("program {:016x} on mesh {}", hasher.finish(), self.mesh)
    }
}
