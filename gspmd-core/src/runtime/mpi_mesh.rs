//! [`MpiMesh`]: a mesh whose devices live in the ranks of an MPI job: one device per rank
//! (rank = device id in the mesh's device order), run on the rank's own thread, or
//! several per rank (the structure of hosts with several accelerators), run as the
//! threads of a [`ThreadMesh`](super::ThreadMesh) whose collectives across ranks go
//! over MPI. Every device runs the same per-device program as a thread mesh's device.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mpi::environment::{Threading, Universe};
use mpi::topology::Communicator as _;

use super::backend::{Backend, Input, Loaded, Output, Resident, Value};
use super::binding::{
    bind_inputs, check_target, donated_keys, padded_blocks, run_bound, unpadded_block,
};
use super::communicator::{Communicator, Hierarchy, MpiCommunicator, Process, RankSteps};
use super::deadline::{self, DeadlineGuard};
use super::device::run_planned;
use super::memory::available_memory;
use super::thread_mesh::{ThreadMesh, device_panicked, output_values};
use crate::error::{Error, MpiProblem, Result, RunPosition};
use crate::ir::{Literal, Location};
use crate::sharding::Mesh;

/// This process's devices of a mesh whose devices are spread over the ranks of an MPI
/// job, launched with `mpirun -np <ranks>`: `R` ranks for a mesh of `N` devices give
/// each rank `T = N / R` (`R` must divide `N`), rank `r` holding devices
/// `r * T .. (r + 1) * T`. With `T = 1` a rank runs its device on the calling thread;
/// with more, each of its devices is a thread, collectives whose groups stay inside the
/// rank run as on a thread mesh, and those whose groups span ranks are steps of the rank:
/// its devices' data meets, the calling thread exchanges it with the other ranks over
/// MPI (reducing inside the rank first) and hands each device its result. A rank's
/// devices must be a block of the mesh (the devices sharing their coordinates on its
/// major digits: with the default device order, `T` the product of the minor axes'
/// sizes times a divisor of the next axis's), else [`MpiMesh::new`] is an error. Results
/// are bitwise those of a [`ThreadMesh`](super::ThreadMesh) of the mesh, whatever `R`.
///
/// Every rank makes its `MpiMesh` and then runs the same programs in the same order
/// (SPMD). Failure contract of [`MpiMesh::run`] and [`Backend::execute`]: when a device's
/// program fails or panics on one rank, every rank returns an error at its next step
/// across ranks (or at the end of its program) naming the failing device and its error;
/// ranks that run different programs or meshes get an error at the start of the run;
/// no rank is left waiting. The mesh is usable again afterwards. A rank that dies (a
/// signal, `exit`) is MPI's to report: `mpirun` then ends the job.
///
/// A run can be given a deadline ([`MpiMesh::with_deadline`], as a thread mesh's): every
/// device stops at its next node once the run has taken that long, which fails the run
/// on every rank as above; the ranks then tell each other where their devices were,
/// and every rank returns the same [`Error::DeadlineExceeded`] naming every device of
/// the mesh.
///
/// A rank that stops responding (it hangs, or computes for longer than the timeout
/// between two steps across ranks) is detected by the others when they have waited
/// [`MpiMesh::timeout`] at a step: MPI cannot take back what they sent, so the first of
/// them prints where it waited and which ranks did not come, and ends the job with
/// `MPI_Abort` (every rank exits non-zero). A device thread of a rank that stops
/// responding is the rank's own devices' to detect within the same timeout: the rank's
/// run fails, and so does every rank's.
///
/// Resident values: like a [`ThreadMesh`](super::ThreadMesh)'s devices, each device
/// keeps its block of the values stored under a key (see [`Backend::store_blocks`] and
/// [`Backend::execute`]) between runs, so training steps move only data in and the loss
/// out.
///
/// MPI is initialised (at the level `MPI_THREAD_FUNNELED`: only this thread calls MPI)
/// by the first `MpiMesh` of a process and finalised when its last one is dropped, after
/// telling the other ranks it leaves (those still running programs on it get an error
/// at their next step); a process may hold several meshes at once (each with its own
/// communicator), all on the thread that made the first. Every rank makes and drops its
/// meshes in the same order.
pub struct MpiMesh {
    /// The ranks' communicator: on the mesh itself (a device per rank) or on the mesh
    /// of the ranks (several).
    communicator: MpiCommunicator,
    devices: Devices,
    memory_limit: usize,
    /// How long a run may take, if bounded.
    deadline: Option<Duration>,
    /// Dropped last: the last mesh finalises MPI after its communicator is freed.
    _environment: Rc<Universe>,
}

