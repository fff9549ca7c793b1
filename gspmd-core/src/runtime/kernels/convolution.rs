//! The `convolution` kernel: XLA's general dilated convolution on host arrays, its
//! operands read where they lie.
//!
//! A convolution's dimension numbers may name any dim of its operands as batch,
//! feature or spatial: the backward convolutions `grad` writes read the forward's
//! values through swapped roles (the kernel gradient convolves the input with its batch
//! as features). The kernel never makes a permuted copy of an operand: every operand
//! and the result are addressed through their standard layout's strides, each role's
//! stride looked up once per call.
//!
//! Three evaluation orders, chosen from the strides:
//! - **depthwise, direct**: one input and one output feature per group (a depthwise
//!   convolution, or its input gradient), features contiguous in input and output: every
//!   output position accumulates its window's taps as contiguous runs over the channels.
//!   A matrix product would be one per channel, each with a single column.
//! - **im2col**: the window of every (batch, output position) packed as a row of a
//!   `[batch * positions, taps * group features]` matrix — each tap one run of the
//!   group's features, copied once — times the group's kernel `[taps * group features,
//!   group output features]` (a strided view of the kernel when its layout already is
//!   that matrix, else packed). Used when the input's features are contiguous, or when
//!   neither of the next order's conditions holds (the runs are then strided reads).
//! - **transposed im2col**: the input's *batch* contiguous and its features not (the
//!   kernel gradient of an NHWC convolution, whose batch is the forward's channels):
//!   the packed matrix is `[taps * group features, positions * batch]`, each (tap,
//!   feature, position) one contiguous run over the batch, and the product is the
//!   transposed one, `kernel^T x packed`.
//!
//! Padding and the holes of an lhs dilation are zeros of the packed matrix: it is
//! zeroed once per call and only the taps that see the input are written (the taps
//! that see padding are the same for every batch element and group). The window's
//! geometry is a per-dim table — for output index `o` and tap `t`, the input offset
//! or none — of `out * kernel` entries per spatial dim, from which each position's
//! window is expanded once per position.

use ndarray::{ArrayD, ArrayView2, ArrayViewMut2, IxDyn, ShapeBuilder, s};

use super::contraction::DotScalar;
use super::{Dims, row_major};
use crate::ir::{ConvConfig, WindowDim};

/// `convolution(input, kernel)` with `config` and result `shape` (checked by the
/// caller's shape rule). For each group (feature or batch group: at most one count
/// exceeds 1), feature group `g` reads input features `g * group features ..`, batch
/// group `g` the input batch `g * batch ..` (`batch` the output's); group `g` writes
/// output features `g * group out ..`.
pub(super) fn convolution<T: DotScalar>(
    config: &ConvConfig,
    input: &ArrayD<T>,
    kernel: &ArrayD<T>,
    shape: &[usize],
) -> Result<ArrayD<T>, String> {
    let x = input.as_standard_layout();
    let k = kernel.as_standard_layout();
    let plan = Plan::new(config, x.shape(), k.shape(), shape);
    let (xs, ks) = (
        x.as_slice().ok_or("the input is not contiguous")?,
        k.as_slice().ok_or("the kernel is not contiguous")?,
    );
    let mut out = vec![T::default(); shape.iter().product()];
    if !out.is_empty() && plan.taps * plan.group_features > 0 {
        if plan.depthwise() {
            plan.depthwise_direct(xs, ks, &mut out);
        } else if plan.feature_stride != 1 && plan.batch_stride == 1 && plan.batch > 1 {
            plan.im2col_transposed(xs, ks, &mut out)?;
        } else {
            plan.im2col(xs, ks, &mut out)?;
        }
    }
    ArrayD::from_shape_vec(IxDyn(shape), out).map_err(|e| e.to_string())
}

/// One convolution's geometry: sizes, and each role's stride in its operand's
/// standard layout (in elements).
struct Plan {
    /// The output batch (the input's is `batch * batch groups`).
    batch: usize,
    feature_groups: usize,
    batch_groups: usize,
    /// Input features per group (the kernel's input feature dim).
    group_features: usize,
    /// Output features per group.
    group_out: usize,
    /// Output positions (the product of the output's spatial dims).
    positions: usize,
    /// Kernel taps (the product of the kernel's spatial dims).
    taps: usize,
    /// The input's batch and feature strides.
    batch_stride: usize,
    feature_stride: usize,
    /// The kernel's input and output feature strides.
    kernel_in_stride: usize,
    kernel_out_stride: usize,
    /// The output's batch and feature strides.
    out_batch_stride: usize,
    out_feature_stride: usize,
    /// Per spatial dim: the output size, the kernel size, and for output index `o` and
    /// tap `t` entry `o * kernel + t`: the offset of the input element the tap sees
    /// (its index times the input's stride), or `None` where it sees padding or a hole
    /// of the lhs dilation.
    spatial: Vec<Spatial>,
    /// The kernel offset of each tap, row-major over the kernel's spatial dims.
    tap_offsets: Vec<usize>,
}

