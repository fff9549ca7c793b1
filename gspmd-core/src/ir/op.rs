//! The primitive op set. High-level ops (matmul, einsum, softmax, ...) are built from
//! these by the [`crate::ir::Builder`]; passes only ever see primitives.

use super::literal::Literal;
use crate::types::DType;

/// Elementwise ops of one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
}

/// Elementwise ops of two operands of the same shape and dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
}

/// Elementwise comparisons; the result is bool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
pub enum ReduceKind {
    /// Sum; identity 0.
    Sum,
    /// Maximum; identity -inf (i32::MIN for integers).
    Max,
    /// Minimum; identity +inf (i32::MAX for integers).
    Min,
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

impl std::fmt::Display for AxisGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{{{}}}", self.axes.join(","))
    }
}

/// A primitive op. Every attribute needed to infer the result type is here, so
/// `infer_type(op, operand types)` is a pure function (see [`crate::ir::infer_type`]).
#[derive(Debug, Clone, PartialEq)]
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
    // ---- SPMD ops: only in partitioned (per-device) programs -------------------------
    /// The device's index in the group spanned by `axes`: an i32 scalar
    /// (`jax.lax.axis_index`); no operands.
    AxisIndex(AxisGroup),
    /// `dynamic_slice(operand, start_0, .., start_r-1)`: the `sizes` block at i32 scalar
    /// start indices, each clamped so that the block fits (as XLA).
    DynamicSlice(Vec<usize>),
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

    /// Identity whose node carries a sharding annotation: pins a value's sharding
    /// mid-program (JAX's `with_sharding_constraint`).
    ShardingConstraint,
}

impl Op {
    /// The op's name as printed in the IR and in errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Parameter { .. } => "parameter",
            Op::Constant(_) => "constant",
            Op::Iota { .. } => "iota",
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
            Op::ShardingConstraint => "sharding_constraint",
            Op::AxisIndex(_) => "axis_index",
            Op::DynamicSlice(_) => "dynamic_slice",
            Op::AllReduce { .. } => "all_reduce",
            Op::AllGather { .. } => "all_gather",
            Op::ReduceScatter { .. } => "reduce_scatter",
            Op::AllToAll { .. } => "all_to_all",
            Op::CollectivePermute { .. } => "collective_permute",
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
            | Op::CollectivePermute { group, .. } => Some(group),
            _ => None,
        }
    }

    /// True for ops that only exist in partitioned programs (collectives, axis_index,
    /// dynamic_slice): the propagation and the reference interpreter reject them.
    pub fn is_spmd_only(&self) -> bool {
        self.is_collective() || matches!(self, Op::AxisIndex(_) | Op::DynamicSlice(_))
    }

    /// True for ops whose every result element depends only on the operand elements at
    /// the same index (unary, binary, compare, select, convert, sharding_constraint).
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_)
                | Op::Binary(_)
                | Op::Compare(_)
                | Op::Select
                | Op::Convert(_)
                | Op::ShardingConstraint
        )
    }
}
