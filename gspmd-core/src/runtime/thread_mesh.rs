//! [`ThreadMesh`]: a mesh of long-lived OS threads, one per device, whose programs
//! talk through a shared-memory [`Communicator`]; or one process's share of a mesh that
//! spans processes (`MpiMesh` with several threads per rank), whose steps across
//! processes its thread takes (`Process`).

use std::any::Any;
use std::collections::HashMap;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::backend::{Backend, Input, Loaded, Output, Resident, Value};
use super::binding::{
    Bind, RunKeys, bind_inputs, check_target, donated_keys, global_output, padded_blocks,
    run_bound, stage_resident, trimmed_blocks, unpadded_block,
};
use super::buffers;
use super::communicator::{Communicator, Process, Rendezvous, SharedMemoryCommunicator, Uplink};
use super::deadline::{self, DeadlineGuard};
use super::device::run_planned;
use super::memory::available_memory;
use crate::error::{Error, Result, RunPosition, ThreadMeshProblem};
use crate::ir::{Literal, TensorType};
use crate::partition::SpmdProgram;
use crate::sharding::{Mesh, Sharding};

/// What a device's program sees: its id, the mesh, its communicator, its memory limit,
/// and a store of named literals that stays on the device between runs (resident
/// parameters).
#[derive(Debug)]
pub struct DeviceContext {
    communicator: SharedMemoryCommunicator,
    store: HashMap<String, Literal>,
    /// Values a run stages for the store until every device has finished (see
    /// [`ThreadMesh::run_then_settle`]), by output index; empty between runs.
    staged: Vec<Option<Literal>>,
    memory_limit: usize,
}

impl DeviceContext {
    /// This device's id.
    pub fn device(&self) -> usize {
        self.communicator.device()
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        self.communicator.mesh()
    }

    /// The bytes of live values this device's runtime may hold (see
    /// [`ThreadMesh::with_memory_limit`]).
    pub fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// This device's communicator.
    pub fn communicator(&self) -> &dyn Communicator {
        &self.communicator
    }

    /// The device's resident store; it persists across runs of the same [`ThreadMesh`].
    pub fn store(&self) -> &HashMap<String, Literal> {
        &self.store
    }

    /// The device's resident store, to change.
    pub fn store_mut(&mut self) -> &mut HashMap<String, Literal> {
        &mut self.store
    }

    /// The values staged by the current run, by output index, for `settle` (see
    /// [`ThreadMesh::run_then_settle`]) to store or drop.
    pub(crate) fn staged_mut(&mut self) -> &mut Vec<Option<Literal>> {
        &mut self.staged
    }

    /// The store and the staged values together.
    pub(crate) fn store_and_staged(
        &mut self,
    ) -> (&mut HashMap<String, Literal>, &mut Vec<Option<Literal>>) {
        (&mut self.store, &mut self.staged)
    }

    /// The communicator and the store together, to call collectives while holding
    /// store entries.
    pub fn communicator_and_store(&mut self) -> (&dyn Communicator, &mut HashMap<String, Literal>) {
        (&self.communicator, &mut self.store)
    }
}

/// A job for one device thread.
type Job = Box<dyn FnOnce(&mut DeviceContext) + Send>;

struct Worker {
    jobs: Sender<Job>,
    thread: JoinHandle<()>,
}

