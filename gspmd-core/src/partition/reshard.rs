//! `reshard`: moves a [`PValue`] from its sharding to another, composing
//! `reduce_scatter`/`all_reduce` (pending partial sums), `dynamic_slice` (free),
//! `all_to_all`, `collective_permute` and `all_gather`, and choosing the composition
//! that receives the fewest bytes per device.
//!
//! Planning is a shortest-path search over *tilings* (per dim, a list of mesh axes).
//! Its moves are:
//! - slice: append axes to a dim; each device keeps its sub-block; free;
//! - gather: drop a dim's trailing axes; receives `(k - 1)` local sizes;
//! - all-to-all: move a dim's trailing axes (one or several, one collective over all
//!   of them), or the minor part of its last axis (a [sub-axis](Mesh::sub_axis), when
//!   the target splits another dim over that axis), to the end of another dim;
//!   receives `(k - 1)/k` of the local size;
//! - permute: deal the same blocks to other devices (same shard count per dim);
//!   receives one local size, nothing when every device's source is itself (the two
//!   axis orders agree up to axes of size 1; then nothing is emitted);
//! - axis move: split a dim over the target's axes for it instead of its own, when each
//!   new block lies inside one old block: a free local slice, then one permute over
//!   [sub-axes](Mesh::sub_axis) ([`AxisMove`]); receives one new local size.
//!
//! Among plans receiving equally many bytes the one with the fewest collectives wins.
//! States may hold sub-axes; adjacent parts of one axis are merged ([`normalize`]), and
//! permutes go to the target cut into the parts a state holds, so `(data, model) ->
//! (model, data)` is an all-to-all over `model:(2)2` and one permute (XLA's plan).
//!
//! With uneven dims (shards rounded up) a move is only taken when every device's new
//! block is inside what it holds or receives; the search routes around the others
//! (gathering a dim whole is always possible, and so is slicing an unsplit dim).
//! The search only depends on the number of axes and dims, never on device count.
//!
//! Device orders ([`DimSharding::reversed`]) are moved apart from tilings: between
//! two shardings that tile alike and differ only in order, one mirrored collective
//! shift over the axes of the dims whose order differs (every device receives one
//! local block); otherwise the value is mirrored into mesh order first and into the
//! target's order last (each when it has a reversed dim).

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use super::emit::Emitter;
use super::report::permute_moves_data;
use super::value::PValue;
use crate::error::Result;
use crate::ir::{CompareOp, DType, Op, ReduceKind, ValueId};
use crate::sharding::{AxisPart, DimSharding, Mesh, Sharding, cut_at};

/// A plan's cost (elements received per device), totally ordered for the search's
/// frontier.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Cost(f64);

impl Eq for Cost {}

impl PartialOrd for Cost {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Cost {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Per dim, the mesh axes it is split over.
type Tiling = Vec<Vec<String>>;

/// One step of a resharding plan.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Slice {
        dim: usize,
        axes: Vec<String>,
    },
    /// Gathers dim `dim` over `axes` (its trailing axes, or the minor part of its last
    /// axis), leaving it split over `rest`.
    Gather {
        dim: usize,
        axes: Vec<String>,
        rest: Vec<String>,
    },
    /// Moves the trailing `axes` of dim `from` to the end of dim `to` (one all-to-all
    /// over all of them), leaving `from` split over `rest` (its other axes, and the
    /// major part of its last axis when `axes` is that axis's minor part).
    AllToAll {
        from: usize,
        to: usize,
        axes: Vec<String>,
        rest: Vec<String>,
    },
    Permute {
        to: Tiling,
    },
    /// Splits dim `dim` over `to` instead of its axes: a free local slice, then one
    /// collective-permute ([`AxisMove`]).
    MoveAxes {
        dim: usize,
        to: Vec<String>,
    },
}

/// Moving dim `d` of tiling `s` from its axes `A` (`n` shards) to axes `u` (`n * r`
/// shards, each new block inside one old block, `u` used by no other dim): `u` read as
/// mixed-radix digits is a major part `P` (`n` shards, cutting an axis into
/// [sub-axes](Mesh::sub_axis) where needed) and a minor part `Q` (`r`). Every device
/// first keeps sub-block `Q`-index of its old block (free), then receives it from the
/// device whose `A`-index is its `P`-index and whose `Q`-index is its own: a
/// collective-permute with receivers over `P ++ Q ++ (A \ P)` and senders over
/// `A ++ Q ++ (P \ A)`. `(data) -> (model)` with data=2, model=4: keep the half of
/// the rows given by model's minor digit, then swap data and model's major digit.
#[derive(Debug, Clone, PartialEq)]
struct AxisMove {
    /// `Q`: the (sub-)axes each device slices its old block over first.
    minor: Vec<String>,
    /// The receivers' group order.
    receivers: Vec<String>,
    /// The senders' order (the same (sub-)axes).
    senders: Vec<String>,
}

