//! `reduce` over contiguous memory: the reduced dims are cut into blocks of adjacent
//! dims, each block reduced on its own (the last block first), and a block is either
//! the minor end of the array — each result element is the fold of one contiguous row,
//! with eight accumulators so the loop vectorises — or followed by kept dims, which
//! fold row into row (`out[p, :] = f(out[p, :], x[p, i, :])`), again over contiguous
//! rows. Nothing is read through a strided lane.
//!
//! The order of the folds is fixed by the shape alone (not by the data or the
//! thread), so a result is the same on every run and every device; it is not the
//! sequential order, so f32 sums differ from a naive loop in the last bits.

use std::borrow::Cow;

use ndarray::{ArrayD, IxDyn};

use super::{Dims, max_nan, min_nan, type_of};
use crate::ir::{Literal, ReduceKind};
use crate::runtime::buffers::{self, Pooled};

/// `reduce` of `x` over `dims` (sorted, distinct; checked by the shape rule).
pub(super) fn reduce(kind: ReduceKind, x: &Literal, dims: &[usize]) -> Result<Literal, String> {
    Ok(match x {
        Literal::F32(a) => Literal::F32(match kind {
            ReduceKind::Sum => fold_dims(a, dims, 0.0, |p, q| p + q)?,
            ReduceKind::Max => fold_dims(a, dims, f32::NEG_INFINITY, max_nan)?,
            ReduceKind::Min => fold_dims(a, dims, f32::INFINITY, min_nan)?,
        }),
        Literal::I32(a) => Literal::I32(match kind {
            ReduceKind::Sum => fold_dims(a, dims, 0, i32::wrapping_add)?,
            ReduceKind::Max => fold_dims(a, dims, i32::MIN, i32::max)?,
            ReduceKind::Min => fold_dims(a, dims, i32::MAX, i32::min)?,
        }),
        x => return Err(format!("cannot reduce {}", type_of(x))),
    })
}

/// Folds `dims` of `a` away with `f` (associative and commutative, `identity` its
/// neutral element), block of adjacent dims by block, the last block first.
fn fold_dims<T: Pooled>(
    a: &ArrayD<T>,
    dims: &[usize],
    identity: T,
    f: impl Fn(T, T) -> T + Copy,
) -> Result<ArrayD<T>, String> {
    let mut shape = Dims::from_slice(a.shape());
    let standard = a.as_standard_layout();
    let slice = (standard.as_slice()).ok_or("a standard-layout array is contiguous")?;
    let mut data = Cow::Borrowed(slice);
    let mut rest = dims;
    while let Some((&last, _)) = rest.split_last() {
        // The block of adjacent dims ending at `last`.
        let len = rest
            .iter()
            .rev()
            .zip((0..=last).rev())
            .take_while(|&(&d, e)| d == e)
            .count();
        let first = last + 1 - len;
        let outer: usize = shape[..first].iter().product();
        let block: usize = shape[first..=last].iter().product();
        let inner: usize = shape[last + 1..].iter().product();
        let folded = fold_block(&data, [outer, block, inner], identity, f);
        // A block folded before this one gives its buffer back.
        if let Cow::Owned(before) = std::mem::replace(&mut data, Cow::Owned(folded)) {
            buffers::give_buffer(before);
        }
        shape.drain(first..=last);
        rest = &rest[..rest.len() - len];
    }
    ArrayD::from_shape_vec(IxDyn(&shape), data.into_owned()).map_err(|e| e.to_string())
}

/// Folds the middle dim of a row-major `[outer, block, inner]` array, into a pooled
/// buffer.
fn fold_block<T: Pooled>(
    data: &[T],
    [outer, block, inner]: [usize; 3],
    identity: T,
    f: impl Fn(T, T) -> T + Copy,
) -> Vec<T> {
    let mut out = buffers::with_capacity(outer * inner);
    if block == 0 || inner == 0 {
        out.resize(outer * inner, identity);
        return out;
    }
    if inner == 1 {
        out.resize(outer, identity);
        pulp::Arch::new().dispatch(Rows {
            values: data,
            row: block,
            identity,
            f,
            out: &mut out,
        });
        return out;
    }
    for slab in data.chunks_exact(block * inner) {
        let start = out.len();
        out.extend_from_slice(&slab[..inner]);
        let acc = &mut out[start..];
        for row in slab[inner..].chunks_exact(inner) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a = f(*a, v);
            }
        }
    }
    out
}

