//! `dot_general`: every dim of the operands and the result is a factor — batch (both
//! operands and result), free (one operand and result) or contracting (both operands).
//! Result factors take the target's axes; contracting factors keep the operands' axes.
//! Operands are resharded to that (gathering a free dim of one operand only when the
//! result is not split on it), the product runs locally on the blocks, and the partial
//! sums over the contracting axes are reduced by `all_reduce`, or `reduce_scatter` when
//! the result is split on that axis, or kept pending when the target is unreduced.

use super::super::emit::Emitter;
use super::super::mask::mask_padding;
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::with_dims;
use crate::error::Result;
use crate::ir::{DotDims, Op, TensorType};
use crate::sharding::Sharding;

pub(super) fn dot_general(
    em: &mut Emitter,
    dd: &DotDims,
    lhs: &PValue,
    rhs: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let axes = |v: &PValue, d: usize| v.sharding.dims[d].axes.clone();
    let bytes = |v: &PValue| v.global.size_in_bytes();
    let lhs_free: Vec<usize> = (0..lhs.global.rank())
        .filter(|d| !dd.lhs_batch.contains(d) && !dd.lhs_contracting.contains(d))
        .collect();
    let rhs_free: Vec<usize> = (0..rhs.global.rank())
        .filter(|d| !dd.rhs_batch.contains(d) && !dd.rhs_contracting.contains(d))
        .collect();
    let nb = dd.lhs_batch.len();
    let batch_axes: Vec<&String> = target.dims[..nb].iter().flat_map(|d| &d.axes).collect();

    // Contracting factors: the operands' axes where they agree, else the larger one's;
    // never an axis the result splits a batch dim on.
    let mut contracting: Vec<Vec<String>> = Vec::new();
    for (&l, &r) in dd.lhs_contracting.iter().zip(&dd.rhs_contracting) {
        let (la, ra) = (axes(lhs, l), axes(rhs, r));
        let pick = if la == ra || bytes(lhs) >= bytes(rhs) {
            la
        } else {
            ra
        };
        let used: Vec<String> = contracting.iter().flatten().cloned().collect();
        contracting.push(
            pick.into_iter()
                .take_while(|a| !batch_axes.contains(&a) && !used.contains(a))
                .collect(),
        );
    }
    let on_contracting: Vec<String> = contracting.iter().flatten().cloned().collect();
    // Result factors: the longest prefix of the target's axes free of contracting axes.
    let result: Vec<Vec<String>> = target
        .dims
        .iter()
        .map(|d| {
            d.axes
                .iter()
                .take_while(|a| !on_contracting.contains(a))
                .cloned()
                .collect()
        })
        .collect();

    let mut want_l = vec![Vec::new(); lhs.global.rank()];
    let mut want_r = vec![Vec::new(); rhs.global.rank()];
    for (i, (&l, &r)) in dd.lhs_batch.iter().zip(&dd.rhs_batch).enumerate() {
        want_l[l] = result[i].clone();
        want_r[r] = result[i].clone();
    }
    for (i, &l) in lhs_free.iter().enumerate() {
        want_l[l] = result[nb + i].clone();
    }
    for (i, &r) in rhs_free.iter().enumerate() {
        want_r[r] = result[nb + lhs_free.len() + i].clone();
    }
    for (i, (&l, &r)) in dd
        .lhs_contracting
        .iter()
        .zip(&dd.rhs_contracting)
        .enumerate()
    {
        want_l[l] = contracting[i].clone();
        want_r[r] = contracting[i].clone();
    }
    let l = reshard(em, lhs, &with_dims(want_l, Vec::new()))?;
    let r = reshard(em, rhs, &with_dims(want_r, Vec::new()))?;
    // Padding of uneven contracting dims must not enter the sums.
    let lid = mask_padding(em, &l, &dd.lhs_contracting, 0.0)?;
    let rid = mask_padding(em, &r, &dd.rhs_contracting, 0.0)?;
    let id = em.emit(Op::DotGeneral(dd.clone()), &[lid, rid])?;
    let global_shape: Vec<usize> = dd
        .lhs_batch
        .iter()
        .map(|&d| lhs.global.shape[d])
        .chain(lhs_free.iter().map(|&d| lhs.global.shape[d]))
        .chain(rhs_free.iter().map(|&d| rhs.global.shape[d]))
        .collect();
    let global = TensorType::new(global_shape, lhs.global.dtype);
    Ok(PValue {
        id,
        global,
        sharding: with_dims(result, on_contracting),
    })
}
