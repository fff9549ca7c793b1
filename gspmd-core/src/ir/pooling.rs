//! Windowed reductions on [`Tensor`]s: XLA's `reduce_window` and the pooling layers
//! built from it (JAX/Flax's `max_pool` and `avg_pool`), and nearest-neighbour
//! upsampling, built from `broadcast_in_dim` and `reshape`.
//!
//! Windows, strides and padding have one entry per operand dim (as `lax.reduce_window`):
//! an NHWC image pooled 2x2 takes `window = [1, 2, 2, 1]`.

use super::builder::{Tensor, any_poisoned};
use super::op::{Op, Padding, ReduceKind, WindowDim};
use crate::types::Location;

impl Tensor {
    /// XLA's `reduce_window` with `kind`'s identity as init value and padding: per dim a
    /// window of `window[d]` elements every `strides[d]`, over the operand padded by
    /// `padding[d] = (low, high)`. One entry per dim in each list.
    #[track_caller]
    pub fn reduce_window(
        &self,
        kind: ReduceKind,
        window: &[usize],
        strides: &[usize],
        padding: &[(i64, i64)],
    ) -> Tensor {
        let location = Location::caller();
        if any_poisoned(&[self]) {
            return self.poisoned();
        }
        let r = self.rank();
        if window.len() != r || strides.len() != r || padding.len() != r {
            let message = format!(
                "window {window:?}, strides {strides:?} and padding {padding:?} need one entry per dim of {}",
                self.ty()
            );
            return self.fail("reduce_window", location, message);
        }
        let dims: Vec<WindowDim> = (0..r)
            .map(|d| WindowDim::new(window[d], strides[d], padding[d]))
            .collect();
        self.reduce_window_with(kind, &dims)
    }

    /// `reduce_window` with a full window description per dim (window dilation too).
    #[track_caller]
    pub fn reduce_window_with(&self, kind: ReduceKind, window: &[WindowDim]) -> Tensor {
        let op = Op::ReduceWindow {
            kind,
            window: window.to_vec(),
        };
        super::builder::push_at(self, op, Location::caller())
    }

    /// Max pooling: the maximum of each window (padding never wins: it is `-inf`).
    #[track_caller]
    pub fn max_pool(&self, window: &[usize], strides: &[usize], padding: Padding) -> Tensor {
        match self.pool_padding(window, strides, &padding) {
            Ok(pads) => self.reduce_window(ReduceKind::Max, window, strides, &pads),
            Err(message) => self.fail("max_pool", Location::caller(), message),
        }
    }

    /// Average pooling: the sum of each window divided by its element count. With
    /// `count_include_pad` (the default of Flax's `avg_pool` and PyTorch's `AvgPool`)
    /// padding counts as zeros, so every window divides by the product of `window`;
    /// without, each window divides by the number of operand elements under it.
    #[track_caller]
    pub fn avg_pool(
        &self,
        window: &[usize],
        strides: &[usize],
        padding: Padding,
        count_include_pad: bool,
    ) -> Tensor {
        let pads = match self.pool_padding(window, strides, &padding) {
            Ok(pads) => pads,
            Err(message) => return self.fail("avg_pool", Location::caller(), message),
        };
        let sum = self.reduce_window(ReduceKind::Sum, window, strides, &pads);
        if any_poisoned(&[&sum]) {
            return sum;
        }
        let count = if count_include_pad {
            // In f64: a window may hold more elements than usize counts.
            self.scalar_like(window.iter().map(|&w| w as f64).product())
        } else {
            let ones = self
                .builder()
                .full(self.shape().to_vec(), self.dtype(), 1.0);
            ones.reduce_window(ReduceKind::Sum, window, strides, &pads)
        };
        sum.div(&count)
    }

    /// Nearest-neighbour upsampling: dim `d` grows `factors[d]` times, result element
    /// `i` being operand element `i / factors[d]`. A `broadcast_in_dim` that adds a dim
    /// of `factors[d]` after each grown dim, then a `reshape` merging each pair.
    #[track_caller]
    pub fn upsample_nearest(&self, factors: &[usize]) -> Tensor {
        let location = Location::caller();
        if any_poisoned(&[self]) {
            return self.poisoned();
        }
        if factors.len() != self.rank() || factors.contains(&0) {
            let message = format!(
                "factors {factors:?} need one entry of at least 1 per dim of {}",
                self.ty()
            );
            return self.fail("upsample_nearest", location, message);
        }
        let (mut spread, mut dims) = (Vec::new(), Vec::new());
        for (&n, &f) in self.shape().iter().zip(factors) {
            dims.push(spread.len());
            spread.push(n);
            if f > 1 {
                spread.push(f);
            }
        }
        let b = self.broadcast_in_dim(spread, &dims);
        if any_poisoned(&[&b]) {
            return b;
        }
        // The broadcast holds exactly these elements, so the products do not overflow.
        let shape: Vec<usize> = (self.shape().iter().zip(factors))
            .map(|(&n, &f)| n * f)
            .collect();
        b.reshape(shape)
    }

    /// The `(low, high)` padding of each dim for a pooling layer; a message for an
    /// explicit list of the wrong length. `window`'s and `strides`' own length
    /// mismatches are left to `reduce_window` to report.
    fn pool_padding(
        &self,
        window: &[usize],
        strides: &[usize],
        padding: &Padding,
    ) -> Result<Vec<(i64, i64)>, String> {
        let shape = self.shape();
        padding.resolve(self.rank(), |d| {
            let at = |v: &[usize]| v.get(d).copied().unwrap_or(1);
            (shape[d], at(window), at(strides))
        })
    }
}
