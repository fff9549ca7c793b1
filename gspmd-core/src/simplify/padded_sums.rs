//! Sums of zero-padded slabs as one concatenation: `add(pad(a, 0), pad(b, 0))`, where
//! `a` is padded after and `b` before along one dim so that together they tile it, is
//! `concatenate(a, b)`. Autodiff makes such sums for the gradient of a value read in
//! slices (a stacked layers' weight, each layer's slice's gradient padded back to the
//! stack and the pads added): the sum writes zeros over the whole stack per slab and
//! then adds them, where the concatenation only copies each slab once.

use crate::ir::{BinaryOp, Element, Op, Program, ValueId, with_literal};

/// `program` with every `add` whose operands, through nested `add`s read by nothing
/// else, are two or more pads that tile one dim replaced by the concatenation of the
/// padded values along it. A pad qualifies when its padding value is a zero constant
/// (either sign), it has no interior padding, no negative padding, and pads only that
/// dim; the pads' slabs must cover the dim once each, without gap or overlap. The
/// replaced `add` keeps its id, type, sharding, name and location; the pads and inner
/// `add`s it no longer reads are left for dead-code elimination.
///
/// The result equals the sum as IEEE values; in the bits, an element `-0.0` of a slab
/// stays `-0.0`, where adding the `+0.0` padding gave `+0.0`.
pub(super) fn join_padded_sums(program: &Program) -> Option<Program> {
    let users = program.users();
    let mut out: Option<Program> = None;
    for v in program.values() {
        let Some((dim, slabs)) = tiling_pads(program, &users, v) else {
            continue;
        };
        let out = out.get_or_insert_with(|| program.clone());
        let node = out.node_mut(v);
        node.op = Op::Concatenate(dim);
        node.operands = slabs;
    }
    out
}

/// For an `add` at `v` whose leaves (see [`join_padded_sums`]) are pads tiling one dim:
/// that dim and the padded values in order along it.
fn tiling_pads(
    program: &Program,
    users: &[Vec<ValueId>],
    v: ValueId,
) -> Option<(usize, Vec<ValueId>)> {
    let node = program.node(v);
    if !matches!(node.op, Op::Binary(BinaryOp::Add)) {
        return None;
    }
    let mut leaves = Vec::new();
    collect_leaves(program, users, v, &mut leaves);
    if leaves.len() < 2 {
        return None;
    }
    let extent = |d: usize| node.ty.shape[d] as i64;
    // Each leaf: (the dim it pads, where its slab starts, its slab's length, the value).
    let mut slabs = Vec::with_capacity(leaves.len());
    for leaf in leaves {
        let pad = program.node(leaf);
        let Op::Pad {
            low,
            high,
            interior,
        } = &pad.op
        else {
            return None;
        };
        let (&operand, &fill) = (pad.operands.first()?, pad.operands.get(1)?);
        if !is_zero(program, fill) || interior.iter().any(|&k| k != 0) {
            return None;
        }
        if low.iter().chain(high).any(|&p| p < 0) {
            return None;
        }
        let mut padded = (0..low.len()).filter(|&d| low[d] != 0 || high[d] != 0);
        let dim = padded.next()?;
        if padded.next().is_some() {
            return None;
        }
        let length = extent(dim) - low[dim] - high[dim];
        slabs.push((dim, low[dim], length, operand));
    }
    let dim = slabs[0].0;
    slabs.sort_by_key(|&(_, start, _, _)| start);
    let mut next = 0;
    for &(d, start, length, _) in &slabs {
        if d != dim || start != next {
            return None;
        }
        next = start + length;
    }
    (next == extent(dim)).then(|| (dim, slabs.into_iter().map(|s| s.3).collect()))
}

/// The operands of the `add` at `v`, with each operand that is itself an `add` read
/// only by `v` replaced by its own operands, recursively.
fn collect_leaves(
    program: &Program,
    users: &[Vec<ValueId>],
    v: ValueId,
    leaves: &mut Vec<ValueId>,
) {
    for &o in &program.node(v).operands {
        // (An operand read twice gives overlapping slabs, which do not tile.)
        let inner = matches!(program.node(o).op, Op::Binary(BinaryOp::Add))
            && users[o.index()].as_slice() == [v];
        if inner {
            collect_leaves(program, users, o, leaves);
        } else {
            leaves.push(o);
        }
    }
}

/// Whether `v` is a constant whose elements are all zero (`0.0` or `-0.0`).
fn is_zero(program: &Program, v: ValueId) -> bool {
    fn zeros<T: Element>(a: &ndarray::ArrayD<T>) -> bool {
        a.iter().all(|x| x.to_f64() == 0.0)
    }
    match &program.node(v).op {
        Op::Constant(lit) => with_literal!(lit, a => zeros(a)),
        _ => false,
    }
}