impl AxisMove {
    /// The move of dim `d` of `s` to `u` on `mesh` for a value of `shape`, if `u` is a
    /// new set of axes whose blocks each lie inside one old block and whose minor part
    /// uses no axis of the old ones.
    fn plan(mesh: &Mesh, shape: &[usize], s: &Tiling, d: usize, u: &[String]) -> Option<Self> {
        let a = &s[d];
        let others_use = |x: &String| {
            (s.iter().enumerate()).any(|(j, t)| j != d && t.iter().any(|y| overlap(mesh, x, y)))
        };
        let whole = a.iter().all(|x| is_whole(mesh, x));
        if !whole || a.is_empty() || a.as_slice() == u || u.iter().any(others_use) {
            return None;
        }
        let (n, total) = (mesh.axes_size(a), mesh.axes_size(u));
        if !total.is_multiple_of(n) {
            return None;
        }
        let r = total / n;
        let mut t = s.clone();
        t[d] = u.to_vec();
        if chunk(shape, s, d, mesh) != r * chunk(shape, &t, d, mesh) {
            return None;
        }
        // Cut `u` after its digits of product `n`.
        let (mut major, mut minor) = (Vec::new(), Vec::new());
        let mut prefix = 1;
        for axis in u {
            let size = mesh.axes_size(std::slice::from_ref(axis));
            if prefix == n {
                minor.push(axis.clone());
            } else if n.is_multiple_of(prefix * size) {
                major.push(axis.clone());
                prefix *= size;
            } else if (n / prefix) > 1
                && n.is_multiple_of(prefix)
                && size.is_multiple_of(n / prefix)
            {
                let (p, q) = mesh.axis_part(axis)?.split(n / prefix);
                major.push(mesh.part_name(p));
                minor.push(mesh.part_name(q));
                prefix = n;
            } else {
                return None;
            }
        }
        if minor.iter().any(|q| a.iter().any(|x| overlap(mesh, q, x))) {
            return None;
        }
        let a_not_p = digits_minus(mesh, a, &major)?;
        let p_not_a = digits_minus(mesh, &major, a)?;
        Some(AxisMove {
            receivers: [major, minor.clone(), a_not_p].concat(),
            senders: [a.clone(), minor.clone(), p_not_a].concat(),
            minor,
        })
    }
}

/// Chunk (padded local length) of dim `d` under `t`.
fn chunk(shape: &[usize], t: &Tiling, d: usize, mesh: &Mesh) -> usize {
    shape[d].div_ceil(mesh.axes_size(&t[d]))
}

fn local_elems(shape: &[usize], t: &Tiling, mesh: &Mesh) -> f64 {
    (0..shape.len())
        .map(|d| chunk(shape, t, d, mesh) as f64)
        .product()
}

/// True if slicing dim `d` (currently `n` shards of `c`) by `k` more keeps every new
/// block inside the old one.
fn slice_is_local(n: usize, c: usize, k: usize, c_new: usize) -> bool {
    n == 1 || c == k * c_new
}

/// True if gathering `k` blocks of `c` along a dim gives exactly the new blocks
/// (`n_new` shards of `c_new`), possibly after trimming the padding of a whole dim.
fn gather_is_exact(n_new: usize, c: usize, k: usize, c_new: usize) -> bool {
    n_new == 1 || k * c == c_new
}

/// True if `name` is a whole mesh axis (not a sub-axis).
fn is_whole(mesh: &Mesh, name: &str) -> bool {
    mesh.axis_index(name).is_some()
}

/// True if the (sub-)axes `x` and `y` share a digit of one mesh axis
/// ([`AxisPart::overlaps`]).
fn overlap(mesh: &Mesh, x: &str, y: &str) -> bool {
    match (mesh.axis_part(x), mesh.axis_part(y)) {
        (Some(p), Some(q)) => p.overlaps(&q),
        _ => x == y,
    }
}

/// The (sub-)axes of `x` whose digits no axis of `y` has: each axis of `x` is dropped
/// when `y` holds it whole, inside one axis or cut in parts, and kept when `y` shares
/// none of its digits. `None` when `y` holds only some of an axis's digits.
fn digits_minus(mesh: &Mesh, x: &[String], y: &[String]) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for a in x {
        let p = mesh.axis_part(a)?;
        let shared: Vec<AxisPart> = (y.iter())
            .filter_map(|b| mesh.axis_part(b))
            .filter(|q| q.overlaps(&p))
            .collect();
        let covered = shared.iter().any(|q| q.contains(&p))
            || (shared.iter().all(|q| p.contains(q))
                && shared.iter().map(|q| q.size).product::<usize>() == p.size);
        if shared.is_empty() {
            out.push(a.clone());
        } else if !covered {
            return None;
        }
    }
    Some(out)
}

/// Every cut of `dim` before its trailing axes: `(trailing axes, the others)`, one
/// trailing axis first.
fn trailing_cuts(dim: &[String]) -> Vec<(Vec<String>, Vec<String>)> {
    (0..dim.len())
        .rev()
        .map(|cut| (dim[cut..].to_vec(), dim[..cut].to_vec()))
        .collect()
}

/// Every cut of `last`, the last (sub-)axis of `dim`, into a major and a minor part:
/// `([minor], dim with `last` replaced by major)`, for each proper divisor.
fn minor_cuts(mesh: &Mesh, dim: &[String], last: AxisPart) -> Vec<(Vec<String>, Vec<String>)> {
    (2..last.size)
        .filter(|k| last.size.is_multiple_of(*k))
        .map(|k| {
            let (major, minor) = last.split(last.size / k);
            let mut rest = dim[..dim.len() - 1].to_vec();
            rest.push(mesh.part_name(major));
            (vec![mesh.part_name(minor)], rest)
        })
        .collect()
}

/// `t` with each dim's axes in canonical form ([`Mesh::canonical_axes`]: adjacent parts
/// of one axis merged) and axes of size 1 left out (a dim split one way is whole), so a
/// tiling has one name: the planner's states and the target compare equal however their
/// parts were made, and a reshard between shardings that differ only in axes of size 1
/// moves nothing.
fn normalize(mesh: &Mesh, t: Tiling) -> Tiling {
    t.iter()
        .map(|d| {
            let split: Vec<&String> = d.iter().filter(|a| mesh.axes_size(&[a]) > 1).collect();
            mesh.canonical_axes(&split)
        })
        .collect()
}

