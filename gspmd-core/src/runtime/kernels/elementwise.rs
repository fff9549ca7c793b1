//! Elementwise kernels: unary, binary, compare, select and convert.
//!
//! An operand passed owned ([`Cow::Owned`]: the evaluation loop passes a value so at its
//! last use) whose elements have the result's dtype is overwritten in place instead of
//! filling a new array (unary ops, binary ops, select, convert to the same dtype). Each
//! element goes through the same scalar function either way, so the results are
//! bitwise those of a fresh array.
//!
//! Every operand is read as flat memory with strides over the result shape (0 along
//! the dims a broadcast repeats; see [`Arg`]). The loop walks the result in runs
//! ([`Runs`]): the shape's dims merged wherever every operand's strides allow, so that
//! contiguous operands are one long run and a row or column broadcast gives runs of a
//! whole row; within a run an operand is a slice (stride 1) or is gathered into a
//! scratch buffer first (a repeated scalar, a strided lane), and the op runs over
//! slices, which vectorises.

use std::borrow::Cow;

use ndarray::{ArrayD, IxDyn};
use smallvec::{SmallVec, smallvec};

use super::{Dims, Operand, elementary, not_defined, type_of, types_differ};
use crate::ir::{BinaryOp, CompareOp, DType, Literal, Op, TensorType, UnaryOp, with_literal};
use crate::runtime::buffers::{self, Pooled};

/// An operand's elements over the result shape.
enum Arg<'a, T: Clone> {
    /// A value handed over, in standard layout: free to overwrite.
    Owned(ArrayD<T>),
    /// A lent value, or a broadcast's operand: element `ix` of the result shape is
    /// `data[sum(ix[d] * strides[d])]`.
    Lent { data: Cow<'a, [T]>, strides: Dims },
}

impl<T: Clone> Arg<'_, T> {
    /// The elements, in the layout [`Arg::strides`] gives.
    fn data(&self) -> &[T] {
        match self {
            Arg::Owned(a) => a.as_slice().unwrap_or(&[]),
            Arg::Lent { data, .. } => data,
        }
    }

    /// The strides over the result `shape`.
    fn strides(&self, shape: &[usize]) -> Dims {
        match self {
            Arg::Owned(_) => row_major(shape),
            Arg::Lent { strides, .. } => strides.clone(),
        }
    }
}

/// `a`'s elements in row-major order: borrowed if `a` is in standard layout.
fn flat<T: Clone>(a: &ArrayD<T>) -> Cow<'_, [T]> {
    match a.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().cloned().collect()),
    }
}

/// `a` as an operand read over its own shape.
fn lent<T: Clone>(a: &ArrayD<T>) -> Arg<'_, T> {
    Arg::Lent {
        data: flat(a),
        strides: row_major(a.shape()),
    }
}

/// `a` handed over: owned if in standard layout, else its elements copied.
fn owned<T: Clone>(a: ArrayD<T>) -> Arg<'static, T> {
    if a.is_standard_layout() {
        Arg::Owned(a)
    } else {
        let strides = row_major(a.shape());
        Arg::Lent {
            data: Cow::Owned(a.iter().cloned().collect()),
            strides,
        }
    }
}

/// `a` broadcast to `shape` along `dims` (operand dim `i` becoming result dim
/// `dims[i]`), as strides: no copy.
fn broadcast<'a, T: Clone>(
    a: &'a ArrayD<T>,
    shape: &[usize],
    dims: &[usize],
) -> Result<Arg<'a, T>, String> {
    let strides = map_strides(a.shape(), &row_major(a.shape()), shape, dims)?;
    Ok(Arg::Lent {
        data: flat(a),
        strides,
    })
}

