//! Common-subexpression elimination (XLA's `HloCSE`): a node computing what an earlier
//! node computes is merged into it.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use super::{Fate, Stage, rebuild};
use crate::ir::{Element, Literal, Node, Op, Program, ValueId, by_element, with_literal};

/// `program` with every node that equals an earlier one merged into it. Two nodes are
/// equal when they have the same op with the same attributes, the same operands (after
/// earlier merges, so whole equal chains merge), the same type, and the same
/// `annotation` and `sharding`: a `sharding_constraint` is kept per distinct
/// annotation, and after propagation differently sharded values stay apart. Constants
/// compare by bit pattern: a NaN constant equals itself, `0.0` and `-0.0` differ.
///
/// Parameters are the program's interface and are never merged. Before propagation,
/// values computable anywhere without communication are not merged either (see
/// [`Stage`]), but they compare equal, so their users merge (and an unused copy then
/// goes with dead code). Every op is a function
/// of its operands; the collectives of a per-device program are too, and since every
/// device runs the same program, merging two equal collectives drops the same one on
/// every device, so the devices still meet in the same collectives in the same order.
///
/// The first node survives with its location and name (it takes the name of a merged
/// node if it has none) and the reasons ([`Node::why`]) of all merged collectives. Cost: one hash per node, plus comparisons with earlier nodes
/// of the same hash.
pub(super) fn eliminate_common_subexpressions(program: &Program, stage: Stage) -> Program {
    let keep_apart = match stage {
        Stage::BeforePropagation => computable_anywhere(program),
        Stage::Sharded => vec![false; program.nodes.len()],
    };
    // `class[v]`: the first node equal to `v`. Nodes kept apart still get a class, so
    // that their users compare equal and merge.
    let mut class: Vec<ValueId> = program.values().collect();
    let mut fate = vec![Fate::Keep; program.nodes.len()];
    let mut seen: HashMap<u64, Vec<ValueId>> = HashMap::new();
    let mut operands = Vec::new();
    for v in program.values() {
        let node = program.node(v);
        if matches!(node.op, Op::Parameter { .. }) {
            continue;
        }
        operands.clear();
        operands.extend(node.operands.iter().map(|&o| class[o.index()]));
        let candidates = seen.entry(key_hash(node, &operands)).or_default();
        let found = candidates.iter().copied().find(|&first| {
            let earlier = program.node(first);
            let earlier_operands = earlier.operands.iter().map(|&o| class[o.index()]);
            earlier_operands.eq(operands.iter().copied()) && same_computation(earlier, node)
        });
        match found {
            Some(first) => {
                class[v.index()] = first;
                if !keep_apart[v.index()] {
                    fate[v.index()] = Fate::SameAs(first);
                }
            }
            None => candidates.push(v),
        }
    }
    rebuild(program, &fate)
}

/// For each value, whether every device can compute it at any sharding without
/// communication: it is not a parameter, and is a broadcast of a scalar (a scalar is
/// never split) or has only such operands (constants and iotas have none).
fn computable_anywhere(program: &Program) -> Vec<bool> {
    let mut anywhere = vec![false; program.nodes.len()];
    for (index, node) in program.nodes.iter().enumerate() {
        let scalar_broadcast = matches!(node.op, Op::Broadcast { .. })
            && node.operands.iter().all(|&o| program.ty(o).rank() == 0);
        anywhere[index] = !matches!(node.op, Op::Parameter { .. })
            && (scalar_broadcast || node.operands.iter().all(|o| anywhere[o.index()]));
    }
    anywhere
}

/// A hash of everything [`same_computation`] compares, with `operands` standing for the
/// node's operands. Op attributes enter through their `Debug` form, which names every
/// attribute of every op; a constant's elements enter by bit pattern.
fn key_hash(node: &Node, operands: &[ValueId]) -> u64 {
    let mut h = DefaultHasher::new();
    match &node.op {
        Op::Constant(literal) => hash_literal_bits(literal, &mut h),
        op => format!("{op:?}").hash(&mut h),
    }
    operands.hash(&mut h);
    node.ty.hash(&mut h);
    node.annotation.hash(&mut h);
    node.sharding.hash(&mut h);
    h.finish()
}

/// True if `a` and `b` compute the same value from the same operands: equal ops
/// (constants bitwise), types, annotations and shardings. Operands are compared by
/// the caller.
pub(crate) fn same_computation(a: &Node, b: &Node) -> bool {
    let same_op = match (&a.op, &b.op) {
        (Op::Constant(x), Op::Constant(y)) => same_bits(x, y),
        (x, y) => x == y,
    };
    same_op && a.ty == b.ty && a.annotation == b.annotation && a.sharding == b.sharding
}

fn hash_literal_bits(literal: &Literal, h: &mut impl Hasher) {
    literal.shape().hash(h);
    literal.dtype().hash(h);
    with_literal!(literal, a => a.iter().for_each(|x| x.bits().hash(h)));
}

/// Equal dtype, shape and element bit patterns.
fn same_bits(x: &Literal, y: &Literal) -> bool {
    fn same<T: Element>(x: &Literal, y: &Literal) -> bool {
        match (T::array(x), T::array(y)) {
            (Some(a), Some(b)) => {
                a.shape() == b.shape() && a.iter().zip(b).all(|(p, q)| p.bits() == q.bits())
            }
            _ => false,
        }
    }
    by_element!(x.dtype(), same(x, y))
}
