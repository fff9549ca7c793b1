//! The rendezvous of a mesh's devices: one [`Meeting`] per set of devices that
//! communicate (a collective group, or all devices at the end of a run), where only
//! those devices synchronise, once per round of a collective.
//!
//! Each device of a meeting posts where it is (its [`Call`]) and a shared buffer, and
//! waits (yielding to the others for up to the `spin` it is given, then asleep) until
//! every device of the meeting has posted; then all get every post of the round. Devices of other meetings run on. Meetings are made once per set of devices
//! and kept for the life of the rendezvous.
//!
//! Failure is mesh-wide. The rendezvous is *aborted* by the first failure: every device
//! waiting in any meeting is released and every later arrival fails at once. A
//! *timeout* bounds how long a device waits for the others of its meeting; on expiry it
//! aborts, naming the devices that did not arrive. When every device of the mesh waits
//! in a meeting that cannot complete (they are at collectives of different groups that
//! wait for each other), the last to arrive aborts at once with a census of where every
//! device is. Runs are numbered (*generations*): [`Rendezvous::reset`] starts a new one,
//! and a device still running an earlier run can neither post nor abort in it.
//!
//! The devices are a thread mesh's, all of a mesh or a range of its device ids (one
//! process's share of a larger mesh); in the latter case the process's own thread
//! takes part too, as [`PROCESS`], in the meeting where the devices hand it the steps
//! that cross processes (`uplink`).
//!
//! Lock order: the meeting registry, then a meeting's state, then the abort state (a
//! leaf: nothing is locked while it is held). A meeting's calls are a leaf too.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::call::{Call, Post, Round};
use crate::error::{Census, CollectiveProblem, Error, Result, ThreadMeshProblem};

/// No code run under these locks can panic, so a poisoned lock's state is sound.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The meeting point of one set of devices: each collective of theirs is one or more
/// rounds in which every one of them posts a shared buffer and receives everyone's.
/// Buffers are immutable `Arc`s, so a round needs no second barrier before buffers are
/// reused.
#[derive(Debug)]
pub(super) struct Meeting {
    /// The devices that meet, in increasing id order: a device's *slot* is its position.
    devices: Vec<usize>,
    state: Mutex<MeetingState>,
    round_done: Condvar,
    /// Number of completed rounds, mirrored from the state for waiters that spin.
    rounds: AtomicU64,
    /// The places its devices have been at, each made once (see [`Meeting::call`]).
    calls: Mutex<Vec<Arc<Call>>>,
}

#[derive(Debug)]
struct MeetingState {
    /// The run this meeting's rounds belong to.
    generation: u64,
    /// Number of completed rounds.
    round: u64,
    /// Posts of the round in progress, by slot.
    pending: Vec<Option<Post>>,
    arrived: usize,
    /// The last completed round, until every waiter has picked it up.
    completed: Option<Round>,
    uncollected: usize,
    /// Waiters asleep on the condition variable (the others spin).
    sleepers: usize,
}

impl MeetingState {
    /// An empty round of run `generation`.
    fn clear(&mut self, generation: u64) {
        self.generation = generation;
        self.pending.iter_mut().for_each(|p| *p = None);
        self.arrived = 0;
        self.completed = None;
        self.uncollected = 0;
    }
}

impl Meeting {
    /// The devices that meet, in increasing id order (the order of a round's posts).
    pub(super) fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// The slot of `device` in this meeting's rounds.
    pub(super) fn slot(&self, device: usize) -> Option<usize> {
        self.devices.binary_search(&device).ok()
    }

    /// This meeting's one instance of `call`, made on first use: every device of the
    /// meeting posts the same `Arc` for the same place, so a round's posts are checked
    /// against each other by address ([`check_calls`](super::call::check_calls)).
    pub(super) fn call(&self, call: Call) -> Arc<Call> {
        let mut calls = lock(&self.calls);
        if let Some(made) = calls.iter().find(|c| ***c == call) {
            return Arc::clone(made);
        }
        let call = Arc::new(call);
        calls.push(Arc::clone(&call));
        call
    }
}

/// The id of a process's own thread among the participants of a rendezvous (after every
/// device id): it meets its devices to take the steps that cross processes.
pub(crate) const PROCESS: usize = usize::MAX;