/// An operand's elements by dtype.
enum Elems<'a> {
    F32(Arg<'a, f32>),
    I32(Arg<'a, i32>),
    Bool(Arg<'a, bool>),
}

/// The elements of `x` and the result shape it is read over: a broadcast is its
/// operand read with zero strides, never materialised.
fn elems(x: Operand<'_>) -> Result<(Elems<'_>, Dims), String> {
    let shape = match &x {
        Operand::Value(v) => with_literal!(v.as_ref(), a => Dims::from_slice(a.shape())),
        Operand::Broadcast { shape, .. } => Dims::from_slice(shape),
    };
    let e = match x {
        Operand::Value(Cow::Borrowed(Literal::F32(a))) => Elems::F32(lent(a)),
        Operand::Value(Cow::Borrowed(Literal::I32(a))) => Elems::I32(lent(a)),
        Operand::Value(Cow::Borrowed(Literal::Bool(a))) => Elems::Bool(lent(a)),
        Operand::Value(Cow::Owned(Literal::F32(a))) => Elems::F32(owned(a)),
        Operand::Value(Cow::Owned(Literal::I32(a))) => Elems::I32(owned(a)),
        Operand::Value(Cow::Owned(Literal::Bool(a))) => Elems::Bool(owned(a)),
        // `narrow` computes these in f32.
        Operand::Value(x) => return Err(format!("{} is computed in f32", type_of(&x))),
        Operand::Broadcast {
            source,
            shape,
            dims,
        } => match source {
            Literal::F32(a) => Elems::F32(broadcast(a, shape, dims)?),
            Literal::I32(a) => Elems::I32(broadcast(a, shape, dims)?),
            Literal::Bool(a) => Elems::Bool(broadcast(a, shape, dims)?),
            x => return Err(format!("{} is computed in f32", type_of(x))),
        },
    };
    Ok((e, shape))
}

/// The row-major strides of `shape`, in elements.
pub(crate) fn row_major(shape: &[usize]) -> Dims {
    let mut strides = smallvec![0; shape.len()];
    let mut stride = 1;
    for (s, &n) in strides.iter_mut().zip(shape).rev() {
        *s = stride;
        stride *= n;
    }
    strides
}

/// The strides over `to` of a value of `shape` with `strides` broadcast to `to`, its
/// dim `i` becoming dim `dims[i]` (0 along the dims that repeat it). `Err` if it does
/// not fit.
pub(crate) fn map_strides(
    shape: &[usize],
    strides: &[usize],
    to: &[usize],
    dims: &[usize],
) -> Result<Dims, String> {
    let misfit = || format!("cannot broadcast {shape:?} to {to:?} along {dims:?}");
    if dims.len() != shape.len() {
        return Err(misfit());
    }
    let mut out = smallvec![0; to.len()];
    for ((&n, &s), &d) in shape.iter().zip(strides).zip(dims) {
        match to.get(d) {
            Some(&m) if m == n && n != 1 => out[d] = s,
            Some(_) if n == 1 => {}
            _ => return Err(misfit()),
        }
    }
    Ok(out)
}

/// The longest run [`Runs`] gives: bounds the scratch buffers.
const RUN: usize = 4096;

/// The runs of an elementwise loop over a result shape read by `N` operands: the
/// shape's dims without those of size 1, adjacent dims merged wherever every operand's
/// strides allow (`stride[d] = stride[d + 1] * size[d + 1]`; the result's row-major
/// strides always do), the minor merged dim cut into runs of at most [`RUN`].
struct Runs<const N: usize> {
    /// The outer merged dims, major first: size and each operand's stride.
    outer: SmallVec<[(usize, [usize; N]); 6]>,
    /// The minor merged dim's size (0: no element).
    len: usize,
    /// Each operand's stride along the minor merged dim.
    step: [usize; N],
}

impl<const N: usize> Runs<N> {
    /// The runs over `shape` of operands with `strides` (each over `shape`).
    fn new(shape: &[usize], strides: [&[usize]; N]) -> Self {
        if shape.contains(&0) {
            return Runs {
                outer: SmallVec::new(),
                len: 0,
                step: [0; N],
            };
        }
        // Minor first while merging.
        let mut merged: SmallVec<[(usize, [usize; N]); 6]> = SmallVec::new();
        for d in (0..shape.len()).rev().filter(|&d| shape[d] != 1) {
            let s: [usize; N] = std::array::from_fn(|k| strides[k][d]);
            match merged.last_mut() {
                Some((n, inner)) if (0..N).all(|k| s[k] == inner[k] * *n) => *n *= shape[d],
                _ => merged.push((shape[d], s)),
            }
        }
        let (len, step) = match merged.first() {
            Some(&(n, s)) => (n, s),
            None => (1, [0; N]),
        };
        let outer = merged.into_iter().skip(1).rev().collect();
        Runs { outer, len, step }
    }

    /// Calls `f(out, starts, len)` for each run in row-major order: `out` is the run's
    /// first flat index of the result, `starts` each operand's offset of its first
    /// element, `len` its length.
    fn each(&self, mut f: impl FnMut(usize, [usize; N], usize)) {
        if self.len == 0 {
            return;
        }
        let mut index: Dims = smallvec![0; self.outer.len()];
        let mut base = [0; N];
        let mut out = 0;
        loop {
            let mut at = 0;
            while at < self.len {
                let len = RUN.min(self.len - at);
                f(
                    out,
                    std::array::from_fn(|k| base[k] + at * self.step[k]),
                    len,
                );
                out += len;
                at += len;
            }
            // The next row: an odometer over the outer dims.
            let mut d = self.outer.len();
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                let (n, s) = self.outer[d];
                index[d] += 1;
                if index[d] < n {
                    (0..N).for_each(|k| base[k] += s[k]);
                    break;
                }
                index[d] = 0;
                (0..N).for_each(|k| base[k] -= s[k] * (n - 1));
            }
        }
    }
}

/// Room for the runs of one operand that are not slices of its memory (see
/// [`Gathered::run`]): a pooled buffer of [`RUN`] elements, taken at the first such run
/// and given back to the pool when dropped.
struct Gathered<T: Pooled>(Vec<T>);

impl<T: Pooled> Gathered<T> {
    fn new() -> Self {
        Gathered(Vec::new())
    }

    /// The `len` elements (at most [`RUN`]) of a run from `start` with `step` in
    /// `data`: a slice when the step is 1, else gathered here.
    fn run<'s>(&'s mut self, data: &'s [T], start: usize, step: usize, len: usize) -> &'s [T] {
        if step == 1 {
            return &data[start..start + len];
        }
        if self.0.is_empty() {
            self.0 = buffers::take(RUN);
        }
        let room = &mut self.0[..len];
        if step == 0 {
            room.fill(data[start]);
        } else {
            for (k, r) in room.iter_mut().enumerate() {
                *r = data[start + k * step];
            }
        }
        room
    }
}

impl<T: Pooled> Drop for Gathered<T> {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            buffers::give_buffer(std::mem::take(&mut self.0));
        }
    }
}

