//! Contractions: `dot_general` here, and `convolution` through [`contract`]. Every dim
//! of the operands and the result is a factor — batch (both operands and result), free
//! (one operand and result) or contracting (both operands).
//! Result factors take the target's axes; contracting factors take the lhs's axes, the
//! rhs's, or none — whichever makes the fewest bytes move in all (resharding both
//! operands, then reducing the result), as GSPMD's cost-based choice does. Operands
//! are resharded to that (a free dim of one operand is gathered only when the result
//! is not split on it), the product runs locally on the blocks, and the partial sums
//! over the contracting axes are reduced by `all_reduce`, or `reduce_scatter` when the
//! result is split on that axis, or kept pending when the target is unreduced.
//!
//! A convolution's windowed spatial dims split along the lhs take a halo exchange of
//! the lhs block after the reshard ([`Contraction::halos`]): either a result dim (the
//! lhs dim keeps the target's axes of its output dim, which no contracting choice may
//! take) or a *spatial contraction* (a contracting pair whose rhs dim is the window:
//! both operands keep the rhs's axes, the result is a partial sum over them).

use super::super::emit::Emitter;
use super::super::halo::{self, HaloPlan};
use super::super::mask::mask_padding;
use super::super::reshard::{plan_reshard, reshard};
use super::super::value::PValue;
use super::with_dims;
use crate::error::Result;
use crate::ir::{DotDims, Op, TensorType};
use crate::sharding::Sharding;

/// How a contraction is computed: each operand's tiling, the result's tiling and the
/// axes the result is a partial sum over.
struct Strategy {
    lhs: Vec<Vec<String>>,
    rhs: Vec<Vec<String>>,
    result: Vec<Vec<String>>,
    partial: Vec<String>,
}

/// A contraction of two operands described by its factors, as `dot_general` and
/// `convolution` both are.
pub(super) struct Contraction {
    /// Per result dim, the lhs dim and the rhs dim that are the same factor (split
    /// alike). A result dim with neither is computed whole (a convolution's windowed
    /// spatial dim); operand dims named nowhere are taken whole.
    pub result: Vec<(Option<usize>, Option<usize>)>,
    /// The contracted (lhs dim, rhs dim) pairs: split, they leave partial sums. Pairs
    /// whose lhs dim has a halo come first.
    pub contracting: Vec<(usize, usize)>,
    /// Halo exchanges of the resharded lhs, one per lhs dim, positions outside the
    /// array read as 0. The lhs dim is a result factor (split over the target's axes of
    /// its result dim) or the lhs side of a contracting pair (split over the rhs's axes
    /// of that pair); each plan is built for that many shards.
    pub halos: Vec<HaloPlan>,
    pub lhs_rank: usize,
    pub rhs_rank: usize,
    /// Multiply-adds per (result element, contracted index) pair: a convolution's
    /// window taps; 1 for a dot.
    pub taps: f64,
}

impl Contraction {
    /// The strategy that splits the contracting pairs over `contracting` (one list per
    /// pair) and the result over the longest prefixes of the target's axes left free.
    fn strategy(&self, contracting: &[Vec<String>], target: &Sharding) -> Strategy {
        let partial: Vec<String> = contracting.iter().flatten().cloned().collect();
        let result: Vec<Vec<String>> = (target.dims.iter().zip(&self.result))
            .map(|(d, from)| match from {
                (None, None) => Vec::new(),
                _ => (d.axes.iter())
                    .take_while(|a| !partial.contains(a))
                    .cloned()
                    .collect(),
            })
            .collect();
        let mut lhs = vec![Vec::new(); self.lhs_rank];
        let mut rhs = vec![Vec::new(); self.rhs_rank];
        for (axes, &(l, r)) in result.iter().zip(&self.result) {
            if let Some(l) = l {
                lhs[l] = axes.clone();
            }
            if let Some(r) = r {
                rhs[r] = axes.clone();
            }
        }
        for (axes, &(l, r)) in contracting.iter().zip(&self.contracting) {
            lhs[l] = axes.clone();
            rhs[r] = axes.clone();
        }
        Strategy {
            lhs,
            rhs,
            result,
            partial,
        }
    }

