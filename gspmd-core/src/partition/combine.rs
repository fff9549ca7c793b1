//! Combining collectives (XLA's `AllReduceCombiner`, `AllGatherCombiner`,
//! `ReduceScatterCombiner`): collectives of a per-device program of one kind, over the
//! same group, with the same reduce kind and dtype, and no dependency path between
//! them, become one collective of their operands flattened and concatenated, each
//! result cut back out. One round trip instead of several (the gradient all-reduces of
//! a data-parallel step); the same bytes. An all-gather's or a reduce-scatter's operand
//! is first laid out with its `group.size` blocks along its dim major (`[k, n / k]`),
//! so the combined buffer's blocks are the members' blocks side by side.
//!
//! Every element is reduced over the same devices in the same order whether it travels
//! alone or in a combined buffer, so results are bitwise equal. Independence is judged
//! on the program with the groups formed so far merged into one node each, so combining
//! never makes a cycle; the program is then re-emitted in a topological order that keeps
//! the original order where it can (a combined all-reduce sits where its last member
//! was, and users of its earlier members move after it).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::sync::Arc;

use crate::error::Result;
use crate::ir::{AxisGroup, DType, Flow, Node, Op, Program, ReduceKind, ValueId};
use crate::types::{Location, num_elements};

/// Combined collectives carry at most this many bytes per device in their result (XLA's
/// default threshold for its all-reduce combiner, 30 MiB); a larger one is left alone.
pub(crate) const COMBINE_THRESHOLD_BYTES: usize = 30 * 1024 * 1024;

/// The collectives the combiner merges, with what their op must share besides the group.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    AllReduce(ReduceKind),
    AllGather,
    ReduceScatter(ReduceKind),
}

/// What collectives must share to be combined.
#[derive(Debug, Clone, PartialEq)]
struct Key {
    kind: Kind,
    group: AxisGroup,
    dtype: DType,
}

impl Key {
    /// The key of `node` if it is a collective the combiner merges.
    fn of(node: &Node) -> Option<Key> {
        let (kind, group) = match &node.op {
            Op::AllReduce { group, kind } => (Kind::AllReduce(*kind), group),
            Op::AllGather { group, .. } => (Kind::AllGather, group),
            Op::ReduceScatter { group, kind, .. } => (Kind::ReduceScatter(*kind), group),
            _ => return None,
        };
        Some(Key {
            kind,
            group: group.clone(),
            dtype: node.ty.dtype,
        })
    }
}

/// Collectives to combine into one, in program order.
#[derive(Debug, Clone)]
struct Combined {
    key: Key,
    members: Vec<ValueId>,
    bytes: usize,
}

/// `program` with its independent all-reduces, all-gathers and reduce-scatters of one
/// group, reduce kind and dtype combined, up to [`COMBINE_THRESHOLD_BYTES`] each (see
/// the module docs), except the collectives in `apart`, which are left as they are
/// and where they are (a regathered weight's second all-gather, which combined with
/// the first would move back to it). The regions of its flow ops (loop bodies,
/// branches) are combined alike, each on its own (nothing moves across a region's
/// boundary). Returns the program and each old value's new id (a combined member's:
/// the value cut out for it).
pub(crate) fn combine_collectives(
    program: &Program,
    apart: &[ValueId],
) -> Result<(Program, Vec<ValueId>)> {
    let with_regions = combine_in_regions(program)?;
    let program = with_regions.as_ref().unwrap_or(program);
    let mut groups: Vec<Combined> = Vec::new();
    // `member_of[v]`: the group all-reduce `v` joined.
    let mut member_of: Vec<Option<usize>> = vec![None; program.nodes.len()];
    for v in program.values() {
        let node = program.node(v);
        let Some(key) = Key::of(node).filter(|_| !apart.contains(&v)) else {
            continue;
        };
        let bytes = node.ty.size_in_bytes();
        if bytes == 0 || bytes > COMBINE_THRESHOLD_BYTES {
            continue;
        }
        let fits =
            |other: &Combined| other.key == key && other.bytes + bytes <= COMBINE_THRESHOLD_BYTES;
        // No path runs from `v` to a group: every member precedes `v`, and so does
        // every node a path from `v` reaches. Only paths into `v` can forbid a group.
        let joins = if groups.iter().any(fits) {
            let reaching = groups_reaching(program, &groups, &member_of, v);
            (0..groups.len())
                .rev()
                .find(|&g| fits(&groups[g]) && !reaching[g])
        } else {
            None
        };
        let g = joins.unwrap_or_else(|| {
            groups.push(Combined {
                key,
                members: Vec::new(),
                bytes: 0,
            });
            groups.len() - 1
        });
        groups[g].members.push(v);
        groups[g].bytes += bytes;
        member_of[v.index()] = Some(g);
    }
    let combined: Vec<&Combined> = groups.iter().filter(|g| g.members.len() > 1).collect();
    if combined.is_empty() {
        return Ok((program.clone(), program.values().collect()));
    }
    emit(program, &combined)
}

