//! The vector-Jacobian rules: for every primitive op, the cotangent that flows from a
//! result to each of its operands. One exhaustive match over [`Op`]; the reverse sweep
//! ([`super::sweep`]) knows no op.
//!
//! Conventions (those of JAX's `lax` rules):
//! - `maximum`/`minimum` and `reduce` max/min: the cotangent goes to the operand
//!   positions equal to the result; ties share it equally (half each for a binary tie,
//!   `1/k` each for `k` tied positions of a reduction), which is also what central
//!   differences measure at a tie.
//! - `reduce_window` max/min: the cotangent of each window goes to the FIRST of its
//!   elements (in row-major window order) equal to the result, as XLA's
//!   `select_and_scatter` (JAX's max-pool gradient) does; a tie gets it exactly once.
//! - `abs`: the derivative is `sign(x)`, 0 at `x = 0`.
//! - `floor`, `ceil`, `round` and `sign` are piecewise constant: no gradient flows
//!   through them (JAX's zero derivative; at the jumps too).
//! - `remainder(a, b) = a - b trunc(a/b)`: `d/da = 1`, `d/db = -trunc(a/b)`, away from
//!   the jumps where `a/b` is an integer.
//! - `power(x, y)`: `d/dx = y x^(y-1)`, taken as 0 where `y = 0`;
//!   `d/dy = x^y log(x)`, taken as 0 where `x = 0`.
//! - `convolution`: the input's cotangent is the convolution of the result's cotangent
//!   with the spatially reversed kernel, in and out features swapped (per feature
//!   group), lhs dilation = stride, stride = lhs dilation; the kernel's is the
//!   convolution of the input (batch as feature, per group) with the result's cotangent
//!   as kernel, rhs dilation = stride, stride = rhs dilation (JAX's transpose rules).
//! - No gradient flows into bool or integer values: `not`, `and`, `or`, `compare`,
//!   `is_finite`, `argsort`, the predicate of `select`, the start indices of
//!   `dynamic_slice` and `dynamic_update_slice`, and `convert` to or from i32 or bool.
//! - `cumprod`: `dx_j = sum_{k >= j} ct_k prod_{i <= k, i != j} x_i`, built without
//!   dividing by `x` (so exact where `x` is 0) at `O(n^2)` per lane (see [`cumprod`]).

use crate::error::{Error, Result};
use crate::ir::Appender;
use crate::ir::{
    BinaryOp, CompareOp, ConvConfig, ConvDimensionNumbers, CumulativeKind, DType, DotDims, Node,
    Op, OpKind, Program, ReduceKind, Rotation, UnaryOp, ValueId, WindowDim, rotation,
};

/// True when the sweep has a rule for ops of `kind`: every op of a global program
/// (bool- and integer-valued ones pass no gradient, but have a rule; `scan` and `cond`
/// have theirs in `autodiff::flow`), and none of the SPMD-only ops nor `while` (its trip
/// count is a run-time value) (inside a `shard_map` body the collectives have their
/// transposes: `autodiff::manual`): [`super::grad`] rejects a program holding one with
/// [`Error::NotDifferentiable`]. `tests/autodiff.rs` checks both halves: a
/// finite-difference test for every differentiable kind, the error for every other one.
pub fn is_differentiable(kind: OpKind) -> bool {
    use OpKind as K;
    match kind {
        K::Parameter | K::Constant | K::Iota | K::Select | K::Convert => true,
        // Integer bits of an integer key: no gradient, but a rule.
        K::RandomBits => true,
        K::Neg | K::Abs | K::Exp | K::Log | K::Sqrt | K::Rsqrt | K::Tanh | K::Logistic => true,
        K::Not | K::Add | K::Sub | K::Mul | K::Div | K::Max | K::Min | K::Pow | K::And => true,
        K::Or | K::Eq | K::Ne | K::Lt | K::Le | K::Gt | K::Ge => true,
        K::Sin | K::Cos | K::Erf | K::Floor | K::Ceil | K::Round | K::Sign | K::IsFinite => true,
        K::Rem => true,
        K::Broadcast | K::Reshape | K::Transpose | K::ReduceSum | K::ReduceMax => true,
        K::ReduceMin | K::DotGeneral | K::Slice | K::Pad | K::Concatenate => true,
        K::ShardingConstraint | K::PropagationBarrier => true,
        K::ReduceWindowSum | K::ReduceWindowMax | K::ReduceWindowMin => true,
        K::Convolution | K::Reverse => true,
        K::DynamicSlice | K::DynamicUpdateSlice | K::CumulativeSum | K::CumulativeProd => true,
        // An i32 result: like `compare`, it passes no gradient but has a rule.
        K::Argsort => true,
        K::Gather | K::ScatterAdd | K::ScatterReplace => true,
        K::AxisIndex | K::AllReduce | K::AllGather => false,
        K::ReduceScatter | K::AllToAll | K::CollectivePermute => false,
        K::CollectiveShift => false,
        K::Scan | K::Cond | K::ShardMap => true,
        K::While => false,
    }
}