/// A mesh of devices that are OS threads of this process, one per device, alive from
/// [`ThreadMesh::new`] until the mesh is dropped (which joins them).
///
/// Failure contract of [`ThreadMesh::run`]: when a device's program returns an error or
/// panics, the communicator is aborted, so every device waiting in a collective returns
/// promptly with [`Error::Aborted`]; the run returns the first failure, naming its
/// device; the mesh is usable again for the next run. A collective synchronises only
/// the devices of its group; every run ends with a meeting of all devices, and devices
/// left waiting for each other (one skipped a collective others entered) are an error
/// at once, not a hang.
///
/// Timeout: a device waits at most [`ThreadMesh::timeout`] (default
/// [`ThreadMesh::DEFAULT_TIMEOUT`]) in a collective for the others; then the run is
/// aborted with [`Error::CollectiveTimeout`] naming the devices that did not arrive.
/// A run that was aborted returns once every device has finished or, for devices that
/// do not finish within another timeout, without them: such a device finishes its
/// program on its own thread, its collectives fail at once, and its next run starts
/// after it.
///
/// Deadline: a run given [`ThreadMesh::with_deadline`] is cancelled once it has run
/// that long, even while its devices keep meeting in collectives (which no timeout
/// ends): each device stops at its next node, and the run returns
/// [`Error::DeadlineExceeded`] naming where each device was.
///
/// A device thread outlives panics: a program's (or `settle`'s) is the run's
/// [`Error::DevicePanicked`]; one raised while the program and what it captured are
/// dropped, after the run, is left to the panic hook to report, and the next runs go on;
/// should a thread exit anyway, every later run is an [`Error::DeviceThreadExited`]
/// naming it.
///
/// Memory: each device's runtime holds at most [`ThreadMesh::memory_limit`] bytes of
/// live values and kernel scratch; see [`ThreadMesh::with_memory_limit`].
pub struct ThreadMesh {
    mesh: Arc<Mesh>,
    /// The devices whose threads these are (all of the mesh's but in an `MpiMesh`).
    devices: Range<usize>,
    rendezvous: Arc<Rendezvous>,
    /// The devices' way to the other processes, if the mesh spans several.
    uplink: Option<Arc<Uplink>>,
    workers: Vec<Worker>,
    timeout: Option<Duration>,
    /// How long a run may take, if bounded.
    deadline: Option<Duration>,
    memory_limit: usize,
    /// Runs are serialised: jobs of two runs interleaved on the threads would meet in
    /// each other's collectives.
    run_lock: Mutex<()>,
    /// Global type and sharding of each value resident in the device stores, by key.
    residents: Mutex<HashMap<String, Arc<Resident>>>,
}

impl ThreadMesh {
    /// The default timeout: ten minutes, long enough for any computation between two
    /// collectives of a host program, short enough that a lost device ends the run (the
    /// watchdog timeouts of NCCL process groups are of this order).
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

    /// Starts one thread per device of `mesh`, each with an empty store; the timeout is
    /// [`ThreadMesh::DEFAULT_TIMEOUT`] and each device's memory limit an equal share of
    /// the host's [`available_memory`].
    pub fn new(mesh: Mesh) -> Result<Self> {
        let devices = 0..mesh.num_devices();
        ThreadMesh::with_devices(mesh, devices, false)
    }

