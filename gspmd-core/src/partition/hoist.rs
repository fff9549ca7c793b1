//! Loop-invariant collectives hoisted out of loop bodies (XLA's while-loop invariant
//! code motion, for what the partitioner emitted): a collective in a partitioned `scan`
//! or `while` body whose operand depends on neither the carried values nor the
//! iteration's slices (an all-gather of a captured weight) runs once before the loop,
//! and the body captures its result. The tracer already keeps user ops on outer values
//! outside loops; this catches the collectives resharding captures inside them.
//!
//! Every device runs the same per-device program, so a hoisted collective is met by
//! all devices alike, also when the loop runs no iteration (then it runs once for
//! nothing). A hoisted value stays live for the whole loop, as in XLA.

use crate::error::Result;
use crate::ir::{Op, Program, ValueId};
use crate::partition::emit::Emitter;

/// Moves out of the partitioned loop `body` (its parameters from `variant` on are
/// captures, the rest change each iteration) each invariant value read by a variant
/// node or returned, whose computation holds a collective. Returns `None` when there is
/// none; else the *prelude*: a program taking the loop's operands (the body's parameters
/// as they were) and returning the hoisted values, which `body` now takes as new
/// trailing parameters, in that order.
pub(crate) fn hoist(body: &mut Program, variant: usize) -> Option<Program> {
    let n = body.nodes.len();
    let mut invariant = vec![false; n];
    let mut communicates = vec![false; n];
    for v in body.values() {
        let node = body.node(v);
        let (i, operands) = (v.index(), &node.operands);
        invariant[i] = match &node.op {
            Op::Parameter { index, .. } => *index >= variant,
            Op::Flow { .. } => false,
            _ => operands.iter().all(|o| invariant[o.index()]),
        };
        communicates[i] =
            node.op.is_collective() || operands.iter().any(|o| communicates[o.index()]);
    }
    // Read by a node that changes each iteration, or returned.
    let mut wanted = vec![false; n];
    for o in &body.outputs {
        wanted[o.index()] = true;
    }
    for (_, node) in (body.nodes.iter().enumerate()).filter(|(u, _)| !invariant[*u]) {
        for o in &node.operands {
            wanted[o.index()] = true;
        }
    }
    let is_param = |v: ValueId| matches!(body.node(v).op, Op::Parameter { .. });
    let hoisted: Vec<ValueId> = (body.values())
        .filter(|&v| invariant[v.index()] && communicates[v.index()] && wanted[v.index()])
        .filter(|&v| !is_param(v))
        .collect();
    if hoisted.is_empty() {
        return None;
    }
    let prelude = prelude(body, &hoisted);
    for &v in &hoisted {
        let index = body.params.len();
        let node = body.node_mut(v);
        node.op = Op::Parameter {
            index,
            ty: node.ty.clone(),
        };
        node.operands.clear();
        node.why.clear();
        body.params.push(v);
    }
    Some(prelude)
}

/// The program computing `outputs` of `body` from its parameters: those parameters,
/// then every node `outputs` depend on, in body order.
fn prelude(body: &Program, outputs: &[ValueId]) -> Program {
    let mut needed = vec![false; body.nodes.len()];
    let mut stack = outputs.to_vec();
    while let Some(v) = stack.pop() {
        if !std::mem::replace(&mut needed[v.index()], true) {
            stack.extend(body.node(v).operands.iter().copied());
        }
    }
    let mut out = Program::new(format!("{} (hoisted)", body.name));
    let mut ids: Vec<Option<ValueId>> = vec![None; body.nodes.len()];
    for &p in &body.params {
        ids[p.index()] = Some(out.push(body.node(p).clone()));
    }
    out.params = (body.params.iter())
        .filter_map(|p| ids[p.index()])
        .collect();
    let computed = |v: &ValueId| !matches!(body.node(*v).op, Op::Parameter { .. });
    for v in body.values().filter(|v| needed[v.index()] && computed(v)) {
        let mut node = body.node(v).clone();
        node.operands = (node.operands.iter())
            .filter_map(|o| ids[o.index()])
            .collect();
        ids[v.index()] = Some(out.push(node));
    }
    out.outputs = outputs.iter().filter_map(|o| ids[o.index()]).collect();
    out
}

/// Emits `prelude` (from [`hoist`]) before the loop, its parameters bound to `locals`
/// (the loop's per-device operands); returns the hoisted values. Each collective keeps
/// its reasons and its user's location.
pub(super) fn emit(
    em: &mut Emitter,
    prelude: &Program,
    locals: &[ValueId],
) -> Result<Vec<ValueId>> {
    let ids = em.inline(prelude, locals)?;
    for (node, &id) in prelude.nodes.iter().zip(&ids) {
        let copy = em.program.node_mut(id);
        if node.op.is_collective() && copy.op.is_collective() {
            copy.why.clone_from(&node.why);
            copy.location = node.location;
        }
    }
    Ok(prelude.outputs.iter().map(|o| ids[o.index()]).collect())
}