/// False for the piecewise-constant ops (`floor`, `ceil`, `round`, `sign`): their
/// derivative is zero wherever it exists (JAX's convention), so the sweep treats their
/// results as constants and emits no backward code for what only reaches the loss
/// through them.
pub(super) fn passes_gradient(op: &Op) -> bool {
    !matches!(
        op,
        Op::Unary(UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign)
    )
}

/// The cotangent flowing to operand `i` of `node` (which defines `y`) when `y`'s
/// cotangent is `ct`, emitted through `e`; `Ok(None)` when no gradient flows along that
/// edge. `node` belongs to a verified program, so its operand count and attributes fit
/// its op. The SPMD-only ops (axis_index, collectives) have their transposes
/// (`super::manual`), used in `shard_map` bodies.
pub(super) fn operand_cotangent(
    e: &mut Appender<'_>,
    node: &Node,
    y: ValueId,
    ct: ValueId,
    i: usize,
) -> Result<Option<ValueId>> {
    let operands = &node.operands;
    let x = operands[i];
    let ct = match &node.op {
        Op::Parameter { .. }
        | Op::Constant(_)
        | Op::Iota { .. }
        | Op::RandomBits { .. }
        | Op::Compare(_) => None,
        Op::Unary(u) => unary(e, *u, x, y, ct)?,
        Op::Binary(b) => binary(e, *b, operands[0], operands[1], y, ct, i)?,
        Op::Select => match i {
            0 => None,
            _ => {
                let zeros = e.zeros_like(ct)?;
                let (t, f) = if i == 1 { (ct, zeros) } else { (zeros, ct) };
                Some(e.select(operands[0], t, f)?)
            }
        },
        // Between floats the cotangent converts back; other conversions are constant.
        Op::Convert(to) => {
            let from = e.ty(x).dtype;
            if to.is_float() && from.is_float() {
                Some(e.push(Op::Convert(from), &[ct])?)
            } else {
                None
            }
        }
        Op::Broadcast { shape, dims } => {
            let x_shape = e.shape(x);
            // Result dims that are new, or that grew from size 1, are summed away.
            let summed: Vec<usize> = (0..shape.len())
                .filter(|d| match dims.iter().position(|k| k == d) {
                    Some(j) => x_shape[j] != shape[*d],
                    None => true,
                })
                .collect();
            let s = e.reduce_sum(ct, &summed)?;
            Some(e.reshape(s, &x_shape)?)
        }
        Op::Reshape(_) => {
            let x_shape = e.shape(x);
            Some(e.reshape(ct, &x_shape)?)
        }
        Op::Transpose(perm) => Some(e.transpose(ct, &inverse(perm))?),
        Op::Reduce { kind, dims } => Some(reduce(e, *kind, dims, x, y, ct)?),
        Op::DotGeneral(dd) => Some(dot_general(e, dd, operands[0], operands[1], ct, i)?),
        Op::Slice { start, stride, .. } => {
            // Scatter the cotangent back with zeros: interior padding re-inserts the
            // skipped elements, edge padding the cut-off ones.
            let (x_shape, ct_shape) = (e.shape(x), e.shape(ct));
            let high = (0..x_shape.len())
                .map(|d| {
                    let spread = match ct_shape[d] {
                        0 => 0,
                        n => (n - 1) * stride[d] + 1,
                    };
                    (x_shape[d] - start[d] - spread) as i64
                })
                .collect();
            let low = start.iter().map(|&s| s as i64).collect();
            let interior = stride.iter().map(|&s| s - 1).collect();
            Some(e.pad(ct, 0.0, low, high, interior)?)
        }
        Op::Pad {
            low,
            high,
            interior,
        } => Some(match i {
            0 => pad_operand(e, x, ct, low, high, interior)?,
            _ => {
                // The padding value's cotangent: the sum over the padded positions,
                // picked by padding zeros (operand positions) with ones.
                let zeros = e.zeros_like(operands[0])?;
                let mask = e.pad(zeros, 1.0, low.clone(), high.clone(), interior.clone())?;
                let picked = e.mul(ct, mask)?;
                e.sum_all(picked)?
            }
        }),
        Op::Concatenate(dim) => {
            let offset: usize = operands[..i].iter().map(|&o| e.ty(o).shape[*dim]).sum();
            let x_shape = e.shape(x);
            let mut start = vec![0; x_shape.len()];
            let mut limit = e.shape(ct);
            start[*dim] = offset;
            limit[*dim] = offset + x_shape[*dim];
            Some(e.slice(ct, start, limit, vec![1; x_shape.len()])?)
        }
        Op::ReduceWindow { kind, window } => Some(reduce_window(e, *kind, window, x, y, ct)?),
        Op::Convolution(config) => Some(match i {
            0 => conv_input_cotangent(e, config, x, operands[1], ct)?,
            _ => conv_kernel_cotangent(e, config, operands[0], x, ct)?,
        }),
        Op::DynamicSlice(_) => match i {
            // The cotangent written into zeros at the same (clamped) starts.
            0 => {
                let zeros = e.zeros_like(x)?;
                let starts = &operands[1..];
                Some(e.push(Op::DynamicUpdateSlice, &[&[zeros, ct], starts].concat())?)
            }
            _ => None,
        },
        Op::DynamicUpdateSlice => {
            let starts = &operands[2..];
            match i {
                // The operand's cotangent: `ct` with the overwritten window zeroed.
                0 => {
                    let zeros = e.zeros_like(operands[1])?;
                    Some(e.push(Op::DynamicUpdateSlice, &[&[ct, zeros], starts].concat())?)
                }
                1 => {
                    let sizes = e.shape(x);
                    Some(e.push(Op::DynamicSlice(sizes), &[&[ct], starts].concat())?)
                }
                _ => None,
            }
        }
        Op::Cumulative { kind, dim, reverse } => Some(match kind {
            // Element `j` feeds results `j..` (reversed: `..=j`): the scan the other way.
            CumulativeKind::Sum => e.push(
                Op::Cumulative {
                    kind: *kind,
                    dim: *dim,
                    reverse: !reverse,
                },
                &[ct],
            )?,
            CumulativeKind::Prod => cumprod(e, *dim, *reverse, x, ct)?,
        }),
        Op::Argsort { .. } => None,
        Op::Reverse(dims) => Some(e.reverse(ct, dims)?),
        Op::Gather(dims) => super::indexing::gather(e, dims, [operands[0], operands[1]], ct, i)?,
        Op::Scatter { dims, kind } => {
            let xs = [operands[0], operands[1], operands[2]];
            super::indexing::scatter(e, dims, *kind, xs, ct, i)?
        }
        // GSPMD 3.6: the backward pass is sharded like the forward pass, so the
        // cotangent is pinned to the same sharding.
        Op::ShardingConstraint => Some(e.constrain(ct, node.annotation.clone())?),
        // The cotangent's barrier runs from ct(y) (its operand) to ct(x) (its result).
        // A cotangent is sharded like its primal (GSPMD 3.6), so to keep the forward
        // barrier's rule (layouts pass from x's side to y's only, for FORWARD) its
        // direction is mirrored: BACKWARD, from ct(x) back to ct(y).
        Op::PropagationBarrier(allowed) => {
            Some(e.push(Op::PropagationBarrier(allowed.mirrored()), &[ct])?)
        }
        // Only in a `shard_map` body: `grad` rejects them in a global program.
        Op::AxisIndex(_)
        | Op::AllReduce { .. }
        | Op::AllGather { .. }
        | Op::ReduceScatter { .. }
        | Op::AllToAll { .. }
        | Op::CollectivePermute { .. }
        | Op::CollectiveShift { .. } => super::manual::collective_cotangent(e, node, y, ct)?,
        // The sweep differentiates a flow instance as a whole (`super::flow`); a
        // `while` is rejected before it starts.
        Op::Flow { .. } => return Err(not_differentiable(node, y)),
    };
    Ok(ct)
}

