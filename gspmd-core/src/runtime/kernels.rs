//! Local kernels: one function per primitive-op family, computing an op on whole host
//! arrays ([`Literal`]s). The reference interpreter runs every node through [`eval`];
//! the per-device runtime reuses it on local shards.
//!
//! Semantics are XLA's, as fixed by the shape rules in [`crate::ir::infer_type`]:
//! integer arithmetic wraps, integer division truncates toward zero (`x / 0 = -1`),
//! `maximum`/`minimum` propagate NaN, `convert` from f32 to i32 truncates toward zero
//! (saturating; NaN gives 0), to bool gives `x != 0`, and bool converts to 0/1.
//!
//! Every result is in standard (row-major, contiguous) layout.

mod blocked_product;
mod contraction;
mod convolution;
pub mod elementary;
mod elementwise;
mod indexing;
mod movement;
mod narrow;
mod random;
mod reduce;
mod small_product;
mod tiles;

use std::borrow::Cow;

use super::buffers::{self, Pooled};
use smallvec::SmallVec;

/// The dims (a shape, strides in elements) of a kernel's per-call layout: inline up to
/// rank 6, so a call allocates only its result.
pub(crate) type Dims = SmallVec<[usize; 6]>;

#[cfg(test)]
pub(crate) use contraction::tests::without_avx512;
pub(crate) use contraction::{
    accumulate as dot_general_accumulate, adds_in_place as dot_adds_in_place,
    scratch_bytes as dot_scratch_bytes,
};
pub(crate) use convolution::scratch_bytes as convolution_scratch;
pub(crate) use elementwise::{
    WithBinary, WithCompare, WithUnary, compare_fn, f32_arith, f32_binary, f32_unary, map_strides,
    max_nan, min_nan, row_major,
};
use ndarray::{Array1, ArrayD, Axis, IxDyn, Slice};
pub(crate) use reduce::{Lanes, body_len, fold_rows_into};

use crate::ir::{
    CumulativeKind, DType, Element, Literal, Op, ReduceKind, TensorType, WindowDim, by_element,
    infer_type, map_literal, with_literal,
};

/// Applies a dtype-generic array expression to two numeric literals of one dtype: in
/// `$body`, `$a` and `$b` bind their `ArrayD<T>`s (f32 or i32); other dtypes are `Err`.
macro_rules! numeric_pair {
    ($x:expr, $y:expr, ($a:ident, $b:ident) => $body:expr) => {
        match ($x, $y) {
            (Literal::F32($a), Literal::F32($b)) => Literal::F32($body),
            (Literal::I32($a), Literal::I32($b)) => Literal::I32($body),
            (x, y) => {
                return Err(format!(
                    "operands {} and {} must share a numeric dtype",
                    type_of(x),
                    type_of(y)
                ));
            }
        }
    };
}

/// Computes `op` on `operands`, whose result must have type `result`.
///
/// The operand types are checked against the op's shape rules first, so a call that
/// does not fit returns `Err` rather than panicking. `Op::Parameter` is not a kernel
/// (the caller binds inputs) and gives `Err`, as do ops whose semantics are undefined
/// for the dtype (`exp` of an i32, ...). The message names what is wrong; the caller
/// adds the value, op and location.
pub fn eval(op: &Op, operands: &[&Literal], result: &TensorType) -> Result<Literal, String> {
    let types: Vec<TensorType> = operands.iter().map(|l| type_of(l)).collect();
    let type_refs: Vec<&TensorType> = types.iter().collect();
    let expected = infer_type(op, &type_refs)?;
    if expected != *result {
        return Err(format!(
            "operands give {expected} but the node's type is {result}"
        ));
    }
    let operands = operands.iter().map(|&o| Operand::Value(Cow::Borrowed(o)));
    eval_typed(op, &mut operands.collect(), result)
}

