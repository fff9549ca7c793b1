//! `dot_general` as 2-D matrix products over strided views: each operand is seen as
//! `[batch dims..., rows, cols]` — its free dims merged into one, its contracting dims
//! into the other, where the memory layout allows it without copying (it does for
//! every operand whose merged dims are adjacent and in order, the usual case: a
//! projection `bsm,mf->bsf`, the attention products `bqhd,bkhd->bhqk` and
//! `bhqk,bkhd->bqhd`); only an operand whose dims cannot merge is copied. Batch dims are
//! never merged: each batch index selects a 2-D view, multiplied by ndarray's
//! `general_mat_mul` (matrixmultiply packs any strides itself) straight into its slot
//! of the result.

use ndarray::{
    Array3, ArrayD, ArrayView2, ArrayViewD, ArrayViewMut2, Axis, CowArray, Ix2, IxDyn, Zip,
    linalg::general_mat_mul,
};

use crate::ir::DotDims;

/// Element types `dot_general` multiplies: `c = a · b` for 2-D operands.
pub(super) trait DotScalar: Copy + Default {
    fn matmul_into(a: ArrayView2<'_, Self>, b: ArrayView2<'_, Self>, c: ArrayViewMut2<'_, Self>);
}

impl DotScalar for f32 {
    fn matmul_into(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, mut c: ArrayViewMut2<'_, f32>) {
        general_mat_mul(1.0, &a, &b, 0.0, &mut c);
    }
}

impl DotScalar for i32 {
    /// Wrapping arithmetic (XLA's), one rank-1 update per contracted index.
    fn matmul_into(a: ArrayView2<'_, i32>, b: ArrayView2<'_, i32>, mut c: ArrayViewMut2<'_, i32>) {
        c.fill(0);
        for (col, row) in a.columns().into_iter().zip(b.rows()) {
            Zip::from(&mut c)
                .and_broadcast(&col.insert_axis(Axis(1)))
                .and_broadcast(&row.insert_axis(Axis(0)))
                .for_each(|c, &p, &q| *c = c.wrapping_add(p.wrapping_mul(q)));
        }
    }
}

/// `dot_general` of `lhs` and `rhs` with result shape `shape` (batch dims, lhs free
/// dims, rhs free dims): one `[M, K] x [K, N]` product per batch index.
pub(super) fn dot_general<T: DotScalar>(
    dd: &DotDims,
    lhs: &ArrayD<T>,
    rhs: &ArrayD<T>,
    shape: &[usize],
) -> Result<ArrayD<T>, String> {
    let lhs_free = free_dims(lhs.ndim(), &dd.lhs_batch, &dd.lhs_contracting);
    let rhs_free = free_dims(rhs.ndim(), &dd.rhs_batch, &dd.rhs_contracting);
    let (lhs_view, lhs_shape) = grouped(lhs, &dd.lhs_batch, [&lhs_free, &dd.lhs_contracting]);
    let (rhs_view, rhs_shape) = grouped(rhs, &dd.rhs_batch, [&dd.rhs_contracting, &rhs_free]);
    let lhs = matrices(&lhs_view, &lhs_shape)?;
    let rhs = matrices(&rhs_view, &rhs_shape)?;
    let nb = dd.lhs_batch.len();
    let batch_shape = &lhs.shape()[..nb];
    let batch: usize = batch_shape.iter().product();
    let (m, n) = (lhs.shape()[nb], rhs.shape()[nb + 1]);
    let mut out = Array3::<T>::default((batch, m, n));
    for (b, c) in out.outer_iter_mut().enumerate() {
        T::matmul_into(matrix_at(&lhs, b)?, matrix_at(&rhs, b)?, c);
    }
    out.into_dyn()
        .into_shape_with_order(IxDyn(shape))
        .map_err(|e| format!("cannot reshape the product to {shape:?}: {e}"))
}

/// The dims of a rank-`rank` operand that are neither batch nor contracting.
fn free_dims(rank: usize, batch: &[usize], contracting: &[usize]) -> Vec<usize> {
    (0..rank)
        .filter(|d| !batch.contains(d) && !contracting.contains(d))
        .collect()
}

/// `a`'s dims reordered as its batch dims, then the dims of `merged[0]`, then those of
/// `merged[1]` (a view), and the shape that merges each of the two groups into one dim
/// (of size 1 for an empty group): `[batch dims..., rows, cols]`.
fn grouped<'a, T>(
    a: &'a ArrayD<T>,
    batch: &[usize],
    merged: [&[usize]; 2],
) -> (ArrayViewD<'a, T>, Vec<usize>) {
    let perm: Vec<usize> = [batch, merged[0], merged[1]].concat();
    let mut shape: Vec<usize> = batch.iter().map(|&d| a.shape()[d]).collect();
    shape.extend(merged.map(|dims| dims.iter().map(|&d| a.shape()[d]).product::<usize>()));
    (a.view().permuted_axes(IxDyn(&perm)), shape)
}

