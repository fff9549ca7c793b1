//! Regathering (PyTorch FSDP's `reshard_after_forward`): an all-gather whose result is
//! read by an earlier and a later cluster of users (in a training step, a weight read
//! by the forward and by the backward pass) is issued a second time right before its
//! first later user, so that the gathered value dies after the earlier cluster instead
//! of being held across the gap. Memory for bytes received: each regathered value is
//! received twice per run.
//!
//! Only gathers that are cheap to re-issue qualify ([`candidates`]): the operand is a
//! parameter, or is computed from parameters by data movement only (reshape, transpose,
//! slice, convert, concatenate, broadcast), and that chain is cloned with the gather.
//! The rewrite runs on a per-device program after common-subexpression elimination
//! (which would merge the copy back into the first gather) and before combining, which
//! must leave the copies alone (see `combine_collectives`'s `apart`).

use std::collections::HashMap;

use crate::ir::{Op, Program, ValueId};

/// An all-gather of a per-device program that [`regather`] can issue again for its
/// later users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The all-gather.
    pub gather: ValueId,
    /// The nodes computing its operand from parameters, in program order (empty when
    /// the operand is a parameter): cloned with the gather.
    pub chain: Vec<ValueId>,
    /// The parameter the operand is computed from (the first, for a concatenation).
    pub root: ValueId,
    /// Its last user before the largest gap between consecutive users (program order).
    pub last_earlier: ValueId,
    /// Its users after that gap: they read the copy, issued right before the first.
    pub later: Vec<ValueId>,
}

/// True for the ops a gather's operand chain may contain: data movement, which costs no
/// arithmetic and no communication to redo.
fn moves_data(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Slice { .. }
            | Op::Convert(_)
            | Op::Concatenate(_)
            | Op::Broadcast { .. }
    )
}

/// The top-level all-gathers of `program` worth regathering, in program order: an
/// operand computed from parameters by data movement only (see the module docs), not an
/// output, and at least two users with at least one other node between the two
/// clusters (split at the largest gap between consecutive users; the first such gap on
/// a tie).
pub(crate) fn candidates(program: &Program) -> Vec<Candidate> {
    let users = program.users();
    let mut found = Vec::new();
    for g in program.values() {
        let node = program.node(g);
        if !matches!(node.op, Op::AllGather { .. }) || program.outputs.contains(&g) {
            continue;
        }
        let Some((chain, root)) = operand_chain(program, node.operands[0]) else {
            continue;
        };
        let users = &users[g.index()];
        let Some(split) = (1..users.len()).max_by_key(|&i| {
            let gap = users[i].index() - users[i - 1].index();
            (gap, std::cmp::Reverse(i))
        }) else {
            continue;
        };
        if users[split].index() - users[split - 1].index() < 2 {
            continue;
        }
        found.push(Candidate {
            gather: g,
            chain,
            root,
            last_earlier: users[split - 1],
            later: users[split..].to_vec(),
        });
    }
    found
}

/// The non-parameter nodes `operand` is computed from, in program order, and the first
/// parameter reached; `None` unless every path ends at a parameter through data
/// movement only.
fn operand_chain(program: &Program, operand: ValueId) -> Option<(Vec<ValueId>, ValueId)> {
    let mut chain = Vec::new();
    let mut root = None;
    let mut stack = vec![operand];
    while let Some(v) = stack.pop() {
        let node = program.node(v);
        if matches!(node.op, Op::Parameter { .. }) {
            root = Some(root.map_or(v, |r: ValueId| r.min(v)));
        } else if moves_data(&node.op) && !node.operands.is_empty() {
            if !chain.contains(&v) {
                chain.push(v);
                stack.extend(&node.operands);
            }
        } else {
            return None;
        }
    }
    chain.sort();
    Some((chain, root?))
}

/// `program` with each of `chosen` (from [`candidates`] of `program`) issued a second
/// time: its operand chain and the gather cloned (op, type, sharding, name, location
/// and reasons kept) right before its first later user, and its later users reading the
/// copy. Returns the program, each chosen gather's copy in it (in `chosen` order), and
/// each old value's new id. Nodes keep their order otherwise and are renumbered (node
/// `i` defines `%i`, operands earlier); parameters and outputs keep their positions;
/// propagation origins are dropped (as combining does: a per-device program has none
/// it needs). With nothing chosen, `program` as it is.
pub(crate) fn regather(
    program: &Program,
    chosen: &[&Candidate],
) -> (Program, Vec<ValueId>, Vec<ValueId>) {
    if chosen.is_empty() {
        return (program.clone(), Vec::new(), program.values().collect());
    }
    // Node index -> the chosen candidates whose copy goes right before it.
    let mut before: HashMap<usize, Vec<usize>> = HashMap::new();
    for (c, candidate) in chosen.iter().enumerate() {
        before
            .entry(candidate.later[0].index())
            .or_default()
            .push(c);
    }
    // (user, gather) -> the copy that user reads instead.
    let mut redirect: HashMap<(ValueId, ValueId), ValueId> = HashMap::new();
    let mut ids: Vec<ValueId> = Vec::with_capacity(program.nodes.len());
    let mut copies = vec![ValueId(0); chosen.len()];
    let mut out = Program::new(program.name.clone());
    for v in program.values() {
        for &c in before.get(&v.index()).into_iter().flatten() {
            let candidate = chosen[c];
            let mut cloned: HashMap<ValueId, ValueId> = HashMap::new();
            for &n in candidate.chain.iter().chain([&candidate.gather]) {
                let id = copy_node(&mut out, program, n, |o| {
                    cloned.get(&o).copied().unwrap_or(ids[o.index()])
                });
                cloned.insert(n, id);
            }
            copies[c] = cloned[&candidate.gather];
            for &u in &candidate.later {
                redirect.insert((u, candidate.gather), copies[c]);
            }
        }
        let id = copy_node(&mut out, program, v, |o| {
            redirect.get(&(v, o)).copied().unwrap_or(ids[o.index()])
        });
        ids.push(id);
    }
    out.params = program.params.iter().map(|p| ids[p.index()]).collect();
    out.outputs = program.outputs.iter().map(|o| ids[o.index()]).collect();
    (out, copies, ids)
}

/// Appends a copy of `program`'s node `v` to `out` with each operand `o` read as
/// `operand(o)` and no propagation origin; returns its id.
fn copy_node(
    out: &mut Program,
    program: &Program,
    v: ValueId,
    operand: impl Fn(ValueId) -> ValueId,
) -> ValueId {
    let node = program.node(v);
    let mut copy = node.clone();
    copy.operands = node.operands.iter().map(|&o| operand(o)).collect();
    copy.origin = None;
    out.push(copy)
}