/// How many operands of one node [`Operands`] holds inline: a fused loop's leaves
/// included (the AdamW update's twelve with its scalars). A list that spills allocates
/// and copies on every call.
pub(crate) const INLINE_OPERANDS: usize = 16;

/// The operands of one node, inline up to [`INLINE_OPERANDS`] (no allocation per op).
pub(crate) type Operands<'a> = SmallVec<[Operand<'a>; INLINE_OPERANDS]>;

/// The `N` operands of a node of arity `N`, drained from `operands`; `None` for any
/// other number.
fn exactly<'a, const N: usize>(operands: &mut Operands<'a>) -> Option<[Operand<'a>; N]> {
    if operands.len() != N {
        return None;
    }
    // Drained in place: the inline operands are not moved into an iterator first.
    let mut it = operands.drain(..);
    // `N` elements: every call of the closure finds one.
    Some(std::array::from_fn(|_| {
        it.next().expect("the length was checked")
    }))
}

/// An operand as the evaluation loop passes it to [`eval_typed`].
#[derive(Debug)]
pub(crate) enum Operand<'a> {
    /// A value, lent or handed over (then free to overwrite).
    Value(Cow<'a, Literal>),
    /// The `broadcast_in_dim` of `source` (standard layout, fitting `shape` and
    /// `dims`), not materialised: elementwise kernels read it as a strided view.
    Broadcast {
        /// The broadcast's operand.
        source: &'a Literal,
        /// The result shape.
        shape: &'a [usize],
        /// The result dim of each operand dim.
        dims: &'a [usize],
    },
}

impl<'a> Operand<'a> {
    /// The operand's dtype.
    pub(crate) fn dtype(&self) -> DType {
        match self {
            Operand::Value(v) => v.dtype(),
            Operand::Broadcast { source, .. } => source.dtype(),
        }
    }

    /// The value of an operand handed over, moved out with an empty array (no
    /// allocation) left in its place, for the caller to overwrite or drop; `None` for
    /// the others.
    pub(crate) fn take_owned(&mut self) -> Option<Literal> {
        match self {
            Operand::Value(Cow::Owned(lit)) => Some(std::mem::replace(
                lit,
                Literal::F32(ArrayD::default(IxDyn(&[0]))),
            )),
            _ => None,
        }
    }

    /// The operand as a literal, a broadcast materialised.
    pub(crate) fn into_value(self) -> Result<Cow<'a, Literal>, String> {
        match self {
            Operand::Value(v) => Ok(v),
            Operand::Broadcast {
                source,
                shape,
                dims,
            } => Ok(Cow::Owned(
                map_literal!(source, a => movement::broadcast_in_dim(a.view(), shape, dims)?),
            )),
        }
    }
}

