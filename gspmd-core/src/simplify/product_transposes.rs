//! Transposes of products that only swap the operands' roles:
//! `transpose(dot_general(a, b), perm)`, where `perm` puts `b`'s free dims before `a`'s,
//! is `dot_general(b, a)` with the dims swapped, which writes its result in the
//! transpose's layout and saves the pass that moves it. Autodiff makes one for every
//! weight gradient: the cotangent of `w` in `x · w` (`x[m, k]`, `w[k, n]`) is
//! `dot(ct, x)`, `[n, k]`, transposed to `[k, n]`; it becomes `dot(x, ct)`. Imported
//! programs (JAX's `dot_general` then `transpose`) have the same shape.
//!
//! Bitwise: each result element is the same sum of the same products in the same order
//! (the contracted indices run in the order of the dim pairs whichever operand is the
//! lhs, see `runtime::kernels::contraction`), and a product `x * y` or a fused
//! `x * y + s` rounds as `y * x` or `y * x + s` does.

use crate::ir::{DotDims, Op, Program, ValueId};

/// `program` with every `transpose` of a `dot_general` that swaps the product's free
/// dims (see [`swapped`]) replaced by the product of the swapped operands, when the
/// transpose is the product's only user, the product is not an output and carries no
/// annotation (the user's sharding of its dims; the transpose's stays, as it is of the
/// same dims). The replaced transpose keeps its id, type, annotation, sharding,
/// origin, name and location; the product it no longer reads is left for dead-code
/// elimination. `None` when nothing is replaced.
pub(super) fn swap_transposed_products(program: &Program) -> Option<Program> {
    let users = program.users();
    let mut out: Option<Program> = None;
    for v in program.values() {
        let node = program.node(v);
        let (Op::Transpose(perm), [p]) = (&node.op, node.operands.as_slice()) else {
            continue;
        };
        let product = program.node(*p);
        let Op::DotGeneral(dd) = &product.op else {
            continue;
        };
        if users[p.index()] != [v] || product.annotation.is_some() || program.outputs.contains(p) {
            continue;
        }
        let ([lhs, rhs], rank) = match product.operands.as_slice() {
            &[l, r] => ([l, r], |x: ValueId| program.node(x).ty.rank()),
            _ => continue,
        };
        let Some(dims) = swapped(dd, rank(lhs), rank(rhs), perm) else {
            continue;
        };
        let out = out.get_or_insert_with(|| program.clone());
        let node = out.node_mut(v);
        node.op = Op::DotGeneral(dims);
        node.operands = vec![rhs, lhs];
    }
    out
}

/// The dims of `dot_general(rhs, lhs)` whose result is `transpose(dot_general(lhs, rhs,
/// dd), perm)` (operands of ranks `lhs_rank` and `rhs_rank`): when `perm` keeps the
/// batch dims first (in any order), then takes the rhs's free dims in order, then the
/// lhs's in order, and is not the identity.
fn swapped(dd: &DotDims, lhs_rank: usize, rhs_rank: usize, perm: &[usize]) -> Option<DotDims> {
    let nb = dd.lhs_batch.len();
    let fl = dd.lhs_free(lhs_rank).count();
    let fr = dd.rhs_free(rhs_rank).count();
    if perm.len() != nb + fl + fr || perm.iter().enumerate().all(|(i, &p)| i == p) {
        return None;
    }
    let (batch, rest) = perm.split_at(nb);
    let (rhs_free, lhs_free) = rest.split_at(fr);
    let in_order = |dims: &[usize], from: usize| dims.iter().copied().eq(from..from + dims.len());
    let batch_first = batch.iter().all(|&d| d < nb);
    if !batch_first || !in_order(rhs_free, nb + fl) || !in_order(lhs_free, nb) {
        return None;
    }
    Some(DotDims {
        lhs_batch: batch.iter().map(|&i| dd.rhs_batch[i]).collect(),
        rhs_batch: batch.iter().map(|&i| dd.lhs_batch[i]).collect(),
        lhs_contracting: dd.rhs_contracting.clone(),
        rhs_contracting: dd.lhs_contracting.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weight_gradient_swaps_its_operands() {
        // dot(ct[m, n], x[m, k]) contracting m: [n, k], transposed [1, 0] to [k, n].
        let dd = DotDims::new(&[], &[], &[0], &[0]);
        assert_eq!(
            swapped(&dd, 2, 2, &[1, 0]),
            Some(DotDims::new(&[], &[], &[0], &[0]))
        );
        // The identity is no swap.
        assert_eq!(swapped(&dd, 2, 2, &[0, 1]), None);
    }

    #[test]
    fn batch_dims_stay_first_and_free_dims_keep_their_order() {
        // [b, c] batch, lhs free [i, j], rhs free [l]: result [b, c, i, j, l].
        let dd = DotDims::new(&[0, 1], &[1, 0], &[4], &[2]);
        assert_eq!(
            swapped(&dd, 5, 4, &[0, 1, 4, 2, 3]),
            Some(DotDims::new(&[1, 0], &[0, 1], &[2], &[4]))
        );
        // Batch dims reordered too.
        assert_eq!(
            swapped(&dd, 5, 4, &[1, 0, 4, 2, 3]),
            Some(DotDims::new(&[0, 1], &[1, 0], &[2], &[4]))
        );
        // A batch dim moved among the free dims, or the lhs's free dims reordered.
        assert_eq!(swapped(&dd, 5, 4, &[0, 4, 1, 2, 3]), None);
        assert_eq!(swapped(&dd, 5, 4, &[0, 1, 4, 3, 2]), None);
        // Attention's `[b, h, q, d] -> [b, q, h, d]` is not a swap.
        let attention = DotDims::new(&[0, 1], &[0, 1], &[3], &[2]);
        assert_eq!(swapped(&attention, 4, 4, &[0, 2, 1, 3]), None);
    }
}