/// The tiling of sharding `s`, normalized.
fn tiling_of(mesh: &Mesh, s: &Sharding) -> Tiling {
    normalize(mesh, s.dims.iter().map(|d| d.axes.clone()).collect())
}

struct Planner<'a> {
    mesh: &'a Mesh,
    shape: &'a [usize],
    target: &'a Tiling,
}

impl Planner<'_> {
    fn neighbours(&self, s: &Tiling) -> Vec<(Step, Tiling, f64)> {
        let (mesh, shape) = (self.mesh, self.shape);
        let mut out = Vec::new();
        let local = local_elems(shape, s, mesh);
        let used: Vec<&String> = s.iter().flatten().collect();
        let unused: Vec<String> = self
            .target
            .iter()
            .flatten()
            .filter(|a| !used.iter().any(|u| overlap(mesh, u, a)))
            .cloned()
            .collect();
        for d in 0..s.len() {
            let (n, c) = (mesh.axes_size(&s[d]), chunk(shape, s, d, mesh));
            // Slices: append an ordered selection of unused target axes.
            for seq in sequences(&unused) {
                let k = mesh.axes_size(&seq);
                let mut t = s.clone();
                t[d].extend(seq.iter().cloned());
                if slice_is_local(n, c, k, chunk(shape, &t, d, mesh)) {
                    out.push((Step::Slice { dim: d, axes: seq }, t, 0.0));
                }
            }
            // Gathers: drop the trailing `len` axes, or the minor part of the last
            // axis when the target keeps a part of it on this dim.
            let mut gathers: Vec<(Vec<String>, Vec<String>)> = trailing_cuts(&s[d]);
            if let Some(last) = (s[d].last())
                .filter(|a| self.target[d].iter().any(|b| overlap(mesh, a, b)))
                .and_then(|a| mesh.axis_part(a))
            {
                gathers.extend(minor_cuts(mesh, &s[d], last));
            }
            for (axes, rest) in gathers {
                let k = mesh.axes_size(&axes);
                let mut t = s.clone();
                t[d].clone_from(&rest);
                if gather_is_exact(n / k, c, k, chunk(shape, &t, d, mesh)) {
                    let step = Step::Gather { dim: d, axes, rest };
                    out.push((step, t, local * (k as f64 - 1.0)));
                }
            }
            // All-to-all: move the trailing `len` axes of `d`, or the minor part of its
            // last axis, to the end of another dim.
            let mut moves: Vec<(Vec<String>, Vec<String>)> = trailing_cuts(&s[d]);
            // (Only a whole axis that the target splits another dim over is cut, once.)
            let moved_elsewhere = |axis: &String| {
                (self.target.iter().enumerate()).any(|(j, t)| j != d && t.contains(axis))
            };
            if let Some(last) = (s[d].last())
                .filter(|a| is_whole(mesh, a) && moved_elsewhere(a))
                .and_then(|a| mesh.axis_part(a))
            {
                moves.extend(minor_cuts(mesh, &s[d], last));
            }
            for (axes, rest) in moves {
                let k = mesh.axes_size(&axes);
                let part = axes.iter().any(|a| !is_whole(mesh, a));
                for j in (0..s.len()).filter(|&j| j != d) {
                    if part && !self.target[j].iter().any(|a| overlap(mesh, a, &axes[0])) {
                        continue;
                    }
                    let mut t = s.clone();
                    t[d].clone_from(&rest);
                    t[j].extend(axes.iter().cloned());
                    let split_ok = slice_is_local(
                        mesh.axes_size(&s[j]),
                        chunk(shape, s, j, mesh),
                        k,
                        chunk(shape, &t, j, mesh),
                    );
                    let concat_ok = gather_is_exact(n / k, c, k, chunk(shape, &t, d, mesh));
                    if split_ok && concat_ok {
                        let step = Step::AllToAll {
                            from: d,
                            to: j,
                            axes: axes.clone(),
                            rest: rest.clone(),
                        };
                        out.push((step, t, local * (k as f64 - 1.0) / k as f64));
                    }
                }
            }
        }
        // Axis moves: a dim to the target's axes, by a local slice and one permute.
        for (d, u) in self.target.iter().enumerate() {
            if let Some(mv) = AxisMove::plan(mesh, shape, s, d, u) {
                let mut t = s.clone();
                t[d] = u.clone();
                let cost = if permute_moves_data(mesh, &mv.receivers, &mv.senders) {
                    local_elems(shape, &t, mesh)
                } else {
                    0.0
                };
                out.push((
                    Step::MoveAxes {
                        dim: d,
                        to: u.clone(),
                    },
                    t,
                    cost,
                ));
            }
        }
        // Permutes: to the target (its axes cut in the parts this tiling uses) extended
        // by the axes it does not use.
        if let Some(target) = self.refined_target(&used) {
            let extra: Vec<String> = used
                .iter()
                .filter(|a| !target.iter().flatten().any(|b| b == **a))
                .map(|a| (*a).clone())
                .collect();
            for t in extensions(&target, &extra) {
                let same_counts =
                    (0..s.len()).all(|d| mesh.axes_size(&t[d]) == mesh.axes_size(&s[d]));
                if same_counts && &t != s {
                    let (receivers, senders) = (flat(&t), flat(s));
                    let cost = if permute_moves_data(mesh, &receivers, &senders) {
                        local
                    } else {
                        0.0
                    };
                    out.push((Step::Permute { to: t.clone() }, t, cost));
                }
            }
        }
        out
    }

    /// The target with each axis replaced by the parts of it in `used`, major first; `None`
    /// unless `used` covers every target axis whole or by parts.
    fn refined_target(&self, used: &[&String]) -> Option<Tiling> {
        let mesh = self.mesh;
        let refine = |axis: &String| -> Option<Vec<String>> {
            let whole = mesh.axis_part(axis)?;
            let mut parts: Vec<(AxisPart, String)> = (used.iter())
                .filter_map(|u| Some((mesh.axis_part(u)?, (*u).clone())))
                .filter(|(p, _)| whole.contains(p))
                .collect();
            parts.sort();
            let names: Vec<String> = parts.into_iter().map(|p| p.1).collect();
            (mesh.axes_size(&names) == mesh.axes_size(std::slice::from_ref(axis))
                && !names.is_empty())
            .then_some(names)
        };
        (self.target.iter())
            .map(|dim| {
                let parts: Option<Vec<Vec<String>>> = dim.iter().map(refine).collect();
                parts.map(|p| p.concat())
            })
            .collect()
    }

    /// Cheapest plan from `from` to the target (fewest collectives, then fewest steps,
    /// among equal costs), and its cost in elements received per device. A step that
    /// receives nothing emits no collective (a slice, a collective over one device, a
    /// permute where every device is its own source).
    fn plan(&self, from: &Tiling) -> (Vec<Step>, f64) {
        // (elements received, (collectives, steps), how the state was reached).
        type Entry = (f64, (usize, usize), Option<(Tiling, Step)>);
        // Ordered maps, and the frontier ordered by (cost, counts, tiling): ties go to
        // the first tiling in order, so every process (every MPI rank) compiles the same
        // plan. A state whose entry improved after it was queued is skipped when its
        // stale copy comes out.
        let mut best: BTreeMap<Tiling, Entry> = BTreeMap::new();
        let mut done: BTreeSet<Tiling> = BTreeSet::new();
        let mut frontier = BinaryHeap::new();
        best.insert(from.clone(), (0.0, (0, 0), None));
        frontier.push(Reverse((Cost(0.0), (0, 0), from.clone())));
        while let Some(Reverse((Cost(cost), steps, state))) = frontier.pop() {
            let current = best
                .get(&state)
                .is_some_and(|e| (e.0, e.1) == (cost, steps));
            if !current || done.contains(&state) {
                continue;
            }
            if &state == self.target {
                break;
            }
            done.insert(state.clone());
            for (step, t, c) in self.neighbours(&state) {
                let t = normalize(self.mesh, t);
                let counts = (steps.0 + usize::from(c > 0.0), steps.1 + 1);
                let entry = (cost + c, counts, Some((state.clone(), step)));
                match best.get(&t) {
                    Some(e) if (e.0, e.1) <= (entry.0, entry.1) => {}
                    _ => {
                        frontier.push(Reverse((Cost(entry.0), counts, t.clone())));
                        best.insert(t, entry);
                    }
                }
            }
        }
        let total = best.get(self.target).map_or(f64::INFINITY, |e| e.0);
        let mut plan = Vec::new();
        let mut at = self.target.clone();
        while let Some((_, _, Some((prev, step)))) = best.get(&at) {
            plan.push(step.clone());
            at = prev.clone();
        }
        plan.reverse();
        (plan, total)
    }
}

