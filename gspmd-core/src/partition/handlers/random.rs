//! `random_bits`: each device draws its own block. The value at a global index depends
//! only on the key and the index's counter, so a device runs the op on its block's
//! shape with the global counter strides and its block's first counter as the base:
//! no communication, and the same values as one device for every sharding.

use super::super::emit::Emitter;
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::reduced;
use crate::error::Result;
use crate::ir::random::RandomOutput;
use crate::ir::{BinaryOp, DType, Node, Op};
use crate::sharding::Sharding;

/// Partitions the `random_bits` `node` (counter `strides`, its `output`) on its `key`
/// and `base` operands towards `target`. A key output's word dim is made whole (the driver
/// reshards it to a target that splits it); pending sums in the target are not made.
pub(super) fn random_bits(
    em: &mut Emitter,
    node: &Node,
    (strides, output): (&[usize], RandomOutput),
    operands: &[PValue],
    target: &Sharding,
) -> Result<PValue> {
    let mut sharding = reduced(target);
    if output == RandomOutput::Key
        && let Some(words) = sharding.dims.last_mut()
    {
        words.axes.clear();
    }
    let local = sharding.local_shape(em.mesh, &node.ty.shape);
    let key = reshard(em, &operands[0], &Sharding::replicated(1))?;
    let mut base = reshard(em, &operands[1], &Sharding::replicated(0))?.id;
    for (d, &stride) in strides.iter().enumerate() {
        let axes = &sharding.dims[d].axes;
        if axes.is_empty() {
            continue;
        }
        // The block's first counter along `d`: its shard index times the block's
        // counters (mod 2^32, as the op counts).
        let step = (local[d] as u64).wrapping_mul(stride as u64) as u32 as i32;
        let index = em.block_offset(axes, 1)?;
        let step = em.scalar(DType::I32, f64::from(step))?;
        let offset = em.emit(Op::Binary(BinaryOp::Mul), &[index, step])?;
        base = em.emit(Op::Binary(BinaryOp::Add), &[base, offset])?;
    }
    let op = Op::RandomBits {
        shape: local[..strides.len()].to_vec(),
        strides: strides.to_vec(),
        output,
    };
    let id = em.emit(op, &[key.id, base])?;
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding,
    })
}
