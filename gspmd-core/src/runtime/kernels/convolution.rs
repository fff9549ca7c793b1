//! The `convolution` kernel: XLA's general dilated convolution on host arrays, as an
//! implicit matrix product read straight from the input.
//!
//! A convolution's dimension numbers may name any dim of its operands as batch,
//! feature or spatial: the backward convolutions `grad` writes read the forward's
//! values through swapped roles (the kernel gradient convolves the input with its batch
//! as features). The kernel never makes a permuted copy of an operand: every operand
//! and the result are addressed through their standard layout's strides, each role's
//! stride looked up once per call.
//!
//! **The padded input.** Padding and the holes of an lhs dilation are zeros that the
//! windows read like any element: when some window reaches them, the input is copied
//! once into a buffer of the device's pool holding exactly the region the windows
//! cover (the input's dims in its order, each spatial dim spread and padded; whole
//! rows copied at a time), else it is read in place. Every window then lies wholly in
//! that array, so a tap's input offset is the same for every position (one table of
//! `taps` offsets per call), and no loop checks for padding.
//!
//! **The product.** Per group, output row `(b, p)` (batch element, output position) and
//! output feature `o` is `sum over (t, f) of input[b, p + t, f] * kernel[t, f, o]`, `t`
//! a tap and `f` a group feature: a matrix product whose left operand, the patch
//! matrix, is never built: its element `((b, p), (t, f))` is read from the padded input
//! at `row(b, p) + reduction(t, f)`, two offset tables. The right operand (the kernel,
//! or for a kernel gradient the result's cotangent) is packed once per call into panels
//! of one or two vector registers' width of output features. The f32 loop (`pulp`'s
//! run-time dispatch: AVX2 or AVX-512) keeps a block of 8 rows by one register, or 6 by
//! two, in registers: per reduction index one load of the panel's registers and one
//! broadcast of the input element per row, fused multiply-adds. Rows are taken in
//! chunks whose input stays in the L2 cache, the reduction in blocks whose panel stays
//! in L1; a block after the first resumes from the sums written, so each output element
//! is one sum over `(t, f)` in order, whatever the blocking. i32 runs the same product
//! as a plain loop (wrapping).
//!
//! **Few output features, dots.** At most half a register of output features per group
//! over at least half a register of adjacent input features (the 1x1 output conv, the
//! input gradient of a one-channel input's conv) would leave most lanes of a panel
//! idle: each output element is instead a dot product over its window, each tap's
//! features in vector registers, the lanes added at the end ([`dots`]); its order
//! depends only on the features and taps, not on which rows a call computes.
//!
//! **Depthwise, direct.** One input and one output feature per group, features
//! contiguous in the input and the output (a depthwise convolution, or its input
//! gradient): a matrix product would be one per channel, each with a single column, so
//! every output position accumulates its window's taps instead, each a contiguous run
//! over the channels.

use std::borrow::Cow;
use std::cell::RefCell;

use ndarray::{ArrayD, IxDyn};
use pulp::{Simd, bytemuck};

use super::contraction::DotScalar;
use super::{Dims, row_major};
use crate::ir::{ConvConfig, WindowDim};
use crate::runtime::buffers;