/// The standard-layout array of `shape` holding `data`.
fn array<T>(shape: &[usize], data: Vec<T>) -> ArrayD<T> {
    // `data` has one element per index of `shape` (the runs cover it).
    ArrayD::from_shape_vec(IxDyn(shape), data).unwrap_or_else(|_| unreachable!())
}

/// `f` of each element of `data` read at `strides` over `shape`, in row-major order,
/// pushed onto `out` (empty, with room for them).
fn map_flat<T: Copy, R>(
    shape: &[usize],
    data: &[T],
    strides: &[usize],
    f: impl Fn(T) -> R,
    mut out: Vec<R>,
) -> Vec<R> {
    let runs = Runs::new(shape, [strides]);
    let step = runs.step[0];
    runs.each(|_, [i], len| match step {
        1 => out.extend(data[i..i + len].iter().map(|&p| f(p))),
        _ => out.extend((0..len).map(|k| f(data[i + k * step]))),
    });
    out
}

/// `f` of each element of `a` over `shape`, into a new array (on a pooled buffer).
fn map_to<T: Copy, R: Pooled>(shape: &[usize], a: &Arg<'_, T>, f: impl Fn(T) -> R) -> ArrayD<R> {
    let out = buffers::with_capacity(shape.iter().product());
    array(shape, map_flat(shape, a.data(), &a.strides(shape), f, out))
}

/// `f` of each element: in place if `a` is owned.
fn map_same<T: Pooled>(shape: &[usize], a: Arg<'_, T>, f: impl Fn(T) -> T) -> ArrayD<T> {
    match a {
        Arg::Owned(mut a) => {
            if let Some(s) = a.as_slice_mut() {
                s.iter_mut().for_each(|p| *p = f(*p));
            }
            a
        }
        a => map_to(shape, &a, f),
    }
}

/// `f(a, b)` of each pair of elements over `shape`, into a new array (on a pooled
/// buffer).
fn zip_to<A: Pooled, B: Pooled, R: Pooled>(
    shape: &[usize],
    a: &Arg<'_, A>,
    b: &Arg<'_, B>,
    f: impl Fn(A, B) -> R,
) -> ArrayD<R> {
    let (sa, sb) = (a.strides(shape), b.strides(shape));
    let runs = Runs::new(shape, [&sa, &sb]);
    let mut out = buffers::with_capacity(shape.iter().product());
    let (mut ka, mut kb) = (Gathered::new(), Gathered::new());
    runs.each(|_, [i, j], len| {
        let x = ka.run(a.data(), i, runs.step[0], len);
        let y = kb.run(b.data(), j, runs.step[1], len);
        out.extend(x.iter().zip(y).map(|(&p, &q)| f(p, q)));
    });
    array(shape, out)
}

/// `dst[k] = f(dst[k], x[k])` (`swap`: `f(x[k], dst[k])`) over `shape`, `dst` the
/// owned operand's elements, `x` read as `other`.
fn zip_into<T: Pooled>(
    shape: &[usize],
    dst: &mut [T],
    other: &Arg<'_, T>,
    swap: bool,
    f: impl Fn(T, T) -> T,
) {
    let strides = other.strides(shape);
    let runs = Runs::new(shape, [&strides]);
    let mut scratch = Gathered::new();
    runs.each(|o, [j], len| {
        let x = scratch.run(other.data(), j, runs.step[0], len);
        let d = &mut dst[o..o + len];
        if swap {
            d.iter_mut().zip(x).for_each(|(p, &q)| *p = f(q, *p));
        } else {
            d.iter_mut().zip(x).for_each(|(p, &q)| *p = f(*p, q));
        }
    });
}

/// `f(a, b)` of each pair of elements (`a` and `b` read over `shape`): in place in
/// whichever is owned.
fn zip_same<T: Pooled>(
    shape: &[usize],
    a: Arg<'_, T>,
    b: Arg<'_, T>,
    f: impl Fn(T, T) -> T,
) -> ArrayD<T> {
    match (a, b) {
        (Arg::Owned(mut a), b) => {
            zip_into(shape, a.as_slice_mut().unwrap_or(&mut []), &b, false, f);
            a
        }
        (a, Arg::Owned(mut b)) => {
            zip_into(shape, b.as_slice_mut().unwrap_or(&mut []), &a, true, f);
            b
        }
        (a, b) => zip_to(shape, &a, &b, f),
    }
}

