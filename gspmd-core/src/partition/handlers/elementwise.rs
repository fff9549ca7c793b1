//! Elementwise ops (unary, binary, compare, select, convert): operands resharded to the
//! result's sharding, then the op runs locally.

use super::super::emit::Emitter;
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::reduced;
use crate::error::Result;
use crate::ir::{BinaryOp, Node, Op, UnaryOp};
use crate::sharding::Sharding;

/// True for ops through which a pending sum may pass unchanged (linear in every operand).
fn is_linear(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(UnaryOp::Neg) | Op::Binary(BinaryOp::Add | BinaryOp::Sub)
    )
}

pub(super) fn elementwise(
    em: &mut Emitter,
    node: &Node,
    operands: &[PValue],
    target: &Sharding,
) -> Result<PValue> {
    // A linear op keeps pending sums of the target; others need full values.
    let want = if is_linear(&node.op) {
        target.clone()
    } else {
        reduced(target)
    };
    let mut ids = Vec::with_capacity(operands.len());
    for o in operands {
        let mut w = want.clone();
        // Operands of another dtype (select's predicate) share the tiling.
        w.dims.truncate(o.global.rank());
        ids.push(reshard(em, o, &w)?.id);
    }
    let id = em.emit(node.op.clone(), &ids)?;
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding: want,
    })
}
