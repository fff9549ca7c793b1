//! [`MpiCommunicator`]: the collectives for devices that are MPI ranks (rank = device
//! id), with the same results, bit for bit, as the shared-memory communicator.
//!
//! Every collective starts with a *meeting* of all ranks: each sends every other a
//! fixed-size record (point to point, so that a rank left waiting can name the ranks it
//! lacks) saying where it is (the collective, its axes and its operand's type) or that
//! it failed and why. SPMD programs call the same collectives in the same order on
//! every device, so every rank meets every other at each collective, and all of them
//! see the same records: when the records disagree or one
//! says "failed", every rank returns the same error at the same meeting and no rank is
//! left waiting in a data exchange. A rank whose program failed goes to one meeting
//! with its error (see [`MpiCommunicator::fail`]); a run ends with a meeting of all.
//! A meeting that some rank never reaches (it hangs) ends the job after the timeout:
//! MPI cannot take back a record sent, so the waiting rank names the ranks whose
//! records it lacks and calls `MPI_Abort`.
//!
//! The data then moves on the group's own communicator, split from the world once per
//! axis list (`MPI_Comm_split`, ranks ordered by group index), point to point: each
//! member sends every other exactly the elements it needs. A reduction receives the
//! others' pieces of its part through a small scratch buffer kept from one collective to
//! the next ([`Scratch`]) and combines each range of them in the group's reduction order
//! with the combine functions of the shared-memory communicator (`combine`), so both
//! backends give equal bits; an all-reduce does so in its operand's own buffer, and
//! receives the others' reduced chunks into the rest of it. A result gathered from the
//! members is built on a buffer of the pool: this member's part copied, the others'
//! received in place.

use std::any::Any;
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi::Tag;
use mpi::datatype::{Equivalence, PartitionMut};
use mpi::point_to_point::{Destination, Source};
use mpi::request::{Request, Scope};
use mpi::topology::{Color, Communicator as _, Process, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;
use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn};

use super::super::buffers;
use super::Communicator;
use super::call::{Call, CollectiveOp};
use super::combine::{
    Element, ReductionOrder, block, by_dtype, check_arguments, chunk_start, literal_type,
    reduce_chunks_into, standard_layout,
};
use super::group::{Group, group_problem};
use crate::error::{Census, CollectiveProblem, Error, MpiProblem, Result};
use crate::ir::{DType, Literal, ReduceKind};
use crate::sharding::Mesh;

/// Bytes of one rank's record at a meeting; longer messages are cut.
const RECORD: usize = 512;

/// The first byte of a record: where the rank is, or that it failed.
const AT: u8 = 0;
const FAILED: u8 = 1;
/// The rank dropped its mesh: it takes part in no more meetings.
const LEFT: u8 = 2;

/// How long a meeting polls for the other ranks' records before it lets other processes
/// run between polls: about as long as ranks that run in step arrive apart. MPI's own
/// waits (the data's) poll without yielding, unless it yields when idle
/// (`mpi_yield_when_idle`, which `mpirun` sets when ranks oversubscribe the cores); a
/// meeting that yielded at once could lose its core for a scheduler slice on a loaded
/// machine, at every collective.
const SPIN: Duration = Duration::from_millis(1);

/// The exit code of every rank when a meeting times out.
const TIMED_OUT: i32 = 3;

/// The tag of the records' point-to-point messages on the world communicator.
const RECORD_TAG: Tag = 14;

/// The tag of the data's point-to-point messages: on a group's communicator (nothing
/// else is sent there), and on the world for the gathering of outputs.
const DATA_TAG: Tag = 15;

/// The most elements one message (or broadcast call) carries: an MPI count is a C int.
const MAX_PIECE: usize = 1 << 30;

/// Bytes of one element type's [`Scratch`] buffer.
const SCRATCH_BYTES: usize = 2 << 20;

/// The fewest elements a piece received into scratch carries (unless fewer are left),
/// however many members share the scratch.
const MIN_PIECE: usize = 1024;

/// One rank's handle on the collectives of an MPI mesh. Not `Send`: it belongs to the
/// thread that initialised MPI.
///
/// Its mesh has one device per rank: the mesh the programs run on, or, when each rank
/// holds several devices (`threads` consecutive ids, see `hierarchical`), the mesh of
/// the ranks themselves.
pub(crate) struct MpiCommunicator {
    /// This rank, its device id in `mesh`.
    rank: usize,
    mesh: Arc<Mesh>,
    /// How many devices of the programs' mesh each rank holds.
    threads: usize,
    world: SimpleCommunicator,
    /// This rank's group over each axis list used so far and its communicator, split
    /// from the world on first use.
    groups: RefCell<HashMap<Vec<String>, Rc<Joined>>>,
    /// Whether every rank knows of the current failure: it came from a meeting, or this
    /// rank reported it (until the next meeting that succeeds).
    met_failure: Cell<bool>,
    /// The rank of the first record saying that its rank left, once one did: this
    /// rank then meets nobody any more (the one who left is not coming).
    left: Cell<Option<usize>>,
    /// How long a meeting waits for every rank before the job is ended.
    timeout: Cell<Duration>,
    /// The buffers received pieces pass through.
    scratch: Scratch,
}

