//! The primitive op set. High-level ops (matmul, einsum, softmax, ...) are built from
//! these by the [`crate::ir::Builder`]; passes only ever see primitives.

use std::sync::Arc;

use super::flow::Flow;
use super::indexing::{GatherDims, ScatterDims, ScatterKind};
use super::literal::Literal;
use super::random::RandomOutput;
use crate::error::Error;
use crate::types::{DType, Location};

/// Elementwise ops of one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `e^x`.
    Exp,
    /// Natural log.
    Log,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Logistic,
    /// Logical not (bool only).
    Not,
    /// Sine (f32).
    Sin,
    /// Cosine (f32).
    Cos,
    /// The error function `2/sqrt(pi) * integral_0^x e^(-t^2) dt` (f32).
    Erf,
    /// Largest integer not above `x` (f32).
    Floor,
    /// Smallest integer not below `x` (f32).
    Ceil,
    /// Nearest integer, ties to even (`jnp.round`, `torch.round`, XLA's
    /// `round_nearest_even`; f32): `round(0.5) = 0`, `round(1.5) = 2`, `round(-2.5) = -2`.
    Round,
    /// `-1`, `0` or `1` by the sign of `x` (f32 and i32); `sign(±0) = ±0`, `sign(NaN) = NaN`.
    Sign,
    /// True where `x` is neither infinite nor NaN (f32 operand, bool result).
    IsFinite,
}

/// Elementwise ops of two operands of the same shape and dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (integer division truncates).
    Div,
    /// Elementwise maximum.
    Max,
    /// Elementwise minimum.
    Min,
    /// `a ^ b`.
    Pow,
    /// Logical and (bool only).
    And,
    /// Logical or (bool only).
    Or,
    /// Truncated remainder `a - b * trunc(a / b)`, with the sign of the dividend `a`
    /// (C's `fmod` for f32, XLA's `remainder`); for i32 `a % 0 = a` and `MIN % -1 = 0`,
    /// as XLA.
    Rem,
}

/// Elementwise comparisons; the result is bool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CompareOp {
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
}

/// The combining function of a reduction (and of an all-reduce).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceKind {
    /// Sum; identity 0.
    Sum,
    /// Maximum; identity -inf (i32::MIN for integers).
    Max,
    /// Minimum; identity +inf (i32::MAX for integers).
    Min,
}

/// The combining function of a scan ([`Op::Cumulative`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CumulativeKind {
    /// Running sum; identity 0.
    Sum,
    /// Running product; identity 1.
    Prod,
}

impl CumulativeKind {
    /// The identity of the combining function (as f64; converted to the element type).
    pub fn identity(self) -> f64 {
        match self {
            CumulativeKind::Sum => 0.0,
            CumulativeKind::Prod => 1.0,
        }
    }
}

/// Which way shardings may cross a [`Op::PropagationBarrier`] (Shardy's
/// `PropagationDirection`, the barrier's `allowed_direction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PropagationDirection {
    /// Nothing crosses: the operand and the result are propagated independently.
    None,
    /// From the operand to the result only: the result may take the operand's axes,
    /// the operand never the result's.
    Forward,
    /// From the result to the operand only.
    Backward,
    /// Both ways, as for any identity; rejected on a barrier (it would block nothing).
    Both,
}

impl PropagationDirection {
    /// The direction for the barrier on the cotangent: the backward pass runs the
    /// barrier from the result's cotangent (its operand) to the operand's cotangent (its
    /// result), so "from the forward operand's side to the forward result's side" is
    /// now from result to operand: `Forward` and `Backward` swap.
    pub fn mirrored(self) -> Self {
        match self {
            PropagationDirection::Forward => PropagationDirection::Backward,
            PropagationDirection::Backward => PropagationDirection::Forward,
            PropagationDirection::None | PropagationDirection::Both => self,
        }
    }

    /// Shardy's spelling: `NONE`, `FORWARD`, `BACKWARD`, `BOTH`.
    pub fn name(self) -> &'static str {
        match self {
            PropagationDirection::None => "NONE",
            PropagationDirection::Forward => "FORWARD",
            PropagationDirection::Backward => "BACKWARD",
            PropagationDirection::Both => "BOTH",
        }
    }
}

/// Dimension numbers of a `dot_general` (XLA's `DotDimensionNumbers`).
///
/// The result's dims are: batch dims (in `lhs_batch` order), then lhs dims that are
/// neither batch nor contracting (in order), then such rhs dims (in order).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DotDims {
    /// Batch dims of the lhs, paired with `rhs_batch`.
    pub lhs_batch: Vec<usize>,
    /// Batch dims of the rhs.
    pub rhs_batch: Vec<usize>,
    /// Contracting dims of the lhs, paired with `rhs_contracting`.
    pub lhs_contracting: Vec<usize>,
    /// Contracting dims of the rhs.
    pub rhs_contracting: Vec<usize>,
}

impl DotDims {
    /// The dims of a product: the lhs's and the rhs's batch dims, pairwise, then their
    /// contracting dims, pairwise.
    pub fn new(
        lhs_batch: &[usize],
        rhs_batch: &[usize],
        lhs_contracting: &[usize],
        rhs_contracting: &[usize],
    ) -> DotDims {
        DotDims {
            lhs_batch: lhs_batch.to_vec(),
            rhs_batch: rhs_batch.to_vec(),
            lhs_contracting: lhs_contracting.to_vec(),
            rhs_contracting: rhs_contracting.to_vec(),
        }
    }

    /// The free dims of a rank-`rank` lhs (neither batch nor contracting), in order:
    /// the result's dims after the batch dims.
    pub fn lhs_free(&self, rank: usize) -> impl Iterator<Item = usize> + '_ {
        free_dims(rank, &self.lhs_batch, &self.lhs_contracting)
    }

    /// The free dims of a rank-`rank` rhs, in order: the result's last dims.
    pub fn rhs_free(&self, rank: usize) -> impl Iterator<Item = usize> + '_ {
        free_dims(rank, &self.rhs_batch, &self.rhs_contracting)
    }
}

/// The dims of `0..rank` in neither `batch` nor `contracting`, in order.
fn free_dims<'a>(
    rank: usize,
    batch: &'a [usize],
    contracting: &'a [usize],
) -> impl Iterator<Item = usize> + 'a {
    (0..rank).filter(move |d| !batch.contains(d) && !contracting.contains(d))
}

