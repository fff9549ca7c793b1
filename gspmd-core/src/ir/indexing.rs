//! Gather and scatter: XLA's (and StableHLO's) dimension numbers and their shape rules
//! (the index arithmetic emitted around them is in `index_arithmetic`).
//!
//! Both ops relate three tensors: the *operand*, the i32 *indices* and the *data* (a
//! gather's result, a scatter's updates). The indices hold one *index vector* per
//! batch position (along `index_vector_dim`; when that equals the indices' rank the
//! vector is implicit, of one component). Data dims are *window* dims (one per operand
//! dim not dropped nor batching, in order) and *batch* dims (one per indices dim but
//! the vector dim, in order). Data element `(batch b, window w)` is operand element
//! `start(b) + w`, where `start(b)[index_map[k]]` is component `k` of the index vector
//! at `b`, `start(b)[operand_batching[j]]` is `b`'s coordinate along
//! `indices_batching[j]`, and every other start is 0.
//!
//! Out-of-range starts (XLA's semantics, which the partitioned programs keep): a
//! gather clamps each start so that its slice fits (`0 ..= n - slice`); a scatter
//! skips an update whose window would not fit whole.

use super::{DType, TensorType};

/// A gather's dimension numbers (StableHLO's `GatherDimensionNumbers` plus the slice
/// sizes). The result has `offset_dims` (the slice's dims, in operand order, skipping
/// the collapsed and batching dims) and, at the other positions in order, the indices'
/// batch dims. Start indices are clamped so that the slice fits in the operand.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct GatherDims {
    /// Result dims that hold the slice (sorted).
    pub offset_dims: Vec<usize>,
    /// Operand dims sliced to size 1 and dropped from the result (sorted).
    pub collapsed_slice_dims: Vec<usize>,
    /// Operand dims that pair with `start_indices_batching_dims` (slice size 1,
    /// dropped).
    pub operand_batching_dims: Vec<usize>,
    /// Indices dims that index the operand's batching dims, pairwise.
    pub start_indices_batching_dims: Vec<usize>,
    /// The operand dim each index vector component starts.
    pub start_index_map: Vec<usize>,
    /// The indices dim holding the index vectors (the indices' rank: implicit, one
    /// component).
    pub index_vector_dim: usize,
    /// The slice's size per operand dim.
    pub slice_sizes: Vec<usize>,
}

/// A scatter's dimension numbers (StableHLO's `ScatterDimensionNumbers`). The updates
/// have `update_window_dims` (the window, in operand order, skipping the inserted and
/// batching dims) and, at the other positions in order, the indices' batch dims. An
/// update whose window does not fit in the operand is skipped whole.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ScatterDims {
    /// Updates dims that hold the window (sorted).
    pub update_window_dims: Vec<usize>,
    /// Operand dims with a window of size 1 that the updates do not have (sorted).
    pub inserted_window_dims: Vec<usize>,
    /// Operand dims that pair with `scatter_indices_batching_dims`.
    pub input_batching_dims: Vec<usize>,
    /// Indices dims that index the operand's batching dims, pairwise.
    pub scatter_indices_batching_dims: Vec<usize>,
    /// The operand dim each index vector component starts.
    pub scatter_dims_to_operand_dims: Vec<usize>,
    /// The indices dim holding the index vectors (the indices' rank: implicit).
    pub index_vector_dim: usize,
}

/// How a scatter combines an update with the operand element it lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScatterKind {
    /// Adds (f32 and i32): duplicate indices accumulate.
    Add,
    /// Overwrites (any dtype). With duplicate indices the last update in the updates'
    /// row-major order wins; the partitioned program and the gradient rule assume the
    /// written positions distinct (a partitioned run with duplicates split across
    /// devices may keep another one of them).
    Replace,
}

