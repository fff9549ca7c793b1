//! A manual region (`shard_map`, [`crate::ir::Flow::Manual`]) in the per-device
//! program: its body already is one, so once the operands are resharded to the
//! region's specs (`handlers::flow`) it is emitted in place, node for node. Its
//! collectives name manual axes and become the runtime's collectives over those axes'
//! device groups; automatic axes are replicated inside (the specs name manual axes only).

use crate::error::Result;
use crate::ir::{Op, Program, ValueId};
use crate::partition::emit::Emitter;

/// Emits `body` with its parameters bound to `locals` (the operands' blocks) and
/// returns the ids of its outputs. Each result node of an instance emits it again;
/// the simplification after partitioning merges the copies (equal nodes).
pub(super) fn inline(em: &mut Emitter, body: &Program, locals: &[ValueId]) -> Result<Vec<ValueId>> {
    let mut ids: Vec<ValueId> = Vec::with_capacity(body.nodes.len());
    for node in &body.nodes {
        let id = match &node.op {
            Op::Parameter { index, .. } => locals[*index],
            op => {
                let operands: Vec<ValueId> = node.operands.iter().map(|o| ids[o.index()]).collect();
                em.emit(op.clone(), &operands)?
            }
        };
        ids.push(id);
    }
    Ok(body.outputs.iter().map(|o| ids[o.index()]).collect())
}
