//! What the communicators share: the element types of [`Literal`] and their combine
//! functions (so every backend reduces in the same order and gets the same bits; bf16
//! and f16 reduce in f32 and round once), the
//! argument checks of the collectives, and the cutting of operands into blocks and chunks.

use ndarray::{
    ArrayD, ArrayView, ArrayView1, ArrayViewD, ArrayViewMut, ArrayViewMut1, Axis, Dimension, Slice,
    Zip,
};

use super::call::CollectiveOp;
use super::group::Group;
use half::{bf16, f16};

use crate::ir::{self, Literal, ReduceKind, TensorType, map_literal, with_literal};
use crate::runtime::buffers::{self, Pooled};
use crate::runtime::kernels::{max_nan, min_nan};

pub(super) fn literal_type(x: &Literal) -> TensorType {
    TensorType::new(x.shape(), x.dtype())
}

/// The shape of `x` (no allocation, unlike [`Literal::shape`]).
pub(super) fn shape_of(x: &Literal) -> &[usize] {
    with_literal!(x, a => a.shape())
}

/// Whether `x` and `y` have one dtype and shape.
pub(super) fn same_type(x: &Literal, y: &Literal) -> bool {
    x.dtype() == y.dtype() && shape_of(x) == shape_of(y)
}

/// Checks the arguments of collective `op` against its group and the shape of the
/// operand: dims in range and divisible by the group size, permute pairs within the
/// group and one-to-one.
pub(super) fn check_arguments(
    op: &CollectiveOp,
    group: &Group,
    shape: &[usize],
) -> Result<(), String> {
    match op {
        CollectiveOp::AllReduce(_) => Ok(()),
        CollectiveOp::AllGather { dim } => check_dim(shape, *dim, "dim"),
        CollectiveOp::ReduceScatter { dim, .. } => check_divisible(group, shape, *dim, "dim"),
        CollectiveOp::AllToAll {
            split_dim,
            concat_dim,
        } => {
            check_divisible(group, shape, *split_dim, "split_dim")?;
            check_dim(shape, *concat_dim, "concat_dim")
        }
        CollectiveOp::CollectivePermute { pairs } => check_pairs(group, pairs),
    }
}

fn check_dim(shape: &[usize], dim: usize, what: &str) -> Result<(), String> {
    if dim < shape.len() {
        Ok(())
    } else {
        Err(format!(
            "{what} {dim} is out of range for an operand of rank {}",
            shape.len()
        ))
    }
}

fn check_divisible(group: &Group, shape: &[usize], dim: usize, what: &str) -> Result<(), String> {
    check_dim(shape, dim, what)?;
    if shape[dim].is_multiple_of(group.size()) {
        Ok(())
    } else {
        Err(format!(
            "{what} {dim} has size {} which the group size {} does not divide",
            shape[dim],
            group.size()
        ))
    }
}

/// Applies a generic function to the dtype of a literal: `by_dtype!(dtype, f(args))`
/// calls `f::<f32>`, `f::<bf16>`, `f::<f16>`, `f::<i32>` or `f::<bool>`;
/// `by_dtype!(dtype, f(args), narrow => e)` gives `e` for bf16 and f16 (for a backend
/// that moves them as f32).
macro_rules! by_dtype {
    ($dtype:expr, $f:ident($($arg:expr),* $(,)?), narrow => $narrow:expr) => {
        match $dtype {
            $crate::ir::DType::F32 => $f::<f32>($($arg),*),
            $crate::ir::DType::I32 => $f::<i32>($($arg),*),
            $crate::ir::DType::Bool => $f::<bool>($($arg),*),
            $crate::ir::DType::BF16 | $crate::ir::DType::F16 => $narrow,
        }
    };
    ($dtype:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $dtype {
            $crate::ir::DType::F32 => $f::<f32>($($arg),*),
            $crate::ir::DType::BF16 => $f::<::half::bf16>($($arg),*),
            $crate::ir::DType::F16 => $f::<::half::f16>($($arg),*),
            $crate::ir::DType::I32 => $f::<i32>($($arg),*),
            $crate::ir::DType::Bool => $f::<bool>($($arg),*),
        }
    };
}
pub(super) use by_dtype;

