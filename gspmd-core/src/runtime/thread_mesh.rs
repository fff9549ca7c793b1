//! [`ThreadMesh`]: a mesh of long-lived OS threads, one per device, whose programs
//! talk through a shared-memory [`Communicator`].

use std::any::Any;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use super::communicator::{Communicator, Rendezvous, SharedMemoryCommunicator};
use crate::error::{Error, Result};
use crate::ir::{Literal, TensorType};
use crate::sharding::{Mesh, Sharding};

/// What a device's program sees: its id, the mesh, its communicator, and a store of
/// named literals that stays on the device between runs (resident parameters).
#[derive(Debug)]
pub struct DeviceContext {
    communicator: SharedMemoryCommunicator,
    store: HashMap<String, Literal>,
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
/// device; the mesh is usable again for the next run. Every run ends with a meeting of
/// all devices, so a device that skips a collective others entered is an error, not a
/// hang.
pub struct ThreadMesh {
    mesh: Arc<Mesh>,
    rendezvous: Arc<Rendezvous>,
    workers: Vec<Worker>,
    /// Runs are serialised: jobs of two runs interleaved on the threads would meet in
    /// each other's collectives.
    run_lock: Mutex<()>,
    /// Global type and sharding of each value resident in the device stores, by key.
    residents: Mutex<HashMap<String, Resident>>,
}

/// What a resident value is: every device's store holds its block (padded to the
/// sharding's local shape) under the value's key.
#[derive(Debug, Clone, PartialEq)]
pub struct Resident {
    /// The global type.
    pub ty: TensorType,
    /// How it is sharded.
    pub sharding: Sharding,
}

impl ThreadMesh {
    /// Starts one thread per device of `mesh`, each with an empty store.
    pub fn new(mesh: Mesh) -> Result<Self> {
        let mesh = Arc::new(mesh);
        let rendezvous = Arc::new(Rendezvous::new(mesh.num_devices()));
        let mut thread_mesh = ThreadMesh {
            mesh: Arc::clone(&mesh),
            rendezvous: Arc::clone(&rendezvous),
            workers: Vec::with_capacity(mesh.num_devices()),
            run_lock: Mutex::new(()),
            residents: Mutex::new(HashMap::new()),
        };
        for device in 0..mesh.num_devices() {
            let mut context = DeviceContext {
                communicator: SharedMemoryCommunicator::new(
                    device,
                    Arc::clone(&mesh),
                    Arc::clone(&rendezvous),
                ),
                store: HashMap::new(),
            };
            let (jobs, queue) = mpsc::channel::<Job>();
            // On error, dropping `thread_mesh` joins the threads already started.
            let thread = std::thread::Builder::new()
                .name(format!("gspmd-device-{device}"))
                .spawn(move || queue.into_iter().for_each(|job| job(&mut context)))
                .map_err(|e| {
                    Error::ThreadMesh(format!("cannot start the thread of device {device}: {e}"))
                })?;
            thread_mesh.workers.push(Worker { jobs, thread });
        }
        Ok(thread_mesh)
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The resident value stored under `key`, if any.
    pub fn resident(&self, key: &str) -> Option<Resident> {
        self.residents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Records (or, with `None`, forgets) what the device stores hold under `key`.
    pub(crate) fn set_resident(&self, key: &str, resident: Option<Resident>) {
        let mut residents = self
            .residents
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match resident {
            Some(r) => residents.insert(key.to_string(), r),
            None => residents.remove(key),
        };
    }

    /// Runs `program` on every device at once and returns the results by device id; or,
    /// if any device fails, the first failure (see the type's failure contract).
    pub fn run<T, F>(&self, program: F) -> Result<Vec<T>>
    where
        F: Fn(&mut DeviceContext) -> Result<T> + Send + Sync + 'static,
        T: Send + 'static,
    {
        let _serial = self.run_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let program = Arc::new(program);
        let (results, collected) = mpsc::channel();
        for (device, worker) in self.workers.iter().enumerate() {
            let program = Arc::clone(&program);
            let results = results.clone();
            let job: Job = Box::new(move |context| {
                // The receiver lives until every job has sent or been dropped.
                let _ = results.send((context.device(), run_on_device(context, &*program)));
            });
            if worker.jobs.send(job).is_err() {
                self.rendezvous.abort(Error::ThreadMesh(format!(
                    "the thread of device {device} has exited"
                )));
            }
        }
        drop(results);
        let mut outputs: Vec<Option<T>> = (0..self.workers.len()).map(|_| None).collect();
        // Ends when every job has sent its result or was dropped unrun.
        for (device, result) in collected {
            outputs[device] = result.ok();
        }
        let cause = self.rendezvous.reset();
        match (outputs.into_iter().collect::<Option<Vec<T>>>(), cause) {
            (Some(outputs), _) => Ok(outputs),
            (None, Some(cause)) => Err(cause),
            (None, None) => Err(Error::ThreadMesh(
                "a device thread exited during the run".into(),
            )),
        }
    }
}

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
            context.communicator.abort(Error::DeviceFailed {
                device,
                cause: Box::new(error.clone()),
            });
            Err(error)
        }
        Err(payload) => {
            let error = Error::DevicePanicked {
                device,
                message: panic_message(payload.as_ref()),
            };
            context.communicator.abort(error.clone());
            Err(error)
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(ToString::to_string)
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a non-string panic payload)".into())
}

impl Drop for ThreadMesh {
    /// Closes every thread's job queue, then joins the threads.
    fn drop(&mut self) {
        let threads: Vec<JoinHandle<()>> = std::mem::take(&mut self.workers)
            .into_iter()
            .map(|Worker { jobs, thread }| {
                drop(jobs);
                thread
            })
            .collect();
        for thread in threads {
            // A device thread cannot panic (programs run under catch_unwind); there is
            // nothing to report from a destructor anyway.
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for ThreadMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadMesh({})", self.mesh)
    }
}
