//! Data movement as strided block copies. Transpose, slice, broadcast, reverse,
//! concatenate, pad and the dynamic slices only move elements: each is a copy of an
//! n-dim block from one strided layout in a flat buffer ([`Layout`]) to another. The
//! copy ([`copy`]) drops one-element dims, merges dims that are adjacent in both
//! layouts, and then moves the minor dim as contiguous runs (`copy_from_slice`), fills
//! it from one element (a broadcast), or, when the destination's minor dim is not the
//! source's, transposes: 4-byte elements (f32, i32) on CPUs with AVX2 in register
//! tiles ([`tiles`]), the rest in square tiles of [`TILE`] so that both sides stay in
//! cache.
//!
//! Every kernel's result is in standard layout. A copy gives the bits ndarray's
//! element-by-element copy gives. The generic kernels
//! stay the fallback for arrays whose elements do not fill one slice ([`Block::of`]),
//! and the tests compare both paths.

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Slice};
use smallvec::{SmallVec, smallvec};

use super::Dims;
use super::tiles::{self, Matrix};
use crate::ir::Element;
use crate::runtime::buffers::{self, Pooled};

/// Strides in elements, inline up to rank 6 (see [`Dims`]).
type Strides = SmallVec<[isize; 6]>;

/// Side of the square tiles a transposing copy moves at a time where [`tiles`] does
/// not take it.
const TILE: usize = 16;

/// Where an n-dim block's elements lie in a flat buffer: the element at multi-index `i`
/// is at `offset + Σ_d i[d] * strides[d]` (which must lie in the buffer for every `i`
/// in the block's shape).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Layout {
    /// Position of the first element.
    pub offset: isize,
    /// Step between neighbours along each dim (0 repeats an element).
    pub strides: Strides,
}

impl Layout {
    /// Row-major contiguous layout of `shape` from position 0.
    pub(crate) fn standard(shape: &[usize]) -> Layout {
        let mut strides: Strides = smallvec![1; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1].max(1) as isize;
        }
        Layout { offset: 0, strides }
    }

    /// The sub-block that starts at `start` and takes every `step[d]`-th element
    /// along dim `d`.
    pub(crate) fn window(&self, start: &[usize], step: &[usize]) -> Layout {
        let at = |d: usize| start[d] as isize * self.strides[d];
        Layout {
            offset: self.offset + (0..start.len()).map(at).sum::<isize>(),
            strides: (self.strides.iter().zip(step))
                .map(|(&s, &k)| s * k as isize)
                .collect(),
        }
    }
}

/// A block of `shape` read from `data` at `layout`.
#[derive(Clone, Debug)]
pub(crate) struct Block<'a, T> {
    data: &'a [T],
    shape: Dims,
    layout: Layout,
}

impl<'a, T: Pooled> Block<'a, T> {
    /// The block of `view` when its elements fill one slice in some dim order (a
    /// standard-layout array, its transposes and reversals); `None` otherwise (a
    /// strided slice, a broadcast view).
    pub(crate) fn of(view: ArrayViewD<'a, T>) -> Option<Self> {
        let data = view.to_slice_memory_order()?;
        let strides = Strides::from_slice(view.strides());
        // The slice starts at the lowest address: reversed dims start past it.
        let offset = (view.shape().iter().zip(&strides))
            .map(|(&n, &s)| {
                if s < 0 {
                    -s * (n.max(1) - 1) as isize
                } else {
                    0
                }
            })
            .sum();
        Some(Block {
            data,
            shape: Dims::from_slice(view.shape()),
            layout: Layout { offset, strides },
        })
    }

    /// Dim `i` of the result is dim `perm[i]` of the block (`perm` a permutation).
    pub(crate) fn permuted(self, perm: &[usize]) -> Self {
        Block {
            data: self.data,
            shape: perm.iter().map(|&d| self.shape[d]).collect(),
            layout: Layout {
                offset: self.layout.offset,
                strides: perm.iter().map(|&d| self.layout.strides[d]).collect(),
            },
        }
    }

    /// Elements `start[d]`, `start[d] + stride[d]`, ... below `limit[d]` along each dim
    /// (`start <= limit <= shape`, strides positive).
    pub(crate) fn sliced(self, start: &[usize], limit: &[usize], stride: &[usize]) -> Self {
        let shape = (0..self.shape.len())
            .map(|d| (limit[d] - start[d]).div_ceil(stride[d]))
            .collect();
        Block {
            data: self.data,
            shape,
            layout: self.layout.window(start, stride),
        }
    }

    /// The element order reversed along `dims`.
    pub(crate) fn reversed(self, dims: &[usize]) -> Self {
        let mut layout = self.layout;
        for &d in dims {
            layout.offset += (self.shape[d].max(1) - 1) as isize * layout.strides[d];
            layout.strides[d] = -layout.strides[d];
        }
        Block {
            data: self.data,
            shape: self.shape,
            layout,
        }
    }