/// [`eval`] without the check of the operand types, for operands known to fit: their
/// types, given to [`infer_type`] with `op`, give `result` (an execution plan checks
/// this once per program). An operand passed owned may be overwritten as the result,
/// and elementwise ops read a broadcast operand as a view (see the elementwise
/// kernels); other ops get it materialised. The kernel's result is still checked
/// against `result`.
pub(crate) fn eval_typed(
    op: &Op,
    operands: &mut Operands<'_>,
    result: &TensorType,
) -> Result<Literal, String> {
    if narrow::computes_wide(op, operands, result) {
        return narrow::eval_wide(op, operands, result);
    }
    let given = operands.len();
    let arity = |n: usize| format!("{} takes {n} operands, given {given}", op.name());
    let out = match op {
        Op::Unary(u) => {
            let [x] = exactly::<1>(operands).ok_or_else(|| arity(1))?;
            elementwise::unary(*u, x)?
        }
        Op::Binary(b) => {
            let [x, y] = exactly::<2>(operands).ok_or_else(|| arity(2))?;
            elementwise::binary(*b, x, y)?
        }
        Op::Compare(c) => {
            let [x, y] = exactly::<2>(operands).ok_or_else(|| arity(2))?;
            elementwise::compare(*c, x, y)?
        }
        Op::Select => {
            let [p, t, f] = exactly::<3>(operands).ok_or_else(|| arity(3))?;
            elementwise::select(p, t, f)?
        }
        Op::Convert(dtype) => {
            let [x] = exactly::<1>(operands).ok_or_else(|| arity(1))?;
            elementwise::convert(x.into_value()?, *dtype)
        }
        // Identities: the operand's buffer when it dies here, else a copy.
        Op::ShardingConstraint | Op::PropagationBarrier(_) => {
            let [x] = exactly::<1>(operands).ok_or_else(|| arity(1))?;
            x.into_value()?.into_owned()
        }
        Op::Reshape(shape) => {
            let [x] = exactly::<1>(operands).ok_or_else(|| arity(1))?;
            map_literal!(x.into_value()?.into_owned(), a => movement::reshape_owned(a, shape)?)
        }
        Op::DynamicUpdateSlice => {
            let mut values = (operands.drain(..))
                .map(Operand::into_value)
                .collect::<Result<SmallVec<[_; 8]>, String>>()?;
            if values.len() < 2 {
                return Err(format!(
                    "{} takes 2 operands or more, given {given}",
                    op.name()
                ));
            }
            let x = values.remove(0);
            let update = values[0].as_ref();
            let starts: SmallVec<[&Literal; 6]> = values[1..].iter().map(AsRef::as_ref).collect();
            let starts = dynamic_starts(&x, &starts, &shape_of(update))?;
            dynamic_update_slice(x, update, &starts)?
        }
        _ => {
            let values = operands
                .drain(..)
                .map(Operand::into_value)
                .collect::<Result<SmallVec<[_; 4]>, String>>()?;
            let refs: SmallVec<[&Literal; 4]> = values.iter().map(AsRef::as_ref).collect();
            let out = compute_borrowed(op, &refs, result)?;
            drop(refs);
            // Operands handed over and read by reference die here: to the pool.
            values.into_iter().for_each(super::buffers::release_operand);
            out
        }
    };
    let out = standard_layout(out);
    if !has_type(&out, result) {
        let got = type_of(&out);
        return Err(format!("kernel produced {got}, expected {result}"));
    }
    Ok(out)
}

