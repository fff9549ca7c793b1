//! Index arithmetic around gathers and scatters that the gradient rules and the
//! partitioner emit: index vectors built from scalars, start indices clamped so that a
//! window fits (a gather's semantics), and masks of the positions whose window fits (a
//! scatter's) or that lie in a device's block.

use super::indexing::{GatherDims, Indexing};
use super::op::Op;
use super::{BinaryOp, CompareOp, DType, Literal, ReduceKind, ValueId};
use crate::error::Result;

/// What the index arithmetic here needs of the program being built: the gradient
/// rules' `Appender` and the partitioner's emitter both provide it.
pub(crate) trait EmitOps {
    /// Appends `op(operands)`, typed by its shape rule.
    fn emit_op(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId>;
    /// The shape of `v`.
    fn shape_of(&self, v: ValueId) -> Vec<usize>;
}

/// An i32 array shaped like `indices` whose index vector components are the i32 scalars
/// `components` (one per component; along `index_vector_dim`, or the only one when that
/// dim is implicit).
pub(crate) fn per_component(
    e: &mut impl EmitOps,
    indices: ValueId,
    index_vector_dim: usize,
    components: &[ValueId],
) -> Result<ValueId> {
    let shape = e.shape_of(indices);
    if index_vector_dim >= shape.len() {
        return e.emit_op(
            Op::Broadcast {
                shape,
                dims: vec![],
            },
            &[components[0]],
        );
    }
    let parts = (components.iter())
        .map(|&c| e.emit_op(Op::Reshape(vec![1]), &[c]))
        .collect::<Result<Vec<_>>>()?;
    let vector = match parts.as_slice() {
        [one] => *one,
        _ => e.emit_op(Op::Concatenate(0), &parts)?,
    };
    e.emit_op(
        Op::Broadcast {
            shape,
            dims: vec![index_vector_dim],
        },
        &[vector],
    )
}

/// An i32 scalar constant.
pub(crate) fn i32_scalar(e: &mut impl EmitOps, value: i64) -> Result<ValueId> {
    let value = value.clamp(i32::MIN.into(), i32::MAX.into());
    e.emit_op(
        Op::Constant(Literal::full(&[], DType::I32, value as f64)),
        &[],
    )
}

/// `indices` with every element clamped to `[lo, hi]` (arrays shaped like it).
fn clamp_between(
    e: &mut impl EmitOps,
    indices: ValueId,
    lo: ValueId,
    hi: ValueId,
) -> Result<ValueId> {
    let below = e.emit_op(Op::Binary(BinaryOp::Min), &[indices, hi])?;
    e.emit_op(Op::Binary(BinaryOp::Max), &[below, lo])
}

/// The range of starts whose window fits, shaped like `indices`: component `k` may
/// lie in `[0, operand_shape[d] - window[d]]`, `d` the operand dim it starts.
pub(crate) fn start_range(
    e: &mut impl EmitOps,
    indices: ValueId,
    ix: Indexing<'_>,
    operand_shape: &[usize],
    window: &[usize],
) -> Result<(ValueId, ValueId)> {
    let zero = i32_scalar(e, 0)?;
    let vd = ix.index_vector_dim;
    let lo = per_component(e, indices, vd, &vec![zero; ix.index_map.len()])?;
    let highest = (ix.index_map.iter())
        .map(|&d| i32_scalar(e, operand_shape[d] as i64 - window[d] as i64))
        .collect::<Result<Vec<_>>>()?;
    let hi = per_component(e, indices, vd, &highest)?;
    Ok((lo, hi))
}

/// A gather's start `indices` clamped as the gather clamps them (into
/// [`start_range`]).
pub(crate) fn clamp_starts(
    e: &mut impl EmitOps,
    indices: ValueId,
    dims: &GatherDims,
    operand_shape: &[usize],
) -> Result<ValueId> {
    let (lo, hi) = start_range(
        e,
        indices,
        dims.indexing(),
        operand_shape,
        &dims.slice_sizes,
    )?;
    clamp_between(e, indices, lo, hi)
}

/// Per batch position of `indices` (its shape without the vector dim), whether every
/// component of the index vector lies in `[lo, hi]` (arrays shaped like `indices`).
pub(crate) fn all_within(
    e: &mut impl EmitOps,
    indices: ValueId,
    index_vector_dim: usize,
    lo: ValueId,
    hi: ValueId,
) -> Result<ValueId> {
    let above = e.emit_op(Op::Compare(CompareOp::Ge), &[indices, lo])?;
    let below = e.emit_op(Op::Compare(CompareOp::Le), &[indices, hi])?;
    let inside = e.emit_op(Op::Binary(BinaryOp::And), &[above, below])?;
    if index_vector_dim >= e.shape_of(indices).len() {
        return Ok(inside);
    }
    // All components: the minimum over the vector dim of 0/1.
    let ones = e.emit_op(Op::Convert(DType::I32), &[inside])?;
    let all = e.emit_op(
        Op::Reduce {
            kind: ReduceKind::Min,
            dims: vec![index_vector_dim],
        },
        &[ones],
    )?;
    let one = i32_scalar(e, 1)?;
    let one = e.emit_op(
        Op::Broadcast {
            shape: e.shape_of(all),
            dims: vec![],
        },
        &[one],
    )?;
    e.emit_op(Op::Compare(CompareOp::Eq), &[all, one])
}

/// `data` (a gather's result or a scatter's updates, batch dims `data_batch`) with the
/// batch positions where `keep` (over the batch dims) is false set to zero.
pub(crate) fn zero_where_not(
    e: &mut impl EmitOps,
    data: ValueId,
    keep: ValueId,
    data_batch: &[usize],
    dtype: DType,
) -> Result<ValueId> {
    let shape = e.shape_of(data);
    let keep = e.emit_op(
        Op::Broadcast {
            shape: shape.clone(),
            dims: data_batch.to_vec(),
        },
        &[keep],
    )?;
    let zero = e.emit_op(Op::Constant(Literal::full(&[], dtype, 0.0)), &[])?;
    let zeros = e.emit_op(
        Op::Broadcast {
            shape,
            dims: vec![],
        },
        &[zero],
    )?;
    e.emit_op(Op::Select, &[keep, data, zeros])
}
