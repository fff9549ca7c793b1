//! Where the loop reads a leaf's elements ([`Source`]): a result's buffer handed over,
//! a scalar splat, a block repeated along the outer dims, or a strided walk over the
//! value's memory; worked out from the shapes at plan time ([`Layout`]) or per run for
//! a value of another shape (a deferred broadcast).

use std::borrow::Cow;

use ndarray::ArrayD;

use crate::ir::{Literal, with_literal};
use crate::runtime::kernels::{Dims, Operand, map_strides, row_major};

use super::CHUNK;
use super::code::bool_lane;

/// Where a leaf's elements are, as the loop reads them.
pub(super) enum Source<'a> {
    /// In the buffer of result `.0` (the leaf was handed over), at the loop's flat
    /// index.
    Buffer(usize),
    /// One element everywhere (a scalar broadcast: every stride 0), in a register
    /// filled once per run.
    Splat(f32),
    /// A contiguous block repeated along the outer dims (a bias row over the rows:
    /// the strides row-major over the minor dims, 0 over the others), every chunk
    /// starting at a repeat: in a register filled once per run with the block
    /// repeated, element `ix` of the loop at `flat(ix) % block.len()`.
    Repeat(Cow<'a, [f32]>),
    /// In `data` (row-major), element `ix` of the loop at `sum(ix[d] * strides[d])`
    /// (see [`Walk`]); `contiguous`: the strides are the loop shape's row-major ones.
    Strided {
        data: Cow<'a, [f32]>,
        walk: &'a Walk,
        contiguous: bool,
    },
}

/// How a leaf's elements are read over the loop, worked out from the shapes alone (the
/// value's, the broadcast's dims, the loop's): what [`Source`] it is with the data.
#[derive(Debug, Clone)]
pub(super) enum Layout {
    /// Every stride 0: [`Source::Splat`].
    Splat,
    /// A block of this many elements repeated: [`Source::Repeat`].
    Repeat(usize),
    /// [`Source::Strided`].
    Strided { walk: Walk, contiguous: bool },
}

/// A strided walk over the loop: `shape` is the loop's and `strides` are over it, with
/// dims merged where they walk as one (see [`coalesce`]), so the runs a chunk is loaded
/// in are as long as they can be.
#[derive(Debug, Clone)]
pub(super) struct Walk {
    shape: Dims,
    strides: Dims,
}

impl Layout {
    /// The layout of a value of `len` elements walked with `value_strides` over
    /// `value_shape`, read through `dims` (see [`Leaf`](super::Leaf)) over the loop's `shape`, every
    /// chunk starting at a multiple of `cut` (see [`Group::cut`](super::Group::cut)).
    pub(super) fn new(
        value_shape: &[usize],
        value_strides: &[usize],
        len: usize,
        dims: Option<&[usize]>,
        shape: &[usize],
        cut: usize,
    ) -> Result<Layout, String> {
        let identity: Dims;
        let dims = match dims {
            Some(dims) => dims,
            None => {
                identity = (0..value_shape.len()).collect();
                &identity
            }
        };
        let strides = map_strides(value_shape, value_strides, shape, dims)?;
        if strides.iter().all(|&s| s == 0) && len > 0 {
            return Ok(Layout::Splat);
        }
        let contiguous = strides == row_major(shape);
        if !contiguous
            && let Some(period) = repeat_period(&strides, shape)
            && period <= CHUNK
            && cut.is_multiple_of(period)
            && period <= len
        {
            return Ok(Layout::Repeat(period));
        }
        let (shape, strides) = coalesce(shape, &strides);
        Ok(Layout::Strided {
            walk: Walk { shape, strides },
            contiguous,
        })
    }
}

/// The elements of `lit` in row-major order as lanes (see [`Lane`](super::code::Lane)): f32 in place, the
/// others converted (bool as [`bool_lane`]s, i32 as their bits, narrow floats widened).
pub(super) fn lanes(lit: &Literal) -> Cow<'_, [f32]> {
    match lit {
        Literal::F32(a) => match a.as_slice() {
            Some(s) => Cow::Borrowed(s),
            None => Cow::Owned(converted(a, |v| v)),
        },
        Literal::Bool(a) => Cow::Owned(converted(a, bool_lane)),
        Literal::BF16(a) => Cow::Owned(converted(a, |v| v.to_f32())),
        Literal::F16(a) => Cow::Owned(converted(a, |v| v.to_f32())),
        Literal::I32(a) => Cow::Owned(converted(a, |v| f32::from_bits(v.cast_unsigned()))),
    }
}

