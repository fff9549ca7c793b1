//! Slices at run-time offsets on [`Tensor`]s: XLA's `dynamic_slice` and
//! `dynamic_update_slice` (JAX's `lax.dynamic_slice` / `lax.dynamic_update_slice`).
//!
//! Start indices are i32 scalar tensors, one per dim, clamped so that the block fits
//! (`0..=dim - size`), as XLA does: an out-of-range start reads or writes the block at
//! the nearest edge, never past it.

use super::builder::{Tensor, any_poisoned, push};
use super::op::Op;
use crate::types::Location;

impl Tensor {
    /// The `sizes` block starting at `starts` (one i32 scalar per dim, each clamped so
    /// the block fits). A dim whose size is the whole dim is kept whole (start 0).
    #[track_caller]
    pub fn dynamic_slice(&self, starts: &[&Tensor], sizes: &[usize]) -> Tensor {
        let location = Location::caller();
        if any_poisoned(&[self]) || any_poisoned(starts) {
            return self.poisoned();
        }
        if starts.len() != self.rank() || sizes.len() != self.rank() {
            let message = format!(
                "{} start indices and sizes {sizes:?} for {}: needs one of each per dim",
                starts.len(),
                self.ty()
            );
            return self.fail("dynamic_slice", location, message);
        }
        push(self, Op::DynamicSlice(sizes.to_vec()), starts, location)
    }

    /// This tensor with `update` (same rank and dtype, no dim larger) written at
    /// `starts` (one i32 scalar per dim, each clamped so the update fits).
    #[track_caller]
    pub fn dynamic_update_slice(&self, update: &Tensor, starts: &[&Tensor]) -> Tensor {
        let location = Location::caller();
        let operands: Vec<&Tensor> = std::iter::once(update)
            .chain(starts.iter().copied())
            .collect();
        push(self, Op::DynamicUpdateSlice, &operands, location)
    }
}