/// A rank's group over an axis list, the order its reductions combine in, and the
/// communicator of its members, whose ranks are the members' group indices.
struct Joined {
    group: Group,
    order: ReductionOrder,
    comm: SimpleCommunicator,
}

impl MpiCommunicator {
    /// The communicator of rank `world.rank()`, device of that id in `mesh`, each rank
    /// holding `threads` devices of the programs' mesh; the caller checked that the
    /// world has one rank per device of `mesh`. Meetings wait at most `timeout`.
    pub(crate) fn new(
        world: SimpleCommunicator,
        mesh: Arc<Mesh>,
        threads: usize,
        timeout: Duration,
    ) -> Self {
        MpiCommunicator {
            rank: usize::try_from(world.rank()).unwrap_or_default(),
            mesh,
            threads,
            world,
            groups: RefCell::new(HashMap::new()),
            met_failure: Cell::new(false),
            left: Cell::new(None),
            timeout: Cell::new(timeout),
            scratch: Scratch::default(),
        }
    }

    /// How long a meeting waits for every rank before the job is ended.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    /// Sets [`MpiCommunicator::timeout`].
    pub(crate) fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }

    /// The device this rank's errors name: its only one, or its first.
    fn device(&self) -> usize {
        self.rank * self.threads
    }

    /// `ranks` by the devices they hold, for messages: `device 1`, `devices 1, 3`, or
    /// with several devices per rank `rank 1 (devices 4-7)`, `ranks 1, 3 (4 devices
    /// each)`.
    fn name_ranks(&self, ranks: &[usize]) -> String {
        let list = |r: &[usize]| r.iter().map(ToString::to_string).collect::<Vec<_>>();
        match (self.threads, ranks) {
            (1, [rank]) => format!("device {rank}"),
            (1, _) => format!("devices {}", list(ranks).join(", ")),
            (t, [rank]) => format!("rank {rank} (devices {}-{})", rank * t, rank * t + t - 1),
            (t, _) => format!("ranks {} ({t} devices each)", list(ranks).join(", ")),
        }
    }

    /// Meets every rank at `place` (e.g. a collective, or the start of a run with a hash
    /// of the program): `Ok` if all are there; otherwise the same error on every rank —
    /// [`Error::Aborted`] with the first failed rank's error, or [`Error::Collective`]
    /// with a census of where the ranks are.
    /// Once a rank has left (dropped its mesh), every meeting is an [`Error::MpiMesh`].
    pub(crate) fn meet(&self, place: &str) -> Result<()> {
        let left = |rank: usize| Error::MpiMesh {
            problem: MpiProblem::Left {
                rank,
                device: self.device(),
                place: place.to_string(),
            },
        };
        if let Some(rank) = self.left.get() {
            return Err(left(rank));
        }
        let records = self.exchange_records(AT, place);
        let failed = records.iter().enumerate().find(|(_, (s, _))| *s == FAILED);
        let error = if let Some(rank) = self.left.get() {
            left(rank)
        } else if let Some((rank, (_, message))) = failed {
            Error::Aborted {
                device: self.device(),
                cause: Box::new(Error::RankFailed {
                    rank,
                    message: message.clone(),
                }),
            }
        } else if records.iter().all(|(_, p)| p == place) {
            self.met_failure.set(false);
            return Ok(());
        } else {
            // Each rank by its first device (with one device per rank, its device).
            let places = records.iter().enumerate();
            Error::Collective {
                device: self.device(),
                collective: place.to_string(),
                problem: CollectiveProblem::Disagree {
                    census: Census::of(places.map(|(r, (_, p))| (r * self.threads, p))),
                },
            }
        };
        self.met_failure.set(true);
        Err(error)
    }

    /// Reports `error` (this rank's program failed) at the meeting the other ranks are
    /// at or will reach next, unless every rank knows of the failure already (it came
    /// from a meeting, or was reported since the last meeting that succeeded).
    pub(crate) fn fail(&self, error: &Error) {
        if !self.met_failure.replace(true) && self.left.get().is_none() {
            self.exchange_records(FAILED, &error.to_string());
        }
    }

    /// Tells the other ranks, at the meeting they are at or reach next, that this rank
    /// leaves: they get an error there instead of waiting for it. Nothing if a rank has
    /// left already (then nobody is meeting any more).
    pub(crate) fn leave(&self) {
        if self.left.get().is_none() {
            self.exchange_records(LEFT, "left");
        }
    }

    /// The rank that left the mesh, if one did.
    pub(crate) fn has_left(&self) -> Option<usize> {
        self.left.get()
    }

    /// Every rank's record (see [`MpiCommunicator::exchange_or_abort`]), as (status,
    /// text) by rank; notes the first rank that left.
    fn exchange_records(&self, status: u8, text: &str) -> Vec<(u8, String)> {
        let mut mine = [0u8; RECORD];
        mine[0] = status;
        let mut end = text.len().min(RECORD - 1);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        mine[1..=end].copy_from_slice(&text.as_bytes()[..end]);
        let mut all = vec![0u8; RECORD * self.mesh.num_devices()];
        let place = match status {
            AT => text,
            FAILED => "the meeting where it reports its failure",
            _ => "the meeting where it leaves",
        };
        self.exchange_or_abort(&mine, &mut all, place);
        let records: Vec<(u8, String)> = all
            .chunks(RECORD)
            .map(|r| {
                let len = r[1..].iter().position(|&b| b == 0).unwrap_or(RECORD - 1);
                (r[0], String::from_utf8_lossy(&r[1..=len]).into_owned())
            })
            .collect();
        if let Some(rank) = records.iter().position(|(s, _)| *s == LEFT) {
            self.left.set(Some(rank));
        }
        records
    }

    /// Sends `mine` to every other rank and receives theirs into `all` (rank `r`'s
    /// record at `r * RECORD`, this rank's copied in): one non-blocking send and receive
    /// per other rank, so that a rank left waiting knows whose records it lacks, polled
    /// (yielding between polls after [`SPIN`]). If some have not come after the
    /// timeout, prints that this device waited at `place` for those ranks and ends the
    /// job (`MPI_Abort`: every rank exits with code [`TIMED_OUT`]). Records from one
    /// sender arrive in the order sent (MPI does not let messages of one source and tag
    /// overtake), so each meeting gets its own.
    fn exchange_or_abort(&self, mine: &[u8], all: &mut [u8], place: &str) {
        let timeout = self.timeout.get();
        let started = Instant::now();
        let me = self.world.rank();
        mpi::request::scope(|scope| {
            // (rank, request): receives first, so that a peer's record finds its receive.
            let mut pending = Vec::with_capacity(2 * self.mesh.num_devices());
            for (rank, slot) in (0..self.world.size()).zip(all.chunks_mut(RECORD)) {
                if rank == me {
                    slot.copy_from_slice(mine);
                } else {
                    let peer = self.world.process_at_rank(rank);
                    pending.push((
                        rank,
                        peer.immediate_receive_into_with_tag(scope, slot, RECORD_TAG),
                    ));
                }
            }
            for rank in (0..self.world.size()).filter(|&r| r != me) {
                let peer = self.world.process_at_rank(rank);
                pending.push((rank, peer.immediate_send_with_tag(scope, mine, RECORD_TAG)));
            }
            loop {
                pending = pending
                    .into_iter()
                    .filter_map(|(rank, request)| request.test().err().map(|r| (rank, r)))
                    .collect();
                if pending.is_empty() {
                    break;
                }
                let waited = started.elapsed();
                if waited > timeout {
                    let mut missing: Vec<usize> = (pending.iter())
                        .filter_map(|&(rank, _)| usize::try_from(rank).ok())
                        .collect();
                    missing.sort_unstable();
                    missing.dedup();
                    let of = match self.threads {
                        1 => self.mesh.to_string(),
                        _ => format!("{} ranks", self.mesh.num_devices()),
                    };
                    eprintln!(
                        "gspmd: {} of {of} waited {timeout:?} at {place} for {}, \
                         which did not come (hung, or busy longer than the MpiMesh timeout): \
                         aborting the MPI job",
                        self.name_ranks(&[self.rank]),
                        self.name_ranks(&missing)
                    );
                    self.world.abort(TIMED_OUT);
                }
                if waited > SPIN {
                    std::thread::yield_now();
                }
            }
        });
    }

    /// This rank's group over `axes` and its communicator, split from the world once per
    /// axis list. Called by every rank at the same collective (after its meeting).
    fn joined(&self, axes: &[String]) -> Result<Rc<Joined>> {
        if let Some(joined) = self.groups.borrow().get(axes) {
            return Ok(Rc::clone(joined));
        }
        let group = Group::of(&self.mesh, self.rank, axes)?;
        let order = ReductionOrder::of(&self.mesh, axes, &group)?;
        // The group's colour is its first member; ranks are ordered by group index.
        let colour = Color::with_value(count(group.members[0])?);
        let comm = self
            .world
            .split_by_color_with_key(colour, count(group.index)?)
            .ok_or_else(|| Error::MpiMesh {
                problem: MpiProblem::Internal {
                    reason: format!("MPI_Comm_split over {axes:?} gave no communicator"),
                },
            })?;
        let joined = Rc::new(Joined { group, order, comm });
        (self.groups.borrow_mut()).insert(axes.to_vec(), Rc::clone(&joined));
        Ok(joined)
    }

    /// Runs collective `op` over `axes` on `x`: meets every rank (at `step`, if given,
    /// then the collective: what the meeting's records compare), resolves the group,
    /// checks the arguments against it and `x`'s shape, then moves the data. Every step
    /// before the data moves fails on every rank alike (all ranks are at the same
    /// collective with operands of one type).
    pub(super) fn collective(
        &self,
        step: Option<&str>,
        op: CollectiveOp,
        axes: &[String],
        x: Literal,
    ) -> Result<Literal> {
        let call = Call::Collective {
            op,
            axes: axes.to_vec(),
        };
        let operand = literal_type(&x);
        match step {
            Some(step) => self.meet(&format!("{step}: {call} of {operand}"))?,
            None => self.meet(&format!("{call} of {operand}"))?,
        }
        let fail = |problem: CollectiveProblem| Error::Collective {
            device: self.device(),
            collective: call.to_string(),
            problem,
        };
        let transfer = |reason: String| fail(CollectiveProblem::Transfer { reason });
        let Call::Collective { op, .. } = &call else {
            return Err(transfer("not a collective".into()));
        };
        let joined = self.joined(axes).map_err(|e| fail(group_problem(e)))?;
        check_arguments(op, &joined.group, &operand.shape)
            .map_err(|reason| fail(CollectiveProblem::Arguments { reason }))?;
        // bf16 and f16 travel as f32 (MPI has no datatype for them): exact, and a
        // reduction of them then sums in f32 in the group's order and rounds once, as on
        // the thread mesh (`combine`), so the results are bitwise the same.
        if operand.dtype.is_narrow_float() {
            let wide = move_data(&joined, &self.scratch, op, x.convert(DType::F32));
            return Ok(wide.map_err(transfer)?.convert(operand.dtype));
        }
        move_data(&joined, &self.scratch, op, x).map_err(transfer)
    }

    /// Every rank's `blocks` (all of one shape and dtype, as many on every rank), by rank
    /// then as given: for outputs, which after a successful run have one shape and
    /// dtype on every device (checked at the meeting).
    pub(crate) fn gather_world(&self, blocks: Vec<Literal>) -> Result<Vec<Literal>> {
        let fail = |reason: String| Error::Collective {
            device: self.device(),
            collective: "the gathering of an output".into(),
            problem: CollectiveProblem::Transfer { reason },
        };
        let first = blocks.first().ok_or_else(|| fail("no blocks".into()))?;
        let (dtype, shape) = (first.dtype(), literal_type(first));
        self.meet(&format!(
            "the gathering of an output of {} x {shape}",
            blocks.len()
        ))?;
        let n = self.mesh.num_devices();
        // Narrow floats travel as f32, as in collectives.
        let narrow = dtype.is_narrow_float();
        let sent: Vec<Literal> = if narrow {
            blocks.iter().map(|b| b.convert(DType::F32)).collect()
        } else {
            blocks
        };
        let gathered = by_dtype!(
            sent[0].dtype(),
            gather_typed(&self.world, n, &sent),
            narrow => Err(format!("{dtype} travels as f32"))
        )
        .map_err(fail)?;
        Ok(if narrow {
            gathered.iter().map(|w| w.convert(dtype)).collect()
        } else {
            gathered
        })
    }

    /// Every rank's `bytes` (of any length), by rank, after a meeting at `place`: the
    /// lengths, then the bytes.
    pub(crate) fn all_gather_bytes(&self, place: &str, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        self.meet(&format!("the gathering of {place}"))?;
        let n = self.mesh.num_devices();
        let fail = |reason: String| Error::Collective {
            device: self.device(),
            collective: format!("the gathering of {place}"),
            problem: CollectiveProblem::Transfer { reason },
        };
        let mut lengths = vec![0u64; n];
        self.world
            .all_gather_into(&(bytes.len() as u64), &mut lengths[..]);
        let sizes = (lengths.iter())
            .map(|&l| usize::try_from(l).map_err(|e| fail(e.to_string())))
            .collect::<Result<Vec<usize>>>()?;
        let all = all_gather_v(&self.world, &bytes, &sizes).map_err(fail)?;
        let mut at = 0;
        Ok(sizes
            .iter()
            .map(|&size| {
                at += size;
                all[at - size..at].to_vec()
            })
            .collect())
    }
}