/// This rank's devices.
enum Devices {
    /// Its one device, run on the calling thread: its block of each resident value, and
    /// what those are (the same on every rank), by key.
    One {
        store: RefCell<HashMap<String, Literal>>,
        residents: RefCell<HashMap<String, Resident>>,
    },
    /// Several, as threads.
    Threads(Box<Threads>),
}

/// A rank's devices as threads, and how the mesh spreads over the ranks.
struct Threads {
    threads: ThreadMesh,
    hierarchy: Hierarchy,
}

/// With several devices per rank, how many times their timeout ranks wait for each
/// other (see [`MpiMesh::with_timeout`]).
const RANKS_WAIT: u32 = 2;

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
        return known.ok_or(Error::MpiMesh {
            problem: MpiProblem::Finalised,
        });
    }
    let (universe, _) =
        mpi::initialize_with_threading(Threading::Funneled).ok_or(Error::MpiMesh {
            problem: MpiProblem::InitialisedOutside,
        })?;
    let universe = Rc::new(universe);
    ENVIRONMENT.set(Some(Rc::downgrade(&universe)));
    Ok(universe)
}

impl MpiMesh {
    /// Joins `mesh` as this rank's devices (initialising MPI if no other mesh of the
    /// process has). An [`Error::MpiMesh`] if the job's rank count does not divide the
    /// mesh's device count (naming the `mpirun -np` to use), if a rank's devices would
    /// not be a block of the mesh, or if they are several and MPI cannot have other
    /// threads in the process. Every rank makes it at the same point. Each device's
    /// memory limit is an equal share of the host's [`available_memory`] per device of
    /// the mesh; the timeout is [`ThreadMesh::DEFAULT_TIMEOUT`].
    pub fn new(mesh: Mesh) -> Result<Self> {
        let environment = environment()?;
        let world = environment.world();
        let ranks = usize::try_from(world.size()).unwrap_or_default().max(1);
        let n = mesh.num_devices();
        if !n.is_multiple_of(ranks) {
            return Err(Error::MpiMesh {
                problem: MpiProblem::RankCount {
                    ranks,
                    mesh: mesh.to_string(),
                    devices: n,
                },
            });
        }
        let threads = n / ranks;
        let timeout = ThreadMesh::DEFAULT_TIMEOUT;
        let memory_limit = available_memory() / n.max(1);
        if threads == 1 {
            return Ok(MpiMesh {
                communicator: MpiCommunicator::new(world.duplicate(), Arc::new(mesh), 1, timeout),
                devices: Devices::One {
                    store: RefCell::new(HashMap::new()),
                    residents: RefCell::new(HashMap::new()),
                },
                memory_limit,
                deadline: None,
                _environment: environment,
            });
        }
        if mpi::environment::threading_support() < Threading::Funneled {
            return Err(Error::MpiMesh {
                problem: MpiProblem::NoThreads { devices: n },
            });
        }
        let rank = usize::try_from(world.rank()).unwrap_or_default();
        let hierarchy = Hierarchy::new(mesh.clone(), ranks)?;
        let threads_mesh = ThreadMesh::with_devices(mesh, hierarchy.devices(rank), true)?
            .with_timeout(timeout)?
            .with_memory_limit(memory_limit);
        let ranks_mesh = Arc::new(hierarchy.ranks().clone());
        let between_ranks = timeout * RANKS_WAIT;
        Ok(MpiMesh {
            communicator: MpiCommunicator::new(
                world.duplicate(),
                ranks_mesh,
                threads,
                between_ranks,
            ),
            devices: Devices::Threads(Box::new(Threads {
                threads: threads_mesh,
                hierarchy,
            })),
            memory_limit,
            deadline: None,
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

    /// The same ranks as the devices of `mesh` instead (its device count a multiple of
    /// the rank count, see [`MpiMesh::new`]), with this mesh's timeout and memory limit
    /// per device: to run programs compiled for another mesh shape. Every rank reshapes
    /// at the same point of its program. Resident values are dropped (their blocks
    /// belong to the old shape).
    pub fn reshape(self, mesh: Mesh) -> Result<Self> {
        if let Some(rank) = self.communicator.has_left() {
            return Err(Error::MpiMesh {
                problem: MpiProblem::Left {
                    rank,
                    device: self.device(),
                    place: "the reshape of the mesh".into(),
                },
            });
        }
        let new = MpiMesh::new(mesh)?.with_timeout(self.timeout())?;
        new.with_memory_limit(self.memory_limit)
            .with_deadline(self.deadline)
    }

    /// This rank's first device (its only one when each rank holds one).
    pub fn device(&self) -> usize {
        self.local_devices().start
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        match &self.devices {
            Devices::One { .. } => self.communicator.mesh(),
            Devices::Threads(local) => local.hierarchy.mesh(),
        }
    }

    /// This mesh with each device's runtime limited to `bytes` of live values.
    pub fn with_memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = bytes;
        if let Devices::Threads(local) = &mut self.devices {
            local.threads.set_memory_limit(bytes);
        }
        self
    }

    /// The bytes of live values each device's runtime may hold.
    pub fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// This mesh with ranks waiting at most `timeout` at a step for the others before
    /// ending the job (see the type's docs); the default is
    /// [`ThreadMesh::DEFAULT_TIMEOUT`]. With several devices per rank, a rank's devices
    /// wait at most `timeout` for each other, and ranks twice that for each other: a
    /// device that stops responding is found by its own rank's devices, which fail the
    /// run on every rank, before the other ranks give up on the whole rank. A zero
    /// timeout, which would fail every run, is an [`Error::ZeroDuration`].
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Self> {
        let timeout = super::deadline::positive("MpiMesh::with_timeout", timeout)?;
        match &mut self.devices {
            Devices::One { .. } => self.communicator.set_timeout(timeout),
            Devices::Threads(local) => {
                local.threads.set_timeout(Some(timeout));
                self.communicator.set_timeout(timeout * RANKS_WAIT);
            }
        }
        Ok(self)
    }

    /// This mesh with each run cancelled once it has taken `deadline` (`None`, the
    /// default: runs are not bounded), on every rank: the run returns
    /// [`Error::DeadlineExceeded`] naming where each device of the mesh was (see the
    /// type's docs). Every rank gives the same deadline. A zero deadline, which would
    /// fail every run, is an [`Error::ZeroDuration`].
    pub fn with_deadline(mut self, deadline: impl Into<Option<Duration>>) -> Result<Self> {
        let deadline = (deadline.into())
            .map(|d| deadline::positive("MpiMesh::with_deadline", d))
            .transpose()?;
        self.deadline = deadline;
        if let Devices::Threads(local) = &mut self.devices {
            local.threads.set_deadline(deadline);
        }
        Ok(self)
    }

    /// How long a run may take; `None` if unbounded.
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// How long a rank waits at a step for the others before ending the job (with
    /// several devices per rank: how long they wait for each other, the ranks twice
    /// that).
    pub fn timeout(&self) -> Duration {
        match &self.devices {
            Devices::One { .. } => self.communicator.timeout(),
            Devices::Threads(local) => local.threads.timeout().unwrap_or(Duration::MAX),
        }
    }

    /// Runs `program` on each of this rank's devices (with its communicator), as every
    /// rank does at the same time, and returns their results in device order: first
    /// checks that every rank runs the program of the same `fingerprint` (a mismatch is
    /// an [`Error::Collective`] with a census, on every rank), then runs it, then meets
    /// every rank at the end. See the type's failure contract.
    pub fn run<T, F>(&self, fingerprint: &str, program: F) -> Result<Vec<T>>
    where
        F: Fn(&dyn Communicator) -> Result<T> + Send + Sync + 'static,
        T: Send + 'static,
    {
        match &self.devices {
            Devices::One { .. } => {
                let on_this_thread = || program(&self.communicator);
                self.run_here(fingerprint, on_this_thread).map(|t| vec![t])
            }
            Devices::Threads(local) => self.run_linked(&local.hierarchy, fingerprint, |process| {
                let on_device = move |ctx: &mut super::DeviceContext| program(ctx.communicator());
                local
                    .threads
                    .run_linked(on_device, |_, _| {}, Some(process))
            }),
        }
    }

    /// Runs `work` on this thread, as every rank does at the same point: meets every
    /// rank at the start of `place` and at the end; a failure (or panic) of `work` is
    /// reported to every rank, which return an error (see the type's failure contract).
    fn run_here<T>(&self, place: &str, work: impl FnOnce() -> Result<T>) -> Result<T> {
        let comm = &self.communicator;
        let device = self.device();
        comm.meet(&format!("the start of {place}"))?;
        let guard = DeadlineGuard::start(Instant::now(), self.deadline);
        let result = match catch_unwind(AssertUnwindSafe(work)) {
            Ok(Ok(output)) => comm.meet("the end of its program").map(|()| output),
            Ok(Err(error)) => Err(deadline::on_device(device, error)),
            Err(payload) => Err(device_panicked(device, payload.as_ref())),
        };
        // Where the device stopped, before the guard forgets it.
        let stopped = result.as_ref().err().map(|e| deadline::position(device, e));
        drop(guard);
        match (result, stopped) {
            (Err(error), Some(position)) => {
                comm.fail(&error);
                Err(self.after_failure(error, vec![position]))
            }
            (result, _) => result,
        }
    }

    /// The error of a failed run on every rank (each rank calls this after the run's
    /// failure, with its `error` and where its devices were, `mine`): without a
    /// deadline, `error`; with one, the ranks tell each other where their devices were
    /// and whether they passed the deadline, and if one did, every rank's error is the
    /// same [`Error::DeadlineExceeded`] naming every device (a rank that cannot take
    /// part, one having left the mesh, keeps `error`).
    fn after_failure(&self, error: Error, mine: Vec<RunPosition>) -> Error {
        let Some(deadline) = self.deadline else {
            return error;
        };
        let passed = matches!(error, Error::DeadlineExceeded { .. });
        let record = positions_record(passed, &mine);
        let place = "where each device was when the run failed";
        let Ok(records) = self.communicator.all_gather_bytes(place, record) else {
            return error;
        };
        let mut any_passed = false;
        let mut positions = Vec::new();
        for record in &records {
            let (passed, theirs) = read_positions(record);
            any_passed |= passed;
            positions.extend(theirs);
        }
        if !any_passed {
            return error;
        }
        positions.sort_by_key(|p| p.device);
        Error::DeadlineExceeded {
            deadline,
            positions,
        }
    }

    /// Meets every rank at the start of `place`, then runs `work`, which runs this
    /// rank's device threads with their steps across ranks taken to the [`Process`] it
    /// is given (whose end step meets every rank); a failure of `work` is reported to
    /// every rank unless it was already.
    fn run_linked<T>(
        &self,
        hierarchy: &Hierarchy,
        place: &str,
        work: impl FnOnce(&mut dyn Process) -> Result<T>,
    ) -> Result<T> {
        let comm = &self.communicator;
        comm.meet(&format!("the start of {place}"))?;
        let mut steps = RankSteps { hierarchy, comm };
        let result = work(&mut steps);
        let Err(error) = result else {
            return result;
        };
        comm.fail(&error);
        // The rank's thread mesh names its devices when they passed the deadline.
        let mine = match &error {
            Error::DeadlineExceeded { positions, .. } => positions.clone(),
            _ => (self.local_devices()).map(RunPosition::unknown).collect(),
        };
        Err(self.after_failure(error, mine))
    }

    /// Every rank's `blocks` (one per device), by device id.
    fn gather(&self, blocks: Vec<Literal>) -> Result<Vec<Literal>> {
        self.communicator.gather_world(blocks)
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
        write!(
            f,
            "MpiMesh(devices {:?} of {})",
            self.local_devices(),
            self.mesh()
        )
    }
}

impl Backend for MpiMesh {
    fn mesh(&self) -> &Mesh {
        MpiMesh::mesh(self)
    }

    fn process(&self) -> (usize, usize) {
        let ranks = self.communicator.mesh().num_devices();
        (self.communicator.device(), ranks)
    }

    fn local_devices(&self) -> Range<usize> {
        match &self.devices {
            Devices::One { .. } => {
                let rank = self.communicator.device();
                rank..rank + 1
            }
            Devices::Threads(local) => local.threads.local_devices(),
        }
    }

    fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// Every rank passes the same `inputs` and `outputs` (global inputs whole, resident
    /// ones by key, shards of its own devices) and gets every global output; resident
    /// outputs replace this rank's blocks, on every rank or (when the run fails) on
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
        let gather = |blocks| self.gather(blocks);
        let (store, residents) = match &self.devices {
            Devices::One { store, residents } => (store, residents),
            Devices::Threads(local) => {
                let blocks =
                    self.run_linked(&local.hierarchy, program.fingerprint(), |process| {
                        (local.threads).execute_local(program, inputs, outputs, Some(process))
                    })?;
                return output_values(spmd, outputs, blocks, devices, &gather);
            }
        };
        let device = devices.start;
        // Every check is inside the run, so that a rank failing one tells the others.
        let locals = self.run_here(program.fingerprint(), || {
            check_target(spmd, self.mesh(), outputs.len())?;
            let mut binds = bind_inputs(spmd, &|key| self.resident(key), inputs, devices.clone())?;
            let mine = binds.pop().unwrap_or_default();
            let donated = &program.plan.donated;
            run_bound(device, mine, &mut store.borrow_mut(), donated, |locals| {
                run_planned(
                    &spmd.program,
                    &program.plan,
                    &self.communicator,
                    locals,
                    self.memory_limit,
                )
            })
        });
        // Donated resident inputs are consumed, whatever the run's result.
        for key in donated_keys(&program.plan, inputs) {
            residents.borrow_mut().remove(key);
        }
        let locals = locals?;
        // Every rank succeeded: gather the outputs that leave the devices, then (once
        // every gathering succeeded too) store the resident ones.
        let mut blocks = Vec::with_capacity(outputs.len());
        let mut resident = Vec::new();
        for (k, (block, mode)) in locals.into_iter().zip(outputs).enumerate() {
            match mode {
                Output::Resident(key) => {
                    resident.push((k, key, block));
                    blocks.push(None);
                }
                _ => blocks.push(Some(vec![block])),
            }
        }
        let values = output_values(spmd, outputs, blocks, devices, &gather)?;
        for (k, key, block) in resident {
            let (ty, sharding) = spmd.outputs[k].clone();
            store.borrow_mut().insert(key.clone(), block);
            residents
                .borrow_mut()
                .insert(key.clone(), Resident { ty, sharding });
        }
        Ok(values)
    }

    fn resident(&self, key: &str) -> Option<Resident> {
        match &self.devices {
            Devices::One { residents, .. } => residents.borrow().get(key).cloned(),
            Devices::Threads(local) => local.threads.resident(key),
        }
    }

    /// Keeps this rank's blocks; no communication (every rank stores its own).
    fn store_blocks(&self, key: &str, resident: Resident, blocks: Vec<Literal>) -> Result<()> {
        let (store, residents) = match &self.devices {
            Devices::One { store, residents } => (store, residents),
            Devices::Threads(local) => return local.threads.store_blocks(key, resident, blocks),
        };
        let devices = self.local_devices();
        let device = devices.start;
        let mut blocks = padded_blocks(self.mesh(), key, &resident, blocks, devices)?;
        let block = blocks.pop().ok_or_else(|| Error::MpiMesh {
            problem: MpiProblem::Internal {
                reason: format!("store `{key}`: no block for device {device}"),
            },
        })?;
        store.borrow_mut().insert(key.to_string(), block);
        residents.borrow_mut().insert(key.to_string(), resident);
        Ok(())
    }

    fn local_blocks(&self, key: &str) -> Result<Vec<Literal>> {
        let store = match &self.devices {
            Devices::One { store, .. } => store,
            Devices::Threads(local) => return local.threads.local_blocks(key),
        };
        let device = self.device();
        let resident = self.resident(key);
        let block = store.borrow().get(key).cloned();
        let (resident, block) = resident.zip(block).ok_or_else(|| Error::MissingResident {
            device,
            key: key.to_string(),
        })?;
        Ok(vec![unpadded_block(self.mesh(), &resident, device, block)?])
    }

    fn remove(&self, key: &str) -> Result<()> {
        match &self.devices {
            Devices::One { store, residents } => {
                store.borrow_mut().remove(key);
                residents.borrow_mut().remove(key);
                Ok(())
            }
            Devices::Threads(local) => local.threads.remove(key),
        }
    }

    fn all_gather_bytes(&self, place: &str, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        self.communicator.all_gather_bytes(place, bytes)
    }

    fn together(&self, place: &str, work: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.run_here(place, work)
    }
}

/// A rank's record of where its devices were when a run failed (see
/// [`MpiMesh::after_failure`]): a line saying whether it passed the deadline (`1`), then
/// a line per device, its fields tab-separated (empty if unknown): device, op, file,
/// line, column, loop iteration.
fn positions_record(passed: bool, positions: &[RunPosition]) -> Vec<u8> {
    let mut text = String::from(if passed { "1" } else { "0" });
    for p in positions {
        let (file, line, column) = p
            .location
            .map_or((String::new(), String::new(), String::new()), |l| {
                (l.file.to_string(), l.line.to_string(), l.column.to_string())
            });
        let op = p.op.unwrap_or_default();
        let iteration = p.iteration.map(|i| i.to_string()).unwrap_or_default();
        text.push_str(&format!(
            "\n{}\t{op}\t{file}\t{line}\t{column}\t{iteration}",
            p.device
        ));
    }
    text.into_bytes()
}

/// The record [`positions_record`] wrote: whether that rank passed the deadline, and
/// where its devices were (a field that does not read as written is unknown).
fn read_positions(record: &[u8]) -> (bool, Vec<RunPosition>) {
    let text = String::from_utf8_lossy(record);
    let mut lines = text.lines();
    let passed = lines.next() == Some("1");
    let positions = lines
        .filter_map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            let [device, op, file, row, column, iteration] = fields[..] else {
                return None;
            };
            let location = match (row.parse(), column.parse()) {
                (Ok(line), Ok(column)) if !file.is_empty() => Some(Location {
                    file: intern(file),
                    line,
                    column,
                }),
                _ => None,
            };
            Some(RunPosition {
                device: device.parse().ok()?,
                op: (!op.is_empty()).then(|| intern(op)),
                location,
                iteration: iteration.parse().ok(),
            })
        })
        .collect();
    (passed, positions)
}

/// `text` as a `&'static str`, the same one for equal texts: the ops and source files
/// other ranks' positions name (those of the same program, a few distinct texts), kept
/// for the process's life.
fn intern(text: &str) -> &'static str {
    static KNOWN: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut known = KNOWN.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&known) = known.get(text) {
        return known;
    }
    let text: &'static str = Box::leak(text.to_owned().into_boxed_str());
    known.insert(text);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_cross_ranks_as_written() {
        let at = RunPosition {
            device: 3,
            op: Some("all_reduce"),
            location: Some(Location {
                file: "src/model.rs",
                line: 12,
                column: 5,
            }),
            iteration: Some(7),
        };
        let positions = [at, RunPosition::unknown(4)];
        let (passed, read) = read_positions(&positions_record(true, &positions));
        assert!(passed);
        assert_eq!(read, positions);
        let (passed, read) = read_positions(&positions_record(false, &[]));
        assert!(!passed && read.is_empty());
        assert!(std::ptr::eq(intern("src/model.rs"), intern("src/model.rs")));
    }
}