/// Something done with the scalar function of an f32 elementwise op of one operand,
/// generic over the function so that each op compiles to its own loop (see
/// [`f32_unary`]): the kernels here and the fused loops of the execution plan apply the
/// same functions, so their results are bitwise equal.
pub(crate) trait WithUnary {
    /// What the use gives.
    type Out;
    /// Applies the use to the op's function `f`.
    fn with(self, f: impl Fn(f32) -> f32 + Copy) -> Self::Out;
}

/// [`WithUnary`] for ops of two operands (see [`f32_binary`]).
pub(crate) trait WithBinary {
    /// What the use gives.
    type Out;
    /// Applies the use to the op's function `f`.
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) -> Self::Out;
}

/// `w` applied to the f32 function of `op`; `None` if `op` has none (`not`, and
/// `is_finite`, whose result is bool).
#[inline(always)]
#[allow(clippy::redundant_closure)] // Closures inlined always: see `exp`'s arm.
pub(crate) fn f32_unary<W: WithUnary>(op: UnaryOp, w: W) -> Option<W::Out> {
    Some(match op {
        UnaryOp::Neg => w.with(|v| -v),
        UnaryOp::Abs => w.with(f32::abs),
        // The three polynomial functions go through closures inlined always (and are
        // themselves), never a function item: the fused loops' dispatch function is
        // large enough that LLVM kept `Fn::call` shims, or the functions, out of line,
        // one scalar call per element (softmax's fused loops ran 2.9x slower, GELU's
        // gradient 2.1x: benches/README.md, "Inlined transcendentals").
        UnaryOp::Exp => w.with(
            #[inline(always)]
            |v| elementary::exp(v),
        ),
        UnaryOp::Log => w.with(f32::ln),
        UnaryOp::Sqrt => w.with(f32::sqrt),
        UnaryOp::Rsqrt => w.with(|v| v.sqrt().recip()),
        UnaryOp::Tanh => w.with(
            #[inline(always)]
            |v| elementary::tanh(v),
        ),
        UnaryOp::Logistic => w.with(
            #[inline(always)]
            |v| elementary::logistic(v),
        ),
        UnaryOp::Sin => w.with(f32::sin),
        UnaryOp::Cos => w.with(f32::cos),
        UnaryOp::Erf => w.with(libm::erff),
        UnaryOp::Floor => w.with(f32::floor),
        UnaryOp::Ceil => w.with(f32::ceil),
        UnaryOp::Round => w.with(f32::round_ties_even),
        UnaryOp::Sign => w.with(sign_f32),
        UnaryOp::Not | UnaryOp::IsFinite => return None,
    })
}

/// `w` applied to the f32 function of `op`; `None` if `op` has none (`and`, `or`).
#[inline(always)]
pub(crate) fn f32_binary<W: WithBinary>(op: BinaryOp, w: W) -> Option<W::Out> {
    Some(match op {
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div => return f32_arith(op, w),
        BinaryOp::Max => w.with(max_nan),
        BinaryOp::Min => w.with(min_nan),
        BinaryOp::Pow => w.with(f32::powf),
        // Rust's `%` on floats is C's `fmod`: exact, the sign of the dividend.
        BinaryOp::Rem => w.with(|p, q| p % q),
        BinaryOp::And | BinaryOp::Or => return None,
    })
}

/// [`f32_binary`] of the four arithmetic ops (`add`, `sub`, `mul`, `div`); `None` for
/// the others. Fewer functions than [`f32_binary`], for uses instantiated once per
/// pair of ops (the fused loops' [pairs](crate::runtime::fusion)).
#[inline(always)]
pub(crate) fn f32_arith<W: WithBinary>(op: BinaryOp, w: W) -> Option<W::Out> {
    Some(match op {
        BinaryOp::Add => w.with(|p, q| p + q),
        BinaryOp::Sub => w.with(|p, q| p - q),
        BinaryOp::Mul => w.with(|p, q| p * q),
        BinaryOp::Div => w.with(|p, q| p / q),
        _ => return None,
    })
}

/// [`map_same`] over a shape as a [`WithUnary`].
struct MapSame<'a, 's>(&'s [usize], Arg<'a, f32>);

impl WithUnary for MapSame<'_, '_> {
    type Out = ArrayD<f32>;
    fn with(self, f: impl Fn(f32) -> f32 + Copy) -> ArrayD<f32> {
        map_same(self.0, self.1, f)
    }
}

/// [`zip_same`] over a shape as a [`WithBinary`].
struct ZipSame<'a, 's>(&'s [usize], Arg<'a, f32>, Arg<'a, f32>);

impl WithBinary for ZipSame<'_, '_> {
    type Out = ArrayD<f32>;
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) -> ArrayD<f32> {
        zip_same(self.0, self.1, self.2, f)
    }
}

