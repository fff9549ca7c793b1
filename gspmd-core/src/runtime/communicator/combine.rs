//! What the communicators share: the element types of [`Literal`] and their combine
//! functions, the order in which a reduction combines its group's values
//! ([`ReductionOrder`]: the same on every backend, so every backend gets the same bits;
//! bf16 and f16 reduce in f32 and round once), the argument checks of the collectives,
//! and the cutting of operands into blocks and chunks.

use ndarray::{
    ArrayBase, ArrayD, ArrayView, ArrayView1, ArrayViewD, ArrayViewMut, ArrayViewMut1, Axis, Data,
    Dimension, IxDyn, Slice, Zip,
};

use super::call::CollectiveOp;
use super::group::Group;
use crate::error::GroupProblem;
use half::{bf16, f16};
use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::ir::{self, Literal, ReduceKind, TensorType, map_literal, with_literal};
use crate::runtime::buffers::{self, Pooled};
use crate::runtime::kernels::{max_nan, min_nan};
use crate::sharding::Mesh;

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

/// `acc = kind(acc, x)` elementwise for two partial results (in the accumulator type):
/// how a level of a [`ReductionOrder`] above the first combines the partial results of
/// the level below.
fn combine_partials<T: Element, D: Dimension>(
    kind: ReduceKind,
    acc: ArrayViewMut<'_, T::Acc, D>,
    x: ArrayView<'_, T::Acc, D>,
) {
    let zip = Zip::from(acc).and(x);
    match kind {
        ReduceKind::Sum => zip.for_each(|a, &b| *a = T::sum(*a, b)),
        ReduceKind::Max => zip.for_each(|a, &b| *a = T::max(*a, b)),
        ReduceKind::Min => zip.for_each(|a, &b| *a = T::min(*a, b)),
    }
}

/// The order in which a reduction combines the values of its group's members: the same
/// on every backend, so that results are equal bit for bit, and nested, so that a
/// backend whose processes each hold a block of the mesh (the devices sharing their
/// coordinates on the major digits) can reduce inside each process first.
///
/// It depends only on the mesh and the set of members, not on how the axes are listed.
/// The members are sorted by their mesh coordinates (first axis major; a sub-axis is a
/// digit of its axis, so this is their row-major mesh position). The group's *digits*
/// are, per axis from the minor-most, the stretches of that axis's mixed-radix digits
/// that the group's (sub-)axes cover (adjacent ones merged), each cut into its prime
/// factors, smallest first from the minor end: `[data, model]` on `(data=2, model=4)`
/// has digits 2 and 2 of `model`, then 2 of `data`. The reduction folds the minor-most
/// digit first — a left fold over runs of that many consecutive members in sorted order
/// — then each next digit over the partial results of the one before, left to right.
/// A group over one axis of prime size is a plain left fold in group order; one over an
/// axis of 4 is `(a0 + a1) + (a2 + a3)`; one over `[data, model]` above reduces over
/// `model` first (pairwise), then over `data`.
///
/// Why prime digits: a process holding `t` consecutive values of an axis holds whole
/// subtrees whenever `t` is a product of the smallest prime digits, e.g. any power of
/// two on a power-of-two axis, so its partial result can be computed locally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ReductionOrder {
    /// The members' group indices, sorted by mesh coordinates.
    sorted: Vec<usize>,
    /// The digits' sizes, minor first; their product is the group size (`[1]` for a
    /// group of one).
    pub(super) levels: Vec<usize>,
}