/// For a node that ends a pattern the partitioner handles as one (GSPMD 4.6), the
/// cotangent that skips the node's operands and goes to the pattern's input, with that
/// input; `None` for other nodes. A rotation `concatenate(a[k:], a[:k])` (`roll`)
/// sends its cotangent to `a` by the inverse rotation — a rotation again, which moves
/// only boundary pieces on a split dim — instead of padding each slice's piece back
/// into zeros (which would gather the piece that wrapped around).
pub(super) fn pattern_cotangent(
    e: &mut Appender<'_>,
    program: &Program,
    node: &Node,
    ct: ValueId,
) -> Result<Option<(ValueId, ValueId)>> {
    let Some(Rotation { source, dim, k }) = rotation(program, node) else {
        return Ok(None);
    };
    let mut shape = e.shape(ct);
    let n = shape[dim];
    let rank = shape.len();
    let mut start = vec![0; rank];
    start[dim] = n - k;
    let head = e.slice(ct, start.clone(), shape.clone(), vec![1; rank])?;
    start[dim] = 0;
    shape[dim] = n - k;
    let tail = e.slice(ct, start, shape, vec![1; rank])?;
    Ok(Some((source, e.push(Op::Concatenate(dim), &[head, tail])?)))
}

/// The error for `node` (defining `y`) when its op is not [`is_differentiable`].
pub(super) fn not_differentiable(node: &Node, y: ValueId) -> Error {
    Error::NotDifferentiable {
        value: y,
        op: node.op.name(),
        location: node.location,
        message: if matches!(node.op, Op::Flow { .. }) {
            "a while_loop's trip count is a run-time value; reverse mode needs a static one \
             (use fori_loop or scan)"
                .into()
        } else {
            "an SPMD op is not differentiable in a global program".into()
        },
    }
}

/// `q` with `q[perm[i]] = i`.
fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut q = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        q[p] = i;
    }
    q
}

