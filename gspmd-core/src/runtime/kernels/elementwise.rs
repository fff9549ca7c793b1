//! Elementwise kernels: unary, binary, compare, select and convert.
//!
//! An operand passed owned ([`Cow::Owned`]: the evaluation loop passes a value so at its
//! last use) whose elements have the result's dtype is overwritten in place instead of
//! filling a new array (unary ops, binary ops, select, convert to the same dtype). Each
//! element goes through the same scalar function either way, so the results are
//! bitwise those of a fresh array.

use std::borrow::Cow;

use ndarray::{ArrayD, Zip};

use super::{dtype_mismatch, elementary, not_defined, type_of};
use crate::ir::{BinaryOp, CompareOp, DType, Literal, Op, UnaryOp};

/// A literal's elements, borrowed or owned (then free to overwrite).
enum Elems<'a> {
    F32(Cow<'a, ArrayD<f32>>),
    I32(Cow<'a, ArrayD<i32>>),
    Bool(Cow<'a, ArrayD<bool>>),
}

fn elems(lit: Cow<'_, Literal>) -> Elems<'_> {
    match lit {
        Cow::Borrowed(Literal::F32(a)) => Elems::F32(Cow::Borrowed(a)),
        Cow::Borrowed(Literal::I32(a)) => Elems::I32(Cow::Borrowed(a)),
        Cow::Borrowed(Literal::Bool(a)) => Elems::Bool(Cow::Borrowed(a)),
        Cow::Owned(Literal::F32(a)) => Elems::F32(Cow::Owned(a)),
        Cow::Owned(Literal::I32(a)) => Elems::I32(Cow::Owned(a)),
        Cow::Owned(Literal::Bool(a)) => Elems::Bool(Cow::Owned(a)),
    }
}

fn zip_with<A: Copy, B: Copy, R>(x: &ArrayD<A>, y: &ArrayD<B>, f: impl Fn(A, B) -> R) -> ArrayD<R> {
    Zip::from(x).and(y).map_collect(|&a, &b| f(a, b))
}

/// `f` of each element: in place if `a` is owned.
fn map_same<T: Copy>(a: Cow<'_, ArrayD<T>>, f: impl Fn(T) -> T) -> ArrayD<T> {
    match a {
        Cow::Owned(mut a) => {
            a.mapv_inplace(f);
            a
        }
        Cow::Borrowed(a) => a.mapv(f),
    }
}

/// `f(a, b)` of each pair of elements (`a` and `b` of one shape): in place in whichever
/// is owned.
fn zip_same<T: Copy>(
    a: Cow<'_, ArrayD<T>>,
    b: Cow<'_, ArrayD<T>>,
    f: impl Fn(T, T) -> T,
) -> ArrayD<T> {
    match (a, b) {
        (Cow::Owned(mut a), b) => {
            Zip::from(&mut a).and(&*b).for_each(|p, &q| *p = f(*p, q));
            a
        }
        (a, Cow::Owned(mut b)) => {
            Zip::from(&*a).and(&mut b).for_each(|&p, q| *q = f(p, *q));
            b
        }
        (a, b) => zip_with(&a, &b, f),
    }
}

pub(super) fn unary(op: UnaryOp, x: Cow<'_, Literal>) -> Result<Literal, String> {
    let dtype = x.dtype();
    let undefined = || not_defined(&Op::Unary(op), dtype);
    Ok(match elems(x) {
        Elems::F32(a) if op == UnaryOp::IsFinite => Literal::Bool(a.mapv(f32::is_finite)),
        Elems::F32(a) => Literal::F32(match op {
            UnaryOp::Neg => map_same(a, |v| -v),
            UnaryOp::Abs => map_same(a, f32::abs),
            UnaryOp::Exp => map_same(a, elementary::exp),
            UnaryOp::Log => map_same(a, f32::ln),
            UnaryOp::Sqrt => map_same(a, f32::sqrt),
            UnaryOp::Rsqrt => map_same(a, |v| v.sqrt().recip()),
            UnaryOp::Tanh => map_same(a, elementary::tanh),
            UnaryOp::Logistic => map_same(a, elementary::logistic),
            UnaryOp::Sin => map_same(a, f32::sin),
            UnaryOp::Cos => map_same(a, f32::cos),
            UnaryOp::Erf => map_same(a, libm::erff),
            UnaryOp::Floor => map_same(a, f32::floor),
            UnaryOp::Ceil => map_same(a, f32::ceil),
            UnaryOp::Round => map_same(a, f32::round_ties_even),
            UnaryOp::Sign => map_same(a, sign_f32),
            UnaryOp::Not | UnaryOp::IsFinite => return Err(undefined()),
        }),
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

pub(super) fn binary(
    op: BinaryOp,
    x: Cow<'_, Literal>,
    y: Cow<'_, Literal>,
) -> Result<Literal, String> {
    if x.dtype() != y.dtype() {
        return Err(dtype_mismatch(&x, &y));
    }
    let dtype = x.dtype();
    let undefined = || not_defined(&Op::Binary(op), dtype);
    Ok(match (elems(x), elems(y)) {
        (Elems::F32(a), Elems::F32(b)) => Literal::F32(match op {
            BinaryOp::Add => zip_same(a, b, |p, q| p + q),
            BinaryOp::Sub => zip_same(a, b, |p, q| p - q),
            BinaryOp::Mul => zip_same(a, b, |p, q| p * q),
            BinaryOp::Div => zip_same(a, b, |p, q| p / q),
            BinaryOp::Max => zip_same(a, b, max_nan),
            BinaryOp::Min => zip_same(a, b, min_nan),
            BinaryOp::Pow => zip_same(a, b, f32::powf),
            // Rust's `%` on floats is C's `fmod`: exact, the sign of the dividend.
            BinaryOp::Rem => zip_same(a, b, |p, q| p % q),
            BinaryOp::And | BinaryOp::Or => return Err(undefined()),
        }),
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
    a: &ArrayD<T>,
    b: &ArrayD<T>,
) -> ArrayD<bool> {
    match op {
        CompareOp::Eq => zip_with(a, b, |p, q| p == q),
        CompareOp::Ne => zip_with(a, b, |p, q| p != q),
        CompareOp::Lt => zip_with(a, b, |p, q| p < q),
        CompareOp::Le => zip_with(a, b, |p, q| p <= q),
        CompareOp::Gt => zip_with(a, b, |p, q| p > q),
        CompareOp::Ge => zip_with(a, b, |p, q| p >= q),
    }
}

pub(super) fn compare(op: CompareOp, x: &Literal, y: &Literal) -> Result<Literal, String> {
    Ok(Literal::Bool(match (x, y) {
        (Literal::F32(a), Literal::F32(b)) => compare_arrays(op, a, b),
        (Literal::I32(a), Literal::I32(b)) => compare_arrays(op, a, b),
        (Literal::Bool(a), Literal::Bool(b)) => compare_arrays(op, a, b),
        _ => return Err(dtype_mismatch(x, y)),
    }))
}

pub(super) fn select(
    pred: &Literal,
    on_true: Cow<'_, Literal>,
    on_false: Cow<'_, Literal>,
) -> Result<Literal, String> {
    /// `p ? t : f` elementwise: in place in whichever of `t` and `f` is owned.
    fn pick<T: Clone>(p: &ArrayD<bool>, t: Cow<'_, ArrayD<T>>, f: Cow<'_, ArrayD<T>>) -> ArrayD<T> {
        match (t, f) {
            (Cow::Owned(mut t), f) => {
                Zip::from(&mut t).and(p).and(&*f).for_each(|t, &p, f| {
                    if !p {
                        *t = f.clone();
                    }
                });
                t
            }
            (t, Cow::Owned(mut f)) => {
                Zip::from(&mut f).and(p).and(&*t).for_each(|f, &p, t| {
                    if p {
                        *f = t.clone();
                    }
                });
                f
            }
            (t, f) => Zip::from(p)
                .and(&*t)
                .and(&*f)
                .map_collect(|&p, t, f| if p { t.clone() } else { f.clone() }),
        }
    }
    let p = pred
        .as_bool()
        .ok_or_else(|| format!("predicate must be pred, got {}", type_of(pred)))?;
    if on_true.dtype() != on_false.dtype() {
        return Err(dtype_mismatch(&on_true, &on_false));
    }
    let dtype = on_true.dtype();
    Ok(match (elems(on_true), elems(on_false)) {
        (Elems::F32(t), Elems::F32(f)) => Literal::F32(pick(p, t, f)),
        (Elems::I32(t), Elems::I32(f)) => Literal::I32(pick(p, t, f)),
        (Elems::Bool(t), Elems::Bool(f)) => Literal::Bool(pick(p, t, f)),
        // The dtypes are equal (checked above).
        _ => return Err(not_defined(&Op::Select, dtype)),
    })
}

/// `x` converted to `dtype` (moved through unchanged if it already has it).
pub(super) fn convert(x: Cow<'_, Literal>, dtype: DType) -> Literal {
    match (x.as_ref(), dtype) {
        (Literal::F32(a), DType::I32) => Literal::I32(a.mapv(|v| v as i32)),
        (Literal::F32(a), DType::Bool) => Literal::Bool(a.mapv(|v| v != 0.0)),
        (Literal::I32(a), DType::F32) => Literal::F32(a.mapv(|v| v as f32)),
        (Literal::I32(a), DType::Bool) => Literal::Bool(a.mapv(|v| v != 0)),
        (Literal::Bool(a), DType::F32) => Literal::F32(a.mapv(|v| f32::from(u8::from(v)))),
        (Literal::Bool(a), DType::I32) => Literal::I32(a.mapv(i32::from)),
        _ => x.into_owned(),
    }
}
