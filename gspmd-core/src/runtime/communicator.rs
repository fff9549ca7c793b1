//! [`Communicator`]: the collectives a per-device program calls, and their
//! shared-memory implementation for devices that are threads of one process.
//!
//! A collective acts over the *group* given by a list of mesh axes: the devices that
//! share coordinates on every other axis. Group members are ordered by the mixed-radix
//! index of their coordinates along the listed axes, first listed axis major — the
//! convention shard indices use. An empty list makes every device a group of one.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use ndarray::{ArrayD, ArrayViewD, ArrayViewMutD, Axis, Slice, Zip};

use crate::error::{Error, Result};
use crate::ir::{DType, Literal, ReduceKind, TensorType};
use crate::sharding::Mesh;

/// One device's handle on the collectives of its mesh (MPI's communicator).
///
/// Contract for every collective: all devices of the mesh call the same collectives in
/// the same order with the same arguments (SPMD), and the members of each group pass
/// operands of one shape and dtype. A broken contract, or any other failure inside a
/// collective, is an error on the devices concerned and aborts the communicator, so no
/// device is left waiting. Operands are taken by value so their buffers can be shared
/// with the group without a copy.
pub trait Communicator {
    /// This device's id.
    fn device(&self) -> usize;

    /// The mesh the devices form.
    fn mesh(&self) -> &Mesh;

    /// Every group member gets the elementwise `kind` reduction of the members' `x`.
    fn all_reduce(&self, axes: &[String], kind: ReduceKind, x: Literal) -> Result<Literal>;

    /// Every group member gets the members' `x` concatenated along `dim`, in group order.
    fn all_gather(&self, axes: &[String], dim: usize, x: Literal) -> Result<Literal>;

    /// The member at group index `i` gets block `i` along `dim` of the elementwise `kind`
    /// reduction of the members' `x`; `x`'s `dim` must be divisible by the group size.
    fn reduce_scatter(
        &self,
        axes: &[String],
        kind: ReduceKind,
        dim: usize,
        x: Literal,
    ) -> Result<Literal>;

    /// Every member splits `x` along `split_dim` into group-size blocks and sends block
    /// `j` to member `j`; the blocks received are concatenated along `concat_dim` in
    /// sender order. `x`'s `split_dim` must be divisible by the group size.
    fn all_to_all(
        &self,
        axes: &[String],
        split_dim: usize,
        concat_dim: usize,
        x: Literal,
    ) -> Result<Literal>;

    /// For each `(source, target)` pair of group indices, `target` gets `source`'s `x`;
    /// a member that is no target gets zeros (`false`) of `x`'s shape. Sources are
    /// distinct, and so are targets.
    fn collective_permute(
        &self,
        axes: &[String],
        pairs: &[(usize, usize)],
        x: Literal,
    ) -> Result<Literal>;

    /// Releases every device waiting in a collective, and fails every later one, with
    /// [`Error::Aborted`] carrying `error`. Only the first abort's error is kept.
    fn abort(&self, error: Error);
}

// ---- groups --------------------------------------------------------------------------

/// The devices of one collective group, in group order, and this device's index in it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Group {
    members: Vec<usize>,
    index: usize,
}

impl Group {
    /// The group of `device` over `axes` (see the module docs), or what is wrong with
    /// `axes`.
    fn of(mesh: &Mesh, device: usize, axes: &[String]) -> Result<Group, String> {
        let mut positions: Vec<usize> = Vec::with_capacity(axes.len());
        for axis in axes {
            let position = mesh.axis_index(axis).ok_or_else(|| {
                format!(
                    "unknown mesh axis `{axis}` (mesh axes: {})",
                    mesh.axis_list()
                )
            })?;
            if positions.contains(&position) {
                return Err(format!("mesh axis `{axis}` listed twice"));
            }
            positions.push(position);
        }
        let coords = mesh
            .device_coords(device)
            .ok_or_else(|| format!("device {device} is not in {mesh}"))?;
        let size_of = |position: usize| mesh.axes()[position].1;
        let group_size: usize = positions.iter().map(|&p| size_of(p)).product();
        let mut member_coords = coords.clone();
        let mut members = Vec::with_capacity(group_size);
        for index in 0..group_size {
            let mut rest = index;
            for &p in positions.iter().rev() {
                member_coords[p] = rest % size_of(p);
                rest /= size_of(p);
            }
            members.push(
                mesh.device_at(&member_coords)
                    .ok_or_else(|| format!("no device at {member_coords:?} in {mesh}"))?,
            );
        }
        let index = positions
            .iter()
            .fold(0, |acc, &p| acc * size_of(p) + coords[p]);
        Ok(Group { members, index })
    }