fn check_pairs(group: &Group, pairs: &[(usize, usize)]) -> Result<(), String> {
    for (i, &(source, target)) in pairs.iter().enumerate() {
        if source >= group.size() || target >= group.size() {
            return Err(format!(
                "pair ({source}, {target}) names a group index beyond the group size {}",
                group.size()
            ));
        }
        if pairs[..i].iter().any(|&(s, _)| s == source) {
            return Err(format!("source {source} appears in two pairs"));
        }
        if pairs[..i].iter().any(|&(_, t)| t == target) {
            return Err(format!("target {target} appears in two pairs"));
        }
    }
    Ok(())
}

// ---- typed kernels -------------------------------------------------------------------

/// The element types of [`Literal`], with their reductions. Each reduces in an
/// accumulator type `Acc`: itself, or f32 for bf16 and f16, which are widened (exactly),
/// combined in f32 and rounded once at the end, as the kernels compute them.
pub(super) trait Element: ir::Element + Pooled {
    /// The type reductions combine in.
    type Acc: Pooled;
    fn array_mut(x: &mut Literal) -> Option<&mut ArrayD<Self>>;
    fn widen(self) -> Self::Acc;
    fn narrow(a: Self::Acc) -> Self;
    fn sum(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc;
}

macro_rules! element {
    ($t:ty, $variant:ident, $acc:ty, widen: $widen:expr, narrow: $narrow:expr,
     sum: $sum:expr, max: $max:expr, min: $min:expr) => {
        impl Element for $t {
            type Acc = $acc;
            fn array_mut(x: &mut Literal) -> Option<&mut ArrayD<Self>> {
                match x {
                    Literal::$variant(a) => Some(a),
                    _ => None,
                }
            }
            #[inline]
            fn widen(self) -> $acc {
                $widen(self)
            }
            #[inline]
            fn narrow(a: $acc) -> Self {
                $narrow(a)
            }
            #[inline]
            fn sum(a: $acc, b: $acc) -> $acc {
                $sum(a, b)
            }
            #[inline]
            fn max(a: $acc, b: $acc) -> $acc {
                $max(a, b)
            }
            #[inline]
            fn min(a: $acc, b: $acc) -> $acc {
                $min(a, b)
            }
        }
    };
}

fn same<T>(x: T) -> T {
    x
}

// NaN propagates and ties go to the later operand, exactly as in the kernels'
// reductions (`kernels::max_nan`), so a reduction split over devices equals the
// reference's.
element!(f32, F32, f32, widen: same, narrow: same, sum: |a: f32, b: f32| a + b, max: max_nan, min: min_nan);
element!(bf16, BF16, f32, widen: bf16::to_f32, narrow: bf16::from_f32, sum: |a: f32, b: f32| a + b, max: max_nan, min: min_nan);
element!(f16, F16, f32, widen: f16::to_f32, narrow: f16::from_f32, sum: |a: f32, b: f32| a + b, max: max_nan, min: min_nan);
element!(i32, I32, i32, widen: same, narrow: same, sum: i32::wrapping_add, max: Ord::max, min: Ord::min);
// As in XLA, adding predicates is a logical or.
element!(bool, Bool, bool, widen: same, narrow: same, sum: |a: bool, b: bool| a | b, max: |a: bool, b: bool| a | b, min: |a: bool, b: bool| a & b);

/// `acc = kind(acc, x)` elementwise; the match is outside the loop so each loop inlines
/// its combiner.
fn accumulate<T: Element, D: Dimension>(
    kind: ReduceKind,
    acc: ArrayViewMut<'_, T::Acc, D>,
    x: ArrayView<'_, T, D>,
) {
    let zip = Zip::from(acc).and(x);
    match kind {
        ReduceKind::Sum => zip.for_each(|a, &b| *a = T::sum(*a, b.widen())),
        ReduceKind::Max => zip.for_each(|a, &b| *a = T::max(*a, b.widen())),
        ReduceKind::Min => zip.for_each(|a, &b| *a = T::min(*a, b.widen())),
    }
}

/// The elementwise `kind` reduction of same-shaped `blocks` (at least one).
pub(super) fn reduce_blocks<'a, T: Element>(
    kind: ReduceKind,
    blocks: impl IntoIterator<Item = ArrayViewD<'a, T>>,
) -> Option<ArrayD<T>> {
    let mut blocks = blocks.into_iter();
    let first = blocks.next()?;
    let mut acc = buffers::take_array::<T::Acc>(first.shape());
    acc.zip_mut_with(&first, |a, &x| *a = x.widen());
    for block in blocks {
        accumulate::<T, _>(kind, acc.view_mut(), block);
    }
    // No copy when `Acc` is `T`.
    Some(acc.mapv_into_any(T::narrow))
}