/// The elements of `a` in row-major order converted by `f` to lanes: a contiguous
/// array through its slice (a loop the compiler vectorises), any other element by
/// element.
pub(super) fn converted<T: Copy>(a: &ArrayD<T>, f: impl Fn(T) -> f32) -> Vec<f32> {
    match a.as_slice() {
        Some(s) => s.iter().map(|&v| f(v)).collect(),
        None => a.iter().map(|&v| f(v)).collect(),
    }
}

/// The elements of leaf value `x` as lanes and their layout read through `dims` (see
/// [`Leaf`](super::Leaf)) over `shape`, every chunk starting at a multiple of `cut` (see
/// [`Group::cut`](super::Group::cut)), worked out from the value as given (a deferred broadcast included).
pub(super) fn worked_out<'x>(
    x: &'x Operand<'_>,
    dims: Option<&[usize]>,
    shape: &[usize],
    cut: usize,
) -> Result<(Cow<'x, [f32]>, Layout), String> {
    let shape_of = |lit: &Literal| with_literal!(lit, a => Dims::from_slice(a.shape()));
    // The value's elements, shape and strides over that shape.
    let (data, value_shape, value_strides) = match x {
        Operand::Value(v) => {
            let shape = shape_of(v);
            let strides = row_major(&shape);
            (lanes(v), shape, strides)
        }
        Operand::Broadcast {
            source,
            shape: to,
            dims,
        } => {
            let from = shape_of(source);
            let strides = map_strides(&from, &row_major(&from), to, dims)?;
            (lanes(source), Dims::from_slice(to), strides)
        }
    };
    let layout = Layout::new(&value_shape, &value_strides, data.len(), dims, shape, cut)?;
    Ok((data, layout))
}

impl<'a> Source<'a> {
    /// The source of the elements `data` (of at least one element if `layout` is a
    /// splat, of at least the block if it repeats one) read as `layout` says; a walk is
    /// borrowed from the layout (the group's, or one worked out for the run: a source
    /// stays a few words, the sources of a run are collected by value).
    pub(super) fn laid(data: Cow<'a, [f32]>, layout: &'a Layout) -> Self {
        match layout {
            Layout::Splat => Source::Splat(data[0]),
            &Layout::Repeat(period) => Source::Repeat(match data {
                Cow::Borrowed(all) => Cow::Borrowed(&all[..period]),
                Cow::Owned(mut all) => {
                    all.truncate(period);
                    Cow::Owned(all)
                }
            }),
            Layout::Strided { walk, contiguous } => Source::Strided {
                data,
                walk,
                contiguous: *contiguous,
            },
        }
    }

    /// Fills `reg` (a register up to the longest chunk) if the source is held in its
    /// register for the run: a splat, or a repeated block (each chunk starts at a
    /// repeat, so the register's element `i` is the block's `i % period`).
    pub(super) fn fill(&self, reg: &mut [f32]) {
        match self {
            Source::Splat(v) => reg.fill(*v),
            Source::Repeat(block) => {
                for run in reg.chunks_mut(block.len()) {
                    run.copy_from_slice(&block[..run.len()]);
                }
            }
            Source::Buffer(_) | Source::Strided { .. } => {}
        }
    }