/// Folds a contiguous row with eight independent accumulators (lane `j` takes the
/// elements `j mod 8`), combined pairwise, then the tail (see [`Lanes`]).
#[inline(always)]
fn fold_row<T: Copy>(row: &[T], identity: T, f: impl Fn(T, T) -> T) -> T {
    let (body, tail) = row.split_at(body_len(row.len()));
    let mut lanes = Lanes::new(identity);
    lanes.push(body, &f);
    lanes.finish(tail, &f)
}

/// Folds each whole row of `row` elements of `values` (`row > 0`) as [`reduce`] folds
/// a contiguous row ([`Lanes`]), into `out` (one element a row, in order; rows past
/// `out`'s end are left). Rows of fewer than [`LANES`] elements (the MoE's experts) and
/// of 8 and 16 (a head's keys) are folded by code of fixed length inlined into the
/// caller, so in a loop compiled for the CPU's vectors (a fused loop's, or [`Rows`])
/// a short row costs no loop set-up and the rows go through the vectors side by side
/// ([`fold_short`]), and a row of 8 or 16 has its eight lanes in one vector; other
/// lengths are folded by [`fold_any`].
#[inline(always)]
pub(crate) fn fold_rows_into<T: Copy>(
    values: &[T],
    row: usize,
    identity: T,
    f: impl Fn(T, T) -> T + Copy,
    out: &mut [T],
) {
    match row {
        1 => fold_short::<T, 1>(values, identity, f, out),
        2 => fold_short::<T, 2>(values, identity, f, out),
        3 => fold_short::<T, 3>(values, identity, f, out),
        4 => fold_short::<T, 4>(values, identity, f, out),
        5 => fold_short::<T, 5>(values, identity, f, out),
        6 => fold_short::<T, 6>(values, identity, f, out),
        7 => fold_short::<T, 7>(values, identity, f, out),
        8 => fold_fixed::<T, 8>(values, identity, f, out),
        16 => fold_fixed::<T, 16>(values, identity, f, out),
        _ => fold_any(values, row, identity, f, out),
    }
}

/// [`fold_rows_into`] for rows of any length: not inlined (compiled for the build's
/// target). Inlined into a loop compiled for AVX2, rows of 32 folded 5-15 % slower
/// (the MoE step's per-node profile), so only the fixed lengths are inlined.
#[inline(never)]
fn fold_any<T: Copy>(
    values: &[T],
    row: usize,
    identity: T,
    f: impl Fn(T, T) -> T + Copy,
    out: &mut [T],
) {
    for (o, r) in out.iter_mut().zip(values.chunks_exact(row)) {
        *o = fold_row(r, identity, f);
    }
}

/// [`fold_rows_into`] for rows of `N < LANES` elements, all of them a row's tail:
/// [`Lanes`] folds such a row from its lanes' combined identities, then each element
/// in order, and so does this, a row at a time in a loop LLVM vectorises across rows
/// (each vector lane one row; the rows' elements deinterleaved by shuffles, `vpermt2ps`
/// on AVX-512): 256 rows of 4 folded in 70-90 ns against 1.1-1.5 us one row at a time
/// (benches/README.md, "Rows shorter than the lanes folded side by side").
#[inline(always)]
fn fold_short<T: Copy, const N: usize>(
    values: &[T],
    identity: T,
    f: impl Fn(T, T) -> T + Copy,
    out: &mut [T],
) {
    let start = Lanes::new(identity).finish(&[], f);
    let (rows, _) = values.as_chunks::<N>();
    for (o, r) in out.iter_mut().zip(rows) {
        *o = r.iter().fold(start, |a, &v| f(a, v));
    }
}

