//! The gather and scatter kernels: both map every element of their *data* (a gather's
//! result, a scatter's updates) to the operand element it reads or writes
//! ([`Targets`]), with XLA's semantics for starts out of range (see
//! [`crate::ir::GatherDims`]): a gather clamps them, a scatter skips the update. When
//! every window is one contiguous run in the operand and in the data (an embedding
//! lookup's table rows, their scatter-add), a window moves as one slice.

use ndarray::{ArrayD, IxDyn};
use smallvec::{SmallVec, smallvec};

use super::{Dims, row_major};
use crate::runtime::buffers::{self, Pooled};

use crate::ir::{GatherDims, Indexing, Literal, ScatterDims, ScatterKind, map_literal};

/// `gather(operand, indices)` into a result of `shape`.
pub(super) fn gather(
    dims: &GatherDims,
    operand: &Literal,
    indices: &Literal,
    shape: &[usize],
) -> Result<Literal, String> {
    let Literal::I32(indices) = indices else {
        return Err("gather indices must be i32".into());
    };
    let at = Targets::new(dims.indexing(), &operand.shape(), indices, shape, true);
    gather_at(operand, &at, shape)
}

/// The gather reading `operand` at `at` (clamped: every target is `Some`).
fn gather_at(operand: &Literal, at: &Targets, shape: &[usize]) -> Result<Literal, String> {
    fn pick<T: Pooled>(a: &ArrayD<T>, at: &Targets, shape: &[usize]) -> Result<ArrayD<T>, String> {
        let a = a.as_standard_layout();
        let flat = a.as_slice().ok_or("a standard layout array has a slice")?;
        let mut v: Vec<T> = buffers::with_capacity(shape.iter().product());
        match at {
            Targets::Runs { starts, len } => {
                for &s in starts.iter().flatten() {
                    v.extend_from_slice(&flat[s..s + len]);
                }
            }
            Targets::Elements(at) => v.extend(at.iter().flatten().map(|&p| flat[p])),
        }
        ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| e.to_string())
    }
    Ok(map_literal!(operand, a => pick(a, at, shape)?))
}

/// `scatter(operand, indices, updates)` combining with `kind`, updates in row-major
/// order (with [`ScatterKind::Replace`] the last update to a position wins).
pub(super) fn scatter(
    dims: &ScatterDims,
    kind: ScatterKind,
    operand: &Literal,
    indices: &Literal,
    updates: &Literal,
) -> Result<Literal, String> {
    let Literal::I32(indices) = indices else {
        return Err("scatter indices must be i32".into());
    };
    let at = Targets::new(
        dims.indexing(),
        &operand.shape(),
        indices,
        &updates.shape(),
        false,
    );
    scatter_at(kind, operand, &at, updates)
}

/// The scatter writing `updates` (row-major) into `operand` at `at`.
fn scatter_at(
    kind: ScatterKind,
    operand: &Literal,
    at: &Targets,
    updates: &Literal,
) -> Result<Literal, String> {
    fn write<T: Pooled>(
        a: &ArrayD<T>,
        u: &ArrayD<T>,
        at: &Targets,
        combine: impl Fn(&T, &T) -> T,
    ) -> ArrayD<T> {
        let mut out = buffers::take_array(a.shape());
        out.assign(a);
        let u = u.as_standard_layout();
        if let (Some(flat), Some(u)) = (out.as_slice_mut(), u.as_slice()) {
            match at {
                Targets::Runs { starts, len } => {
                    for (s, u) in starts.iter().zip(u.chunks_exact((*len).max(1))) {
                        if let Some(s) = *s {
                            for (x, v) in flat[s..s + len].iter_mut().zip(u) {
                                *x = combine(x, v);
                            }
                        }
                    }
                }
                Targets::Elements(at) => {
                    for (p, v) in at.iter().zip(u) {
                        if let Some(p) = *p {
                            flat[p] = combine(&flat[p], v);
                        }
                    }
                }
            }
        }
        out
    }
    let replace = kind == ScatterKind::Replace;
    Ok(match (operand, updates) {
        (Literal::F32(a), Literal::F32(u)) => {
            Literal::F32(write(a, u, at, |x, v| if replace { *v } else { x + v }))
        }
        (Literal::I32(a), Literal::I32(u)) => Literal::I32(write(a, u, at, |x, v| {
            if replace { *v } else { x.wrapping_add(*v) }
        })),
        (Literal::Bool(a), Literal::Bool(u)) if replace => {
            Literal::Bool(write(a, u, at, |_, v| *v))
        }
        _ => {
            return Err(format!(
                "cannot scatter with {kind:?} into {}",
                operand.dtype()
            ));
        }
    })
}