    fn size(&self) -> usize {
        self.members.len()
    }
}

// ---- the rendezvous ------------------------------------------------------------------

/// Where a device is at a rendezvous; every device must be at the same place.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    /// A collective over the group of `axes`.
    Collective { op: Collective, axes: Vec<String> },
    /// The end of the device's program (the thread mesh's last rendezvous of a run).
    End,
}

#[derive(Debug, Clone, PartialEq)]
enum Collective {
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
            Collective::AllReduce(kind) => write!(f, "all_reduce({})", kind_name(kind)),
            Collective::AllGather { dim } => write!(f, "all_gather(dim={dim})"),
            Collective::ReduceScatter { kind, dim } => {
                write!(f, "reduce_scatter({}, dim={dim})", kind_name(kind))
            }
            Collective::AllToAll {
                split_dim,
                concat_dim,
            } => write!(
                f,
                "all_to_all(split_dim={split_dim}, concat_dim={concat_dim})"
            ),
            Collective::CollectivePermute { pairs } => {
                write!(f, "collective_permute(pairs={pairs:?})")
            }
        }?;
        write!(f, " over [{}]", axes.join(", "))
    }
}

/// What one device contributes to one round of a rendezvous: where it is, the type of
/// its operand, and the operand itself when its group needs it.
#[derive(Debug, Clone)]
struct Post {
    call: Arc<Call>,
    operand: Option<TensorType>,
    data: Option<Arc<Literal>>,
}

/// All devices' posts of one completed round, indexed by device id.
type Round = Arc<Vec<Post>>;