impl std::fmt::Debug for MpiCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiCommunicator(rank {} of {})", self.rank, self.mesh)
    }
}

/// An MPI count (a C int) for `n`.
fn count(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::MpiMesh {
        problem: MpiProblem::Count { elements: n },
    })
}

fn counts(sizes: &[usize]) -> Result<(Vec<i32>, Vec<i32>), String> {
    let mut displs = Vec::with_capacity(sizes.len());
    let mut at = 0usize;
    for &s in sizes {
        displs.push(count(at).map_err(|e| e.to_string())?);
        at += s;
    }
    let counts = sizes
        .iter()
        .map(|&s| count(s).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    Ok((counts, displs))
}

/// The members' `sizes[i]`-element pieces, concatenated in member order.
fn all_gather_v<T: Equivalence + Copy + Default>(
    comm: &SimpleCommunicator,
    mine: &[T],
    sizes: &[usize],
) -> Result<Vec<T>, String> {
    let (counts, displs) = counts(sizes)?;
    let mut recv = vec![T::default(); sizes.iter().sum()];
    {
        let mut part = PartitionMut::new(&mut recv[..], counts, displs);
        comm.all_gather_varcount_into(mine, &mut part);
    }
    Ok(recv)
}

/// The buffers that reductions receive pieces into, kept from one collective to the
/// next: one per element type, of about [`SCRATCH_BYTES`], so that data arrives in
/// memory that is mapped and cached already (a new buffer's pages fault on first touch).
#[derive(Default)]
struct Scratch(RefCell<Vec<Box<dyn Any>>>);

impl Scratch {
    /// Runs `f` on the kept buffer of `T`s, made `len` long.
    fn with<T: Element, R>(&self, len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
        let kept = {
            let mut kept = self.0.borrow_mut();
            let at = kept.iter().position(|b| b.is::<Vec<T>>());
            at.and_then(|at| kept.swap_remove(at).downcast::<Vec<T>>().ok())
        };
        let mut buffer = kept.map_or_else(Vec::new, |b| *b);
        if buffer.len() < len {
            buffer.resize(len, T::default());
        }
        let out = f(&mut buffer[..len]);
        self.0.borrow_mut().push(Box::new(buffer));
        out
    }
}

/// Elements of a piece received into scratch in a group of `n`: `n + 1` pieces fill
/// [`SCRATCH_BYTES`] (one from each member and one for the caller). The same on every
/// member (they have one `n` and one `T`).
fn piece_len<T>(n: usize) -> usize {
    (SCRATCH_BYTES / ((n + 1) * size_of::<T>())).max(MIN_PIECE)
}

/// This process's rank in `comm` (its group index).
fn rank_of(comm: &SimpleCommunicator) -> usize {
    usize::try_from(comm.rank()).unwrap_or_default()
}

/// The member of index `i` of `comm`.
fn member(comm: &SimpleCommunicator, i: usize) -> Process<'_> {
    comm.process_at_rank(i32::try_from(i).expect("a group index is an MPI rank"))
}