pub(super) fn unary(op: UnaryOp, x: Operand<'_>) -> Result<Literal, String> {
    let dtype = x.dtype();
    let undefined = || not_defined(&Op::Unary(op), dtype);
    let (x, shape) = elems(x)?;
    let shape = shape.as_slice();
    Ok(match x {
        Elems::F32(a) if op == UnaryOp::IsFinite => {
            Literal::Bool(map_to(shape, &a, f32::is_finite))
        }
        Elems::F32(a) => Literal::F32(f32_unary(op, MapSame(shape, a)).ok_or_else(undefined)?),
        Elems::I32(a) => Literal::I32(match op {
            UnaryOp::Neg => map_same(shape, a, i32::wrapping_neg),
            UnaryOp::Abs => map_same(shape, a, i32::wrapping_abs),
            UnaryOp::Sign => map_same(shape, a, i32::signum),
            _ => return Err(undefined()),
        }),
        Elems::Bool(a) => Literal::Bool(match op {
            UnaryOp::Not => map_same(shape, a, |v| !v),
            _ => return Err(undefined()),
        }),
    })
}

/// IEEE maximum that propagates NaN (XLA's `maximum`).
#[inline(always)]
pub(crate) fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || a > b { a } else { b }
}

/// IEEE minimum that propagates NaN (XLA's `minimum`).
#[inline(always)]
pub(crate) fn min_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || a < b { a } else { b }
}

/// XLA's `sign`: `-1`, `1`, or the operand itself for `±0` and NaN.
#[inline(always)]
fn sign_f32(v: f32) -> f32 {
    if v == 0.0 || v.is_nan() {
        v
    } else {
        v.signum()
    }
}

/// XLA's integer division: truncates toward zero; `x / 0 = -1`; `MIN / -1 = MIN`.
fn div_i32(a: i32, b: i32) -> i32 {
    if b == 0 { -1 } else { a.wrapping_div(b) }
}

/// XLA's integer remainder, the partner of [`div_i32`]: the sign of the dividend;
/// `x % 0 = x`; `MIN % -1 = 0`.
fn rem_i32(a: i32, b: i32) -> i32 {
    if b == 0 { a } else { a.wrapping_rem(b) }
}

/// XLA's integer power: negative exponents give 0 except for bases 1 and -1.
fn pow_i32(a: i32, b: i32) -> i32 {
    match (a, b) {
        (_, 0..) => a.wrapping_pow(b.unsigned_abs()),
        (1, _) => 1,
        (-1, _) => {
            if b % 2 == 0 {
                1
            } else {
                -1
            }
        }
        _ => 0,
    }
}

pub(super) fn binary(op: BinaryOp, x: Operand<'_>, y: Operand<'_>) -> Result<Literal, String> {
    let dtype = same_dtype(&x, &y)?;
    let undefined = || not_defined(&Op::Binary(op), dtype);
    let ([a, b], shape) = same_shape([x, y])?;
    let s = shape.as_slice();
    Ok(match (a, b) {
        (Elems::F32(a), Elems::F32(b)) => {
            Literal::F32(f32_binary(op, ZipSame(s, a, b)).ok_or_else(undefined)?)
        }
        (Elems::I32(a), Elems::I32(b)) => Literal::I32(match op {
            BinaryOp::Add => zip_same(s, a, b, i32::wrapping_add),
            BinaryOp::Sub => zip_same(s, a, b, i32::wrapping_sub),
            BinaryOp::Mul => zip_same(s, a, b, i32::wrapping_mul),
            BinaryOp::Div => zip_same(s, a, b, div_i32),
            BinaryOp::Max => zip_same(s, a, b, i32::max),
            BinaryOp::Min => zip_same(s, a, b, i32::min),
            BinaryOp::Pow => zip_same(s, a, b, pow_i32),
            BinaryOp::Rem => zip_same(s, a, b, rem_i32),
            BinaryOp::And | BinaryOp::Or => return Err(undefined()),
        }),
        (Elems::Bool(a), Elems::Bool(b)) => Literal::Bool(match op {
            BinaryOp::And => zip_same(s, a, b, |p, q| p && q),
            BinaryOp::Or => zip_same(s, a, b, |p, q| p || q),
            _ => return Err(undefined()),
        }),
        // The dtypes are equal (checked above).
        _ => return Err(undefined()),
    })
}

/// [`WithBinary`] for comparisons of elements of type `T` (see [`compare_fn`]).
pub(crate) trait WithCompare<T> {
    /// What the use gives.
    type Out;
    /// Applies the use to the comparison's function `f`.
    fn with(self, f: impl Fn(T, T) -> bool + Copy) -> Self::Out;
}

