//! Padding masks for uneven dims: before a reduction or contraction over a dim whose
//! shards were rounded up, the padding is replaced by the reduction's identity so that
//! results stay exact.

use super::emit::Emitter;
use super::value::PValue;
use crate::error::Result;
use crate::ir::{BinaryOp, CompareOp, DType, Op, ValueId};

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
        // position = iota + block offset; valid where position < size.
        let iota = em.emit(
            Op::Iota {
                shape: local.clone(),
                dim: d,
                dtype: DType::I32,
            },
            &[],
        )?;
        let offset = em.block_offset(axes, c)?;
        let offset = em.splat(offset, &local)?;
        let pos = em.emit(Op::Binary(BinaryOp::Add), &[iota, offset])?;
        let size = em.scalar(DType::I32, size as f64)?;
        let size = em.splat(size, &local)?;
        let valid = em.emit(Op::Compare(CompareOp::Lt), &[pos, size])?;
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