/// Posts the sends of `sends[j]` to every member `j` of `comm` but this one, in pieces of
/// at most `piece` elements.
fn send_pieces<'a, Sc: Scope<'a> + Copy, T: Equivalence>(
    comm: &SimpleCommunicator,
    scope: Sc,
    sends: &[&'a [T]],
    piece: usize,
) -> Vec<Request<'a, [T], Sc>> {
    let me = rank_of(comm);
    let others = sends.iter().enumerate().filter(|&(j, _)| j != me);
    others
        .flat_map(|(j, data)| {
            let to = member(comm, j);
            (data.chunks(piece)).map(move |p| to.immediate_send_with_tag(scope, p, DATA_TAG))
        })
        .collect()
}

/// Sends `sends[j]` to every other member `j` of `comm` and receives from every other
/// member `i` into `receives[i]` (as long as what `i` sends this one; this member's own
/// entry is left alone), all at once.
fn exchange_pieces<T: Equivalence>(
    comm: &SimpleCommunicator,
    sends: &[&[T]],
    receives: &mut [&mut [T]],
) {
    let me = rank_of(comm);
    mpi::request::scope(|scope| {
        let mut requests = send_pieces(comm, scope, sends, MAX_PIECE);
        for (i, into) in receives.iter_mut().enumerate().filter(|&(i, _)| i != me) {
            let from = member(comm, i);
            requests.extend(
                (into.chunks_mut(MAX_PIECE))
                    .map(|p| from.immediate_receive_into_with_tag(scope, p, DATA_TAG)),
            );
        }
        requests.into_iter().for_each(Request::wait_without_status);
    });
}

