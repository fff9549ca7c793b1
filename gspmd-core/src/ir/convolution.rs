//! Convolution on [`Tensor`]s in `jax.lax`'s spirit: [`Tensor::conv_general_dilated`]
//! (any dimension numbers, strides, padding, dilations, feature groups) and the
//! [`Tensor::conv2d`] convenience for NHWC inputs and HWIO kernels. Both build one
//! [`Op::Convolution`]; its shape rule reports every bad configuration.

use super::builder::{Tensor, any_poisoned, push};
use super::op::{ConvConfig, ConvDimensionNumbers, Op, WindowDim};
use crate::types::Location;

/// How a convolution pads its input, per spatial dim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Padding {
    /// No padding: only windows that fit the input.
    Valid,
    /// Output size `ceil(input / stride)`; the padding needed is split with the smaller
    /// half low (TensorFlow's and JAX's `SAME`), computed on the lhs-dilated input and
    /// the rhs-dilated window.
    Same,
    /// `(low, high)` per spatial dim; negative crops.
    Explicit(Vec<(i64, i64)>),
}

impl Tensor {
    /// XLA's general dilated convolution (`jax.lax.conv_general_dilated`) of `self` (the
    /// input) with `kernel`. `window_strides` has one entry per spatial dim;
    /// `lhs_dilation` and `rhs_dilation` one per spatial dim, or none for no dilation.
    /// Records an [`crate::Error::Shape`] at the caller's line for a configuration that
    /// does not fit (see [`crate::ir::infer_type`]).
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn conv_general_dilated(
        &self,
        kernel: &Tensor,
        window_strides: &[usize],
        padding: Padding,
        lhs_dilation: &[usize],
        rhs_dilation: &[usize],
        dimension_numbers: &ConvDimensionNumbers,
        feature_group_count: usize,
    ) -> Tensor {
        let location = Location::caller();
        if any_poisoned(&[self, kernel]) {
            return self.poisoned();
        }
        match window(
            self,
            kernel,
            window_strides,
            &padding,
            lhs_dilation,
            rhs_dilation,
            dimension_numbers,
        ) {
            Ok(window) => {
                let config = ConvConfig {
                    dims: dimension_numbers.clone(),
                    window,
                    feature_group_count,
                };
                push(self, Op::Convolution(config), &[kernel], location)
            }
            Err(message) => self.fail("convolution", location, message),
        }
    }

    /// 2-D convolution of an NHWC input with an HWIO kernel (TensorFlow's layout), with
    /// `strides` over (H, W).
    #[track_caller]
    pub fn conv2d(&self, kernel: &Tensor, strides: [usize; 2], padding: Padding) -> Tensor {
        let nhwc = ConvDimensionNumbers {
            input_batch: 0,
            input_feature: 3,
            input_spatial: vec![1, 2],
            kernel_input_feature: 2,
            kernel_output_feature: 3,
            kernel_spatial: vec![0, 1],
            output_batch: 0,
            output_feature: 3,
            output_spatial: vec![1, 2],
        };
        self.conv_general_dilated(kernel, &strides, padding, &[], &[], &nhwc, 1)
    }
}

/// The window of a convolution of `input` with `kernel`, or a message naming the
/// argument of the wrong length. Dims out of range are left to the shape rule.
fn window(
    input: &Tensor,
    kernel: &Tensor,
    strides: &[usize],
    padding: &Padding,
    lhs_dilation: &[usize],
    rhs_dilation: &[usize],
    dn: &ConvDimensionNumbers,
) -> Result<Vec<WindowDim>, String> {
    let spatial = dn.input_spatial.len();
    let per_dim = |what: &str, v: &[usize]| -> Result<Vec<usize>, String> {
        match v.len() {
            0 if what != "window_strides" => Ok(vec![1; spatial]),
            n if n == spatial => Ok(v.to_vec()),
            n => Err(format!("{what} has {n} entries for {spatial} spatial dims")),
        }
    };
    let strides = per_dim("window_strides", strides)?;
    let lhs_dilation = per_dim("lhs_dilation", lhs_dilation)?;
    let rhs_dilation = per_dim("rhs_dilation", rhs_dilation)?;
    let pads: Vec<(i64, i64)> = match padding {
        Padding::Explicit(p) if p.len() == spatial => p.clone(),
        Padding::Explicit(p) => {
            return Err(format!(
                "padding has {} entries for {spatial} spatial dims",
                p.len()
            ));
        }
        Padding::Valid => vec![(0, 0); spatial],
        Padding::Same => (0..spatial)
            .map(|i| {
                let size = |t: &Tensor, d: Option<&usize>| {
                    d.and_then(|&d| t.shape().get(d)).copied().unwrap_or(1) as i64
                };
                let dilated = |n: i64, dilation: usize| (n - 1).max(0) * dilation as i64 + 1;
                let n = dilated(size(input, dn.input_spatial.get(i)), lhs_dilation[i]);
                let k = dilated(size(kernel, dn.kernel_spatial.get(i)), rhs_dilation[i]);
                let s = strides[i].max(1) as i64;
                let out = (n + s - 1) / s;
                let total = ((out - 1) * s + k - n).max(0);
                (total / 2, total - total / 2)
            })
            .collect(),
    };
    Ok((0..spatial)
        .map(|i| WindowDim {
            stride: strides[i],
            padding_low: pads[i].0,
            padding_high: pads[i].1,
            lhs_dilation: lhs_dilation[i],
            rhs_dilation: rhs_dilation[i],
        })
        .collect())
}