/// Element types the convolution kernel computes in: the implicit product per type.
pub(super) trait ConvScalar: DotScalar {
    /// Writes `gemm`'s product (every output row and feature of every group) into
    /// `out`, whatever `out` held before.
    fn multiply(gemm: &Gemm<'_, Self>, out: &mut [Self]);
}

impl ConvScalar for f32 {
    fn multiply(gemm: &Gemm<'_, f32>, out: &mut [f32]) {
        PANELS.with_borrow_mut(|panel| pulp::Arch::new().dispatch(Vectorised { gemm, out, panel }));
    }
}

impl ConvScalar for i32 {
    fn multiply(gemm: &Gemm<'_, i32>, out: &mut [i32]) {
        gemm.scalar(out);
    }
}

/// `convolution(input, kernel)` with `config` and result `shape` (checked by the
/// caller's shape rule). For each group (feature or batch group: at most one count
/// exceeds 1), feature group `g` reads input features `g * group features ..`, batch
/// group `g` the input batch `g * batch ..` (`batch` the output's); group `g` writes
/// output features `g * group out ..`.
pub(super) fn convolution<T: ConvScalar>(
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
    // Pooled: every element is written below.
    let mut out = buffers::take::<T>(shape.iter().product());
    if plan.taps * plan.group_features == 0 {
        // Nothing summed: zeros.
        out.fill(T::default());
    } else if !out.is_empty() {
        let padded = Padded::new(&plan, xs, x.shape());
        if plan.depthwise() {
            out.fill(T::default());
            plan.depthwise_direct(&padded, ks, &mut out);
        } else {
            plan.implicit_product(&padded, ks, &mut out);
        }
        padded.give_back();
    }
    ArrayD::from_shape_vec(IxDyn(shape), out).map_err(|e| e.to_string())
}

/// The most bytes [`convolution`] holds besides its operands and result, for elements
/// of `size` bytes: the padded copy of the input (when one is made), the kernel's
/// packed panels (as wide as two vector registers of 16 lanes at most), the offset
/// tables, and the product when the output's features are not contiguous.
pub(crate) fn scratch_bytes(
    config: &ConvConfig,
    input: &[usize],
    kernel: &[usize],
    shape: &[usize],
    size: usize,
) -> usize {
    let plan = Plan::new(config, input, kernel, shape);
    let dims = plan.pad_dims(input);
    let copy = match needs_copy(&dims) {
        true => dims.iter().map(|d| d.len).product::<usize>() * size,
        false => 0,
    };
    let (rows, depth) = (plan.batch * plan.positions, plan.taps * plan.group_features);
    let width = if plan.group_out <= 8 { 16 } else { 32 };
    let panel = depth * width * size;
    let tables = (2 * rows + depth + 2 * plan.positions) * size_of::<usize>();
    let product = match plan.out_feature_stride == 1 || plan.out_features() == 1 {
        true => 0,
        false => rows * plan.out_features() * size,
    };
    copy + panel + tables + product
}

/// One convolution's geometry: sizes, and each role's dim and stride in its operand's
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
    /// The input's batch and feature dims, and whether the features are its innermost
    /// dim.
    batch_dim: usize,
    feature_dim: usize,
    feature_innermost: bool,
    /// The kernel's input and output feature strides.
    kernel_in_stride: usize,
    kernel_out_stride: usize,
    /// The output's batch and feature strides.
    out_batch_stride: usize,
    out_feature_stride: usize,
    spatial: Vec<Spatial>,
    /// The kernel offset of each tap, row-major over the kernel's spatial dims.
    tap_offsets: Vec<usize>,
}

/// One spatial dim of a [`Plan`].
struct Spatial {
    /// The input's dim.
    dim: usize,
    /// Output positions and kernel taps along it.
    out: usize,
    kernel: usize,
    /// The output's stride.
    out_stride: usize,
    window: WindowDim,
}

impl Spatial {
    /// The input elements the windows cover along this dim, the input spread by its
    /// base dilation and padded: `(out - 1) * stride + (kernel - 1) * window dilation +
    /// 1` (0 without output positions).
    fn span(&self) -> usize {
        let w = &self.window;
        match self.out {
            0 => 0,
            out => (out - 1) * w.stride + (self.kernel.max(1) - 1) * w.window_dilation + 1,
        }
    }
}

