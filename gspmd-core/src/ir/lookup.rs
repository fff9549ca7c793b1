//! Gather and scatter on [`Tensor`]s: the raw ops with XLA's dimension numbers
//! ([`Tensor::gather`], [`Tensor::scatter_add`], [`Tensor::scatter`]) and the forms
//! users know — NumPy's `take`, `take_along_axis` (PyTorch's `take_along_dim`), an
//! embedding lookup and PyTorch's `index_add` — each one gather or scatter.
//!
//! Indices are i32. Out of range, a lookup clamps them into the dim (a negative index
//! reads element 0; XLA's gather) and a scatter skips them (XLA's scatter); they do
//! not wrap around as NumPy's negative indices do.

use super::builder::{Tensor, any_poisoned, axis, push};
use super::indexing::{GatherDims, ScatterDims, ScatterKind};
use super::op::Op;
use crate::types::{DType, Location};

impl Tensor {
    /// XLA's gather of `self` at the i32 `indices` (see [`GatherDims`]); start indices
    /// are clamped so that each slice fits.
    #[track_caller]
    pub fn gather(&self, indices: &Tensor, dims: &GatherDims) -> Tensor {
        push(
            self,
            Op::Gather(dims.clone()),
            &[indices],
            Location::caller(),
        )
    }

    /// XLA's scatter into `self` adding `updates` at the i32 `indices` (see
    /// [`ScatterDims`]); duplicate indices accumulate, updates out of range are
    /// skipped.
    #[track_caller]
    pub fn scatter_add(&self, indices: &Tensor, updates: &Tensor, dims: &ScatterDims) -> Tensor {
        let op = Op::Scatter {
            dims: dims.clone(),
            kind: ScatterKind::Add,
        };
        push(self, op, &[indices, updates], Location::caller())
    }

    /// XLA's scatter into `self` writing `updates` at the i32 `indices` (see
    /// [`ScatterDims`]); updates out of range are skipped, and with duplicate indices
    /// the last update in row-major order wins — on one device. Partitioned programs
    /// and gradients need the written positions distinct ([`ScatterKind::Replace`]).
    #[track_caller]
    pub fn scatter(&self, indices: &Tensor, updates: &Tensor, dims: &ScatterDims) -> Tensor {
        let op = Op::Scatter {
            dims: dims.clone(),
            kind: ScatterKind::Replace,
        };
        push(self, op, &[indices, updates], Location::caller())
    }

    /// NumPy's `take(self, indices, axis=dim)`: the elements at the i32 `indices` along
    /// `dim` (negative counts from the end). The result's dims are `self`'s before `dim`,
    /// the indices' dims, then `self`'s after `dim`. Indices are clamped into the dim.
    #[track_caller]
    pub fn take(&self, indices: &Tensor, dim: isize) -> Tensor {
        let location = Location::caller();
        let Some(d) = axis(self, dim, "take", location) else {
            return self.poisoned();
        };
        let (r, q) = (self.rank(), indices.rank());
        let mut slice_sizes = self.shape().to_vec();
        slice_sizes[d] = 1;
        let dims = GatherDims {
            offset_dims: (0..d).chain(d + q..r - 1 + q).collect(),
            collapsed_slice_dims: vec![d],
            start_index_map: vec![d],
            index_vector_dim: q,
            slice_sizes,
            ..GatherDims::default()
        };
        push(self, Op::Gather(dims), &[indices], location)
    }

    /// PyTorch's `take_along_dim` (NumPy's `take_along_axis`): `indices` has `self`'s
    /// rank and its sizes except along `dim` (negative counts from the end); result
    /// element `[.., i, ..]` is `self[.., indices[.., i, ..], ..]` along `dim`, shaped
    /// like `indices`. Indices are clamped into the dim.
    #[track_caller]
    pub fn take_along_dim(&self, indices: &Tensor, dim: isize) -> Tensor {
        let location = Location::caller();
        let Some(d) = axis(self, dim, "take_along_dim", location) else {
            return self.poisoned();
        };
        if any_poisoned(&[indices]) {
            return self.poisoned();
        }
        let r = self.rank();
        let others: Vec<usize> = (0..r).filter(|&k| k != d).collect();
        let fits = indices.rank() == r
            && others
                .iter()
                .all(|&k| indices.shape()[k] == self.shape()[k]);
        if !fits {
            let message = format!(
                "indices {} must have the rank of {} and its sizes except along dim {d}",
                indices.ty(),
                self.ty()
            );
            return self.fail("take_along_dim", location, message);
        }
        let dims = GatherDims {
            collapsed_slice_dims: vec![d],
            operand_batching_dims: others.clone(),
            start_indices_batching_dims: others,
            start_index_map: vec![d],
            index_vector_dim: r,
            slice_sizes: vec![1; r],
            ..GatherDims::default()
        };
        push(self, Op::Gather(dims), &[indices], location)
    }

    /// An embedding lookup in the table `self` (`[vocabulary, features]`) of the i32
    /// `ids` (any shape): `ids`' dims then `[features]`, row `ids[..]` of the table (ids
    /// clamped into the vocabulary). With the table split over its vocabulary the
    /// partitioned lookup is Megatron's: each device reads its own rows, one all-reduce.
    #[track_caller]
    pub fn embedding(&self, ids: &Tensor) -> Tensor {
        let location = Location::caller();
        if any_poisoned(&[self, ids]) {
            return self.poisoned();
        }
        if self.rank() != 2 {
            let message = format!("the table {} must be [vocabulary, features]", self.ty());
            return self.fail("embedding", location, message);
        }
        self.take(ids, 0)
    }

    /// PyTorch's `index_add`: `self` plus `source` added along `dim` (negative counts
    /// from the end) at the rows named by the rank-1 i32 `index` — `source[.., i, ..]` is
    /// added to `self[.., index[i], ..]`; `source` has `self`'s shape except `index`'s
    /// length along `dim`. Rows out of range are skipped.
    #[track_caller]
    pub fn index_add(&self, dim: isize, index: &Tensor, source: &Tensor) -> Tensor {
        let location = Location::caller();
        let Some(d) = axis(self, dim, "index_add", location) else {
            return self.poisoned();
        };
        if any_poisoned(&[index, source]) {
            return self.poisoned();
        }
        let mut expected = self.shape().to_vec();
        expected[d] = index.shape().first().copied().unwrap_or(0);
        if index.rank() != 1 || index.dtype() != DType::I32 || source.shape() != expected {
            let message = format!(
                "index_add along dim {d} of {} needs a rank-1 i32 index (got {}) and a source of shape {expected:?} (got {})",
                self.ty(),
                index.ty(),
                source.ty()
            );
            return self.fail("index_add", location, message);
        }
        let op = Op::Scatter {
            dims: ScatterDims::along(d, self.rank()),
            kind: ScatterKind::Add,
        };
        push(self, op, &[index, source], location)
    }
}

/// An embedding lookup of `ids` in `table`: [`Tensor::embedding`].
#[track_caller]
pub fn embedding(table: &Tensor, ids: &Tensor) -> Tensor {
    table.embedding(ids)
}