/// The operand elements a gather reads or a scatter writes, for the data's elements in
/// row-major order.
#[derive(Debug, PartialEq)]
enum Targets {
    /// Every batch position's window is one run of `len` operand elements from its
    /// start (`None`: skipped) and `len` data elements: a row of a table.
    Runs {
        starts: Vec<Option<usize>>,
        len: usize,
    },
    /// One operand offset per data element (`None`: skipped).
    Elements(Vec<Option<usize>>),
}

impl Targets {
    /// The targets of the data (of `data_shape`) indexed by `indices`: runs when the
    /// windows are contiguous in the operand and in the data ([`run_length`]),
    /// elements ([`positions`]) otherwise. `clamp` as for [`window_starts`].
    fn new(
        ix: Indexing<'_>,
        operand_shape: &[usize],
        indices: &ArrayD<i32>,
        data_shape: &[usize],
        clamp: bool,
    ) -> Targets {
        let sizes = ix.window_sizes(operand_shape.len(), data_shape);
        let starts = window_starts(ix, operand_shape, indices, &sizes, clamp);
        match run_length(ix, operand_shape, &sizes, data_shape.len()) {
            Some(len) => Targets::Runs { starts, len },
            None => Targets::Elements(positions(ix, operand_shape, &starts, data_shape)),
        }
    }
}

/// The element count of a window when it is contiguous both in the operand (whole
/// operand dims after its first dim of more than one element) and in the data (the
/// window dims are the data's minor dims).
fn run_length(
    ix: Indexing<'_>,
    operand_shape: &[usize],
    sizes: &[usize],
    data_rank: usize,
) -> Option<usize> {
    let minor = (ix.window.iter().enumerate()).all(|(i, &d)| d == data_rank - ix.window.len() + i);
    let first = sizes.iter().position(|&n| n != 1).unwrap_or(sizes.len());
    let whole = (first + 1..sizes.len()).all(|d| sizes[d] == operand_shape[d]);
    (minor && whole).then(|| sizes.iter().product())
}

/// Advances the row-major multi-index `idx` within `shape` (to all zeros after the
/// last).
fn next(idx: &mut [usize], shape: &[usize]) {
    for d in (0..idx.len()).rev() {
        idx[d] += 1;
        if idx[d] < shape[d] {
            return;
        }
        idx[d] = 0;
    }
}