impl Plan {
    fn new(config: &ConvConfig, input: &[usize], kernel: &[usize], shape: &[usize]) -> Plan {
        let dn = &config.dims;
        let (kst, ost) = (row_major(kernel), row_major(shape));
        let spatial: Vec<Spatial> = (config.window.iter().enumerate())
            .map(|(d, w)| Spatial {
                dim: dn.input_spatial[d],
                out: shape[dn.output_spatial[d]],
                kernel: kernel[dn.kernel_spatial[d]],
                out_stride: ost[dn.output_spatial[d]],
                window: *w,
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
            batch_dim: dn.input_batch,
            feature_dim: dn.input_feature,
            feature_innermost: row_major(input)[dn.input_feature] == 1,
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
    /// contiguous in the input (so in the padded input too) and the output.
    fn depthwise(&self) -> bool {
        self.group_features == 1
            && self.group_out == 1
            && self.batch_groups == 1
            && self.feature_innermost
            && self.out_feature_stride == 1
    }

    /// The dims of the padded input (see [`PadDim`]) of an input of `shape`.
    fn pad_dims(&self, shape: &[usize]) -> Vec<PadDim> {
        let mut dims: Vec<PadDim> = (shape.iter())
            .map(|&n| PadDim {
                len: n,
                n,
                low: 0,
                dilation: 1,
            })
            .collect();
        for s in &self.spatial {
            dims[s.dim] = PadDim {
                len: s.span(),
                n: shape[s.dim],
                low: s.window.padding_low,
                dilation: s.window.base_dilation,
            };
        }
        dims
    }

    /// The offset of each tap's input element from its window's first in `padded`,
    /// row-major over the taps.
    fn tap_inputs(&self, padded: &Padded<'_, impl Copy>) -> Vec<usize> {
        let spans: Dims = self.spatial.iter().map(|s| s.kernel).collect();
        let mut offsets = Vec::with_capacity(self.taps);
        for_each_index(&spans, |_, t| {
            let offset = (self.spatial.iter().zip(t))
                .map(|(s, &i)| i * s.window.window_dilation * padded.strides[s.dim]);
            offsets.push(offset.sum());
        });
        offsets
    }

    /// Calls `f(input, out)` for every output position (row-major) with the offset of
    /// its window's first element in `padded` (batch 0, feature 0) and its offset in
    /// the output: the offsets computed once per run along the last spatial dim.
    fn for_each_position(&self, padded: &Padded<'_, impl Copy>, mut f: impl FnMut(usize, usize)) {
        let Some((last, outer)) = self.spatial.split_last() else {
            return f(padded.origin, 0);
        };
        let step = last.window.stride * padded.strides[last.dim];
        let outs: Dims = outer.iter().map(|s| s.out).collect();
        for_each_index(&outs, |_, at| {
            let (mut input, mut out) = (padded.origin, 0);
            for (s, &o) in outer.iter().zip(at) {
                input += o * s.window.stride * padded.strides[s.dim];
                out += o * s.out_stride;
            }
            for o in 0..last.out {
                f(input + o * step, out + o * last.out_stride);
            }
        });
    }

    /// The direct path ([`Plan::depthwise`]): every output position accumulates, tap
    /// by tap in order, the window's input run over the channels times the tap's
    /// kernel run, into `out` (zeroed by the caller).
    fn depthwise_direct<T: DotScalar>(&self, padded: &Padded<'_, T>, ks: &[T], out: &mut [T]) {
        let channels = self.out_features();
        // The kernel as [taps, channels], contiguous runs per tap.
        let mut kt = Vec::with_capacity(self.taps * channels);
        for &t in &self.tap_offsets {
            kt.extend((0..channels).map(|c| ks[t + c * self.kernel_out_stride]));
        }
        let (taps, xs) = (self.tap_inputs(padded), &padded.data[..]);
        let batch_stride = padded.strides[self.batch_dim];
        self.for_each_position(padded, |input, at| {
            for b in 0..self.batch {
                let base = input + b * batch_stride;
                let run = &mut out[b * self.out_batch_stride + at..][..channels];
                for (k, &tap) in kt.chunks_exact(channels).zip(&taps) {
                    let xs = &xs[base + tap..][..channels];
                    for ((y, &x), &k) in run.iter_mut().zip(xs).zip(k) {
                        *y = T::mul_add(*y, x, k);
                    }
                }
            }
        });
    }

    /// The implicit product ([`Gemm`]) into `out`: in place when the output's features
    /// are contiguous, else into a `[batch * positions, out features]` buffer then placed.
    fn implicit_product<T: ConvScalar>(&self, padded: &Padded<'_, T>, ks: &[T], out: &mut [T]) {
        let width = self.out_features();
        let direct = self.out_feature_stride == 1 || width == 1;
        let mut positions = Vec::with_capacity(self.positions);
        self.for_each_position(padded, |input, at| positions.push((input, at)));
        let mut rows = Vec::with_capacity(self.batch * self.positions);
        let mut outs = Vec::with_capacity(rows.capacity());
        let batch_stride = padded.strides[self.batch_dim];
        for b in 0..self.batch {
            let (input, at) = (b * batch_stride, b * self.out_batch_stride);
            rows.extend(positions.iter().map(|&(i, _)| input + i));
            match direct {
                true => outs.extend(positions.iter().map(|&(_, o)| at + o)),
                false => outs.extend((0..self.positions).map(|p| (b * self.positions + p) * width)),
            }
        }
        let feature_stride = padded.strides[self.feature_dim];
        let tap_inputs = self.tap_inputs(padded);
        let mut reduction = Vec::with_capacity(self.taps * self.group_features);
        for &tap in &tap_inputs {
            reduction.extend((0..self.group_features).map(|f| tap + f * feature_stride));
        }
        let groups = (0..self.groups())
            .map(|g| {
                let (feature_group, batch_group) = (g % self.feature_groups, g % self.batch_groups);
                batch_group * self.batch * batch_stride
                    + feature_group * self.group_features * feature_stride
            })
            .collect();
        let gemm = Gemm {
            input: &padded.data,
            adjacent_features: feature_stride == 1,
            rows,
            outs,
            span: reduction.iter().max().map_or(0, |&m| m + 1),
            reduction,
            groups,
            kernel: ks,
            tap_offsets: &self.tap_offsets,
            group_features: self.group_features,
            group_out: self.group_out,
            kernel_in_stride: self.kernel_in_stride,
            kernel_out_stride: self.kernel_out_stride,
        };
        if direct {
            T::multiply(&gemm, out);
        } else {
            let mut product = buffers::take::<T>(self.batch * self.positions * width);
            T::multiply(&gemm, &mut product);
            self.place(padded, &product, width, out);
            buffers::give_buffer(product);
        }
    }

    /// Writes `product` (`[batch * positions, width]`, row-major) into the output in
    /// its layout.
    fn place<T: Copy>(&self, padded: &Padded<'_, T>, product: &[T], width: usize, out: &mut [T]) {
        let mut row = 0;
        for b in 0..self.batch {
            self.for_each_position(padded, |_, at| {
                let dst = b * self.out_batch_stride + at;
                for (o, &v) in product[row * width..][..width].iter().enumerate() {
                    out[dst + o * self.out_feature_stride] = v;
                }
                row += 1;
            });
        }
    }
}

/// The input as the windows read it (see the module docs): the input itself, or a
/// pooled copy spread and padded with zeros; element `i` of the input's dims at
/// `origin + sum(i[d] * strides[d])`, index 0 of a spatial dim the first element a
/// window sees.
struct Padded<'a, T: Clone> {
    data: Cow<'a, [T]>,
    origin: usize,
    strides: Dims,
}

/// One dim of the input as the padded copy holds it: `len` elements, element `q` being
/// input element `(q - low) / dilation` where that is a whole index below `n`, else a
/// zero (padding, or a hole of the lhs dilation). Batch and feature dims are copied
/// whole (`low` 0, `dilation` 1, `len == n`).
struct PadDim {
    len: usize,
    n: usize,
    low: i64,
    dilation: usize,
}

/// Whether some window reaches padding or a hole of the lhs dilation: the input is
/// then copied, else read in place.
fn needs_copy(dims: &[PadDim]) -> bool {
    !(dims.iter()).all(|d| d.dilation == 1 && d.low <= 0 && d.len as i64 - d.low <= d.n as i64)
}

impl PadDim {
    /// The input index element `q` holds, or `None` for a zero.
    fn source(&self, q: usize) -> Option<usize> {
        let u = q as i64 - self.low;
        let d = self.dilation as i64;
        (u >= 0 && u % d == 0 && u / d < self.n as i64).then_some((u / d) as usize)
    }
}

impl<'a, T: Copy + Default + buffers::Pooled> Padded<'a, T> {
    /// The input read in place when every window lies in it (no lhs dilation, no
    /// padding reached), else copied.
    fn new(plan: &Plan, xs: &'a [T], shape: &[usize]) -> Self {
        let xst = row_major(shape);
        let dims = plan.pad_dims(shape);
        if !needs_copy(&dims) {
            let origin = (dims.iter().zip(&xst)).map(|(d, &s)| (-d.low) as usize * s);
            return Padded {
                data: Cow::Borrowed(xs),
                origin: origin.sum(),
                strides: xst,
            };
        }
        let lens: Dims = dims.iter().map(|d| d.len).collect();
        let strides = row_major(&lens);
        // Pooled: `fill` writes every element.
        let mut data = buffers::take::<T>(lens.iter().product());
        // The dims after the last one that pads or crops are copied as whole runs.
        let last = (dims.iter())
            .rposition(|d| d.len != d.n || d.low != 0 || d.dilation != 1)
            .expect("a dim that pads or crops (else the input is read in place)");
        if !data.is_empty() {
            fill(xs, &xst, &mut data, &strides, &dims[..=last], 0, 0);
        }
        Padded {
            data: Cow::Owned(data),
            origin: 0,
            strides,
        }
    }

    /// Gives a copy's buffer back to the device's pool.
    fn give_back(self) {
        if let Cow::Owned(data) = self.data {
            buffers::give_buffer(data);
        }
    }
}

/// Writes `block`, the padded copy's block of `dims[level..]` (the last of `dims` the
/// innermost dim that pads or crops; the dims after it are whole runs), from the
/// input's block at `from`.
fn fill<T: Copy + Default>(
    xs: &[T],
    xst: &[usize],
    block: &mut [T],
    strides: &[usize],
    dims: &[PadDim],
    level: usize,
    from: usize,
) {
    let (d, xs_step, step) = (&dims[level], xst[level], strides[level]);
    let block = &mut block[..d.len * step];
    if level + 1 < dims.len() {
        for (q, block) in block.chunks_exact_mut(step).enumerate() {
            match d.source(q) {
                Some(i) => fill(xs, xst, block, strides, dims, level + 1, from + i * xs_step),
                None => block.fill(T::default()),
            }
        }
        return;
    }
    // The innermost padded dim: each element a run of `step` elements (the input's
    // stride there too, the later dims being whole).
    if d.dilation == 1 {
        let low = d.low.clamp(0, d.len as i64) as usize;
        let high = (d.low + d.n as i64).clamp(low as i64, d.len as i64) as usize;
        let start = from + (low as i64 - d.low) as usize * xs_step;
        block[..low * step].fill(T::default());
        block[low * step..high * step].copy_from_slice(&xs[start..][..(high - low) * step]);
        block[high * step..].fill(T::default());
    } else {
        for (q, run) in block.chunks_exact_mut(step).enumerate() {
            match d.source(q) {
                Some(i) => run.copy_from_slice(&xs[from + i * xs_step..][..step]),
                None => run.fill(T::default()),
            }
        }
    }
}

/// A convolution as a matrix product over the padded input (see the module docs):
/// per group `g`, output row `m` and group output feature `o`, the sum over reduction
/// index `k = t * group features + f` of `input[groups[g] + rows[m] + reduction[k]]`
/// times the kernel's element `(t, f, g * group out + o)`, written to `out[outs[m] + g *
/// group out + o]`.
pub(super) struct Gemm<'a, T> {
    input: &'a [T],
    /// Whether a tap's group features are adjacent in `input` (feature stride 1): its
    /// reduction indices read one contiguous run.
    adjacent_features: bool,
    rows: Vec<usize>,
    outs: Vec<usize>,
    reduction: Vec<usize>,
    /// One more than the largest `reduction` offset: a row reads `span` elements from
    /// its start.
    span: usize,
    /// Per group, the offset of its first batch element and feature.
    groups: Vec<usize>,
    kernel: &'a [T],
    tap_offsets: &'a [usize],
    group_features: usize,
    group_out: usize,
    kernel_in_stride: usize,
    kernel_out_stride: usize,
}

impl<T: DotScalar> Gemm<'_, T> {
    /// Packs the kernel's output features `column .. column + columns` (of all groups')
    /// into `panel`: a row of `width` per reduction index, zeros past `columns`.
    fn pack(&self, panel: &mut Vec<T>, column: usize, columns: usize, width: usize) {
        panel.clear();
        panel.resize(self.reduction.len() * width, T::default());
        let mut rows = panel.chunks_exact_mut(width);
        for &tap in self.tap_offsets {
            for f in 0..self.group_features {
                let from = tap + f * self.kernel_in_stride + column * self.kernel_out_stride;
                let row = &mut rows.next().expect("a row per reduction index")[..columns];
                if self.kernel_out_stride == 1 {
                    row.copy_from_slice(&self.kernel[from..][..columns]);
                } else {
                    for (o, to) in row.iter_mut().enumerate() {
                        *to = self.kernel[from + o * self.kernel_out_stride];
                    }
                }
            }
        }
    }