    /// XLA `broadcast_in_dim` to `shape`: block dim `i` becomes dim `dims[i]`, of the
    /// same size or repeated from one element. `None` if it does not fit.
    pub(crate) fn broadcast(self, shape: &[usize], dims: &[usize]) -> Option<Self> {
        if dims.len() != self.shape.len() {
            return None;
        }
        let mut strides: Strides = smallvec![0; shape.len()];
        for (i, &d) in dims.iter().enumerate() {
            match (self.shape[i], shape.get(d)) {
                (n, Some(&m)) if n == m => strides[d] = self.layout.strides[i],
                (1, Some(_)) => {}
                _ => return None,
            }
        }
        Some(Block {
            data: self.data,
            shape: Dims::from_slice(shape),
            layout: Layout {
                offset: self.layout.offset,
                strides,
            },
        })
    }

    /// The block as a new standard-layout array, on a pooled buffer (see
    /// [`buffers::take_array`]).
    pub(crate) fn to_array(&self) -> ArrayD<T> {
        let mut out = buffers::take_array(&self.shape);
        let layout = Layout::standard(&self.shape);
        self.write(
            out.as_slice_mut().expect("a new array is standard"),
            &layout,
        );
        out
    }

    /// Writes the block into `into` at `at` (a layout of the block's shape).
    pub(crate) fn write(&self, into: &mut [T], at: &Layout) {
        copy(&self.shape, self.data, &self.layout, into, at);
    }
}

// ---- the kernels ------------------------------------------------------------------------

/// XLA `broadcast_in_dim`: operand dim `i` becomes result dim `dims[i]` (increasing).
pub(crate) fn broadcast_in_dim<T: Pooled>(
    a: ArrayViewD<'_, T>,
    shape: &[usize],
    dims: &[usize],
) -> Result<ArrayD<T>, String> {
    match Block::of(a.clone()) {
        Some(block) => (block.broadcast(shape, dims).map(|b| b.to_array()))
            .ok_or_else(|| generic::cannot_broadcast(a.shape(), shape, dims)),
        None => generic::broadcast_in_dim(a, shape, dims),
    }
}

/// `a` in standard layout (moved if it is already, copied otherwise).
pub(crate) fn standard_layout<T: Pooled>(a: ArrayD<T>) -> ArrayD<T> {
    if a.is_standard_layout() {
        return a;
    }
    match Block::of(a.view()) {
        Some(block) => block.to_array(),
        None => generic::standard_layout(a.view()),
    }
}

/// Row-major reshape of an array handed over: its buffer is moved, not copied, when
/// it is in standard layout.
pub(crate) fn reshape_owned<T: Pooled>(a: ArrayD<T>, shape: &[usize]) -> Result<ArrayD<T>, String> {
    let a = standard_layout(a);
    let from = Dims::from_slice(a.shape());
    a.into_shape_with_order(IxDyn(shape))
        .map_err(|e| generic::cannot_reshape(&from, shape, e))
}

/// Result dim `i` is operand dim `perm[i]`.
pub(crate) fn transpose<T: Pooled>(a: &ArrayD<T>, perm: &[usize]) -> ArrayD<T> {
    match Block::of(a.view()) {
        Some(block) => block.permuted(perm).to_array(),
        None => generic::transpose(a, perm),
    }
}

/// Elements `start[d]`, `start[d] + stride[d]`, ... below `limit[d]` along each dim.
pub(crate) fn slice<T: Pooled>(
    a: &ArrayD<T>,
    start: &[usize],
    limit: &[usize],
    stride: &[usize],
) -> ArrayD<T> {
    match Block::of(a.view()) {
        Some(block) => block.sliced(start, limit, stride).to_array(),
        None => generic::slice(a, start, limit, stride),
    }
}

/// Reverses the element order along `dims`.
pub(crate) fn reverse<T: Pooled>(a: &ArrayD<T>, dims: &[usize]) -> ArrayD<T> {
    match Block::of(a.view()) {
        Some(block) => block.reversed(dims).to_array(),
        None => generic::reverse(a, dims),
    }
}