/// The kernels that read their operands by reference (see [`eval_typed`]).
fn compute_borrowed(
    op: &Op,
    operands: &[&Literal],
    result: &TensorType,
) -> Result<Literal, String> {
    let out = match op {
        Op::Parameter { index, .. } => {
            return Err(format!(
                "parameter {index} is bound to an input, not evaluated"
            ));
        }
        Op::Constant(lit) => lit.clone(),
        Op::Iota { shape, dim, dtype } => iota(shape, *dim, *dtype)?,
        Op::RandomBits {
            shape,
            strides,
            output,
        } => random::random_bits(operands[0], operands[1], shape, strides, *output)?,
        Op::Broadcast { shape, dims } => {
            map_literal!(operands[0], a => movement::broadcast_in_dim(a.view(), shape, dims)?)
        }
        Op::Transpose(perm) => map_literal!(operands[0], a => movement::transpose(a, perm)),
        Op::Reduce { kind, dims } => reduce::reduce(*kind, operands[0], dims)?,
        Op::DotGeneral(dd) => {
            numeric_pair!(operands[0], operands[1], (a, b) => contraction::dot_general(dd, a, b, &result.shape)?)
        }
        Op::Slice {
            start,
            limit,
            stride,
        } => map_literal!(operands[0], a => movement::slice(a, start, limit, stride)),
        Op::Pad {
            low,
            high,
            interior,
        } => pad(operands[0], operands[1], low, high, interior)?,
        Op::Concatenate(dim) => concatenate(operands, *dim)?,
        Op::ReduceWindow { kind, window } => {
            reduce_window(*kind, operands[0], window, &result.shape)?
        }
        Op::Convolution(config) => {
            numeric_pair!(operands[0], operands[1], (x, k) => convolution::convolution(config, x, k, &result.shape)?)
        }
        Op::Gather(dims) => indexing::gather(dims, operands[0], operands[1], &result.shape)?,
        Op::Scatter { dims, kind } => {
            indexing::scatter(dims, *kind, operands[0], operands[1], operands[2])?
        }
        Op::DynamicSlice(sizes) => {
            let starts = dynamic_starts(operands[0], &operands[1..], sizes)?;
            let limit: Dims = starts.iter().zip(sizes).map(|(s, n)| s + n).collect();
            let stride: Dims = smallvec::smallvec![1; sizes.len()];
            map_literal!(operands[0], a => movement::slice(a, &starts, &limit, &stride))
        }
        Op::Cumulative { kind, dim, reverse } => cumulative(*kind, operands[0], *dim, *reverse)?,
        Op::Argsort { dim, descending } => argsort(operands[0], *dim, *descending)?,
        Op::Reverse(dims) => map_literal!(operands[0], a => movement::reverse(a, dims)),
        Op::Flow { flow, .. } => {
            return Err(format!(
                "{} has regions: the evaluation loop runs it, not a kernel",
                flow.name()
            ));
        }
        Op::AxisIndex(_)
        | Op::AllReduce { .. }
        | Op::AllGather { .. }
        | Op::ReduceScatter { .. }
        | Op::AllToAll { .. }
        | Op::CollectivePermute { .. }
        | Op::CollectiveShift { .. } => {
            return Err(format!(
                "{} needs a device mesh: it runs only in a partitioned program",
                op.name()
            ));
        }
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert(_)
        | Op::ShardingConstraint
        | Op::PropagationBarrier(_)
        | Op::Reshape(_)
        | Op::DynamicUpdateSlice => {
            return Err(format!("{} takes its operands by value", op.name()));
        }
    };
    Ok(out)
}

/// Whether `lit` has type `ty` (no allocation).
pub(crate) fn has_type(lit: &Literal, ty: &TensorType) -> bool {
    let shape = with_literal!(lit, a => a.shape());
    lit.dtype() == ty.dtype && shape == ty.shape.as_slice()
}

/// The shape of `lit` (no allocation up to rank 6).
fn shape_of(lit: &Literal) -> Dims {
    with_literal!(lit, a => Dims::from_slice(a.shape()))
}

pub(crate) fn type_of(lit: &Literal) -> TensorType {
    TensorType::new(lit.shape(), lit.dtype())
}

/// `lit` in row-major contiguous layout (copied only if it is not already).
fn standard_layout(lit: Literal) -> Literal {
    map_literal!(lit, a => movement::standard_layout(a))
}

fn not_defined(op: &Op, dtype: DType) -> String {
    format!("{} is not defined for {dtype}", op.name())
}

/// The arrays of `a` and `b`, both of dtype `T`, or `Err` naming their types.
fn same_dtype<'a, T: Element>(
    a: &'a Literal,
    b: &'a Literal,
) -> Result<(&'a ArrayD<T>, &'a ArrayD<T>), String> {
    T::array(a)
        .zip(T::array(b))
        .ok_or_else(|| types_differ(&type_of(a), &type_of(b)))
}

fn types_differ(a: &TensorType, b: &TensorType) -> String {
    format!("operands of types {a} and {b} differ in dtype")
}

// ---- generated arrays ------------------------------------------------------------------

