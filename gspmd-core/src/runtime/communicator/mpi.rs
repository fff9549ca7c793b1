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
//! axis list (`MPI_Comm_split`, ranks ordered by group index), with all-to-all and
//! all-gather calls of exactly the bytes each member needs. Reductions combine the
//! members' chunks in the order and with the combine functions of the shared-memory
//! communicator (`combine`), so both backends give equal bits.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi::Tag;
use mpi::datatype::{Equivalence, Partition, PartitionMut};
use mpi::point_to_point::{Destination, Source};
use mpi::topology::{Color, Communicator as _, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;
use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn};

use super::Communicator;
use super::call::{Call, CollectiveOp, census};
use super::combine::{
    Element, ReductionOrder, block, by_dtype, check_arguments, chunk_start, literal_type,
    reduce_blocks, reduce_chunks,
};
use super::group::Group;
use crate::error::{Error, Result};
use crate::ir::{DType, Literal, ReduceKind};
use crate::sharding::Mesh;

/// Bytes of one rank's record at a meeting; longer messages are cut.
const RECORD: usize = 512;

/// The first byte of a record: where the rank is, or that it failed.
const AT: u8 = 0;
const FAILED: u8 = 1;
/// The rank dropped its mesh: it takes part in no more meetings.
const LEFT: u8 = 2;

/// The exit code of every rank when a meeting times out.
const TIMED_OUT: i32 = 3;