/// One dim of a window (XLA's `WindowDimension`, without reversal), shared by
/// `reduce_window` (one per operand dim) and `convolution` (one per spatial dim, `size`
/// being the kernel's dim there). The operand dim of `n` elements is dilated by
/// `base_dilation` (`base_dilation - 1` holes between neighbours, XLA's `lhs_dilate`)
/// and padded by `padding_low` and `padding_high` elements (negative: cropped); a window
/// of `size` elements `window_dilation` apart (XLA's `rhs_dilate`) starts every
/// `stride` elements of that.
///
/// Result size along the dim: `(padded - span) / stride + 1`, where `padded =
/// padding_low + (n - 1) * base_dilation + 1 + padding_high` and `span = (size - 1) *
/// window_dilation + 1` must not exceed it. Result element `j` combines padded-operand
/// elements `j * stride + k * window_dilation` for `k` in `0..size`.
///
/// `reduce_window` takes no negative padding (its shape rule says so); its padding and
/// base dilation's holes hold the reduction's identity, a convolution's zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowDim {
    /// Number of elements the window covers (>= 1).
    pub size: usize,
    /// Step between successive windows (>= 1).
    pub stride: usize,
    /// Padding before the first (dilated) operand element; negative crops.
    pub padding_low: i64,
    /// Padding after the last (dilated) operand element; negative crops.
    pub padding_high: i64,
    /// Distance between the window's elements (>= 1; XLA's `rhs_dilate`).
    pub window_dilation: usize,
    /// Distance between the operand's elements (>= 1; XLA's `lhs_dilate`).
    pub base_dilation: usize,
}

impl WindowDim {
    /// A window of `size` every `stride` elements, padded by `padding`, not dilated.
    pub fn new(size: usize, stride: usize, padding: (i64, i64)) -> Self {
        WindowDim {
            size,
            stride,
            padding_low: padding.0,
            padding_high: padding.1,
            window_dilation: 1,
            base_dilation: 1,
        }
    }

    /// The same window with its elements `window_dilation` apart.
    pub fn with_window_dilation(self, window_dilation: usize) -> Self {
        WindowDim {
            window_dilation,
            ..self
        }
    }

    /// The same window over the operand with its elements `base_dilation` apart.
    pub fn with_base_dilation(self, base_dilation: usize) -> Self {
        WindowDim {
            base_dilation,
            ..self
        }
    }

    /// True when the window leaves the dim alone: size 1, stride 1, no padding or
    /// dilation (result element `j` is operand element `j`).
    pub fn is_trivial(&self) -> bool {
        *self == WindowDim::new(1, 1, (0, 0))
    }
}

/// How a windowed op (pooling, convolution) pads its operand, per windowed dim
/// (TensorFlow's, JAX's and Flax's names).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Padding {
    /// No padding: only windows that fit wholly in the operand.
    Valid,
    /// `ceil(n / stride)` results per dim (`n` the base-dilated size): padded by
    /// `(ceil(n / stride) - 1) * stride + span - n` (at least 0, `span` the dilated
    /// window), half of it before (rounded down), the rest after.
    Same,
    /// `(low, high)` per windowed dim; negative crops (convolution only).
    Explicit(Vec<(i64, i64)>),
}

impl Padding {
    /// The `(low, high)` padding of `dims` windowed dims, `extent(i)` giving dim `i`'s
    /// base-dilated size, its window's dilated span and its stride; a message when an
    /// explicit list has another length. A zero stride gets no padding (the shape rule
    /// reports the stride).
    pub(crate) fn resolve(
        &self,
        dims: usize,
        extent: impl Fn(usize) -> (usize, usize, usize),
    ) -> Result<Vec<(i64, i64)>, String> {
        match self {
            Padding::Explicit(p) if p.len() == dims => Ok(p.clone()),
            Padding::Explicit(p) => Err(format!(
                "padding has {} entries for {dims} windowed dims",
                p.len()
            )),
            Padding::Valid => Ok(vec![(0, 0); dims]),
            Padding::Same => Ok((0..dims)
                .map(|i| match extent(i) {
                    (n, span, stride) if stride > 0 => {
                        let out = n.div_ceil(stride);
                        let total = (out.saturating_sub(1).saturating_mul(stride))
                            .saturating_add(span)
                            .saturating_sub(n);
                        let total = i64::try_from(total).unwrap_or(i64::MAX);
                        (total / 2, total - total / 2)
                    }
                    _ => (0, 0),
                })
                .collect()),
        }
    }
}

/// Dimension numbers of a `convolution` (XLA's `ConvolutionDimensionNumbers`): which
/// dim of the input, the kernel and the output is batch, feature and each spatial dim.
/// Dims may come in any order; spatial dim `i` of the three tensors belong together.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvDimensionNumbers {
    /// The input's batch dim.
    pub input_batch: usize,
    /// The input's feature dim.
    pub input_feature: usize,
    /// The input's spatial dims.
    pub input_spatial: Vec<usize>,
    /// The kernel's input-feature dim (contracted with the input's features).
    pub kernel_input_feature: usize,
    /// The kernel's output-feature dim.
    pub kernel_output_feature: usize,
    /// The kernel's spatial (window) dims.
    pub kernel_spatial: Vec<usize>,
    /// The output's batch dim.
    pub output_batch: usize,
    /// The output's feature dim.
    pub output_feature: usize,
    /// The output's spatial dims.
    pub output_spatial: Vec<usize>,
}

impl ConvDimensionNumbers {
    /// Dimension numbers from JAX's string form: `input` and `output` name each dim by
    /// a letter, `N` batch and `C` feature; `kernel` with `O` output and `I` input
    /// feature; every other letter is a spatial dim, and spatial dims are numbered in
    /// the kernel's order (`("NHWC", "HWIO", "NHWC")` is TensorFlow's 2-D layout).
    /// An [`Error::Shape`] at the caller's line names a letter missing, repeated, or
    /// not in all three.
    #[track_caller]
    pub fn from_labels(input: &str, kernel: &str, output: &str) -> Result<Self, Error> {
        let location = Location::caller();
        Self::parse_labels(input, kernel, output).map_err(|message| Error::Shape {
            op: "convolution",
            location,
            message,
        })
    }