/// The meetings of all devices of a mesh, and the mesh-wide state of a run: its
/// generation, its abort and the timeout.
#[derive(Debug)]
pub(crate) struct Rendezvous {
    /// The devices, in increasing id order.
    devices: Vec<usize>,
    /// The threads that can wait in a meeting: the devices, and [`PROCESS`] if the
    /// process's thread takes part; in increasing id order.
    participants: Vec<usize>,
    /// The meetings made so far, by their (sorted) devices.
    meetings: Mutex<HashMap<Vec<usize>, Arc<Meeting>>>,
    /// The current generation and its abort's cause.
    abort: Mutex<AbortState>,
    /// Mirrors of `abort` read without its lock: the current generation, and whether
    /// it is aborted.
    generation: AtomicU64,
    aborted: AtomicBool,
    /// How long a device waits in a round, in nanoseconds; [`NO_TIMEOUT`]: for ever.
    timeout_nanos: AtomicU64,
    /// Devices of the current run waiting in a round that has not completed.
    blocked: AtomicUsize,
    /// Per participant (by position), whether it waits in a round (so a timeout
    /// elsewhere does not name it as missing: it is held up, not absent).
    waiting: Box<[AtomicBool]>,
}

#[derive(Debug)]
struct AbortState {
    generation: u64,
    cause: Option<Error>,
}

const NO_TIMEOUT: u64 = u64::MAX;

/// How long a device waiting for a small collective yields to the others of its
/// meeting before it sleeps: a sleep and wake-up costs tens of microseconds, but on an
/// oversubscribed machine the yields steal time from devices still computing, so long
/// waits (large collectives, the end of a program) do not spin. A waiter yields at
/// once: busy-polling first (even 16 `spin_loop` polls) burns the core a peer needs to
/// reach the collective, and made scalar all-reduces on a 2x4 mesh of 2 cores 1.2-2x
/// slower (`benches/collectives.rs`); sleeping at once (no spin) was slower too.
pub(super) const SPIN: Duration = Duration::from_micros(50);

impl Rendezvous {
    /// The rendezvous of `devices` at generation 0, waiting for ever; with `process`,
    /// the process's thread takes part as [`PROCESS`].
    pub(crate) fn new(devices: Range<usize>, process: bool) -> Self {
        let devices: Vec<usize> = devices.collect();
        let mut participants = devices.clone();
        if process {
            participants.push(PROCESS);
        }
        Rendezvous {
            waiting: participants
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect(),
            devices,
            participants,
            meetings: Mutex::new(HashMap::new()),
            abort: Mutex::new(AbortState {
                generation: 0,
                cause: None,
            }),
            generation: AtomicU64::new(0),
            aborted: AtomicBool::new(false),
            timeout_nanos: AtomicU64::new(NO_TIMEOUT),
            blocked: AtomicUsize::new(0),
        }
    }

    /// Whether `participant` waits in a round.
    fn waiting(&self, participant: usize) -> &AtomicBool {
        let position = self.participants.binary_search(&participant);
        &self.waiting[position.unwrap_or_default()]
    }

    /// Sets how long a device waits in a round for the others (`None`: for ever).
    pub(crate) fn set_timeout(&self, timeout: Option<Duration>) {
        let nanos = timeout.map_or(NO_TIMEOUT, |t| {
            u64::try_from(t.as_nanos()).map_or(NO_TIMEOUT - 1, |n| n.min(NO_TIMEOUT - 1))
        });
        self.timeout_nanos.store(nanos, Ordering::Relaxed);
    }

    fn timeout(&self) -> Option<Duration> {
        let nanos = self.timeout_nanos.load(Ordering::Relaxed);
        (nanos != NO_TIMEOUT).then(|| Duration::from_nanos(nanos))
    }

    /// The current generation: the one devices of the run being started must use.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The meeting of `devices` (sorted, distinct participants), made on first use.
    pub(super) fn meeting(&self, devices: Vec<usize>) -> Arc<Meeting> {
        let mut meetings = lock(&self.meetings);
        // Under the registry lock, so no reset can run between reading the generation
        // and registering the meeting.
        let generation = self.generation();
        let meeting = meetings.entry(devices).or_insert_with_key(|devices| {
            Arc::new(Meeting {
                devices: devices.clone(),
                state: Mutex::new(MeetingState {
                    generation,
                    round: 0,
                    pending: vec![None; devices.len()],
                    arrived: 0,
                    completed: None,
                    uncollected: 0,
                    sleepers: 0,
                }),
                round_done: Condvar::new(),
                rounds: AtomicU64::new(0),
                calls: Mutex::new(Vec::new()),
            })
        });
        Arc::clone(meeting)
    }

    /// The meeting of every device.
    pub(super) fn everyone(&self) -> Arc<Meeting> {
        self.meeting(self.devices.clone())
    }

    /// The meeting of every device and the process's thread.
    pub(super) fn devices_and_process(&self) -> Arc<Meeting> {
        self.meeting(self.participants.clone())
    }