/// The axes of a tiling, dim by dim: a device's shard index over them is its index in
/// the row-major order of blocks.
fn flat(t: &Tiling) -> Vec<String> {
    t.iter().flatten().cloned().collect()
}

/// Every non-empty ordered selection of distinct items.
fn sequences(items: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        out.push(vec![item.clone()]);
        let rest: Vec<String> = items
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, a)| a.clone())
            .collect();
        for mut tail in sequences(&rest) {
            tail.insert(0, item.clone());
            out.push(tail);
        }
    }
    out
}

/// Every way to append all of `extra` (each once, any order) to the dims of `base`.
fn extensions(base: &Tiling, extra: &[String]) -> Vec<Tiling> {
    let Some((first, rest)) = extra.split_first() else {
        return vec![base.clone()];
    };
    let mut out = Vec::new();
    for t in extensions(base, rest) {
        for d in 0..t.len() {
            // Insert `first` at every position after the base axes of dim d.
            for pos in base[d].len()..=t[d].len() {
                let mut u = t.clone();
                u[d].insert(pos, first.clone());
                if !out.contains(&u) {
                    out.push(u);
                }
            }
        }
    }
    out
}

/// The sharding with `dims` as axes, all closed, and `unreduced` pending sums.
pub(crate) fn sharding_of(dims: &Tiling, unreduced: Vec<String>) -> Sharding {
    Sharding {
        dims: dims
            .iter()
            .map(|axes| DimSharding {
                axes: axes.clone(),
                closed: true,
                priority: None,
                reversed: false,
            })
            .collect(),
        replicated: Vec::new(),
        unreduced,
    }
}