/// Elementwise ops of one operand `x` with result `y`.
fn unary(
    e: &mut Appender<'_>,
    op: UnaryOp,
    x: ValueId,
    y: ValueId,
    ct: ValueId,
) -> Result<Option<ValueId>> {
    let dy_dx = match op {
        // Bool-valued, or piecewise constant (not `passes_gradient`: never reached).
        UnaryOp::Not
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Round
        | UnaryOp::Sign
        | UnaryOp::IsFinite => return Ok(None),
        UnaryOp::Neg => return e.unary(UnaryOp::Neg, ct).map(Some),
        UnaryOp::Log => return e.div(ct, x).map(Some),
        UnaryOp::Exp => y,
        UnaryOp::Abs => {
            let zeros = e.zeros_like(x)?;
            let pos = e.compare(CompareOp::Gt, x, zeros)?;
            let neg = e.compare(CompareOp::Lt, x, zeros)?;
            let (pos, neg) = (e.mask_like(pos, x)?, e.mask_like(neg, x)?);
            e.sub(pos, neg)?
        }
        // 1 / (2 sqrt(x))
        UnaryOp::Sqrt => {
            let half = e.scale(ct, 0.5)?;
            return e.div(half, y).map(Some);
        }
        // -x^(-3/2) / 2 = -y / (2x)
        UnaryOp::Rsqrt => {
            let q = e.div(y, x)?;
            e.scale(q, -0.5)?
        }
        UnaryOp::Tanh => {
            let sq = e.mul(y, y)?;
            e.rsub(1.0, sq)?
        }
        UnaryOp::Logistic => {
            let rest = e.rsub(1.0, y)?;
            e.mul(y, rest)?
        }
        UnaryOp::Sin => e.unary(UnaryOp::Cos, x)?,
        UnaryOp::Cos => {
            let sin = e.unary(UnaryOp::Sin, x)?;
            e.unary(UnaryOp::Neg, sin)?
        }
        // 2/sqrt(pi) e^(-x^2)
        UnaryOp::Erf => {
            let sq = e.mul(x, x)?;
            let minus_sq = e.unary(UnaryOp::Neg, sq)?;
            let g = e.unary(UnaryOp::Exp, minus_sq)?;
            e.scale(g, std::f32::consts::FRAC_2_SQRT_PI)?
        }
    };
    e.mul(ct, dy_dx).map(Some)
}

/// Elementwise ops of two operands `a`, `b` with result `y`; the cotangent of operand `i`.
fn binary(
    e: &mut Appender<'_>,
    op: BinaryOp,
    a: ValueId,
    b: ValueId,
    y: ValueId,
    ct: ValueId,
    i: usize,
) -> Result<Option<ValueId>> {
    let (this, other) = if i == 0 { (a, b) } else { (b, a) };
    let ct = match (op, i) {
        (BinaryOp::And | BinaryOp::Or, _) => return Ok(None),
        (BinaryOp::Add, _) | (BinaryOp::Sub, 0) => ct,
        (BinaryOp::Sub, _) => e.unary(UnaryOp::Neg, ct)?,
        (BinaryOp::Mul, _) => e.mul(ct, other)?,
        (BinaryOp::Div, 0) => e.div(ct, b)?,
        // d(a/b)/db = -(a/b)/b
        (BinaryOp::Div, _) => {
            let q = e.div(y, b)?;
            let t = e.mul(ct, q)?;
            e.unary(UnaryOp::Neg, t)?
        }
        (BinaryOp::Max | BinaryOp::Min, _) => tie_share(e, this, other, y, ct)?,
        (BinaryOp::Rem, 0) => ct,
        // y = a - b trunc(a/b): d/db = -trunc(a/b), the integer (a - y) / b rounded.
        (BinaryOp::Rem, _) => {
            let multiple = e.sub(a, y)?;
            let q = e.div(multiple, b)?;
            let n = e.unary(UnaryOp::Round, q)?;
            let t = e.mul(ct, n)?;
            e.unary(UnaryOp::Neg, t)?
        }
        // b a^(b-1), 0 where b = 0.
        (BinaryOp::Pow, 0) => {
            let ones = e.full(&e.shape(b), e.ty(b).dtype, 1.0)?;
            let b_minus_1 = e.sub(b, ones)?;
            let p = e.binary(BinaryOp::Pow, a, b_minus_1)?;
            let d = e.mul(b, p)?;
            let t = e.mul(ct, d)?;
            zero_where(e, b, t)?
        }
        // a^b log(a), 0 where a = 0.
        (BinaryOp::Pow, _) => {
            let log_a = e.unary(UnaryOp::Log, a)?;
            let d = e.mul(y, log_a)?;
            let t = e.mul(ct, d)?;
            zero_where(e, a, t)?
        }
    };
    Ok(Some(ct))
}

