//! Elementwise kernels: unary, binary, compare, select and convert.
//!
//! An operand passed owned ([`Cow::Owned`]: the evaluation loop passes a value so at its
//! last use) whose elements have the result's dtype is overwritten in place instead of
//! filling a new array (unary ops, binary ops, select, convert to the same dtype). Each
//! element goes through the same scalar function either way, so the results are
//! bitwise those of a fresh array.

use std::borrow::Cow;

use ndarray::{ArrayD, ArrayViewD, Zip};

use super::{
    Operand, broadcast_in_dim, broadcast_view, elementary, not_defined, type_of, types_differ,
};
use crate::ir::{BinaryOp, CompareOp, DType, Literal, Op, TensorType, UnaryOp};

/// An operand's elements: owned (then free to overwrite) or a view (of a lent value,
/// or of a broadcast's operand).
enum Arg<'a, T> {
    Owned(ArrayD<T>),
    View(ArrayViewD<'a, T>),
}

impl<T> Arg<'_, T> {
    fn view(&self) -> ArrayViewD<'_, T> {
        match self {
            Arg::Owned(a) => a.view(),
            Arg::View(v) => v.view(),
        }
    }
}

/// An operand's elements by dtype.
enum Elems<'a> {
    F32(Arg<'a, f32>),
    I32(Arg<'a, i32>),
    Bool(Arg<'a, bool>),
}

/// The elements of `x`: a broadcast is a view of its operand, materialised only if
/// that operand is not in standard layout.
fn elems(x: Operand<'_>) -> Result<Elems<'_>, String> {
    fn arg<'a, T: Clone>(
        a: &'a ArrayD<T>,
        shape: &[usize],
        dims: &[usize],
    ) -> Result<Arg<'a, T>, String> {
        match broadcast_view(a, shape, dims) {
            Some(v) => Ok(Arg::View(v)),
            None => broadcast_in_dim(a.view(), shape, dims).map(Arg::Owned),
        }
    }
    Ok(match x {
        Operand::Value(Cow::Borrowed(Literal::F32(a))) => Elems::F32(Arg::View(a.view())),
        Operand::Value(Cow::Borrowed(Literal::I32(a))) => Elems::I32(Arg::View(a.view())),
        Operand::Value(Cow::Borrowed(Literal::Bool(a))) => Elems::Bool(Arg::View(a.view())),
        Operand::Value(Cow::Owned(Literal::F32(a))) => Elems::F32(Arg::Owned(a)),
        Operand::Value(Cow::Owned(Literal::I32(a))) => Elems::I32(Arg::Owned(a)),
        Operand::Value(Cow::Owned(Literal::Bool(a))) => Elems::Bool(Arg::Owned(a)),
        // `narrow` computes these in f32.
        Operand::Value(x) => return Err(format!("{} is computed in f32", type_of(&x))),
        Operand::Broadcast {
            source,
            shape,
            dims,
        } => match source {
            Literal::F32(a) => Elems::F32(arg(a, shape, dims)?),
            Literal::I32(a) => Elems::I32(arg(a, shape, dims)?),
            Literal::Bool(a) => Elems::Bool(arg(a, shape, dims)?),
            x => return Err(format!("{} is computed in f32", type_of(x))),
        },
    })
}

fn zip_with<A: Copy, B: Copy, R>(
    x: ArrayViewD<'_, A>,
    y: ArrayViewD<'_, B>,
    f: impl Fn(A, B) -> R,
) -> ArrayD<R> {
    Zip::from(x).and(y).map_collect(|&a, &b| f(a, b))
}

/// `f` of each element: in place if `a` is owned.
fn map_same<T: Copy>(a: Arg<'_, T>, f: impl Fn(T) -> T) -> ArrayD<T> {
    match a {
        Arg::Owned(mut a) => {
            a.mapv_inplace(f);
            a
        }
        Arg::View(a) => a.mapv(f),
    }
}

/// `f(a, b)` of each pair of elements (`a` and `b` of one shape): in place in whichever
/// is owned.
fn zip_same<T: Copy>(a: Arg<'_, T>, b: Arg<'_, T>, f: impl Fn(T, T) -> T) -> ArrayD<T> {
    match (a, b) {
        (Arg::Owned(mut a), b) => {
            Zip::from(&mut a)
                .and(b.view())
                .for_each(|p, &q| *p = f(*p, q));
            a
        }
        (a, Arg::Owned(mut b)) => {
            Zip::from(a.view())
                .and(&mut b)
                .for_each(|&p, q| *q = f(p, *q));
            b
        }
        (Arg::View(a), Arg::View(b)) => zip_with(a, b, f),
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
pub(crate) fn f32_unary<W: WithUnary>(op: UnaryOp, w: W) -> Option<W::Out> {
    Some(match op {
        UnaryOp::Neg => w.with(|v| -v),
        UnaryOp::Abs => w.with(f32::abs),
        UnaryOp::Exp => w.with(elementary::exp),
        UnaryOp::Log => w.with(f32::ln),
        UnaryOp::Sqrt => w.with(f32::sqrt),
        UnaryOp::Rsqrt => w.with(|v| v.sqrt().recip()),
        UnaryOp::Tanh => w.with(elementary::tanh),
        UnaryOp::Logistic => w.with(elementary::logistic),
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
pub(crate) fn f32_binary<W: WithBinary>(op: BinaryOp, w: W) -> Option<W::Out> {
    Some(match op {
        BinaryOp::Add => w.with(|p, q| p + q),
        BinaryOp::Sub => w.with(|p, q| p - q),
        BinaryOp::Mul => w.with(|p, q| p * q),
        BinaryOp::Div => w.with(|p, q| p / q),
        BinaryOp::Max => w.with(max_nan),
        BinaryOp::Min => w.with(min_nan),
        BinaryOp::Pow => w.with(f32::powf),
        // Rust's `%` on floats is C's `fmod`: exact, the sign of the dividend.
        BinaryOp::Rem => w.with(|p, q| p % q),
        BinaryOp::And | BinaryOp::Or => return None,
    })
}

/// [`map_same`] as a [`WithUnary`].
struct MapSame<'a>(Arg<'a, f32>);

impl WithUnary for MapSame<'_> {
    type Out = ArrayD<f32>;
    fn with(self, f: impl Fn(f32) -> f32 + Copy) -> ArrayD<f32> {
        map_same(self.0, f)
    }
}

/// [`zip_same`] as a [`WithBinary`].
struct ZipSame<'a>(Arg<'a, f32>, Arg<'a, f32>);

impl WithBinary for ZipSame<'_> {
    type Out = ArrayD<f32>;
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) -> ArrayD<f32> {
        zip_same(self.0, self.1, f)
    }
}

pub(super) fn unary(op: UnaryOp, x: Operand<'_>) -> Result<Literal, String> {
    let dtype = x.dtype();
    let undefined = || not_defined(&Op::Unary(op), dtype);
    Ok(match elems(x)? {
        Elems::F32(a) if op == UnaryOp::IsFinite => Literal::Bool(a.view().mapv(f32::is_finite)),
        Elems::F32(a) => Literal::F32(f32_unary(op, MapSame(a)).ok_or_else(undefined)?),
        Elems::I32(a) => Literal::I32(match op {
            UnaryOp::Neg => map_same(a, i32::wrapping_neg),
            UnaryOp::Abs => map_same(a, i32::wrapping_abs),
            UnaryOp::Sign => map_same(a, i32::signum),
            _ => return Err(undefined()),
        }),
        Elems::Bool(a) => Literal::Bool(match op {
            UnaryOp::Not => map_same(a, |v| !v),
            _ => return Err(undefined()),
        }),
    })
}

/// IEEE maximum that propagates NaN (XLA's `maximum`).
pub(crate) fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || a > b { a } else { b }
}

/// IEEE minimum that propagates NaN (XLA's `minimum`).
pub(crate) fn min_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || a < b { a } else { b }
}

