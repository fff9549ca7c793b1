//! `dot_general`: every dim of the operands and the result is a factor — batch (both
//! operands and result), free (one operand and result) or contracting (both operands).
//! Result factors take the target's axes; contracting factors take the lhs's axes, the
//! rhs's, or none — whichever makes the fewest bytes move in all (resharding both
//! operands, then reducing the result), as GSPMD's cost-based choice does. Operands
//! are resharded to that (a free dim of one operand is gathered only when the result
//! is not split on it), the product runs locally on the blocks, and the partial sums
//! over the contracting axes are reduced by `all_reduce`, or `reduce_scatter` when the
//! result is split on that axis, or kept pending when the target is unreduced.

use super::super::emit::Emitter;
use super::super::mask::mask_padding;
use super::super::reshard::{plan_reshard, reshard};
use super::super::value::PValue;
use super::with_dims;
use crate::error::Result;
use crate::ir::{DotDims, Op, TensorType};
use crate::sharding::Sharding;

/// How a dot is computed: each operand's tiling, the result's tiling and the axes the
/// result is a partial sum over.
struct Strategy {
    lhs: Vec<Vec<String>>,
    rhs: Vec<Vec<String>>,
    result: Vec<Vec<String>>,
    partial: Vec<String>,
}

/// The dot's dims: batch pairs, free dims of each operand, contracting pairs.
struct Dims<'a> {
    dd: &'a DotDims,
    lhs_free: Vec<usize>,
    rhs_free: Vec<usize>,
    lhs_rank: usize,
    rhs_rank: usize,
}

impl Dims<'_> {
    /// The strategy that splits the contracting dims over `contracting` (one list per
    /// pair) and the result over the longest prefixes of the target's axes left free.
    fn strategy(&self, contracting: &[Vec<String>], target: &Sharding) -> Strategy {
        let dd = self.dd;
        let partial: Vec<String> = contracting.iter().flatten().cloned().collect();
        let result: Vec<Vec<String>> = target
            .dims
            .iter()
            .map(|d| {
                d.axes
                    .iter()
                    .take_while(|a| !partial.contains(a))
                    .cloned()
                    .collect()
            })
            .collect();
        let nb = dd.lhs_batch.len();
        let mut lhs = vec![Vec::new(); self.lhs_rank];
        let mut rhs = vec![Vec::new(); self.rhs_rank];
        for (i, (&l, &r)) in dd.lhs_batch.iter().zip(&dd.rhs_batch).enumerate() {
            lhs[l] = result[i].clone();
            rhs[r] = result[i].clone();
        }
        for (i, &l) in self.lhs_free.iter().enumerate() {
            lhs[l] = result[nb + i].clone();
        }
        for (i, &r) in self.rhs_free.iter().enumerate() {
            rhs[r] = result[nb + self.lhs_free.len() + i].clone();
        }
        for (i, (&l, &r)) in dd
            .lhs_contracting
            .iter()
            .zip(&dd.rhs_contracting)
            .enumerate()
        {
            lhs[l] = contracting[i].clone();
            rhs[r] = contracting[i].clone();
        }
        Strategy {
            lhs,
            rhs,
            result,
            partial,
        }
    }
}

/// Every choice of contracting axes: per contracting pair, the lhs's axes, the rhs's,
/// none, or the target's unreduced axes; never an axis the target splits a batch dim
/// on, nor one used twice.
fn contracting_choices(
    dd: &DotDims,
    lhs: &PValue,
    rhs: &PValue,
    target: &Sharding,
) -> Vec<Vec<Vec<String>>> {
    let batch_axes: Vec<&String> = target.dims[..dd.lhs_batch.len()]
        .iter()
        .flat_map(|d| &d.axes)
        .collect();
    let mut choices: Vec<Vec<Vec<String>>> = vec![Vec::new()];
    for (&l, &r) in dd.lhs_contracting.iter().zip(&dd.rhs_contracting) {
        // The target's pending-sum axes split a contracting dim for free (a slice) and
        // leave exactly the partial sums it keeps.
        let options = [
            lhs.sharding.dims[l].axes.clone(),
            rhs.sharding.dims[r].axes.clone(),
            Vec::new(),
            target.unreduced.clone(),
        ];
        let mut next = Vec::new();
        for prefix in &choices {
            let used: Vec<&String> = prefix.iter().flatten().collect();
            for option in &options {
                let axes: Vec<String> = option
                    .iter()
                    .take_while(|a| !batch_axes.contains(a) && !used.contains(a))
                    .cloned()
                    .collect();
                let mut c = prefix.clone();
                c.push(axes);
                if !next.contains(&c) {
                    next.push(c);
                }
            }
        }
        choices = next;
    }
    choices
}