/// `t` with zeros where `v == 0`.
fn zero_where(e: &mut Appender<'_>, v: ValueId, t: ValueId) -> Result<ValueId> {
    let zeros = e.zeros_like(v)?;
    let is_zero = e.compare(CompareOp::Eq, v, zeros)?;
    e.select(is_zero, zeros, t)
}

/// `maximum`/`minimum`: `this` gets `ct` where it equals the result `y`, half of it
/// where `other` equals `y` too (a tie), nothing elsewhere.
fn tie_share(
    e: &mut Appender<'_>,
    this: ValueId,
    other: ValueId,
    y: ValueId,
    ct: ValueId,
) -> Result<ValueId> {
    let chosen = e.compare(CompareOp::Eq, this, y)?;
    let tie = e.compare(CompareOp::Eq, other, y)?;
    let half = e.scale(ct, 0.5)?;
    let share = e.select(tie, half, ct)?;
    let zeros = e.zeros_like(ct)?;
    e.select(chosen, share, zeros)
}

/// The cotangent of `x` for `y = cumprod(x)` along `dim` (size `n`), without dividing
/// by `x` (exact where elements are 0): `dx_j = sum_k [k >= j] ct_k prod_{i <= k, i != j}
/// x_i` (reversed: `k <= j`, `i >= k`). A new dim `j` is inserted before `dim`; `x`
/// broadcast along it with its diagonal `i == j` set to 1 is scanned along `dim` (now
/// `k`), multiplied by the cotangent, masked to `k >= j` and summed over `k`. Costs
/// `n` times the memory and work of the forward scan: `O(n^2)` per lane.
fn cumprod(
    e: &mut Appender<'_>,
    dim: usize,
    reverse: bool,
    x: ValueId,
    ct: ValueId,
) -> Result<ValueId> {
    let shape = e.shape(x);
    let n = shape[dim];
    let mut wide = shape.clone();
    wide.insert(dim, n);
    let (j, k) = (dim, dim + 1);
    let spread: Vec<usize> = (0..wide.len()).filter(|&d| d != j).collect();
    let iota = |e: &mut Appender<'_>, d: usize| {
        let op = Op::Iota {
            shape: wide.clone(),
            dim: d,
            dtype: DType::I32,
        };
        e.push(op, &[])
    };
    let (jj, kk) = (iota(e, j)?, iota(e, k)?);
    let diagonal = e.compare(CompareOp::Eq, jj, kk)?;
    let xs = e.broadcast(x, &wide, &spread)?;
    let ones = e.full(&wide, e.ty(x).dtype, 1.0)?;
    let others = e.select(diagonal, ones, xs)?;
    let products = e.push(
        Op::Cumulative {
            kind: CumulativeKind::Prod,
            dim: k,
            reverse,
        },
        &[others],
    )?;
    let cts = e.broadcast(ct, &wide, &spread)?;
    let terms = e.mul(products, cts)?;
    let reaches = if reverse {
        CompareOp::Le
    } else {
        CompareOp::Ge
    };
    let reaches = e.compare(reaches, kk, jj)?;
    let zeros = e.zeros_like(terms)?;
    let terms = e.select(reaches, terms, zeros)?;
    e.reduce_sum(terms, &[k])
}

/// `reduce` of `x` over `dims` to `y`.
fn reduce(
    e: &mut Appender<'_>,
    kind: ReduceKind,
    dims: &[usize],
    x: ValueId,
    y: ValueId,
    ct: ValueId,
) -> Result<ValueId> {
    let x_shape = e.shape(x);
    let kept: Vec<usize> = (0..x_shape.len()).filter(|d| !dims.contains(d)).collect();
    match kind {
        ReduceKind::Sum => e.broadcast(ct, &x_shape, &kept),
        // The positions equal to the result share its cotangent equally.
        ReduceKind::Max | ReduceKind::Min => {
            let y_b = e.broadcast(y, &x_shape, &kept)?;
            let chosen = e.compare(CompareOp::Eq, x, y_b)?;
            let mask = e.mask_like(chosen, x)?;
            let count = e.reduce_sum(mask, dims)?;
            let share = e.div(ct, count)?;
            let share = e.broadcast(share, &x_shape, &kept)?;
            e.mul(mask, share)
        }
    }
}