/// XLA's `sign`: `-1`, `1`, or the operand itself for `±0` and NaN.
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
    Ok(match (elems(x)?, elems(y)?) {
        (Elems::F32(a), Elems::F32(b)) => {
            Literal::F32(f32_binary(op, ZipSame(a, b)).ok_or_else(undefined)?)
        }
        (Elems::I32(a), Elems::I32(b)) => Literal::I32(match op {
            BinaryOp::Add => zip_same(a, b, i32::wrapping_add),
            BinaryOp::Sub => zip_same(a, b, i32::wrapping_sub),
            BinaryOp::Mul => zip_same(a, b, i32::wrapping_mul),
            BinaryOp::Div => zip_same(a, b, div_i32),
            BinaryOp::Max => zip_same(a, b, i32::max),
            BinaryOp::Min => zip_same(a, b, i32::min),
            BinaryOp::Pow => zip_same(a, b, pow_i32),
            BinaryOp::Rem => zip_same(a, b, rem_i32),
            BinaryOp::And | BinaryOp::Or => return Err(undefined()),
        }),
        (Elems::Bool(a), Elems::Bool(b)) => Literal::Bool(match op {
            BinaryOp::And => zip_same(a, b, |p, q| p && q),
            BinaryOp::Or => zip_same(a, b, |p, q| p || q),
            _ => return Err(undefined()),
        }),
        // The dtypes are equal (checked above).
        _ => return Err(undefined()),
    })
}