impl ReductionOrder {
    /// The order of `group`, the group over `axes` (valid axes of `mesh`, as
    /// [`Group::of`] checked them) of one of its members.
    pub(super) fn of(mesh: &Mesh, axes: &[String], group: &Group) -> Result<ReductionOrder> {
        let mut keys = Vec::with_capacity(group.size());
        for (i, &member) in group.members.iter().enumerate() {
            let coords = mesh.device_coords(member).ok_or_else(|| Error::AxisGroup {
                axes: axes.to_vec(),
                mesh: mesh.to_string(),
                problem: GroupProblem::NoSuchDevice { device: member },
            })?;
            keys.push((coords, i));
        }
        keys.sort_unstable();
        let sorted = keys.into_iter().map(|(_, i)| i).collect();
        // Per axis, the (stride, size) stretches of its digits the group covers.
        let mut spans: Vec<Vec<(usize, usize)>> = vec![Vec::new(); mesh.axes().len()];
        for part in axes.iter().filter_map(|a| mesh.axis_part(a)) {
            let axis_size = mesh.axes()[part.axis].1;
            spans[part.axis].push((axis_size / (part.pre * part.size), part.size));
        }
        let mut levels = Vec::new();
        for axis_spans in spans.iter_mut().rev() {
            axis_spans.sort_unstable();
            let mut merged: Vec<(usize, usize)> = Vec::with_capacity(axis_spans.len());
            for &(stride, size) in axis_spans.iter() {
                match merged.last_mut() {
                    Some((s, n)) if *s * *n == stride => *n *= size,
                    _ => merged.push((stride, size)),
                }
            }
            for (_, size) in merged {
                levels.extend(prime_factors(size));
            }
        }
        if levels.is_empty() {
            levels.push(1);
        }
        Ok(ReductionOrder { sorted, levels })
    }

    /// Folds the values `leaf(i)` of the members (by group index `i`) in this order:
    /// into `accs`, one accumulator per level (at least one, all of the leaves' shape),
    /// which the fold rotates between levels; returns the index of the one holding the
    /// result.
    fn fold<'x, T: Element, D: Dimension>(
        &self,
        kind: ReduceKind,
        accs: &mut [ArrayViewMut<'_, T::Acc, D>],
        leaf: impl Fn(usize) -> ArrayView<'x, T, D>,
    ) -> usize {
        let top = self.levels.len() - 1;
        let mut holder: Levels<usize> = (0..=top).collect();
        let mut digits: Levels<usize> = self.levels.iter().map(|_| 0).collect();
        for &member in &self.sorted {
            let x = leaf(member);
            if digits[0] == 0 {
                accs[0].zip_mut_with(&x, |a, &x| *a = x.widen());
            } else {
                accumulate::<T, _>(kind, accs[0].view_mut(), x);
            }
            // A level whose last digit value was added passes its result up.
            let mut k = 0;
            loop {
                digits[k] += 1;
                if digits[k] < self.levels[k] || k == top {
                    break;
                }
                digits[k] = 0;
                if digits[k + 1] == 0 {
                    accs.swap(k, k + 1);
                    holder.swap(k, k + 1);
                } else {
                    let (below, above) = accs.split_at_mut(k + 1);
                    combine_partials::<T, _>(kind, above[0].view_mut(), below[k].view());
                }
                k += 1;
            }
        }
        holder[top]
    }
}

/// Per level of a [`ReductionOrder`] (a handful: one per prime digit of the group).
type Levels<T> = SmallVec<[T; 8]>;