    /// Packs the kernel's output features `column .. column + columns` into `panel` for
    /// [`dots`]: per feature, its weights in reduction order.
    fn pack_dots(&self, panel: &mut Vec<T>, column: usize, columns: usize) {
        panel.clear();
        for o in column..column + columns {
            for &tap in self.tap_offsets {
                let from = tap + o * self.kernel_out_stride;
                let weights =
                    (0..self.group_features).map(|f| self.kernel[from + f * self.kernel_in_stride]);
                panel.extend(weights);
            }
        }
    }

    /// The product as a plain loop: each sum in order, `T::mul_add` at each step.
    fn scalar(&self, out: &mut [T]) {
        let (go, mut panel) = (self.group_out, Vec::new());
        for (g, &group) in self.groups.iter().enumerate().filter(|_| go > 0) {
            self.pack(&mut panel, g * go, go, go);
            for (&row, &at) in self.rows.iter().zip(&self.outs) {
                let input = &self.input[group + row..];
                for (o, out) in out[at + g * go..][..go].iter_mut().enumerate() {
                    let terms = self.reduction.iter().zip(panel[o..].iter().step_by(go));
                    *out = terms.fold(T::default(), |acc, (&k, &w)| T::mul_add(acc, input[k], w));
                }
            }
        }
    }
}

