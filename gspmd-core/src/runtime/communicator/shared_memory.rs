//! [`SharedMemoryCommunicator`]: the collectives for devices that are threads of one
//! process, and the element combine functions of their reductions. When the devices are
//! one process's share of a larger mesh, collectives whose groups span processes go to
//! the process's thread through the [`Uplink`].

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Slice};
use smallvec::SmallVec;

use super::super::buffers;
use super::Communicator;
use super::call::{Call, CollectiveOp, Post, Round, check_calls};
use super::combine::{
    Element, ReductionOrder, TILE, block, by_dtype, check_arguments, chunk_start, literal_type,
    prime_factors, reduce_blocks, reduce_chunks, same_type, shape_of, standard_layout,
};
use super::group::{Group, group_problem};
use super::rendezvous::{Meeting, Rendezvous, SPIN};
use super::uplink::Uplink;
use crate::error::{CollectiveProblem, Error, Result, ThreadMeshProblem};
use crate::ir::{DType, Literal, Op, ReduceKind};
use crate::sharding::Mesh;

/// A [`Communicator`] for devices that are threads of one process: collectives exchange
/// `Arc`s of the operands in the [`Meeting`] of their group only (devices of other
/// groups run on), and each member reads only the parts of the others' buffers it
/// needs. A group of one meets nobody. With an [`Uplink`] (the devices are a share of
/// a mesh spanning processes), a collective whose group has members in other processes
/// is a step of the process, and so is the end of a program.
#[derive(Debug, Clone)]
pub(crate) struct SharedMemoryCommunicator {
    device: usize,
    mesh: Arc<Mesh>,
    rendezvous: Arc<Rendezvous>,
    /// The meeting of every device, at the end of each program.
    everyone: Arc<Meeting>,
    /// Its one place, the end of a program.
    end: Arc<Call>,
    /// This device's group over each axis list used so far, made on first use.
    groups: RefCell<HashMap<Vec<String>, Arc<Joined>>>,
    /// The run (the rendezvous's generation) this device is in.
    generation: u64,
    /// The way to the other processes, if the mesh spans several.
    uplink: Option<Arc<Uplink>>,
    /// Whether this run's process takes its devices' steps: else the run stays inside
    /// the process (no collective may span processes, the end is the devices' own).
    linked: bool,
}

/// A device's group over an axis list, with the order its reductions combine in, the
/// meeting where its members exchange (`None` for a group of one, or one spanning
/// processes) and the slot in that meeting's rounds of each member, in group order.
#[derive(Debug)]
struct Joined {
    group: Group,
    order: ReductionOrder,
    meeting: Option<Arc<Meeting>>,
    /// The uplink, if the group has members in other processes.
    uplink: Option<Arc<Uplink>>,
    slots: Vec<usize>,
    /// The collectives called over the group so far, each made once.
    calls: Mutex<Vec<Arc<Call>>>,
}

impl Joined {
    /// Collective `op` over this group's `axes`, made on first use: the meeting's
    /// instance of it (see [`Meeting::call`]), if the group meets.
    fn call(&self, op: CollectiveOp, axes: &[String]) -> Arc<Call> {
        let mut calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        let made = calls
            .iter()
            .find(|c| matches!(&***c, Call::Collective { op: o, .. } if *o == op));
        if let Some(call) = made {
            return Arc::clone(call);
        }
        let call = Call::Collective {
            op,
            axes: axes.to_vec(),
        };
        let call = match (&self.meeting, &self.uplink) {
            (Some(meeting), _) => meeting.call(call),
            (None, Some(uplink)) => uplink.call(call),
            (None, None) => Arc::new(call),
        };
        calls.push(Arc::clone(&call));
        call
    }
}

/// How a collective starts: alone (a group of one, for a collective that is then the
/// identity), with the first round of posts of its group, or as a step of the process
/// (a group spanning processes) at this call.
enum Start {
    Alone(Literal),
    Exchange(Exchange),
    Process(Arc<Uplink>, Arc<Call>, Literal),
}

