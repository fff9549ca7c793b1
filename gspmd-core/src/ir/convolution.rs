//! Convolution on [`Tensor`]s in `jax.lax`'s spirit: [`Tensor::conv_general_dilated`]
//! (any dimension numbers, strides, padding, dilations, feature groups),
//! [`Tensor::conv_general_dilated_grouped`] (the same with batch groups too) and the
//! [`Tensor::conv2d`] convenience for NHWC inputs and HWIO kernels. All build one
//! [`Op::Convolution`]; its shape rule reports every bad configuration.

use super::builder::{Tensor, any_poisoned, push};
use super::op::{ConvConfig, ConvDimensionNumbers, Op, Padding, WindowDim};
use crate::types::Location;

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
        self.conv_general_dilated_grouped(
            kernel,
            window_strides,
            padding,
            lhs_dilation,
            rhs_dilation,
            dimension_numbers,
            feature_group_count,
            1,
        )
    }

    /// [`Tensor::conv_general_dilated`] with `jax.lax`'s `batch_group_count` too: the
    /// input batch is cut in that many groups (major), group `g` convolved with the
    /// kernel's output features `g * O / count ..`, and the output batch is one group
    /// (XLA's semantics; a grouped convolution's kernel gradient is one). At most one of
    /// the two counts may exceed 1; a count that does not divide the batch or the
    /// features is an [`crate::Error::Shape`] at the caller's line.
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn conv_general_dilated_grouped(
        &self,
        kernel: &Tensor,
        window_strides: &[usize],
        padding: Padding,
        lhs_dilation: &[usize],
        rhs_dilation: &[usize],
        dimension_numbers: &ConvDimensionNumbers,
        feature_group_count: usize,
        batch_group_count: usize,
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
                    batch_group_count,
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
    let size = |t: &Tensor, d: Option<&usize>| d.and_then(|&d| t.shape().get(d)).copied();
    let dilated = |n: usize, dilation: usize| n.saturating_sub(1).saturating_mul(dilation) + 1;
    let sizes: Vec<usize> = (0..spatial)
        .map(|i| size(kernel, dn.kernel_spatial.get(i)).unwrap_or(1))
        .collect();
    let pads = padding.resolve(spatial, |i| {
        let n = size(input, dn.input_spatial.get(i)).unwrap_or(1);
        let span = dilated(sizes[i], rhs_dilation[i]);
        (dilated(n, lhs_dilation[i]), span, strides[i])
    })?;
    Ok((0..spatial)
        .map(|i| {
            WindowDim::new(sizes[i], strides[i], pads[i])
                .with_window_dilation(rhs_dilation[i])
                .with_base_dilation(lhs_dilation[i])
        })
        .collect())
}
