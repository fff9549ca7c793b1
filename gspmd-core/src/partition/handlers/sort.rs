//! `argsort`: the sorted dim is made whole (every index depends on the whole lane), the
//! other dims keep the target's axes, and the local op sorts. When the operand is split
//! along the sorted dim, propagation has moved that split to another dim of the result
//! (`propagation::registry::moved_sort_splits`, XLA's `HandleSort`): the reshard is one
//! all-to-all, not a gather; a target without the moved split (an annotated result)
//! gathers the dim.

use super::super::emit::Emitter;
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::with_dims;
use crate::error::Result;
use crate::ir::Node;
use crate::sharding::Sharding;

pub(super) fn argsort(
    em: &mut Emitter,
    node: &Node,
    dim: usize,
    x: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let mut dims: Vec<Vec<String>> = target.dims.iter().map(|d| d.axes.clone()).collect();
    dims[dim].clear();
    let want = with_dims(dims, Vec::new());
    let x = reshard(em, x, &want)?;
    let id = em.emit(node.op.clone(), &[x.id])?;
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding: want,
    })
}