    /// Posts `post` for `device` of run `generation` in `meeting`, waits until every
    /// device of the meeting has posted (yielding for up to `spin` before sleeping),
    /// and returns all posts of the round by slot.
    /// Errors: [`Error::Aborted`] once the rendezvous is aborted, or when `generation`
    /// is not the current run; [`Error::CollectiveTimeout`] (which aborts) when the
    /// others do not all arrive within the timeout; [`Error::Collective`] (which aborts)
    /// when this arrival leaves every participant waiting.
    pub(super) fn exchange(
        &self,
        meeting: &Meeting,
        device: usize,
        generation: u64,
        post: Post,
        spin: Duration,
    ) -> Result<Round> {
        self.exchange_within(meeting, device, generation, post, spin, self.timeout())
    }

    /// [`Rendezvous::exchange`] without the timeout: for a wait whose length another
    /// party bounds (the process's thread waiting for its devices to hand it a step,
    /// which they do or fail within their own timeouts; devices waiting for the
    /// process to finish one, which MPI's meeting bounds).
    pub(super) fn exchange_without_timeout(
        &self,
        meeting: &Meeting,
        device: usize,
        generation: u64,
        post: Post,
    ) -> Result<Round> {
        self.exchange_within(meeting, device, generation, post, Duration::ZERO, None)
    }