/// One spatial dim of a [`Plan`].
struct Spatial {
    out: usize,
    kernel: usize,
    out_stride: usize,
    seen: Vec<Option<usize>>,
}

impl Plan {
    fn new(config: &ConvConfig, input: &[usize], kernel: &[usize], shape: &[usize]) -> Plan {
        let dn = &config.dims;
        let (xst, kst, ost) = (row_major(input), row_major(kernel), row_major(shape));
        let spatial: Vec<Spatial> = (config.window.iter().enumerate())
            .map(|(d, w)| {
                let (out, size) = (shape[dn.output_spatial[d]], kernel[dn.kernel_spatial[d]]);
                let (n, stride) = (input[dn.input_spatial[d]], xst[dn.input_spatial[d]]);
                Spatial {
                    out,
                    kernel: size,
                    out_stride: ost[dn.output_spatial[d]],
                    seen: seen(w, n, stride, out, size),
                }
            })
            .collect();
        let kernel_spatial: Dims = dn.kernel_spatial.iter().map(|&d| kernel[d]).collect();
        let mut tap_offsets = Vec::new();
        for_each_index(&kernel_spatial, |_, t| {
            let offset = (t.iter().zip(&dn.kernel_spatial)).map(|(&i, &d)| i * kst[d]);
            tap_offsets.push(offset.sum());
        });
        let groups = config.feature_group_count * config.batch_group_count;
        Plan {
            batch: shape[dn.output_batch],
            feature_groups: config.feature_group_count,
            batch_groups: config.batch_group_count,
            group_features: kernel[dn.kernel_input_feature],
            group_out: shape[dn.output_feature] / groups.max(1),
            positions: spatial.iter().map(|s| s.out).product(),
            taps: tap_offsets.len(),
            batch_stride: xst[dn.input_batch],
            feature_stride: xst[dn.input_feature],
            kernel_in_stride: kst[dn.kernel_input_feature],
            kernel_out_stride: kst[dn.kernel_output_feature],
            out_batch_stride: ost[dn.output_batch],
            out_feature_stride: ost[dn.output_feature],
            spatial,
            tap_offsets,
        }
    }

    fn groups(&self) -> usize {
        self.feature_groups * self.batch_groups
    }

    /// Output features in all.
    fn out_features(&self) -> usize {
        self.groups() * self.group_out
    }

    /// The direct path applies: one input and one output feature per group, features
    /// contiguous in the input and the output.
    fn depthwise(&self) -> bool {
        self.group_features == 1
            && self.group_out == 1
            && self.batch_groups == 1
            && self.feature_stride == 1
            && self.out_feature_stride == 1
    }

    /// Calls `f(p, out)` for every output position `p` (row-major) with its offset in
    /// the output.
    fn for_each_position(&self, mut f: impl FnMut(usize, &[usize], usize)) {
        let outs: Dims = self.spatial.iter().map(|s| s.out).collect();
        for_each_index(&outs, |p, at| {
            let out = self.spatial.iter().zip(at).map(|(s, &o)| o * s.out_stride);
            f(p, at, out.sum());
        });
    }

    /// Calls `f(p, window, out)` for every output position `p` (row-major), with the
    /// input offset each tap sees (or `None`, row-major over the taps) and the
    /// position's offset in the output.
    fn for_each_window(&self, mut f: impl FnMut(usize, &[Option<usize>], usize)) {
        let (mut window, mut next) = (Vec::new(), Vec::new());
        self.for_each_position(|p, at, out| {
            window.clear();
            window.push(Some(0));
            for (s, &o) in self.spatial.iter().zip(at) {
                let seen = &s.seen[o * s.kernel..(o + 1) * s.kernel];
                next.clear();
                for &base in &window {
                    next.extend(seen.iter().map(|&t| base.zip(t).map(|(b, t)| b + t)));
                }
                std::mem::swap(&mut window, &mut next);
            }
            f(p, &window, out);
        });
    }