/// A resharding decided but not emitted: what [`reshard`] will do, and its cost.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReshardPlan {
    /// First, the axes of a mirrored shift putting the value's reversed dims in the
    /// order the tiling moves need or the target has (none: nothing to do).
    mirror_first: Vec<String>,
    /// Pending sums reduce-scattered onto a dim: `(dim, axes)`.
    reduce_scatters: Vec<(usize, Vec<String>)>,
    /// Pending sums all-reduced.
    all_reduce: Vec<String>,
    /// Then the moves between tilings.
    steps: Vec<Step>,
    /// Last, the axes over which the target keeps a partial sum that the value does not
    /// have yet: the value stays on the devices at index 0 along them, the others hold
    /// zeros (exact, no communication).
    make_unreduced: Vec<String>,
    /// Last, the axes of a mirrored shift putting the target's reversed dims in its
    /// order (none: nothing to do).
    mirror_last: Vec<String>,
    /// Elements each device receives.
    pub cost: f64,
}

/// The axes of the dims of `s` where `reversed` holds, dim by dim.
fn axes_where(s: &Sharding, reversed: impl Fn(usize, &DimSharding) -> bool) -> Vec<String> {
    (s.dims.iter().enumerate())
        .filter(|(d, dim)| reversed(*d, dim))
        .flat_map(|(_, dim)| dim.axes.iter().cloned())
        .collect()
}

/// The mirrored shifts before and after the tiling moves from `from` to `to`
/// ([`ReshardPlan::mirror_first`], [`ReshardPlan::mirror_last`]): when both tile
/// alike, one over the dims whose order differs (a mirror over several dims' axes
/// reverses each dim's index); otherwise out of `from`'s order and into `to`'s.
fn order_moves(mesh: &Mesh, from: &Sharding, to: &Sharding) -> (Vec<String>, Vec<String>) {
    if tiling_of(mesh, from) == tiling_of(mesh, to) {
        let differs = |d: usize, dim: &DimSharding| dim.reversed != to.dims[d].reversed;
        return (axes_where(from, differs), Vec::new());
    }
    (
        axes_where(from, |_, dim| dim.reversed),
        axes_where(to, |_, dim| dim.reversed),
    )
}

/// Plans moving a value of `shape` from `from` to `to` (tilings and pending sums).
/// Pending sums the target does not keep are reduced by `reduce_scatter` onto the dims
/// the target splits on them next, the rest by one `all_reduce`; pending sums the
/// target has and the value has not are made by zeroing all but one copy.
pub(crate) fn plan_reshard(
    mesh: &Mesh,
    shape: &[usize],
    from: &Sharding,
    to: &Sharding,
) -> ReshardPlan {
    let mut tiling = tiling_of(mesh, from);
    let goal = tiling_of(mesh, to);
    let (mirror_first, mirror_last) = order_moves(mesh, from, to);
    let mirrored = |axes: &[String], t: &Tiling| {
        if mesh.axes_size(axes) > 1 {
            local_elems(shape, t, mesh)
        } else {
            0.0
        }
    };
    let order_cost = mirrored(&mirror_first, &tiling) + mirrored(&mirror_last, &goal);
    let mut pending: Vec<String> = from
        .unreduced
        .iter()
        .filter(|a| !to.unreduced.contains(a))
        .cloned()
        .collect();
    let mut plan = ReshardPlan {
        mirror_first,
        mirror_last,
        reduce_scatters: Vec::new(),
        all_reduce: Vec::new(),
        steps: Vec::new(),
        make_unreduced: (to.unreduced.iter())
            .filter(|a| !from.unreduced.contains(a))
            .cloned()
            .collect(),
        cost: order_cost,
    };
    for d in 0..shape.len() {
        let mut axes = Vec::new();
        while goal[d].starts_with(&tiling[d]) && goal[d].len() > tiling[d].len() + axes.len() {
            let a = &goal[d][tiling[d].len() + axes.len()];
            if !pending.contains(a) {
                break;
            }
            axes.push(a.clone());
        }
        while !axes.is_empty() {
            let mut t = tiling.clone();
            t[d].extend(axes.iter().cloned());
            let (n, c, k) = (
                mesh.axes_size(&tiling[d]),
                chunk(shape, &tiling, d, mesh),
                mesh.axes_size(&axes),
            );
            if slice_is_local(n, c, k, chunk(shape, &t, d, mesh)) {
                plan.cost += local_elems(shape, &tiling, mesh) * (k as f64 - 1.0) / k as f64;
                pending.retain(|a| !axes.contains(a));
                plan.reduce_scatters.push((d, axes));
                tiling = t;
                break;
            }
            axes.pop();
        }
    }
    if !pending.is_empty() {
        let k = mesh.axes_size(&pending) as f64;
        plan.cost += 2.0 * local_elems(shape, &tiling, mesh) * (k - 1.0) / k;
        plan.all_reduce = pending;
    }
    let (steps, cost) = Planner {
        mesh,
        shape,
        target: &goal,
    }
    .plan(&tiling);
    plan.steps = steps;
    plan.cost += cost;
    plan
}

/// Moves `v` to `target` (see [`plan_reshard`]), emitting the collectives and slices,
/// each collective with [`Emitter::why_moving`] as its reason.
pub(crate) fn reshard(em: &mut Emitter, v: &PValue, target: &Sharding) -> Result<PValue> {
    let why = em.why_moving(v, target);
    let outer = em.reason.replace(why);
    let moved = reshard_as_planned(em, v, target);
    em.reason = outer;
    moved
}