impl SharedMemoryCommunicator {
    /// The communicator of `device`, one of the devices of `rendezvous`; `uplink` is
    /// theirs if the mesh spans other processes.
    pub(crate) fn new(
        device: usize,
        mesh: Arc<Mesh>,
        rendezvous: Arc<Rendezvous>,
        uplink: Option<Arc<Uplink>>,
    ) -> Self {
        let everyone = rendezvous.everyone();
        SharedMemoryCommunicator {
            device,
            mesh,
            end: everyone.call(Call::End),
            everyone,
            rendezvous,
            groups: RefCell::new(HashMap::new()),
            generation: 0,
            uplink,
            linked: false,
        }
    }

    /// Joins run `generation` of the rendezvous: this device's collectives and aborts
    /// from now on belong to it. `linked`: the process takes the run's steps across
    /// processes (see [`Uplink`]).
    pub(crate) fn join_run(&mut self, generation: u64, linked: bool) {
        self.generation = generation;
        self.linked = linked && self.uplink.is_some();
    }

    /// Aborts the communicator with `result`'s error, unless that error is itself the
    /// consequence of an abort.
    fn abort_on_error<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(error) = &result
            && !matches!(error, Error::Aborted { .. })
        {
            self.rendezvous.abort(self.generation, error.clone());
        }
        result
    }

    /// This device's group over `axes` and its meeting, made once per axis list.
    fn joined(&self, axes: &[String]) -> Result<Arc<Joined>> {
        if let Some(joined) = self.groups.borrow().get(axes) {
            return Ok(Arc::clone(joined));
        }
        let group = Group::of(&self.mesh, self.device, axes)?;
        let order = ReductionOrder::of(&self.mesh, axes, &group)?;
        let here = self.everyone.devices();
        let uplink = (self.uplink.clone())
            .filter(|_| !group.members.iter().all(|m| here.binary_search(m).is_ok()));
        let (meeting, slots) = if group.size() == 1 || uplink.is_some() {
            (None, vec![0])
        } else {
            let mut devices = group.members.clone();
            devices.sort_unstable();
            let meeting = self.rendezvous.meeting(devices);
            let slots = (group.members.iter())
                .map(|&m| meeting.slot(m).unwrap_or_default())
                .collect();
            (Some(meeting), slots)
        };
        let joined = Arc::new(Joined {
            group,
            order,
            meeting,
            uplink,
            slots,
            calls: Mutex::new(Vec::new()),
        });
        (self.groups.borrow_mut()).insert(axes.to_vec(), Arc::clone(&joined));
        Ok(joined)
    }

    /// Runs collective `op` over `axes` on `x`: resolves the group, checks the arguments
    /// against it and `x`'s shape, meets the group, checks that all members are at the
    /// same collective and that their operands agree in shape and dtype, then computes
    /// the result with `compute`. A group of one meets nobody: every collective but collective_permute
    /// is then the identity. Any error aborts the communicator.
    fn collective(
        &self,
        op: CollectiveOp,
        axes: &[String],
        x: Literal,
        compute: impl FnOnce(&Self, Exchange) -> Result<Literal>,
    ) -> Result<Literal> {
        let result = self.start(op, axes, x).and_then(|start| match start {
            Start::Alone(x) => Ok(x),
            Start::Exchange(ex) => compute(self, ex),
            Start::Process(uplink, call, x) => uplink
                .step(
                    &self.rendezvous,
                    self.device,
                    self.generation,
                    call,
                    Some(x),
                )?
                .ok_or_else(|| Error::ThreadMesh {
                    problem: ThreadMeshProblem::Internal {
                        reason: "the process gave no result".into(),
                    },
                }),
        });
        self.abort_on_error(result)
    }

    fn start(&self, op: CollectiveOp, axes: &[String], x: Literal) -> Result<Start> {
        let identity_when_alone = !matches!(op, CollectiveOp::CollectivePermute { .. });
        let joined = self.joined(axes).map_err(|e| Error::Collective {
            device: self.device,
            collective: Call::Collective {
                op: op.clone(),
                axes: axes.to_vec(),
            }
            .to_string(),
            problem: group_problem(e),
        })?;
        let call = joined.call(op, axes);
        let fail = |problem: CollectiveProblem| Error::Collective {
            device: self.device,
            collective: call.to_string(),
            problem,
        };
        let Call::Collective { op, .. } = &*call else {
            let reason = "not a collective".into();
            return Err(fail(CollectiveProblem::Transfer { reason }));
        };
        let shape = shape_of(&x);
        check_arguments(op, &joined.group, shape)
            .map_err(|reason| fail(CollectiveProblem::Arguments { reason }))?;
        if let Some(uplink) = &joined.uplink {
            if !self.linked {
                return Err(fail(CollectiveProblem::Unlinked));
            }
            return Ok(Start::Process(Arc::clone(uplink), call, x));
        }
        let Some(meeting) = &joined.meeting else {
            if identity_when_alone {
                return Ok(Start::Alone(x));
            }
            let mine = Arc::new(x);
            let own = Post {
                call: Arc::clone(&call),
                checked: false,
                data: Some(Arc::clone(&mine)),
            };
            return Ok(Start::Exchange(Exchange {
                device: self.device,
                call,
                joined,
                mine,
                round: Arc::new(vec![own]),
            }));
        };
        let elements: usize = shape.iter().product();
        let mine = Arc::new(x);
        let post = Post {
            call: Arc::clone(&call),
            checked: true,
            data: Some(Arc::clone(&mine)),
        };
        let spin = if elements <= ONE_ROUND_MAX_ELEMENTS {
            SPIN
        } else {
            Duration::ZERO
        };
        let round = self
            .rendezvous
            .exchange(meeting, self.device, self.generation, post, spin)?;
        check_calls(&round, meeting.devices(), &call).map_err(fail)?;
        for (&member, &slot) in joined.group.members.iter().zip(&joined.slots) {
            let theirs = (round[slot].data.as_deref()).filter(|_| round[slot].checked);
            if let Some(theirs) = theirs.filter(|t| !same_type(t, &mine)) {
                return Err(fail(CollectiveProblem::OperandsDiffer {
                    device: self.device,
                    ty: literal_type(&mine),
                    other: member,
                    other_ty: literal_type(theirs),
                }));
            }
        }
        Ok(Start::Exchange(Exchange {
            device: self.device,
            call,
            joined,
            mine,
            round,
        }))
    }

    /// Meets every device at the end of their programs: an error if another device is
    /// still in a collective (it called one this device did not), which aborts. With an
    /// uplink, the end is a step of the process: `Ok` once every process has ended.
    pub(crate) fn end_program(&self) -> Result<()> {
        if let Some(uplink) = self.uplink.as_ref().filter(|_| self.linked) {
            let end = uplink.call(Call::End);
            let ended = uplink.step(&self.rendezvous, self.device, self.generation, end, None);
            return self.abort_on_error(ended.map(drop));
        }
        let call = Arc::clone(&self.end);
        let post = Post {
            call: Arc::clone(&call),
            checked: false,
            data: None,
        };
        let result = self
            .rendezvous
            .exchange(
                &self.everyone,
                self.device,
                self.generation,
                post,
                Duration::ZERO,
            )
            .and_then(|round| {
                check_calls(&round, self.everyone.devices(), &call).map_err(|problem| {
                    Error::Collective {
                        device: self.device,
                        collective: call.to_string(),
                        problem,
                    }
                })
            });
        self.abort_on_error(result)
    }
}