/// Checks that every device of `round` is at `call`.
fn check_calls(round: &[Post], call: &Call) -> Result<(), String> {
    match round.iter().enumerate().find(|(_, p)| *p.call != *call) {
        Some((other, post)) => Err(format!(
            "devices disagree on the collective: device {other} is at {}",
            post.call
        )),
        None => Ok(()),
    }
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
    pub(crate) fn new(num_devices: usize) -> Self {
        Rendezvous {
            num_devices,
            state: Mutex::new(RendezvousState {
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

    /// Posts `post` for `device`, waits until every device has posted, and returns all
    /// posts of the round; or an [`Error::Aborted`] once the rendezvous is aborted.
    fn exchange(&self, device: usize, post: Post) -> Result<Round> {
        let mut state = self.lock();
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
        let mut state = self
            .round_done
            .wait_while(state, |s| s.round == my_round && s.abort.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        if state.round == my_round {
            let cause = state.abort.as_ref().map_or_else(
                || Error::ThreadMesh("rendezvous woke without a result".into()),
                |cause| aborted(device, cause),
            );
            return Err(cause);
        }
        state.uncollected -= 1;
        let round = if state.uncollected == 0 {
            state.completed.take()
        } else {
            state.completed.clone()
        };
        round.ok_or_else(|| Error::ThreadMesh("completed round already collected".into()))
    }

    /// Records `error` as the cause of the abort (unless one is recorded) and wakes every
    /// waiting device.
    pub(crate) fn abort(&self, error: Error) {
        let mut state = self.lock();
        if state.abort.is_none() {
            state.abort = Some(error);
        }
        self.round_done.notify_all();
    }

    /// Returns the abort's cause, if any, and makes the rendezvous usable again. Only
    /// valid while no device is inside a collective.
    pub(crate) fn reset(&self) -> Option<Error> {
        let mut state = self.lock();
        state.pending.iter_mut().for_each(|p| *p = None);
        state.arrived = 0;
        state.completed = None;
        state.uncollected = 0;
        state.abort.take()
    }
}

fn aborted(device: usize, cause: &Error) -> Error {
    Error::Aborted {
        device,
        cause: Box::new(cause.clone()),
    }
}

// ---- the shared-memory communicator --------------------------------------------------

/// A [`Communicator`] for devices that are threads of one process: collectives exchange
/// `Arc`s of the operands through a [`Rendezvous`] shared by all devices, and each
/// member reads only the parts of the others' buffers it needs.
#[derive(Debug, Clone)]
pub(crate) struct SharedMemoryCommunicator {
    device: usize,
    mesh: Arc<Mesh>,
    rendezvous: Arc<Rendezvous>,
}

impl SharedMemoryCommunicator {
    pub(crate) fn new(device: usize, mesh: Arc<Mesh>, rendezvous: Arc<Rendezvous>) -> Self {
        SharedMemoryCommunicator {
            device,
            mesh,
            rendezvous,
        }
    }

    /// Aborts the communicator with `result`'s error, unless that error is itself the
    /// consequence of an abort.
    fn abort_on_error<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(error) = &result
            && !matches!(error, Error::Aborted { .. })
        {
            self.rendezvous.abort(error.clone());
        }
        result
    }

    /// Runs collective `op` over `axes` on `x`: resolves the group, runs `check` on `x`'s
    /// shape, meets every device, checks that all are at the same collective and that
    /// the group's operands agree in shape and dtype, then computes the result with
    /// `compute`. A group of one needs no data: every collective but collective_permute
    /// is then the identity. Any error aborts the communicator.
    fn collective(
        &self,
        op: Collective,
        axes: &[String],
        x: Literal,
        check: impl FnOnce(&Group, &[usize]) -> Result<(), String>,
        compute: impl FnOnce(&Self, Exchange) -> Result<Literal>,
    ) -> Result<Literal> {
        let identity_when_alone = !matches!(op, Collective::CollectivePermute { .. });
        let call = Arc::new(Call::Collective {
            op,
            axes: axes.to_vec(),
        });
        let result = self.start(call, x, check).and_then(|ex| {
            if ex.group.size() == 1 && identity_when_alone {
                Ok(Arc::unwrap_or_clone(ex.mine))
            } else {
                compute(self, ex)
            }
        });
        self.abort_on_error(result)
    }

    fn start(
        &self,
        call: Arc<Call>,
        x: Literal,
        check: impl FnOnce(&Group, &[usize]) -> Result<(), String>,
    ) -> Result<Exchange> {
        let fail = |message: String| Error::Collective {
            device: self.device,
            collective: call.to_string(),
            message,
        };
        let axes = match &*call {
            Call::Collective { axes, .. } => axes.as_slice(),
            Call::End => &[],
        };
        let group = Group::of(&self.mesh, self.device, axes).map_err(fail)?;
        let operand = literal_type(&x);
        check(&group, &operand.shape).map_err(fail)?;
        let mine = Arc::new(x);
        let post = Post {
            call: Arc::clone(&call),
            operand: Some(operand.clone()),
            data: (group.size() > 1).then(|| Arc::clone(&mine)),
        };
        let round = self.rendezvous.exchange(self.device, post)?;
        check_calls(&round, &call).map_err(fail)?;
        for &member in &group.members {
            if let Some(theirs) = round[member].operand.as_ref().filter(|t| **t != operand) {
                return Err(fail(format!(
                    "operands differ across the group: device {} has {operand}, device {member} has {theirs}",
                    self.device
                )));
            }
        }
        Ok(Exchange {
            device: self.device,
            call,
            group,
            mine,
            round,
        })
    }

    /// Meets every device at the end of their programs: an error if another device is
    /// still in a collective (it called one this device did not), which aborts.
    pub(crate) fn end_program(&self) -> Result<()> {
        let call = Arc::new(Call::End);
        let post = Post {
            call: Arc::clone(&call),
            operand: None,
            data: None,
        };
        let result = self
            .rendezvous
            .exchange(self.device, post)
            .and_then(|round| {
                check_calls(&round, &call).map_err(|message| Error::Collective {
                    device: self.device,
                    collective: call.to_string(),
                    message,
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
    group: Group,
    mine: Arc<Literal>,
    round: Round,
}

impl Exchange {
    fn fail(&self, message: String) -> Error {
        Error::Collective {
            device: self.device,
            collective: self.call.to_string(),
            message,
        }
    }

    /// The group members' operands as `T` arrays, in group order.
    fn operands<T: Element>(&self) -> Result<Vec<&ArrayD<T>>> {
        self.group
            .members
            .iter()
            .map(|&m| self.operand(m))
            .collect()
    }

    /// Device `member`'s operand as a `T` array.
    fn operand<T: Element>(&self, member: usize) -> Result<&ArrayD<T>> {
        self.round[member]
            .data
            .as_deref()
            .and_then(T::array)
            .ok_or_else(|| self.fail(format!("device {member} shared no {} operand", T::DTYPE)))
    }
}

fn literal_type(x: &Literal) -> TensorType {
    TensorType::new(x.shape(), x.dtype())
}

fn check_dim(shape: &[usize], dim: usize, what: &str) -> Result<(), String> {
    if dim < shape.len() {
        Ok(())
    } else {
        Err(format!(
            "{what} {dim} is out of range for an operand of rank {}",
            shape.len()
        ))
    }
}

fn check_divisible(group: &Group, shape: &[usize], dim: usize, what: &str) -> Result<(), String> {
    check_dim(shape, dim, what)?;
    if shape[dim] % group.size() == 0 {
        Ok(())
    } else {
        Err(format!(
            "{what} {dim} has size {} which the group size {} does not divide",
            shape[dim],
            group.size()
        ))
    }
}

/// Applies a generic function to the dtype of a literal: `by_dtype!(dtype, f(args))`
/// calls `f::<f32>`, `f::<i32>` or `f::<bool>`.
macro_rules! by_dtype {
    ($dtype:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::Bool => $f::<bool>($($arg),*),
        }
    };
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
        self.collective(
            Collective::AllReduce(kind),
            axes,
            x,
            |_, _| Ok(()),
            |comm, ex| by_dtype!(ex.mine.dtype(), all_reduce_typed(comm, ex, kind)),
        )
    }

    fn all_gather(&self, axes: &[String], dim: usize, x: Literal) -> Result<Literal> {
        self.collective(
            Collective::AllGather { dim },
            axes,
            x,
            |_, shape| check_dim(shape, dim, "dim"),
            |_, ex| by_dtype!(ex.mine.dtype(), all_gather_typed(ex, dim)),
        )
    }

    fn reduce_scatter(
        &self,
        axes: &[String],
        kind: ReduceKind,
        dim: usize,
        x: Literal,
    ) -> Result<Literal> {
        self.collective(
            Collective::ReduceScatter { kind, dim },
            axes,
            x,
            |group, shape| check_divisible(group, shape, dim, "dim"),
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
            Collective::AllToAll {
                split_dim,
                concat_dim,
            },
            axes,
            x,
            |group, shape| {
                check_divisible(group, shape, split_dim, "split_dim")?;
                check_dim(shape, concat_dim, "concat_dim")
            },
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
            Collective::CollectivePermute {
                pairs: pairs.to_vec(),
            },
            axes,
            x,
            |group, _| check_pairs(group, pairs),
            |_, ex| by_dtype!(ex.mine.dtype(), collective_permute_typed(ex, pairs)),
        )
    }

    fn abort(&self, error: Error) {
        self.rendezvous.abort(error);
    }
}

fn check_pairs(group: &Group, pairs: &[(usize, usize)]) -> Result<(), String> {
    for (i, &(source, target)) in pairs.iter().enumerate() {
        if source >= group.size() || target >= group.size() {
            return Err(format!(
                "pair ({source}, {target}) names a group index beyond the group size {}",
                group.size()
            ));
        }
        if pairs[..i].iter().any(|&(s, _)| s == source) {
            return Err(format!("source {source} appears in two pairs"));
        }
        if pairs[..i].iter().any(|&(_, t)| t == target) {
            return Err(format!("target {target} appears in two pairs"));
        }
    }
    Ok(())
}

// ---- typed kernels -------------------------------------------------------------------

/// The element types of [`Literal`], with their reductions.
trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn array(x: &Literal) -> Option<&ArrayD<Self>>;
    fn array_mut(x: &mut Literal) -> Option<&mut ArrayD<Self>>;
    fn literal(a: ArrayD<Self>) -> Literal;
    fn sum(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
}

macro_rules! element {
    ($t:ty, $variant:ident, sum: $sum:expr, max: $max:expr, min: $min:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn array(x: &Literal) -> Option<&ArrayD<Self>> {
                match x {
                    Literal::$variant(a) => Some(a),
                    _ => None,
                }
            }
            fn array_mut(x: &mut Literal) -> Option<&mut ArrayD<Self>> {
                match x {
                    Literal::$variant(a) => Some(a),
                    _ => None,
                }
            }
            fn literal(a: ArrayD<Self>) -> Literal {
                Literal::$variant(a)
            }
            #[inline]
            fn sum(a: Self, b: Self) -> Self {
                $sum(a, b)
            }
            #[inline]
            fn max(a: Self, b: Self) -> Self {
                $max(a, b)
            }
            #[inline]
            fn min(a: Self, b: Self) -> Self {
                $min(a, b)
            }
        }
    };
}

element!(f32, F32, sum: |a: f32, b: f32| a + b, max: f32::max, min: f32::min);
element!(i32, I32, sum: i32::wrapping_add, max: Ord::max, min: Ord::min);
// As in XLA, adding predicates is a logical or.
element!(bool, Bool, sum: |a: bool, b: bool| a | b, max: |a: bool, b: bool| a | b, min: |a: bool, b: bool| a & b);

/// `acc = kind(acc, x)` elementwise; the match is outside the loop so each loop inlines
/// its combiner.
fn accumulate<T: Element>(kind: ReduceKind, acc: ArrayViewMutD<'_, T>, x: ArrayViewD<'_, T>) {
    let zip = Zip::from(acc).and(x);
    match kind {
        ReduceKind::Sum => zip.for_each(|a, &b| *a = T::sum(*a, b)),
        ReduceKind::Max => zip.for_each(|a, &b| *a = T::max(*a, b)),
        ReduceKind::Min => zip.for_each(|a, &b| *a = T::min(*a, b)),
    }
}

/// The elementwise `kind` reduction of same-shaped `blocks` (at least one).
fn reduce_blocks<T: Element>(kind: ReduceKind, blocks: &[ArrayViewD<'_, T>]) -> Option<ArrayD<T>> {
    let (first, rest) = blocks.split_first()?;
    let mut acc = first.to_owned();
    for block in rest {
        accumulate(kind, acc.view_mut(), block.view());
    }
    Some(acc)
}

/// Start of chunk `i` when `len` elements are cut in `n` chunks whose sizes differ by
/// at most one.
fn chunk_start(len: usize, n: usize, i: usize) -> usize {
    i * (len / n) + i.min(len % n)
}

fn standard_layout(x: Literal) -> Literal {
    fn standard<T: Clone>(a: ArrayD<T>) -> ArrayD<T> {
        if a.is_standard_layout() {
            a
        } else {
            a.as_standard_layout().into_owned()
        }
    }
    match x {
        Literal::F32(a) => Literal::F32(standard(a)),
        Literal::I32(a) => Literal::I32(standard(a)),
        Literal::Bool(a) => Literal::Bool(standard(a)),
    }
}

fn all_reduce_typed<T: Element>(
    comm: &SharedMemoryCommunicator,
    ex: Exchange,
    kind: ReduceKind,
) -> Result<Literal> {
    let n = ex.group.size();
    let len = ex.mine.shape().iter().product();
    let range = |i: usize| chunk_start(len, n, i)..chunk_start(len, n, i + 1);
    // Reduce-scatter: reduce my chunk of everyone's operand.
    let chunks: Vec<ArrayViewD<'_, T>> = ex
        .operands::<T>()?
        .into_iter()
        .map(|x| {
            x.as_slice()
                .map(|all| ndarray::aview1(&all[range(ex.group.index)]).into_dyn())
                .ok_or_else(|| ex.fail("an operand is not in standard layout".into()))
        })
        .collect::<Result<_>>()?;
    let reduced = reduce_blocks(kind, &chunks).ok_or_else(|| ex.fail("empty group".into()))?;
    drop(chunks);
    // All-gather the reduced chunks into my own operand's buffer, which nobody reads once
    // every device has let go of the first round.
    let Exchange {
        call,
        group,
        mine,
        round,
        ..
    } = ex;
    drop(round);
    let post = Post {
        call: Arc::clone(&call),
        operand: None,
        data: Some(Arc::new(T::literal(reduced))),
    };
    let round = comm.rendezvous.exchange(comm.device, post)?;
    let mut result = Arc::unwrap_or_clone(mine);
    let fail = |message: String| Error::Collective {
        device: comm.device,
        collective: call.to_string(),
        message,
    };
    let out = T::array_mut(&mut result)
        .and_then(|a| a.as_slice_mut())
        .ok_or_else(|| fail("own operand is not a standard-layout array".into()))?;
    for (i, &member) in group.members.iter().enumerate() {
        let chunk = round[member]
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

fn concatenate<T: Element>(
    ex: &Exchange,
    dim: usize,
    blocks: &[ArrayViewD<'_, T>],
) -> Result<Literal> {
    ndarray::concatenate(Axis(dim), blocks)
        .map(T::literal)
        .map_err(|e| ex.fail(format!("cannot concatenate along dim {dim}: {e}")))
}

/// Block `index` of `x` cut in `n` equal blocks along `dim` (which `n` divides).
fn block<T>(x: &ArrayD<T>, dim: usize, n: usize, index: usize) -> ArrayViewD<'_, T> {
    let size = x.shape()[dim] / n;
    x.slice_axis(Axis(dim), Slice::from(index * size..(index + 1) * size))
}

/// Block `ex.group.index` along `dim` of every member's operand, in group order.
fn my_blocks<T: Element>(ex: &Exchange, dim: usize) -> Result<Vec<ArrayViewD<'_, T>>> {
    let n = ex.group.size();
    Ok(ex
        .operands::<T>()?
        .into_iter()
        .map(|x| block(x, dim, n, ex.group.index))
        .collect())
}

fn reduce_scatter_typed<T: Element>(ex: Exchange, kind: ReduceKind, dim: usize) -> Result<Literal> {
    reduce_blocks(kind, &my_blocks::<T>(&ex, dim)?)
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
    match pairs.iter().find(|&&(_, target)| target == ex.group.index) {
        Some(&(source, _)) if source == ex.group.index => Ok(Arc::unwrap_or_clone(ex.mine)),
        Some(&(source, _)) => Ok(T::literal(
            ex.operand::<T>(ex.group.members[source])?.clone(),
        )),
        None => Ok(Literal::full(&ex.mine.shape(), T::DTYPE, 0.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes(names: &[&str]) -> Vec<String> {
        names.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn groups_follow_listed_axis_order() -> Result<()> {
        let mesh = Mesh::new([("data", 2), ("model", 4)])?;
        // Device 6 sits at (1, 2).
        let by_data = Group::of(&mesh, 6, &axes(&["data"])).map_err(Error::InvalidMesh)?;
        assert_eq!(
            by_data,
            Group {
                members: vec![2, 6],
                index: 1
            }
        );
        let model_data =
            Group::of(&mesh, 6, &axes(&["model", "data"])).map_err(Error::InvalidMesh)?;
        assert_eq!(
            model_data,
            Group {
                members: vec![0, 4, 1, 5, 2, 6, 3, 7],
                index: 5
            }
        );
        let none = Group::of(&mesh, 6, &[]).map_err(Error::InvalidMesh)?;
        assert_eq!(
            none,
            Group {
                members: vec![6],
                index: 0
            }
        );
        Ok(())
    }

    #[test]
    fn bad_axis_lists_are_rejected() -> Result<()> {
        let mesh = Mesh::new([("data", 2)])?;
        assert!(Group::of(&mesh, 0, &axes(&["model"])).is_err());
        assert!(Group::of(&mesh, 0, &axes(&["data", "data"])).is_err());
        Ok(())
    }

    #[test]
    fn chunks_cover_the_range() {
        for (len, n) in [(10, 3), (2, 4), (0, 2), (8, 8)] {
            let starts: Vec<usize> = (0..=n).map(|i| chunk_start(len, n, i)).collect();
            assert_eq!(starts[0], 0);
            assert_eq!(starts[n], len);
            assert!(
                starts
                    .windows(2)
                    .all(|w| w[1] - w[0] <= len / n + 1 && w[0] <= w[1])
            );
        }
    }
}