/// `reduce_window` of `x` to `y`, built from slices and pads, one window offset `k` at
/// a time (windows are small): the padded-operand elements that every window sees at
/// offset `k` form a strided slice, and a pad with interior `stride - 1` (negative
/// edges cropping the padding) scatters a result-shaped value back onto them. Sum:
/// every offset gets the whole cotangent. Max/min: offset `k` gets it where its
/// element equals the result and no earlier offset took it. With base dilation, the
/// same for the undilated window over `x` spread with the identity in the holes (XLA's
/// definition; max/min compare with the spread operand, a sum needs only its shape),
/// and the spread operand's cotangent strided back onto `x`.
fn reduce_window(
    e: &mut Appender<'_>,
    kind: ReduceKind,
    window: &[WindowDim],
    x: ValueId,
    y: ValueId,
    ct: ValueId,
) -> Result<ValueId> {
    let rank = window.len();
    let identity = match kind {
        ReduceKind::Sum => 0.0,
        ReduceKind::Max => f32::NEG_INFINITY,
        ReduceKind::Min => f32::INFINITY,
    };
    let dilation: Vec<usize> = window.iter().map(|w| w.base_dilation).collect();
    let undilated: Vec<WindowDim> = (window.iter())
        .map(|w| WindowDim {
            base_dilation: 1,
            ..*w
        })
        .collect();
    let spread_shape: Vec<usize> = (e.shape(x).iter().zip(&dilation))
        .map(|(&n, &b)| n.saturating_sub(1) * b + usize::from(n > 0))
        .collect();
    // The (spread) operand padded with the identity, for max/min's comparisons.
    let padded = match kind {
        ReduceKind::Sum => None,
        ReduceKind::Max | ReduceKind::Min => {
            let low = window.iter().map(|w| w.padding_low).collect();
            let high = window.iter().map(|w| w.padding_high).collect();
            let interior = dilation.iter().map(|&b| b - 1).collect();
            Some(e.pad(x, identity, low, high, interior)?)
        }
    };
    let spread_ct = reduce_window_ct(e, &undilated, &spread_shape, padded, y, ct)?;
    if dilation.iter().all(|&b| b == 1) {
        return Ok(spread_ct);
    }
    e.slice(spread_ct, vec![0; rank], spread_shape, dilation)
}

/// The cotangent of an undilated `reduce_window`'s operand of `x_shape` (see
/// [`reduce_window`]): `padded` is the operand padded with the identity for max/min,
/// `None` for a sum.
fn reduce_window_ct(
    e: &mut Appender<'_>,
    window: &[WindowDim],
    x_shape: &[usize],
    padded: Option<ValueId>,
    y: ValueId,
    ct: ValueId,
) -> Result<ValueId> {
    let y_shape = e.shape(y);
    let rank = x_shape.len();
    let count: usize = window.iter().map(|w| w.size).product();
    let mut taken = None;
    let mut total = None;
    for i in 0..count {
        // Offset `i` of the window, row-major, in padded-operand elements.
        let mut offset = vec![0; rank];
        let mut rest = i;
        for d in (0..rank).rev() {
            offset[d] = (rest % window[d].size) * window[d].window_dilation;
            rest /= window[d].size;
        }
        let part = match padded {
            None => ct,
            Some(padded) => {
                let limit = (0..rank)
                    .map(|d| offset[d] + (y_shape[d] - 1) * window[d].stride + 1)
                    .collect();
                let stride = window.iter().map(|w| w.stride).collect();
                let seen = e.slice(padded, offset.clone(), limit, stride)?;
                let mut hit = e.compare(CompareOp::Eq, seen, y)?;
                if let Some(t) = taken {
                    let free = e.unary(UnaryOp::Not, t)?;
                    hit = e.binary(BinaryOp::And, hit, free)?;
                }
                // The last offset's mask is not needed: no offset comes after it.
                if i + 1 < count {
                    taken = Some(match taken {
                        Some(t) => e.binary(BinaryOp::Or, t, hit)?,
                        None => hit,
                    });
                }
                let zeros = e.zeros_like(ct)?;
                e.select(hit, ct, zeros)?
            }
        };
        // Result element `j` saw operand element `j * stride + offset - padding_low`.
        let low: Vec<i64> = (0..rank)
            .map(|d| offset[d] as i64 - window[d].padding_low)
            .collect();
        let high = (0..rank)
            .map(|d| {
                let last = low[d] + ((y_shape[d] - 1) * window[d].stride) as i64;
                x_shape[d] as i64 - 1 - last
            })
            .collect();
        let interior = window.iter().map(|w| w.stride - 1).collect();
        let scattered = e.pad(part, 0.0, low, high, interior)?;
        total = Some(match total {
            Some(t) => e.add(t, scattered)?,
            None => scattered,
        });
    }
    match total {
        Some(t) => Ok(t),
        // A window has at least one element; an empty sum of cotangents is zero.
        None => {
            let dtype = e.ty(ct).dtype;
            e.full(x_shape, dtype, 0.0)
        }
    }
}