/// `program` with the regions of each of its flow ops combined (each distinct op once:
/// an instance's result nodes keep sharing one), or `None` when no region changes.
fn combine_in_regions(program: &Program) -> Result<Option<Program>> {
    let mut done: HashMap<*const Flow, Arc<Flow>> = HashMap::new();
    let mut out = program.clone();
    let mut changed = false;
    for node in &mut out.nodes {
        let Op::Flow { flow, .. } = &mut node.op else {
            continue;
        };
        let local = match done.get(&Arc::as_ptr(flow)) {
            Some(f) => f.clone(),
            None => {
                let combined = flow.try_map_regions(|r| Ok(combine_collectives(r, &[])?.0))?;
                let combined = Arc::new(combined);
                done.insert(Arc::as_ptr(flow), combined.clone());
                combined
            }
        };
        changed |= *local != **flow;
        *flow = local;
    }
    Ok(changed.then_some(out))
}

/// For each group formed so far, whether a path runs from it to `v` in `program`'s
/// graph with each group taken as one node (reaching a member reaches every member's
/// users). One walk back from `v` over operands, which on reaching a member marks its
/// group and walks back from every member: linear in the nodes `v` depends on.
fn groups_reaching(
    program: &Program,
    groups: &[Combined],
    member_of: &[Option<usize>],
    v: ValueId,
) -> Vec<bool> {
    let mut reaching = vec![false; groups.len()];
    let mut seen = vec![false; program.nodes.len()];
    let mut stack: Vec<ValueId> = Vec::new();
    let mut visit = |o: ValueId, stack: &mut Vec<ValueId>| {
        let alone = [o];
        let members = match member_of[o.index()] {
            Some(g) => {
                reaching[g] = true;
                &groups[g].members[..]
            }
            None => &alone[..],
        };
        for &m in members {
            if !std::mem::replace(&mut seen[m.index()], true) {
                stack.push(m);
            }
        }
    };
    stack.push(v);
    while let Some(x) = stack.pop() {
        for &o in &program.node(x).operands {
            visit(o, &mut stack);
        }
    }
    reaching
}

/// `program` re-emitted with each of `combined` as one all-reduce, in a topological
/// order of the graph with each group one node, earliest original position first (a
/// group at its last member's); with each old value's new id.
fn emit(program: &Program, combined: &[&Combined]) -> Result<(Program, Vec<ValueId>)> {
    let n = program.nodes.len();
    // Unit of a node: itself, or `n + g` for a member of combined group `g`.
    let mut unit: Vec<usize> = (0..n).collect();
    for (g, group) in combined.iter().enumerate() {
        for m in &group.members {
            unit[m.index()] = n + g;
        }
    }
    let units = n + combined.len();
    let mut successors: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); units];
    for (index, node) in program.nodes.iter().enumerate() {
        for o in &node.operands {
            if unit[o.index()] != unit[index] {
                successors[unit[o.index()]].insert(unit[index]);
            }
        }
    }
    let mut waiting = vec![0usize; units];
    for s in successors.iter().flatten() {
        waiting[*s] += 1;
    }
    let position = |u: usize| -> usize {
        if u < n {
            u
        } else {
            combined[u - n].members.last().map_or(0, |m| m.index())
        }
    };
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> = (0..units)
        .filter(|&u| waiting[u] == 0 && (u >= n || unit[u] == u))
        .map(|u| Reverse((position(u), u)))
        .collect();
    let mut out = Program::new(program.name.clone());
    let mut ids: Vec<Option<ValueId>> = vec![None; n];
    let new_id = |ids: &[Option<ValueId>], v: ValueId| {
        ids[v.index()].unwrap_or_else(|| panic!("combine: {v} used before it is emitted"))
    };
    while let Some(Reverse((_, u))) = ready.pop() {
        if u < n {
            let node = &program.nodes[u];
            let mut copy = node.clone();
            copy.operands = node.operands.iter().map(|&o| new_id(&ids, o)).collect();
            ids[u] = Some(out.push(copy));
        } else {
            let group = combined[u - n];
            let operands: Vec<ValueId> = (group.members.iter())
                .map(|m| new_id(&ids, program.node(*m).operands[0]))
                .collect();
            let results = emit_combined(&mut out, program, group, &operands)?;
            for (m, r) in group.members.iter().zip(results) {
                ids[m.index()] = Some(r);
            }
        }
        for &s in &successors[u] {
            waiting[s] -= 1;
            if waiting[s] == 0 {
                ready.push(Reverse((position(s), s)));
            }
        }
    }
    out.params = program.params.iter().map(|&p| new_id(&ids, p)).collect();
    out.outputs = program.outputs.iter().map(|&o| new_id(&ids, o)).collect();
    for node in &mut out.nodes {
        node.origin = None;
    }
    let ids = (program.values()).map(|v| new_id(&ids, v)).collect();
    Ok((out, ids))
}