    fn parse_labels(input: &str, kernel: &str, output: &str) -> Result<Self, String> {
        let spatial: Vec<char> = kernel.chars().filter(|c| !matches!(c, 'O' | 'I')).collect();
        let find = |labels: &str, what: &str, c: char| -> Result<usize, String> {
            let mut at = labels.char_indices().filter(|&(_, l)| l == c);
            match (at.next(), at.next()) {
                (Some((i, _)), None) => Ok(i),
                (None, _) => Err(format!("{what} labels {labels:?} have no {c:?}")),
                (Some(_), Some(_)) => Err(format!("{what} labels {labels:?} repeat {c:?}")),
            }
        };
        let spatial_of = |labels: &str, what: &str| -> Result<Vec<usize>, String> {
            if labels.chars().count() != spatial.len() + 2 {
                return Err(format!(
                    "{what} labels {labels:?} must have the kernel's {} spatial dims and two more",
                    spatial.len()
                ));
            }
            spatial.iter().map(|&c| find(labels, what, c)).collect()
        };
        Ok(ConvDimensionNumbers {
            input_batch: find(input, "input", 'N')?,
            input_feature: find(input, "input", 'C')?,
            input_spatial: spatial_of(input, "input")?,
            kernel_input_feature: find(kernel, "kernel", 'I')?,
            kernel_output_feature: find(kernel, "kernel", 'O')?,
            kernel_spatial: spatial_of(kernel, "kernel")?,
            output_batch: find(output, "output", 'N')?,
            output_feature: find(output, "output", 'C')?,
            output_spatial: spatial_of(output, "output")?,
        })
    }
}

/// The attributes of a `convolution` (XLA's `conv_general_dilated`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvConfig {
    /// Which dims are batch, feature and spatial.
    pub dims: ConvDimensionNumbers,
    /// One entry per spatial dim.
    pub window: Vec<WindowDim>,
    /// Input features are cut in this many groups, each convolved with its own slice of
    /// the kernel's output features (grouped; depthwise when it equals the features).
    pub feature_group_count: usize,
    /// The input batch is cut in this many groups (major), each convolved with its own
    /// slice of the kernel's output features (XLA's `batch_group_count`: a grouped
    /// convolution's kernel gradient); the output batch is the group size. At most one
    /// of the two counts exceeds 1.
    pub batch_group_count: usize,
}

/// The devices that take part together in a collective: those that share their
/// coordinates on every mesh axis not in `axes`. A member's index in the group is the
/// mixed-radix number of its coordinates along `axes`, the first axis major.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AxisGroup {
    /// Mesh axes spanned, major to minor.
    pub axes: Vec<String>,
    /// Number of devices in the group: the product of the axes' sizes.
    pub size: usize,
}

impl AxisGroup {
    /// The `(source, target)` group indices of an [`Op::CollectiveShift`] over this
    /// group: member `i` sends to `t + offset`, where `t` is `size - 1 - i` with `mirror`
    /// and `i` without; the target is taken modulo `size` with `wrap`, else only the
    /// pairs whose target lies in the group are kept (a member left without a source
    /// receives zeros). Each member sends to at most one and receives from at most one.
    pub fn shift_pairs(&self, offset: i64, wrap: bool, mirror: bool) -> Vec<(usize, usize)> {
        let n = self.size as i64;
        (0..n)
            .filter_map(|i| {
                let t = if mirror { n - 1 - i } else { i } + offset;
                let t = if wrap { t.rem_euclid(n) } else { t };
                (0..n).contains(&t).then_some((i as usize, t as usize))
            })
            .collect()
    }
}

impl std::fmt::Display for AxisGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{{{}}}", self.axes.join(","))
    }
}