    fn exchange_within(
        &self,
        meeting: &Meeting,
        device: usize,
        generation: u64,
        post: Post,
        spin: Duration,
        timeout: Option<Duration>,
    ) -> Result<Round> {
        let call = Arc::clone(&post.call);
        let collective_error = |problem: CollectiveProblem| Error::Collective {
            device,
            collective: call.to_string(),
            problem,
        };
        let slot = meeting
            .slot(device)
            .ok_or_else(|| collective_error(CollectiveProblem::NotInGroup { device }))?;
        let mut state = lock(&meeting.state);
        if state.generation != generation || self.generation() != generation {
            return Err(stale(device));
        }
        if self.aborted.load(Ordering::SeqCst) {
            drop(state);
            return Err(self.aborted_error(device));
        }
        if state.pending[slot].is_some() {
            return Err(collective_error(CollectiveProblem::Concurrent));
        }
        state.pending[slot] = Some(post);
        state.arrived += 1;
        let size = meeting.devices.len();
        if state.arrived == size {
            // Every slot is filled: each arrival filled its own, distinct, slot.
            let round: Round =
                Arc::new(state.pending.iter_mut().filter_map(Option::take).collect());
            state.arrived = 0;
            state.round += 1;
            state.uncollected = size - 1;
            state.completed = (state.uncollected > 0).then(|| Arc::clone(&round));
            meeting.rounds.store(state.round, Ordering::Release);
            if size > 1 {
                self.blocked.fetch_sub(size - 1, Ordering::SeqCst);
            }
            for &d in &meeting.devices {
                self.waiting(d).store(false, Ordering::SeqCst);
            }
            if state.sleepers > 0 {
                meeting.round_done.notify_all();
            }
            return Ok(round);
        }
        let my_round = state.round;
        self.waiting(device).store(true, Ordering::SeqCst);
        if self.blocked.fetch_add(1, Ordering::SeqCst) + 1 == self.participants.len() {
            drop(state);
            return Err(self.deadlock(device, generation, collective_error));
        }
        drop(state);
        let spin_start = Instant::now();
        while meeting.rounds.load(Ordering::Acquire) == my_round
            && !self.aborted.load(Ordering::SeqCst)
            && spin_start.elapsed() < spin
        {
            std::thread::yield_now();
        }
        let mut state = lock(&meeting.state);
        state.sleepers += 1;
        let waiting = |s: &mut MeetingState| {
            s.round == my_round
                && s.generation == generation
                && !self.aborted.load(Ordering::SeqCst)
        };
        let mut state = match timeout {
            None => meeting
                .round_done
                .wait_while(state, waiting)
                .unwrap_or_else(PoisonError::into_inner),
            Some(timeout) => {
                meeting
                    .round_done
                    .wait_timeout_while(state, timeout, waiting)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        };
        state.sleepers -= 1;
        // `waiting[device]` stays set on every way out but a completed round (whose
        // completer clears it): a device that timed out was held up, not absent, for
        // whoever times out next; the next run clears it.
        if state.generation != generation {
            return Err(stale(device));
        }
        if state.round == my_round {
            if self.aborted.load(Ordering::SeqCst) {
                drop(state);
                return Err(self.aborted_error(device));
            }
            // Absent devices: not here, and not held up waiting in another round (if
            // every absent one waits elsewhere, all of them).
            let absent: Vec<usize> = (meeting.devices.iter().zip(&state.pending))
                .filter(|(_, p)| p.is_none())
                .map(|(&d, _)| d)
                .collect();
            let unheld: Vec<usize> = (absent.iter().copied())
                .filter(|&d| !self.waiting(d).load(Ordering::SeqCst))
                .collect();
            let missing = if unheld.is_empty() { absent } else { unheld };
            let error = Error::CollectiveTimeout {
                device,
                collective: call.to_string(),
                missing,
                timeout: timeout.unwrap_or_default(),
            };
            // Recorded under the meeting's lock, so the round cannot complete now.
            self.record_abort(generation, error.clone());
            drop(state);
            self.wake_all();
            return Err(error);
        }
        state.uncollected -= 1;
        let round = if state.uncollected == 0 {
            state.completed.take()
        } else {
            state.completed.clone()
        };
        round.ok_or_else(|| Error::ThreadMesh {
            problem: ThreadMeshProblem::Internal {
                reason: "completed round already collected".into(),
            },
        })
    }

    /// The error of an arrival that left every device waiting: a census of where each
    /// one is; aborts the run.
    fn deadlock(
        &self,
        device: usize,
        generation: u64,
        collective_error: impl FnOnce(CollectiveProblem) -> Error,
    ) -> Error {
        let mut places: Vec<(usize, Arc<Call>)> = Vec::with_capacity(self.participants.len());
        for meeting in lock(&self.meetings).values() {
            let state = lock(&meeting.state);
            for (&d, post) in meeting.devices.iter().zip(&state.pending) {
                // The process's thread waits for its devices' next step: not a place.
                if let Some(post) = post.as_ref().filter(|_| d != PROCESS) {
                    places.push((d, Arc::clone(&post.call)));
                }
            }
        }
        places.sort_by_key(|(d, _)| *d);
        let census = Census::of(places.iter().map(|(d, call)| (*d, &**call)));
        let error = collective_error(CollectiveProblem::Deadlock { census });
        self.abort(generation, error.clone());
        // A concurrent abort (whose releases left the count stale) is the real cause.
        match lock(&self.abort).cause.as_ref() {
            Some(cause) if *cause != error => aborted(device, cause),
            _ => error,
        }
    }

    /// Records `error` as the cause of the abort of run `generation`, unless a cause is
    /// recorded or that run is over.
    fn record_abort(&self, generation: u64, error: Error) {
        let mut abort = lock(&self.abort);
        if abort.generation == generation && abort.cause.is_none() {
            abort.cause = Some(error);
            self.aborted.store(true, Ordering::SeqCst);
        }
    }

    /// Wakes every device waiting in any meeting.
    fn wake_all(&self) {
        for meeting in lock(&self.meetings).values() {
            // Taking the lock orders this after any waiter's check of the abort flag.
            let _state = lock(&meeting.state);
            meeting.round_done.notify_all();
        }
    }

    /// The error of a device refused by (or released by) the current abort.
    fn aborted_error(&self, device: usize) -> Error {
        match &lock(&self.abort).cause {
            Some(cause) => aborted(device, cause),
            None => stale(device),
        }
    }

    /// Records `error` as the cause of the abort of run `generation` (unless a cause is
    /// recorded, or that run is over) and wakes every waiting device.
    pub(crate) fn abort(&self, generation: u64, error: Error) {
        self.record_abort(generation, error);
        self.wake_all();
    }

    /// Whether the current run is aborted.
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Ends the current run: returns its abort's cause, if any, and starts the next
    /// generation with empty rounds in every meeting. Devices still in the ended run
    /// (only possible after an abort) are refused from then on.
    pub(crate) fn reset(&self) -> Option<Error> {
        let meetings = lock(&self.meetings);
        let (generation, cause) = {
            let mut abort = lock(&self.abort);
            abort.generation += 1;
            self.generation.store(abort.generation, Ordering::SeqCst);
            self.aborted.store(false, Ordering::SeqCst);
            (abort.generation, abort.cause.take())
        };
        for meeting in meetings.values() {
            lock(&meeting.state).clear(generation);
            meeting.round_done.notify_all();
        }
        self.blocked.store(0, Ordering::SeqCst);
        for w in &self.waiting {
            w.store(false, Ordering::SeqCst);
        }
        cause
    }
}

/// The error of a device still in a run that has ended (after an abort).
fn stale(device: usize) -> Error {
    let cause = Error::ThreadMesh {
        problem: ThreadMeshProblem::StaleRun { device },
    };
    aborted(device, &cause)
}

fn aborted(device: usize, cause: &Error) -> Error {
    Error::Aborted {
        device,
        cause: Box::new(cause.clone()),
    }
}