fn compare_arrays<T: Copy + PartialOrd>(
    op: CompareOp,
    a: Arg<'_, T>,
    b: Arg<'_, T>,
) -> ArrayD<bool> {
    let (a, b) = (a.view(), b.view());
    match op {
        CompareOp::Eq => zip_with(a, b, |p, q| p == q),
        CompareOp::Ne => zip_with(a, b, |p, q| p != q),
        CompareOp::Lt => zip_with(a, b, |p, q| p < q),
        CompareOp::Le => zip_with(a, b, |p, q| p <= q),
        CompareOp::Gt => zip_with(a, b, |p, q| p > q),
        CompareOp::Ge => zip_with(a, b, |p, q| p >= q),
    }
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
    Ok(Literal::Bool(match (elems(x)?, elems(y)?) {
        (Elems::F32(a), Elems::F32(b)) => compare_arrays(op, a, b),
        (Elems::I32(a), Elems::I32(b)) => compare_arrays(op, a, b),
        (Elems::Bool(a), Elems::Bool(b)) => compare_arrays(op, a, b),
        // The dtypes are equal (checked above).
        _ => return Err(not_defined(&Op::Compare(op), dtype)),
    }))
}

pub(super) fn select(
    pred: Operand<'_>,
    on_true: Operand<'_>,
    on_false: Operand<'_>,
) -> Result<Literal, String> {
    /// `p ? t : f` elementwise: in place in whichever of `t` and `f` is owned.
    fn pick<T: Clone>(p: ArrayViewD<'_, bool>, t: Arg<'_, T>, f: Arg<'_, T>) -> ArrayD<T> {
        match (t, f) {
            (Arg::Owned(mut t), f) => {
                Zip::from(&mut t).and(p).and(f.view()).for_each(|t, &p, f| {
                    if !p {
                        *t = f.clone();
                    }
                });
                t
            }
            (t, Arg::Owned(mut f)) => {
                Zip::from(&mut f).and(p).and(t.view()).for_each(|f, &p, t| {
                    if p {
                        *f = t.clone();
                    }
                });
                f
            }
            (Arg::View(t), Arg::View(f)) => Zip::from(p)
                .and(t)
                .and(f)
                .map_collect(|&p, t, f| if p { t.clone() } else { f.clone() }),
        }
    }
    let dtype = same_dtype(&on_true, &on_false)?;
    let p = match elems(pred)? {
        Elems::Bool(p) => p,
        Elems::F32(_) => return Err("predicate must be pred, got f32".into()),
        Elems::I32(_) => return Err("predicate must be pred, got i32".into()),
    };
    let p = p.view();
    Ok(match (elems(on_true)?, elems(on_false)?) {
        (Elems::F32(t), Elems::F32(f)) => Literal::F32(pick(p, t, f)),
        (Elems::I32(t), Elems::I32(f)) => Literal::I32(pick(p, t, f)),
        (Elems::Bool(t), Elems::Bool(f)) => Literal::Bool(pick(p, t, f)),
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