thread_local! {
    /// The f32 product's packed panels, kept between calls.
    static PANELS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Output rows per chunk: the input the chunk's windows read stays in the L2 cache
/// across the chunk's panels and reduction blocks.
const ROW_CHUNK: usize = 240;

/// The bytes of a panel's reduction block: it stays in the L1 cache across a chunk's
/// rows.
const PANEL_BLOCK_BYTES: usize = 16 * 1024;

/// The f32 [`Gemm`] run by `pulp` with the CPU's vector features enabled.
struct Vectorised<'g, 'a, 'o> {
    gemm: &'g Gemm<'a, f32>,
    out: &'o mut [f32],
    /// The buffer of the packed panels.
    panel: &'o mut Vec<f32>,
}

impl pulp::WithSimd for Vectorised<'_, '_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let gemm = self.gemm;
        let lanes = S::F32_LANES;
        if gemm.adjacent_features && 2 * gemm.group_out <= lanes && 2 * gemm.group_features >= lanes
        {
            dots::<S>(simd, self.gemm, self.out, self.panel);
        } else if self.gemm.group_out <= lanes {
            product::<S, 8, 1>(simd, self.gemm, self.out, self.panel);
        } else {
            product::<S, 6, 2>(simd, self.gemm, self.out, self.panel);
        }
    }
}