    /// [`ThreadMesh::new`] with threads for `devices` of `mesh` only; `linked`: they are
    /// one process's share of `mesh`, and collectives whose groups reach other devices
    /// are steps of the process ([`ThreadMesh::run_linked`]).
    pub(crate) fn with_devices(mesh: Mesh, devices: Range<usize>, linked: bool) -> Result<Self> {
        let mesh = Arc::new(mesh);
        let rendezvous = Arc::new(Rendezvous::new(devices.clone(), linked));
        rendezvous.set_timeout(Some(Self::DEFAULT_TIMEOUT));
        let uplink = linked.then(|| Arc::new(Uplink::new(&rendezvous)));
        let memory_limit = available_memory() / mesh.num_devices().max(1);
        let mut thread_mesh = ThreadMesh {
            mesh: Arc::clone(&mesh),
            devices: devices.clone(),
            rendezvous: Arc::clone(&rendezvous),
            uplink: uplink.clone(),
            workers: Vec::with_capacity(devices.len()),
            timeout: Some(Self::DEFAULT_TIMEOUT),
            deadline: None,
            memory_limit,
            run_lock: Mutex::new(()),
            residents: Mutex::new(HashMap::new()),
        };
        for device in devices {
            let mut context = DeviceContext {
                communicator: SharedMemoryCommunicator::new(
                    device,
                    Arc::clone(&mesh),
                    Arc::clone(&rendezvous),
                    uplink.clone(),
                ),
                store: HashMap::new(),
                staged: Vec::new(),
                memory_limit,
            };
            let (jobs, queue) = mpsc::channel::<Job>();
            // On error, dropping `thread_mesh` joins the threads already started.
            let thread = std::thread::Builder::new()
                .name(format!("gspmd-device-{device}"))
                .spawn(move || {
                    for job in queue {
                        // A job reports its program's panics itself; one escaping it
                        // (its run's receiver gets no result and names the device) must
                        // not end the thread, which the next runs need.
                        let _ = catch_unwind(AssertUnwindSafe(|| job(&mut context)));
                    }
                })
                .map_err(|e| Error::ThreadMesh {
                    problem: ThreadMeshProblem::Spawn {
                        device,
                        reason: e.to_string(),
                    },
                })?;
            thread_mesh.workers.push(Worker { jobs, thread });
        }
        Ok(thread_mesh)
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// This mesh with devices waiting at most `timeout` in a collective for the others
    /// (`None`: for ever; see the type's docs). A zero timeout, which would fail every
    /// run, is an [`Error::ZeroDuration`].
    pub fn with_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Result<Self> {
        let timeout = (timeout.into())
            .map(|t| deadline::positive("ThreadMesh::with_timeout", t))
            .transpose()?;
        self.set_timeout(timeout);
        Ok(self)
    }

    /// This mesh with each run cancelled once it has taken `deadline` (`None`, the
    /// default: runs are not bounded): the run returns [`Error::DeadlineExceeded`]
    /// naming where each device was (see the type's docs). A zero deadline, which
    /// would fail every run, is an [`Error::ZeroDuration`].
    pub fn with_deadline(mut self, deadline: impl Into<Option<Duration>>) -> Result<Self> {
        self.deadline = (deadline.into())
            .map(|d| deadline::positive("ThreadMesh::with_deadline", d))
            .transpose()?;
        Ok(self)
    }

    /// Sets [`ThreadMesh::deadline`] (a positive one, see [`ThreadMesh::with_deadline`]).
    #[cfg(feature = "mpi")]
    pub(crate) fn set_deadline(&mut self, deadline: Option<Duration>) {
        self.deadline = deadline;
    }

    /// How long a run may take; `None` if unbounded.
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// Sets [`ThreadMesh::timeout`] (see [`ThreadMesh::with_timeout`]).
    pub(crate) fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
        self.rendezvous.set_timeout(timeout);
    }

    /// How long a device waits in a collective for the others; `None` for ever.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// This mesh with each device's runtime limited to `bytes` of live values and the
    /// scratch of the kernel running (as the memory analysis estimates it): a value
    /// that would exceed it fails the run with [`Error::OutOfMemory`] (wrapped in
    /// [`Error::DeviceFailed`]) before it is allocated. Resident values kept in the
    /// stores between runs count only while a run binds them.
    pub fn with_memory_limit(mut self, bytes: usize) -> Self {
        self.set_memory_limit(bytes);
        self
    }

    /// Sets [`ThreadMesh::memory_limit`] (see [`ThreadMesh::with_memory_limit`]).
    pub(crate) fn set_memory_limit(&mut self, bytes: usize) {
        self.memory_limit = bytes;
    }

    /// The bytes of live values each device's runtime may hold.
    pub fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// The device whose thread is the current one, if any.
    fn current_device(&self) -> Option<usize> {
        let me = std::thread::current().id();
        let position = (self.workers.iter()).position(|w| w.thread.thread().id() == me);
        position.map(|p| self.devices.start + p)
    }

