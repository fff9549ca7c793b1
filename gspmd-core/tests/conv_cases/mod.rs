//! Convolution configurations shared by the suites (interpreter against a naive loop,
//! gradients against finite differences, partitioned against the interpreter): 1-, 2-
//! and 3-D windows, dims in unusual orders, strides, positive and negative padding,
//! lhs and rhs dilation, feature groups and depthwise, batch groups; both of the
//! convolution kernel's evaluation orders (direct depthwise, the implicit product), its
//! input read in place and padded, inputs whose batch is innermost (a kernel
//! gradient's layout) and outputs whose features are not.

use gspmd_core::ir::{Builder, ConvDimensionNumbers, DType, Padding, Tensor};

/// One convolution: operand shapes (in the layouts `labels` name) and the window.
pub struct ConvCase {
    pub name: &'static str,
    pub labels: [&'static str; 3],
    pub input: &'static [usize],
    pub kernel: &'static [usize],
    pub strides: &'static [usize],
    pub padding: &'static [(i64, i64)],
    pub lhs_dilation: &'static [usize],
    pub rhs_dilation: &'static [usize],
    pub groups: usize,
    pub batch_groups: usize,
}

impl ConvCase {
    pub fn dims(&self) -> ConvDimensionNumbers {
        let [i, k, o] = self.labels;
        ConvDimensionNumbers::from_labels(i, k, o).expect("valid labels")
    }

    /// `input` convolved with `kernel` as this case says.
    #[track_caller]
    pub fn apply(&self, input: &Tensor, kernel: &Tensor) -> Tensor {
        input.conv_general_dilated_grouped(
            kernel,
            self.strides,
            Padding::Explicit(self.padding.to_vec()),
            self.lhs_dilation,
            self.rhs_dilation,
            &self.dims(),
            self.groups,
            self.batch_groups,
        )
    }