/// `w` applied to the function of comparison `op` (IEEE: every comparison with a NaN
/// is false but `!=`). The kernel here and the fused loops apply the same functions.
#[inline(always)]
pub(crate) fn compare_fn<T: PartialOrd, W: WithCompare<T>>(op: CompareOp, w: W) -> W::Out {
    match op {
        CompareOp::Eq => w.with(|p, q| p == q),
        CompareOp::Ne => w.with(|p, q| p != q),
        CompareOp::Lt => w.with(|p, q| p < q),
        CompareOp::Le => w.with(|p, q| p <= q),
        CompareOp::Gt => w.with(|p, q| p > q),
        CompareOp::Ge => w.with(|p, q| p >= q),
    }
}

/// [`zip_to`] of a comparison over a shape as a [`WithCompare`].
struct CompareTo<'a, 's, T: Clone>(&'s [usize], Arg<'a, T>, Arg<'a, T>);

impl<T: Pooled + PartialOrd> WithCompare<T> for CompareTo<'_, '_, T> {
    type Out = ArrayD<bool>;
    fn with(self, f: impl Fn(T, T) -> bool + Copy) -> ArrayD<bool> {
        zip_to(self.0, &self.1, &self.2, f)
    }
}

fn compare_arrays<T: Pooled + PartialOrd>(
    op: CompareOp,
    shape: &[usize],
    a: Arg<'_, T>,
    b: Arg<'_, T>,
) -> ArrayD<bool> {
    compare_fn(op, CompareTo(shape, a, b))
}

/// The elements of the operands `xs` and the result shape they share, or `Err` if
/// their shapes differ.
fn same_shape<const N: usize>(xs: [Operand<'_>; N]) -> Result<([Elems<'_>; N], Dims), String> {
    let read = xs.map(elems);
    let mut shape: Option<&Dims> = None;
    for x in &read {
        let s = match x {
            Ok((_, s)) => s,
            Err(e) => return Err(e.clone()),
        };
        match shape {
            Some(first) if first != s => {
                return Err(format!("operand shapes {first:?} and {s:?} differ"));
            }
            Some(_) => {}
            None => shape = Some(s),
        }
    }
    let shape = shape.cloned().unwrap_or_default();
    // Every element is `Ok` (checked above).
    let mut read = read.into_iter().flatten();
    let out = std::array::from_fn(|_| read.next().expect("every operand was read").0);
    Ok((out, shape))
}

/// The dtype of `x` and `y`, or `Err` naming their types if they differ.
fn same_dtype(x: &Operand<'_>, y: &Operand<'_>) -> Result<DType, String> {
    let type_of = |x: &Operand<'_>| match x {
        Operand::Value(v) => type_of(v),
        Operand::Broadcast { source, shape, .. } => TensorType::new(shape.to_vec(), source.dtype()),
    };
    if x.dtype() == y.dtype() {
        Ok(x.dtype())
    } else {
        Err(types_differ(&type_of(x), &type_of(y)))
    }
}

pub(super) fn compare(op: CompareOp, x: Operand<'_>, y: Operand<'_>) -> Result<Literal, String> {
    let dtype = same_dtype(&x, &y)?;
    let ([a, b], shape) = same_shape([x, y])?;
    let s = shape.as_slice();
    Ok(Literal::Bool(match (a, b) {
        (Elems::F32(a), Elems::F32(b)) => compare_arrays(op, s, a, b),
        (Elems::I32(a), Elems::I32(b)) => compare_arrays(op, s, a, b),
        (Elems::Bool(a), Elems::Bool(b)) => compare_arrays(op, s, a, b),
        // The dtypes are equal (checked above).
        _ => return Err(not_defined(&Op::Compare(op), dtype)),
    }))
}

