//! Combining collectives (XLA's `AllReduceCombiner`): all-reduces of a per-device
//! program over the same group, with the same reduce kind and dtype, and no dependency
//! path between them, become one all-reduce of their operands flattened and
//! concatenated, each result sliced back out. One round trip instead of several (the
//! gradient all-reduces of a data-parallel step); the same bytes.
//!
//! Every element is reduced over the same devices in the same order whether it travels
//! alone or in a combined buffer, so results are bitwise equal. Independence is judged
//! on the program with the groups formed so far merged into one node each, so combining
//! never makes a cycle; the program is then re-emitted in a topological order that keeps
//! the original order where it can (a combined all-reduce sits where its last member
//! was, and users of its earlier members move after it).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use crate::error::Result;
use crate::ir::{AxisGroup, DType, Node, Op, Program, ReduceKind, ValueId};
use crate::types::{Location, num_elements};

/// Combined all-reduces carry at most this many bytes per device (XLA's default
/// threshold for its all-reduce combiner, 30 MiB); an all-reduce over more is left alone.
pub(crate) const COMBINE_THRESHOLD_BYTES: usize = 30 * 1024 * 1024;

/// What all-reduces must share to be combined.
#[derive(Debug, Clone, PartialEq)]
struct Key {
    group: AxisGroup,
    kind: ReduceKind,
    dtype: DType,
}

/// All-reduces to combine into one, in program order.
#[derive(Debug, Clone)]
struct Combined {
    key: Key,
    members: Vec<ValueId>,
    bytes: usize,
}

/// `program` with its independent all-reduces of one group, kind and dtype combined, up
/// to [`COMBINE_THRESHOLD_BYTES`] each (see the module docs).
pub(crate) fn combine_all_reduces(program: &Program) -> Result<Program> {
    let users = program.users();
    let mut groups: Vec<Combined> = Vec::new();
    // `member_of[v]`: the group all-reduce `v` joined.
    let mut member_of: Vec<Option<usize>> = vec![None; program.nodes.len()];
    for v in program.values() {
        let node = program.node(v);
        let Op::AllReduce { group, kind } = &node.op else {
            continue;
        };
        let key = Key {
            group: group.clone(),
            kind: *kind,
            dtype: node.ty.dtype,
        };
        let bytes = node.ty.size_in_bytes();
        if bytes == 0 || bytes > COMBINE_THRESHOLD_BYTES {
            continue;
        }
        let joins = (0..groups.len()).rev().find(|&g| {
            let other = &groups[g];
            other.key == key
                && other.bytes + bytes <= COMBINE_THRESHOLD_BYTES
                && !reaches(&users, &groups, &member_of, &other.members, v)
                && !reaches(&users, &groups, &member_of, &[v], other.members[0])
        });
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
        return Ok(program.clone());
    }
    emit(program, &combined)
}

/// True if a path runs from any of `from` to `to` in `program`'s graph with each group
/// formed so far taken as one node (reaching a member reaches every member's users).
fn reaches(
    users: &[Vec<ValueId>],
    groups: &[Combined],
    member_of: &[Option<usize>],
    from: &[ValueId],
    to: ValueId,
) -> bool {
    let mut seen = vec![false; users.len()];
    let mut stack: Vec<ValueId> = Vec::new();
    let mut visit = |v: ValueId, stack: &mut Vec<ValueId>| {
        let alone = [v];
        let members = member_of[v.index()].map_or(&alone[..], |g| &groups[g].members[..]);
        for &m in members {
            if !std::mem::replace(&mut seen[m.index()], true) {
                stack.push(m);
            }
        }
    };
    for &v in from {
        visit(v, &mut stack);
    }
    while let Some(v) = stack.pop() {
        for &u in &users[v.index()] {
            if u == to {
                return true;
            }
            visit(u, &mut stack);
        }
    }
    false
}

/// `program` re-emitted with each of `combined` as one all-reduce, in a topological
/// order of the graph with each group one node, earliest original position first (a
/// group at its last member's).
fn emit(program: &Program, combined: &[&Combined]) -> Result<Program> {
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
    Ok(out)
}

/// Appends one all-reduce of `operands` (the members' operands in `out`) flattened and
/// concatenated, and each member's result sliced from it and reshaped back; returns the
/// members' new values, each carrying its member's name and sharding.
fn emit_combined(
    out: &mut Program,
    program: &Program,
    group: &Combined,
    operands: &[ValueId],
) -> Result<Vec<ValueId>> {
    let members: Vec<&Node> = group.members.iter().map(|m| program.node(*m)).collect();
    let location = members[0].location;
    let lengths: Vec<usize> = members.iter().map(|m| num_elements(&m.ty.shape)).collect();
    let mut flat = Vec::with_capacity(operands.len());
    for (&x, &len) in operands.iter().zip(&lengths) {
        flat.push(reshape(out, x, vec![len], location)?);
    }
    let joined = out.push_op(Op::Concatenate(0), &flat, location)?;
    let op = Op::AllReduce {
        group: group.key.group.clone(),
        kind: group.key.kind,
    };
    let reduced = out.push_op(op, &[joined], location)?;
    let mut results = Vec::with_capacity(members.len());
    let mut start = 0;
    for (member, len) in members.iter().zip(lengths) {
        let slice = Op::Slice {
            start: vec![start],
            limit: vec![start + len],
            stride: vec![1],
        };
        start += len;
        let part = out.push_op(slice, &[reduced], member.location)?;
        let result = reshape(out, part, member.ty.shape.clone(), member.location)?;
        let node = out.node_mut(result);
        node.name.clone_from(&member.name);
        node.sharding.clone_from(&member.sharding);
        results.push(result);
    }
    Ok(results)
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
