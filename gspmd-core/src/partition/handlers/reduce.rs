//! `reduce`: a local reduce over the block, then the pending sum is reduced across the
//! devices that split the reduced dims — by `all_reduce`, by `reduce_scatter` when the
//! result is split on that axis, or left unreduced when the target keeps it so.

use super::super::emit::Emitter;
use super::super::mask::mask_padding;
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::with_dims;
use crate::error::Result;
use crate::ir::{Op, ReduceKind, TensorType};
use crate::sharding::Sharding;

/// The identity of `kind` (as f64; converted to the element type when emitted).
pub(super) fn identity(kind: ReduceKind) -> f64 {
    match kind {
        ReduceKind::Sum => 0.0,
        ReduceKind::Max => f64::NEG_INFINITY,
        ReduceKind::Min => f64::INFINITY,
    }
}

pub(super) fn reduce(
    em: &mut Emitter,
    kind: ReduceKind,
    dims: &[usize],
    x: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let rank = x.global.rank();
    let kept: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
    // Reduced dims keep their axes (those become the pending sum); kept dims take the
    // longest prefix of the target's axes that the reduced dims do not use (the rest
    // arrives by reduce_scatter).
    let on_reduced: Vec<String> = dims
        .iter()
        .flat_map(|&d| x.sharding.dims[d].axes.clone())
        .collect();
    let mut want = vec![Vec::new(); rank];
    for &d in dims {
        want[d] = x.sharding.dims[d].axes.clone();
    }
    for (r, &d) in kept.iter().enumerate() {
        want[d] = target.dims[r]
            .axes
            .iter()
            .take_while(|a| !on_reduced.contains(a))
            .cloned()
            .collect();
    }
    let x = reshard(em, x, &with_dims(want.clone(), Vec::new()))?;
    let masked = mask_padding(em, &x, dims, identity(kind))?;
    let mut id = em.emit(
        Op::Reduce {
            kind,
            dims: dims.to_vec(),
        },
        &[masked],
    )?;
    let global = TensorType::new(
        kept.iter().map(|&d| x.global.shape[d]).collect::<Vec<_>>(),
        x.global.dtype,
    );
    let result_dims: Vec<Vec<String>> = kept.iter().map(|&d| want[d].clone()).collect();
    let mut pending = on_reduced;
    if kind != ReduceKind::Sum && !pending.is_empty() {
        // Only sums may stay pending: combine maxima and minima right away.
        let group = em.group(&pending);
        id = em.emit(Op::AllReduce { group, kind }, &[id])?;
        pending.clear();
    }
    Ok(PValue {
        id,
        global,
        sharding: with_dims(result_dims, pending),
    })
}