/// [`fold_rows_into`] for rows of `N` elements.
#[inline(always)]
fn fold_fixed<T: Copy, const N: usize>(
    values: &[T],
    identity: T,
    f: impl Fn(T, T) -> T + Copy,
    out: &mut [T],
) {
    let (rows, _) = values.as_chunks::<N>();
    for (o, r) in out.iter_mut().zip(rows) {
        // The row behind an opaque reference: LLVM otherwise vectorises this loop
        // across rows, each lane a row's element gathered (`vgatherqps`, 3.2x slower
        // on a Zen 4 core than one row's lanes as vectors: benches/README.md, "Short
        // rows folded in the row").
        let r = std::hint::black_box(r);
        *o = fold_row(r, identity, f);
    }
}

/// [`fold_rows_into`] of a whole buffer under `pulp`'s run-time dispatch (rows of 8
/// and 16 compiled with the CPU's vector features; the bits do not change: each lane
/// is still folded in order, nothing contracted or reordered).
struct Rows<'v, T, F> {
    values: &'v [T],
    row: usize,
    identity: T,
    f: F,
    out: &'v mut [T],
}

impl<T: Copy, F: Fn(T, T) -> T + Copy> pulp::WithSimd for Rows<'_, T, F> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        fold_rows_into(self.values, self.row, self.identity, self.f, self.out);
    }
}

/// The number of accumulators of a row's fold ([`Lanes`]).
const LANES: usize = 8;

/// The length of the body of a row of `len` elements (see [`Lanes`]).
pub(crate) fn body_len(len: usize) -> usize {
    len - len % LANES
}

/// The fold of one row as [`reduce`] does it, fed piece by piece: the row's body (its
/// first `len - len % 8` elements) in pieces of whole multiples of eight, each element
/// to lane `j mod 8`; then [`Lanes::finish`] with the tail. A row fed so folds
/// bitwise as `reduce` folds it, however it is cut.
pub(crate) struct Lanes<T> {
    acc: [T; LANES],
}

impl<T: Copy> Lanes<T> {
    /// Lanes holding `identity`.
    pub(crate) fn new(identity: T) -> Self {
        Lanes {
            acc: [identity; LANES],
        }
    }

    /// Folds the next piece of the body (its length a multiple of the width; a
    /// remainder is ignored) into the lanes with `f`.
    #[inline(always)]
    pub(crate) fn push(&mut self, piece: &[T], f: impl Fn(T, T) -> T) {
        for chunk in piece.chunks_exact(LANES) {
            for (a, &v) in self.acc.iter_mut().zip(chunk) {
                *a = f(*a, v);
            }
        }
    }