/// A primitive op. Every attribute needed to infer the result type is here, so
/// `infer_type(op, operand types)` is a pure function (see [`crate::ir::infer_type`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// The program's parameter number `index`; no operands.
    Parameter {
        /// Position in the program's parameter list.
        index: usize,
        /// Type of the argument.
        ty: crate::types::TensorType,
    },
    /// A constant array; no operands.
    Constant(Literal),
    /// `shape`-shaped array whose elements count up along `dim`; no operands.
    Iota {
        /// Result dims.
        shape: Vec<usize>,
        /// The dim that counts.
        dim: usize,
        /// Result element type.
        dtype: DType,
    },
    /// `random_bits(key, base)`: counter-based random bits, threefry-2x32 with 20 rounds
    /// (Salmon et al. 2011; JAX's `threefry2x32` in its partitionable layout; see
    /// [`crate::ir::random`]). Operands: the key, `i32[2]` (two u32 words, bits
    /// reinterpreted: the IR has no unsigned dtype), and the counter base, an `i32[]`
    /// read as a u32. Element `j` of `shape` is `threefry2x32(key, (0, c))` for the
    /// counter `c = base + sum_d j_d * strides[d]` (mod 2^32), reduced per `output`.
    /// Its value depends only on the key and its counter, never on a mesh: a partitioned
    /// program's device computes its block with the same `strides` and its block's
    /// offset added to `base`.
    RandomBits {
        /// The counters' dims: the result's, without a key output's trailing word dim.
        shape: Vec<usize>,
        /// Counter step per dim: row-major strides of the global array (so at most
        /// 2^32 distinct counters: the shape rule bounds the largest one).
        strides: Vec<usize>,
        /// What each counter's two words become.
        output: RandomOutput,
    },
    /// Elementwise op of one operand.
    Unary(UnaryOp),
    /// Elementwise op of two operands of equal type.
    Binary(BinaryOp),
    /// Elementwise comparison of two operands of equal type; bool result.
    Compare(CompareOp),
    /// `select(pred, on_true, on_false)`: operands of equal shape, pred bool.
    Select,
    /// Elementwise conversion to `dtype` (bool converts to 0/1; non-zero to `true`).
    Convert(DType),
    /// XLA's `broadcast_in_dim`: operand dim `i` becomes result dim `dims[i]`
    /// (increasing); operand dims are 1 or equal to the result dim.
    Broadcast {
        /// Result dims.
        shape: Vec<usize>,
        /// Where each operand dim goes.
        dims: Vec<usize>,
    },
    /// Row-major reshape to `shape` (same element count).
    Reshape(Vec<usize>),
    /// Result dim `i` is operand dim `perm[i]`.
    Transpose(Vec<usize>),
    /// Reduces `dims` (sorted, distinct) away with `kind`.
    Reduce {
        /// Combining function.
        kind: ReduceKind,
        /// Reduced dims of the operand.
        dims: Vec<usize>,
    },
    /// Generalised matrix product with batch and contracting dims.
    DotGeneral(DotDims),
    /// Static strided slice: result dim `i` takes `start[i]..limit[i]` by `stride[i]`.
    Slice {
        /// First index per dim.
        start: Vec<usize>,
        /// One past the last index per dim.
        limit: Vec<usize>,
        /// Step per dim (>= 1).
        stride: Vec<usize>,
    },
    /// `pad(operand, padding_value)`: `low`/`high` edge padding per dim (negative
    /// removes elements), `interior` elements inserted between neighbours.
    Pad {
        /// Padding before the first element, per dim.
        low: Vec<i64>,
        /// Padding after the last element, per dim.
        high: Vec<i64>,
        /// Padding between elements, per dim.
        interior: Vec<usize>,
    },
    /// Joins operands along `dim`; all other dims equal.
    Concatenate(usize),
    /// XLA's `reduce_window` with the identity of `kind` as init value and padding:
    /// result element `j` combines the operand elements under the window placed at `j`
    /// (see [`WindowDim`]).
    ReduceWindow {
        /// Combining function.
        kind: ReduceKind,
        /// One entry per operand dim.
        window: Vec<WindowDim>,
    },
    /// `convolution(input, kernel)`: XLA's general dilated convolution (cross-correlation,
    /// as XLA and every framework compute it).
    Convolution(ConvConfig),
    /// `dynamic_slice(operand, start_0, .., start_r-1)`: the `sizes` block at i32 scalar
    /// start indices, each clamped to `0..=dim - size` so that the block fits (as XLA).
    /// The partitioner also emits it to cut blocks at per-device offsets.
    DynamicSlice(Vec<usize>),
    /// `dynamic_update_slice(operand, update, start_0, .., start_r-1)`: the operand with
    /// the block `update` (same rank and dtype, no dim larger) written at i32 scalar start
    /// indices, each clamped to `0..=dim - update dim` so that the block fits (as XLA).
    DynamicUpdateSlice,
    /// Inclusive scan along `dim` with `kind`: result element `j` combines operand
    /// elements `0..=j` (with `reverse`, `j..n`), in that order.
    Cumulative {
        /// Combining function.
        kind: CumulativeKind,
        /// The scanned dim.
        dim: usize,
        /// Scan from the last element to the first.
        reverse: bool,
    },
    /// The i32 indices that sort the operand along `dim` (a stable sort: equal elements
    /// keep their order). A NaN is greater than every number and equal to NaN (ascending:
    /// NaNs last; descending: first); `-0.0` equals `0.0`; `false < true`.
    Argsort {
        /// The sorted dim.
        dim: usize,
        /// Largest first.
        descending: bool,
    },
    /// Reverses the order of elements along `dims` (sorted, distinct).
    Reverse(Vec<usize>),
    /// `gather(operand, start_indices)`: XLA's gather (see [`GatherDims`]); i32 indices,
    /// each start clamped so that its slice fits in the operand.
    Gather(GatherDims),
    /// `scatter(operand, scatter_indices, updates)`: XLA's scatter (see
    /// [`ScatterDims`]) combining with `kind`; i32 indices, an update whose window would
    /// not fit in the operand is skipped whole.
    Scatter {
        /// Which dims of the updates and indices go where in the operand.
        dims: ScatterDims,
        /// How an update combines with the operand element it lands on.
        kind: ScatterKind,
    },
    // ---- SPMD ops: only in partitioned (per-device) programs -------------------------
    /// The device's index in the group spanned by `axes`: an i32 scalar
    /// (`jax.lax.axis_index`); no operands.
    AxisIndex(AxisGroup),
    /// Combines the operand across the devices of `group` with `kind`.
    AllReduce {
        /// The devices that combine.
        group: AxisGroup,
        /// Combining function.
        kind: ReduceKind,
    },
    /// Concatenates the group's operands along `dim`, in group order.
    AllGather {
        /// The devices that gather.
        group: AxisGroup,
        /// The dim that grows `group.size` times.
        dim: usize,
    },
    /// Reduces across the group, then leaves group member `i` the `i`-th of `group.size`
    /// blocks along `dim`.
    ReduceScatter {
        /// The devices that reduce.
        group: AxisGroup,
        /// Combining function.
        kind: ReduceKind,
        /// The dim that shrinks `group.size` times.
        dim: usize,
    },
    /// Splits the operand in `group.size` blocks along `split_dim`, sends block `j` to
    /// member `j`, and concatenates the received blocks along `concat_dim` in sender order.
    AllToAll {
        /// The devices that exchange.
        group: AxisGroup,
        /// The dim that shrinks.
        split_dim: usize,
        /// The dim that grows.
        concat_dim: usize,
    },
    /// Moves whole operands between devices: device `c` receives the operand of the
    /// device `c'` whose index over `from` equals `c`'s index over `group.axes` (`from`
    /// is a reordering of the group's axes; all other mesh coordinates equal).
    CollectivePermute {
        /// The devices that exchange, and the receivers' index order.
        group: AxisGroup,
        /// The senders' index order.
        from: Vec<String>,
    },
    /// Shifts operands along a group (XLA's collective-permute with the source-target
    /// pairs `(i, i + offset)`, e.g. a halo exchange with neighbours): the member at group
    /// index `i` receives the operand of member `i - offset`. With `wrap` indices are
    /// taken modulo the group size (a rotation); without it a member with no source
    /// (`i - offset` outside the group) receives zeros (`false`), as XLA's
    /// collective-permute gives a device that is no target. With `mirror` the group is
    /// reversed first: member `i` receives the operand of member `size - 1 - (i - offset)`
    /// (a reversal of a split dim moves block `size - 1 - i` to member `i`). The pairs are
    /// computed at run time from the group ([`AxisGroup::shift_pairs`]), so the op's size
    /// does not grow with the device count.
    CollectiveShift {
        /// The devices that exchange, in group order.
        group: AxisGroup,
        /// How many group indices the operands move up (negative: down).
        offset: i64,
        /// Whether indices wrap around the group.
        wrap: bool,
        /// Whether member `i` sends to `size - 1 - i` (before `offset`) instead of `i`.
        mirror: bool,
    },

    /// Identity whose node carries a sharding annotation: pins a value's sharding
    /// mid-program (JAX's `with_sharding_constraint`).
    ShardingConstraint,
    /// Identity that shardings cross during propagation only in the allowed direction
    /// (Shardy's `sdy.propagation_barrier`): where the two sides end up differently
    /// sharded, the partitioner reshards the operand to the result's sharding.
    PropagationBarrier(PropagationDirection),
    /// Result number `result` of a control-flow op with regions (`while`, `scan`,
    /// `cond`; see [`Flow`]). Every result of one instance is its own node with the
    /// same `flow` and operands; the op runs once for all of them.
    Flow {
        /// The op and its regions, shared by the instance's result nodes.
        flow: Arc<Flow>,
        /// Which of the op's results this node is.
        result: usize,
    },
}