    /// Every choice of contracting axes: per contracting pair, the lhs's axes, the
    /// rhs's, none, or the target's unreduced axes; never an axis the target splits a
    /// dim of both operands (a batch dim) on, nor one used twice.
    fn contracting_choices(
        &self,
        lhs: &PValue,
        rhs: &PValue,
        target: &Sharding,
    ) -> Vec<Vec<Vec<String>>> {
        let halo = |l: &usize| self.halos.iter().any(|p| p.dim() == *l);
        let batch_axes: Vec<&String> = (target.dims.iter().zip(&self.result))
            .filter(|(_, from)| {
                matches!(from, (Some(_), Some(_))) || from.0.is_some_and(|l| halo(&l))
            })
            .flat_map(|(d, _)| &d.axes)
            .collect();
        let mut choices: Vec<Vec<Vec<String>>> = vec![Vec::new()];
        for &(l, r) in &self.contracting {
            // The target's pending-sum axes split a contracting dim for free (a slice)
            // and leave exactly the partial sums it keeps.
            // A spatial contraction is split where its window (the rhs) is.
            let options = if halo(&l) {
                vec![rhs.sharding.dims[r].axes.clone()]
            } else {
                vec![
                    lhs.sharding.dims[l].axes.clone(),
                    rhs.sharding.dims[r].axes.clone(),
                    Vec::new(),
                    target.unreduced.clone(),
                ]
            };
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
}

/// Partitions the contraction `c` of `lhs` and `rhs` into `global`, computed on the
/// local blocks by `local_op` (the op itself: its attributes hold for blocks too).
/// Chooses the cheapest strategy: bytes received to reshard both operands and to
/// reduce the result, plus the local multiply-adds, each flop charged as one byte.
/// Without the flop term, gathering both operands of a small product would look
/// cheaper than all-reducing its partial sums while every device repeats the whole
/// product.
pub(super) fn contract(
    em: &mut Emitter,
    c: &Contraction,
    lhs: &PValue,
    rhs: &PValue,
    target: &Sharding,
    global: TensorType,
    local_op: Op,
) -> Result<PValue> {
    let elem_bytes = lhs.global.dtype.size_in_bytes() as f64;
    let local_size = |n: usize, axes: &[String]| n.div_ceil(em.mesh.axes_size(axes)) as f64;
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
            &global.shape,
            &with_dims(st.result.clone(), st.partial.clone()),
            target,
        );
        // Every local result element meets every local contracted index, `taps` times.
        let results: f64 = (global.shape.iter().zip(&st.result))
            .map(|(&n, axes)| local_size(n, axes))
            .product();
        let contracted: f64 = (c.contracting.iter())
            .map(|&(l, _)| local_size(lhs.global.shape[l], &st.lhs[l]))
            .product();
        moved * elem_bytes + 2.0 * results * contracted * c.taps
    };
    let best = c
        .contracting_choices(lhs, rhs, target)
        .iter()
        .map(|choice| c.strategy(choice, target))
        .map(|st| (cost(&st), st))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, st)| st)
        .ok_or_else(|| em.error("no strategy"))?;
    let mut l = reshard(em, lhs, &with_dims(best.lhs, Vec::new()))?;
    let r = reshard(em, rhs, &with_dims(best.rhs, Vec::new()))?;
    // Padding of uneven contracting dims must not enter the sums; a window's positions
    // outside the array are 0 already.
    let mut lhs_con: Vec<usize> = Vec::new();
    for &(d, _) in &c.contracting {
        if !c.halos.iter().any(|p| p.dim() == d) {
            lhs_con.push(d);
        }
    }
    let rhs_con: Vec<usize> = c.contracting.iter().map(|&(_, r)| r).collect();
    l.id = mask_padding(em, &l, &lhs_con, 0.0)?;
    for plan in &c.halos {
        if em.mesh.axes_size(&l.sharding.dims[plan.dim()].axes) != plan.shards() {
            return Err(em.error("a halo plan does not match the contraction's strategy"));
        }
        let zero = em.scalar(lhs.global.dtype, 0.0)?;
        l.id = halo::exchange(em, &l, plan, Some(zero))?;
    }
    let rid = mask_padding(em, &r, &rhs_con, 0.0)?;
    let id = em.emit(local_op, &[l.id, rid])?;
    Ok(PValue {
        id,
        global,
        sharding: with_dims(best.result, best.partial),
    })
}

pub(super) fn dot_general(
    em: &mut Emitter,
    dd: &DotDims,
    lhs: &PValue,
    rhs: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let lhs_free: Vec<usize> = dd.lhs_free(lhs.global.rank()).collect();
    let rhs_free: Vec<usize> = dd.rhs_free(rhs.global.rank()).collect();
    let batch = (dd.lhs_batch.iter().zip(&dd.rhs_batch)).map(|(&l, &r)| (Some(l), Some(r)));
    let result: Vec<(Option<usize>, Option<usize>)> = batch
        .chain(lhs_free.iter().map(|&l| (Some(l), None)))
        .chain(rhs_free.iter().map(|&r| (None, Some(r))))
        .collect();
    let global_shape: Vec<usize> = (result.iter())
        .map(|&(l, r)| match (l, r) {
            (Some(l), _) => lhs.global.shape[l],
            (_, Some(r)) => rhs.global.shape[r],
            (None, None) => 1,
        })
        .collect();
    let c = Contraction {
        result,
        contracting: (dd.lhs_contracting.iter().copied())
            .zip(dd.rhs_contracting.iter().copied())
            .collect(),
        lhs_rank: lhs.global.rank(),
        rhs_rank: rhs.global.rank(),
        taps: 1.0,
        halos: Vec::new(),
    };
    let global = TensorType::new(global_shape, lhs.global.dtype);
    contract(em, &c, lhs, rhs, target, global, Op::DotGeneral(dd.clone()))
}