    /// Combines the lanes pairwise and folds in the row's `tail`.
    #[inline(always)]
    pub(crate) fn finish(mut self, tail: &[T], f: impl Fn(T, T) -> T) -> T {
        let mut width = LANES;
        while width > 1 {
            width /= 2;
            for j in 0..width {
                self.acc[j] = f(self.acc[j], self.acc[j + width]);
            }
        }
        tail.iter().fold(self.acc[0], |a, &v| f(a, v))
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{ArrayD, Axis, Dimension, IxDyn};

    use super::*;

    /// The plain definition: fold one axis at a time through ndarray.
    fn naive<T: Copy>(
        a: &ArrayD<T>,
        dims: &[usize],
        identity: T,
        f: impl Fn(T, T) -> T,
    ) -> ArrayD<T> {
        let mut out = a.clone();
        for &d in dims.iter().rev() {
            out = out.fold_axis(Axis(d), identity, |&acc, &v| f(acc, v));
        }
        out
    }

    /// Every subset of dims of several shapes (sizes 0, 1, odd, above the lane count),
    /// in standard and transposed layouts: i32 sums (exact, wrapping) and f32 maxima
    /// equal the plain fold; f32 sums (elements below 1000 in magnitude) agree within
    /// the rounding bound `n * eps * max |x|`.
    #[test]
    fn blocks_of_dims_fold_like_the_definition() {
        let shapes: [&[usize]; 6] = [
            &[5],
            &[3, 17],
            &[2, 3, 4],
            &[4, 1, 9, 2],
            &[2, 0, 3],
            &[19, 2, 11],
        ];
        for shape in shapes {
            let n: usize = shape.iter().product();
            let ints = ArrayD::from_shape_fn(IxDyn(shape), |ix| {
                let k = ix.slice().iter().fold(7usize, |h, &i| h * 31 + i);
                (k % 2001) as i32 * 1_000_003 - 900_000_000
            });
            let floats = ints.mapv(|v| v as f32 * 1e-6);
            let transposed = floats.clone().reversed_axes();
            let rank = shape.len();
            for mask in 0..1usize << rank {
                let dims: Vec<usize> = (0..rank).filter(|d| mask & (1 << d) != 0).collect();
                let sum_i = fold_dims(&ints, &dims, 0, i32::wrapping_add).unwrap();
                assert_eq!(
                    sum_i,
                    naive(&ints, &dims, 0, i32::wrapping_add),
                    "{shape:?} {dims:?}"
                );
                let max = fold_dims(&floats, &dims, f32::NEG_INFINITY, max_nan).unwrap();
                assert_eq!(max, naive(&floats, &dims, f32::NEG_INFINITY, max_nan));
                for a in [&floats, &transposed] {
                    let got = fold_dims(a, &dims, 0.0f32, |p, q| p + q).unwrap();
                    let want = naive(a, &dims, 0.0, |p, q| p + q);
                    assert_eq!(got.shape(), want.shape());
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (g - w).abs() <= 1.2e-7 * 1000.0 * n as f32,
                            "{shape:?} {dims:?}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    /// A NaN anywhere in a row makes its maximum and minimum NaN (XLA's semantics).
    #[test]
    fn nan_propagates_through_the_lanes() {
        for at in [0, 5, 8, 12] {
            let mut row = vec![1.0f32; 13];
            row[at] = f32::NAN;
            let a = ArrayD::from_shape_vec(IxDyn(&[13]), row).unwrap();
            assert!(fold_dims(&a, &[0], f32::NEG_INFINITY, max_nan).unwrap()[[]].is_nan());
            assert!(fold_dims(&a, &[0], f32::INFINITY, min_nan).unwrap()[[]].is_nan());
        }
    }

    /// Rows of every length 1..=40, as many as fit (an odd count, a partial row past
    /// the last left unread), folded by [`fold_rows_into`] (the rows shorter than the
    /// lanes and the fixed-length rows of 8 and 16 among them) and by the kernel's
    /// dispatch over a whole buffer, equal bitwise the rows fed to [`Lanes`] element by
    /// element: sums with -0.0 among the values, maxima and minima with NaN.
    #[test]
    fn rows_fold_as_their_lanes_bitwise() {
        let lanes = |row: &[f32], identity: f32, f: fn(f32, f32) -> f32| {
            let body = body_len(row.len());
            let mut lanes = Lanes::new(identity);
            for piece in row[..body].chunks(LANES) {
                lanes.push(piece, f);
            }
            lanes.finish(&row[body..], f)
        };
        type Fold = (f32, fn(f32, f32) -> f32);
        let folds: [Fold; 3] = [
            (0.0, |p, q| p + q),
            (f32::NEG_INFINITY, max_nan),
            (f32::INFINITY, min_nan),
        ];
        for row in 1..=40 {
            let count = 2 * (40 / row) + 1;
            let values: Vec<f32> = (0..count * row + row / 2)
                .map(|k| match (k * 7 + row) % 23 {
                    0 => -0.0,
                    1 if row % 2 == 0 => f32::NAN,
                    m => (m as f32 - 11.0) * 0.37 + k as f32 * 1e-3,
                })
                .collect();
            for (identity, f) in folds {
                let want: Vec<u32> = (values.chunks_exact(row))
                    .map(|r| lanes(r, identity, f).to_bits())
                    .collect();
                let mut out = vec![1.5; count];
                fold_rows_into(&values, row, identity, f, &mut out);
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "row {row}");
                let whole = &values[..count * row];
                let block = fold_block(whole, [count, row, 1], identity, f);
                let got: Vec<u32> = block.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "row {row}, the kernel");
            }
        }
    }
}