impl Op {
    /// The op's name as printed in the IR and in errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Parameter { .. } => "parameter",
            Op::Constant(_) => "constant",
            Op::Iota { .. } => "iota",
            Op::RandomBits { .. } => "random_bits",
            Op::Unary(u) => match u {
                UnaryOp::Neg => "negate",
                UnaryOp::Abs => "abs",
                UnaryOp::Exp => "exponential",
                UnaryOp::Log => "log",
                UnaryOp::Sqrt => "sqrt",
                UnaryOp::Rsqrt => "rsqrt",
                UnaryOp::Tanh => "tanh",
                UnaryOp::Logistic => "logistic",
                UnaryOp::Not => "not",
                UnaryOp::Sin => "sine",
                UnaryOp::Cos => "cosine",
                UnaryOp::Erf => "erf",
                UnaryOp::Floor => "floor",
                UnaryOp::Ceil => "ceil",
                UnaryOp::Round => "round_nearest_even",
                UnaryOp::Sign => "sign",
                UnaryOp::IsFinite => "is_finite",
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => "add",
                BinaryOp::Sub => "subtract",
                BinaryOp::Mul => "multiply",
                BinaryOp::Div => "divide",
                BinaryOp::Max => "maximum",
                BinaryOp::Min => "minimum",
                BinaryOp::Pow => "power",
                BinaryOp::And => "and",
                BinaryOp::Or => "or",
                BinaryOp::Rem => "remainder",
            },
            Op::Compare(_) => "compare",
            Op::Select => "select",
            Op::Convert(_) => "convert",
            Op::Broadcast { .. } => "broadcast",
            Op::Reshape(_) => "reshape",
            Op::Transpose(_) => "transpose",
            Op::Reduce { .. } => "reduce",
            Op::DotGeneral(_) => "dot_general",
            Op::Slice { .. } => "slice",
            Op::Pad { .. } => "pad",
            Op::Concatenate(_) => "concatenate",
            Op::ReduceWindow { .. } => "reduce_window",
            Op::Convolution(_) => "convolution",
            Op::DynamicSlice(_) => "dynamic_slice",
            Op::DynamicUpdateSlice => "dynamic_update_slice",
            Op::Cumulative { kind, .. } => match kind {
                CumulativeKind::Sum => "cumsum",
                CumulativeKind::Prod => "cumprod",
            },
            Op::Argsort { .. } => "argsort",
            Op::Reverse(_) => "reverse",
            Op::Gather(_) => "gather",
            Op::Scatter { kind, .. } => match kind {
                ScatterKind::Add => "scatter_add",
                ScatterKind::Replace => "scatter",
            },
            Op::ShardingConstraint => "sharding_constraint",
            Op::PropagationBarrier(_) => "propagation_barrier",
            Op::Flow { flow, .. } => flow.name(),
            Op::AxisIndex(_) => "axis_index",
            Op::AllReduce { .. } => "all_reduce",
            Op::AllGather { .. } => "all_gather",
            Op::ReduceScatter { .. } => "reduce_scatter",
            Op::AllToAll { .. } => "all_to_all",
            Op::CollectivePermute { .. } => "collective_permute",
            Op::CollectiveShift { .. } => "collective_shift",
        }
    }

    /// The op's kind: the variant, and the sub-op of unary, binary, compare and reduce.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Parameter { .. } => OpKind::Parameter,
            Op::Constant(_) => OpKind::Constant,
            Op::Iota { .. } => OpKind::Iota,
            Op::RandomBits { .. } => OpKind::RandomBits,
            Op::Unary(u) => match u {
                UnaryOp::Neg => OpKind::Neg,
                UnaryOp::Abs => OpKind::Abs,
                UnaryOp::Exp => OpKind::Exp,
                UnaryOp::Log => OpKind::Log,
                UnaryOp::Sqrt => OpKind::Sqrt,
                UnaryOp::Rsqrt => OpKind::Rsqrt,
                UnaryOp::Tanh => OpKind::Tanh,
                UnaryOp::Logistic => OpKind::Logistic,
                UnaryOp::Not => OpKind::Not,
                UnaryOp::Sin => OpKind::Sin,
                UnaryOp::Cos => OpKind::Cos,
                UnaryOp::Erf => OpKind::Erf,
                UnaryOp::Floor => OpKind::Floor,
                UnaryOp::Ceil => OpKind::Ceil,
                UnaryOp::Round => OpKind::Round,
                UnaryOp::Sign => OpKind::Sign,
                UnaryOp::IsFinite => OpKind::IsFinite,
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => OpKind::Add,
                BinaryOp::Sub => OpKind::Sub,
                BinaryOp::Mul => OpKind::Mul,
                BinaryOp::Div => OpKind::Div,
                BinaryOp::Max => OpKind::Max,
                BinaryOp::Min => OpKind::Min,
                BinaryOp::Pow => OpKind::Pow,
                BinaryOp::And => OpKind::And,
                BinaryOp::Or => OpKind::Or,
                BinaryOp::Rem => OpKind::Rem,
            },
            Op::Compare(c) => match c {
                CompareOp::Eq => OpKind::Eq,
                CompareOp::Ne => OpKind::Ne,
                CompareOp::Lt => OpKind::Lt,
                CompareOp::Le => OpKind::Le,
                CompareOp::Gt => OpKind::Gt,
                CompareOp::Ge => OpKind::Ge,
            },
            Op::Select => OpKind::Select,
            Op::Convert(_) => OpKind::Convert,
            Op::Broadcast { .. } => OpKind::Broadcast,
            Op::Reshape(_) => OpKind::Reshape,
            Op::Transpose(_) => OpKind::Transpose,
            Op::Reduce { kind, .. } => match kind {
                ReduceKind::Sum => OpKind::ReduceSum,
                ReduceKind::Max => OpKind::ReduceMax,
                ReduceKind::Min => OpKind::ReduceMin,
            },
            Op::DotGeneral(_) => OpKind::DotGeneral,
            Op::Slice { .. } => OpKind::Slice,
            Op::Pad { .. } => OpKind::Pad,
            Op::Concatenate(_) => OpKind::Concatenate,
            Op::ReduceWindow { kind, .. } => match kind {
                ReduceKind::Sum => OpKind::ReduceWindowSum,
                ReduceKind::Max => OpKind::ReduceWindowMax,
                ReduceKind::Min => OpKind::ReduceWindowMin,
            },
            Op::Convolution(_) => OpKind::Convolution,
            Op::DynamicSlice(_) => OpKind::DynamicSlice,
            Op::DynamicUpdateSlice => OpKind::DynamicUpdateSlice,
            Op::Cumulative { kind, .. } => match kind {
                CumulativeKind::Sum => OpKind::CumulativeSum,
                CumulativeKind::Prod => OpKind::CumulativeProd,
            },
            Op::Argsort { .. } => OpKind::Argsort,
            Op::Reverse(_) => OpKind::Reverse,
            Op::Gather(_) => OpKind::Gather,
            Op::Scatter { kind, .. } => match kind {
                ScatterKind::Add => OpKind::ScatterAdd,
                ScatterKind::Replace => OpKind::ScatterReplace,
            },
            Op::AxisIndex(_) => OpKind::AxisIndex,
            Op::AllReduce { .. } => OpKind::AllReduce,
            Op::AllGather { .. } => OpKind::AllGather,
            Op::ReduceScatter { .. } => OpKind::ReduceScatter,
            Op::AllToAll { .. } => OpKind::AllToAll,
            Op::CollectivePermute { .. } => OpKind::CollectivePermute,
            Op::CollectiveShift { .. } => OpKind::CollectiveShift,
            Op::ShardingConstraint => OpKind::ShardingConstraint,
            Op::PropagationBarrier(_) => OpKind::PropagationBarrier,
            Op::Flow { flow, .. } => match **flow {
                Flow::While { .. } => OpKind::While,
                Flow::Scan { .. } => OpKind::Scan,
                Flow::Cond { .. } => OpKind::Cond,
                Flow::Manual { .. } => OpKind::ShardMap,
            },
        }
    }

    /// How many operands the op takes.
    pub fn arity(&self) -> Arity {
        match self {
            Op::Parameter { .. } | Op::Constant(_) | Op::Iota { .. } | Op::AxisIndex(_) => {
                Arity::Fixed(0)
            }
            Op::Unary(_)
            | Op::Convert(_)
            | Op::Broadcast { .. }
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Reduce { .. }
            | Op::Slice { .. }
            | Op::ReduceWindow { .. }
            | Op::Reverse(_)
            | Op::AllReduce { .. }
            | Op::AllGather { .. }
            | Op::ReduceScatter { .. }
            | Op::AllToAll { .. }
            | Op::CollectivePermute { .. }
            | Op::CollectiveShift { .. }
            | Op::ShardingConstraint
            | Op::PropagationBarrier(_) => Arity::Fixed(1),
            Op::Binary(_) | Op::Compare(_) | Op::Pad { .. } | Op::DotGeneral(_) => Arity::Fixed(2),
            // The key, then the counter base.
            Op::RandomBits { .. } => Arity::Fixed(2),
            Op::Convolution(_) => Arity::Fixed(2),
            Op::Gather(_) => Arity::Fixed(2),
            Op::Scatter { .. } => Arity::Fixed(3),
            // The operand, then one start index per dim.
            Op::DynamicSlice(sizes) => Arity::Fixed(sizes.len() + 1),
            // The operand, the update, then one start index per dim (at least two).
            Op::DynamicUpdateSlice => Arity::AtLeast(2),
            Op::Cumulative { .. } | Op::Argsort { .. } => Arity::Fixed(1),
            Op::Select => Arity::Fixed(3),
            Op::Concatenate(_) => Arity::AtLeast(1),
            // The flow's signature rule counts its operands.
            Op::Flow { .. } => Arity::AtLeast(0),
        }
    }

    /// True for the collectives (ops that communicate between devices).
    pub fn is_collective(&self) -> bool {
        self.collective_group().is_some()
    }

    /// The devices a collective spans; `None` for other ops.
    pub fn collective_group(&self) -> Option<&AxisGroup> {
        match self {
            Op::AllReduce { group, .. }
            | Op::AllGather { group, .. }
            | Op::ReduceScatter { group, .. }
            | Op::AllToAll { group, .. }
            | Op::CollectivePermute { group, .. }
            | Op::CollectiveShift { group, .. } => Some(group),
            Op::Parameter { .. }
            | Op::Constant(_)
            | Op::Iota { .. }
            | Op::RandomBits { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::Broadcast { .. }
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Reduce { .. }
            | Op::DotGeneral(_)
            | Op::Slice { .. }
            | Op::Pad { .. }
            | Op::Concatenate(_)
            | Op::ReduceWindow { .. }
            | Op::Convolution(_)
            | Op::DynamicSlice(_)
            | Op::DynamicUpdateSlice
            | Op::Cumulative { .. }
            | Op::Argsort { .. }
            | Op::Reverse(_)
            | Op::Gather(_)
            | Op::Scatter { .. }
            | Op::AxisIndex(_)
            | Op::Flow { .. }
            | Op::ShardingConstraint
            | Op::PropagationBarrier(_) => None,
        }
    }

    /// See [`OpKind::is_spmd_only`].
    pub fn is_spmd_only(&self) -> bool {
        self.kind().is_spmd_only()
    }

    /// See [`OpKind::is_elementwise`].
    pub fn is_elementwise(&self) -> bool {
        self.kind().is_elementwise()
    }
}