    /// Writes the elements at flat indices `start..start + out.len()` of the loop
    /// into `out` if the source is loaded chunk by chunk (strided, not contiguous);
    /// else (read in place, or held in its register for the run) nothing.
    ///
    /// The chunk is loaded run by run along the minor dim, the runs of one row of the
    /// next dim (`mid`) in a tight loop (the run's offset stepped by that dim's
    /// stride), the dims above stepped like an odometer once a row: a leaf broadcast
    /// along a short minor dim (`[.., 1]` read as `[.., 16]`: runs of one value) or
    /// a middle one (`[a, c]` read as `[a, b, c]`) costs a few vector stores a run.
    #[inline(always)]
    pub(super) fn load(&self, out: &mut [f32], start: usize) {
        let Source::Strided {
            data,
            walk,
            contiguous: false,
        } = self
        else {
            return;
        };
        let (shape, strides) = (&walk.shape, &walk.strides);
        // Not read in place, so not contiguous and of rank >= 1: runs along the minor dim.
        let Some((&minor, outer_dims)) = shape.split_last() else {
            return;
        };
        let (outer_strides, step) = strides.split_at(outer_dims.len());
        let step = step[0];
        // The row dim of the runs (the minor dim's neighbour; one row of one run
        // without it) and the dims above it.
        let (mid, mid_stride, above, above_strides) =
            match (outer_dims.split_last(), outer_strides.split_last()) {
                (Some((&n, above)), Some((&s, above_strides))) => (n, s, above, above_strides),
                _ => (1, 0, outer_dims, outer_strides),
            };
        // The loop index of `start`: its place in the minor dim, its run in the row,
        // the dims above (and the offset of the row).
        let mut within = start % minor;
        let runs = start / minor;
        let mut run_ix = runs % mid;
        let mut rest = runs / mid;
        let mut index: Dims = Dims::from_elem(0, above.len());
        let mut base = 0;
        for ((i, &n), &s) in index.iter_mut().zip(above).zip(above_strides).rev() {
            *i = rest % n;
            base += *i * s;
            rest /= n;
        }
        let mut filled = 0;
        while filled < out.len() {
            while run_ix < mid && filled < out.len() {
                let run = (minor - within).min(out.len() - filled);
                let at = base + run_ix * mid_stride;
                load_run(&mut out[filled..filled + run], data, at, within, step);
                filled += run;
                within = 0;
                run_ix += 1;
            }
            run_ix = 0;
            for ((i, &n), &s) in index.iter_mut().zip(above).zip(above_strides).rev() {
                *i += 1;
                base += s;
                if *i < n {
                    break;
                }
                base -= n * s;
                *i = 0;
            }
        }
    }
}

/// Loads one run of `dst.len()` elements of a minor dim walked with `step` from
/// element `within` of the run whose first element is `data[at]`: one value for a
/// broadcast (`step` 0), a contiguous copy (`step` 1), else a strided gather.
#[inline(always)]
fn load_run(dst: &mut [f32], data: &[f32], at: usize, within: usize, step: usize) {
    match step {
        0 => splat(dst, data[at]),
        1 => copy(dst, &data[at + within..at + within + dst.len()]),
        s => {
            for (k, d) in dst.iter_mut().enumerate() {
                *d = data[at + (within + k) * s];
            }
        }
    }
}

/// The width of the blocks [`splat`] and [`copy`] write a short run in (a vector
/// register of f32 under AVX2).
const BLOCK: usize = 8;

/// Fills `dst` with `v` in whole blocks, then the tail in halving pieces: a short run
/// (a row of 16, of 4) is a few vector stores, neither a loop sized for long fills nor
/// masked stores (which the compiler picks for a plain tail loop, and which cost tens
/// of cycles each on some CPUs).
#[inline(always)]
fn splat(dst: &mut [f32], v: f32) {
    let mut blocks = dst.chunks_exact_mut(BLOCK);
    for b in &mut blocks {
        b.copy_from_slice(&[v; BLOCK]);
    }
    in_pieces(blocks.into_remainder(), |piece, _| piece.fill(v));
}

/// Copies `src` into `dst` (of one length): a short run in whole blocks then the tail
/// in halving pieces (as [`splat`]), without a call to `memcpy`; a long one by
/// `copy_from_slice`.
#[inline(always)]
fn copy(dst: &mut [f32], src: &[f32]) {
    if dst.len() >= 8 * BLOCK {
        dst.copy_from_slice(src);
        return;
    }
    let mut blocks = dst.chunks_exact_mut(BLOCK);
    let mut from = src.chunks_exact(BLOCK);
    for (b, s) in (&mut blocks).zip(&mut from) {
        b.copy_from_slice(s);
    }
    let from = from.remainder();
    in_pieces(blocks.into_remainder(), |piece, at| {
        piece.copy_from_slice(&from[at..at + piece.len()]);
    });
}

/// Calls `write` on `tail` (shorter than a [`BLOCK`]) in pieces of 4, 2 and 1
/// elements (each with its offset in `tail`), each a piece of fixed length.
#[inline(always)]
fn in_pieces(tail: &mut [f32], mut write: impl FnMut(&mut [f32], usize)) {
    let mut at = 0;
    for width in [4, 2, 1] {
        if tail.len() - at >= width {
            write(&mut tail[at..at + width], at);
            at += width;
        }
    }
}