/// The tag of the records' point-to-point messages on the world communicator (no other
/// point-to-point message is sent there).
const RECORD_TAG: Tag = 14;

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
        let left = |rank: usize| {
            Error::MpiMesh(format!(
                "{} has left the mesh (dropped its MpiMesh); device {} is at {place}",
                self.name_ranks(&[rank]),
                self.device()
            ))
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
                message: format!(
                    "ranks disagree: {}",
                    census(places.map(|(r, (_, p))| (r * self.threads, p)))
                ),
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
    /// per other rank, so that a rank left waiting knows whose records it lacks. If some
    /// have not come after the timeout, prints that this device waited at `place` for
    /// those ranks and ends the job (`MPI_Abort`: every rank exits with code
    /// [`TIMED_OUT`]). Records from one sender arrive in the order sent (MPI does not
    /// let messages of one source and tag overtake), so each meeting gets its own.
    fn exchange_or_abort(&self, mine: &[u8], all: &mut [u8], place: &str) {
        let timeout = self.timeout.get();
        let deadline = Instant::now() + timeout;
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
            while !pending.is_empty() {
                pending = pending
                    .into_iter()
                    .filter_map(|(rank, request)| request.test().err().map(|r| (rank, r)))
                    .collect();
                if !pending.is_empty() && Instant::now() > deadline {
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
                std::thread::yield_now();
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
            .ok_or_else(|| Error::RankFailed {
                rank: self.rank,
                message: format!("MPI_Comm_split over {axes:?} gave no communicator"),
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
        let fail = |message: String| Error::Collective {
            device: self.device(),
            collective: call.to_string(),
            message,
        };
        let Call::Collective { op, .. } = &call else {
            return Err(fail("not a collective".into()));
        };
        let joined = self.joined(axes).map_err(|e| fail(e.to_string()))?;
        check_arguments(op, &joined.group, &operand.shape).map_err(fail)?;
        // bf16 and f16 travel as f32 (MPI has no datatype for them): exact, and a
        // reduction of them then sums in f32 in the group's order and rounds once, as on
        // the thread mesh (`combine`), so the results are bitwise the same.
        if operand.dtype.is_narrow_float() {
            let wide = exchange(&joined, op, x.convert(DType::F32)).map_err(fail)?;
            return Ok(wide.convert(operand.dtype));
        }
        exchange(&joined, op, x).map_err(fail)
    }

    /// Every rank's `blocks` (all of one shape and dtype, as many on every rank), by rank
    /// then as given: for outputs, which after a successful run have one shape and
    /// dtype on every device (checked at the meeting).
    pub(crate) fn gather_world(&self, blocks: Vec<Literal>) -> Result<Vec<Literal>> {
        let fail = |message: String| Error::Collective {
            device: self.device(),
            collective: "the gathering of an output".into(),
            message,
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
        let fail = |message: String| Error::Collective {
            device: self.device(),
            collective: format!("the gathering of {place}"),
            message,
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
    i32::try_from(n).map_err(|_| Error::MpiMesh(format!("{n} elements exceed an MPI count")))
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

/// Each member sends `send[displ(j)..][..send_sizes[j]]` to member `j` and receives
/// `recv_sizes[i]` elements from member `i`, laid out in member order.
fn all_to_all_v<T: Equivalence + Copy + Default>(
    comm: &SimpleCommunicator,
    send: &[T],
    send_sizes: &[usize],
    recv_sizes: &[usize],
) -> Result<Vec<T>, String> {
    let (send_counts, send_displs) = counts(send_sizes)?;
    let (recv_counts, recv_displs) = counts(recv_sizes)?;
    let mut recv = vec![T::default(); recv_sizes.iter().sum()];
    {
        let send = Partition::new(send, send_counts, send_displs);
        let mut part = PartitionMut::new(&mut recv[..], recv_counts, recv_displs);
        comm.all_to_all_varcount_into(&send, &mut part);
    }
    Ok(recv)
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

fn concatenate<T: Element>(dim: usize, blocks: &[ArrayViewD<'_, T>]) -> Result<Literal, String> {
    ndarray::concatenate(Axis(dim), blocks)
        .map(T::literal)
        .map_err(|e| format!("cannot concatenate along dim {dim}: {e}"))
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

/// Reduce-scatter then all-gather of the flattened operand: member `i` receives chunk
/// `i` of everyone's operand, combines them in the group's [`ReductionOrder`], and every
/// member gathers the reduced chunks — the shared-memory communicator's order and bits.
fn all_reduce_typed<T: Element + Equivalence + Default>(
    joined: &Joined,
    kind: ReduceKind,
    x: Literal,
) -> Result<Literal, String> {
    let shape = x.shape();
    let mine = elements::<T>(&x)?;
    let (n, index) = (joined.group.size(), joined.group.index);
    let len = mine.len();
    let sizes: Vec<usize> = (0..n)
        .map(|i| chunk_start(len, n, i + 1) - chunk_start(len, n, i))
        .collect();
    let received = all_to_all_v(&joined.comm, &mine, &sizes, &vec![sizes[index]; n])?;
    let chunks: Vec<&[T]> = received.chunks(sizes[index].max(1)).take(n).collect();
    let reduced = if sizes[index] == 0 {
        Vec::new()
    } else {
        reduce_chunks(kind, &joined.order, &chunks).ok_or("empty group")?
    };
    literal(&shape, all_gather_v(&joined.comm, &reduced, &sizes)?)
}

fn all_gather_typed<T: Element + Equivalence + Default>(
    joined: &Joined,
    dim: usize,
    x: Literal,
) -> Result<Literal, String> {
    let n = joined.group.size();
    let mine = elements::<T>(&x)?;
    let all = all_gather_v(&joined.comm, &mine, &vec![mine.len(); n])?;
    concatenate(dim, &views(&all, &x.shape(), n)?)
}

/// Sends block `j` of `x` along `dim` to member `j`; returns the blocks received, in
/// sender order, and their shape.
fn exchange_blocks<T: Element + Equivalence + Default>(
    joined: &Joined,
    dim: usize,
    x: &Literal,
) -> Result<(Vec<T>, Vec<usize>), String> {
    let n = joined.group.size();
    let a = T::array(x).ok_or_else(|| format!("the operand is not {}", T::DTYPE))?;
    let mut send: Vec<T> = Vec::with_capacity(a.len());
    for j in 0..n {
        let b = block(a, dim, n, j);
        match b.as_slice() {
            Some(contiguous) => send.extend_from_slice(contiguous),
            None => send.extend(b.iter().copied()),
        }
    }
    let mut shape = x.shape();
    shape[dim] /= n;
    let size: usize = shape.iter().product();
    Ok((
        all_to_all_v(&joined.comm, &send, &vec![size; n], &vec![size; n])?,
        shape,
    ))
}

fn reduce_scatter_typed<T: Element + Equivalence + Default>(
    joined: &Joined,
    kind: ReduceKind,
    dim: usize,
    x: Literal,
) -> Result<Literal, String> {
    let (received, shape) = exchange_blocks::<T>(joined, dim, &x)?;
    reduce_blocks(
        kind,
        &joined.order,
        &views(&received, &shape, joined.group.size())?,
    )
    .map(T::literal)
    .ok_or_else(|| "empty group".into())
}

fn all_to_all_typed<T: Element + Equivalence + Default>(
    joined: &Joined,
    split_dim: usize,
    concat_dim: usize,
    x: Literal,
) -> Result<Literal, String> {
    let (received, shape) = exchange_blocks::<T>(joined, split_dim, &x)?;
    concatenate(concat_dim, &views(&received, &shape, joined.group.size())?)
}

/// Sends `x` to this member's target and receives from its source; a member that is
/// no target gets zeros.
fn collective_permute_typed<T: Element + Equivalence + Default>(
    joined: &Joined,
    pairs: &[(usize, usize)],
    x: Literal,
) -> Result<Literal, String> {
    let (n, index) = (joined.group.size(), joined.group.index);
    let mine = elements::<T>(&x)?;
    let mut send_sizes = vec![0; n];
    let mut recv_sizes = vec![0; n];
    for &(source, target) in pairs {
        if source == index {
            send_sizes[target] = mine.len();
        }
        if target == index {
            recv_sizes[source] = mine.len();
        }
    }
    let received = all_to_all_v(&joined.comm, &mine, &send_sizes, &recv_sizes)?;
    if received.is_empty() && !mine.is_empty() {
        return Ok(Literal::full(&x.shape(), T::DTYPE, 0.0));
    }
    literal(&x.shape(), received)
}

/// The error for a narrow float reaching a typed collective: [`MpiCommunicator::collective`]
/// widens them first.
fn wide_only(x: &Literal) -> Result<Literal, String> {
    Err(format!("{} travels as f32", literal_type(x)))
}

/// Moves the data of collective `op` over `joined`'s group, this rank's operand `x`
/// (not a narrow float: those travel as f32).
fn exchange(joined: &Joined, op: &CollectiveOp, x: Literal) -> Result<Literal, String> {
    match op {
        CollectiveOp::AllReduce(kind) => {
            by_dtype!(x.dtype(), all_reduce_typed(joined, *kind, x), narrow => wide_only(&x))
        }
        CollectiveOp::AllGather { dim } => {
            by_dtype!(x.dtype(), all_gather_typed(joined, *dim, x), narrow => wide_only(&x))
        }
        CollectiveOp::ReduceScatter { kind, dim } => by_dtype!(
            x.dtype(),
            reduce_scatter_typed(joined, *kind, *dim, x),
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