/// `view` reshaped to `shape` (see [`grouped`]): a view when the merged dims' strides
/// allow it, a copy otherwise.
fn matrices<'a, T: Clone>(
    view: &'a ArrayViewD<'_, T>,
    shape: &[usize],
) -> Result<CowArray<'a, T, IxDyn>, String> {
    (view.to_shape(IxDyn(shape)))
        .map_err(|e| format!("cannot view {:?} as {shape:?}: {e}", view.shape()))
}

/// The 2-D matrix of batch index `b` (row-major over the batch dims) of `a`, a
/// `[batch dims..., rows, cols]` array.
fn matrix_at<'a, T>(a: &'a CowArray<'_, T, IxDyn>, b: usize) -> Result<ArrayView2<'a, T>, String> {
    let nb = a.ndim() - 2;
    let mut view: ArrayViewD<'a, T> = a.view();
    let mut rest = b;
    let mut index = vec![0; nb];
    for d in (0..nb).rev() {
        index[d] = rest % a.shape()[d];
        rest /= a.shape()[d];
    }
    for i in index {
        view = view.index_axis_move(Axis(0), i);
    }
    view.into_dimensionality::<Ix2>().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use ndarray::{ArrayD, IxDyn};

    use super::*;

    fn dims(lb: &[usize], rb: &[usize], lc: &[usize], rc: &[usize]) -> DotDims {
        DotDims {
            lhs_batch: lb.to_vec(),
            rhs_batch: rb.to_vec(),
            lhs_contracting: lc.to_vec(),
            rhs_contracting: rc.to_vec(),
        }
    }

    fn counting(shape: &[usize]) -> ArrayD<i32> {
        let n: usize = shape.iter().product();
        ArrayD::from_shape_vec(IxDyn(shape), (0..n as i32).map(|v| v % 13 - 6).collect()).unwrap()
    }

    /// The definition, by indices: `out[b, i, j] = sum_k lhs[b, i, k] rhs[b, k, j]`
    /// over the multi-indices of each group.
    fn naive(dd: &DotDims, lhs: &ArrayD<i32>, rhs: &ArrayD<i32>) -> ArrayD<i32> {
        let free = |rank: usize, b: &[usize], c: &[usize]| -> Vec<usize> {
            (0..rank)
                .filter(|d| !b.contains(d) && !c.contains(d))
                .collect()
        };
        let lf = free(lhs.ndim(), &dd.lhs_batch, &dd.lhs_contracting);
        let rf = free(rhs.ndim(), &dd.rhs_batch, &dd.rhs_contracting);
        let sizes =
            |a: &ArrayD<i32>, ds: &[usize]| ds.iter().map(|&d| a.shape()[d]).collect::<Vec<_>>();
        let shape: Vec<usize> =
            [sizes(lhs, &dd.lhs_batch), sizes(lhs, &lf), sizes(rhs, &rf)].concat();
        let k_shape = sizes(lhs, &dd.lhs_contracting);
        ArrayD::from_shape_fn(IxDyn(&shape), |ix| {
            let (nb, nl) = (dd.lhs_batch.len(), lf.len());
            let mut sum = 0;
            for k in ndarray::indices(IxDyn(&k_shape)) {
                let mut li = vec![0; lhs.ndim()];
                let mut ri = vec![0; rhs.ndim()];
                for (j, (&l, &r)) in dd.lhs_batch.iter().zip(&dd.rhs_batch).enumerate() {
                    (li[l], ri[r]) = (ix[j], ix[j]);
                }
                for (j, &l) in lf.iter().enumerate() {
                    li[l] = ix[nb + j];
                }
                for (j, &r) in rf.iter().enumerate() {
                    ri[r] = ix[nb + nl + j];
                }
                for (j, (&l, &r)) in dd
                    .lhs_contracting
                    .iter()
                    .zip(&dd.rhs_contracting)
                    .enumerate()
                {
                    (li[l], ri[r]) = (k[j], k[j]);
                }
                sum += lhs[IxDyn(&li)] * rhs[IxDyn(&ri)];
            }
            sum
        })
    }

    /// Batch dims anywhere, several free and contracting dims in any order, empty
    /// groups (an outer product, a full contraction): the kernel equals the definition.
    #[test]
    fn every_grouping_equals_the_definition() {
        let cases: [(&[usize], &[usize], DotDims); 7] = [
            (&[3, 4], &[4, 5], dims(&[], &[], &[1], &[0])),
            (&[2, 3, 4], &[4, 5], dims(&[], &[], &[2], &[0])),
            (
                &[2, 5, 3, 4],
                &[2, 6, 3, 4],
                dims(&[0, 2], &[0, 2], &[3], &[3]),
            ),
            (
                &[2, 3, 5, 6],
                &[2, 6, 3, 4],
                dims(&[0, 1], &[0, 2], &[3], &[1]),
            ),
            (&[4, 3, 2], &[2, 3, 5], dims(&[], &[], &[2, 1], &[0, 1])),
            (&[3], &[4], dims(&[], &[], &[], &[])),
            (&[2, 3], &[3, 2], dims(&[], &[], &[0, 1], &[1, 0])),
        ];
        for (ls, rs, dd) in cases {
            let (lhs, rhs) = (counting(ls), counting(rs));
            let want = naive(&dd, &lhs, &rhs);
            let got = dot_general(&dd, &lhs, &rhs, want.shape()).unwrap();
            assert_eq!(got, want, "{ls:?} x {rs:?} {dd:?}");
            let (lf, rf) = (lhs.mapv(|v| v as f32), rhs.mapv(|v| v as f32));
            let got = dot_general(&dd, &lf, &rf, want.shape()).unwrap();
            assert_eq!(got, want.mapv(|v| v as f32), "f32 {ls:?} x {rs:?}");
        }
    }

    /// The Transformer's products read both operands in place: no operand is copied.
    #[test]
    fn transformer_products_read_their_operands_in_place() {
        let cases: [(&[usize], &[usize], DotDims); 3] = [
            // Projection bsm,mf->bsf.
            (&[2, 8, 16], &[16, 32], dims(&[], &[], &[2], &[0])),
            // Scores bqhd,bkhd->bhqk.
            (
                &[2, 8, 4, 16],
                &[2, 8, 4, 16],
                dims(&[0, 2], &[0, 2], &[3], &[3]),
            ),
            // Context bhqk,bkhd->bhqd.
            (
                &[2, 4, 8, 8],
                &[2, 8, 4, 16],
                dims(&[0, 1], &[0, 2], &[3], &[1]),
            ),
        ];
        for (ls, rs, dd) in cases {
            let (lhs, rhs) = (counting(ls), counting(rs));
            let lf = free_dims(lhs.ndim(), &dd.lhs_batch, &dd.lhs_contracting);
            let rf = free_dims(rhs.ndim(), &dd.rhs_batch, &dd.rhs_contracting);
            let (lv, lshape) = grouped(&lhs, &dd.lhs_batch, [&lf, &dd.lhs_contracting]);
            let (rv, rshape) = grouped(&rhs, &dd.rhs_batch, [&dd.rhs_contracting, &rf]);
            assert!(matrices(&lv, &lshape).unwrap().is_view(), "lhs of {dd:?}");
            assert!(matrices(&rv, &rshape).unwrap().is_view(), "rhs of {dd:?}");
        }
    }
}
