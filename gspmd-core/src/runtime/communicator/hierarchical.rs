//! [`Hierarchy`]: a mesh spread over the ranks of an MPI job with several devices per
//! rank (rank `r` holds the `T` consecutive device ids from `r * T`, as threads), and
//! [`RankSteps`], the [`Process`] that runs a rank's steps across ranks over MPI.
//!
//! A rank's devices must be a *block* of the mesh: the devices sharing their coordinates
//! on the mesh's major digits. With the default device order, `T` is then the product of
//! the minor axes' sizes times a divisor of the next axis's size (`(data=2, model=4)` on
//! 2 ranks: `model` inside a rank; on 4 ranks: `model`'s minor 2 values inside a rank);
//! a permuted device order must keep each rank's devices such a block. The major digits
//! form the *rank mesh*, one device per rank, with the mesh's axis names. A collective
//! over axes `A` splits into the digits of `A` inside a rank (axes of the mesh) and those
//! across ranks (axes of the rank mesh); with none across, it stays on the threads.
//!
//! A step across ranks does what it can inside the rank, makes one MPI collective over
//! the rank mesh with the data of all the rank's devices, and hands each device its part:
//! - all-reduce: each group's members in the rank reduce first (the inner levels of the
//!   [`ReductionOrder`]: a rank holds whole subtrees of it), one all-reduce of the partial
//!   results of all of the rank's groups, then each device copies its group's;
//! - reduce-scatter: those partial results, their blocks reordered so that each rank's
//!   members' blocks lie together, one reduce-scatter;
//! - all-gather: one all-gather of every device's operand;
//! - all-to-all: one all-to-all of exactly the blocks each device of the other ranks
//!   needs from this rank's devices;
//! - collective permute: one all-to-all of, for each device of the rank group, the operand
//!   its source on this rank sends it (zeros where its source is elsewhere: `J` times the
//!   bytes moved over a rank group of `J`, acceptable for the halos and shifts permutes
//!   move).
//!
//! The reductions combine in the [`ReductionOrder`] of the whole group, so results are
//! bitwise those of a thread mesh of the same shape. A reduction whose digits a rank
//! would cut (an axis whose values inside a rank are not a product of its smallest prime
//! digits, e.g. 3 of an axis of 6) is an error. The rank-level collectives are
//! [`MpiCommunicator`]'s, each with its meeting of all ranks, whose record names the
//! devices' collective too.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn};

use super::call::{Call, CollectiveOp};
use super::combine::{Element, ReductionOrder, block, by_dtype, literal_type, reduce_blocks};
use super::group::Group;
use super::mpi::MpiCommunicator;
use super::uplink::{Process, Step};
use crate::error::{Error, MpiProblem, Result};
use crate::ir::{DType, Literal, ReduceKind};
use crate::sharding::{AxisPart, Mesh};

/// How a mesh's devices spread over the ranks of an MPI job, `T` consecutive device ids
/// per rank, each rank's devices a block of the mesh (see the module's docs).
#[derive(Debug)]
pub(crate) struct Hierarchy {
    mesh: Mesh,
    /// Devices per rank (`T`).
    threads: usize,
    /// Per mesh axis, how many of its values (its minor digits) lie inside a rank.
    inside: Vec<usize>,
    /// The ranks as a mesh: per mesh axis with values across ranks, an axis of that
    /// name and their count.
    ranks: Mesh,
    /// Per axis of `ranks`, the mesh axis it comes from.
    rank_axes: Vec<usize>,
    /// Per device, its position among its rank's devices (row-major over the digits
    /// inside a rank): the same on every rank for corresponding devices.
    positions: Vec<usize>,
    /// The device at each rank's position: `at[rank * T + position]`.
    at: Vec<usize>,
    /// The plans of this rank's steps, per axis list, made on first use.
    plans: RefCell<HashMap<Vec<String>, Rc<Plan>>>,
}

