//! Math composites on [`Tensor`]s, built from the elementwise primitives: clamping,
//! Python's floor division and modulo, and the exact GELU.
//!
//! Every method is `#[track_caller]` and calls only `#[track_caller]` methods, so each
//! node it emits, and any error, carries the user's line.

use super::builder::Tensor;
use crate::types::DType;

impl Tensor {
    /// `min(max(x, lo), hi)` elementwise, as `jnp.clip` (NumPy broadcasting; `hi` wins
    /// where `lo > hi`).
    #[track_caller]
    pub fn clamp(&self, lo: &Tensor, hi: &Tensor) -> Tensor {
        self.max(lo).min(hi)
    }

    /// [`Tensor::clamp`] to the scalars `lo` and `hi`.
    #[track_caller]
    pub fn clamp_scalar(&self, lo: f64, hi: f64) -> Tensor {
        self.clamp(&self.scalar_like(lo), &self.scalar_like(hi))
    }

    /// Floor modulo, as Python's `%`, `jnp.remainder` and `torch.remainder`: `a - b
    /// floor(a/b)`, the sign of the divisor `b` (`-7 mod 3 = 2`, `7 mod -3 = -2`): the
    /// truncated [`Tensor::rem`], plus `b` where that has the other sign. i32: `a mod 0
    /// = a`, as [`Tensor::rem`].
    #[track_caller]
    pub fn remainder(&self, b: &Tensor) -> Tensor {
        let r = self.rem(b);
        r.wrong_sign(b).select(&(&r + b), &r)
    }

    /// Floor division, as Python's `//` and `jnp.floor_divide`: `floor(a/b)`. f32:
    /// `floor` of the quotient. i32: the truncating quotient, minus one where the
    /// remainder and `b` have opposite signs (`-7 // 2 = -4`); `a // 0 = -1`, XLA's
    /// division by zero.
    #[track_caller]
    pub fn floor_divide(&self, b: &Tensor) -> Tensor {
        let q = self.div(b);
        if self.dtype() != DType::I32 {
            return q.floor();
        }
        let r = self.rem(b);
        r.wrong_sign(b).select(&(&q - 1.0), &q)
    }

    /// Where the truncated remainder `self` of a division by `b` and `b` are non-zero
    /// with opposite signs: where floor and truncated division differ.
    #[track_caller]
    fn wrong_sign(&self, b: &Tensor) -> Tensor {
        // Signs multiply without overflow; NaN compares false.
        (self.sign() * b.sign()).lt(&self.scalar_like(0.0))
    }

    /// GELU without the tanh approximation: `x/2 (1 + erf(x / sqrt 2))` (PyTorch's
    /// default `gelu`, `jax.nn.gelu(approximate=False)`).
    #[track_caller]
    pub fn gelu_exact(&self) -> Tensor {
        let cdf = (self * std::f32::consts::FRAC_1_SQRT_2).erf() + 1.0;
        self * 0.5 * cdf
    }
}