    /// The direct path ([`Plan::depthwise`]): every output position accumulates, tap
    /// by tap in order, the window's input run over the channels times the tap's
    /// kernel run.
    fn depthwise_direct<T: DotScalar>(&self, xs: &[T], ks: &[T], out: &mut [T]) {
        let channels = self.out_features();
        // The kernel as [taps, channels], contiguous runs per tap.
        let mut kt = Vec::with_capacity(self.taps * channels);
        for &t in &self.tap_offsets {
            kt.extend((0..channels).map(|c| ks[t + c * self.kernel_out_stride]));
        }
        self.for_each_window(|_, window, at| {
            for b in 0..self.batch {
                let base = b * self.batch_stride;
                let run = &mut out[b * self.out_batch_stride + at..][..channels];
                for (taps, &seen) in kt.chunks_exact(channels).zip(window) {
                    if let Some(o) = seen {
                        let xs = &xs[base + o..][..channels];
                        for ((y, &x), &k) in run.iter_mut().zip(xs).zip(taps) {
                            *y = T::mul_add(*y, x, k);
                        }
                    }
                }
            }
        });
    }

    /// The group's kernel as the matrix `[taps * group features, group out]`: a view
    /// when the kernel's layout already is one (HWIO: taps and input features
    /// row-major, uniformly strided), else a packed copy.
    fn kernel_matrix<'a, T: DotScalar>(&self, ks: &'a [T], g: usize) -> KernelMatrix<'a, T> {
        let (gf, go) = (self.group_features, self.group_out);
        let start = g * go * self.kernel_out_stride;
        let uniform = (self.tap_offsets.iter().enumerate())
            .all(|(t, &o)| o == t * gf * self.kernel_in_stride);
        let rows = self.taps * gf;
        if uniform {
            let strides = (rows, go).strides((self.kernel_in_stride, self.kernel_out_stride));
            if let Ok(view) = ArrayView2::from_shape(strides, &ks[start..]) {
                return KernelMatrix::View(view);
            }
        }
        let mut packed = Vec::with_capacity(rows * go);
        for &t in &self.tap_offsets {
            for c in 0..gf {
                let row = start + t + c * self.kernel_in_stride;
                packed.extend((0..go).map(|j| ks[row + j * self.kernel_out_stride]));
            }
        }
        KernelMatrix::Packed(
            ndarray::Array2::from_shape_vec((rows, go), packed).expect("rows * go elements"),
        )
    }

    /// The input offset of group `g`'s first feature of batch element `b`.
    fn input_base(&self, g: usize, b: usize) -> usize {
        let (feature_group, batch_group) = (g % self.feature_groups, g % self.batch_groups);
        (batch_group * self.batch + b) * self.batch_stride
            + feature_group * self.group_features * self.feature_stride
    }

    /// im2col: per group, the packed `[batch * positions, taps * group features]`
    /// times the group's kernel matrix, into `product` `[batch * positions, out
    /// features]` (the output itself when its layout is that matrix).
    fn im2col<T: DotScalar>(&self, xs: &[T], ks: &[T], out: &mut [T]) -> Result<(), String> {
        let (gf, go, width) = (self.group_features, self.group_out, self.out_features());
        let rows = self.batch * self.positions;
        let mut cols = vec![T::default(); rows * self.taps * gf];
        // The output is the product matrix when its features are innermost and its
        // batch and positions row-major outside them.
        let row_major_out = self.out_feature_stride == 1
            && self.out_batch_stride == self.positions * width
            && self.is_row_major_out(width);
        let mut separate = Vec::new();
        if !row_major_out {
            separate = vec![T::default(); rows * width];
        }
        for g in 0..self.groups() {
            self.for_each_window(|p, window, _| {
                for b in 0..self.batch {
                    let base = self.input_base(g, b);
                    let row =
                        &mut cols[(b * self.positions + p) * self.taps * gf..][..self.taps * gf];
                    for (dst, &seen) in row.chunks_exact_mut(gf).zip(window) {
                        if let Some(o) = seen {
                            copy_run(xs, base + o, self.feature_stride, dst);
                        }
                    }
                }
            });
            let cols = ArrayView2::from_shape((rows, self.taps * gf), &cols[..])
                .map_err(|e| format!("cannot view the packed windows: {e}"))?;
            let product = if row_major_out {
                &mut *out
            } else {
                &mut separate[..]
            };
            let mut product = ArrayViewMut2::from_shape((rows, width), product)
                .map_err(|e| format!("cannot view the product: {e}"))?;
            let kernel = self.kernel_matrix(ks, g);
            T::matmul_into(
                cols,
                kernel.view(),
                product.slice_mut(s![.., g * go..(g + 1) * go]),
            );
        }
        if !row_major_out {
            self.place(&separate, [self.positions * width, width, 1], out);
        }
        Ok(())
    }

    /// Transposed im2col: per group, the packed `[taps * group features, positions *
    /// batch]` (contiguous runs over the batch), and the product `kernel^T x packed`
    /// into `[out features, positions * batch]`, placed into the output.
    fn im2col_transposed<T: DotScalar>(
        &self,
        xs: &[T],
        ks: &[T],
        out: &mut [T],
    ) -> Result<(), String> {
        let (gf, go, width) = (self.group_features, self.group_out, self.out_features());
        let columns = self.positions * self.batch;
        let mut cols = vec![T::default(); self.taps * gf * columns];
        let mut product = ndarray::Array2::<T>::default((width, columns));
        for g in 0..self.groups() {
            let base = self.input_base(g, 0);
            self.for_each_window(|p, window, _| {
                for (t, &seen) in window.iter().enumerate() {
                    let Some(o) = seen else { continue };
                    for c in 0..gf {
                        let src = base + o + c * self.feature_stride;
                        let dst = ((t * gf + c) * columns) + p * self.batch;
                        cols[dst..dst + self.batch].copy_from_slice(&xs[src..src + self.batch]);
                    }
                }
            });
            let cols = ArrayView2::from_shape((self.taps * gf, columns), &cols[..])
                .map_err(|e| format!("cannot view the packed windows: {e}"))?;
            let kernel = self.kernel_matrix(ks, g);
            T::matmul_into(
                kernel.view().t(),
                cols,
                product.slice_mut(s![g * go..(g + 1) * go, ..]),
            );
        }
        let product = product.as_slice().ok_or("the product is not contiguous")?;
        self.place(product, [1, self.batch, columns], out);
        Ok(())
    }

    /// Whether the output's spatial dims are row-major over `positions`, each
    /// position `width` elements apart.
    fn is_row_major_out(&self, width: usize) -> bool {
        let mut stride = width;
        for s in self.spatial.iter().rev() {
            if s.out > 1 && s.out_stride != stride {
                return false;
            }
            stride *= s.out;
        }
        true
    }

    /// Writes `product` (element (b, p, o) at `b * strides[0] + p * strides[1] + o *
    /// strides[2]`) into the output in its layout.
    fn place<T: Copy>(&self, product: &[T], strides: [usize; 3], out: &mut [T]) {
        let width = self.out_features();
        self.for_each_position(|p, _, at| {
            for b in 0..self.batch {
                let (src, dst) = (
                    b * strides[0] + p * strides[1],
                    b * self.out_batch_stride + at,
                );
                for o in 0..width {
                    out[dst + o * self.out_feature_stride] = product[src + o * strides[2]];
                }
            }
        });
    }
}

