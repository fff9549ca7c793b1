//! Host arrays with a runtime element type: constants in the IR, inputs and outputs of
//! runs (XLA calls this a literal).

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

use crate::types::{DType, Shape};

/// A dense host array of one of the IR's element types.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Literal {
    /// f32 elements.
    F32(ArrayD<f32>),
    /// bf16 elements.
    BF16(ArrayD<bf16>),
    /// f16 elements.
    F16(ArrayD<f16>),
    /// i32 elements.
    I32(ArrayD<i32>),
    /// bool elements.
    Bool(ArrayD<bool>),
}

/// Applies a dtype-generic array expression to a literal, keeping its dtype: in `$body`,
/// `$a` binds the literal's `ArrayD<T>` (by reference when `$lit` is a reference) and
/// the result is the same variant of `$body`'s array.
macro_rules! map_literal {
    ($lit:expr, $a:ident => $body:expr) => {
        match $lit {
            $crate::ir::Literal::F32($a) => $crate::ir::Literal::F32($body),
            $crate::ir::Literal::BF16($a) => $crate::ir::Literal::BF16($body),
            $crate::ir::Literal::F16($a) => $crate::ir::Literal::F16($body),
            $crate::ir::Literal::I32($a) => $crate::ir::Literal::I32($body),
            $crate::ir::Literal::Bool($a) => $crate::ir::Literal::Bool($body),
        }
    };
}
pub(crate) use map_literal;

/// Evaluates a dtype-generic expression on a literal's array: in `$body`, `$a` binds the
/// literal's `ArrayD<T>` (by reference when `$lit` is a reference); every arm must give
/// the same type.
macro_rules! with_literal {
    ($lit:expr, $a:ident => $body:expr) => {
        match $lit {
            $crate::ir::Literal::F32($a) => $body,
            $crate::ir::Literal::BF16($a) => $body,
            $crate::ir::Literal::F16($a) => $body,
            $crate::ir::Literal::I32($a) => $body,
            $crate::ir::Literal::Bool($a) => $body,
        }
    };
}
pub(crate) use with_literal;

/// The element types of [`Literal`] as values: conversions through f64, which holds every
/// f32, bf16, f16, i32 and bool exactly, so a conversion rounds at most once.
pub trait Element: Copy + Default + Send + Sync + 'static {
    /// The dtype of `Self`.
    const DTYPE: DType;
    /// The exact value as an f64 (`true` is 1).
    fn to_f64(self) -> f64;
    /// `v` converted: floats round to nearest even, i32 truncates toward zero
    /// (saturating; NaN gives 0), bool is `v != 0`.
    fn from_f64(v: f64) -> Self;
    /// `v` converted as [`Element::from_f64`] converts it.
    fn from_f32(v: f32) -> Self;
    /// The bit pattern (zero-extended): what constants are compared and hashed by.
    fn bits(self) -> u32;
    /// The element of bit pattern `bits` (as [`Element::bits`] gives it); `None` for a
    /// pattern no element has (a bool other than 0 or 1, bits beyond a 16-bit type).
    fn from_bits(bits: u32) -> Option<Self>;
    /// The literal holding `a`.
    fn literal(a: ArrayD<Self>) -> Literal;
    /// The array of `x`, if `x` has dtype `Self::DTYPE`.
    fn array(x: &Literal) -> Option<&ArrayD<Self>>;
}

macro_rules! element {
    // A `half` type: its own conversions, its 16-bit pattern.
    ($t:ident, $variant:ident, half) => {
        element!(
            $t,
            $variant,
            |x| x.to_f64(),
            |v| $t::from_f64(v),
            |w| $t::from_f32(w),
            |x| u32::from(x.to_bits()),
            |b| u16::try_from(b).ok().map($t::from_bits)
        );
    };
    ($t:ty, $variant:ident, |$x:ident| $to:expr, |$v:ident| $from:expr, |$w:ident| $from32:expr,
     |$b:ident| $bits:expr, |$p:ident| $from_bits:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            #[inline]
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            #[inline]
            fn from_f64($v: f64) -> Self {
                $from
            }
            #[inline]
            fn from_f32($w: f32) -> Self {
                $from32
            }
            #[inline]
            fn bits(self) -> u32 {
                let $b = self;
                $bits
            }
            #[inline]
            fn from_bits($p: u32) -> Option<Self> {
                $from_bits
            }
            fn literal(a: ArrayD<Self>) -> Literal {
                Literal::$variant(a)
            }
            fn array(x: &Literal) -> Option<&ArrayD<Self>> {
                match x {
                    Literal::$variant(a) => Some(a),
                    _ => None,
                }
            }
        }
    };
}