/// Sends `sends[j]` to every other member `j` of `comm` and receives from every other
/// member the `len` elements it sends this one, through `buffer` (`n` pieces long) in
/// pieces of `piece` elements; `combine(range, pieces)` gets each range of the `len`
/// elements in turn with every member's elements there, in group order (this member's
/// own as `&[]`: the caller holds them). One range at a time: with single-copy transfers
/// (Open MPI's shared-memory transport reads the sender's memory from the receiver's
/// process) the receiving core does the copying, so receiving the next range while
/// combining this one would not overlap.
fn combine_pieces<T: Equivalence>(
    comm: &SimpleCommunicator,
    buffer: &mut [T],
    piece: usize,
    sends: &[&[T]],
    len: usize,
    mut combine: impl FnMut(Range<usize>, &[&[T]]),
) {
    let me = rank_of(comm);
    mpi::request::scope(|scope| {
        let sent = send_pieces(comm, scope, sends, piece);
        for p in 0..len.div_ceil(piece) {
            let range = p * piece..len.min((p + 1) * piece);
            mpi::request::scope(|scope| {
                let slots = buffer
                    .chunks_mut(piece)
                    .enumerate()
                    .filter(|&(i, _)| i != me);
                let arriving: Vec<_> = slots
                    .map(|(i, slot)| {
                        let slot = &mut slot[..range.len()];
                        member(comm, i).immediate_receive_into_with_tag(scope, slot, DATA_TAG)
                    })
                    .collect();
                arriving.into_iter().for_each(Request::wait_without_status);
            });
            let pieces: Vec<&[T]> = (buffer.chunks(piece).enumerate())
                .map(|(i, slot)| {
                    if i == me {
                        &[][..]
                    } else {
                        &slot[..range.len()]
                    }
                })
                .collect();
            combine(range, &pieces);
        }
        sent.into_iter().for_each(Request::wait_without_status);
    });
}