impl GatherDims {
    /// The layout shared with scatter.
    pub(crate) fn indexing(&self) -> Indexing<'_> {
        Indexing {
            window: &self.offset_dims,
            dropped: &self.collapsed_slice_dims,
            operand_batching: &self.operand_batching_dims,
            indices_batching: &self.start_indices_batching_dims,
            index_map: &self.start_index_map,
            index_vector_dim: self.index_vector_dim,
        }
    }

    /// The scatter that writes data laid out as this gather's result back where the
    /// gather read it (the gather's transpose).
    pub fn to_scatter(&self) -> ScatterDims {
        ScatterDims {
            update_window_dims: self.offset_dims.clone(),
            inserted_window_dims: self.collapsed_slice_dims.clone(),
            input_batching_dims: self.operand_batching_dims.clone(),
            scatter_indices_batching_dims: self.start_indices_batching_dims.clone(),
            scatter_dims_to_operand_dims: self.start_index_map.clone(),
            index_vector_dim: self.index_vector_dim,
        }
    }
}

impl ScatterDims {
    /// The scatter of whole slices along `dim` of a rank-`rank` operand at rank-1
    /// indices: update `i` (the updates' slice `i` along `dim`) lands on the operand's
    /// slice `indices[i]` (PyTorch's `index_add`, `index_copy`).
    pub fn along(dim: usize, rank: usize) -> Self {
        ScatterDims {
            update_window_dims: (0..rank).filter(|&k| k != dim).collect(),
            inserted_window_dims: vec![dim],
            scatter_dims_to_operand_dims: vec![dim],
            index_vector_dim: 1,
            ..ScatterDims::default()
        }
    }

    /// The layout shared with gather.
    pub(crate) fn indexing(&self) -> Indexing<'_> {
        Indexing {
            window: &self.update_window_dims,
            dropped: &self.inserted_window_dims,
            operand_batching: &self.input_batching_dims,
            indices_batching: &self.scatter_indices_batching_dims,
            index_map: &self.scatter_dims_to_operand_dims,
            index_vector_dim: self.index_vector_dim,
        }
    }

    /// The gather that reads, for every update, the operand window it lands on;
    /// `window_sizes` per operand dim (1 on inserted and batching dims, the updates'
    /// window dim elsewhere).
    pub fn to_gather(&self, window_sizes: Vec<usize>) -> GatherDims {
        GatherDims {
            offset_dims: self.update_window_dims.clone(),
            collapsed_slice_dims: self.inserted_window_dims.clone(),
            operand_batching_dims: self.input_batching_dims.clone(),
            start_indices_batching_dims: self.scatter_indices_batching_dims.clone(),
            start_index_map: self.scatter_dims_to_operand_dims.clone(),
            index_vector_dim: self.index_vector_dim,
            slice_sizes: window_sizes,
        }
    }
}

/// The layout of a gather or scatter (see the module docs), borrowed from its
/// dimension numbers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Indexing<'a> {
    /// Data dims holding the window (sorted).
    pub window: &'a [usize],
    /// Operand dims with a one-element window that the data does not have (sorted).
    pub dropped: &'a [usize],
    /// Operand dims indexed by the indices' batching dims.
    pub operand_batching: &'a [usize],
    /// Indices dims paired with `operand_batching`.
    pub indices_batching: &'a [usize],
    /// The operand dim each index vector component starts.
    pub index_map: &'a [usize],
    /// The indices dim holding the index vectors (the rank: implicit).
    pub index_vector_dim: usize,
}

