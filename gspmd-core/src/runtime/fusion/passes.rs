//! One op's pass over a chunk: the destinations a kernel's scalar function is handed
//! to (`kernels::WithUnary`, `WithBinary`, `WithCompare`), each applying it lane by lane
//! from its operands' registers, a scalar broadcast held as one value, or a pair of
//! arithmetic ops in one pass. The compiler vectorises each such loop.

use super::code::bool_lane;
use crate::ir::BinaryOp;
use crate::runtime::kernels::{WithBinary, WithCompare, WithUnary, f32_arith};

/// A reduction's finishing op applied in place (see [`Finish::apply`](super::Finish::apply)): to each value
/// `v`, `f(v)`, or `f(v, q)` (`left`) or `f(q, v)`.
pub(super) struct InPlace<'a>(pub(super) &'a mut [f32], pub(super) f32, pub(super) bool);

impl WithUnary for InPlace<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32) -> f32 + Copy) {
        self.0.iter_mut().for_each(|v| *v = f(*v));
    }
}

impl WithBinary for InPlace<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) {
        let InPlace(values, q, left) = self;
        if left {
            values.iter_mut().for_each(|v| *v = f(*v, q));
        } else {
            values.iter_mut().for_each(|v| *v = f(q, *v));
        }
    }
}

/// A unary op's function from one register into another.
pub(super) struct MapInto<'a>(pub(super) &'a [f32], pub(super) &'a mut [f32]);

impl WithUnary for MapInto<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32) -> f32 + Copy) {
        for (d, &a) in self.1.iter_mut().zip(self.0) {
            *d = f(a);
        }
    }
}

/// A binary op's function from two registers into a third.
pub(super) struct ZipInto<'a>(
    pub(super) &'a [f32],
    pub(super) &'a [f32],
    pub(super) &'a mut [f32],
);

impl WithBinary for ZipInto<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) {
        for ((d, &a), &b) in self.2.iter_mut().zip(self.0).zip(self.1) {
            *d = f(a, b);
        }
    }
}

/// An [`Instr::Pair`](super::code::Instr::Pair) from three registers into a fourth, given its second op: the
/// first op's function is applied here, the second's in [`PairWith`].
pub(super) struct PairInto<'a>(
    pub(super) BinaryOp,
    pub(super) &'a [f32],
    pub(super) &'a [f32],
    pub(super) &'a [f32],
    pub(super) bool,
    pub(super) &'a mut [f32],
);

impl WithBinary for PairInto<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, first: impl Fn(f32, f32) -> f32 + Copy) {
        let PairInto(second, a, b, c, t_left, dst) = self;
        f32_arith(second, PairWith(first, a, b, c, t_left, dst));
    }
}

/// An [`Instr::Pair`](super::code::Instr::Pair) with its first op's function: runs the pass.
pub(super) struct PairWith<'a, F>(
    pub(super) F,
    pub(super) &'a [f32],
    pub(super) &'a [f32],
    pub(super) &'a [f32],
    pub(super) bool,
    pub(super) &'a mut [f32],
);

impl<F: Fn(f32, f32) -> f32 + Copy> WithBinary for PairWith<'_, F> {
    type Out = ();
    #[inline(always)]
    fn with(self, second: impl Fn(f32, f32) -> f32 + Copy) {
        let PairWith(first, a, b, c, t_left, dst) = self;
        let lanes = dst.iter_mut().zip(a).zip(b).zip(c);
        if t_left {
            for (((d, &a), &b), &c) in lanes {
                *d = second(first(a, b), c);
            }
        } else {
            for (((d, &a), &b), &c) in lanes {
                *d = second(c, first(a, b));
            }
        }
    }
}

/// A comparison's function from two registers, their lanes read with the fourth field
/// (as f32, or as i32 by [`int_lane`](super::code::int_lane)), into bool lanes in the third.
pub(super) struct CompareInto<'a, R>(
    pub(super) &'a [f32],
    pub(super) &'a [f32],
    pub(super) &'a mut [f32],
    pub(super) R,
);

impl<T, R: Fn(f32) -> T + Copy> WithCompare<T> for CompareInto<'_, R> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(T, T) -> bool + Copy) {
        let read = self.3;
        for ((d, &a), &b) in self.2.iter_mut().zip(self.0).zip(self.1) {
            *d = bool_lane(f(read(a), read(b)));
        }
    }
}

/// A binary op's function from a register and a scalar (a splat leaf, the right
/// operand) into a third register.
pub(super) struct ZipSplat<'a>(
    pub(super) &'a [f32],
    pub(super) f32,
    pub(super) &'a mut [f32],
);

impl WithBinary for ZipSplat<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) {
        let q = self.1;
        for (d, &a) in self.2.iter_mut().zip(self.0) {
            *d = f(a, q);
        }
    }
}

/// [`ZipSplat`] with the scalar the left operand.
pub(super) struct SplatZip<'a>(
    pub(super) f32,
    pub(super) &'a [f32],
    pub(super) &'a mut [f32],
);

impl WithBinary for SplatZip<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) {
        let p = self.0;
        for (d, &b) in self.2.iter_mut().zip(self.1) {
            *d = f(p, b);
        }
    }
}