    /// The input and kernel parameters of `dtype`, and the convolution.
    pub fn trace(&self, b: &Builder, dtype: DType) -> (Tensor, Tensor, Tensor) {
        let x = b.parameter("x", self.input.to_vec(), dtype);
        let k = b.parameter("k", self.kernel.to_vec(), dtype);
        let y = self.apply(&x, &k);
        (x, k, y)
    }
}

pub fn cases() -> Vec<ConvCase> {
    vec![
        ConvCase {
            name: "1-D, stride 2, uneven padding",
            labels: ["NCH", "OIH", "NCH"],
            input: &[2, 3, 7],
            kernel: &[4, 3, 3],
            strides: &[2],
            padding: &[(1, 2)],
            lhs_dilation: &[],
            rhs_dilation: &[],
            groups: 1,
            batch_groups: 1,
        },
        ConvCase {
            name: "2-D NHWC/HWIO, strides and rhs dilation",
            labels: ["NHWC", "HWIO", "NHWC"],
            input: &[2, 5, 6, 4],
            kernel: &[3, 2, 4, 5],
            strides: &[1, 2],
            padding: &[(1, 1), (0, 1)],
            lhs_dilation: &[],
            rhs_dilation: &[2, 1],
            groups: 1,
            batch_groups: 1,
        },
        ConvCase {
            name: "2-D NCHW, lhs dilation and negative padding",
            labels: ["NCHW", "OIHW", "NCHW"],
            input: &[1, 2, 4, 3],
            kernel: &[3, 2, 2, 2],
            strides: &[1, 2],
            padding: &[(-1, 1), (2, 0)],
            lhs_dilation: &[2, 3],
            rhs_dilation: &[],
            groups: 1,
            batch_groups: 1,
        },
        ConvCase {
            name: "2-D, 3 feature groups, SAME-like padding",
            labels: ["NHWC", "HWIO", "NHWC"],
            input: &[2, 5, 5, 6],
            kernel: &[3, 3, 2, 6],
            strides: &[1, 1],
            padding: &[(1, 1), (1, 1)],
            lhs_dilation: &[],
            rhs_dilation: &[],
            groups: 3,
            batch_groups: 1,
        },
        ConvCase {
            name: "2-D depthwise, multiplier 2, stride 2",
            labels: ["NHWC", "HWIO", "NHWC"],
            input: &[1, 6, 5, 4],
            kernel: &[3, 2, 1, 8],
            strides: &[2, 1],
            padding: &[(1, 1), (0, 0)],
            lhs_dilation: &[],
            rhs_dilation: &[1, 2],
            groups: 4,
            batch_groups: 1,
        },
        ConvCase {
            name: "3-D, dims in scrambled orders",
            labels: ["HCDNW", "DIWHO", "WNCHD"],
            input: &[4, 2, 3, 2, 5],
            kernel: &[2, 2, 2, 3, 3],
            strides: &[1, 2, 1],
            padding: &[(0, 1), (1, 0), (1, 1)],
            lhs_dilation: &[1, 1, 2],
            rhs_dilation: &[],
            groups: 1,
            batch_groups: 1,
        },
        ConvCase {
            name: "2-D 1x1 kernel, trivial window (spatial dims pass through)",
            labels: ["NHWC", "HWIO", "NHWC"],
            input: &[3, 5, 6, 4],
            kernel: &[1, 1, 4, 6],
            strides: &[1, 1],
            padding: &[(0, 0), (0, 0)],
            lhs_dilation: &[],
            rhs_dilation: &[],
            groups: 1,
            batch_groups: 1,
        },
        ConvCase {
            name: "2-D, 2 batch groups (a grouped convolution's kernel gradient)",
            labels: ["NHWC", "HWIO", "NHWC"],
            input: &[4, 5, 4, 3],
            kernel: &[3, 2, 3, 6],
            strides: &[1, 1],
            padding: &[(1, 1), (0, 1)],
            lhs_dilation: &[],
            rhs_dilation: &[],
            groups: 1,
            batch_groups: 2,
        },
        ConvCase {
            name: "1-D, 3 batch groups, stride 2 and lhs dilation, dims in odd orders",
            labels: ["NCH", "IOH", "CNH"],
            input: &[6, 2, 5],
            kernel: &[2, 3, 2],
            strides: &[2],
            padding: &[(1, 0)],
            lhs_dilation: &[2],
            rhs_dilation: &[],
            groups: 1,
            batch_groups: 3,
        },
        ConvCase {
            name: "2-D depthwise, multiplier 1, SAME (channels contiguous: the direct kernel)",
            labels: ["NHWC", "HWIO", "NHWC"],
            input: &[2, 5, 6, 4],
            kernel: &[3, 3, 1, 4],
            strides: &[1, 1],
            padding: &[(1, 1), (1, 1)],
            lhs_dilation: &[],
            rhs_dilation: &[],
            groups: 4,
            batch_groups: 1,
        },
        ConvCase {
            name: "2-D, input batch innermost (a kernel gradient's layout), rhs dilation",
            labels: ["CHWN", "IHWO", "HWNC"],
            input: &[3, 5, 4, 4],
            kernel: &[3, 2, 3, 5],
            strides: &[1, 2],
            padding: &[(1, 0), (1, 1)],
            lhs_dilation: &[],
            rhs_dilation: &[2, 1],
            groups: 1,
            batch_groups: 1,
        },
        ConvCase {
            name: "2-D, input batch innermost, 2 feature groups, lhs dilation",
            labels: ["CHWN", "HWIO", "NHWC"],
            input: &[4, 4, 3, 3],
            kernel: &[2, 2, 2, 6],
            strides: &[1, 1],
            padding: &[(0, 0), (1, 1)],
            lhs_dilation: &[2, 1],
            rhs_dilation: &[],
            groups: 2,
            batch_groups: 1,
        },
        ConvCase {
            name: "2-D, input batch innermost, 2 batch groups",
            labels: ["CHWN", "HWIO", "NHWC"],
            input: &[2, 3, 3, 4],
            kernel: &[2, 2, 2, 4],
            strides: &[1, 1],
            padding: &[(0, 0), (0, 0)],
            lhs_dilation: &[],
            rhs_dilation: &[],
            groups: 1,
            batch_groups: 2,
        },
    ]
}