pub(super) fn select(
    pred: Operand<'_>,
    on_true: Operand<'_>,
    on_false: Operand<'_>,
) -> Result<Literal, String> {
    /// `p ? t : f` elementwise over `shape`: in place in whichever of `t` and `f` is
    /// owned.
    fn pick<T: Pooled>(
        shape: &[usize],
        p: &Arg<'_, bool>,
        t: Arg<'_, T>,
        f: Arg<'_, T>,
    ) -> ArrayD<T> {
        /// `dst[k] = x[k]` where `p[k] == keep` is false.
        fn into<T: Pooled>(
            shape: &[usize],
            p: &Arg<'_, bool>,
            keep: bool,
            dst: &mut [T],
            x: &Arg<'_, T>,
        ) {
            let (sp, sx) = (p.strides(shape), x.strides(shape));
            let runs = Runs::new(shape, [&sp, &sx]);
            let (mut kp, mut kx) = (Gathered::new(), Gathered::new());
            runs.each(|o, [i, j], len| {
                let p = kp.run(p.data(), i, runs.step[0], len);
                let x = kx.run(x.data(), j, runs.step[1], len);
                for ((d, &p), &x) in dst[o..o + len].iter_mut().zip(p).zip(x) {
                    if p != keep {
                        *d = x;
                    }
                }
            });
        }
        match (t, f) {
            (Arg::Owned(mut t), f) => {
                into(shape, p, true, t.as_slice_mut().unwrap_or(&mut []), &f);
                t
            }
            (t, Arg::Owned(mut f)) => {
                into(shape, p, false, f.as_slice_mut().unwrap_or(&mut []), &t);
                f
            }
            (t, f) => {
                let (sp, st, sf) = (p.strides(shape), t.strides(shape), f.strides(shape));
                let runs = Runs::new(shape, [&sp, &st, &sf]);
                let mut out = buffers::with_capacity(shape.iter().product());
                let (mut kp, mut kt, mut kf) = (Gathered::new(), Gathered::new(), Gathered::new());
                runs.each(|_, [i, j, k], len| {
                    let p = kp.run(p.data(), i, runs.step[0], len);
                    let t = kt.run(t.data(), j, runs.step[1], len);
                    let f = kf.run(f.data(), k, runs.step[2], len);
                    let picked = p.iter().zip(t).zip(f);
                    out.extend(picked.map(|((&p, &t), &f)| if p { t } else { f }));
                });
                array(shape, out)
            }
        }
    }
    let dtype = same_dtype(&on_true, &on_false)?;
    let ([p, t, f], shape) = same_shape([pred, on_true, on_false])?;
    let s = shape.as_slice();
    let p = match p {
        Elems::Bool(p) => p,
        Elems::F32(_) => return Err("predicate must be pred, got f32".into()),
        Elems::I32(_) => return Err("predicate must be pred, got i32".into()),
    };
    Ok(match (t, f) {
        (Elems::F32(t), Elems::F32(f)) => Literal::F32(pick(s, &p, t, f)),
        (Elems::I32(t), Elems::I32(f)) => Literal::I32(pick(s, &p, t, f)),
        (Elems::Bool(t), Elems::Bool(f)) => Literal::Bool(pick(s, &p, t, f)),
        // The dtypes are equal (checked above).
        _ => return Err(not_defined(&Op::Select, dtype)),
    })
}

/// `x` converted to `dtype` as [`Literal::convert`] converts (moved through unchanged
/// if it already has it).
pub(super) fn convert(x: Cow<'_, Literal>, dtype: DType) -> Literal {
    if x.dtype() == dtype {
        x.into_owned()
    } else {
        x.convert(dtype)
    }
}

#[cfg(test)]
mod tests {
    use ndarray::IxDyn;
    use proptest::prelude::*;
    use rand::rngs::Xoshiro256PlusPlus;
    use rand::{RngExt, SeedableRng};

    use super::*;