impl Hierarchy {
    /// `mesh` on `ranks` ranks (which divide its device count); an [`Error::MpiMesh`]
    /// unless each rank's devices are a block of the mesh.
    pub(crate) fn new(mesh: Mesh, ranks: usize) -> Result<Hierarchy> {
        let n = mesh.num_devices();
        let threads = n / ranks.max(1);
        let sizes: Vec<usize> = mesh.axes().iter().map(|a| a.1).collect();
        let mut inside = vec![1; sizes.len()];
        let mut remaining = threads;
        for (i, &size) in sizes.iter().enumerate().rev() {
            if remaining.is_multiple_of(size) {
                inside[i] = size;
                remaining /= size;
            } else if size.is_multiple_of(remaining) {
                inside[i] = remaining;
                remaining = 1;
            }
            if remaining == 1 || !size.is_multiple_of(inside[i]) {
                break;
            }
        }
        if remaining != 1 {
            return Err(not_a_block(
                format!(
                    "{ranks} ranks of {threads} devices cannot each hold a block of mesh {mesh}: \
                     the devices per rank must be the product of the minor axes' sizes times a \
                     divisor of the next axis's"
                ),
                n,
            ));
        }
        let rank_axes: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i] > inside[i]).collect();
        let across: Vec<(String, usize)> = (rank_axes.iter())
            .map(|&i| (mesh.axes()[i].0.clone(), sizes[i] / inside[i]))
            .collect();
        let mut rank_ids = vec![usize::MAX; ranks];
        let mut positions = vec![0; n];
        let mut at = vec![0; n];
        for (device, position_of) in positions.iter_mut().enumerate() {
            let coords = mesh.device_coords(device).unwrap_or_default();
            let rank_position = (rank_axes.iter()).fold(0, |p, &i| {
                p * (sizes[i] / inside[i]) + coords[i] / inside[i]
            });
            let position = (0..sizes.len()).fold(0, |p, i| p * inside[i] + coords[i] % inside[i]);
            let rank = device / threads;
            if rank_ids[rank_position] == usize::MAX {
                rank_ids[rank_position] = rank;
            } else if rank_ids[rank_position] != rank {
                return Err(not_a_block(
                    format!(
                        "the devices of rank {rank} ({}..{}) are not a block of mesh {mesh} (the \
                         devices sharing their coordinates on its major digits): reorder the \
                         mesh's devices",
                        rank * threads,
                        (rank + 1) * threads
                    ),
                    n,
                ));
            }
            *position_of = position;
            at[rank * threads + position] = device;
        }
        let ranks_mesh = if across.is_empty() {
            Mesh::new([("ranks", 1)])?
        } else {
            Mesh::with_device_order(across, rank_ids)?
        };
        Ok(Hierarchy {
            mesh,
            threads,
            inside,
            ranks: ranks_mesh,
            rank_axes,
            positions,
            at,
            plans: RefCell::new(HashMap::new()),
        })
    }

    /// The mesh.
    pub(crate) fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The ranks as a mesh (one device per rank).
    pub(crate) fn ranks(&self) -> &Mesh {
        &self.ranks
    }

    /// The devices of `rank`.
    pub(crate) fn devices(&self, rank: usize) -> Range<usize> {
        rank * self.threads..(rank + 1) * self.threads
    }

    fn rank_of(&self, device: usize) -> usize {
        device / self.threads
    }

    /// `rank`'s index in its group over `across` (axes of the rank mesh).
    fn rank_index(&self, rank: usize, across: &[String]) -> Result<usize> {
        self.ranks.group_index(rank, across)
    }

    /// `axes` (of the mesh) split into their digits across ranks (as axes of the rank
    /// mesh) and inside a rank (as axes of the mesh), each in the listed order.
    fn split(&self, axes: &[String]) -> Result<(Vec<String>, Vec<String>)> {
        let (mut across, mut local) = (Vec::new(), Vec::new());
        for name in axes {
            let uneven = || {
                let reason = format!(
                    "axis `{name}` of mesh {} is cut unevenly between ranks",
                    self.mesh
                );
                not_a_block(reason, self.mesh.num_devices())
            };
            let part = self.mesh.axis_part(name).ok_or_else(uneven)?;
            let size = self.mesh.axes()[part.axis].1;
            let stride = size / (part.pre * part.size);
            let end = stride * part.size;
            let inside = self.inside[part.axis];
            if stride < inside {
                if !inside.is_multiple_of(stride) || (end > inside && !end.is_multiple_of(inside)) {
                    return Err(uneven());
                }
                let count = end.min(inside) / stride;
                let pre = size / (stride * count);
                local.push(self.mesh.part_name(AxisPart {
                    axis: part.axis,
                    pre,
                    size: count,
                }));
            }
            if end > inside {
                let axis =
                    (self.rank_axes.iter().position(|&a| a == part.axis)).ok_or_else(uneven)?;
                let count = end / stride.max(inside);
                let pre = (size / inside) / (end / inside);
                across.push(self.ranks.part_name(AxisPart {
                    axis,
                    pre,
                    size: count,
                }));
            }
        }
        Ok((across, local))
    }

    /// The plan of a step over `axes` of the rank of `devices` (all of it), made once.
    fn plan(&self, axes: &[String], devices: &[usize]) -> Result<Rc<Plan>> {
        if let Some(plan) = self.plans.borrow().get(axes) {
            return Ok(Rc::clone(plan));
        }
        let plan = Rc::new(Plan::new(self, axes, devices)?);
        (self.plans.borrow_mut()).insert(axes.to_vec(), Rc::clone(&plan));
        Ok(plan)
    }
}