/// [`reshard`] without setting the reason.
fn reshard_as_planned(em: &mut Emitter, v: &PValue, target: &Sharding) -> Result<PValue> {
    let mesh = em.mesh;
    let shape = v.global.shape.clone();
    let plan = plan_reshard(mesh, &shape, &v.sharding, target);
    let mut tiling = tiling_of(mesh, &v.sharding);
    let mut x = mirror(em, v.id, &plan.mirror_first)?;
    for (d, axes) in &plan.reduce_scatters {
        let mut t = tiling.clone();
        t[*d].extend(axes.iter().cloned());
        x = em.pad_to(x, *d, mesh.axes_size(axes) * chunk(&shape, &t, *d, mesh))?;
        let group = em.group(axes);
        x = em.emit(
            Op::ReduceScatter {
                group,
                kind: ReduceKind::Sum,
                dim: *d,
            },
            &[x],
        )?;
        tiling = t;
    }
    if !plan.all_reduce.is_empty() {
        let group = em.group(&plan.all_reduce);
        x = em.emit(
            Op::AllReduce {
                group,
                kind: ReduceKind::Sum,
            },
            &[x],
        )?;
    }
    let mut replicated_midway = false;
    for step in &plan.steps {
        x = emit_step(em, x, &shape, &tiling, step)?;
        tiling = apply(mesh, &tiling, step);
        replicated_midway |= tiling.iter().all(Vec::is_empty);
    }
    let goal = tiling_of(mesh, target);
    let split = |t: &[DimSharding]| t.iter().any(|d| !d.axes.is_empty());
    if replicated_midway && split(&v.sharding.dims) && split(&target.dims) {
        warn_full_rematerialization(em, v, target, &plan);
    }
    if tiling != goal {
        return Err(em.error(format!("no resharding from {} to {target}", v.sharding)));
    }
    if !plan.make_unreduced.is_empty() {
        x = keep_one_copy(em, x, &plan.make_unreduced)?;
    }
    x = mirror(em, x, &plan.mirror_last)?;
    let mut sharding = sharding_of(&goal, target.unreduced.clone());
    for (dim, want) in sharding.dims.iter_mut().zip(&target.dims) {
        dim.reversed = want.reversed && !dim.axes.is_empty();
    }
    Ok(PValue {
        id: x,
        global: v.global.clone(),
        sharding,
    })
}

/// `x` mirrored over the group of `axes` (member `i` receives member `n - 1 - i`'s
/// block); nothing when they hold one device.
fn mirror(em: &mut Emitter, x: ValueId, axes: &[String]) -> Result<ValueId> {
    if em.mesh.axes_size(axes) > 1 {
        em.mirror(x, axes, 0)
    } else {
        Ok(x)
    }
}

/// Warns that resharding `v` to `target` by `plan` replicates it whole on every device
/// although both shardings split it (XLA's "involuntary full rematerialization"),
/// naming both shardings and the bytes, suggesting the annotation that makes the
/// value's producer emit it in the target's layout, and giving the reason (the
/// annotations both shardings came from).
fn warn_full_rematerialization(
    em: &mut Emitter,
    v: &PValue,
    target: &Sharding,
    plan: &ReshardPlan,
) {
    let bytes = plan.cost * v.global.dtype.size_in_bytes() as f64;
    let why = em
        .reason
        .as_ref()
        .map(|w| format!("; why: {w}"))
        .unwrap_or_default();
    em.warn(format!(
        "full rematerialization: resharding {} from {} to {target} replicates it on every \
         device ({bytes} bytes received per device); annotate the value \
         `.shard(\"{target}\")` where it is defined, so it is produced split as used here{why}",
        v.global, v.sharding
    ));
}

/// `x` on the devices at index 0 along `axes`, zeros on the others: a replicated value
/// turned into an equal sum of partial values over `axes`.
fn keep_one_copy(em: &mut Emitter, x: ValueId, axes: &[String]) -> Result<ValueId> {
    let shape = em.shape(x);
    let dtype = em.ty(x).dtype;
    let index = em.emit(Op::AxisIndex(em.group(axes)), &[])?;
    let zero_index = em.scalar(DType::I32, 0.0)?;
    let first = em.emit(Op::Compare(CompareOp::Eq), &[index, zero_index])?;
    let first = em.splat(first, &shape)?;
    let zero = em.scalar(dtype, 0.0)?;
    let zeros = em.splat(zero, &shape)?;
    em.emit(Op::Select, &[first, x, zeros])
}

/// The tiling after `step` from `s` (normalized, see [`normalize`]).
fn apply(mesh: &Mesh, s: &Tiling, step: &Step) -> Tiling {
    let mut t = s.clone();
    match step {
        Step::Slice { dim, axes } => t[*dim].extend(axes.iter().cloned()),
        Step::Gather { dim, rest, .. } => t[*dim].clone_from(rest),
        Step::AllToAll {
            from,
            to,
            axes,
            rest,
        } => {
            t[*from].clone_from(rest);
            t[*to].extend(axes.iter().cloned());
        }
        Step::Permute { to } => t = to.clone(),
        Step::MoveAxes { dim, to } => t[*dim] = to.clone(),
    }
    normalize(mesh, t)
}

/// A collective-permute of `x` where the member at index `i` of its group over
/// `receivers` receives from the member at index `i` over `senders` (the same digits
/// of the mesh, possibly cut differently: both lists are cut into the same parts
/// first); nothing when every device is its own source.
fn emit_permute(
    em: &mut Emitter,
    x: ValueId,
    receivers: &[String],
    senders: &[String],
) -> Result<ValueId> {
    let mesh = em.mesh;
    if !permute_moves_data(mesh, receivers, senders) {
        return Ok(x);
    }
    let parts = |axes: &[String]| -> Vec<AxisPart> {
        axes.iter().filter_map(|a| mesh.axis_part(a)).collect()
    };
    let (r, s) = (parts(receivers), parts(senders));
    let names = |cut: Vec<AxisPart>| -> Vec<String> {
        cut.into_iter().map(|p| mesh.part_name(p)).collect()
    };
    let group = em.group(&names(cut_at(&r, &s)));
    let from = names(cut_at(&s, &r));
    em.emit(Op::CollectivePermute { group, from }, &[x])
}