/// `shape` and `strides` with each dim merged into the next where walking the two in
/// row-major order walks one dim (`strides[d] == strides[d + 1] * shape[d + 1]`: a
/// broadcast scalar repeated along several minor dims, contiguous rows) and dims of one
/// element dropped (at least one dim kept): the same elements in the same flat order.
pub(super) fn coalesce(shape: &[usize], strides: &[usize]) -> (Dims, Dims) {
    let (mut dims, mut steps) = (Dims::new(), Dims::new());
    for (&n, &step) in shape.iter().zip(strides) {
        let k = dims.len();
        if n == 1 {
            continue;
        } else if k > 0 && steps[k - 1] == step * n {
            dims[k - 1] *= n;
            steps[k - 1] = step;
        } else {
            dims.push(n);
            steps.push(step);
        }
    }
    if dims.is_empty() {
        dims.push(1);
        steps.push(0);
    }
    (dims, steps)
}

/// The period of a leaf read through `strides` over `shape` if it repeats a contiguous
/// block along its outer dims: the dims from some `k` on are row-major (the block,
/// `period` elements), those before `k` stride 0 (or of one element), and `0 < k`.
pub(super) fn repeat_period(strides: &[usize], shape: &[usize]) -> Option<usize> {
    let (mut k, mut period) = (shape.len(), 1);
    while k > 0 && (strides[k - 1] == period || shape[k - 1] == 1) {
        period *= shape[k - 1];
        k -= 1;
    }
    let outer = (strides[..k].iter().zip(shape)).all(|(&s, &n)| s == 0 || n == 1);
    (k > 0 && outer && period > 0).then_some(period)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A strided source reads broadcast rows, columns and transposes as the views do.
    #[test]
    fn strided_loads_follow_the_broadcast() {
        let data: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let a = Literal::F32(ArrayD::from_shape_vec(&[2, 3][..], data).unwrap());
        let x = Operand::Value(Cow::Borrowed(&a));
        // [2, 3] onto [4, 2, 3] along dims 1, 2, and onto [3, 2] transposed.
        let shape = [4, 2, 3];
        let (data, layout) = worked_out(&x, Some(&[1, 2]), &shape, 1).unwrap();
        let s = Source::laid(data, &layout);
        let mut out = vec![0.0; 10];
        s.load(&mut out, 4);
        assert_eq!(out, [4.0, 5.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 1.0]);
        let shape = [3, 2];
        let (data, layout) = worked_out(&x, Some(&[1, 0]), &shape, 1).unwrap();
        let s = Source::laid(data, &layout);
        let mut out = vec![0.0; 6];
        s.load(&mut out, 0);
        assert_eq!(out, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert!(worked_out(&x, Some(&[0, 1]), &[3, 2], 1).is_err());
        // [2, 3] transposed onto [3, 4, 2] along dims 2, 0: every start and length
        // (runs cut anywhere, carries across both outer dims) reads element
        // `[ix[2], ix[0]]` of the value at loop index `ix`.
        let shape = [3, 4, 2];
        let (data, layout) = worked_out(&x, Some(&[2, 0]), &shape, 1).unwrap();
        let s = Source::laid(data, &layout);
        let want: Vec<f32> = (0..24).map(|k| ((k % 2) * 3 + k / 8) as f32).collect();
        for start in 0..24 {
            for len in 1..=24 - start {
                let mut out = vec![0.0; len];
                s.load(&mut out, start);
                assert_eq!(out, want[start..start + len], "from {start}, {len}");
            }
        }
        // [2, 3] onto [4, 2, 3] repeats a block of 6: held in its register when every
        // chunk starts at a repeat (a cut of 12), loaded when not (a cut of 3).
        let shape = [4, 2, 3];
        let (data, layout) = worked_out(&x, Some(&[1, 2]), &shape, 12).unwrap();
        let s = Source::laid(data, &layout);
        assert!(matches!(s, Source::Repeat(ref block) if block.len() == 6));
        let mut reg = vec![0.0; 16];
        s.fill(&mut reg);
        let want: Vec<f32> = (0..16).map(|k| (k % 6) as f32).collect();
        assert_eq!(reg, want);
        let (data, layout) = worked_out(&x, Some(&[1, 2]), &shape, 3).unwrap();
        let s = Source::laid(data, &layout);
        assert!(matches!(s, Source::Strided { .. }));
    }

    /// A source laid out at plan time from the value's shape reads what the source
    /// worked out at run time reads, for splats, repeated blocks, strided and
    /// contiguous leaves, and for every start and length.
    #[test]
    fn planned_layouts_read_as_run_time_ones() {
        let data: Vec<f32> = (0..6).map(|v| v as f32 + 0.5).collect();
        let a = Literal::F32(ArrayD::from_shape_vec(&[2, 3][..], data).unwrap());
        let scalar = Literal::F32(ArrayD::from_elem(&[][..], 2.5));
        let flags = Literal::Bool(ArrayD::from_shape_fn(&[2, 3][..], |ix| ix[0] == ix[1]));
        // The value, the broadcast's dims, the loop's shape and the cut.
        type Case<'c> = (&'c Literal, Option<&'c [usize]>, &'c [usize], usize);
        let cases: [Case<'_>; 7] = [
            (&a, Some(&[1, 2]), &[4, 2, 3], 12),
            (&a, Some(&[1, 2]), &[4, 2, 3], 3),
            (&a, Some(&[2, 0]), &[3, 4, 2], 1),
            (&a, None, &[2, 3], CHUNK),
            (&scalar, Some(&[]), &[5, 7], CHUNK),
            (&flags, Some(&[0, 2]), &[2, 2, 3], 6),
            (&flags, None, &[2, 3], CHUNK),
        ];
        for (lit, dims, shape, cut) in cases {
            let x = Operand::Value(Cow::Borrowed(lit));
            let (data, worked) = worked_out(&x, dims, shape, cut).unwrap();
            let run_time = Source::laid(data, &worked);
            let value = with_literal!(lit, a => Dims::from_slice(a.shape()));
            let len = value.iter().product();
            let layout = Layout::new(&value, &row_major(&value), len, dims, shape, cut).unwrap();
            let planned = Source::laid(lanes(lit), &layout);
            assert_eq!(
                std::mem::discriminant(&planned),
                std::mem::discriminant(&run_time)
            );
            let total: usize = shape.iter().product();
            let (mut p, mut r) = (vec![0.0; total], vec![0.0; total]);
            planned.fill(&mut p);
            run_time.fill(&mut r);
            assert_eq!(p, r);
            for start in 0..total {
                for len in 1..=total - start {
                    let (mut p, mut r) = (vec![0.0; len], vec![0.0; len]);
                    planned.load(&mut p, start);
                    run_time.load(&mut r, start);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&p), bits(&r), "{shape:?} from {start}, {len}");
                }
            }
        }
    }

    /// Runs of every length 1..=20 along the minor dim (the whole blocks and the
    /// pieces of 4, 2 and 1 of a run's tail): a leaf broadcast along the minor dim (a
    /// value a run), over a middle dim (contiguous runs repeated), and transposed (a
    /// strided run) load, from every start and for every length, the elements of the
    /// broadcast view.
    #[test]
    fn short_runs_load_the_broadcast_view() {
        for minor in 1..=20 {
            let shape = [3, 2, minor];
            let total = 3 * 2 * minor;
            let value = |dims: [usize; 2]| {
                let data = (0..dims[0] * dims[1]).map(|v| v as f32 + 0.25).collect();
                ArrayD::from_shape_vec(&dims[..], data).unwrap()
            };
            // The value, the broadcast's dims, and its element at a loop index.
            type At = fn(&ArrayD<f32>, [usize; 3]) -> f32;
            let cases: [(ArrayD<f32>, [usize; 2], At); 3] = [
                (value([3, 2]), [0, 1], |a, [i, j, _]| a[[i, j]]),
                (value([3, minor]), [0, 2], |a, [i, _, k]| a[[i, k]]),
                (value([minor, 3]), [2, 0], |a, [i, _, k]| a[[k, i]]),
            ];
            for (a, dims, at) in cases {
                let lit = Literal::F32(a.clone());
                let x = Operand::Value(Cow::Borrowed(&lit));
                let (data, layout) = worked_out(&x, Some(&dims), &shape, 1).unwrap();
                let s = Source::laid(data, &layout);
                let want: Vec<f32> = (0..total)
                    .map(|f| at(&a, [f / (2 * minor), f / minor % 2, f % minor]))
                    .collect();
                for start in 0..total {
                    for len in 1..=total - start {
                        let mut out = vec![0.0; len];
                        s.load(&mut out, start);
                        assert_eq!(out, want[start..start + len], "{dims:?}, {minor}");
                    }
                }
            }
        }
    }
}