/// A rank's step over an axis list: the split of the axes, its devices' groups and the
/// groups' members inside the rank.
#[derive(Debug)]
struct Plan {
    /// The axes.
    axes: Vec<String>,
    /// Their digits across ranks (axes of the rank mesh).
    across: Vec<String>,
    /// Their digits inside a rank (axes of the mesh).
    local: Vec<String>,
    /// The rank and its index in its group over `across`.
    rank: usize,
    rank_index: usize,
    /// The size of a group over `across` (ranks) and over `local` (devices).
    ranks: usize,
    per_rank: usize,
    /// Per device (by slot: the rank's devices in id order), its group's members in
    /// group order and its index among them.
    members: Vec<Vec<usize>>,
    index: Vec<usize>,
    /// The groups inside the rank (the devices of a group in this rank), each as slots in
    /// group order over `local`, ordered by position; and each device's.
    classes: Vec<Vec<usize>>,
    class_of: Vec<usize>,
    /// The order of a reduction inside the rank (over `local`).
    inner: ReductionOrder,
}

impl Plan {
    fn new(hierarchy: &Hierarchy, axes: &[String], devices: &[usize]) -> Result<Plan> {
        let mesh = &hierarchy.mesh;
        let (across, local) = hierarchy.split(axes)?;
        let rank = hierarchy.rank_of(devices[0]);
        let groups = (devices.iter())
            .map(|&d| Group::of(mesh, d, axes))
            .collect::<Result<Vec<Group>>>()?;
        let locals = (devices.iter())
            .map(|&d| Group::of(mesh, d, &local))
            .collect::<Result<Vec<Group>>>()?;
        let slot = |d: usize| d - devices[0];
        let mut firsts: Vec<(usize, usize)> = (locals.iter().enumerate())
            .filter(|(_, g)| g.index == 0)
            .map(|(s, g)| (hierarchy.positions[g.members[0]], s))
            .collect();
        firsts.sort_unstable();
        let classes: Vec<Vec<usize>> = (firsts.iter())
            .map(|&(_, s)| locals[s].members.iter().map(|&m| slot(m)).collect())
            .collect();
        let mut class_of = vec![0; devices.len()];
        for (c, class) in classes.iter().enumerate() {
            class.iter().for_each(|&s| class_of[s] = c);
        }
        // The whole group's order must be the rank's levels, then the ranks'.
        let whole = ReductionOrder::of(mesh, axes, &groups[0])?;
        let inner = ReductionOrder::of(mesh, &local, &locals[0])?;
        let outer_group = Group::of(&hierarchy.ranks, rank, &across)?;
        let outer = ReductionOrder::of(&hierarchy.ranks, &across, &outer_group)?;
        let digits = |order: &ReductionOrder| -> Vec<usize> {
            order.levels.iter().copied().filter(|&d| d > 1).collect()
        };
        if digits(&whole) != [digits(&inner), digits(&outer)].concat() {
            let reason = format!(
                "a reduction over {axes:?} on mesh {mesh} has digits {:?}, which ranks of {} \
                 devices cut: inside a rank {:?}, across ranks {:?}",
                digits(&whole),
                hierarchy.threads,
                digits(&inner),
                digits(&outer)
            );
            return Err(not_a_block(reason, mesh.num_devices()));
        }
        Ok(Plan {
            rank_index: hierarchy.rank_index(rank, &across)?,
            ranks: outer_group.size(),
            per_rank: locals[0].size(),
            index: groups.iter().map(|g| g.index).collect(),
            members: groups.into_iter().map(|g| g.members).collect(),
            axes: axes.to_vec(),
            across,
            local,
            rank,
            classes,
            class_of,
            inner,
        })
    }
}

/// A rank's steps across ranks, over MPI: a [`Process`] for its threads.
pub(crate) struct RankSteps<'a> {
    pub(crate) hierarchy: &'a Hierarchy,
    pub(crate) comm: &'a MpiCommunicator,
}