/// The row-major operand offset of every batch position's window start (batch
/// positions row-major over the indices' batch dims). With `clamp` (gather) starts are
/// clamped so that the window (of `sizes`) fits; without (scatter) a window that does
/// not fit gives `None`.
fn window_starts(
    ix: Indexing<'_>,
    operand_shape: &[usize],
    indices: &ArrayD<i32>,
    sizes: &[usize],
    clamp: bool,
) -> Vec<Option<usize>> {
    let r = operand_shape.len();
    let stride = row_major(operand_shape);
    let indices = indices.as_standard_layout();
    let flat = indices.as_slice().unwrap_or_default();
    let indices_shape = indices.shape();
    let indices_stride = row_major(indices_shape);
    // The indices' offset step per component of an index vector, per batch dim, and
    // the batch dim (position in `b`) of each indices batching dim.
    let component = match ix.explicit_vector(indices_shape.len()) {
        true => indices_stride[ix.index_vector_dim],
        false => 0,
    };
    let batch_dims = ix.indices_batch(indices_shape.len());
    let batch_shape: Dims = batch_dims.iter().map(|&d| indices_shape[d]).collect();
    let batch_stride: Dims = batch_dims.iter().map(|&d| indices_stride[d]).collect();
    let batching: SmallVec<[(usize, usize); 6]> = (ix.operand_batching.iter())
        .zip(ix.indices_batching)
        .map(|(&o, i)| (o, batch_dims.iter().position(|d| d == i).unwrap_or(0)))
        .collect();
    let count: usize = batch_shape.iter().product();
    let mut bases = Vec::with_capacity(count);
    let mut b: Dims = smallvec![0; batch_shape.len()];
    let mut start: SmallVec<[i64; 6]> = smallvec![0; r];
    for _ in 0..count {
        let at: usize = b.iter().zip(&batch_stride).map(|(i, s)| i * s).sum();
        start.fill(0);
        for (k, &d) in ix.index_map.iter().enumerate() {
            start[d] = i64::from(flat[at + k * component]);
        }
        for &(o, p) in &batching {
            start[o] = b[p] as i64;
        }
        let mut fits = true;
        let mut base = 0;
        for d in 0..r {
            let highest = operand_shape[d] as i64 - sizes[d] as i64;
            if clamp {
                start[d] = start[d].clamp(0, highest);
            }
            fits &= (0..=highest).contains(&start[d]);
            base += start[d].max(0) as usize * stride[d];
        }
        bases.push(fits.then_some(base));
        next(&mut b, &batch_shape);
    }
    bases
}

/// For every element of the data (of `data_shape`, row-major), the row-major offset of
/// the operand element it is: its batch position's window start ([`window_starts`])
/// plus its window offset, `None` for all elements of a window whose start is `None`.
fn positions(
    ix: Indexing<'_>,
    operand_shape: &[usize],
    bases: &[Option<usize>],
    data_shape: &[usize],
) -> Vec<Option<usize>> {
    let stride = row_major(operand_shape);
    let window_operand = ix.operand_window(operand_shape.len());
    let data_batch = ix.data_batch(data_shape.len());
    let batch_shape: Dims = data_batch.iter().map(|&d| data_shape[d]).collect();
    let batch_stride = row_major(&batch_shape);
    let total: usize = data_shape.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut idx: Dims = smallvec![0; data_shape.len()];
    for _ in 0..total {
        let b: usize = (data_batch.iter().zip(&batch_stride))
            .map(|(&d, &s)| idx[d] * s)
            .sum();
        let window: usize = (ix.window.iter().zip(&window_operand))
            .map(|(&d, &o)| idx[d] * stride[o])
            .sum();
        out.push(bases[b].map(|base| base + window));
        next(&mut idx, data_shape);
    }
    out
}

#[cfg(test)]
mod tests {
    use ndarray::Array;
    use proptest::prelude::*;

    use super::*;

    /// A gather of windows `[h, w]` (dim 0 collapsed if `collapse` and `h == 1`) from a
    /// `[rows, cols]` table at `starts` (row, column pairs, possibly out of range), the
    /// window dims the result's minor dims if `minor`, its major dims otherwise.
    fn lookup(
        h: usize,
        w: usize,
        collapse: bool,
        minor: bool,
        batch: usize,
    ) -> (GatherDims, Vec<usize>) {
        let window = if collapse && h == 1 {
            vec![w]
        } else {
            vec![h, w]
        };
        let k = window.len();
        let (offset_dims, shape): (Vec<usize>, Vec<usize>) = if minor {
            ((1..=k).collect(), [vec![batch], window].concat())
        } else {
            ((0..k).collect(), [window, vec![batch]].concat())
        };
        let dims = GatherDims {
            offset_dims,
            collapsed_slice_dims: if k == 1 { vec![0] } else { vec![] },
            start_index_map: vec![0, 1],
            index_vector_dim: 1,
            slice_sizes: vec![h, w],
            ..GatherDims::default()
        };
        (dims, shape)
    }

    fn table(rows: usize, cols: usize) -> Literal {
        let values = (0..rows * cols).map(|i| i as f32 * 0.5 - 3.0);
        Literal::F32(
            Array::from_iter(values)
                .into_shape_with_order(IxDyn(&[rows, cols]))
                .unwrap(),
        )
    }