/// How many operands an op takes (see [`Op::arity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    /// Exactly this many.
    Fixed(usize),
    /// This many or more (variadic: `concatenate`).
    AtLeast(usize),
}

impl Arity {
    /// True when `n` operands fit.
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Fixed(k) => n == k,
            Arity::AtLeast(k) => n >= k,
        }
    }
}

impl std::fmt::Display for Arity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arity::Fixed(k) => write!(f, "{k}"),
            Arity::AtLeast(k) => write!(f, "at least {k}"),
        }
    }
}

/// Declares [`OpKind`] and its complete list [`OpKind::ALL`] from one list of
/// variants, so the list cannot miss one.
macro_rules! op_kinds {
    ($($(#[$doc:meta])* $kind:ident,)*) => {
        /// What an [`Op`] is, without its attributes: one kind per op variant, and one
        /// per sub-op of `Unary`, `Binary`, `Compare`, `Reduce` and `ReduceWindow` (each has its own
        /// kernel and VJP rule). Tests measure op coverage in kinds.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum OpKind {
            $($(#[$doc])* $kind,)*
        }

        impl OpKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$kind,)*];
        }
    };
}

op_kinds! {
    /// [`Op::Parameter`].
    Parameter,
    /// [`Op::Constant`].
    Constant,
    /// [`Op::Iota`].
    Iota,
    /// [`Op::RandomBits`].
    RandomBits,
    /// [`UnaryOp::Neg`].
    Neg,
    /// [`UnaryOp::Abs`].
    Abs,
    /// [`UnaryOp::Exp`].
    Exp,
    /// [`UnaryOp::Log`].
    Log,
    /// [`UnaryOp::Sqrt`].
    Sqrt,
    /// [`UnaryOp::Rsqrt`].
    Rsqrt,
    /// [`UnaryOp::Tanh`].
    Tanh,
    /// [`UnaryOp::Logistic`].
    Logistic,
    /// [`UnaryOp::Not`].
    Not,
    /// [`UnaryOp::Sin`].
    Sin,
    /// [`UnaryOp::Cos`].
    Cos,
    /// [`UnaryOp::Erf`].
    Erf,
    /// [`UnaryOp::Floor`].
    Floor,
    /// [`UnaryOp::Ceil`].
    Ceil,
    /// [`UnaryOp::Round`].
    Round,
    /// [`UnaryOp::Sign`].
    Sign,
    /// [`UnaryOp::IsFinite`].
    IsFinite,
    /// [`BinaryOp::Add`].
    Add,
    /// [`BinaryOp::Sub`].
    Sub,
    /// [`BinaryOp::Mul`].
    Mul,
    /// [`BinaryOp::Div`].
    Div,
    /// [`BinaryOp::Max`].
    Max,
    /// [`BinaryOp::Min`].
    Min,
    /// [`BinaryOp::Pow`].
    Pow,
    /// [`BinaryOp::And`].
    And,
    /// [`BinaryOp::Or`].
    Or,
    /// [`BinaryOp::Rem`].
    Rem,
    /// [`CompareOp::Eq`].
    Eq,
    /// [`CompareOp::Ne`].
    Ne,
    /// [`CompareOp::Lt`].
    Lt,
    /// [`CompareOp::Le`].
    Le,
    /// [`CompareOp::Gt`].
    Gt,
    /// [`CompareOp::Ge`].
    Ge,
    /// [`Op::Select`].
    Select,
    /// [`Op::Convert`].
    Convert,
    /// [`Op::Broadcast`].
    Broadcast,
    /// [`Op::Reshape`].
    Reshape,
    /// [`Op::Transpose`].
    Transpose,
    /// [`Op::Reduce`] with [`ReduceKind::Sum`].
    ReduceSum,
    /// [`Op::Reduce`] with [`ReduceKind::Max`].
    ReduceMax,
    /// [`Op::Reduce`] with [`ReduceKind::Min`].
    ReduceMin,
    /// [`Op::DotGeneral`].
    DotGeneral,
    /// [`Op::Slice`].
    Slice,
    /// [`Op::Pad`].
    Pad,
    /// [`Op::Concatenate`].
    Concatenate,
    /// [`Op::ReduceWindow`] with [`ReduceKind::Sum`].
    ReduceWindowSum,
    /// [`Op::ReduceWindow`] with [`ReduceKind::Max`].
    ReduceWindowMax,
    /// [`Op::ReduceWindow`] with [`ReduceKind::Min`].
    ReduceWindowMin,
    /// [`Op::Convolution`].
    Convolution,
    /// [`Op::DynamicSlice`].
    DynamicSlice,
    /// [`Op::DynamicUpdateSlice`].
    DynamicUpdateSlice,
    /// [`Op::Cumulative`] with [`CumulativeKind::Sum`].
    CumulativeSum,
    /// [`Op::Cumulative`] with [`CumulativeKind::Prod`].
    CumulativeProd,
    /// [`Op::Argsort`].
    Argsort,
    /// [`Op::Reverse`].
    Reverse,
    /// [`Op::Gather`].
    Gather,
    /// [`Op::Scatter`] with [`ScatterKind::Add`].
    ScatterAdd,
    /// [`Op::Scatter`] with [`ScatterKind::Replace`].
    ScatterReplace,
    /// [`Op::AxisIndex`].
    AxisIndex,
    /// [`Op::AllReduce`].
    AllReduce,
    /// [`Op::AllGather`].
    AllGather,
    /// [`Op::ReduceScatter`].
    ReduceScatter,
    /// [`Op::AllToAll`].
    AllToAll,
    /// [`Op::CollectivePermute`].
    CollectivePermute,
    /// [`Op::CollectiveShift`].
    CollectiveShift,
    /// [`Op::ShardingConstraint`].
    ShardingConstraint,
    /// [`Op::PropagationBarrier`].
    PropagationBarrier,
    /// [`Op::Flow`] with [`Flow::While`].
    While,
    /// [`Op::Flow`] with [`Flow::Scan`].
    Scan,
    /// [`Op::Flow`] with [`Flow::Cond`].
    Cond,
    /// [`Op::Flow`] with [`Flow::Manual`] (`shard_map`).
    ShardMap,
}