/// Start of chunk `i` when `len` elements are cut in `n` chunks whose sizes differ by
/// at most one.
pub(super) fn chunk_start(len: usize, n: usize, i: usize) -> usize {
    i * (len / n) + i.min(len % n)
}

pub(super) fn standard_layout(x: Literal) -> Literal {
    fn standard<T: Clone>(a: ArrayD<T>) -> ArrayD<T> {
        if a.is_standard_layout() {
            a
        } else {
            a.as_standard_layout().into_owned()
        }
    }
    map_literal!(x, a => standard(a))
}

/// Elements of a reduction tile: 64 KiB of f32, so a tile's accumulator stays in L2.
const TILE: usize = 16 * 1024;

/// Block `index` of `x` cut in `n` equal blocks along `dim` (which `n` divides).
pub(super) fn block<T>(x: &ArrayD<T>, dim: usize, n: usize, index: usize) -> ArrayViewD<'_, T> {
    let size = x.shape()[dim] / n;
    x.slice_axis(Axis(dim), Slice::from(index * size..(index + 1) * size))
}

/// The elementwise `kind` reduction of same-length `chunks` (at least one), combining the
/// first chunk with the others in order, a cache-sized tile at a time.
pub(super) fn reduce_chunks<T: Element>(kind: ReduceKind, chunks: &[&[T]]) -> Option<Vec<T>> {
    let (first, rest) = chunks.split_first()?;
    let mut reduced: Vec<T::Acc> = Vec::with_capacity(first.len());
    for start in (0..first.len()).step_by(TILE) {
        let tile = start..(start + TILE).min(first.len());
        reduced.extend(first[tile.clone()].iter().map(|&x| x.widen()));
        combine_rest(kind, &mut reduced[tile.clone()], rest, tile);
    }
    // Collected in place when `Acc` is `T`.
    Some(reduced.into_iter().map(T::narrow).collect())
}

/// [`reduce_chunks`] into `out` (of the chunks' length), for an element type that
/// reduces in itself (no rounding at the end): the same bits, no new buffer. No chunks:
/// `out` is left as it is.
pub(super) fn reduce_chunks_into<T: Element<Acc = T>>(
    kind: ReduceKind,
    chunks: &[&[T]],
    out: &mut [T],
) {
    let Some((first, rest)) = chunks.split_first() else {
        return;
    };
    for start in (0..out.len()).step_by(TILE) {
        let tile = start..(start + TILE).min(out.len());
        out[tile.clone()].copy_from_slice(&first[tile.clone()]);
        combine_rest(kind, &mut out[tile.clone()], rest, tile);
    }
}

/// `acc = kind(acc, chunk[tile])` for each of `chunks` in order.
fn combine_rest<T: Element>(
    kind: ReduceKind,
    acc: &mut [T::Acc],
    chunks: &[&[T]],
    tile: std::ops::Range<usize>,
) {
    for chunk in chunks {
        let x = ArrayView1::from(&chunk[tile.clone()]);
        accumulate::<T, _>(kind, ArrayViewMut1::from(&mut *acc), x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_range() {
        for (len, n) in [(10, 3), (2, 4), (0, 2), (8, 8)] {
            let starts: Vec<usize> = (0..=n).map(|i| chunk_start(len, n, i)).collect();
            assert_eq!(starts[0], 0);
            assert_eq!(starts[n], len);
            assert!(
                starts
                    .windows(2)
                    .all(|w| w[1] - w[0] <= len / n + 1 && w[0] <= w[1])
            );
        }
    }
}