fn iota(shape: &[usize], dim: usize, dtype: DType) -> Result<Literal, String> {
    /// `0..shape[dim]` converted by `f`, broadcast along the other dims.
    fn counting<T: Pooled>(
        shape: &[usize],
        dim: usize,
        f: fn(usize) -> T,
    ) -> Result<ArrayD<T>, String> {
        let count = Array1::from_iter((0..shape[dim]).map(f)).into_dyn();
        movement::broadcast_in_dim(count.view(), shape, &[dim])
    }
    /// `0..shape[dim]` in `T` (exact below 2^24 for f32, rounded for bf16 and f16).
    fn count_in<T: Element>(shape: &[usize], dim: usize) -> Result<Literal, String> {
        counting(shape, dim, |i| T::from_f64(i as f64)).map(T::literal)
    }
    if dtype == DType::Bool {
        return Err("iota of bool".into());
    }
    by_element!(dtype, count_in(shape, dim))
}

// ---- data movement ---------------------------------------------------------------------

/// Start indices of a `dynamic_slice`: each i32 scalar clamped so that the `sizes` block
/// fits in `x` (XLA's semantics).
fn dynamic_starts(x: &Literal, starts: &[&Literal], sizes: &[usize]) -> Result<Dims, String> {
    let shape = shape_of(x);
    starts
        .iter()
        .enumerate()
        .map(|(d, s)| {
            let v = s
                .as_i32()
                .and_then(|a| a.iter().next().copied())
                .ok_or("start index must be an i32 scalar")?;
            let max = (shape[d] - sizes[d]) as i64;
            Ok(i64::from(v).clamp(0, max) as usize)
        })
        .collect()
}

/// `x` with `update` written at `starts` (which fit): in `x`'s buffer when it is handed
/// over.
fn dynamic_update_slice(
    x: Cow<'_, Literal>,
    update: &Literal,
    starts: &[usize],
) -> Result<Literal, String> {
    fn write<T: Element>(
        out: ArrayD<T>,
        update: &Literal,
        starts: &[usize],
    ) -> Result<ArrayD<T>, String> {
        let u = T::array(update).ok_or_else(|| {
            let x = TensorType::new(out.shape().to_vec(), T::DTYPE);
            types_differ(&x, &type_of(update))
        })?;
        Ok(movement::update_slice(out, u, starts))
    }
    Ok(map_literal!(x.into_owned(), a => write(a, update, starts)?))
}

/// Inclusive scan along `dim`: element `j` is `f(element j - 1 of the scan, x_j)`,
/// from the last element down with `reverse`.
fn cumulative(
    kind: CumulativeKind,
    x: &Literal,
    dim: usize,
    reverse: bool,
) -> Result<Literal, String> {
    if dim >= x.shape().len() {
        return Err(format!("a scan along dim {dim} of {}", type_of(x)));
    }
    Ok(match (x, kind) {
        (Literal::F32(a), CumulativeKind::Sum) => Literal::F32(scan(a, dim, reverse, |p, q| p + q)),
        (Literal::F32(a), CumulativeKind::Prod) => {
            Literal::F32(scan(a, dim, reverse, |p, q| p * q))
        }
        (Literal::I32(a), CumulativeKind::Sum) => {
            Literal::I32(scan(a, dim, reverse, i32::wrapping_add))
        }
        (Literal::I32(a), CumulativeKind::Prod) => {
            Literal::I32(scan(a, dim, reverse, i32::wrapping_mul))
        }
        (x, _) => return Err(format!("cannot scan {}", type_of(x))),
    })
}