impl OpKind {
    /// True for ops that only exist in partitioned programs (collectives, axis_index):
    /// the propagation, autodiff and the reference interpreter reject them.
    pub fn is_spmd_only(self) -> bool {
        use OpKind as K;
        match self {
            K::AxisIndex
            | K::AllReduce
            | K::AllGather
            | K::ReduceScatter
            | K::AllToAll
            | K::CollectivePermute
            | K::CollectiveShift => true,
            K::Parameter | K::Constant | K::Iota | K::RandomBits => false,
            K::Neg | K::Abs | K::Exp | K::Log | K::Sqrt | K::Rsqrt | K::Tanh | K::Logistic => false,
            K::Not | K::Add | K::Sub | K::Mul | K::Div | K::Max | K::Min | K::Pow | K::And => false,
            K::Or | K::Eq | K::Ne | K::Lt | K::Le | K::Gt | K::Ge | K::Select | K::Convert => false,
            K::Sin | K::Cos | K::Erf | K::Floor | K::Ceil | K::Round | K::Sign | K::IsFinite => {
                false
            }
            K::Rem => false,
            K::Broadcast | K::Reshape | K::Transpose | K::ReduceSum | K::ReduceMax => false,
            K::ReduceMin | K::DotGeneral | K::Slice | K::Pad | K::Concatenate => false,
            K::Convolution | K::Reverse => false,
            K::DynamicSlice | K::DynamicUpdateSlice | K::CumulativeSum | K::CumulativeProd => false,
            K::Argsort => false,
            K::Gather | K::ScatterAdd | K::ScatterReplace => false,
            K::ShardingConstraint | K::PropagationBarrier => false,
            K::ReduceWindowSum | K::ReduceWindowMax | K::ReduceWindowMin => false,
            K::While | K::Scan | K::Cond | K::ShardMap => false,
        }
    }

