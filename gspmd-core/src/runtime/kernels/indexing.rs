//! The gather and scatter kernels: both map every element of their *data* (a gather's
//! result, a scatter's updates) to the operand element it reads or writes
//! ([`positions`]), with XLA's semantics for starts out of range (see
//! [`crate::ir::GatherDims`]): a gather clamps them, a scatter skips the update.

use ndarray::{ArrayD, IxDyn};

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
    let at = positions(dims.indexing(), &operand.shape(), indices, shape, true);
    fn pick<T: Clone>(
        a: &ArrayD<T>,
        at: &[Option<usize>],
        shape: &[usize],
    ) -> Result<ArrayD<T>, String> {
        let a = a.as_standard_layout();
        let flat = a.as_slice().ok_or("a standard layout array has a slice")?;
        // Clamped starts always fit: every position is `Some`.
        let v: Vec<T> = at.iter().flatten().map(|&p| flat[p].clone()).collect();
        ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| e.to_string())
    }
    Ok(map_literal!(operand, a => pick(a, &at, shape)?))
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
    let at = positions(
        dims.indexing(),
        &operand.shape(),
        indices,
        &updates.shape(),
        false,
    );
    fn write<T: Clone>(
        a: &ArrayD<T>,
        u: &ArrayD<T>,
        at: &[Option<usize>],
        combine: impl Fn(&T, &T) -> T,
    ) -> ArrayD<T> {
        let mut out = a.as_standard_layout().into_owned();
        let u = u.as_standard_layout();
        if let (Some(flat), Some(u)) = (out.as_slice_mut(), u.as_slice()) {
            for (p, v) in at.iter().zip(u) {
                if let Some(p) = *p {
                    flat[p] = combine(&flat[p], v);
                }
            }
        }
        out
    }
    let replace = kind == ScatterKind::Replace;
    Ok(match (operand, updates) {
        (Literal::F32(a), Literal::F32(u)) => {
            Literal::F32(write(a, u, &at, |x, v| if replace { *v } else { x + v }))
        }
        (Literal::I32(a), Literal::I32(u)) => Literal::I32(write(a, u, &at, |x, v| {
            if replace { *v } else { x.wrapping_add(*v) }
        })),
        (Literal::Bool(a), Literal::Bool(u)) if replace => {
            Literal::Bool(write(a, u, &at, |_, v| *v))
        }
        _ => {
            return Err(format!(
                "cannot scatter with {kind:?} into {}",
                operand.dtype()
            ));
        }
    })
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
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

/// For every element of the data (of `data_shape`, row-major), the row-major offset of
/// the operand element it is: its batch position's start plus its window offset. With
/// `clamp` (gather) starts are clamped so that the window fits; without (scatter) a
/// batch position whose window does not fit gives `None` for all its elements.
fn positions(
    ix: Indexing<'_>,
    operand_shape: &[usize],
    indices: &ArrayD<i32>,
    data_shape: &[usize],
    clamp: bool,
) -> Vec<Option<usize>> {
    let r = operand_shape.len();
    let sizes = ix.window_sizes(r, data_shape);
    let stride = strides(operand_shape);
    let indices_shape = indices.shape();
    let batch_dims = ix.indices_batch(indices_shape.len());
    let batch_shape: Vec<usize> = batch_dims.iter().map(|&d| indices_shape[d]).collect();
    // The operand offset of each batch position's window start.
    let count: usize = batch_shape.iter().product();
    let mut bases = Vec::with_capacity(count);
    let mut b = vec![0; batch_shape.len()];
    let mut coord = vec![0; indices_shape.len()];
    for _ in 0..count {
        for (&d, &i) in batch_dims.iter().zip(&b) {
            coord[d] = i;
        }
        let mut start = vec![0i64; r];
        for (k, &d) in ix.index_map.iter().enumerate() {
            if ix.explicit_vector(coord.len()) {
                coord[ix.index_vector_dim] = k;
            }
            start[d] = i64::from(indices[IxDyn(&coord)]);
        }
        for (&o, &i) in ix.operand_batching.iter().zip(ix.indices_batching) {
            start[o] = coord[i] as i64;
        }
        let mut fits = true;
        for d in 0..r {
            let highest = (operand_shape[d] - sizes[d]) as i64;
            if clamp {
                start[d] = start[d].clamp(0, highest);
            }
            fits &= (0..=highest).contains(&start[d]);
        }
        bases.push(fits.then(|| (0..r).map(|d| start[d] as usize * stride[d]).sum::<usize>()));
        next(&mut b, &batch_shape);
    }
    let window_operand = ix.operand_window(r);
    let data_batch = ix.data_batch(data_shape.len());
    let batch_stride = strides(&batch_shape);
    let total: usize = data_shape.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut idx = vec![0; data_shape.len()];
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