pub(super) fn dot_general(
    em: &mut Emitter,
    dd: &DotDims,
    lhs: &PValue,
    rhs: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let free = |rank: usize, batch: &[usize], contracting: &[usize]| -> Vec<usize> {
        (0..rank)
            .filter(|d| !batch.contains(d) && !contracting.contains(d))
            .collect()
    };
    let dims = Dims {
        dd,
        lhs_free: free(lhs.global.rank(), &dd.lhs_batch, &dd.lhs_contracting),
        rhs_free: free(rhs.global.rank(), &dd.rhs_batch, &dd.rhs_contracting),
        lhs_rank: lhs.global.rank(),
        rhs_rank: rhs.global.rank(),
    };
    let global_shape: Vec<usize> = dd
        .lhs_batch
        .iter()
        .map(|&d| lhs.global.shape[d])
        .chain(dims.lhs_free.iter().map(|&d| lhs.global.shape[d]))
        .chain(dims.rhs_free.iter().map(|&d| rhs.global.shape[d]))
        .collect();
    // The cheapest strategy: bytes received to reshard both operands and to reduce the
    // result, plus the local product's flops, each flop charged as one byte. Without the
    // flop term, gathering both operands of a small product would look cheaper than
    // all-reducing its partial sums while every device repeats the whole product.
    let elem_bytes = lhs.global.dtype.size_in_bytes() as f64;
    let cost = |st: &Strategy| -> f64 {
        let plan = |shape: &[usize], from: &Sharding, to: &Sharding| {
            plan_reshard(em.mesh, shape, from, to).cost
        };
        let moved = plan(
            &lhs.global.shape,
            &lhs.sharding,
            &with_dims(st.lhs.clone(), Vec::new()),
        ) + plan(
            &rhs.global.shape,
            &rhs.sharding,
            &with_dims(st.rhs.clone(), Vec::new()),
        ) + plan(
            &global_shape,
            &with_dims(st.result.clone(), st.partial.clone()),
            target,
        );
        let local = |shape: &[usize], tiling: &[Vec<String>]| -> Vec<f64> {
            shape
                .iter()
                .zip(tiling)
                .map(|(&n, axes)| n.div_ceil(em.mesh.axes_size(axes)) as f64)
                .collect()
        };
        let l = local(&lhs.global.shape, &st.lhs);
        let r = local(&rhs.global.shape, &st.rhs);
        // 2 * (all lhs dims) * (rhs free dims): every lhs element meets every rhs free column.
        let flops =
            2.0 * l.iter().product::<f64>() * dims.rhs_free.iter().map(|&d| r[d]).product::<f64>();
        moved * elem_bytes + flops
    };
    let best = contracting_choices(dd, lhs, rhs, target)
        .iter()
        .map(|c| dims.strategy(c, target))
        .map(|st| (cost(&st), st))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, st)| st)
        .ok_or_else(|| em.error("no strategy"))?;
    let l = reshard(em, lhs, &with_dims(best.lhs, Vec::new()))?;
    let r = reshard(em, rhs, &with_dims(best.rhs, Vec::new()))?;
    // Padding of uneven contracting dims must not enter the sums.
    let lid = mask_padding(em, &l, &dd.lhs_contracting, 0.0)?;
    let rid = mask_padding(em, &r, &dd.rhs_contracting, 0.0)?;
    let id = em.emit(Op::DotGeneral(dd.clone()), &[lid, rid])?;
    let global = TensorType::new(global_shape, lhs.global.dtype);
    Ok(PValue {
        id,
        global,
        sharding: with_dims(best.result, best.partial),
    })
}