impl Indexing<'_> {
    /// Operand dims in the window, in order: the `i`-th is data dim `window[i]`.
    pub fn operand_window(&self, operand_rank: usize) -> Vec<usize> {
        (0..operand_rank)
            .filter(|d| !self.dropped.contains(d) && !self.operand_batching.contains(d))
            .collect()
    }

    /// Indices dims other than the vector dim, in order: the batch dims.
    pub fn indices_batch(&self, indices_rank: usize) -> Vec<usize> {
        (0..indices_rank)
            .filter(|&d| d != self.index_vector_dim)
            .collect()
    }

    /// Data dims that are not window dims, in order: the `i`-th is the `i`-th of
    /// [`Self::indices_batch`].
    pub fn data_batch(&self, data_rank: usize) -> Vec<usize> {
        (0..data_rank)
            .filter(|d| !self.window.contains(d))
            .collect()
    }

    /// The window's size per operand dim: 1 on dropped and batching dims, the data's
    /// window dim elsewhere.
    pub fn window_sizes(&self, operand_rank: usize, data_shape: &[usize]) -> Vec<usize> {
        let mut sizes = vec![1; operand_rank];
        for (&o, &d) in self.operand_window(operand_rank).iter().zip(self.window) {
            sizes[o] = data_shape.get(d).copied().unwrap_or(1);
        }
        sizes
    }

    /// Whether the indices have an explicit vector dim.
    pub fn explicit_vector(&self, indices_rank: usize) -> bool {
        self.index_vector_dim < indices_rank
    }

    /// Checks the dimension numbers against the operand, the i32 indices and a data
    /// tensor of `data_rank` dims; returns the data's batch sizes (the indices' batch
    /// dims).
    fn check(
        &self,
        operand: &TensorType,
        indices: &TensorType,
        data_rank: usize,
    ) -> std::result::Result<Vec<usize>, String> {
        let (r, q) = (operand.rank(), indices.rank());
        if indices.dtype != DType::I32 {
            return Err(format!("indices must be i32, got {indices}"));
        }
        let ivd = self.index_vector_dim;
        if ivd > q {
            return Err(format!(
                "index_vector_dim {ivd} out of range for indices {indices}"
            ));
        }
        let sorted = |dims: &[usize], what: &str, rank: usize| -> std::result::Result<(), String> {
            if dims.windows(2).any(|w| w[0] >= w[1]) || dims.iter().any(|&d| d >= rank) {
                return Err(format!(
                    "{what} {dims:?} must be sorted, distinct and below rank {rank}"
                ));
            }
            Ok(())
        };
        let distinct =
            |dims: &[usize], what: &str, rank: usize| -> std::result::Result<(), String> {
                for (i, &d) in dims.iter().enumerate() {
                    if d >= rank || dims[..i].contains(&d) {
                        return Err(format!(
                            "{what} {dims:?} must be distinct and below rank {rank}"
                        ));
                    }
                }
                Ok(())
            };
        sorted(self.dropped, "collapsed (inserted) window dims", r)?;
        distinct(self.operand_batching, "operand batching dims", r)?;
        if let Some(d) = self
            .dropped
            .iter()
            .find(|d| self.operand_batching.contains(d))
        {
            return Err(format!(
                "operand dim {d} is both collapsed (inserted) and a batching dim"
            ));
        }
        distinct(self.index_map, "the index map", r)?;
        if let Some(d) = self
            .index_map
            .iter()
            .find(|d| self.operand_batching.contains(d))
        {
            return Err(format!(
                "operand dim {d} is both indexed (in the index map) and a batching dim"
            ));
        }
        let components = if ivd < q { indices.shape[ivd] } else { 1 };
        if components != self.index_map.len() {
            return Err(format!(
                "index vectors of {components} components (dim {ivd} of {indices}) for an index map of {} entries {:?}",
                self.index_map.len(),
                self.index_map
            ));
        }
        distinct(self.indices_batching, "indices batching dims", q)?;
        if self.indices_batching.contains(&ivd) {
            return Err(format!(
                "index_vector_dim {ivd} cannot be an indices batching dim"
            ));
        }
        if self.indices_batching.len() != self.operand_batching.len() {
            return Err(format!(
                "operand batching dims {:?} and indices batching dims {:?} differ in length",
                self.operand_batching, self.indices_batching
            ));
        }
        for (&o, &i) in self.operand_batching.iter().zip(self.indices_batching) {
            if operand.shape[o] != indices.shape[i] {
                return Err(format!(
                    "batching dims differ: operand dim {o} of {operand} is {} but indices dim {i} of {indices} is {}",
                    operand.shape[o], indices.shape[i]
                ));
            }
        }
        let window_len = r - self.dropped.len() - self.operand_batching.len();
        if self.window.len() != window_len {
            return Err(format!(
                "{} window dims {:?} for the {window_len} operand dims of {operand} neither collapsed (inserted) nor batching",
                self.window.len(),
                self.window
            ));
        }
        let batch: Vec<usize> = (self.indices_batch(q).iter())
            .map(|&d| indices.shape[d])
            .collect();
        if data_rank != window_len + batch.len() {
            return Err(format!(
                "{window_len} window dims and the {} batch dims of {indices} make rank {}, not {data_rank}",
                batch.len(),
                window_len + batch.len()
            ));
        }
        sorted(self.window, "window (offset) dims", data_rank)?;
        Ok(batch)
    }
}