    /// A value of `shape` (standard layout, or permuted in memory when `permuted`)
    /// holding `elem(k)` at logical index `k`.
    fn value<T: Clone>(shape: &[usize], permuted: bool, elem: impl Fn(usize) -> T) -> ArrayD<T> {
        let n: usize = shape.iter().product();
        if !permuted || shape.len() < 2 {
            return ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(elem).collect()).unwrap();
        }
        // Stored reversed: the view reversing the axes back has the logical shape.
        let reversed: Vec<usize> = shape.iter().rev().copied().collect();
        let standard = ArrayD::from_shape_fn(IxDyn(&reversed), |ix| {
            let logical: Vec<usize> = (0..reversed.len()).rev().map(|d| ix[d]).collect();
            elem(
                row_major(shape)
                    .iter()
                    .zip(&logical)
                    .map(|(s, i)| s * i)
                    .sum(),
            )
        });
        standard.reversed_axes()
    }

    /// One operand over `shape`, as the evaluation loop may pass it: lent, handed over,
    /// either in a permuted layout, or a broadcast of a random subset of the dims.
    enum Form {
        Lent(Literal),
        Owned(Literal),
        Broadcast(Literal, Vec<usize>),
    }

    impl Form {
        fn random(
            rng: &mut Xoshiro256PlusPlus,
            shape: &[usize],
            make: &dyn Fn(&[usize], bool) -> Literal,
        ) -> Form {
            let permuted = rng.random_bool(0.3);
            match rng.random_range(0..3) {
                0 => Form::Lent(make(shape, permuted)),
                1 => Form::Owned(make(shape, permuted)),
                _ => {
                    let dims: Vec<usize> =
                        (0..shape.len()).filter(|_| rng.random_bool(0.5)).collect();
                    // A kept dim may also have size 1 (repeated along it).
                    let sizes: Vec<usize> = dims
                        .iter()
                        .map(|&d| if rng.random_bool(0.2) { 1 } else { shape[d] })
                        .collect();
                    Form::Broadcast(make(&sizes, false), dims)
                }
            }
        }

        fn operand<'a>(&'a self, shape: &'a [usize]) -> Operand<'a> {
            match self {
                Form::Lent(v) => Operand::Value(Cow::Borrowed(v)),
                Form::Owned(v) => Operand::Value(Cow::Owned(v.clone())),
                Form::Broadcast(source, dims) => Operand::Broadcast {
                    source,
                    shape,
                    dims,
                },
            }
        }

        /// The operand materialised, in logical order.
        fn materialised(&self, shape: &[usize]) -> Literal {
            self.operand(shape).into_value().unwrap().into_owned()
        }
    }

    fn f32s(shape: &[usize], permuted: bool, seed: u64) -> Literal {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let v: Vec<f32> = (0..shape.iter().product())
            .map(|_| rng.random_range(-3.0f32..3.0))
            .collect();
        Literal::F32(value(shape, permuted, |k| v[k]))
    }

    fn bools(shape: &[usize], permuted: bool, seed: u64) -> Literal {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let v: Vec<bool> = (0..shape.iter().product())
            .map(|_| rng.random_bool(0.5))
            .collect();
        Literal::Bool(value(shape, permuted, |k| v[k]))
    }

    /// The shape and the bits of each element in logical order.
    fn logical(lit: &Literal) -> (Vec<usize>, Vec<u32>) {
        (lit.shape(), lit.bit_patterns())
    }

    /// `f` of the operands' elements in logical order (the definition).
    fn reference<T: Clone, R: Clone>(
        xs: &[&Literal],
        pick: impl Fn(&Literal) -> Vec<T>,
        f: impl Fn(&[T]) -> R,
    ) -> Vec<R> {
        let columns: Vec<Vec<T>> = xs.iter().map(|x| pick(x)).collect();
        let n = columns.first().map_or(0, Vec::len);
        (0..n)
            .map(|k| f(&columns.iter().map(|c| c[k].clone()).collect::<Vec<_>>()))
            .collect()
    }

    fn elements<T: crate::ir::Element>(lit: &Literal) -> Vec<T> {
        T::array(lit).unwrap().iter().cloned().collect()
    }

    fn check(shape: Vec<usize>, seed: u64) {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let mut next = || rng.random_range(0..u64::MAX);
        let (s1, s2, s3) = (next(), next(), next());
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 1);
        let fa = Form::random(&mut rng, &shape, &|s, p| f32s(s, p, s1));
        let fb = Form::random(&mut rng, &shape, &|s, p| f32s(s, p, s2));
        let fp = Form::random(&mut rng, &shape, &|s, p| bools(s, p, s3));
        let want_shape = shape.clone();
        let (ma, mb, mp) = (
            fa.materialised(&shape),
            fb.materialised(&shape),
            fp.materialised(&shape),
        );
        let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // Binary ops in place and fresh.
        for op in [BinaryOp::Sub, BinaryOp::Div, BinaryOp::Max] {
            let got = binary(op, fa.operand(&shape), fb.operand(&shape)).unwrap();
            assert!(got.as_f32().unwrap().is_standard_layout());
            let f = |v: &[f32]| {
                let w = Literal::F32(ArrayD::from_elem(IxDyn(&[]), v[0]));
                let z = Literal::F32(ArrayD::from_elem(IxDyn(&[]), v[1]));
                super::super::eval(
                    &Op::Binary(op),
                    &[&w, &z],
                    &TensorType::new(vec![], DType::F32),
                )
                .unwrap()
                .as_f32()
                .unwrap()[IxDyn(&[])]
            };
            let want = reference(&[&ma, &mb], elements::<f32>, f);
            assert_eq!(
                logical(&got),
                (want_shape.clone(), bits(want)),
                "{op:?} {shape:?}"
            );
        }
        // Unary.
        let got = unary(UnaryOp::Exp, fa.operand(&shape)).unwrap();
        let want = reference(&[&ma], elements::<f32>, |v| elementary::exp(v[0]));
        assert_eq!(
            logical(&got),
            (want_shape.clone(), bits(want)),
            "exp {shape:?}"
        );
        // Compare.
        let got = compare(CompareOp::Lt, fa.operand(&shape), fb.operand(&shape)).unwrap();
        let want = reference(&[&ma, &mb], elements::<f32>, |v| v[0] < v[1]);
        assert_eq!(elements::<bool>(&got), want, "compare {shape:?}");
        assert_eq!(got.shape(), want_shape);
        // Select, in place in either branch and fresh.
        let got = select(fp.operand(&shape), fa.operand(&shape), fb.operand(&shape)).unwrap();
        let p = elements::<bool>(&mp);
        let (ta, tb) = (elements::<f32>(&ma), elements::<f32>(&mb));
        let want: Vec<f32> = (0..p.len())
            .map(|k| if p[k] { ta[k] } else { tb[k] })
            .collect();
        assert_eq!(logical(&got), (want_shape, bits(want)), "select {shape:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Any layout and broadcast of the operands, empty and unit dims: the runs give
        /// the elements the definition gives, bitwise.
        #[test]
        fn runs_equal_the_definition(
            shape in proptest::collection::vec(0usize..5, 0..5),
            seed in any::<u64>(),
        ) {
            check(shape, seed);
        }
    }

    /// Runs longer than [`RUN`] are cut, a scratch buffer reused across them.
    #[test]
    fn long_runs_are_cut() {
        for seed in 0..8 {
            check(vec![3, RUN + 5], seed);
            check(vec![2 * RUN + 1], seed);
        }
    }
}