element!(
    f32,
    F32,
    |x| f64::from(x),
    |v| v as f32,
    |w| w,
    |x| f32::to_bits(x),
    |b| Some(f32::from_bits(b))
);
element!(bf16, BF16, half);
element!(f16, F16, half);
element!(
    i32,
    I32,
    |x| f64::from(x),
    |v| v as i32,
    |w| w as i32,
    |x| x.cast_unsigned(),
    |b| Some(b.cast_signed())
);
element!(
    bool,
    Bool,
    |x| f64::from(u8::from(x)),
    |v| v != 0.0,
    |w| w != 0.0,
    |x| u32::from(x),
    |b| match b {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    }
);

/// Calls a function generic over [`Element`] for a runtime dtype:
/// `by_element!(dtype, f(args))` calls `f::<f32>(args)`, `f::<bf16>(args)`, ...
macro_rules! by_element {
    ($dtype:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $dtype {
            $crate::types::DType::F32 => $f::<f32>($($arg),*),
            $crate::types::DType::BF16 => $f::<::half::bf16>($($arg),*),
            $crate::types::DType::F16 => $f::<::half::f16>($($arg),*),
            $crate::types::DType::I32 => $f::<i32>($($arg),*),
            $crate::types::DType::Bool => $f::<bool>($($arg),*),
        }
    };
}
pub(crate) use by_element;

impl Literal {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Literal::F32(_) => DType::F32,
            Literal::BF16(_) => DType::BF16,
            Literal::F16(_) => DType::F16,
            Literal::I32(_) => DType::I32,
            Literal::Bool(_) => DType::Bool,
        }
    }

    /// Dims.
    pub fn shape(&self) -> Shape {
        with_literal!(self, a => a.shape().to_vec())
    }

    /// An f32 scalar.
    pub fn scalar_f32(v: f32) -> Self {
        Literal::F32(ArrayD::from_elem(IxDyn(&[]), v))
    }

    /// A tensor of `shape` filled with `v` converted to `dtype` as [`Literal::convert`]
    /// converts (non-zero is `true`).
    pub fn full(shape: &[usize], dtype: DType, v: f64) -> Self {
        fn fill<T: Element>(shape: &[usize], v: f64) -> Literal {
            T::literal(ArrayD::from_elem(IxDyn(shape), T::from_f64(v)))
        }
        by_element!(dtype, fill(shape, v))
    }

    /// This literal converted to `dtype`, elementwise, rounding at most once: floats to
    /// nearest even, to i32 toward zero (saturating; NaN gives 0), to bool `x != 0`,
    /// bool to 0/1. Converting to its own dtype copies.
    pub fn convert(&self, dtype: DType) -> Literal {
        /// Floats go through f32, which holds bf16 and f16 exactly, so they round as
        /// through f64, only faster (the float normalisation converts at every op).
        fn to<T: Element>(x: &Literal) -> Literal {
            T::literal(match x {
                Literal::F32(a) => a.mapv(T::from_f32),
                Literal::BF16(a) => a.mapv(|v| T::from_f32(v.to_f32())),
                Literal::F16(a) => a.mapv(|v| T::from_f32(v.to_f32())),
                Literal::I32(a) => a.mapv(|v| T::from_f64(v.to_f64())),
                Literal::Bool(a) => a.mapv(|v| T::from_f64(v.to_f64())),
            })
        }
        if dtype == self.dtype() {
            return self.clone();
        }
        by_element!(dtype, to(self))
    }

    /// The elements in row-major order as little-endian bytes, each
    /// [`DType::size_in_bytes`] long (a bool is one byte, 0 or 1): the layout of
    /// safetensors files and of blocks sent between processes.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        fn bytes<T: Element>(a: &ArrayD<T>) -> Vec<u8> {
            let size = T::DTYPE.size_in_bytes();
            let mut out = Vec::with_capacity(a.len() * size);
            for x in a.iter() {
                out.extend_from_slice(&x.bits().to_le_bytes()[..size]);
            }
            out
        }
        with_literal!(self, a => bytes(a))
    }

    /// The `dtype` array of `shape` whose elements are `bytes` as
    /// [`Literal::to_le_bytes`] writes them; an error naming the problem if the byte
    /// count does not fit the shape or an element has no value of `dtype` (a bool byte
    /// other than 0 or 1).
    pub fn from_le_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Literal, String> {
        fn elements<T: Element>(shape: &[usize], bytes: &[u8]) -> Result<Literal, String> {
            let size = T::DTYPE.size_in_bytes();
            let count: usize = shape.iter().product();
            if count.checked_mul(size) != Some(bytes.len()) {
                return Err(format!(
                    "{} bytes for {count} elements of {} ({size} bytes each)",
                    bytes.len(),
                    T::DTYPE
                ));
            }
            let values = bytes
                .chunks_exact(size)
                .map(|b| {
                    let mut word = [0u8; 4];
                    word[..size].copy_from_slice(b);
                    T::from_bits(u32::from_le_bytes(word))
                        .ok_or_else(|| format!("bytes {b:?} are no {} element", T::DTYPE))
                })
                .collect::<Result<Vec<T>, String>>()?;
            ArrayD::from_shape_vec(IxDyn(shape), values)
                .map(T::literal)
                .map_err(|e| e.to_string())
        }
        by_element!(dtype, elements(shape, bytes))
    }

    /// Each element's bit pattern (zero-extended, in logical order): what "bitwise
    /// equal" compares (NaNs and signed zeros included).
    pub fn bit_patterns(&self) -> Vec<u32> {
        with_literal!(self, a => a.iter().map(|x| x.bits()).collect())
    }

    /// The f32 array, if this is one.
    pub fn as_f32(&self) -> Option<&ArrayD<f32>> {
        f32::array(self)
    }

    /// The bf16 array, if this is one.
    pub fn as_bf16(&self) -> Option<&ArrayD<bf16>> {
        bf16::array(self)
    }

    /// The f16 array, if this is one.
    pub fn as_f16(&self) -> Option<&ArrayD<f16>> {
        f16::array(self)
    }

    /// The i32 array, if this is one.
    pub fn as_i32(&self) -> Option<&ArrayD<i32>> {
        i32::array(self)
    }

    /// The bool array, if this is one.
    pub fn as_bool(&self) -> Option<&ArrayD<bool>> {
        bool::array(self)
    }
}