/// The product in tiles of `R` rows by `V` registers of output features (`R * V`
/// accumulators), the panels packed in `panel`. No closure here runs vector code: a
/// closure is not compiled with the dispatch's CPU features.
#[inline(always)]
fn product<S: Simd, const R: usize, const V: usize>(
    simd: S,
    gemm: &Gemm<'_, f32>,
    out: &mut [f32],
    panel: &mut Vec<f32>,
) {
    let width = V * S::F32_LANES;
    let depth = gemm.reduction.len();
    let block = (PANEL_BLOCK_BYTES / (width * size_of::<f32>())).max(1);
    for (g, &group) in gemm.groups.iter().enumerate() {
        for first in (0..gemm.group_out).step_by(width) {
            let columns = width.min(gemm.group_out - first);
            let column = g * gemm.group_out + first;
            gemm.pack(panel, column, columns, width);
            let panel: &[S::f32s] = bytemuck::cast_slice(&panel[..]);
            for (rows, outs) in gemm.rows.chunks(ROW_CHUNK).zip(gemm.outs.chunks(ROW_CHUNK)) {
                for start in (0..depth).step_by(block) {
                    let end = depth.min(start + block);
                    let tile = Tile {
                        input: &gemm.input[group..],
                        span: gemm.span,
                        reduction: &gemm.reduction[start..end],
                        panel: &panel[start * V..end * V],
                        first: start == 0,
                        column,
                        columns,
                    };
                    let mut blocks = rows.chunks_exact(R).zip(outs.chunks_exact(R));
                    for (rows, outs) in blocks.by_ref() {
                        tile.run::<S, R, V>(simd, rows, outs, out);
                    }
                    let done = rows.len() / R * R;
                    for (rows, outs) in rows[done..].chunks(1).zip(outs[done..].chunks(1)) {
                        tile.run::<S, 1, V>(simd, rows, outs, out);
                    }
                }
            }
        }
    }
}