/// The prime factors of `n`, smallest first (none for 1).
pub(super) fn prime_factors(mut n: usize) -> Vec<usize> {
    let mut factors = Vec::new();
    let mut p = 2;
    while p * p <= n {
        while n.is_multiple_of(p) {
            factors.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        factors.push(n);
    }
    factors
}

/// The elementwise `kind` reduction, in `order`, of same-shaped `blocks` (one per
/// member, by group index; at least one).
pub(super) fn reduce_blocks<T: Element>(
    kind: ReduceKind,
    order: &ReductionOrder,
    blocks: &[ArrayViewD<'_, T>],
) -> Option<ArrayD<T>> {
    let shape = blocks.first()?.shape();
    let mut accs: Levels<ArrayD<T::Acc>> = (order.levels.iter())
        .map(|_| buffers::take_array::<T::Acc>(shape))
        .collect();
    let mut views: Levels<ArrayViewMut<'_, T::Acc, _>> =
        accs.iter_mut().map(|a| a.view_mut()).collect();
    let result = order.fold::<T, _>(kind, &mut views, |i| blocks[i].view());
    drop(views);
    let reduced = accs.swap_remove(result);
    for spare in accs {
        buffers::give_buffer(spare.into_raw_vec_and_offset().0);
    }
    // No copy when `Acc` is `T`.
    Some(reduced.mapv_into_any(T::narrow))
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
pub(super) const TILE: usize = 16 * 1024;

/// Block `index` of `x` cut in `n` equal blocks along `dim` (which `n` divides).
pub(super) fn block<S: Data>(
    x: &ArrayBase<S, IxDyn>,
    dim: usize,
    n: usize,
    index: usize,
) -> ArrayViewD<'_, S::Elem> {
    let size = x.shape()[dim] / n;
    x.slice_axis(Axis(dim), Slice::from(index * size..(index + 1) * size))
}

/// The elementwise `kind` reduction, in `order`, of same-length `chunks` (one per
/// member, by group index; at least one), a cache-sized tile at a time.
pub(super) fn reduce_chunks<T: Element>(
    kind: ReduceKind,
    order: &ReductionOrder,
    chunks: &[&[T]],
) -> Option<Vec<T>> {
    let len = chunks.first()?.len();
    let mut reduced: Vec<T::Acc> = buffers::take(len);
    reduce_tiles::<T>(kind, order, chunks, &mut reduced);
    // Collected in place when `Acc` is `T`.
    Some(reduced.into_iter().map(T::narrow).collect())
}

/// [`reduce_chunks`] into `out` (of the chunks' length), for an element type that
/// reduces in itself (no rounding at the end): the same bits, no new buffer. No chunks:
/// `out` is left as it is. (The MPI mesh's reductions land in the operand's buffer.)
#[cfg(feature = "mpi")]
pub(super) fn reduce_chunks_into<T: Element<Acc = T>>(
    kind: ReduceKind,
    order: &ReductionOrder,
    chunks: &[&[T]],
    out: &mut [T],
) {
    if !chunks.is_empty() {
        reduce_tiles::<T>(kind, order, chunks, out);
    }
}

/// `out = ` the elementwise `kind` reduction of `chunks` (at least one, each as long as
/// `out`) in `order`, a tile at a time: the first level accumulates in `out`, the others
/// in scratch tiles.
fn reduce_tiles<T: Element>(
    kind: ReduceKind,
    order: &ReductionOrder,
    chunks: &[&[T]],
    out: &mut [T::Acc],
) {
    let len = out.len();
    let mut scratch: Levels<Vec<T::Acc>> = (1..order.levels.len())
        .map(|_| buffers::take(TILE.min(len)))
        .collect();
    for start in (0..len).step_by(TILE) {
        let tile = start..(start + TILE).min(len);
        let mut accs: Levels<ArrayViewMut1<'_, T::Acc>> = SmallVec::new();
        accs.push(ArrayViewMut1::from(&mut out[tile.clone()]));
        accs.extend((scratch.iter_mut()).map(|s| ArrayViewMut1::from(&mut s[..tile.len()])));
        let result = order.fold::<T, _>(kind, &mut accs, |i| {
            ArrayView1::from(&chunks[i][tile.clone()])
        });
        drop(accs);
        if result > 0 {
            out[tile.clone()].copy_from_slice(&scratch[result - 1][..tile.len()]);
        }
    }
    for spare in scratch {
        buffers::give_buffer(spare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    }

    fn order(mesh: &Mesh, device: usize, axes: &[&str]) -> ReductionOrder {
        let axes = names(axes);
        let group = Group::of(mesh, device, &axes).unwrap();
        ReductionOrder::of(mesh, &axes, &group).unwrap()
    }

    #[test]
    fn digits_are_prime_and_minor_first() {
        let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
        let both = order(&mesh, 6, &["model", "data"]);
        // Group order over [model, data] is model major; sorted is mesh order.
        assert_eq!(both.sorted, [0, 2, 4, 6, 1, 3, 5, 7]);
        assert_eq!(both.levels, [2, 2, 2]);
        // Listed the other way, the group has other indices but the same sorted devices.
        let group = Group::of(&mesh, 1, &names(&["data", "model"])).unwrap();
        let other = order(&mesh, 1, &["data", "model"]);
        let devices: Vec<usize> = other.sorted.iter().map(|&i| group.members[i]).collect();
        assert_eq!(devices, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(other.levels, both.levels);
        assert_eq!(order(&mesh, 6, &["data"]).levels, [2]);
        assert_eq!(order(&mesh, 6, &[]).levels, [1]);
        // Sub-axes cover digits of their axis: both halves of `model` are `model`.
        let halves = order(&mesh, 6, &["model:(2)2", "model:(1)2"]);
        assert_eq!(halves.levels, [2, 2]);
        assert_eq!(halves.sorted, [0, 2, 1, 3]);
        let mixed = Mesh::new([("x", 3), ("y", 12)]).unwrap();
        assert_eq!(order(&mixed, 0, &["x", "y"]).levels, [2, 2, 3, 3]);
        assert_eq!(order(&mixed, 0, &["y:(1)6"]).levels, [2, 3]);
        assert_eq!(order(&mixed, 0, &["x"]).levels, [3]);
    }

    /// Values whose f32 sum depends on how it is associated.
    const VALUES: [f32; 8] = [1e8, 1.0, -1e8, 3.0, 0.5, -2.5e7, 2.5e7, 7.0];

    #[test]
    fn the_fold_nests_minor_digits_first() {
        let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
        let both = order(&mesh, 0, &["model", "data"]);
        // Member `i` (group index over [model, data]) holds device `sorted` maps it to.
        let group = Group::of(&mesh, 0, &names(&["model", "data"])).unwrap();
        let value = |i: usize| VALUES[group.members[i]];
        let blocks: Vec<ArrayD<f32>> = (0..8)
            .map(|i| ArrayD::from_elem(ndarray::IxDyn(&[3]), value(i)))
            .collect();
        let views: Vec<ArrayViewD<'_, f32>> = blocks.iter().map(|b| b.view()).collect();
        let got = reduce_blocks(ReduceKind::Sum, &both, &views).unwrap();
        let v = |device: usize| VALUES[device];
        let want = ((v(0) + v(1)) + (v(2) + v(3))) + ((v(4) + v(5)) + (v(6) + v(7)));
        assert!(
            got.iter().all(|x| x.to_bits() == want.to_bits()),
            "{got} vs {want}"
        );
        let left = VALUES.iter().fold(0.0f32, |a, &b| a + b);
        assert_ne!(left.to_bits(), want.to_bits(), "association must matter");
        // One level: a left fold in group order.
        let single = ReductionOrder {
            sorted: (0..8).collect(),
            levels: vec![8],
        };
        let views: Vec<ArrayViewD<'_, f32>> = blocks.iter().map(|b| b.view()).collect();
        let got = reduce_blocks(ReduceKind::Sum, &single, &views).unwrap();
        let want = (0..8)
            .map(value)
            .fold(None, |a: Option<f32>, b| Some(a.map_or(b, |a| a + b)));
        assert_eq!(got[[0]].to_bits(), want.unwrap().to_bits());
    }

    #[test]
    fn chunks_fold_tile_by_tile_as_blocks_do() {
        let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
        let both = order(&mesh, 0, &["data", "model"]);
        let len = 2 * TILE + 5;
        let data: Vec<Vec<f32>> = (0..8)
            .map(|m| {
                (0..len)
                    .map(|i| VALUES[(m + i) % 8] * (1.0 + i as f32 * 1e-3))
                    .collect()
            })
            .collect();
        let chunks: Vec<&[f32]> = data.iter().map(Vec::as_slice).collect();
        let by_chunks = reduce_chunks(ReduceKind::Sum, &both, &chunks).unwrap();
        let views: Vec<ArrayViewD<'_, f32>> = data
            .iter()
            .map(|d| ArrayViewD::from_shape(ndarray::IxDyn(&[len]), d).unwrap())
            .collect();
        let by_blocks = reduce_blocks(ReduceKind::Sum, &both, &views).unwrap();
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&by_chunks), bits(by_blocks.as_slice().unwrap()));
    }

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