/// The arrays joined along `dim` (same rank, same sizes on the other dims).
pub(crate) fn concatenate<T: Pooled>(
    arrays: &[ArrayViewD<'_, T>],
    dim: usize,
) -> Result<ArrayD<T>, String> {
    let blocks: Option<SmallVec<[Block<'_, T>; 4]>> =
        arrays.iter().map(|a| Block::of(a.clone())).collect();
    let (Some(blocks), Some(first)) = (blocks, arrays.first()) else {
        return generic::concatenate(arrays, dim);
    };
    let mut shape = Dims::from_slice(first.shape());
    if dim >= shape.len() {
        return Err(format!(
            "concatenate along dim {dim} of rank {}",
            shape.len()
        ));
    }
    shape[dim] = 0;
    for b in &blocks {
        let fits = b.shape.len() == shape.len()
            && (0..shape.len()).all(|d| d == dim || b.shape[d] == shape[d]);
        if !fits {
            return Err(format!(
                "cannot concatenate {:?} and {:?} along dim {dim}",
                first.shape(),
                b.shape
            ));
        }
        shape[dim] += b.shape[dim];
    }
    // The blocks cover the result: every element is written.
    let mut out = buffers::take_array(&shape);
    let flat = out.as_slice_mut().expect("a new array is standard");
    let layout = Layout::standard(&shape);
    let mut start: Dims = smallvec![0; shape.len()];
    let step: Dims = smallvec![1; shape.len()];
    for b in &blocks {
        b.write(flat, &layout.window(&start, &step));
        start[dim] += b.shape[dim];
    }
    Ok(out)
}

/// Edge padding (negative removes) and interior padding with `fill`: `low` elements
/// before each dim, `interior` between neighbours, `high` after (a result dim below
/// zero is empty).
pub(crate) fn pad<T: Pooled>(
    a: &ArrayD<T>,
    fill: T,
    low: &[i64],
    high: &[i64],
    interior: &[usize],
) -> ArrayD<T> {
    let Some(block) = Block::of(a.view()) else {
        return generic::pad(a, fill, low, high, interior);
    };
    let shape: Dims = (0..a.ndim())
        .map(|d| {
            let n = low[d] + generic::spread(a.shape()[d], interior[d]) as i64 + high[d];
            n.max(0) as usize
        })
        .collect();
    // Operand element `i` lands at `low + i * step`: keep those inside the result.
    let rank = shape.len();
    let (mut first, mut end, mut at): (Dims, Dims, Dims) =
        (smallvec![0; rank], smallvec![0; rank], smallvec![0; rank]);
    for d in 0..rank {
        let (step, n) = (interior[d] as i64 + 1, a.shape()[d] as i64);
        let lo = if low[d] >= 0 {
            0
        } else {
            (step - 1 - low[d]) / step
        };
        let hi = (shape[d] as i64 - low[d] + step - 1).div_euclid(step);
        first[d] = lo.min(n) as usize;
        end[d] = hi.clamp(first[d] as i64, n) as usize;
        at[d] = (low[d] + first[d] as i64 * step).max(0) as usize;
    }
    let mut out = buffers::filled(&shape, fill);
    let ones: Dims = smallvec![1; rank];
    let steps: Dims = interior.iter().map(|&k| k + 1).collect();
    block.sliced(&first, &end, &ones).write(
        out.as_slice_mut().expect("a new array is standard"),
        &Layout::standard(&shape).window(&at, &steps),
    );
    out
}

/// `out` with `update` written at `starts` (which fit), in place.
pub(crate) fn update_slice<T: Pooled>(
    out: ArrayD<T>,
    update: &ArrayD<T>,
    starts: &[usize],
) -> ArrayD<T> {
    let mut out = standard_layout(out);
    let ones: Dims = smallvec![1; starts.len()];
    let layout = Layout::standard(out.shape()).window(starts, &ones);
    match (Block::of(update.view()), out.as_slice_mut()) {
        (Some(block), Some(flat)) => block.write(flat, &layout),
        _ => generic::update_slice(&mut out, update, starts),
    }
    out
}

/// The elements of `data` read at `strides` over `shape` (each element once, strides
/// keeping every index inside `data`), in row-major order: a permuted copy, moved as
/// runs or transposed in tiles like the kernels above.
pub(crate) fn permuted_copy<T: Element>(shape: &[usize], data: &[T], strides: &[usize]) -> Vec<T> {
    let len = shape.iter().product();
    let Some(&first) = data.first().filter(|_| len > 0) else {
        return Vec::new();
    };
    // Every element is overwritten; `first` only makes the buffer without `Default`.
    let mut out = vec![first; len];
    let from = Layout {
        offset: 0,
        strides: strides.iter().map(|&s| s as isize).collect(),
    };
    copy(shape, data, &from, &mut out, &Layout::standard(shape));
    out
}

/// The generic kernels (ndarray's element-by-element copies): the fallback for arrays
/// whose elements do not fill one slice, and the tests' reference.
pub(crate) mod generic {
    use super::*;

    pub(crate) fn cannot_broadcast(from: &[usize], shape: &[usize], dims: &[usize]) -> String {
        format!("cannot broadcast {from:?} to {shape:?} along {dims:?}")
    }

    pub(crate) fn cannot_reshape(
        from: &[usize],
        shape: &[usize],
        e: impl std::fmt::Display,
    ) -> String {
        format!("cannot reshape {from:?} to {shape:?}: {e}")
    }

    /// See [`super::broadcast_in_dim`].
    pub(crate) fn broadcast_in_dim<T: Clone>(
        a: ArrayViewD<'_, T>,
        shape: &[usize],
        dims: &[usize],
    ) -> Result<ArrayD<T>, String> {
        let from = a.shape().to_vec();
        let mut v = a;
        for d in (0..shape.len()).filter(|d| !dims.contains(d)) {
            v.insert_axis_inplace(Axis(d));
        }
        v.broadcast(IxDyn(shape))
            .map(|b| b.to_owned())
            .ok_or_else(|| cannot_broadcast(&from, shape, dims))
    }

    /// See [`super::standard_layout`].
    pub(crate) fn standard_layout<T: Clone>(a: ArrayViewD<'_, T>) -> ArrayD<T> {
        a.as_standard_layout().into_owned()
    }

    /// See [`super::transpose`].
    pub(crate) fn transpose<T: Clone>(a: &ArrayD<T>, perm: &[usize]) -> ArrayD<T> {
        standard_layout(a.view().permuted_axes(IxDyn(perm)))
    }

    /// See [`super::slice`].
    pub(crate) fn slice<T: Clone>(
        a: &ArrayD<T>,
        start: &[usize],
        limit: &[usize],
        stride: &[usize],
    ) -> ArrayD<T> {
        a.slice_each_axis(|ax| {
            let d = ax.axis.index();
            Slice::new(
                start[d] as isize,
                Some(limit[d] as isize),
                stride[d] as isize,
            )
        })
        .to_owned()
    }

    /// See [`super::reverse`].
    pub(crate) fn reverse<T: Clone>(a: &ArrayD<T>, dims: &[usize]) -> ArrayD<T> {
        a.slice_each_axis(|ax| {
            let step = if dims.contains(&ax.axis.index()) {
                -1
            } else {
                1
            };
            Slice::new(0, None, step)
        })
        .as_standard_layout()
        .into_owned()
    }

    /// See [`super::concatenate`].
    pub(crate) fn concatenate<T: Pooled>(
        arrays: &[ArrayViewD<'_, T>],
        dim: usize,
    ) -> Result<ArrayD<T>, String> {
        (ndarray::concatenate(Axis(dim), arrays).map(super::standard_layout))
            .map_err(|e| e.to_string())
    }

    /// The extent of `n` elements with `interior` padding between neighbours.
    pub(crate) fn spread(n: usize, interior: usize) -> usize {
        match n {
            0 => 0,
            n => (n - 1) * (interior + 1) + 1,
        }
    }

    /// See [`super::pad`]: the operand is first written with stride `interior + 1` into
    /// an array of `fill` that has room for the positive edges, then the negative edges
    /// are cut off.
    pub(crate) fn pad<T: Clone>(
        a: &ArrayD<T>,
        fill: T,
        low: &[i64],
        high: &[i64],
        interior: &[usize],
    ) -> ArrayD<T> {
        let grow = |p: i64| p.max(0) as usize;
        let cut = |p: i64| (-p).max(0) as usize;
        let spread = |d: usize| spread(a.shape()[d], interior[d]);
        let grown: Vec<usize> = (0..a.ndim())
            .map(|d| grow(low[d]) + spread(d) + grow(high[d]))
            .collect();
        let mut out = ArrayD::from_elem(IxDyn(&grown), fill);
        out.slice_each_axis_mut(|ax| {
            let d = ax.axis.index();
            let s = grow(low[d]);
            Slice::new(
                s as isize,
                Some((s + spread(d)) as isize),
                (interior[d] + 1) as isize,
            )
        })
        .assign(a);
        out.slice_each_axis_inplace(|ax| {
            let d = ax.axis.index();
            let end = grown[d].saturating_sub(cut(high[d]));
            Slice::new(cut(low[d]).min(end) as isize, Some(end as isize), 1)
        });
        standard_layout(out.view())
    }

    /// See [`super::update_slice`].
    pub(crate) fn update_slice<T: Clone>(
        out: &mut ArrayD<T>,
        update: &ArrayD<T>,
        starts: &[usize],
    ) {
        out.slice_each_axis_mut(|ax| {
            let d = ax.axis.index();
            Slice::from(starts[d]..starts[d] + update.shape()[d])
        })
        .assign(update);
    }
}

/// One dim of a copy: its size and its steps in the source and the destination.
#[derive(Clone, Copy, Debug)]
struct Dim {
    n: usize,
    from: isize,
    to: isize,
}

/// Copies the block of `shape` at `from` in `src` to `to` in `dst`.
fn copy<T: Element>(shape: &[usize], src: &[T], from: &Layout, dst: &mut [T], to: &Layout) {
    if shape.contains(&0) {
        return;
    }
    // One-element dims move nothing; a dim whose steps are its inner neighbour's
    // whole extent in both layouts continues it.
    let mut dims: SmallVec<[Dim; 6]> = SmallVec::with_capacity(shape.len());
    for (d, &n) in shape.iter().enumerate().filter(|&(_, &n)| n > 1) {
        let (from, to) = (from.strides[d], to.strides[d]);
        match dims.last_mut() {
            Some(outer) if outer.from == from * n as isize && outer.to == to * n as isize => {
                *outer = Dim {
                    n: outer.n * n,
                    from,
                    to,
                };
            }
            _ => dims.push(Dim { n, from, to }),
        }
    }
    let minor = dims.pop().unwrap_or(Dim {
        n: 1,
        from: 1,
        to: 1,
    });
    // A destination run whose source is strided, while another dim is contiguous in
    // the source: a transpose, copied in tiles over the two dims.
    let partner = (minor.to == 1 && minor.from != 1 && minor.from != 0)
        .then(|| dims.iter().rposition(|d| d.from == 1 && d.to != 0))
        .flatten();
    match partner {
        Some(p) => {
            let partner = dims.remove(p);
            each_offset(&dims, from.offset, to.offset, |s, t| {
                transpose_block(src, dst, s, t, partner, minor)
            });
        }
        // Short contiguous runs of a length known here move as one fixed-size copy each
        // (a few register moves) instead of a loop over the run.
        None => match (minor.from, minor.to, minor.n) {
            (1, 1, 4) => each_offset(&dims, from.offset, to.offset, |s, t| {
                run_of::<T, 4>(src, dst, s, t)
            }),
            (1, 1, 8) => each_offset(&dims, from.offset, to.offset, |s, t| {
                run_of::<T, 8>(src, dst, s, t)
            }),
            (1, 1, 16) => each_offset(&dims, from.offset, to.offset, |s, t| {
                run_of::<T, 16>(src, dst, s, t)
            }),
            _ => each_offset(&dims, from.offset, to.offset, |s, t| {
                run(src, dst, s, t, minor)
            }),
        },
    }
}

/// Copies the `N` contiguous elements at `s` to `t`.
#[inline(always)]
fn run_of<T: Copy, const N: usize>(src: &[T], dst: &mut [T], s: isize, t: isize) {
    let (s, t) = (s as usize, t as usize);
    dst[t..t + N].copy_from_slice(&src[s..s + N]);
}

/// Calls `f` with the source and destination offsets of every multi-index over `dims`
/// (row-major), starting from `s` and `t`. The last dim is a plain loop, the others
/// count as an odometer.
fn each_offset(dims: &[Dim], mut s: isize, mut t: isize, mut f: impl FnMut(isize, isize)) {
    let Some((last, outer)) = dims.split_last() else {
        return f(s, t);
    };
    let mut idx: Dims = smallvec![0; outer.len()];
    loop {
        let (mut si, mut ti) = (s, t);
        for _ in 0..last.n {
            f(si, ti);
            si += last.from;
            ti += last.to;
        }
        let mut d = outer.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            s += outer[d].from;
            t += outer[d].to;
            if idx[d] < outer[d].n {
                break;
            }
            idx[d] = 0;
            s -= outer[d].from * outer[d].n as isize;
            t -= outer[d].to * outer[d].n as isize;
        }
    }
}

/// Copies the `m.n` elements of the minor dim from `s` to `t`.
fn run<T: Copy>(src: &[T], dst: &mut [T], s: isize, t: isize, m: Dim) {
    let (s, t, n) = (s as usize, t as usize, m.n);
    match (m.from, m.to) {
        (1, 1) if n < SHORT_RUN => copy_short(&src[s..s + n], &mut dst[t..t + n]),
        (1, 1) => dst[t..t + n].copy_from_slice(&src[s..s + n]),
        (0, 1) => dst[t..t + n].fill(src[s]),
        (from, to) => {
            for j in 0..n as isize {
                dst[(t as isize + j * to) as usize] = src[(s as isize + j * from) as usize];
            }
        }
    }
}

/// Runs shorter than this many elements are copied inline rather than by a `memcpy`
/// call, which costs more than it moves for a few elements (the channels of a strided
/// slice or an interior pad over NHWC images).
const SHORT_RUN: usize = 32;

/// Copies `src` into `dst` (of the same length) four elements at a time, each copy of
/// a fixed length so that it compiles to register moves.
#[inline(always)]
fn copy_short<T: Copy>(src: &[T], dst: &mut [T]) {
    let mut to = dst.chunks_exact_mut(4);
    let mut from = src.chunks_exact(4);
    for (to, from) in to.by_ref().zip(from.by_ref()) {
        to.copy_from_slice(from);
    }
    for (to, from) in to.into_remainder().iter_mut().zip(from.remainder()) {
        *to = *from;
    }
}

/// Copies the `p.n x m.n` block of the partner dim `p` (contiguous in the source) and
/// the minor dim `m` (contiguous in the destination) from `s` to `t`: by [`tiles`]
/// where it takes the copy (4-byte elements on AVX2, both other steps positive), else
/// by [`tile`].
fn transpose_block<T: Element>(src: &[T], dst: &mut [T], s: isize, t: isize, p: Dim, m: Dim) {
    let registers = p.to > 0
        && m.from > 0
        && tiles::transpose(
            src,
            Matrix {
                offset: s as usize,
                row: m.from as usize,
            },
            dst,
            Matrix {
                offset: t as usize,
                row: p.to as usize,
            },
            [m.n, p.n],
        );
    if !registers {
        tile(src, dst, s, t, p, m);
    }
}

/// Copies the `p.n x m.n` block of the partner dim `p` (contiguous in the source) and
/// the minor dim `m` (contiguous in the destination) from `s` to `t`, tile by tile: a
/// tile's source runs are read into a local square, whose columns are written as
/// destination runs.
fn tile<T: Copy>(src: &[T], dst: &mut [T], s: isize, t: isize, p: Dim, m: Dim) {
    // Every cell read is written first; the source's first element only fills it.
    let mut square = [[src[s as usize]; TILE]; TILE];
    for i0 in (0..p.n).step_by(TILE) {
        let rows = TILE.min(p.n - i0);
        for j0 in (0..m.n).step_by(TILE) {
            let cols = TILE.min(m.n - j0);
            for (j, line) in square[..cols].iter_mut().enumerate() {
                let from = (s + i0 as isize + (j0 + j) as isize * m.from) as usize;
                line[..rows].copy_from_slice(&src[from..from + rows]);
            }
            for i in 0..rows {
                let row = (t + (i0 + i) as isize * p.to) as usize + j0;
                for (out, line) in dst[row..row + cols].iter_mut().zip(&square) {
                    *out = line[i];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{Array, ArrayD, Axis, IxDyn, Slice};
    use proptest::prelude::*;

    use super::*;

    /// How a test operand's elements lie in memory.
    #[derive(Clone, Copy, Debug)]
    enum Arrangement {
        /// Row-major.
        Standard,
        /// Another dim order (a transpose's storage).
        Permuted,
        /// Dim 0 reversed (negative strides).
        Reversed,
        /// Every second element of a larger array along dim 0: no one slice, so the
        /// kernels take the generic path.
        Strided,
    }

    fn arrangement() -> impl Strategy<Value = Arrangement> {
        prop_oneof![
            Just(Arrangement::Standard),
            Just(Arrangement::Permuted),
            Just(Arrangement::Reversed),
            Just(Arrangement::Strided),
        ]
    }

    /// An f32 array of `shape` holding distinct values (from `first`), laid out as `how`.
    fn array(shape: &[usize], how: Arrangement, first: f32) -> ArrayD<f32> {
        let count = |shape: &[usize]| shape.iter().product::<usize>();
        let values = |n: usize| (0..n).map(|i| first + i as f32);
        let a = |shape: &[usize]| {
            Array::from_iter(values(count(shape)))
                .into_shape_with_order(IxDyn(shape))
                .unwrap()
        };
        let rank = shape.len();
        match how {
            Arrangement::Standard => a(shape),
            Arrangement::Permuted => {
                let reversed: Vec<usize> = shape.iter().rev().copied().collect();
                a(&reversed).permuted_axes(IxDyn(&(0..rank).rev().collect::<Vec<_>>()))
            }
            Arrangement::Reversed => {
                let mut x = a(shape);
                if rank > 0 {
                    x.invert_axis(Axis(0));
                }
                x
            }
            Arrangement::Strided => {
                let mut twice = shape.to_vec();
                if let Some(n) = twice.first_mut() {
                    *n *= 2;
                }
                let mut x = a(&twice);
                if rank > 0 {
                    x.slice_axis_inplace(Axis(0), Slice::new(0, None, 2));
                }
                x
            }
        }
    }

    fn shape() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(0usize..6, 0..5)
    }

    /// Asserts that `fast` has `reference`'s shape and bits, in standard layout.
    fn same(fast: &ArrayD<f32>, reference: &ArrayD<f32>) -> Result<(), TestCaseError> {
        prop_assert!(fast.is_standard_layout());
        prop_assert_eq!(fast.shape(), reference.shape());
        let bits = |a: &ArrayD<f32>| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(fast), bits(reference));
        Ok(())
    }

    #[test]
    fn only_one_slice_makes_a_block() {
        let shape = [3, 4];
        for (how, fits) in [
            (Arrangement::Standard, true),
            (Arrangement::Permuted, true),
            (Arrangement::Reversed, true),
            (Arrangement::Strided, false),
        ] {
            assert_eq!(Block::of(array(&shape, how, 0.0).view()).is_some(), fits);
        }
        let row = array(&[4], Arrangement::Standard, 0.0);
        let broadcast = row.broadcast(IxDyn(&shape)).unwrap();
        assert!(Block::of(broadcast).is_none());
    }

    #[test]
    fn copies_merge_dims_and_tile_transposes() {
        // A transposed matrix larger than a tile, a 3-D transpose keeping the minor dim,
        // a broadcast of a column: each against the generic kernel.
        let m = array(&[37, 21], Arrangement::Standard, 0.0);
        assert_eq!(transpose(&m, &[1, 0]), generic::transpose(&m, &[1, 0]));
        let t = array(&[3, 5, 7], Arrangement::Standard, 0.0);
        assert_eq!(
            transpose(&t, &[1, 0, 2]),
            generic::transpose(&t, &[1, 0, 2])
        );
        let c = array(&[5, 1], Arrangement::Standard, 0.0);
        assert_eq!(
            broadcast_in_dim(c.view(), &[5, 9], &[0, 1]).unwrap(),
            generic::broadcast_in_dim(c.view(), &[5, 9], &[0, 1]).unwrap()
        );
    }

    #[test]
    fn short_runs_match_generic() {
        // Minor runs of 4, 8 and 16 elements (the fixed-size copies) and one of 5, kept by
        // a transpose of the outer dims, cut by a slice and joined by a concatenate.
        for n in [4, 5, 8, 16] {
            let a = array(&[3, 5, 2, n], Arrangement::Standard, 0.0);
            let perm = [2, 0, 1, 3];
            assert_eq!(transpose(&a, &perm), generic::transpose(&a, &perm));
            let b = array(&[3, 5, 2, 2 * n], Arrangement::Standard, 7.0);
            let (start, limit, stride) = ([0, 1, 0, n], [3, 5, 2, 2 * n], [1, 1, 1, 1]);
            assert_eq!(
                slice(&b, &start, &limit, &stride),
                generic::slice(&b, &start, &limit, &stride)
            );
            let views = [a.view(), a.view()];
            assert_eq!(
                concatenate(&views, 3).unwrap(),
                generic::concatenate(&views, 3).unwrap()
            );
        }
    }

    proptest! {
        #[test]
        fn permuted_copy_matches_generic(
            shape in shape(),
            permuted in any::<bool>(),
            keys in prop::collection::vec(any::<u32>(), 5),
        ) {
            let how = if permuted { Arrangement::Permuted } else { Arrangement::Standard };
            let a = array(&shape, how, 2.0);
            let mut perm: Vec<usize> = (0..shape.len()).collect();
            perm.sort_by_key(|&d| keys[d]);
            let data = a.as_slice_memory_order().unwrap();
            let sizes: Vec<usize> = perm.iter().map(|&d| shape[d]).collect();
            let strides: Vec<usize> = perm.iter().map(|&d| a.strides()[d] as usize).collect();
            let copied = ArrayD::from_shape_vec(IxDyn(&sizes), permuted_copy(&sizes, data, &strides)).unwrap();
            same(&copied, &generic::transpose(&a, &perm))?;
        }

        #[test]
        fn transpose_matches_generic(
            shape in shape(),
            how in arrangement(),
            keys in prop::collection::vec(any::<u32>(), 5),
        ) {
            let a = array(&shape, how, 1.0);
            let mut perm: Vec<usize> = (0..shape.len()).collect();
            perm.sort_by_key(|&d| keys[d]);
            same(&transpose(&a, &perm), &generic::transpose(&a, &perm))?;
            same(&standard_layout(a.clone()), &generic::standard_layout(a.view()))?;
        }

        /// Transposes large enough for the 8x8 register tiles ([`tiles`]), their edges
        /// and blocks of tiles: 2-D and 3-D, with the source standard, permuted,
        /// reversed (negative strides: the generic tiles) and strided (every second
        /// element of dim 0), f32 and i32.
        #[test]
        fn tiled_transposes_match_generic(
            shape in prop::collection::vec(1usize..80, 2..4),
            how in arrangement(),
            keys in prop::collection::vec(any::<u32>(), 3),
        ) {
            let a = array(&shape, how, 0.25);
            let mut perm: Vec<usize> = (0..shape.len()).collect();
            perm.sort_by_key(|&d| keys[d]);
            same(&transpose(&a, &perm), &generic::transpose(&a, &perm))?;
            let i = a.mapv(|x| (x * 4.0) as i32);
            prop_assert_eq!(transpose(&i, &perm), generic::transpose(&i, &perm));
        }

        #[test]
        fn slice_and_reverse_match_generic(
            shape in shape(),
            how in arrangement(),
            cuts in prop::collection::vec((any::<u16>(), any::<u16>(), 1usize..4, any::<bool>()), 5),
        ) {
            let a = array(&shape, how, -3.0);
            let rank = shape.len();
            let (mut start, mut limit) = (vec![0; rank], vec![0; rank]);
            for d in 0..rank {
                let (p, q) = (cuts[d].0 as usize % (shape[d] + 1), cuts[d].1 as usize % (shape[d] + 1));
                (start[d], limit[d]) = (p.min(q), p.max(q));
            }
            let stride: Vec<usize> = cuts[..rank].iter().map(|c| c.2).collect();
            same(&slice(&a, &start, &limit, &stride), &generic::slice(&a, &start, &limit, &stride))?;
            let dims: Vec<usize> = (0..rank).filter(|&d| cuts[d].3).collect();
            same(&reverse(&a, &dims), &generic::reverse(&a, &dims))?;
        }

        #[test]
        fn broadcast_matches_generic(
            shape in shape(),
            how in arrangement(),
            keep in prop::collection::vec((any::<bool>(), any::<bool>()), 5),
        ) {
            // The operand has the kept dims of `shape`, some of them size 1.
            let dims: Vec<usize> = (0..shape.len()).filter(|&d| keep[d].0).collect();
            let from: Vec<usize> = dims.iter().map(|&d| if keep[d].1 { 1 } else { shape[d] }).collect();
            let a = array(&from, how, 0.5);
            same(
                &broadcast_in_dim(a.view(), &shape, &dims).unwrap(),
                &generic::broadcast_in_dim(a.view(), &shape, &dims).unwrap(),
            )?;
        }

        #[test]
        fn concatenate_matches_generic(
            shape in prop::collection::vec(0usize..5, 1..4),
            parts in prop::collection::vec((0usize..4, arrangement()), 1..4),
            dim in 0usize..3,
        ) {
            let dim = dim % shape.len();
            let arrays: Vec<ArrayD<f32>> = (parts.iter().enumerate())
                .map(|(i, &(n, how))| {
                    let mut s = shape.clone();
                    s[dim] = n;
                    array(&s, how, 100.0 * i as f32)
                })
                .collect();
            let views: Vec<_> = arrays.iter().map(|a| a.view()).collect();
            same(&concatenate(&views, dim).unwrap(), &generic::concatenate(&views, dim).unwrap())?;
        }

        #[test]
        fn pad_matches_generic(
            shape in shape(),
            how in arrangement(),
            edges in prop::collection::vec((-3i64..4, -3i64..4, 0usize..3), 5),
        ) {
            let a = array(&shape, how, 1.0);
            let rank = shape.len();
            let interior: Vec<usize> = edges[..rank].iter().map(|e| e.2).collect();
            let mut low: Vec<i64> = edges[..rank].iter().map(|e| e.0).collect();
            let mut high: Vec<i64> = edges[..rank].iter().map(|e| e.1).collect();
            // Keep every result dim at least 0 (the shape rule's condition).
            for d in 0..rank {
                let spread = generic::spread(shape[d], interior[d]) as i64;
                while low[d] + spread + high[d] < 0 {
                    low[d] += 1;
                    high[d] += 1;
                }
            }
            same(
                &pad(&a, -1.0, &low, &high, &interior),
                &generic::pad(&a, -1.0, &low, &high, &interior),
            )?;
        }

        #[test]
        fn update_slice_and_reshape_match_generic(
            shape in shape(),
            how in arrangement(),
            update_how in arrangement(),
            corner in prop::collection::vec((any::<u16>(), any::<u16>()), 5),
        ) {
            let rank = shape.len();
            let (mut starts, mut sizes) = (vec![0; rank], vec![0; rank]);
            for d in 0..rank {
                sizes[d] = corner[d].0 as usize % (shape[d] + 1);
                starts[d] = corner[d].1 as usize % (shape[d] - sizes[d] + 1);
            }
            let x = array(&shape, how, 0.0);
            let u = array(&sizes, update_how, 1000.0);
            let mut reference = x.clone();
            generic::update_slice(&mut reference, &u, &starts);
            same(&update_slice(x.clone(), &u, &starts), &reference)?;
            // Reshape to the flat vector and back.
            let flat = [shape.iter().product::<usize>()];
            let reference = x.to_shape((IxDyn(&flat), ndarray::Order::RowMajor)).unwrap().to_owned();
            same(&reshape_owned(x, &flat).unwrap(), &reference)?;
        }
    }
}