/// Rows per block of [`dots`]: each weight register loaded serves this many rows.
const DOT_ROWS: usize = 4;

/// The product for few output features and many adjacent group features (under half a
/// register of the one, at least half of the other): each output element is a dot
/// product over its window, the features of each tap in vector registers (the last
/// one partial), so the lanes hold features rather than mostly idle output columns.
/// Lane `l` sums, tap by tap in order, the features `l, l + lanes, ..` of each tap;
/// the lanes are added at the end. That order depends only on the group features and
/// the taps, not on which rows a call computes.
#[inline(always)]
fn dots<S: Simd>(simd: S, gemm: &Gemm<'_, f32>, out: &mut [f32], panel: &mut Vec<f32>) {
    let (lanes, features, go) = (S::F32_LANES, gemm.group_features, gemm.group_out);
    let full = features / lanes * lanes;
    let taps: Vec<usize> = gemm.reduction.iter().step_by(features).copied().collect();
    for (g, &group) in gemm.groups.iter().enumerate() {
        gemm.pack_dots(panel, g * go, go);
        let dots = Dots {
            input: &gemm.input[group..],
            span: gemm.span,
            taps: &taps,
            panel,
            full,
            features,
            column: g * go,
        };
        let mut blocks = (gemm.rows.chunks_exact(DOT_ROWS)).zip(gemm.outs.chunks_exact(DOT_ROWS));
        for (rows, outs) in blocks.by_ref() {
            dots.run::<S, DOT_ROWS>(simd, rows, outs, out);
        }
        let done = gemm.rows.len() / DOT_ROWS * DOT_ROWS;
        for (rows, outs) in gemm.rows[done..].chunks(1).zip(gemm.outs[done..].chunks(1)) {
            dots.run::<S, 1>(simd, rows, outs, out);
        }
    }
}

/// One group of [`dots`]: what its row blocks share.
struct Dots<'a> {
    /// The padded input from the group's first batch element and feature.
    input: &'a [f32],
    span: usize,
    /// Each tap's input offset from a window's first element.
    taps: &'a [usize],
    /// Each output feature's weights, `taps * features` in reduction order.
    panel: &'a [f32],
    /// The features of a tap that fill whole registers, and all of them.
    full: usize,
    features: usize,
    /// The group's first output feature.
    column: usize,
}

