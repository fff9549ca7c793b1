//! Run deadlines: a bound on how long one run may take, which cancels it even while its
//! devices keep meeting in collectives (a never-ending `while_loop` whose condition
//! all-reduces every iteration never makes a device wait, so the collective timeout
//! cannot end it).
//!
//! The thread running a device's program (or the interpreter's caller) holds the run's
//! deadline in a thread-local slot ([`DeadlineGuard`]); the evaluation loop checks it
//! before every node ([`check`]) and the loops of control flow record their iteration
//! ([`enter_iteration`]), so a device past the deadline stops at its next node with an
//! [`Error::DeadlineExceeded`] that says where it was. A device stopping aborts the
//! communicator (the thread mesh's failure contract), which releases the devices
//! waiting for it in a collective; the run's error then names where each device was.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::error::{Error, Result, RunPosition};
use crate::ir::Location;

thread_local! {
    /// The deadline of the run on this thread (when it ends, and the duration it was
    /// given), if it has one.
    static DEADLINE: Cell<Option<(Instant, Duration)>> = const { Cell::new(None) };
    /// The iteration the innermost loop running on this thread is at; kept when a loop
    /// fails, so the run's error can name it.
    static ITERATION: Cell<Option<usize>> = const { Cell::new(None) };
    /// The node (its op and source location) the run on this thread is at: the last
    /// one [`check`] was called for.
    static NODE: Cell<Option<(&'static str, Location)>> = const { Cell::new(None) };
}

/// `duration` if it is positive; [`Error::ZeroDuration`] naming `setting` (e.g.
/// `ThreadMesh::with_timeout`) otherwise: a zero timeout or deadline would fail every
/// run.
pub(crate) fn positive(setting: &'static str, duration: Duration) -> Result<Duration> {
    if duration.is_zero() {
        return Err(Error::ZeroDuration { setting });
    }
    Ok(duration)
}

/// The deadline of the run on the current thread, from [`DeadlineGuard::start`] until
/// the guard is dropped (which restores the slot as it was).
pub(crate) struct DeadlineGuard {
    previous: Option<(Instant, Duration)>,
    previous_iteration: Option<usize>,
    previous_node: Option<(&'static str, Location)>,
}

impl DeadlineGuard {
    /// Sets the current thread's run to end `deadline` after `started` (none: no
    /// deadline); no node and no loop iteration yet.
    pub(crate) fn start(started: Instant, deadline: Option<Duration>) -> Self {
        let ends = deadline.map(|d| (started + d, d));
        DeadlineGuard {
            previous: DEADLINE.replace(ends),
            previous_iteration: ITERATION.replace(None),
            previous_node: NODE.replace(None),
        }
    }
}

impl Drop for DeadlineGuard {
    fn drop(&mut self) {
        DEADLINE.set(self.previous);
        ITERATION.set(self.previous_iteration);
        NODE.set(self.previous_node);
    }
}

/// Before a node runs: records it as where the run on this thread is ([`here`]), then
/// [`Error::DeadlineExceeded`] (its one position on device 0, the caller's to
/// renumber: [`on_device`]) if the current thread's run is past its deadline, at this
/// node (`op` at `location`).
pub(crate) fn check(op: &'static str, location: Location) -> Result<()> {
    NODE.set(Some((op, location)));
    let Some((ends, deadline)) = DEADLINE.get() else {
        return Ok(());
    };
    if Instant::now() < ends {
        return Ok(());
    }
    Err(Error::DeadlineExceeded {
        deadline,
        positions: vec![RunPosition {
            device: 0,
            op: Some(op),
            location: Some(location),
            iteration: ITERATION.get(),
        }],
    })
}

/// A loop of control flow starting iteration `i` (after the previous ones succeeded):
/// returns the iteration of the enclosing loop, which [`leave_loop`] restores when this
/// loop ends without an error.
pub(crate) fn enter_iteration(i: usize) -> Option<usize> {
    ITERATION.replace(Some(i))
}

/// A loop ended normally: the enclosing loop's iteration (from [`enter_iteration`]) is
/// current again.
pub(crate) fn leave_loop(outer: Option<usize>) {
    ITERATION.set(outer);
}

/// Where `device` was, from the error its program returned on this thread: the node a
/// deadline check or a failing node (a collective released by an abort) names, else
/// the last node the run on this thread reached ([`here`]), and the loop iteration
/// recorded on this thread.
pub(crate) fn position(device: usize, error: &Error) -> RunPosition {
    let named = match error {
        Error::DeadlineExceeded { positions, .. } => {
            (positions.first()).and_then(|p| p.op.zip(p.location))
        }
        Error::Runtime { op, location, .. } | Error::OutOfMemory { op, location, .. } => {
            Some((*op, *location))
        }
        _ => None,
    };
    let mut at = here(device);
    if let Some((op, location)) = named {
        (at.op, at.location) = (Some(op), Some(location));
    }
    at
}

/// Where the run on this thread is, as `device`: the last node it reached (see
/// [`check`]) and the iteration of the innermost loop around it, each if any.
pub(crate) fn here(device: usize) -> RunPosition {
    let node = NODE.get();
    RunPosition {
        device,
        op: node.map(|(op, _)| op),
        location: node.map(|(_, location)| location),
        iteration: ITERATION.get(),
    }
}

/// `error` with the device of its positions set to `device`, if it is a deadline's.
pub(crate) fn on_device(device: usize, error: Error) -> Error {
    match error {
        Error::DeadlineExceeded {
            deadline,
            mut positions,
        } => {
            for p in &mut positions {
                p.device = device;
            }
            Error::DeadlineExceeded {
                deadline,
                positions,
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_past_its_deadline_stops_at_the_next_node_naming_it() {
        let location = Location::synthetic();
        assert!(check("add", location).is_ok(), "no deadline: never past it");
        let started = Instant::now() - Duration::from_secs(2);
        let guard = DeadlineGuard::start(started, Some(Duration::from_secs(1)));
        let outer = enter_iteration(7);
        assert_eq!(outer, None);
        match on_device(3, check("all_reduce", location).unwrap_err()) {
            Error::DeadlineExceeded {
                deadline,
                positions,
            } => {
                assert_eq!(deadline, Duration::from_secs(1));
                let at = RunPosition {
                    device: 3,
                    op: Some("all_reduce"),
                    location: Some(location),
                    iteration: Some(7),
                };
                assert_eq!(positions, [at]);
            }
            other => panic!("{other}"),
        }
        drop(guard);
        assert!(
            check("add", location).is_ok(),
            "the guard restores no deadline"
        );
        assert_eq!(ITERATION.get(), None);
    }

    #[test]
    fn zero_is_not_a_deadline() {
        assert!(matches!(
            positive("with_deadline", Duration::ZERO),
            Err(Error::ZeroDuration {
                setting: "with_deadline"
            })
        ));
        assert_eq!(
            positive("with_deadline", Duration::from_millis(1)).unwrap(),
            Duration::from_millis(1)
        );
    }
}
