//! The link from a thread mesh's devices to their process's own thread, for devices that
//! are one process's share of a mesh spanning several processes (`MpiMesh` with several
//! threads per rank).
//!
//! A collective whose groups span processes is a *step* of the whole process: every
//! device of the process posts its operand at the meeting of the devices and the
//! process's thread ([`PROCESS`]); once all have, the process's thread runs the step
//! for all of them (a [`Process`]: the exchange between processes, with whatever it can
//! do inside the process first) and hands each device its result in a second round of
//! that meeting. The end of a program is such a step too, so a device settles its run
//! only once every process has ended it. Only the process's thread talks to the other
//! processes.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::call::{Call, Post, check_calls};
use super::combine::{literal_type, same_type};
use super::rendezvous::{Meeting, PROCESS, Rendezvous};
use crate::error::{CollectiveProblem, Error, Result};
use crate::ir::Literal;

/// A step of a process: where its devices are (all at the same place) and their
/// operands.
pub(crate) struct Step<'a> {
    /// The collective, or the end of the program.
    pub(super) call: &'a Call,
    /// The devices, in increasing id order.
    pub(super) devices: &'a [usize],
    /// The devices' operands, in the same order (none at the end of the program).
    pub(super) operands: Vec<&'a Literal>,
}

impl Step<'_> {
    /// An error unless the devices' operands have one shape and dtype.
    fn check_operands(&self) -> Result<()> {
        let (Some(first), Some(&device)) = (self.operands.first(), self.devices.first()) else {
            return Ok(());
        };
        match (self.devices.iter().zip(&self.operands)).find(|(_, x)| !same_type(x, first)) {
            None => Ok(()),
            Some((&other, x)) => Err(Error::Collective {
                device,
                collective: self.call.to_string(),
                problem: CollectiveProblem::OperandsDiffer {
                    device,
                    ty: literal_type(first),
                    other,
                    other_ty: literal_type(x),
                },
            }),
        }
    }
}

/// What a process does with the steps of its devices: the part of the mesh beyond the
/// process.
pub(crate) trait Process {
    /// Runs `step` for the process's devices, as every process does at the same point;
    /// returns each device's result, in the step's device order (none at the end of
    /// the program). An error fails the run on every process.
    fn step(&mut self, step: &Step<'_>) -> Result<Vec<Literal>>;

    /// Tells the other processes that this process's run failed with `error` (unless
    /// they learnt it from the step that failed).
    fn fail(&mut self, error: &Error);
}

/// The meeting of a process's devices and its thread, and the devices' results of the
/// step in progress.
#[derive(Debug)]
pub(crate) struct Uplink {
    meeting: Arc<Meeting>,
    /// What the process's thread posts.
    ready: Arc<Call>,
    /// Each device's result of the step in progress, by slot.
    results: Mutex<Vec<Option<Literal>>>,
}

impl Uplink {
    /// The uplink of the devices of `rendezvous`, whose process's thread takes part.
    pub(crate) fn new(rendezvous: &Rendezvous) -> Self {
        let meeting = rendezvous.devices_and_process();
        Uplink {
            ready: meeting.call(Call::Process),
            results: Mutex::new(vec![None; meeting.devices().len() - 1]),
            meeting,
        }
    }

    /// The meeting's one instance of `call` (see [`Meeting::call`]).
    pub(super) fn call(&self, call: Call) -> Arc<Call> {
        self.meeting.call(call)
    }

    /// Device `device` of run `generation` at step `call` with operand `x` (none at the
    /// end of the program): waits for the other devices (within the rendezvous's
    /// timeout), then for the process to run the step; returns this device's result.
    pub(super) fn step(
        &self,
        rendezvous: &Rendezvous,
        device: usize,
        generation: u64,
        call: Arc<Call>,
        x: Option<Literal>,
    ) -> Result<Option<Literal>> {
        let post = Post {
            call: Arc::clone(&call),
            checked: false,
            data: x.map(Arc::new),
        };
        drop(rendezvous.exchange(&self.meeting, device, generation, post, Duration::ZERO)?);
        let wait = Post {
            call,
            checked: false,
            data: None,
        };
        drop(rendezvous.exchange_without_timeout(&self.meeting, device, generation, wait)?);
        let slot = self.meeting.slot(device).unwrap_or_default();
        Ok(self.lock_results()[slot].take())
    }

    /// The process's side of run `generation`: takes its devices' steps to `process`
    /// until the end of their programs or the run's abort. A failure — of a step, of a
    /// device, or the devices disagreeing on the step — aborts the run (the first
    /// failure is its error, see [`Rendezvous::reset`]) and is told to `process`.
    pub(crate) fn serve(
        &self,
        rendezvous: &Rendezvous,
        generation: u64,
        process: &mut dyn Process,
    ) {
        let ready = || Post {
            call: Arc::clone(&self.ready),
            checked: false,
            data: None,
        };
        let all = self.meeting.devices();
        let devices = &all[..all.len() - 1];
        loop {
            let step = rendezvous
                .exchange_without_timeout(&self.meeting, PROCESS, generation, ready())
                .and_then(|round| {
                    let posts = &round[..devices.len()];
                    let call = Arc::clone(&posts[0].call);
                    check_calls(posts, devices, &call).map_err(|problem| Error::Collective {
                        device: devices[0],
                        collective: call.to_string(),
                        problem,
                    })?;
                    let operands = posts.iter().filter_map(|p| p.data.as_deref()).collect();
                    let step = Step {
                        call: &call,
                        devices,
                        operands,
                    };
                    step.check_operands()?;
                    let results = process.step(&step)?;
                    Ok((*call == Call::End, results))
                })
                .and_then(|(end, results)| {
                    let mut slots = self.lock_results();
                    slots.iter_mut().for_each(|s| *s = None);
                    slots
                        .iter_mut()
                        .zip(results)
                        .for_each(|(s, r)| *s = Some(r));
                    drop(slots);
                    rendezvous.exchange_without_timeout(
                        &self.meeting,
                        PROCESS,
                        generation,
                        ready(),
                    )?;
                    Ok(end)
                });
            match step {
                Ok(false) => {}
                Ok(true) => return,
                Err(error) => {
                    self.lock_results().iter_mut().for_each(|s| *s = None);
                    let cause = match error {
                        Error::Aborted { cause, .. } => *cause,
                        error => error,
                    };
                    rendezvous.abort(generation, cause.clone());
                    process.fail(&cause);
                    return;
                }
            }
        }
    }

    fn lock_results(&self) -> std::sync::MutexGuard<'_, Vec<Option<Literal>>> {
        self.results.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
