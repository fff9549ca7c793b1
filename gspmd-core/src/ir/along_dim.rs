//! Ops along one dim of a [`Tensor`]: inclusive scans (`cumsum`, `cumprod`, reversed
//! too), `argsort`, `argmax` / `argmin` (composites of a reduction, a comparison and
//! a reduction of indices, which partition like their parts), and `sort` / `top_k`
//! (`argsort`, then the values picked by `take_along_dim`: their gradient flows back
//! through the gather to the picked elements).

use super::builder::{Tensor, any_poisoned, axis, push, push_at, push_reduce};
use super::op::{BinaryOp, CompareOp, CumulativeKind, Op, ReduceKind};
use crate::types::{DType, Location};

impl Tensor {
    /// Inclusive running sum along `dim` (negative counts from the end): element `j`
    /// is the sum of elements `0..=j` (`jnp.cumsum`).
    #[track_caller]
    pub fn cumsum(&self, dim: isize) -> Tensor {
        self.cumulative_at(CumulativeKind::Sum, dim, false, Location::caller())
    }

    /// Inclusive running product along `dim` (`jnp.cumprod`).
    #[track_caller]
    pub fn cumprod(&self, dim: isize) -> Tensor {
        self.cumulative_at(CumulativeKind::Prod, dim, false, Location::caller())
    }

    /// Inclusive scan along `dim` with `kind`; with `reverse`, element `j` combines
    /// elements `j..` (a scan from the end).
    #[track_caller]
    pub fn cumulative(&self, kind: CumulativeKind, dim: isize, reverse: bool) -> Tensor {
        self.cumulative_at(kind, dim, reverse, Location::caller())
    }

    fn cumulative_at(
        &self,
        kind: CumulativeKind,
        dim: isize,
        reverse: bool,
        location: Location,
    ) -> Tensor {
        let op_name = Op::Cumulative {
            kind,
            dim: 0,
            reverse,
        }
        .name();
        let Some(dim) = axis(self, dim, op_name, location) else {
            return self.poisoned();
        };
        push_at(self, Op::Cumulative { kind, dim, reverse }, location)
    }

    /// The i32 indices that sort this tensor along `dim`, a stable sort (equal elements
    /// keep their order), largest first when `descending`. A NaN is greater than every
    /// number (ascending: last; descending: first); `-0.0` equals `0.0`.
    #[track_caller]
    pub fn argsort(&self, dim: isize, descending: bool) -> Tensor {
        let location = Location::caller();
        let Some(dim) = axis(self, dim, "argsort", location) else {
            return self.poisoned();
        };
        push_at(self, Op::Argsort { dim, descending }, location)
    }

    /// This tensor sorted along `dim` and the i32 indices that sort it (`torch.sort`):
    /// `(values, indices)`, stable, largest first when `descending`, NaN ordered as in
    /// [`Tensor::argsort`].
    #[track_caller]
    pub fn sort(&self, dim: isize, descending: bool) -> (Tensor, Tensor) {
        let indices = self.argsort(dim, descending);
        (self.take_along_dim(&indices, dim), indices)
    }

    /// The `k` largest elements along `dim` and their i32 indices, largest first, equal
    /// elements in index order (`torch.topk`; `jax.lax.top_k` is `dim = -1`):
    /// `(values, indices)`, each with `k` elements along `dim`. An [`Error::Shape`]
    /// at the caller's line unless `1 <= k <= ` the dim's size.
    ///
    /// [`Error::Shape`]: crate::error::Error::Shape
    #[track_caller]
    pub fn top_k(&self, k: usize, dim: isize) -> (Tensor, Tensor) {
        let location = Location::caller();
        let Some(d) = axis(self, dim, "top_k", location) else {
            return (self.poisoned(), self.poisoned());
        };
        let n = self.shape()[d];
        if k == 0 || k > n {
            let message = format!("k = {k} must be in 1..={n} (dim {d} of {})", self.ty());
            return (self.fail("top_k", location, message), self.poisoned());
        }
        let indices = self.argsort(dim, true).slice_axis(d as isize, 0, k);
        (self.take_along_dim(&indices, dim), indices)
    }

    /// The i32 index of the first maximum along `dim`, which is removed (`jnp.argmax`).
    /// A NaN counts as the maximum.
    #[track_caller]
    pub fn argmax(&self, dim: isize) -> Tensor {
        self.arg_extreme(ReduceKind::Max, dim, "argmax", Location::caller())
    }

    /// The i32 index of the first minimum along `dim`, which is removed (`jnp.argmin`).
    /// A NaN counts as the minimum.
    #[track_caller]
    pub fn argmin(&self, dim: isize) -> Tensor {
        self.arg_extreme(ReduceKind::Min, dim, "argmin", Location::caller())
    }

    /// `min(select(x == extreme(x) or x is NaN, iota, n))` along `dim`: the first
    /// position holding the extreme (NaN propagates through max and min, so a lane with
    /// a NaN picks its first NaN).
    #[track_caller]
    fn arg_extreme(
        &self,
        kind: ReduceKind,
        dim: isize,
        op: &'static str,
        location: Location,
    ) -> Tensor {
        let Some(d) = axis(self, dim, op, location) else {
            return self.poisoned();
        };
        let n = self.shape()[d];
        if self.dtype() == DType::Bool || n == 0 {
            let message = format!(
                "needs a numeric tensor with elements along dim {d}, got {}",
                self.ty()
            );
            return self.fail(op, location, message);
        }
        let shape = self.shape().to_vec();
        let all: Vec<usize> = (0..shape.len()).collect();
        let spread = |t: &Tensor| {
            let op = Op::Broadcast {
                shape: shape.clone(),
                dims: all.clone(),
            };
            push_at(t, op, location)
        };
        let extreme = spread(&push_reduce(self, kind, &[d as isize], true, location));
        let mut hit = push(self, Op::Compare(CompareOp::Eq), &[&extreme], location);
        if self.dtype().is_float() {
            let nan = push(self, Op::Compare(CompareOp::Ne), &[self], location);
            hit = push(&hit, Op::Binary(BinaryOp::Or), &[&nan], location);
        }
        let b = self.builder();
        let index = b.iota(shape.clone(), d, DType::I32);
        let past = b.full(shape.clone(), DType::I32, n as f64);
        let picked = push(&hit, Op::Select, &[&index, &past], location);
        if any_poisoned(&[&picked]) {
            return picked;
        }
        push_reduce(&picked, ReduceKind::Min, &[d as isize], false, location)
    }
}