    /// True for ops whose every result element depends only on the operand elements at
    /// the same index (unary, binary, compare, select, convert, sharding_constraint).
    pub fn is_elementwise(self) -> bool {
        use OpKind as K;
        match self {
            K::Neg | K::Abs | K::Exp | K::Log | K::Sqrt | K::Rsqrt | K::Tanh | K::Logistic => true,
            K::Not | K::Add | K::Sub | K::Mul | K::Div | K::Max | K::Min | K::Pow | K::And => true,
            K::Or | K::Eq | K::Ne | K::Lt | K::Le | K::Gt | K::Ge | K::Select | K::Convert => true,
            K::Sin | K::Cos | K::Erf | K::Floor | K::Ceil | K::Round | K::Sign | K::IsFinite => {
                true
            }
            K::Rem => true,
            K::ShardingConstraint => true,
            // An identity, but propagation crosses it only as its direction allows.
            K::PropagationBarrier => false,
            K::Parameter | K::Constant | K::Iota | K::RandomBits => false,
            K::Broadcast | K::Reshape | K::Transpose | K::ReduceSum | K::ReduceMax => false,
            K::ReduceMin | K::DotGeneral | K::Slice | K::Pad | K::Concatenate => false,
            K::Convolution | K::Reverse => false,
            K::DynamicSlice | K::DynamicUpdateSlice | K::CumulativeSum | K::CumulativeProd => false,
            K::Argsort => false,
            K::Gather | K::ScatterAdd | K::ScatterReplace => false,
            K::AxisIndex | K::AllReduce | K::AllGather => false,
            K::ReduceScatter | K::AllToAll | K::CollectivePermute => false,
            K::ReduceWindowSum | K::ReduceWindowMax | K::ReduceWindowMin => false,
            K::CollectiveShift => false,
            K::While | K::Scan | K::Cond | K::ShardMap => false,
        }
    }

    /// True for ops whose result is a partial sum when an operand dim they sum over
    /// (a contracting dim of `dot_general`, the input features of a `convolution`, a dim
    /// of a `reduce` sum, a sliced dim of a `dynamic_slice`) is split: each
    /// device then holds a summand, a pending sum the partitioner may keep unreduced.
    pub fn makes_partial_sums(self) -> bool {
        use OpKind as K;
        match self {
            K::DotGeneral | K::ReduceSum | K::Convolution => true,
            // Max and min are not sums; the collectives already combine across devices.
            K::ReduceMax | K::ReduceMin | K::AllReduce | K::ReduceScatter => false,
            K::Parameter | K::Constant | K::Iota | K::RandomBits => false,
            K::Neg | K::Abs | K::Exp | K::Log | K::Sqrt | K::Rsqrt | K::Tanh | K::Logistic => false,
            K::Not | K::Add | K::Sub | K::Mul | K::Div | K::Max | K::Min | K::Pow | K::And => false,
            K::Or | K::Eq | K::Ne | K::Lt | K::Le | K::Gt | K::Ge | K::Select | K::Convert => false,
            K::Sin | K::Cos | K::Erf | K::Floor | K::Ceil | K::Round | K::Sign | K::IsFinite => {
                false
            }
            K::Rem => false,
            K::Broadcast | K::Reshape | K::Transpose | K::Slice | K::Pad | K::Concatenate => false,
            K::Reverse => false,
            // Each device holds the part of the window inside its block, zeros elsewhere.
            K::DynamicSlice => true,
            // A scan along a split dim combines the shard totals itself.
            K::DynamicUpdateSlice | K::CumulativeSum | K::CumulativeProd => false,
            K::Argsort => false,
            // Their pending sums arise only in the partitioner's own plans (a split
            // indexed dim), which reduce them unless the target keeps them.
            K::Gather | K::ScatterAdd | K::ScatterReplace => false,
            K::AxisIndex | K::AllGather | K::AllToAll => false,
            K::CollectivePermute | K::ShardingConstraint | K::PropagationBarrier => false,
            // A window sums neighbouring elements of one dim; nothing is left pending.
            K::ReduceWindowSum | K::ReduceWindowMax | K::ReduceWindowMin => false,
            K::CollectiveShift => false,
            K::While | K::Scan | K::Cond | K::ShardMap => false,
        }
    }
}