/// The result type of a gather of `operand` at `indices`.
pub(crate) fn infer_gather(
    dims: &GatherDims,
    operand: &TensorType,
    indices: &TensorType,
) -> std::result::Result<TensorType, String> {
    let ix = dims.indexing();
    let r = operand.rank();
    if dims.slice_sizes.len() != r {
        return Err(format!(
            "slice_sizes {:?} must have one entry per dim of {operand}",
            dims.slice_sizes
        ));
    }
    if let Some(d) = (0..r).find(|&d| dims.slice_sizes[d] > operand.shape[d]) {
        return Err(format!(
            "slice size {} does not fit dim {d} of {operand}",
            dims.slice_sizes[d]
        ));
    }
    let dropped = ix.dropped.iter().chain(ix.operand_batching);
    if let Some(&d) = dropped
        .clone()
        .find(|&&d| d < r && dims.slice_sizes[d] != 1)
    {
        return Err(format!(
            "collapsed and batching dims must have slice size 1, dim {d} has {}",
            dims.slice_sizes[d]
        ));
    }
    let rank = (r.saturating_sub(ix.dropped.len() + ix.operand_batching.len()))
        + ix.indices_batch(indices.rank()).len();
    let batch = ix.check(operand, indices, rank)?;
    let mut window = ix
        .operand_window(r)
        .into_iter()
        .map(|d| dims.slice_sizes[d]);
    let mut batch = batch.into_iter();
    let shape: Vec<usize> = (0..rank)
        .map(|d| {
            if ix.window.contains(&d) {
                window.next()
            } else {
                batch.next()
            }
            .unwrap_or(0)
        })
        .collect();
    Ok(TensorType::new(shape, operand.dtype))
}

/// The result type of a scatter into `operand` at `indices` of `updates`.
pub(crate) fn infer_scatter(
    dims: &ScatterDims,
    kind: ScatterKind,
    operand: &TensorType,
    indices: &TensorType,
    updates: &TensorType,
) -> std::result::Result<TensorType, String> {
    let ix = dims.indexing();
    if updates.dtype != operand.dtype {
        return Err(format!(
            "updates {updates} and operand {operand} differ in dtype"
        ));
    }
    if kind == ScatterKind::Add && operand.dtype == DType::Bool {
        return Err(format!("cannot add into {operand}"));
    }
    let batch = ix.check(operand, indices, updates.rank())?;
    let data_batch = ix.data_batch(updates.rank());
    for (&d, &n) in data_batch.iter().zip(&batch) {
        if updates.shape[d] != n {
            return Err(format!(
                "updates dim {d} of {updates} is {} but the indices' batch dim is {n}",
                updates.shape[d]
            ));
        }
    }
    let sizes = ix.window_sizes(operand.rank(), &updates.shape);
    if let Some(d) = (0..operand.rank()).find(|&d| sizes[d] > operand.shape[d]) {
        return Err(format!(
            "the updates' window of {} along operand dim {d} does not fit {operand}",
            sizes[d]
        ));
    }
    Ok(operand.clone())
}