/// A group's kernel matrix ([`Plan::kernel_matrix`]).
enum KernelMatrix<'a, T> {
    View(ArrayView2<'a, T>),
    Packed(ndarray::Array2<T>),
}

impl<T> KernelMatrix<'_, T> {
    fn view(&self) -> ArrayView2<'_, T> {
        match self {
            KernelMatrix::View(v) => v.view(),
            KernelMatrix::Packed(a) => a.view(),
        }
    }
}

/// For one spatial dim of size `n` (input element stride `stride`) under window dim
/// `w`, with `out` output positions and `kernel` taps: entry `o * kernel + t` is the
/// offset of the input element output `o` sees by tap `t`, or `None` for padding or a
/// hole of the lhs dilation.
fn seen(w: &WindowDim, n: usize, stride: usize, out: usize, kernel: usize) -> Vec<Option<usize>> {
    let dilation = w.base_dilation as i64;
    let mut seen = Vec::with_capacity(out * kernel);
    for o in 0..out {
        for t in 0..kernel {
            let q = (o * w.stride + t * w.window_dilation) as i64 - w.padding_low;
            seen.push(
                (q >= 0 && q % dilation == 0)
                    .then_some((q / dilation) as usize)
                    .filter(|&i| i < n)
                    .map(|i| i * stride),
            );
        }
    }
    seen
}

/// Copies `dst.len()` elements of `src` from `start`, `stride` apart.
fn copy_run<T: Copy>(src: &[T], start: usize, stride: usize, dst: &mut [T]) {
    if stride == 1 {
        dst.copy_from_slice(&src[start..start + dst.len()]);
    } else {
        for (i, d) in dst.iter_mut().enumerate() {
            *d = src[start + i * stride];
        }
    }
}

/// Calls `f(i, index)` for every index of `shape`, row-major, `i` its linear position
/// (once, with an empty index, for rank 0).
fn for_each_index(shape: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let total: usize = shape.iter().product();
    let mut index: Dims = smallvec::smallvec![0; shape.len()];
    for i in 0..total {
        f(i, &index);
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}