/// [`cumulative`] of `a` along `dim` (within its rank) with `f`, into a pooled buffer:
/// the lanes along `dim` are scanned side by side, a whole row of the dims after
/// `dim` at a time (`row_j = f(row_{j-1}, x_j)`, a loop the compiler vectorises), each
/// lane's elements combined in the same order as one lane at a time.
fn scan<T: Pooled>(a: &ArrayD<T>, dim: usize, reverse: bool, f: impl Fn(T, T) -> T) -> ArrayD<T> {
    let shape = a.shape();
    let inner: usize = shape[dim + 1..].iter().product();
    let block = shape[dim] * inner;
    let x = a.as_standard_layout();
    let mut out = buffers::take(x.len());
    out.copy_from_slice(x.as_slice().unwrap_or_default());
    // Each row, holding `x_j`, becomes `f(row before, x_j)`.
    let combine = |last: &[T], this: &mut [T]| {
        for (t, &l) in this.iter_mut().zip(last) {
            *t = f(l, *t);
        }
    };
    if block > 0 {
        for lanes in out.chunks_exact_mut(block) {
            let rows = lanes.chunks_exact_mut(inner);
            if reverse {
                rows.rev().reduce(|last, this| {
                    combine(last, this);
                    this
                });
            } else {
                rows.reduce(|last, this| {
                    combine(last, this);
                    this
                });
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(shape), out).expect("the buffer has the shape's length")
}

/// [`Op::Argsort`]'s order of f32s: NaN above every number and equal to NaN; `-0.0`
/// equals `0.0`.
fn total_order(a: &f32, b: &f32) -> std::cmp::Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Greater,
        (false, true) => std::cmp::Ordering::Less,
        (false, false) => a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal),
    }
}

/// The i32 indices that stably sort each lane along `dim` (see [`Op::Argsort`]).
fn argsort(x: &Literal, dim: usize, descending: bool) -> Result<Literal, String> {
    fn indices<T>(
        a: &ArrayD<T>,
        dim: usize,
        descending: bool,
        order: fn(&T, &T) -> std::cmp::Ordering,
    ) -> ArrayD<i32> {
        let mut out = ArrayD::zeros(a.raw_dim());
        let mut order_of = Vec::new();
        for (lane, mut result) in a.lanes(Axis(dim)).into_iter().zip(out.lanes_mut(Axis(dim))) {
            order_of.clear();
            order_of.extend(0..lane.len());
            // `sort_by` is stable: equal elements keep their order either way.
            order_of.sort_by(|&i, &j| match descending {
                false => order(&lane[i], &lane[j]),
                true => order(&lane[j], &lane[i]),
            });
            // The shape rule keeps the dim within i32.
            for (r, &i) in result.iter_mut().zip(&order_of) {
                *r = i as i32;
            }
        }
        out
    }
    Ok(Literal::I32(match x {
        Literal::F32(a) => indices(a, dim, descending, total_order),
        Literal::I32(a) => indices(a, dim, descending, i32::cmp),
        Literal::Bool(a) => indices(a, dim, descending, bool::cmp),
        x => return Err(format!("cannot sort {}", type_of(x))),
    }))
}

/// Edge padding (negative removes) and interior padding with the scalar `value`.
fn pad(
    x: &Literal,
    value: &Literal,
    low: &[i64],
    high: &[i64],
    interior: &[usize],
) -> Result<Literal, String> {
    fn pad_array<T: Element>(
        x: &Literal,
        value: &Literal,
        low: &[i64],
        high: &[i64],
        interior: &[usize],
    ) -> Result<Literal, String> {
        let (a, value) = same_dtype::<T>(x, value)?;
        let fill = *value.first().ok_or("padding value must be a scalar")?;
        Ok(T::literal(movement::pad(a, fill, low, high, interior)))
    }
    by_element!(x.dtype(), pad_array(x, value, low, high, interior))
}

fn concatenate(operands: &[&Literal], dim: usize) -> Result<Literal, String> {
    fn join<T: Element>(operands: &[&Literal], dim: usize) -> Result<Literal, String> {
        let views = operands
            .iter()
            .map(|l| T::array(l).map(|a| a.view()))
            .collect::<Option<Vec<_>>>()
            .ok_or("concatenate operands differ in dtype")?;
        movement::concatenate(&views, dim).map(T::literal)
    }
    let first = operands.first().ok_or("concatenate needs an operand")?;
    by_element!(first.dtype(), join(operands, dim))
}

// ---- reductions ------------------------------------------------------------------------