    /// [`Backend::resident`], shared rather than copied.
    pub(crate) fn resident_shared(&self, key: &str) -> Option<Arc<Resident>> {
        self.residents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Records (or, with `None`, forgets) what the device stores hold under `key`.
    fn set_resident(&self, key: &str, resident: Option<Resident>) {
        let mut residents = self
            .residents
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match resident {
            Some(r) => residents.insert(key.to_string(), Arc::new(r)),
            None => residents.remove(key),
        };
    }

    /// Records that the device stores hold a `ty` value sharded as `sharding` under
    /// `key`; no copy when that is already recorded (a training step's outputs).
    fn keep_resident(&self, key: &str, ty: &TensorType, sharding: &Sharding) {
        let unchanged = self
            .resident_shared(key)
            .is_some_and(|r| r.ty == *ty && r.sharding == *sharding);
        if !unchanged {
            let resident = Resident {
                ty: ty.clone(),
                sharding: sharding.clone(),
            };
            self.set_resident(key, Some(resident));
        }
    }

    /// Runs `program` on every device at once and returns the results by device id (of
    /// this process's devices, [`Backend::local_devices`]); or, if any device fails, the
    /// first failure (see the type's failure contract).
    ///
    /// Called from one of this mesh's own device threads (from inside a program), it
    /// returns [`Error::ReentrantRun`] at once: the device would wait for itself. The
    /// program (and what it captures) is dropped on the thread of the last device to
    /// finish.
    pub fn run<T, F>(&self, program: F) -> Result<Vec<T>>
    where
        F: Fn(&mut DeviceContext) -> Result<T> + Send + Sync + 'static,
        T: Send + 'static,
    {
        self.run_then_settle(program, |_, _| {})
    }

    /// [`ThreadMesh::run`], then `settle(context, succeeded)` on each device once its
    /// program has ended, in the same run: `succeeded` is whether every device's program
    /// succeeded, which a device knows after the meeting at the end of its program. It
    /// is the same on every device that settles, and true exactly when the run returns
    /// `Ok`; so a program can stage values in the stores and `settle` make them current
    /// on all devices or on none, without a second run. A device left behind by a
    /// failed run settles with `false` when its program ends.
    pub fn run_then_settle<T, F, S>(&self, program: F, settle: S) -> Result<Vec<T>>
    where
        F: Fn(&mut DeviceContext) -> Result<T> + Send + Sync + 'static,
        S: Fn(&mut DeviceContext, bool) + Send + Sync + 'static,
        T: Send + 'static,
    {
        self.run_linked(program, settle, None)
    }

    /// [`ThreadMesh::run_then_settle`]; on a mesh made `linked`
    /// ([`ThreadMesh::with_devices`]) with a `process`, the calling thread takes the
    /// devices' steps across processes to it until their programs end (so `settle`
    /// learns whether every process succeeded); without one, the run stays inside this
    /// process (a collective spanning processes is an error).
    pub(crate) fn run_linked<T, F, S>(
        &self,
        program: F,
        settle: S,
        process: Option<&mut dyn Process>,
    ) -> Result<Vec<T>>
    where
        F: Fn(&mut DeviceContext) -> Result<T> + Send + Sync + 'static,
        S: Fn(&mut DeviceContext, bool) + Send + Sync + 'static,
        T: Send + 'static,
    {
        if let Some(device) = self.current_device() {
            return Err(Error::ReentrantRun { device });
        }
        let _serial = self.run_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let generation = self.rendezvous.generation();
        let memory_limit = self.memory_limit;
        let linked = process.is_some();
        let started = Instant::now();
        let run_deadline = self.deadline;
        // One handle per device and none kept here, so the program is dropped on the
        // thread of the last device to finish.
        let program = Arc::new((program, settle));
        let mut programs: Vec<Arc<(F, S)>> = (1..self.workers.len())
            .map(|_| Arc::clone(&program))
            .collect();
        programs.push(program);
        let (results, collected) = mpsc::channel();
        for ((device, worker), program) in self.workers.iter().enumerate().zip(programs) {
            let results = results.clone();
            let job: Job = Box::new(move |context| {
                context.communicator.join_run(generation, linked);
                context.memory_limit = memory_limit;
                let device = context.device();
                let _deadline = DeadlineGuard::start(started, run_deadline);
                let result = run_on_device(context, &program.0);
                let succeeded = result.is_ok();
                // A panicking `settle` is this device's failure, not its thread's end.
                let settled = catch_unwind(AssertUnwindSafe(|| (program.1)(context, succeeded)));
                let result = match settled {
                    Ok(()) => result,
                    Err(payload) => Err(device_panicked(device, payload.as_ref())),
                };
                let position = result.as_ref().err().map(|e| deadline::position(device, e));
                // The receiver may be gone (a run that ended without this device).
                let _ = results.send((device, result, position));
                // The program and what it captures are dropped after the result is
                // sent (on the device that finishes last), so they may hold the mesh's
                // last handle (see `Drop`). A destructor panicking here (a user's value)
                // cannot fail the run, which has ended: the panic hook reports it, and
                // the thread lives on for the next runs.
                let _ = catch_unwind(AssertUnwindSafe(move || drop(program)));
            });
            if worker.jobs.send(job).is_err() {
                let device = self.devices.start + device;
                self.rendezvous
                    .abort(generation, Error::DeviceThreadExited { device });
            }
        }
        drop(results);
        if let (Some(uplink), Some(process)) = (&self.uplink, process) {
            uplink.serve(&self.rendezvous, generation, process);
        }
        let local = self.workers.len();
        let mut outputs: Vec<Option<T>> = (0..local).map(|_| None).collect();
        let mut failures: Vec<Option<(Error, RunPosition)>> = (0..local).map(|_| None).collect();
        let ends = run_deadline.map(|d| started + d);
        let mut cancelled = false;
        let mut missing = local;
        while missing > 0 {
            let received = match self.wait(ends) {
                None => collected.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(wait) => collected.recv_timeout(wait),
            };
            match received {
                Ok((device, result, position)) => {
                    let k = device - self.devices.start;
                    match result {
                        Ok(output) => outputs[k] = Some(output),
                        Err(error) => failures[k] = position.map(|p| (error, p)),
                    }
                    missing -= 1;
                }
                // Devices still running a failed run are left to finish on their own.
                Err(RecvTimeoutError::Timeout) if self.rendezvous.is_aborted() => break,
                // Past the deadline and its grace, devices that did not stop by
                // themselves (waiting in a collective for one inside a long kernel) are
                // released.
                Err(RecvTimeoutError::Timeout)
                    if ends.is_some_and(|at| Instant::now() >= at + DEADLINE_GRACE) =>
                {
                    let deadline = run_deadline.unwrap_or_default();
                    let positions = Vec::new();
                    (self.rendezvous).abort(
                        generation,
                        Error::DeadlineExceeded {
                            deadline,
                            positions,
                        },
                    );
                    cancelled = true;
                }
                Err(RecvTimeoutError::Timeout) => {}
                // Every job has sent its result or was dropped unrun.
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let cause = self.rendezvous.reset();
        if outputs.iter().all(Option::is_some) {
            return Ok(outputs.into_iter().flatten().collect());
        }
        let past_deadline =
            (failures.iter().flatten()).any(|(e, _)| matches!(e, Error::DeadlineExceeded { .. }));
        if let (Some(deadline), true) = (run_deadline, cancelled || past_deadline) {
            // Where each device that had not finished was.
            let devices = self.devices.clone();
            let positions = (devices.zip(failures).zip(&outputs))
                .filter(|(_, output)| output.is_none())
                .map(|((device, failure), _)| {
                    failure.map_or_else(|| RunPosition::unknown(device), |(_, p)| p)
                })
                .collect();
            return Err(Error::DeadlineExceeded {
                deadline,
                positions,
            });
        }
        let first_failure = failures.into_iter().flatten().next().map(|(e, _)| e);
        Err(cause.or(first_failure).unwrap_or(Error::ThreadMesh {
            problem: ThreadMeshProblem::NoResult,
        }))
    }

    /// How long the host waits for the next device's result: the collective timeout,
    /// and at most until the deadline `ends` and its grace (then that grace again).
    fn wait(&self, ends: Option<Instant>) -> Option<Duration> {
        let Some(ends) = ends else {
            return self.timeout;
        };
        let left = (ends + DEADLINE_GRACE)
            .saturating_duration_since(Instant::now())
            .max(DEADLINE_GRACE);
        Some(self.timeout.map_or(left, |t| t.min(left)))
    }
}

/// How long past a run's deadline the host waits for the devices to stop by themselves
/// (at their next node) before it releases those waiting in collectives.
const DEADLINE_GRACE: Duration = Duration::from_millis(200);

/// Runs `program` on one device, turning a panic into an error; a failure aborts the
/// communicator (the first abort's error is the run's error).
fn run_on_device<T>(
    context: &mut DeviceContext,
    program: &(dyn Fn(&mut DeviceContext) -> Result<T> + Send + Sync),
) -> Result<T> {
    let device = context.device();
    match catch_unwind(AssertUnwindSafe(|| program(context))) {
        Ok(Ok(output)) => context.communicator.end_program().map(|()| output),
        Ok(Err(error)) => {
            let error = deadline::on_device(device, error);
            context.communicator.abort(Error::DeviceFailed {
                device,
                cause: Box::new(error.clone()),
            });
            Err(error)
        }
        Err(payload) => {
            let error = device_panicked(device, payload.as_ref());
            context.communicator.abort(error.clone());
            Err(error)
        }
    }
}

/// [`Error::DevicePanicked`] for `device`, whose program on this thread panicked with
/// `payload`: where the program was ([`deadline::here`]) and the panic's text.
pub(super) fn device_panicked(device: usize, payload: &(dyn Any + Send)) -> Error {
    Error::DevicePanicked {
        device,
        position: deadline::here(device),
        message: panic_message(payload),
    }
}

/// The text of a panic payload.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(ToString::to_string)
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a non-string panic payload)".into())
}

impl Drop for ThreadMesh {
    /// Closes every thread's job queue, then joins the threads. When the last handle is
    /// dropped on one of the mesh's own device threads (by a program's captured state),
    /// that thread is not joined but detached: it ends by itself once its job returns.
    fn drop(&mut self) {
        let me = std::thread::current().id();
        let threads: Vec<JoinHandle<()>> = std::mem::take(&mut self.workers)
            .into_iter()
            .map(|Worker { jobs, thread }| {
                drop(jobs);
                thread
            })
            .collect();
        for thread in threads.into_iter().filter(|t| t.thread().id() != me) {
            // A device thread does not panic (its jobs run under catch_unwind); there
            // is nothing to report from a destructor anyway.
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for ThreadMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadMesh({})", self.mesh)
    }
}

impl ThreadMesh {
    /// Runs `program` on this mesh's devices as [`Backend::execute`] does (linked to
    /// `process`, see [`ThreadMesh::run_linked`]); returns, per output, the devices'
    /// blocks (padded, by device) or `None` for a resident one, which every device has
    /// stored if and only if the run succeeded.
    pub(crate) fn execute_local(
        &self,
        program: &Arc<Loaded>,
        inputs: &[Input],
        outputs: &[Output],
        process: Option<&mut dyn Process>,
    ) -> Result<Vec<Option<Vec<Literal>>>> {
        let spmd = program.spmd();
        check_target(spmd, &self.mesh, outputs.len())?;
        let first = self.devices.start;
        let binds = bind_inputs(
            spmd,
            &|key| self.resident(key),
            inputs,
            self.devices.clone(),
        )?;
        // Each device takes its own bindings (moved, not copied).
        let binds: Arc<Vec<Mutex<Vec<Bind>>>> =
            Arc::new(binds.into_iter().map(Mutex::new).collect());
        let modes = RunKeys::outputs(outputs);
        let settle_modes = Arc::clone(&modes);
        let planned = Arc::clone(program);
        let on_device = move |ctx: &mut DeviceContext| {
            let device = ctx.device();
            let memory_limit = ctx.memory_limit();
            let (comm, store) = ctx.communicator_and_store();
            let mine = std::mem::take(
                &mut *binds[device - first]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            );
            let outs = run_bound(device, mine, store, &planned.plan.donated, |locals| {
                run_planned(
                    &planned.spmd().program,
                    &planned.plan,
                    comm,
                    locals,
                    memory_limit,
                )
            })?;
            Ok(stage_resident(outs, &modes, ctx.staged_mut()))
        };
        // Every device staged its new resident values: once its program has ended, each
        // makes them current if every device succeeded, or drops them.
        let settle = move |ctx: &mut DeviceContext, committed: bool| {
            let (store, staged) = ctx.store_and_staged();
            for (mode, value) in settle_modes.iter().zip(staged.drain(..)) {
                if let (Output::Resident(key), Some(v), true) = (mode, value, committed) {
                    match store.get_mut(key) {
                        // The old value's buffer goes to the pool: the next step's new
                        // value has its dtype and length.
                        Some(slot) => buffers::release(std::mem::replace(slot, v)),
                        None => {
                            store.insert(key.clone(), v);
                        }
                    }
                }
            }
        };
        let results = self.run_linked(on_device, settle, process);
        // Donated resident inputs are consumed, whatever the run's result; the outputs
        // stored again are current on success.
        for key in donated_keys(&program.plan, inputs) {
            self.set_resident(key, None);
        }
        let results = results?;
        for (mode, (ty, sharding)) in outputs.iter().zip(&spmd.outputs) {
            if let Output::Resident(key) = mode {
                self.keep_resident(key, ty, sharding);
            }
        }
        let mut per_output: Vec<Option<Vec<Literal>>> = (outputs.iter())
            .map(|mode| (!matches!(mode, Output::Resident(_))).then(Vec::new))
            .collect();
        for device_outs in results {
            for (blocks, out) in per_output.iter_mut().zip(device_outs) {
                if let (Some(blocks), Some(out)) = (blocks, out) {
                    blocks.push(out);
                }
            }
        }
        Ok(per_output)
    }
}

/// The values of a run's outputs as `outputs` asks, from the blocks of this process's
/// `devices` (padded, by device; `None` for a resident output): shards trimmed, global
/// outputs assembled from every device's blocks, which `gather` collects from this
/// process's (by device id, from every process).
pub(super) fn output_values(
    spmd: &SpmdProgram,
    outputs: &[Output],
    blocks: Vec<Option<Vec<Literal>>>,
    devices: Range<usize>,
    gather: &dyn Fn(Vec<Literal>) -> Result<Vec<Literal>>,
) -> Result<Vec<Value>> {
    (blocks.into_iter().zip(outputs).enumerate())
        .map(|(k, (blocks, mode))| match (mode, blocks) {
            (Output::Resident(_), _) | (_, None) => Ok(Value::Resident),
            (Output::Shards, Some(blocks)) => Ok(Value::Shards(trimmed_blocks(
                spmd,
                k,
                blocks,
                devices.clone(),
            )?)),
            (Output::Global, Some(blocks)) => {
                Ok(Value::Global(global_output(spmd, k, gather(blocks)?)?))
            }
        })
        .collect()
}

impl Backend for ThreadMesh {
    fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    fn local_devices(&self) -> Range<usize> {
        self.devices.clone()
    }

    fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// Runs on the device threads. Inputs are checked before any thread starts; a
    /// device failure is returned as an error, no device is left waiting, and resident
    /// values keep their old contents (but donated ones, which the run consumed).
    fn execute(
        &self,
        program: &Arc<Loaded>,
        inputs: &[Input],
        outputs: &[Output],
    ) -> Result<Vec<Value>> {
        let blocks = self.execute_local(program, inputs, outputs, None)?;
        output_values(program.spmd(), outputs, blocks, self.devices.clone(), &Ok)
    }

    fn resident(&self, key: &str) -> Option<Resident> {
        self.resident_shared(key).map(Arc::unwrap_or_clone)
    }

    fn store_blocks(&self, key: &str, resident: Resident, blocks: Vec<Literal>) -> Result<()> {
        let first = self.devices.start;
        let blocks = padded_blocks(&self.mesh, key, &resident, blocks, self.devices.clone())?;
        let blocks = Arc::new(blocks);
        let k = key.to_string();
        self.run(move |ctx| {
            let device = ctx.device();
            (ctx.store_mut()).insert(k.clone(), blocks[device - first].clone());
            Ok(())
        })?;
        self.set_resident(key, Some(resident));
        Ok(())
    }

    fn local_blocks(&self, key: &str) -> Result<Vec<Literal>> {
        let r = self.resident(key).ok_or_else(|| Error::ThreadMesh {
            problem: ThreadMeshProblem::NoResident {
                key: key.to_string(),
            },
        })?;
        let k = key.to_string();
        let blocks = self.run(move |ctx| {
            let device = ctx.device();
            (ctx.store().get(&k).cloned()).ok_or_else(|| Error::MissingResident {
                device,
                key: k.clone(),
            })
        })?;
        (blocks.into_iter().zip(self.devices.clone()))
            .map(|(block, d)| unpadded_block(&self.mesh, &r, d, block))
            .collect()
    }

    fn remove(&self, key: &str) -> Result<()> {
        let k = key.to_string();
        self.run(move |ctx| {
            ctx.store_mut().remove(&k);
            Ok(())
        })?;
        self.set_resident(key, None);
        Ok(())
    }
}