impl<T: Element> From<ArrayD<T>> for Literal {
    fn from(a: ArrayD<T>) -> Self {
        T::literal(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_once() {
        // 1 + 2^-8 + 2^-20 rounds up in bf16 (the 2^-20 breaks the tie); via f32 then
        // bf16 it is the same value, and an i32 above bf16's precision rounds to even.
        let x = Literal::F32(ArrayD::from_elem(
            IxDyn(&[1]),
            1.0 + 2f32.powi(-8) + 2f32.powi(-20),
        ));
        let b = x.convert(DType::BF16);
        assert_eq!(b.as_bf16().unwrap()[[0]].to_f32(), 1.0 + 2f32.powi(-7));
        let i = Literal::I32(ArrayD::from_shape_vec(IxDyn(&[3]), vec![257, 259, -3]).unwrap());
        let wide: Vec<f32> = i
            .convert(DType::BF16)
            .convert(DType::F32)
            .as_f32()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(wide, vec![256.0, 260.0, -3.0]);
        let h = Literal::full(&[2], DType::F16, 70000.0);
        assert!(h.as_f16().unwrap()[[0]].is_infinite());
        assert_eq!(
            h.convert(DType::I32),
            Literal::full(&[2], DType::I32, f64::from(i32::MAX))
        );
        // Through f32 and through f64, floats round alike (ties, subnormals, overflow).
        for bits in (0..u32::MAX).step_by(65_537) {
            let v = f32::from_bits(bits);
            let same = |a: u32, b: u32| a == b || v.is_nan();
            assert!(same(
                bf16::from_f32(v).bits(),
                bf16::from_f64(v.into()).bits()
            ));
            assert!(same(
                f16::from_f32(v).bits(),
                f16::from_f64(v.into()).bits()
            ));
        }
        let back = Literal::full(&[], DType::BF16, -2.5)
            .convert(DType::F16)
            .convert(DType::Bool);
        assert_eq!(back, Literal::full(&[], DType::Bool, 1.0));
    }
}
