//! `cumsum` / `cumprod` ([`Op::Cumulative`]) along a dim the target splits: a local scan
//! of each block, then each block's total (one element per lane) is all-gathered over
//! the dim's axes, the totals of the blocks before this one (by `axis_index`; after it
//! when reversed) are combined, and the combination is added to (multiplied into) the
//! local scan. The only communication is that all-gather of `K` totals per lane, never
//! the data. Other dims pass through with the target's axes.

use super::super::emit::Emitter;
use super::super::mask::mask_padding;
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::reduced;
use crate::error::Result;
use crate::ir::{BinaryOp, CompareOp, CumulativeKind, DType, Op};
use crate::sharding::Sharding;

pub(super) fn cumulative(
    em: &mut Emitter,
    (kind, dim, reverse): (CumulativeKind, usize, bool),
    x: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let want = reduced(target);
    let x = reshard(em, x, &want)?;
    let axes = want.dims[dim].axes.clone();
    let op = |dim, reverse| Op::Cumulative { kind, dim, reverse };
    let result = |id| PValue {
        id,
        global: x.global.clone(),
        sharding: want.clone(),
    };
    let chunk = em.shape(x.id)[dim];
    if em.mesh.axes_size(&axes) == 1 || chunk == 0 {
        let id = em.emit(op(dim, reverse), &[x.id])?;
        return Ok(result(id));
    }
    // Padding (past the end of the dim) must not enter a total or a reversed scan.
    let block = mask_padding(em, &x, &[dim], kind.identity())?;
    let scan = em.emit(op(dim, reverse), &[block])?;
    let local = em.shape(scan);
    let last = if reverse { 0 } else { chunk - 1 };
    let total = em.slice_dim(scan, dim, last, last + 1)?;
    let group = em.group(&axes);
    let totals = em.emit(Op::AllGather { group, dim }, &[total])?;
    // Keep the totals of the blocks this one continues: group index below ours (above
    // when reversed); the identity stands in for the others.
    let shape = em.shape(totals);
    let index = em.emit(
        Op::Iota {
            shape: shape.clone(),
            dim,
            dtype: DType::I32,
        },
        &[],
    )?;
    let ours = em.emit(Op::AxisIndex(em.group(&axes)), &[])?;
    let ours = em.splat(ours, &shape)?;
    let before = if reverse {
        CompareOp::Gt
    } else {
        CompareOp::Lt
    };
    let before = em.emit(Op::Compare(before), &[index, ours])?;
    let identity = em.scalar(x.global.dtype, kind.identity())?;
    let identity = em.splat(identity, &shape)?;
    let kept = em.emit(Op::Select, &[before, totals, identity])?;
    // Their combination: the last element of their scan.
    let combined = em.emit(op(dim, false), &[kept])?;
    let k = shape[dim];
    let carry = em.slice_dim(combined, dim, k - 1, k)?;
    let carry = em.emit(
        Op::Broadcast {
            shape: local.clone(),
            dims: (0..local.len()).collect(),
        },
        &[carry],
    )?;
    let combine = match kind {
        CumulativeKind::Sum => BinaryOp::Add,
        CumulativeKind::Prod => BinaryOp::Mul,
    };
    let id = em.emit(Op::Binary(combine), &[carry, scan])?;
    Ok(result(id))
}
