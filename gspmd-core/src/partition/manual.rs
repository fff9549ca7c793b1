//! A manual region (`shard_map`, [`crate::ir::Flow::Manual`]) in the per-device
//! program: `handlers::flow` reshards the operands to the region's boundary and
//! partitions the body over the automatic axes like any region; the per-device body is
//! then emitted in place, node for node. Its collectives name manual axes and become the
//! runtime's collectives over those axes' device groups; inside the body they are
//! partitioned by [`collective`]: the dims they gather, scatter or exchange are made
//! whole along automatic axes first, the others stay as they are.

use crate::error::Result;
use crate::ir::{Node, ValueId, moved_dims};
use crate::partition::emit::Emitter;
use crate::partition::reshard::reshard;
use crate::partition::value::PValue;
use crate::sharding::Sharding;

/// Partitions a collective (or `axis_index`) of a manual region's body over the
/// automatic axes: the operand resharded to `target` without pending sums, and with the
/// dims the op gathers, scatters or exchanges whole (each device's piece of such a dim
/// must be the whole block dim); then the op on the local piece, over the same manual
/// axes (devices sharing their automatic coordinates hold corresponding pieces).
pub(super) fn collective(
    em: &mut Emitter,
    node: &Node,
    operands: &[PValue],
    target: &Sharding,
) -> Result<PValue> {
    let mut sharding = super::handlers::reduced(target);
    for d in moved_dims(&node.op) {
        if let Some(dim) = sharding.dims.get_mut(d) {
            dim.axes.clear();
        }
    }
    let locals = (operands.iter())
        .map(|x| Ok(reshard(em, x, &sharding)?.id))
        .collect::<Result<Vec<ValueId>>>()?;
    Ok(PValue {
        id: em.emit(node.op.clone(), &locals)?,
        global: node.ty.clone(),
        sharding,
    })
}