fn emit_step(
    em: &mut Emitter,
    x: crate::ir::ValueId,
    shape: &[usize],
    s: &Tiling,
    step: &Step,
) -> Result<crate::ir::ValueId> {
    let mesh = em.mesh;
    let t = apply(mesh, s, step);
    match step {
        Step::Slice { dim, axes } => slice_block(em, x, *dim, axes, chunk(shape, &t, *dim, mesh)),
        Step::Gather { dim, axes, .. } => {
            let group = em.group(axes);
            let x = em.emit(Op::AllGather { group, dim: *dim }, &[x])?;
            em.truncate(x, *dim, chunk(shape, &t, *dim, mesh))
        }
        Step::AllToAll { from, to, axes, .. } => {
            let group = em.group(axes);
            let x = em.pad_to(x, *to, group.size * chunk(shape, &t, *to, mesh))?;
            let x = em.emit(
                Op::AllToAll {
                    group,
                    split_dim: *to,
                    concat_dim: *from,
                },
                &[x],
            )?;
            em.truncate(x, *from, chunk(shape, &t, *from, mesh))
        }
        Step::Permute { to } => emit_permute(em, x, &flat(to), &flat(s)),
        Step::MoveAxes { dim, to } => {
            let mv = AxisMove::plan(mesh, shape, s, *dim, to)
                .ok_or_else(|| em.error(format!("no move of dim {dim} to {to:?}")))?;
            let c_new = chunk(shape, &t, *dim, mesh);
            let x = slice_block(em, x, *dim, &mv.minor, c_new)?;
            emit_permute(em, x, &mv.receivers, &mv.senders)
        }
    }
}