/// `dot_general(lhs, rhs)`: the cotangent of operand `i` (0: lhs) is the product of the
/// result's cotangent with the other operand, contracting the other operand's free dims,
/// then transposed back to the operand's dim order.
fn dot_general(
    e: &mut Appender<'_>,
    dd: &DotDims,
    lhs: ValueId,
    rhs: ValueId,
    ct: ValueId,
    i: usize,
) -> Result<ValueId> {
    let nb = dd.lhs_batch.len();
    let lhs_free: Vec<usize> = dd.lhs_free(e.ty(lhs).rank()).collect();
    let rhs_free: Vec<usize> = dd.rhs_free(e.ty(rhs).rank()).collect();
    // The result's dims: batch, lhs free, rhs free.
    let lhs_free_at = nb..nb + lhs_free.len();
    let rhs_free_at = lhs_free_at.end..lhs_free_at.end + rhs_free.len();
    // `a` is the operand whose cotangent we want, `b` the other one.
    let (b, a_batch, a_free, a_con, b_batch, b_free, b_con, b_free_at) = if i == 0 {
        let (a_batch, a_con) = (&dd.lhs_batch, &dd.lhs_contracting);
        let (b_batch, b_con) = (&dd.rhs_batch, &dd.rhs_contracting);
        (
            rhs,
            a_batch,
            lhs_free,
            a_con,
            b_batch,
            rhs_free,
            b_con,
            rhs_free_at,
        )
    } else {
        let (a_batch, a_con) = (&dd.rhs_batch, &dd.rhs_contracting);
        let (b_batch, b_con) = (&dd.lhs_batch, &dd.lhs_contracting);
        (
            lhs,
            a_batch,
            rhs_free,
            a_con,
            b_batch,
            lhs_free,
            b_con,
            lhs_free_at,
        )
    };
    let dims = DotDims {
        lhs_batch: (0..nb).collect(),
        rhs_batch: b_batch.clone(),
        lhs_contracting: b_free_at.collect(),
        rhs_contracting: b_free,
    };
    let product = e.dot_general(ct, b, dims)?;
    // The product's dims: batch, `a`'s free dims, then `b`'s contracting dims in
    // increasing order, each standing for the `a` dim it was contracted with.
    let mut by_b_dim: Vec<usize> = (0..a_con.len()).collect();
    by_b_dim.sort_by_key(|&c| b_con[c]);
    let a_dim_of_product: Vec<usize> = a_batch
        .iter()
        .chain(&a_free)
        .copied()
        .chain(by_b_dim.iter().map(|&c| a_con[c]))
        .collect();
    e.transpose(product, &inverse(&a_dim_of_product))
}

/// `pad(x, value)`: the cotangent of `x` is the slice of the result's cotangent at the
/// operand's positions; positions a negative edge cut off get zeros.
fn pad_operand(
    e: &mut Appender<'_>,
    x: ValueId,
    ct: ValueId,
    low: &[i64],
    high: &[i64],
    interior: &[usize],
) -> Result<ValueId> {
    let cut = |p: &i64| (-p).max(0);
    let restored = if low.iter().chain(high).any(|&p| p < 0) {
        let rank = low.len();
        let low = low.iter().map(cut).collect();
        let high = high.iter().map(cut).collect();
        e.pad(ct, 0.0, low, high, vec![0; rank])?
    } else {
        ct
    };
    let x_shape = e.shape(x);
    let start: Vec<usize> = low.iter().map(|&p| p.max(0) as usize).collect();
    let limit = (0..x_shape.len())
        .map(|d| match x_shape[d] {
            0 => start[d],
            n => start[d] + (n - 1) * (interior[d] + 1) + 1,
        })
        .collect();
    let stride = interior.iter().map(|&s| s + 1).collect();
    e.slice(restored, start, limit, stride)
}

/// Size of `n` elements with `dilation - 1` holes between neighbours.
fn dilated(n: usize, dilation: usize) -> i64 {
    ((n.max(1) - 1) * dilation + 1) as i64
}

/// `t` (dims `major`, `minor`, then `spatial`) arranged for a transposed convolution in
/// which the two swap roles: returns the tensor and the dims that now play `major`'s
/// and `minor`'s parts, and the spatial dims. With `groups > 1`, `major` (of size
/// `groups * inner`, groups major) loses the group count to `minor`: `t` is
/// transposed and reshaped to `[inner, groups * minor, spatial..]` (JAX's
/// `_reshape_axis_out_of` then `_reshape_axis_into`).
fn move_groups(
    e: &mut Appender<'_>,
    t: ValueId,
    [major, minor]: [usize; 2],
    spatial: &[usize],
    groups: usize,
) -> Result<(ValueId, usize, usize, Vec<usize>)> {
    if groups == 1 {
        return Ok((t, major, minor, spatial.to_vec()));
    }
    let order = [&[major, minor][..], spatial].concat();
    let t = e.transpose(t, &order)?;
    let shape = e.shape(t);
    let inner = shape[0] / groups;
    let split = [&[groups, inner][..], &shape[1..]].concat();
    let t = e.reshape(t, &split)?;
    let mut perm: Vec<usize> = (0..split.len()).collect();
    perm[..3].copy_from_slice(&[1, 0, 2]);
    let t = e.transpose(t, &perm)?;
    let merged = [&[inner, groups * shape[1]][..], &shape[2..]].concat();
    let t = e.reshape(t, &merged)?;
    Ok((t, 0, 1, (2..order.len()).collect()))
}