/// Appends one collective of `operands` (the members' operands in `out`) laid out as
/// `[k, n / k]` blocks (all-reduce: `k` = 1) and concatenated, and each member's result
/// cut from it and laid out back; returns the members' new values, each carrying its
/// member's name and sharding.
fn emit_combined(
    out: &mut Program,
    program: &Program,
    group: &Combined,
    operands: &[ValueId],
) -> Result<Vec<ValueId>> {
    let members: Vec<&Node> = group.members.iter().map(|m| program.node(*m)).collect();
    let location = members[0].location;
    let k = group.key.group.size;
    let op = match group.key.kind {
        Kind::AllReduce(kind) => Op::AllReduce {
            group: group.key.group.clone(),
            kind,
        },
        Kind::AllGather => Op::AllGather {
            group: group.key.group.clone(),
            dim: 0,
        },
        Kind::ReduceScatter(kind) => Op::ReduceScatter {
            group: group.key.group.clone(),
            kind,
            dim: 0,
        },
    };
    let mut laid_out = Vec::with_capacity(operands.len());
    let mut widths = Vec::with_capacity(operands.len());
    for (&x, member) in operands.iter().zip(&members) {
        let x = match &member.op {
            Op::ReduceScatter { dim, .. } => blocks_major(out, x, *dim, k, location)?,
            _ => {
                let n = num_elements(&out.ty(x).shape);
                reshape(out, x, vec![1, n], location)?
            }
        };
        widths.push(out.ty(x).shape[1]);
        laid_out.push(x);
    }
    let joined = out.push_op(Op::Concatenate(1), &laid_out, location)?;
    // `[1, total]`, or `[k, total]` for an all-gather (row `j` from device `j`).
    let combined = out.push_op(op, &[joined], location)?;
    out.node_mut(combined).why = members.iter().flat_map(|m| m.why.clone()).collect();
    let rows = out.ty(combined).shape[0];
    let mut results = Vec::with_capacity(members.len());
    let mut start = 0;
    for (member, width) in members.iter().zip(widths) {
        let slice = Op::Slice {
            start: vec![0, start],
            limit: vec![rows, start + width],
            stride: vec![1, 1],
        };
        start += width;
        let part = out.push_op(slice, &[combined], member.location)?;
        let result = match &member.op {
            Op::AllGather { dim, .. } => {
                let local = &program.ty(member.operands[0]).shape;
                blocks_back(out, part, *dim, local, member.location)?
            }
            _ => reshape(out, part, member.ty.shape.clone(), member.location)?,
        };
        let node = out.node_mut(result);
        node.name.clone_from(&member.name);
        node.sharding.clone_from(&member.sharding);
        results.push(result);
    }
    Ok(results)
}

/// `x` with its dim `dim` cut in `k` blocks laid out as `[k, n / k]`, block-major (the
/// operand of a reduce-scatter over `k` devices along `dim`, as one along dim 0).
fn blocks_major(
    out: &mut Program,
    x: ValueId,
    dim: usize,
    k: usize,
    location: Location,
) -> Result<ValueId> {
    let shape = out.ty(x).shape.clone();
    let n = num_elements(&shape);
    let split: Vec<usize> = [&shape[..dim], &[k, shape[dim] / k], &shape[dim + 1..]].concat();
    let x = reshape(out, x, split, location)?;
    let perm: Vec<usize> = std::iter::once(dim)
        .chain((0..=shape.len()).filter(|&i| i != dim))
        .collect();
    let x = transpose(out, x, perm, location)?;
    reshape(out, x, vec![k, n / k], location)
}

/// The inverse of [`blocks_major`] for an all-gather's result: `part` is `[k, n]`, row
/// `j` device `j`'s block of shape `local`; returns them concatenated along `dim`.
fn blocks_back(
    out: &mut Program,
    part: ValueId,
    dim: usize,
    local: &[usize],
    location: Location,
) -> Result<ValueId> {
    let k = out.ty(part).shape[0];
    let x = reshape(out, part, [&[k][..], local].concat(), location)?;
    let perm: Vec<usize> = (1..=dim)
        .chain(std::iter::once(0))
        .chain(dim + 1..=local.len())
        .collect();
    let x = transpose(out, x, perm, location)?;
    let mut gathered = local.to_vec();
    gathered[dim] *= k;
    reshape(out, x, gathered, location)
}

/// `x` transposed by `perm`, or `x` itself if `perm` is the identity.
fn transpose(
    out: &mut Program,
    x: ValueId,
    perm: Vec<usize>,
    location: Location,
) -> Result<ValueId> {
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(x);
    }
    out.push_op(Op::Transpose(perm), &[x], location)
}

/// `x` reshaped to `shape`, or `x` itself if it has that shape.
fn reshape(
    out: &mut Program,
    x: ValueId,
    shape: Vec<usize>,
    location: Location,
) -> Result<ValueId> {
    if out.ty(x).shape == shape {
        return Ok(x);
    }
    out.push_op(Op::Reshape(shape), &[x], location)
}