    #[test]
    fn batched_picks_are_runs_of_one() {
        // `take_along_dim` of [3, 5] at [3, 4] indices: operand dim 0 pairs with the
        // indices' dim 0, every window one element; starts out of range included.
        let dims = GatherDims {
            collapsed_slice_dims: vec![1],
            operand_batching_dims: vec![0],
            start_indices_batching_dims: vec![0],
            start_index_map: vec![1],
            index_vector_dim: 2,
            slice_sizes: vec![1, 1],
            ..GatherDims::default()
        };
        let picks = [0, 4, -1, 7, 2, 2, 3, 1, 4, 0, 9, -5];
        let indices = Array::from_shape_vec(IxDyn(&[3, 4]), picks.to_vec()).unwrap();
        let ix = dims.indexing();
        let fast = Targets::new(ix, &[3, 5], &indices, &[3, 4], true);
        let Targets::Runs { starts, len: 1 } = &fast else {
            panic!("expected runs of one element, got {fast:?}");
        };
        let elements = positions(ix, &[3, 5], starts, &[3, 4]);
        let operand = table(3, 5);
        let want = gather_at(&operand, &Targets::Elements(elements), &[3, 4]).unwrap();
        assert_eq!(gather_at(&operand, &fast, &[3, 4]).unwrap(), want);
        // Row r, column picks[r * 4 + c] clamped to 0..5.
        let clamped: Vec<usize> = (0..12)
            .map(|i| 5 * (i / 4) + picks[i].clamp(0, 4) as usize)
            .collect();
        assert_eq!(
            starts.iter().map(|s| s.unwrap()).collect::<Vec<_>>(),
            clamped
        );
    }

    proptest! {
        /// Gathers and scatters through runs give the bits of the element-by-element
        /// path, out-of-range starts included (clamped, skipped), and runs are taken
        /// exactly when the windows are contiguous.
        #[test]
        fn runs_match_elements(
            (rows, cols) in (1usize..6, 0usize..6),
            window in (1usize..6, 0usize..6),
            collapse in any::<bool>(),
            minor in any::<bool>(),
            starts in prop::collection::vec((-3i32..9, -3i32..9), 0..6),
            replace in any::<bool>(),
        ) {
            let (h, w) = (window.0.min(rows), window.1.min(cols));
            let (dims, shape) = lookup(h, w, collapse, minor, starts.len());
            let flat: Vec<i32> = starts.iter().flat_map(|&(r, c)| [r, c]).collect();
            let indices = Array::from_shape_vec(IxDyn(&[starts.len(), 2]), flat).unwrap();
            let operand = table(rows, cols);
            let ix = dims.indexing();
            let elements = |data_shape: &[usize], clamp| {
                let sizes = ix.window_sizes(2, data_shape);
                let starts = window_starts(ix, &[rows, cols], &indices, &sizes, clamp);
                Targets::Elements(positions(ix, &[rows, cols], &starts, data_shape))
            };
            let fast = Targets::new(ix, &[rows, cols], &indices, &shape, true);
            let runs = minor && (h == 1 || w == cols);
            prop_assert_eq!(matches!(fast, Targets::Runs { .. }), runs);
            let gathered = gather_at(&operand, &fast, &shape).unwrap();
            prop_assert_eq!(&gathered, &gather_at(&operand, &elements(&shape, true), &shape).unwrap());

            let scatter_dims = ScatterDims {
                update_window_dims: dims.offset_dims.clone(),
                inserted_window_dims: dims.collapsed_slice_dims.clone(),
                scatter_dims_to_operand_dims: vec![0, 1],
                index_vector_dim: 1,
                ..ScatterDims::default()
            };
            let kind = if replace { ScatterKind::Replace } else { ScatterKind::Add };
            let indices = Literal::I32(indices.clone());
            prop_assert_eq!(
                scatter(&scatter_dims, kind, &operand, &indices, &gathered).unwrap(),
                scatter_at(kind, &operand, &elements(&shape, false), &gathered).unwrap()
            );
        }
    }
}