/// A collective in progress: this device's group, its own operand and the first round
/// of posts (whose group members' operands have this operand's shape and dtype).
struct Exchange {
    device: usize,
    call: Arc<Call>,
    joined: Arc<Joined>,
    mine: Arc<Literal>,
    round: Round,
}

impl Exchange {
    fn group(&self) -> &Group {
        &self.joined.group
    }

    fn fail(&self, reason: String) -> Error {
        Error::Collective {
            device: self.device,
            collective: self.call.to_string(),
            problem: CollectiveProblem::Transfer { reason },
        }
    }

    /// The group members' operands as `T` arrays, in group order.
    fn operands<T: Element>(&self) -> Result<Vec<&ArrayD<T>>> {
        (0..self.group().size()).map(|i| self.operand(i)).collect()
    }

    /// The operand of the member at group index `i` as a `T` array.
    fn operand<T: Element>(&self, i: usize) -> Result<&ArrayD<T>> {
        self.round[self.joined.slots[i]]
            .data
            .as_deref()
            .and_then(T::array)
            .ok_or_else(|| {
                let member = self.group().members[i];
                self.fail(format!("device {member} shared no {} operand", T::DTYPE))
            })
    }
}

impl Communicator for SharedMemoryCommunicator {
    fn device(&self) -> usize {
        self.device
    }

    fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// Reduce-scatter then all-gather over the flattened operands: member `i` reduces
    /// only the `i`-th contiguous chunk, then every member copies all chunks into its own
    /// operand's buffer.
    fn all_reduce(&self, axes: &[String], kind: ReduceKind, x: Literal) -> Result<Literal> {
        let x = standard_layout(x);
        self.collective(CollectiveOp::AllReduce(kind), axes, x, |comm, ex| {
            by_dtype!(ex.mine.dtype(), all_reduce_typed(comm, ex, kind))
        })
    }

    fn all_gather(&self, axes: &[String], dim: usize, x: Literal) -> Result<Literal> {
        self.collective(CollectiveOp::AllGather { dim }, axes, x, |_, ex| {
            by_dtype!(ex.mine.dtype(), all_gather_typed(ex, dim))
        })
    }

    fn reduce_scatter(
        &self,
        axes: &[String],
        kind: ReduceKind,
        dim: usize,
        x: Literal,
    ) -> Result<Literal> {
        self.collective(
            CollectiveOp::ReduceScatter { kind, dim },
            axes,
            x,
            |_, ex| by_dtype!(ex.mine.dtype(), reduce_scatter_typed(ex, kind, dim)),
        )
    }

    fn all_to_all(
        &self,
        axes: &[String],
        split_dim: usize,
        concat_dim: usize,
        x: Literal,
    ) -> Result<Literal> {
        self.collective(
            CollectiveOp::AllToAll {
                split_dim,
                concat_dim,
            },
            axes,
            x,
            |_, ex| by_dtype!(ex.mine.dtype(), all_to_all_typed(ex, split_dim, concat_dim)),
        )
    }

    fn collective_permute(
        &self,
        axes: &[String],
        pairs: &[(usize, usize)],
        x: Literal,
    ) -> Result<Literal> {
        self.collective(
            CollectiveOp::CollectivePermute {
                pairs: pairs.to_vec(),
            },
            axes,
            x,
            |_, ex| by_dtype!(ex.mine.dtype(), collective_permute_typed(ex, pairs)),
        )
    }

    fn abort(&self, error: Error) {
        self.rendezvous.abort(self.generation, error);
    }
}

/// Operands of at most this many elements are all-reduced in one round: each member
/// reduces every posted operand itself, trading the group size times the arithmetic
/// for one meeting instead of two. Collectives of such operands are small: their
/// members spin a while before sleeping ([`SPIN`]).
const ONE_ROUND_MAX_ELEMENTS: usize = 4096;