/// The members' pieces concatenated in group order, on a buffer of the pool: this
/// member's own (`sends[me]`) copied, and from every other member `i` the `lens[i]`
/// elements it sends this one (this one sending `sends[j]` to member `j`), received in
/// place. Their place is zero-filled first: safe code receives only into initialised
/// memory, and a write pass from the cache costs less than receiving elsewhere and
/// copying.
fn gather_pieces<T: Element + Equivalence>(
    comm: &SimpleCommunicator,
    sends: &[&[T]],
    lens: &[usize],
) -> Vec<T> {
    let me = rank_of(comm);
    let sizes: Vec<usize> = (lens.iter().enumerate())
        .map(|(i, &len)| if i == me { sends[me].len() } else { len })
        .collect();
    let mut gathered = buffers::with_capacity(sizes.iter().sum());
    for (i, &size) in sizes.iter().enumerate() {
        if i == me {
            gathered.extend_from_slice(sends[me]);
        } else {
            gathered.resize(gathered.len() + size, T::default());
        }
    }
    exchange_pieces(comm, sends, &mut cut_mut(&mut gathered, &sizes));
    gathered
}

/// `data` cut into consecutive pieces of `sizes`.
fn cut_mut<'a, T>(data: &'a mut [T], sizes: &[usize]) -> Vec<&'a mut [T]> {
    let mut rest = data;
    (sizes.iter())
        .map(|&size| {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(size);
            rest = tail;
            piece
        })
        .collect()
}

/// The `n` blocks of `a` along `dim` as slices: of `a` itself where they are contiguous,
/// else copied into `packed` (a buffer of the pool, to give back).
fn contiguous_blocks<'a, T: Element>(
    a: &'a ArrayD<T>,
    dim: usize,
    n: usize,
    packed: &'a mut Vec<T>,
) -> Vec<&'a [T]> {
    let blocks: Vec<ArrayViewD<'a, T>> = (0..n).map(|j| block(a, dim, n, j)).collect();
    if let Some(slices) = blocks.iter().map(ArrayViewD::to_slice).collect() {
        return slices;
    }
    *packed = buffers::with_capacity(a.len());
    for b in &blocks {
        packed.extend(b.iter().copied());
    }
    let size = a.len() / n;
    (0..n).map(|j| &packed[j * size..(j + 1) * size]).collect()
}

/// The elements of `x` in standard (row-major) order: borrowed when `x` is laid out so.
fn elements<T: Element>(x: &Literal) -> Result<Cow<'_, [T]>, String> {
    let a = T::array(x).ok_or_else(|| format!("the operand is not {}", T::DTYPE))?;
    Ok(match a.as_slice() {
        Some(slice) => Cow::Borrowed(slice),
        None => Cow::Owned(a.iter().copied().collect()),
    })
}

/// `n` same-shaped arrays laid end to end in `flat`, as views.
fn views<'a, T>(
    flat: &'a [T],
    shape: &[usize],
    n: usize,
) -> Result<Vec<ArrayViewD<'a, T>>, String> {
    let len: usize = shape.iter().product();
    (0..n)
        .map(|i| {
            let part = flat.get(i * len..(i + 1) * len).ok_or("short receive")?;
            ArrayViewD::from_shape(IxDyn(shape), part).map_err(|e| e.to_string())
        })
        .collect()
}

fn literal<T: Element>(shape: &[usize], data: Vec<T>) -> Result<Literal, String> {
    ArrayD::from_shape_vec(IxDyn(shape), data)
        .map(T::literal)
        .map_err(|e| e.to_string())
}

/// `n` blocks of `shape` laid end to end in `flat`, concatenated along `dim`: `flat`
/// itself when only unit dims precede `dim`.
fn concatenate<T: Element>(
    flat: Vec<T>,
    shape: &[usize],
    n: usize,
    dim: usize,
) -> Result<Literal, String> {
    let mut whole = shape.to_vec();
    whole[dim] *= n;
    if shape[..dim].iter().all(|&d| d == 1) {
        return literal(&whole, flat);
    }
    let joined = ndarray::concatenate(Axis(dim), &views(&flat, shape, n)?)
        .map(T::literal)
        .map_err(|e| format!("cannot concatenate along dim {dim}: {e}"));
    buffers::give_buffer(flat);
    joined
}

