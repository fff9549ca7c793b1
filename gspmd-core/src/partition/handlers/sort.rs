//! `argsort`: the sorted dim is made whole (gathered when split: every index depends on
//! the whole lane), the other dims keep the target's axes, and the local op sorts.

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