impl Dots<'_> {
    /// `R` rows (input offsets `rows`, output offsets `outs`) by every output feature
    /// of the group.
    #[inline(always)]
    fn run<S: Simd, const R: usize>(
        &self,
        simd: S,
        rows: &[usize],
        outs: &[usize],
        out: &mut [f32],
    ) {
        let (lanes, full) = (S::F32_LANES, self.full);
        let inputs: [&[f32]; R] = std::array::from_fn(|r| &self.input[rows[r]..][..self.span]);
        let per_feature = self.taps.len() * self.features;
        for (o, weights) in self.panel.chunks_exact(per_feature).enumerate() {
            let mut acc = [simd.splat_f32s(0.0); R];
            for (&tap, weights) in self.taps.iter().zip(weights.chunks_exact(self.features)) {
                let whole: &[S::f32s] = bytemuck::cast_slice(&weights[..full]);
                for (v, &w) in whole.iter().enumerate() {
                    for (acc, input) in acc.iter_mut().zip(&inputs) {
                        let x: S::f32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(
                            &input[tap + v * lanes..][..lanes],
                        ));
                        *acc = simd.mul_add_e_f32s(x, w, *acc);
                    }
                }
                let rest = &weights[full..];
                if !rest.is_empty() {
                    let w = simd.partial_load_f32s(rest);
                    for (acc, input) in acc.iter_mut().zip(&inputs) {
                        let x = simd.partial_load_f32s(&input[tap + full..][..rest.len()]);
                        *acc = simd.mul_add_e_f32s(x, w, *acc);
                    }
                }
            }
            for (acc, &at) in acc.iter().zip(outs) {
                out[at + self.column + o] = simd.reduce_sum_f32s(*acc);
            }
        }
    }
}

/// One block of the reduction of one panel: what its tiles share.
struct Tile<'a, F> {
    /// The padded input from the group's first batch element and feature.
    input: &'a [f32],
    span: usize,
    /// The block's reduction offsets and panel rows (`V` registers each).
    reduction: &'a [usize],
    panel: &'a [F],
    /// Whether the block is the first: its sums start at zero, a later block's from
    /// what the last one wrote.
    first: bool,
    /// The first output feature of the panel, and how many it holds.
    column: usize,
    columns: usize,
}

impl<F: Copy> Tile<'_, F> {
    /// `R` rows (input offsets `rows`, output offsets `outs`) by the panel's features.
    #[inline(always)]
    fn run<S: Simd<f32s = F>, const R: usize, const V: usize>(
        &self,
        simd: S,
        rows: &[usize],
        outs: &[usize],
        out: &mut [f32],
    ) {
        let lanes = S::F32_LANES;
        let registers = self.columns.div_ceil(lanes);
        let inputs: [&[f32]; R] = std::array::from_fn(|r| &self.input[rows[r]..][..self.span]);
        let mut acc = [[simd.splat_f32s(0.0); V]; R];
        if !self.first {
            for (acc, &at) in acc.iter_mut().zip(outs) {
                let sums = &out[at + self.column..][..self.columns];
                for (v, acc) in acc.iter_mut().enumerate().take(registers) {
                    let end = sums.len().min((v + 1) * lanes);
                    *acc = simd.partial_load_f32s(&sums[v * lanes..end]);
                }
            }
        }
        for (&k, weights) in self.reduction.iter().zip(self.panel.chunks_exact(V)) {
            for (acc, input) in acc.iter_mut().zip(&inputs) {
                let x = simd.splat_f32s(input[k]);
                for (acc, &w) in acc.iter_mut().zip(weights) {
                    *acc = simd.mul_add_e_f32s(x, w, *acc);
                }
            }
        }
        for (acc, &at) in acc.iter().zip(outs) {
            let sums = &mut out[at + self.column..][..self.columns];
            for (v, &acc) in acc.iter().enumerate().take(registers) {
                let end = sums.len().min((v + 1) * lanes);
                simd.partial_store_f32s(&mut sums[v * lanes..end], acc);
            }
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