/// Every member's `blocks` (all of one shape, as many on every member), by member then
/// as given.
fn gather_typed<T: Element + Equivalence + Default>(
    comm: &SimpleCommunicator,
    n: usize,
    blocks: &[Literal],
) -> Result<Vec<Literal>, String> {
    let mine: Cow<'_, [T]> = match blocks {
        [block] => elements::<T>(block)?,
        _ => Cow::Owned(
            (blocks.iter())
                .map(|b| elements::<T>(b).map(|e| e.into_owned()))
                .collect::<Result<Vec<Vec<T>>, String>>()?
                .concat(),
        ),
    };
    let shape = blocks.first().map(Literal::shape).unwrap_or_default();
    let all = all_gather_v(comm, &mine, &vec![mine.len(); n])?;
    views(&all, &shape, n * blocks.len())?
        .into_iter()
        .map(|v| Ok(T::literal(v.to_owned())))
        .collect()
}

/// Reduce-scatter then all-gather of the flattened operand, in the operand's own buffer:
/// member `i` receives chunk `i` of every other member's operand in pieces, combines
/// each range with its own in the group's [`ReductionOrder`] into its own chunk `i` (the
/// shared-memory communicator's order and bits), then receives the others' reduced
/// chunks into the rest of its buffer.
fn all_reduce_typed<T: Element<Acc = T> + Equivalence>(
    joined: &Joined,
    scratch: &Scratch,
    kind: ReduceKind,
    x: Literal,
) -> Result<Literal, String> {
    let (comm, n, me) = (&joined.comm, joined.group.size(), joined.group.index);
    let mut x = standard_layout(x);
    let data = (T::array_mut(&mut x).and_then(|a| a.as_slice_mut()))
        .ok_or_else(|| format!("the operand is not {}", T::DTYPE))?;
    let len = data.len();
    let sizes: Vec<usize> = (0..n)
        .map(|i| chunk_start(len, n, i + 1) - chunk_start(len, n, i))
        .collect();
    let mut chunks = cut_mut(data, &sizes);
    let mine = std::mem::take(&mut chunks[me]);
    let piece = piece_len::<T>(n);
    scratch.with::<T, _>((n + 1) * piece, |buffer| {
        let (own, buffer) = buffer.split_at_mut(piece);
        let sends: Vec<&[T]> = chunks.iter().map(|c| &**c).collect();
        combine_pieces(comm, buffer, piece, &sends, mine.len(), |range, pieces| {
            // A copy of this member's piece, as the reduction writes over it.
            let own = &mut own[..range.len()];
            own.copy_from_slice(&mine[range.clone()]);
            let mut pieces = pieces.to_vec();
            pieces[me] = own;
            reduce_chunks_into(kind, &joined.order, &pieces, &mut mine[range]);
        });
    });
    exchange_pieces(comm, &vec![&*mine; n], &mut chunks);
    Ok(x)
}

fn all_gather_typed<T: Element + Equivalence>(
    joined: &Joined,
    dim: usize,
    x: Literal,
) -> Result<Literal, String> {
    let n = joined.group.size();
    let mine = elements::<T>(&x)?;
    let gathered = gather_pieces(&joined.comm, &vec![&mine[..]; n], &vec![mine.len(); n]);
    concatenate(gathered, &x.shape(), n, dim)
}

/// Member `i` gets block `i` along `dim` of every member's operand in pieces and
/// combines each range in the group's [`ReductionOrder`] (the shared-memory
/// communicator's order and bits).
fn reduce_scatter_typed<T: Element<Acc = T> + Equivalence>(
    joined: &Joined,
    scratch: &Scratch,
    kind: ReduceKind,
    dim: usize,
    x: Literal,
) -> Result<Literal, String> {
    let (n, me) = (joined.group.size(), joined.group.index);
    let a = T::array(&x).ok_or_else(|| format!("the operand is not {}", T::DTYPE))?;
    let mut packed = Vec::new();
    let blocks = contiguous_blocks(a, dim, n, &mut packed);
    let len = blocks[me].len();
    let mut out = buffers::with_capacity(len);
    let piece = piece_len::<T>(n);
    scratch.with::<T, _>((n + 1) * piece, |buffer| {
        let (reduced, buffer) = buffer.split_at_mut(piece);
        combine_pieces(
            &joined.comm,
            buffer,
            piece,
            &blocks,
            len,
            |range, pieces| {
                let mut pieces = pieces.to_vec();
                pieces[me] = &blocks[me][range.clone()];
                let reduced = &mut reduced[..range.len()];
                reduce_chunks_into(kind, &joined.order, &pieces, reduced);
                out.extend_from_slice(reduced);
            },
        );
    });
    buffers::give_buffer(packed);
    let mut shape = x.shape();
    shape[dim] /= n;
    literal(&shape, out)
}

