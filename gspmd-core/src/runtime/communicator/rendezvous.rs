//! The rendezvous: where all devices of a mesh meet, once per round of a collective.
//!
//! Each device posts where it is (its [`Call`]) and a shared buffer, and waits until
//! every device has posted; then all get every post of the round. A rendezvous is
//! *aborted* by the first failure: every waiting device is released and every later
//! arrival fails at once. A *timeout* bounds how long a device waits for the others; on
//! expiry it aborts, naming the devices that did not arrive. Runs are numbered
//! (*generations*): [`Rendezvous::reset`] starts a new one, and a device still running
//! an earlier run can neither post nor abort in it.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::ir::{Literal, ReduceKind, TensorType};

/// Where a device is at a rendezvous; every device must be at the same place.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Call {
    /// A collective over the group of `axes`.
    Collective { op: CollectiveOp, axes: Vec<String> },
    /// The end of the device's program (the thread mesh's last rendezvous of a run).
    End,
}

/// A collective and its attributes.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum CollectiveOp {
    AllReduce(ReduceKind),
    AllGather { dim: usize },
    ReduceScatter { kind: ReduceKind, dim: usize },
    AllToAll { split_dim: usize, concat_dim: usize },
    CollectivePermute { pairs: Vec<(usize, usize)> },
}

impl fmt::Display for Call {
    /// `all_reduce(sum) over [data, model]`, `the end of its program`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (op, axes) = match self {
            Call::Collective { op, axes } => (op, axes),
            Call::End => return f.write_str("the end of its program"),
        };
        let kind_name = |kind: &ReduceKind| format!("{kind:?}").to_lowercase();
        match op {
            CollectiveOp::AllReduce(kind) => write!(f, "all_reduce({})", kind_name(kind)),
            CollectiveOp::AllGather { dim } => write!(f, "all_gather(dim={dim})"),
            CollectiveOp::ReduceScatter { kind, dim } => {
                write!(f, "reduce_scatter({}, dim={dim})", kind_name(kind))
            }
            CollectiveOp::AllToAll {
                split_dim,
                concat_dim,
            } => write!(
                f,
                "all_to_all(split_dim={split_dim}, concat_dim={concat_dim})"
            ),
            CollectiveOp::CollectivePermute { pairs } => {
                write!(f, "collective_permute(pairs={pairs:?})")
            }
        }?;
        write!(f, " over [{}]", axes.join(", "))
    }
}

/// What one device contributes to one round of a rendezvous: where it is, the type of
/// its operand, and the operand itself when its group needs it.
#[derive(Debug, Clone)]
pub(super) struct Post {
    pub(super) call: Arc<Call>,
    pub(super) operand: Option<TensorType>,
    pub(super) data: Option<Arc<Literal>>,
}

/// All devices' posts of one completed round, indexed by device id.
pub(super) type Round = Arc<Vec<Post>>;

/// Checks that every device of `round` is at `call`; otherwise says where every device
/// is (`devices [0, 1, 2] are at all_reduce(sum) over [x]; device 3 is at the end of its
/// program`), the same message on every device.
pub(super) fn check_calls(round: &[Post], call: &Call) -> Result<(), String> {
    if round.iter().all(|p| *p.call == *call) {
        return Ok(());
    }
    let mut places: Vec<(&Call, Vec<usize>)> = Vec::new();
    for (device, post) in round.iter().enumerate() {
        match places.iter_mut().find(|(c, _)| **c == *post.call) {
            Some((_, devices)) => devices.push(device),
            None => places.push((&post.call, vec![device])),
        }
    }
    let census: Vec<String> = places
        .iter()
        .map(|(call, devices)| match devices.as_slice() {
            [device] => format!("device {device} is at {call}"),
            _ => format!("devices {devices:?} are at {call}"),
        })
        .collect();
    Err(format!(
        "devices disagree on the collective: {}",
        census.join("; ")
    ))
}

/// The meeting point of all devices of a mesh: each collective is one or more rounds in
/// which every device posts a shared buffer and receives everyone's. Buffers are
/// immutable `Arc`s, so a round needs no second barrier before buffers are reused.
#[derive(Debug)]
pub(crate) struct Rendezvous {
    num_devices: usize,
    state: Mutex<RendezvousState>,
    round_done: Condvar,
}

#[derive(Debug)]
struct RendezvousState {
    /// The current run; posts and aborts of other runs are refused.
    generation: u64,
    /// How long a device waits for the others; `None` waits for ever.
    timeout: Option<Duration>,
    /// Number of completed rounds.
    round: u64,
    /// Posts of the round in progress, by device.
    pending: Vec<Option<Post>>,
    arrived: usize,
    /// The last completed round, until every waiter has picked it up.
    completed: Option<Round>,
    uncollected: usize,
    /// The first abort's error.
    abort: Option<Error>,
}