impl Process for RankSteps<'_> {
    fn step(&mut self, step: &Step<'_>) -> Result<Vec<Literal>> {
        let (op, axes) = match step.call {
            Call::Collective { op, axes } => (op, axes),
            Call::End => {
                return self
                    .comm
                    .meet("the end of its program")
                    .map(|()| Vec::new());
            }
            Call::Process => return Err(internal("a device posted no step".into())),
        };
        let first = step
            .operands
            .first()
            .ok_or_else(|| internal(format!("{}: the devices posted no operands", step.call)))?;
        let plan = self.hierarchy.plan(axes, step.devices)?;
        let place = format!("{} of {}", step.call, literal_type(first));
        let dtype = first.dtype();
        let run = Run {
            hierarchy: self.hierarchy,
            comm: self.comm,
            plan: &plan,
            place: &place,
            operands: &step.operands,
        };
        match op {
            CollectiveOp::AllReduce(kind) => run.reduction(*kind, None),
            CollectiveOp::ReduceScatter { kind, dim } => run.reduction(*kind, Some(*dim)),
            CollectiveOp::AllGather { dim } => by_dtype!(dtype, all_gather(&run, *dim)),
            CollectiveOp::AllToAll {
                split_dim,
                concat_dim,
            } => by_dtype!(dtype, all_to_all(&run, *split_dim, *concat_dim)),
            CollectiveOp::CollectivePermute { pairs } => {
                by_dtype!(dtype, collective_permute(&run, pairs))
            }
        }
    }

    fn fail(&mut self, error: &Error) {
        self.comm.fail(error);
    }
}

/// One step in progress: the rank's devices' operands (by slot) and the plan.
struct Run<'a> {
    hierarchy: &'a Hierarchy,
    comm: &'a MpiCommunicator,
    plan: &'a Plan,
    place: &'a str,
    operands: &'a [&'a Literal],
}

impl Run<'_> {
    /// The rank-level collective `op` over the plan's axes across ranks on `x`.
    fn across(&self, op: CollectiveOp, x: Literal) -> Result<Literal> {
        (self.comm).collective(Some(self.place), op, &self.plan.across, x)
    }

    /// `rows` stacked (one shape), the rank at index `j` of this rank's group sent its
    /// `j`-th equal share of them: what the others' sent this rank, stacked likewise.
    fn to_ranks<T: Element>(&self, rows: &[ArrayViewD<'_, T>]) -> Result<Literal> {
        let op = CollectiveOp::AllToAll {
            split_dim: 0,
            concat_dim: 0,
        };
        self.across(op, stack(rows)?)
    }

    /// The device at `position` of the rank at index `j` of this rank's group.
    fn device_at(&self, j: usize, position: usize) -> Result<usize> {
        let rank = (self.hierarchy.ranks).group_member(self.plan.rank, &self.plan.across, j)?;
        Ok(self.hierarchy.at[rank * self.hierarchy.threads + position])
    }

    /// The index in this rank's group over the axes across ranks of `device`'s rank.
    fn rank_index(&self, device: usize) -> Result<usize> {
        let rank = self.hierarchy.rank_of(device);
        self.hierarchy.rank_index(rank, &self.plan.across)
    }

    /// The slots in position order.
    fn by_position(&self) -> Vec<usize> {
        let first = self.plan.rank * self.hierarchy.threads;
        (0..self.hierarchy.threads)
            .map(|p| self.hierarchy.at[first + p] - first)
            .collect()
    }

    /// All-reduce (`dim` `None`) or reduce-scatter along `dim`: the groups' partial
    /// results inside the rank (in f32 for narrow floats, rounded once at the end), one
    /// rank-level collective of them all, each device's part.
    fn reduction(&self, kind: ReduceKind, dim: Option<usize>) -> Result<Vec<Literal>> {
        let dtype = self.operands[0].dtype();
        let wide: Vec<Literal>;
        let operands: Vec<&Literal> = if dtype.is_narrow_float() {
            wide = (self.operands.iter())
                .map(|x| x.convert(DType::F32))
                .collect();
            wide.iter().collect()
        } else {
            self.operands.to_vec()
        };
        let results = by_dtype!(
            operands[0].dtype(),
            reduction(self, &operands, kind, dim),
            narrow => Err(internal("narrow floats reduce in f32".into()))
        )?;
        Ok(if dtype.is_narrow_float() {
            results.iter().map(|r| r.convert(dtype)).collect()
        } else {
            results
        })
    }
}