/// Spatial dim `i` of a convolution of `x` by `kernel` into `y`, each dilated as the
/// window says: the input by the lhs dilation, the kernel by the rhs dilation, the
/// output by the stride.
fn dilated_sizes(
    e: &Appender<'_>,
    config: &ConvConfig,
    [x, kernel, y]: [ValueId; 3],
    i: usize,
) -> [i64; 3] {
    let (dn, w) = (&config.dims, &config.window[i]);
    [
        dilated(e.ty(x).shape[dn.input_spatial[i]], w.base_dilation),
        dilated(e.ty(kernel).shape[dn.kernel_spatial[i]], w.window_dilation),
        dilated(e.ty(y).shape[dn.output_spatial[i]], w.stride),
    ]
}

/// The cotangent of a convolution's input `x`: the result's cotangent convolved with the
/// spatially reversed kernel, in and out features swapped. With batch groups, that is a
/// convolution with as many feature groups whose features (group major) are then moved
/// into the batch (JAX's `_conv_general_dilated_transpose_lhs`).
fn conv_input_cotangent(
    e: &mut Appender<'_>,
    config: &ConvConfig,
    x: ValueId,
    kernel: ValueId,
    ct: ValueId,
) -> Result<ValueId> {
    let dn = &config.dims;
    let batch_groups = config.batch_group_count;
    let groups = config.feature_group_count * batch_groups;
    // The kernel's out features become its in features; with groups, the group count
    // moves from the out features into the in features.
    let major_minor = [dn.kernel_output_feature, dn.kernel_input_feature];
    let (t, kernel_input_feature, kernel_output_feature, kernel_spatial) =
        move_groups(e, kernel, major_minor, &dn.kernel_spatial, groups)?;
    let mut reversed = kernel_spatial.clone();
    reversed.sort_unstable();
    let flipped = e.reverse(t, &reversed)?;
    let window = (config.window.iter().enumerate())
        .map(|(i, w)| {
            let [n, k, out] = dilated_sizes(e, config, [x, kernel, ct], i);
            let low = k - w.padding_low - 1;
            // The flipped kernel is the same size: the window keeps its size.
            WindowDim::new(w.size, w.base_dilation, (low, n + k - 1 - out - low))
                .with_base_dilation(w.stride)
                .with_window_dilation(w.window_dilation)
        })
        .collect();
    let dims = ConvDimensionNumbers {
        input_batch: dn.output_batch,
        input_feature: dn.output_feature,
        input_spatial: dn.output_spatial.clone(),
        kernel_input_feature,
        kernel_output_feature,
        kernel_spatial,
        output_batch: dn.input_batch,
        output_feature: dn.input_feature,
        output_spatial: dn.input_spatial.clone(),
    };
    let transposed = ConvConfig {
        dims,
        window,
        feature_group_count: groups,
        batch_group_count: 1,
    };
    let dx = e.convolution(ct, flipped, transposed)?;
    if batch_groups == 1 {
        return Ok(dx);
    }
    // [features (group major), batch, spatial..] -> [features / groups, groups * batch,
    // spatial..], then back to the input's dim order.
    let major_minor = [dn.input_feature, dn.input_batch];
    let (dx, ..) = move_groups(e, dx, major_minor, &dn.input_spatial, batch_groups)?;
    let mut order = vec![0; dn.input_spatial.len() + 2];
    order[dn.input_batch] = 1;
    for (i, &d) in dn.input_spatial.iter().enumerate() {
        order[d] = i + 2;
    }
    e.transpose(dx, &order)
}

/// The cotangent of a convolution's kernel: the input, batch and feature swapped,
/// convolved with the result's cotangent as kernel; feature groups become batch groups
/// and batch groups feature groups (JAX's `_conv_general_dilated_transpose_rhs`): a
/// feature group's input features are the swapped input's batch group.
fn conv_kernel_cotangent(
    e: &mut Appender<'_>,
    config: &ConvConfig,
    x: ValueId,
    kernel: ValueId,
    ct: ValueId,
) -> Result<ValueId> {
    let dn = &config.dims;
    let window = (config.window.iter().enumerate())
        .map(|(i, w)| {
            let [n, k, out] = dilated_sizes(e, config, [x, kernel, ct], i);
            // The result's cotangent is the kernel: the window is its spatial dim.
            let size = e.ty(ct).shape[dn.output_spatial[i]];
            let high = out - n + k - w.padding_low - 1;
            WindowDim::new(size, w.window_dilation, (w.padding_low, high))
                .with_base_dilation(w.base_dilation)
                .with_window_dilation(w.stride)
        })
        .collect();
    let dims = ConvDimensionNumbers {
        input_batch: dn.input_feature,
        input_feature: dn.input_batch,
        input_spatial: dn.input_spatial.clone(),
        kernel_input_feature: dn.output_batch,
        kernel_output_feature: dn.output_feature,
        kernel_spatial: dn.output_spatial.clone(),
        output_batch: dn.kernel_input_feature,
        output_feature: dn.kernel_output_feature,
        output_spatial: dn.kernel_spatial.clone(),
    };
    let config = ConvConfig {
        dims,
        window,
        feature_group_count: config.batch_group_count,
        batch_group_count: config.feature_group_count,
    };
    e.convolution(x, ct, config)
}