fn all_to_all_typed<T: Element + Equivalence>(
    joined: &Joined,
    split_dim: usize,
    concat_dim: usize,
    x: Literal,
) -> Result<Literal, String> {
    let n = joined.group.size();
    let a = T::array(&x).ok_or_else(|| format!("the operand is not {}", T::DTYPE))?;
    let mut packed = Vec::new();
    let blocks = contiguous_blocks(a, split_dim, n, &mut packed);
    let lens = vec![blocks[0].len(); n];
    let gathered = gather_pieces(&joined.comm, &blocks, &lens);
    buffers::give_buffer(packed);
    let mut shape = x.shape();
    shape[split_dim] /= n;
    concatenate(gathered, &shape, n, concat_dim)
}

/// Sends `x` to this member's target and receives from its source; a member that is
/// no target gets zeros.
fn collective_permute_typed<T: Element + Equivalence>(
    joined: &Joined,
    pairs: &[(usize, usize)],
    x: Literal,
) -> Result<Literal, String> {
    let (n, me) = (joined.group.size(), joined.group.index);
    let source = pairs.iter().find(|&&(_, t)| t == me).map(|&(s, _)| s);
    let target = pairs.iter().find(|&&(s, _)| s == me).map(|&(_, t)| t);
    if source == Some(me) {
        return Ok(x);
    }
    let mine = elements::<T>(&x)?;
    let mut sends = vec![&[][..]; n];
    let mut lens = vec![0; n];
    if let Some(target) = target {
        sends[target] = &mine[..];
    }
    if let Some(source) = source {
        lens[source] = mine.len();
    }
    let received = gather_pieces(&joined.comm, &sends, &lens);
    match source {
        Some(_) => literal(&x.shape(), received),
        None => Ok(Literal::full(&x.shape(), T::DTYPE, 0.0)),
    }
}

/// The error for a narrow float reaching a typed collective: [`MpiCommunicator::collective`]
/// widens them first.
fn wide_only(x: &Literal) -> Result<Literal, String> {
    Err(format!("{} travels as f32", literal_type(x)))
}

/// Moves the data of collective `op` over `joined`'s group (received pieces through
/// `scratch`), this rank's operand `x`
/// (not a narrow float: those travel as f32).
fn move_data(
    joined: &Joined,
    scratch: &Scratch,
    op: &CollectiveOp,
    x: Literal,
) -> Result<Literal, String> {
    match op {
        CollectiveOp::AllReduce(kind) => {
            by_dtype!(x.dtype(), all_reduce_typed(joined, scratch, *kind, x), narrow => wide_only(&x))
        }
        CollectiveOp::AllGather { dim } => {
            by_dtype!(x.dtype(), all_gather_typed(joined, *dim, x), narrow => wide_only(&x))
        }
        CollectiveOp::ReduceScatter { kind, dim } => by_dtype!(
            x.dtype(),
            reduce_scatter_typed(joined, scratch, *kind, *dim, x),
            narrow => wide_only(&x)
        ),
        CollectiveOp::AllToAll {
            split_dim,
            concat_dim,
        } => by_dtype!(
            x.dtype(),
            all_to_all_typed(joined, *split_dim, *concat_dim, x),
            narrow => wide_only(&x)
        ),
        CollectiveOp::CollectivePermute { pairs } => by_dtype!(
            x.dtype(),
            collective_permute_typed(joined, pairs, x),
            narrow => wide_only(&x)
        ),
    }
}

impl Communicator for MpiCommunicator {
    fn device(&self) -> usize {
        self.rank
    }

    fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    fn all_reduce(&self, axes: &[String], kind: ReduceKind, x: Literal) -> Result<Literal> {
        self.collective(None, CollectiveOp::AllReduce(kind), axes, x)
    }

    fn all_gather(&self, axes: &[String], dim: usize, x: Literal) -> Result<Literal> {
        self.collective(None, CollectiveOp::AllGather { dim }, axes, x)
    }

    fn reduce_scatter(
        &self,
        axes: &[String],
        kind: ReduceKind,
        dim: usize,
        x: Literal,
    ) -> Result<Literal> {
        self.collective(None, CollectiveOp::ReduceScatter { kind, dim }, axes, x)
    }

    fn all_to_all(
        &self,
        axes: &[String],
        split_dim: usize,
        concat_dim: usize,
        x: Literal,
    ) -> Result<Literal> {
        let op = CollectiveOp::AllToAll {
            split_dim,
            concat_dim,
        };
        self.collective(None, op, axes, x)
    }

    fn collective_permute(
        &self,
        axes: &[String],
        pairs: &[(usize, usize)],
        x: Literal,
    ) -> Result<Literal> {
        let op = CollectiveOp::CollectivePermute {
            pairs: pairs.to_vec(),
        };
        self.collective(None, op, axes, x)
    }

    /// Reports `error` to every rank at their next meeting (see [`MpiCommunicator::fail`]).
    fn abort(&self, error: Error) {
        self.fail(&error);
    }
}