/// The typed arrays of `operands`.
fn arrays<'a, T: Element>(operands: &[&'a Literal]) -> Result<Vec<&'a ArrayD<T>>> {
    (operands.iter())
        .map(|x| T::array(x).ok_or_else(|| internal(format!("an operand is not {}", T::DTYPE))))
        .collect()
}

/// `views` stacked along a new first axis.
fn stack<T: Element>(views: &[ArrayViewD<'_, T>]) -> Result<Literal> {
    ndarray::stack(Axis(0), views)
        .map(T::literal)
        .map_err(|e| internal(format!("stacking the rank's operands: {e}")))
}

/// `views` concatenated along `dim`.
fn concatenate<T: Element>(dim: usize, views: &[ArrayViewD<'_, T>]) -> Result<Literal> {
    ndarray::concatenate(Axis(dim), views)
        .map(T::literal)
        .map_err(|e| internal(format!("cannot concatenate along dim {dim}: {e}")))
}

/// The typed array of a rank-level result.
fn array<T: Element>(x: &Literal) -> Result<&ArrayD<T>> {
    T::array(x).ok_or_else(|| internal(format!("a rank-level result is not {}", T::DTYPE)))
}

fn reduction<T: Element>(
    run: &Run<'_>,
    operands: &[&Literal],
    kind: ReduceKind,
    dim: Option<usize>,
) -> Result<Vec<Literal>> {
    let plan = run.plan;
    let xs = arrays::<T>(operands)?;
    let partials = (plan.classes.iter())
        .map(|class| {
            let views: Vec<ArrayViewD<'_, T>> = class.iter().map(|&s| xs[s].view()).collect();
            reduce_blocks(kind, &plan.inner, &views)
                .ok_or_else(|| internal("an empty group inside a rank".into()))
        })
        .collect::<Result<Vec<ArrayD<T>>>>()?;
    let Some(dim) = dim else {
        let views: Vec<ArrayViewD<'_, T>> = partials.iter().map(|p| p.view()).collect();
        let reduced = run.across(CollectiveOp::AllReduce(kind), stack(&views)?)?;
        let reduced = array::<T>(&reduced)?;
        return (plan.class_of.iter())
            .map(|&c| Ok(T::literal(reduced.index_axis(Axis(0), c).to_owned())))
            .collect();
    };
    // Blocks along `dim` in the order of the ranks holding their members, so that each
    // rank's lie together (a rank then gets its members' blocks in group order).
    let n = plan.members[0].len();
    let mut order: Vec<(usize, usize)> = (0..n)
        .map(|i| Ok((run.rank_index(plan.members[0][i])?, i)))
        .collect::<Result<_>>()?;
    order.sort_unstable();
    let partials = if order.iter().enumerate().all(|(k, &(_, i))| k == i) {
        partials
    } else {
        (partials.iter())
            .map(|p| {
                let blocks: Vec<ArrayViewD<'_, T>> =
                    order.iter().map(|&(_, i)| block(p, dim, n, i)).collect();
                ndarray::concatenate(Axis(dim), &blocks)
                    .map_err(|e| internal(format!("reordering blocks: {e}")))
            })
            .collect::<Result<Vec<ArrayD<T>>>>()?
    };
    let views: Vec<ArrayViewD<'_, T>> = partials.iter().map(|p| p.view()).collect();
    let op = CollectiveOp::ReduceScatter { kind, dim: dim + 1 };
    let scattered = run.across(op, stack(&views)?)?;
    let scattered = array::<T>(&scattered)?;
    let mine: Vec<usize> = (order.iter())
        .filter(|&&(j, _)| j == plan.rank_index)
        .map(|&(_, i)| i)
        .collect();
    (0..plan.class_of.len())
        .map(|s| {
            let k = (mine.iter().position(|&i| i == plan.index[s]))
                .ok_or_else(|| internal("a member's block went to another rank".into()))?;
            let row = scattered.index_axis(Axis(0), plan.class_of[s]);
            Ok(T::literal(block(&row, dim, mine.len(), k).to_owned()))
        })
        .collect()
}

fn all_gather<T: Element>(run: &Run<'_>, dim: usize) -> Result<Vec<Literal>> {
    let (plan, threads) = (run.plan, run.hierarchy.threads);
    let xs = arrays::<T>(run.operands)?;
    let by_position: Vec<ArrayViewD<'_, T>> =
        run.by_position().iter().map(|&s| xs[s].view()).collect();
    let gathered = run.across(CollectiveOp::AllGather { dim: 0 }, stack(&by_position)?)?;
    let gathered = array::<T>(&gathered)?;
    let mut per_class: Vec<Option<Literal>> = vec![None; plan.classes.len()];
    (0..plan.class_of.len())
        .map(|s| {
            let c = plan.class_of[s];
            if let Some(done) = &per_class[c] {
                return Ok(done.clone());
            }
            let views = (plan.members[s].iter())
                .map(|&m| {
                    let row = run.rank_index(m)? * threads + run.hierarchy.positions[m];
                    Ok(gathered.index_axis(Axis(0), row))
                })
                .collect::<Result<Vec<_>>>()?;
            let result = concatenate(dim, &views)?;
            per_class[c] = Some(result.clone());
            Ok(result)
        })
        .collect()
}

fn all_to_all<T: Element>(
    run: &Run<'_>,
    split_dim: usize,
    concat_dim: usize,
) -> Result<Vec<Literal>> {
    let (plan, hierarchy) = (run.plan, run.hierarchy);
    let (threads, n) = (hierarchy.threads, plan.members[0].len());
    let xs = arrays::<T>(run.operands)?;
    let first = plan.rank * threads;
    // For each rank of the group, each of its positions, each member there of the group
    // inside this rank: the block that device needs.
    let mut sent: Vec<ArrayViewD<'_, T>> = Vec::with_capacity(plan.ranks * threads * plan.per_rank);
    for j in 0..plan.ranks {
        for position in 0..threads {
            let target = run.device_at(j, position)?;
            let index = hierarchy.mesh.group_index(target, &plan.axes)?;
            let here = hierarchy.at[first + position] - first;
            for &s in &plan.classes[plan.class_of[here]] {
                sent.push(block(xs[s], split_dim, n, index));
            }
        }
    }
    let received = run.to_ranks(&sent)?;
    let received = array::<T>(&received)?;
    (0..plan.class_of.len())
        .map(|s| {
            let position = hierarchy.positions[first + s];
            let views = (plan.members[s].iter())
                .map(|&m| {
                    let l = hierarchy.mesh.group_index(m, &plan.local)?;
                    let row = (run.rank_index(m)? * threads + position) * plan.per_rank + l;
                    Ok(received.index_axis(Axis(0), row))
                })
                .collect::<Result<Vec<_>>>()?;
            concatenate(concat_dim, &views)
        })
        .collect()
}

fn collective_permute<T: Element>(run: &Run<'_>, pairs: &[(usize, usize)]) -> Result<Vec<Literal>> {
    let (plan, hierarchy) = (run.plan, run.hierarchy);
    let threads = hierarchy.threads;
    let xs = arrays::<T>(run.operands)?;
    let shape = xs[0].shape().to_vec();
    let zeros = ArrayD::from_elem(IxDyn(&shape), T::default());
    let first = plan.rank * threads;
    let source_of = |target: usize| pairs.iter().find(|p| p.1 == target).map(|p| p.0);
    let mut sent: Vec<ArrayViewD<'_, T>> = Vec::with_capacity(plan.ranks * threads);
    for j in 0..plan.ranks {
        for position in 0..threads {
            let target = run.device_at(j, position)?;
            let source = match source_of(hierarchy.mesh.group_index(target, &plan.axes)?) {
                Some(i) => Some(hierarchy.mesh.group_member(target, &plan.axes, i)?),
                None => None,
            };
            sent.push(
                match source.filter(|&d| hierarchy.rank_of(d) == plan.rank) {
                    Some(d) => xs[d - first].view(),
                    None => zeros.view(),
                },
            );
        }
    }
    let received = run.to_ranks(&sent)?;
    let received = array::<T>(&received)?;
    (0..plan.class_of.len())
        .map(|s| match source_of(plan.index[s]) {
            None => Ok(T::literal(zeros.clone())),
            Some(i) => {
                let source = plan.members[s][i];
                let row = run.rank_index(source)? * threads + hierarchy.positions[first + s];
                Ok(T::literal(received.index_axis(Axis(0), row).to_owned()))
            }
        })
        .collect()
}

/// An [`Error::MpiMesh`] saying that ranks cannot hold blocks of the mesh of `devices`
/// devices: `reason`.
fn not_a_block(reason: String, devices: usize) -> Error {
    Error::MpiMesh {
        problem: MpiProblem::NotABlock { reason, devices },
    }
}

/// An [`Error::MpiMesh`] for a broken invariant of the rank's bookkeeping.
fn internal(reason: String) -> Error {
    Error::MpiMesh {
        problem: MpiProblem::Internal { reason },
    }
}