/// Block `axes`-index of `c_new` rows along `dim` of `x` (padded first to `axes`
/// blocks): the local slice that splits a dim further over `axes` (none if empty).
fn slice_block(
    em: &mut Emitter,
    x: ValueId,
    dim: usize,
    axes: &[String],
    c_new: usize,
) -> Result<ValueId> {
    if axes.is_empty() {
        return Ok(x);
    }
    let x = em.pad_to(x, dim, em.mesh.axes_size(axes) * c_new)?;
    let start = em.block_offset(axes, c_new)?;
    let mut starts = vec![None; em.shape(x).len()];
    starts[dim] = Some(start);
    let mut sizes = em.shape(x);
    sizes[dim] = c_new;
    em.dynamic_slice(x, &starts, &sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[&[&str]]) -> Tiling {
        dims.iter()
            .map(|d| d.iter().map(|a| a.to_string()).collect())
            .collect()
    }

    fn plan(mesh: &Mesh, shape: &[usize], from: &Tiling, to: &Tiling) -> Vec<Step> {
        Planner {
            mesh,
            shape,
            target: to,
        }
        .plan(from)
        .0
    }

    fn mesh24() -> Mesh {
        Mesh::new([("data", 2), ("model", 4)]).unwrap()
    }

    #[test]
    fn orders_move_by_mirrored_shifts() {
        let mesh = mesh24();
        let plan = |from: &str, to: &str| {
            let p = plan_reshard(
                &mesh,
                &[8, 16],
                &from.parse().unwrap(),
                &to.parse().unwrap(),
            );
            (p.mirror_first, p.mirror_last, p.steps.len(), p.cost)
        };
        let names = |axes: &[&str]| -> Vec<String> { axes.iter().map(|a| a.to_string()).collect() };
        // Only the order differs: one mirror over the dims whose order differs, one local
        // block ([4, 4]) received.
        assert_eq!(
            plan("(-data, model)", "(-data, model)"),
            (vec![], vec![], 0, 0.0)
        );
        assert_eq!(
            plan("(-data, model)", "(data, model)"),
            (names(&["data"]), vec![], 0, 16.0)
        );
        assert_eq!(
            plan("(-data, model)", "(data, -model)"),
            (names(&["data", "model"]), vec![], 0, 16.0)
        );
        // Another tiling: out of the value's order first, into the target's last.
        let (first, last, steps, cost) = plan("(-data, _)", "(_, -model)");
        assert_eq!((first, last), (names(&["data"]), names(&["model"])));
        assert!(steps > 0);
        assert_eq!(
            cost,
            4.0 * 16.0 + plan("(data, _)", "(_, model)").3 + 8.0 * 4.0
        );
    }

    #[test]
    fn same_tiling_needs_nothing() {
        let m = mesh24();
        assert!(plan(&m, &[8, 8], &t(&[&["data"], &[]]), &t(&[&["data"], &[]])).is_empty());
    }

    #[test]
    fn adding_axes_only_slices() {
        let m = mesh24();
        let p = plan(&m, &[8, 8], &t(&[&[], &[]]), &t(&[&["data"], &["model"]]));
        assert!(p.iter().all(|s| matches!(s, Step::Slice { .. })), "{p:?}");
    }

    #[test]
    fn data_to_model_on_one_dim_never_gathers_whole() {
        let m = mesh24();
        let p = plan(&m, &[64], &t(&[&["data"]]), &t(&[&["model"]]));
        // Whatever the route, no step may gather the dim whole (to 1 shard).
        let mut s = t(&[&["data"]]);
        for step in &p {
            s = apply(&m, &s, step);
            assert!(
                !s[0].is_empty(),
                "plan {p:?} passes through a replicated dim"
            );
        }
        assert_eq!(s, t(&[&["model"]]));
        assert!(
            p.iter().any(|s| matches!(
                s,
                Step::Permute { .. } | Step::AllToAll { .. } | Step::MoveAxes { .. }
            )),
            "{p:?}"
        );
    }

    #[test]
    fn moving_an_axis_between_dims_is_one_all_to_all() {
        let m = mesh24();
        let p = plan(&m, &[8, 8], &t(&[&["model"], &[]]), &t(&[&[], &["model"]]));
        assert_eq!(
            p,
            vec![Step::AllToAll {
                from: 0,
                to: 1,
                axes: vec!["model".into()],
                rest: vec![],
            }]
        );
    }

    /// Bytes received per device by a plan, from the planner's own cost model.
    fn cost(mesh: &Mesh, shape: &[usize], from: &Tiling, to: &Tiling, p: &[Step]) -> f64 {
        let planner = Planner {
            mesh,
            shape,
            target: to,
        };
        let mut s = from.clone();
        let mut total = 0.0;
        for step in p {
            let (_, next, c) = planner
                .neighbours(&s)
                .into_iter()
                .find(|(st, _, _)| st == step)
                .expect("plan steps are neighbours");
            total += c;
            s = normalize(mesh, next);
        }
        total
    }

    #[test]
    fn data_to_model_is_a_local_slice_and_one_permute() {
        let m = mesh24();
        let (from, to) = (t(&[&["data"], &[]]), t(&[&["model"], &[]]));
        let p = plan(&m, &[32, 64], &from, &to);
        let step = Step::MoveAxes {
            dim: 0,
            to: vec!["model".into()],
        };
        assert_eq!(p, vec![step]);
        assert_eq!(cost(&m, &[32, 64], &from, &to, &p), 8.0 * 64.0);
        let mv = AxisMove::plan(&m, &[32, 64], &from, 0, &to[0]).unwrap();
        let (major, minor) = (Mesh::sub_axis("model", 1, 2), Mesh::sub_axis("model", 2, 2));
        assert_eq!(mv.minor, vec![minor.clone()]);
        assert_eq!(
            mv.receivers,
            vec![major.clone(), minor.clone(), "data".into()]
        );
        assert_eq!(mv.senders, vec!["data".into(), minor, major]);
    }

    #[test]
    fn moving_two_axes_between_dims_is_one_all_to_all_over_both() {
        let m = Mesh::new([("a", 2), ("b", 2)]).unwrap();
        let (from, to) = (t(&[&["a", "b"], &[]]), t(&[&[], &["a", "b"]]));
        let p = plan(&m, &[8, 8], &from, &to);
        let step = Step::AllToAll {
            from: 0,
            to: 1,
            axes: vec!["a".into(), "b".into()],
            rest: vec![],
        };
        assert_eq!(p, vec![step]);
        assert_eq!(cost(&m, &[8, 8], &from, &to, &p), 16.0 * 3.0 / 4.0);
    }

    #[test]
    fn reordering_around_a_size_one_axis_moves_nothing() {
        let m = Mesh::new([("x", 2), ("one", 1)]).unwrap();
        let (from, to) = (t(&[&["x", "one"], &[]]), t(&[&["one", "x"], &[]]));
        let p = plan(&m, &[8, 8], &from, &to);
        assert_eq!(p, vec![], "axes of size 1 split nothing");
        assert_eq!(normalize(&m, from), normalize(&m, to));
    }

    #[test]
    fn swapping_axes_is_cheaper_than_gathering_everything() {
        let m = mesh24();
        let (from, to) = (t(&[&["data"], &["model"]]), t(&[&["model"], &["data"]]));
        let p = plan(&m, &[8, 8], &from, &to);
        assert_eq!(p.iter().fold(from.clone(), |s, st| apply(&m, &s, st)), to);
        // Gathering everything receives 64 - 8 = 56 elements per device.
        let c = cost(&m, &[8, 8], &from, &to, &p);
        assert!(c < 56.0, "{p:?} costs {c}");
    }

    #[test]
    fn uneven_dims_route_around_misaligned_slices() {
        let m = mesh24();
        // 10 over (data, model): from replicated, one slice of both axes at once.
        let p = plan(&m, &[10], &t(&[&[]]), &t(&[&["data", "model"]]));
        assert_eq!(
            p,
            vec![Step::Slice {
                dim: 0,
                axes: vec!["data".into(), "model".into()]
            }]
        );
        // From `data` (chunks of 5) to `(data, model)` (chunks of 2): not nested, so no
        // single slice.
        let p = plan(&m, &[10], &t(&[&["data"]]), &t(&[&["data", "model"]]));
        assert_ne!(
            p,
            vec![Step::Slice {
                dim: 0,
                axes: vec!["model".into()]
            }]
        );
    }

    #[test]
    fn sequences_and_extensions_enumerate() {
        let ax = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(sequences(&ax(&["a", "b"])).len(), 4);
        let e = extensions(&t(&[&["m"], &[]]), &ax(&["d"]));
        assert_eq!(e, vec![t(&[&["m", "d"], &[]]), t(&[&["m"], &["d"]])]);
    }
}