/// The scratch a reduction collective (an all-reduce or a reduce-scatter; `result_elements`
/// elements of `dtype` on each member of a group of `group_size`) holds on a thread mesh
/// besides its operand and its result: the accumulators of its [`ReductionOrder`]'s
/// levels (one per prime factor of the group size; f32 for narrow floats), the whole
/// result's when the operand is small or scattered, else the member's chunk and a
/// cache-sized tile per further level, and the chunk rounded to `dtype` when that is
/// narrower. No other collective holds any. The memory analysis counts it
/// (`runtime::liveness::kernel_scratch`).
pub(crate) fn reduction_scratch_bytes(
    op: &Op,
    dtype: DType,
    result_elements: usize,
    group_size: usize,
) -> usize {
    let levels = prime_factors(group_size).len().max(1);
    let acc = match dtype {
        DType::Bool => 1,
        _ => 4,
    };
    // A level's accumulator is the result itself only when `dtype` is its own
    // accumulator type.
    let own = usize::from(acc == dtype.size_in_bytes());
    match op {
        Op::AllReduce { .. } if result_elements > ONE_ROUND_MAX_ELEMENTS => {
            let chunk = result_elements.div_ceil(group_size.max(1));
            let rounded = if own == 1 {
                0
            } else {
                chunk * dtype.size_in_bytes()
            };
            chunk * acc + (levels - 1) * TILE.min(chunk) * acc + rounded
        }
        Op::AllReduce { .. } | Op::ReduceScatter { .. } => (levels - own) * result_elements * acc,
        _ => 0,
    }
}