/// `reduce_window`: for every result position (row-major) and every window offset,
/// the operand element under it, or nothing for a padding position (the identity).
/// The window's offsets are listed once per call; the loop allocates nothing, and a
/// window wholly inside the operand is read without bounds checks. A base-dilated
/// operand is first spread into a copy with the identity in its holes.
fn reduce_window(
    kind: ReduceKind,
    x: &Literal,
    window: &[WindowDim],
    shape: &[usize],
) -> Result<Literal, String> {
    fn windows<T: Copy>(
        a: &ArrayD<T>,
        window: &[WindowDim],
        shape: &[usize],
        identity: T,
        f: impl Fn(T, T) -> T,
    ) -> Result<ArrayD<T>, String> {
        if window.iter().any(|w| w.base_dilation > 1) {
            // XLA's base dilation: the operand spread with the identity in the holes,
            // under the same window undilated.
            let spread_shape: Vec<usize> = (a.shape().iter().zip(window))
                .map(|(&n, w)| n.saturating_sub(1) * w.base_dilation + usize::from(n > 0))
                .collect();
            let mut spread = ArrayD::from_elem(IxDyn(&spread_shape), identity);
            spread
                .slice_each_axis_mut(|ax| {
                    Slice::new(0, None, window[ax.axis.index()].base_dilation as isize)
                })
                .assign(a);
            let undilated: Vec<WindowDim> = (window.iter())
                .map(|w| WindowDim {
                    base_dilation: 1,
                    ..*w
                })
                .collect();
            return windows(&spread, &undilated, shape, identity, f);
        }
        let a = a.as_standard_layout();
        let (dims, data) = (a.shape(), a.as_slice().unwrap_or_default());
        // The trailing dims the window leaves alone (size 1, stride 1, no padding: the
        // result's dims are the operand's) form runs contiguous in both: the loop goes
        // over the result positions of the other dims, each a run of `run` elements.
        let trivial = |(w, (&n, &m)): (&WindowDim, (&usize, &usize))| {
            w.size == 1 && w.stride == 1 && w.padding_low == 0 && n == m
        };
        let kept = (window.iter().zip(dims.iter().zip(shape)).rev())
            .take_while(|&d| trivial(d))
            .count();
        let rank = shape.len() - kept;
        let run: usize = dims[rank..].iter().product();
        // Row-major element strides of the operand.
        let mut strides = vec![run; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * dims[d + 1];
        }
        // Offsets from the window's start of every window element, `rank` per element,
        // row-major, and the same as linear offsets.
        let count: usize = window[..rank].iter().map(|w| w.size).product();
        let mut offsets = vec![0isize; count * rank];
        let mut linear = vec![0isize; count];
        for (i, lin) in linear.iter_mut().enumerate() {
            let mut rest = i;
            for d in (0..rank).rev() {
                let o = ((rest % window[d].size) * window[d].window_dilation) as isize;
                offsets[i * rank + d] = o;
                *lin += o * strides[d] as isize;
                rest /= window[d].size;
            }
        }
        // The window's extent per dim: a window from `start` lies in the operand when
        // `0 <= start` and `start + span <= dim`.
        let span: Vec<isize> = (window.iter())
            .map(|w| ((w.size - 1) * w.window_dilation + 1) as isize)
            .collect();
        let total: usize = shape.iter().product();
        let mut out = vec![identity; total];
        let mut start = vec![0isize; rank];
        let mut position = vec![0usize; rank];
        for acc in out.chunks_exact_mut(run.max(1)) {
            let (mut inside, mut base) = (true, 0isize);
            for d in 0..rank {
                let w = &window[d];
                start[d] = (position[d] * w.stride) as isize - w.padding_low as isize;
                inside &= start[d] >= 0 && start[d] + span[d] <= dims[d] as isize;
                base += start[d] * strides[d] as isize;
            }
            let mut combine = |at: usize| {
                for (acc, &x) in acc.iter_mut().zip(&data[at..at + run]) {
                    *acc = f(*acc, x);
                }
            };
            if inside {
                // No padding under the window: no bounds checks.
                for &o in &linear {
                    combine((base + o) as usize);
                }
            } else {
                'offsets: for o in (0..count).map(|i| &offsets[i * rank..(i + 1) * rank]) {
                    let mut at = 0;
                    for d in 0..rank {
                        let i = start[d] + o[d];
                        if i < 0 || i as usize >= dims[d] {
                            continue 'offsets;
                        }
                        at += i as usize * strides[d];
                    }
                    combine(at);
                }
            }
            // The next result position, row-major.
            for d in (0..rank).rev() {
                position[d] += 1;
                if position[d] < shape[d] {
                    break;
                }
                position[d] = 0;
            }
        }
        ArrayD::from_shape_vec(IxDyn(shape), out).map_err(|e| e.to_string())
    }
    Ok(match x {
        Literal::F32(a) => Literal::F32(match kind {
            ReduceKind::Sum => windows(a, window, shape, 0.0, |p, q| p + q)?,
            ReduceKind::Max => windows(a, window, shape, f32::NEG_INFINITY, max_nan)?,
            ReduceKind::Min => windows(a, window, shape, f32::INFINITY, min_nan)?,
        }),
        Literal::I32(a) => Literal::I32(match kind {
            ReduceKind::Sum => windows(a, window, shape, 0, i32::wrapping_add)?,
            ReduceKind::Max => windows(a, window, shape, i32::MIN, i32::max)?,
            ReduceKind::Min => windows(a, window, shape, i32::MAX, i32::min)?,
        }),
        x => return Err(format!("cannot reduce {}", type_of(x))),
    })
}

