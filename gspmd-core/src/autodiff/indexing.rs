//! The VJP rules of gather and scatter. Indices get no cotangent.
//!
//! - `gather`: the cotangent is added back where the gather read it: a scatter-add
//!   into zeros at the start indices clamped as the gather clamped them (the scatter
//!   would skip an unclamped out-of-range start instead).
//! - `scatter_add`: the operand's cotangent is the result's; the updates' is the result's
//!   cotangent gathered at the updates' windows, zero for updates the scatter skipped.
//! - `scatter` (replace): the operand's cotangent is the result's with the written
//!   positions zeroed; the updates' as for `scatter_add`. This assumes the written
//!   positions distinct: with duplicates, every update to a position gets its cotangent,
//!   not only the one that won.

use crate::error::Result;
use crate::ir::index_arithmetic::{all_within, clamp_starts, start_range, zero_where_not};
use crate::ir::{Appender, GatherDims, Op, ScatterDims, ScatterKind, ValueId};

/// The cotangent of operand `i` (0: operand, 1: indices) of `gather(x, indices)`.
pub(super) fn gather(
    e: &mut Appender<'_>,
    dims: &GatherDims,
    [x, indices]: [ValueId; 2],
    ct: ValueId,
    i: usize,
) -> Result<Option<ValueId>> {
    if i != 0 || !e.ty(x).dtype.is_float() {
        return Ok(None);
    }
    let shape = e.shape(x);
    let starts = clamp_starts(e, indices, dims, &shape)?;
    let zeros = e.zeros_like(x)?;
    let scatter = Op::Scatter {
        dims: dims.to_scatter(),
        kind: ScatterKind::Add,
    };
    e.push(scatter, &[zeros, starts, ct]).map(Some)
}

/// The cotangent of operand `i` (0: operand, 1: indices, 2: updates) of
/// `scatter(x, indices, updates)` combining with `kind`.
pub(super) fn scatter(
    e: &mut Appender<'_>,
    dims: &ScatterDims,
    kind: ScatterKind,
    [x, indices, updates]: [ValueId; 3],
    ct: ValueId,
    i: usize,
) -> Result<Option<ValueId>> {
    let dtype = e.ty(x).dtype;
    if !dtype.is_float() {
        return Ok(None);
    }
    let ix = dims.indexing();
    let (shape, update_shape) = (e.shape(x), e.shape(updates));
    let sizes = ix.window_sizes(shape.len(), &update_shape);
    Ok(match (i, kind) {
        (0, ScatterKind::Add) => Some(ct),
        (0, ScatterKind::Replace) => {
            let zeros = e.zeros_like(x)?;
            let ones = e.full(&update_shape, dtype, 1.0)?;
            let replace = Op::Scatter {
                dims: dims.clone(),
                kind: ScatterKind::Replace,
            };
            let written = e.push(replace, &[zeros, indices, ones])?;
            let kept = e.rsub(1.0, written)?;
            Some(e.mul(ct, kept)?)
        }
        (2, _) => {
            let read = e.push(Op::Gather(dims.to_gather(sizes.clone())), &[ct, indices])?;
            let (lo, hi) = start_range(e, indices, ix, &shape, &sizes)?;
            let applied = all_within(e, indices, ix.index_vector_dim, lo, hi)?;
            let batch = ix.data_batch(update_shape.len());
            Some(zero_where_not(e, read, applied, &batch, dtype)?)
        }
        _ => None,
    })
}