/// Every member gets, element by element, the members' operands combined in the group's
/// [`ReductionOrder`] — on both paths (one round, or reduce-scatter then all-gather), so
/// results are bitwise the same on every member and every path.
fn all_reduce_typed<T: Element>(
    comm: &SharedMemoryCommunicator,
    ex: Exchange,
    kind: ReduceKind,
) -> Result<Literal> {
    let len = shape_of(&ex.mine).iter().product();
    let order = &ex.joined.order;
    if len <= ONE_ROUND_MAX_ELEMENTS {
        let views = (0..ex.group().size())
            .map(|i| ex.operand::<T>(i).map(|x| x.view()))
            .collect::<Result<SmallVec<[ArrayViewD<'_, T>; 8]>>>()?;
        return reduce_blocks(kind, order, &views)
            .map(T::literal)
            .ok_or_else(|| ex.fail("empty group".into()));
    }
    let n = ex.group().size();
    let index = ex.group().index;
    let range = |i: usize| chunk_start(len, n, i)..chunk_start(len, n, i + 1);
    // Reduce-scatter: reduce my chunk of everyone's operand, a cache-sized tile at a time.
    let chunks: Vec<&[T]> = ex
        .operands::<T>()?
        .into_iter()
        .map(|x| {
            x.as_slice()
                .map(|all| &all[range(index)])
                .ok_or_else(|| ex.fail("an operand is not in standard layout".into()))
        })
        .collect::<Result<_>>()?;
    let reduced =
        reduce_chunks(kind, order, &chunks).ok_or_else(|| ex.fail("empty group".into()))?;
    let reduced = ArrayD::from_shape_vec(IxDyn(&[reduced.len()]), reduced)
        .map_err(|e| ex.fail(format!("reduced chunk: {e}")))?;
    drop(chunks);
    let meeting = (ex.joined.meeting.clone()).ok_or_else(|| ex.fail("no meeting".into()))?;
    // All-gather the reduced chunks into my own operand's buffer, which nobody reads once
    // every member has let go of the first round.
    let Exchange {
        call,
        joined,
        mine,
        round,
        ..
    } = ex;
    drop(round);
    let post = Post {
        call: Arc::clone(&call),
        checked: false,
        data: Some(Arc::new(T::literal(reduced))),
    };
    let round =
        comm.rendezvous
            .exchange(&meeting, comm.device, comm.generation, post, Duration::ZERO)?;
    let mut result = Arc::unwrap_or_clone(mine);
    let fail = |reason: String| Error::Collective {
        device: comm.device,
        collective: call.to_string(),
        problem: CollectiveProblem::Transfer { reason },
    };
    let out = T::array_mut(&mut result)
        .and_then(|a| a.as_slice_mut())
        .ok_or_else(|| fail("own operand is not a standard-layout array".into()))?;
    for (i, (&member, &slot)) in joined.group.members.iter().zip(&joined.slots).enumerate() {
        let chunk = round[slot]
            .data
            .as_deref()
            .and_then(T::array)
            .and_then(|a| a.as_slice())
            .ok_or_else(|| fail(format!("device {member} posted no reduced chunk")))?;
        out[range(i)].copy_from_slice(chunk);
    }
    Ok(result)
}

fn all_gather_typed<T: Element>(ex: Exchange, dim: usize) -> Result<Literal> {
    let operands = ex.operands::<T>()?;
    let views: Vec<ArrayViewD<'_, T>> = operands.iter().map(|x| x.view()).collect();
    concatenate(&ex, dim, &views)
}

/// `blocks` (of one shape off `dim`) concatenated along `dim`, into a pooled buffer.
fn concatenate<T: Element>(
    ex: &Exchange,
    dim: usize,
    blocks: &[ArrayViewD<'_, T>],
) -> Result<Literal> {
    let first = blocks
        .first()
        .ok_or_else(|| ex.fail("empty group".into()))?;
    let mut shape = first.shape().to_vec();
    let fits = |b: &ArrayViewD<'_, T>| b.ndim() == shape.len() && dim < shape.len();
    if !blocks.iter().all(fits) {
        return Err(ex.fail(format!("cannot concatenate along dim {dim}")));
    }
    shape[dim] = blocks.iter().map(|b| b.len_of(Axis(dim))).sum();
    let mut out = buffers::take_array::<T>(&shape);
    let mut start = 0;
    for block in blocks {
        let end = start + block.len_of(Axis(dim));
        let mut part = out.slice_axis_mut(Axis(dim), Slice::from(start..end));
        if part.shape() != block.shape() {
            return Err(ex.fail(format!("blocks differ off dim {dim}")));
        }
        part.assign(block);
        start = end;
    }
    Ok(T::literal(out))
}

/// Block `ex.group().index` along `dim` of every member's operand, in group order.
fn my_blocks<T: Element>(ex: &Exchange, dim: usize) -> Result<Vec<ArrayViewD<'_, T>>> {
    let n = ex.group().size();
    Ok(ex
        .operands::<T>()?
        .into_iter()
        .map(|x| block(x, dim, n, ex.group().index))
        .collect())
}

fn reduce_scatter_typed<T: Element>(ex: Exchange, kind: ReduceKind, dim: usize) -> Result<Literal> {
    reduce_blocks(kind, &ex.joined.order, &my_blocks::<T>(&ex, dim)?)
        .map(T::literal)
        .ok_or_else(|| ex.fail("empty group".into()))
}

fn all_to_all_typed<T: Element>(
    ex: Exchange,
    split_dim: usize,
    concat_dim: usize,
) -> Result<Literal> {
    concatenate(&ex, concat_dim, &my_blocks::<T>(&ex, split_dim)?)
}

fn collective_permute_typed<T: Element>(ex: Exchange, pairs: &[(usize, usize)]) -> Result<Literal> {
    let index = ex.group().index;
    match pairs.iter().find(|&&(_, target)| target == index) {
        Some(&(source, _)) if source == index => Ok(Arc::unwrap_or_clone(ex.mine)),
        Some(&(source, _)) => Ok(T::literal(ex.operand::<T>(source)?.clone())),
        None => Ok(Literal::full(&ex.mine.shape(), T::DTYPE, 0.0)),
    }
}