#[cfg(test)]
mod tests {
    use ndarray::{ArrayD, Axis, IxDyn};
    use proptest::prelude::*;

    use super::scan;

    /// One lane at a time, as `ndarray` scans an axis.
    fn lane_by_lane<T: Copy>(
        a: &ArrayD<T>,
        dim: usize,
        reverse: bool,
        f: impl Fn(T, T) -> T,
    ) -> ArrayD<T> {
        let mut out = a.clone();
        let mut view = out.view_mut();
        if reverse {
            view.invert_axis(Axis(dim));
        }
        view.accumulate_axis_inplace(Axis(dim), |&prev, cur| *cur = f(prev, *cur));
        out
    }

    proptest! {
        /// Row by row equals lane by lane bit for bit: f32 sums and products, i32
        /// wrapping products, over any dim, forward and reversed, in standard layout
        /// and transposed.
        #[test]
        fn a_scan_row_by_row_equals_lane_by_lane(
            shape in prop::collection::vec(0usize..5, 1..4),
            dim in 0usize..3,
            reverse: bool,
            transposed: bool,
            seed in 0u32..1000,
        ) {
            let dim = dim % shape.len();
            let n: usize = shape.iter().product();
            let value = |i: usize| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 300.0 - 1.5;
            let a = ArrayD::from_shape_vec(IxDyn(&shape), (0..n).map(value).collect())
                .expect("shape fits");
            let a = if transposed { a.reversed_axes() } else { a };
            for (got, want) in [
                (scan(&a, dim, reverse, |p, q| p + q), lane_by_lane(&a, dim, reverse, |p, q| p + q)),
                (scan(&a, dim, reverse, |p, q| p * q), lane_by_lane(&a, dim, reverse, |p, q| p * q)),
            ] {
                prop_assert_eq!(got.shape(), want.shape());
                let bits = |x: &ArrayD<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&got), bits(&want));
            }
            let ints = a.mapv(|v| (v * 1e6) as i32);
            prop_assert_eq!(
                scan(&ints, dim, reverse, i32::wrapping_mul),
                lane_by_lane(&ints, dim, reverse, i32::wrapping_mul)
            );
        }
    }
}
