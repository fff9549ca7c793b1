//! Float normalisation (XLA-CPU's): arithmetic on bf16 and f16 runs in f32.
//!
//! An op that computes (arithmetic, comparisons, contractions, reductions, scans, sorts,
//! scatters) with a bf16 or f16 operand or result gets its narrow operands converted to
//! f32 (exact), runs the f32 kernel, and has its result rounded once to the narrow dtype
//! (to nearest even). So a dot or a sum accumulates in f32 and rounds once, and every op
//! rounds at the same point wherever it runs: the reference interpreter and the
//! per-device runtime share these kernels, so a bf16 program rounds alike on one device
//! and on a mesh. Ops that only move data (reshape, transpose, slice, pad, concatenate,
//! broadcast, gather, dynamic slices, reverse) and `convert` work on the narrow type
//! itself, as do the collectives (`communicator::combine` reduces them in f32).
//!
//! This is the one place that decides which ops widen: [`computes`] matches every op.

use std::borrow::Cow;

use super::{Operand, Operands, eval_typed};
use crate::ir::{DType, Literal, Op, TensorType};

/// Whether `op` on `operands` with type `result` runs in f32: it computes
/// ([`computes`]) and an operand or the result is a narrow float.
pub(super) fn computes_wide(op: &Op, operands: &[Operand<'_>], result: &TensorType) -> bool {
    let narrow =
        result.dtype.is_narrow_float() || operands.iter().any(|o| o.dtype().is_narrow_float());
    narrow && computes(op)
}

/// Whether `op` does arithmetic on its elements (rather than moving them or making
/// them: `iota`, `constant` and `convert` make narrow values directly).
fn computes(op: &Op) -> bool {
    match op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Reduce { .. }
        | Op::DotGeneral(_)
        | Op::ReduceWindow { .. }
        | Op::Convolution(_)
        | Op::Scatter { .. }
        | Op::Cumulative { .. }
        | Op::Argsort { .. } => true,
        Op::Parameter { .. }
        | Op::Constant(_)
        | Op::Iota { .. }
        | Op::RandomBits { .. }
        | Op::Convert(_)
        | Op::ShardingConstraint
        | Op::PropagationBarrier(_)
        | Op::Broadcast { .. }
        | Op::Reshape(_)
        | Op::Transpose(_)
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Concatenate(_)
        | Op::Gather(_)
        | Op::DynamicSlice(_)
        | Op::DynamicUpdateSlice
        | Op::Reverse(_)
        | Op::Flow { .. }
        | Op::AxisIndex(_)
        | Op::AllReduce { .. }
        | Op::AllGather { .. }
        | Op::ReduceScatter { .. }
        | Op::AllToAll { .. }
        | Op::CollectivePermute { .. }
        | Op::CollectiveShift { .. } => false,
    }
}

/// `op` computed in f32: narrow operands widened, the f32 kernel run, the result
/// rounded to `result`'s dtype if that is narrow.
pub(super) fn eval_wide(
    op: &Op,
    operands: &mut Operands<'_>,
    result: &TensorType,
) -> Result<Literal, String> {
    let mut operands = operands
        .drain(..)
        .map(widen)
        .collect::<Result<Operands<'_>, String>>()?;
    let dtype = result.dtype;
    let wide = TensorType::new(
        result.shape.clone(),
        if dtype.is_narrow_float() {
            DType::F32
        } else {
            dtype
        },
    );
    let out = eval_typed(op, &mut operands, &wide)?;
    Ok(if dtype.is_narrow_float() {
        out.convert(dtype)
    } else {
        out
    })
}

/// `x` in f32 if it is a narrow float (exact), else unchanged.
fn widen(x: Operand<'_>) -> Result<Operand<'_>, String> {
    if !x.dtype().is_narrow_float() {
        return Ok(x);
    }
    Ok(Operand::Value(Cow::Owned(
        x.into_value()?.convert(DType::F32),
    )))
}