impl Rendezvous {
    /// A rendezvous of `num_devices` devices at generation 0, waiting for ever.
    pub(crate) fn new(num_devices: usize) -> Self {
        Rendezvous {
            num_devices,
            state: Mutex::new(RendezvousState {
                generation: 0,
                timeout: None,
                round: 0,
                pending: vec![None; num_devices],
                arrived: 0,
                completed: None,
                uncollected: 0,
                abort: None,
            }),
            round_done: Condvar::new(),
        }
    }

    /// No code run under this lock can panic, so a poisoned lock's state is sound.
    fn lock(&self) -> MutexGuard<'_, RendezvousState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets how long a device waits in a round for the others (`None`: for ever).
    pub(crate) fn set_timeout(&self, timeout: Option<Duration>) {
        self.lock().timeout = timeout;
    }

    /// The current generation: the one devices of the run being started must use.
    pub(crate) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Posts `post` for `device` of run `generation`, waits until every device has
    /// posted, and returns all posts of the round. Errors: [`Error::Aborted`] once the
    /// rendezvous is aborted, or when `generation` is not the current run;
    /// [`Error::CollectiveTimeout`] (which aborts) when the others do not all arrive
    /// within the timeout.
    pub(super) fn exchange(&self, device: usize, generation: u64, post: Post) -> Result<Round> {
        let mut state = self.lock();
        if state.generation != generation {
            return Err(stale(device));
        }
        if let Some(cause) = &state.abort {
            return Err(aborted(device, cause));
        }
        if state.pending[device].is_some() {
            return Err(Error::Collective {
                device,
                collective: post.call.to_string(),
                message: "this device is already in a collective (called concurrently?)".into(),
            });
        }
        let call = Arc::clone(&post.call);
        state.pending[device] = Some(post);
        state.arrived += 1;
        if state.arrived == self.num_devices {
            // Every slot is filled: each arrival filled its own, distinct, slot.
            let round: Round =
                Arc::new(state.pending.iter_mut().filter_map(Option::take).collect());
            state.arrived = 0;
            state.round += 1;
            state.uncollected = self.num_devices - 1;
            state.completed = (state.uncollected > 0).then(|| Arc::clone(&round));
            self.round_done.notify_all();
            return Ok(round);
        }
        let my_round = state.round;
        let waiting = |s: &mut RendezvousState| {
            s.round == my_round && s.abort.is_none() && s.generation == generation
        };
        let mut state = match state.timeout {
            None => self
                .round_done
                .wait_while(state, waiting)
                .unwrap_or_else(PoisonError::into_inner),
            Some(timeout) => {
                self.round_done
                    .wait_timeout_while(state, timeout, waiting)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        };
        if state.generation != generation {
            return Err(stale(device));
        }
        if state.round == my_round {
            if let Some(cause) = &state.abort {
                return Err(aborted(device, cause));
            }
            let missing = (0..self.num_devices)
                .filter(|&d| state.pending[d].is_none())
                .collect();
            let timeout = state.timeout.unwrap_or_default();
            let error = Error::CollectiveTimeout {
                device,
                collective: call.to_string(),
                missing,
                timeout,
            };
            state.abort = Some(error.clone());
            self.round_done.notify_all();
            return Err(error);
        }
        state.uncollected -= 1;
        let round = if state.uncollected == 0 {
            state.completed.take()
        } else {
            state.completed.clone()
        };
        round.ok_or_else(|| Error::ThreadMesh("completed round already collected".into()))
    }

    /// Records `error` as the cause of the abort of run `generation` (unless a cause is
    /// recorded, or that run is over) and wakes every waiting device.
    pub(crate) fn abort(&self, generation: u64, error: Error) {
        let mut state = self.lock();
        if state.generation == generation && state.abort.is_none() {
            state.abort = Some(error);
        }
        self.round_done.notify_all();
    }

    /// Whether the current run is aborted.
    pub(crate) fn is_aborted(&self) -> bool {
        self.lock().abort.is_some()
    }

    /// Ends the current run: returns its abort's cause, if any, and starts the next
    /// generation with an empty round. Devices still in the ended run (only possible
    /// after an abort) are refused from then on.
    pub(crate) fn reset(&self) -> Option<Error> {
        let mut state = self.lock();
        state.generation += 1;
        state.pending.iter_mut().for_each(|p| *p = None);
        state.arrived = 0;
        state.completed = None;
        state.uncollected = 0;
        self.round_done.notify_all();
        state.abort.take()
    }
}

/// The error of a device still in a run that has ended (after an abort).
fn stale(device: usize) -> Error {
    let cause = Error::ThreadMesh(format!(
        "device {device} is still running an earlier, failed run"
    ));
    aborted(device, &cause)
}

fn aborted(device: usize, cause: &Error) -> Error {
    Error::Aborted {
        device,
        cause: Box::new(cause.clone()),
    }
}
