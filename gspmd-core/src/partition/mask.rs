//! Masks by global position: before a reduction or contraction over a dim whose shards
//! were rounded up, the padding is replaced by the reduction's identity so that results
//! stay exact; a windowed block (see `halo`) has its positions outside the global array
//! replaced by the pad value.

use super::emit::Emitter;
use super::value::PValue;
use crate::error::Result;
use crate::ir::{BinaryOp, CompareOp, DType, Op, ValueId};

/// An i32 array of `shape`: the global position `axis_index(axes) * stride + first + k`
/// of the element at local index `k` along `dim` (a block laid out in group order,
/// starting `first` elements from its shard's start).
pub(crate) fn global_positions(
    em: &mut Emitter,
    shape: &[usize],
    dim: usize,
    (axes, stride, first): (&[String], usize, i64),
) -> Result<ValueId> {
    let iota = em.emit(
        Op::Iota {
            shape: shape.to_vec(),
            dim,
            dtype: DType::I32,
        },
        &[],
    )?;
    let mut offset = em.block_offset(axes, stride)?;
    if first != 0 {
        let first = em.scalar(DType::I32, first as f64)?;
        offset = em.emit(Op::Binary(BinaryOp::Add), &[offset, first])?;
    }
    let offset = em.splat(offset, shape)?;
    em.emit(Op::Binary(BinaryOp::Add), &[iota, offset])
}

/// A bool array of `shape`: whether the element at local index `k` along `dim` holds a
/// global position (see [`global_positions`]) inside `0..size`.
pub(crate) fn positions_inside(
    em: &mut Emitter,
    shape: &[usize],
    dim: usize,
    (axes, stride, first): (&[String], usize, i64),
    size: usize,
) -> Result<ValueId> {
    let pos = global_positions(em, shape, dim, (axes, stride, first))?;
    let size = em.scalar(DType::I32, size as f64)?;
    let size = em.splat(size, shape)?;
    let below = em.emit(Op::Compare(CompareOp::Lt), &[pos, size])?;
    if first >= 0 {
        return Ok(below);
    }
    let zero = em.scalar(DType::I32, 0.0)?;
    let zero = em.splat(zero, shape)?;
    let above = em.emit(Op::Compare(CompareOp::Ge), &[pos, zero])?;
    em.emit(Op::Binary(BinaryOp::And), &[below, above])
}

/// `v`'s local block with the padding along each of `dims` set to `identity`. Emits
/// nothing for dims whose size divides evenly.
pub(crate) fn mask_padding(
    em: &mut Emitter,
    v: &PValue,
    dims: &[usize],
    identity: f64,
) -> Result<ValueId> {
    let local = em.shape(v.id);
    let mut mask: Option<ValueId> = None;
    for &d in dims {
        let axes = &v.sharding.dims[d].axes;
        let size = v.global.shape[d];
        let c = local[d];
        if c * em.mesh.axes_size(axes) == size {
            continue;
        }
        let valid = positions_inside(em, &local, d, (axes, c, 0), size)?;
        mask = Some(match mask {
            Some(m) => em.emit(Op::Binary(BinaryOp::And), &[m, valid])?,
            None => valid,
        });
    }
    let Some(mask) = mask else { return Ok(v.id) };
    let fill = em.scalar(v.global.dtype, identity)?;
    let fill = em.splat(fill, &local)?;
    em.emit(Op::Select, &[mask, v.id, fill])
}
