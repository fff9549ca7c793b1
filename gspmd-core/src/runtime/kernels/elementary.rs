//! `exp`, `tanh` and `logistic` for f32 without branches or library calls, so that a
//! loop over an array vectorises (glibc's `tanhf` costs ~13.5 ns per element on these
//! machines). Error bounds, checked against the f64 library functions over a dense
//! sweep in the tests below:
//! - `exp`: within 2 ulp of the correctly rounded result where it is normal; `+inf`
//!   from `88.72284` up, 0 below `-103.97` (subnormal results within 2 ulp's worth of
//!   absolute error, `1.5e-45 · 2^2`); NaN stays NaN.
//! - `tanh`: within 4e-7 absolute error (at most 7 ulp of the results near ±1, far
//!   fewer near 0); `|tanh| <= 1`, and ±1 beyond `|x| = 9.02`; odd; NaN stays NaN.
//! - `logistic(x) = 1 / (1 + exp(-x))`: within 2 ulp where the result is at least
//!   `2^-126`, 1e-7 absolute error everywhere.
//!
//! No `mul_add`: the fused loops run these on the CPU's widest vectors, where FMA
//! exists, and the unfused kernels for the build's target (baseline x86-64), where it
//! is a library call; both evaluate the same separate multiplies and adds, so their
//! results are bitwise equal.
//!
//! Method, `exp`: `exp(x) = 2^n · exp(r)` with `n = round(x / ln 2)` (the
//! round-to-nearest "magic number" addition, which needs no rounding instruction) and
//! `r = x - n ln 2` in two parts (Cody and Waite); `exp(r)` for `|r| <= ln 2 / 2` is
//! `1 + r + r^2 q(r)`, `q` of degree 4 (Horner over all seven terms), fitted to
//! minimise the largest relative error over that interval (a linear program over
//! 4,000 points in f64, scipy's HiGHS; with the coefficients rounded to f32 the error
//! is `2.0e-8`, against `5.3e-9` for the former Taylor polynomial of degree 7, and
//! the result is within 1 ulp over every third f32 bit pattern; degree 5 reached
//! 2 ulp in `exp` and 3 in `logistic`). `2^n` is built from its exponent bits in
//! two factors so that `n` may reach 128 (`e^x` overflows to `+inf` there) and go
//! down to -150 (subnormal results); the clamp of `x` keeps both factors' exponents
//! in range, so no integer clamp is needed. At and below that clamp's lower bound the
//! formula gives 0, and `exp` returns 0 there without running it on the lane: the last
//! product would underflow, which these CPUs finish in microcode, one assist per
//! vector instruction (a causally masked softmax's `exp` ran about 1.7x slower).
//!
//! Method, `tanh`: `x P(x^2) / Q(x^2)` for `x` clamped to `[-9.02, 9.02]`, `P` of
//! degree 6 and `Q` of degree 3 (an odd numerator of degree 13 over an even
//! denominator of degree 6, the shape XLA's CPU backend uses; these coefficients are
//! our own), `P(0) = Q(0) = 1` so that `tanh(x) = x` exactly for tiny `x`. The
//! coefficients minimise the largest relative error over `[0, 9.02]` (`3.4e-8`: the
//! differential-correction algorithm, a linear program over 3,000 points per step
//! with numpy and scipy's HiGHS, 12 steps) and are rounded to f32; the result is
//! clamped to `[-1, 1]`. The f32 evaluation's roundings (`x^2`, two Horner chains, a
//! division and a product, about 6 ulp at most, where the old formula rounded about
//! twice) dominate the error near ±1: 3.8e-7 at most over every f32 in `[0.3, 9.5]`,
//! against 1e-7 for the former `1 - 2 / (e^{2|x|} + 1)` with a Taylor polynomial
//! below 0.625, which cost an `exp`, a division and 9 more Horner steps (about 65
//! vector ops a lane group, against about 25 and one division here).

/// `2^23 + 2^22`: adding it to an f32 of magnitude below `2^22` rounds it to an
/// integer held in the low mantissa bits.
const ROUNDER: f32 = 12_582_912.0;
/// `ln 2` in two parts: `LN2_HI` has 16 significant bits, so `n · LN2_HI` is exact.
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;

/// `e^x` (see the module documentation for the error bound).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // At and below `FLOOR` the result is 0: such a lane computes from 0 instead and
    // gives 0 at the end, so its last product does not underflow. An underflowing
    // multiply costs a microcode assist per vector instruction on these CPUs, and
    // every masked attention score (-1e9 less the row's maximum) lands here.
    let floor = x <= FLOOR;
    let e = exp_formula(if floor { 0.0 } else { x });
    if floor { 0.0 } else { e }
}

/// The clamp's lower bound of [`exp_formula`]'s argument, where it gives exactly 0
/// (`n = -150`, `exp(r) < 1`: `2^-150 · exp(r)` rounds to 0; tested), as it does below
/// (clamped to it): [`exp`] returns 0 there without it, bitwise the same result.
const FLOOR: f32 = -104.0;

/// `e^x` by the method of the module documentation, for every `x`.
#[inline(always)]
fn exp_formula(x: f32) -> f32 {
    // Beyond these, the result is +inf or 0 (and the exponent arithmetic below would
    // leave the factors' range); NaN passes through `clamp` and the arithmetic.
    let x = x.clamp(FLOOR, 88.8);
    let shifted = x * std::f32::consts::LOG2_E + ROUNDER;
    let n = shifted - ROUNDER;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // `1 + r + r^2 q(r)`: the minimax coefficients of `r^6` to `r^2`, then 1 and 1.
    let mut p = 1.337_108_8e-3;
    for c in [8.356_89e-3, 4.167_31e-2, 1.666_666_3e-1, 0.5, 1.0, 1.0] {
        p = p * r + c;
    }
    // `n` (in [-150, 128] after the clamp) sits in the low bits of `shifted`; split
    // it so each factor is a normal 2^k, k in [-75, 64]. For NaN, `n` is garbage and
    // the product stays NaN.
    let n = shifted.to_bits().wrapping_sub(ROUNDER.to_bits()) as i32;
    let half = n >> 1;
    let pow2 = |k: i32| f32::from_bits((k.wrapping_add(127) as u32) << 23);
    p * pow2(half) * pow2(n.wrapping_sub(half))
}

/// `tanh(x)` (see the module documentation for the error bound).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    /// `P`'s coefficients of `s^1` to `s^6` (`P(0) = 1`).
    const P: [f32; 6] = [
        1.307_385e-1,
        3.092_804_2e-3,
        1.104_303_1e-5,
        -1.980_516_2e-8,
        5.092_022_6e-11,
        -8.050_685e-14,
    ];
    /// `Q`'s coefficients of `s^1` to `s^3` (`Q(0) = 1`).
    const Q: [f32; 3] = [4.640_717e-1, 2.445_022_8e-2, 2.530_224e-4];
    let x = x.clamp(-9.02, 9.02);
    let s = x * x;
    let mut p = P[5];
    for &c in P[..5].iter().rev() {
        p = p * s + c;
    }
    let p = p * s + 1.0;
    let mut q = Q[2];
    for &c in Q[..2].iter().rev() {
        q = q * s + c;
    }
    let q = q * s + 1.0;
    (x * (p / q)).clamp(-1.0, 1.0)
}

/// `1 / (1 + e^-x)` (see the module documentation for the error bound).
#[inline(always)]
pub fn logistic(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between `got` and the f64 `want` rounded
    /// to f32 (0 when both are the same infinity or both NaN).
    fn ulps(got: f32, want: f64) -> u64 {
        let want = want as f32;
        if (got.is_nan() && want.is_nan()) || got == want {
            return 0;
        }
        // Adjacent floats differ by one in this order, across zero too.
        let ordered = |v: f32| {
            let magnitude = i64::from(v.to_bits() & 0x7fff_ffff);
            if v.is_sign_negative() {
                -magnitude
            } else {
                magnitude
            }
        };
        ordered(got).abs_diff(ordered(want))
    }

    /// Every 997th f32 bit pattern (4.3 million values, both signs, every exponent,
    /// about 8,400 per binade), plus the special values.
    fn sweep() -> impl Iterator<Item = f32> {
        let specials = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            1e-45,
        ];
        (0..u32::MAX / 997)
            .map(|i| f32::from_bits(i * 997))
            .chain(specials)
    }

    /// Every f32 from 88 to 90 (where `2^n` needs its second factor and `e^x`
    /// overflows): within 2 ulp, and `+inf` exactly from `88.72284` up.
    #[test]
    fn exp_overflows_from_88_72284() {
        let (lo, hi) = (88f32.to_bits(), 90f32.to_bits());
        for x in (lo..hi).map(f32::from_bits) {
            let got = exp(x);
            assert!(ulps(got, (x as f64).exp()) <= 2, "exp({x:e}) = {got:e}");
            assert_eq!(got.is_infinite(), x >= 88.722_84, "exp({x:e}) = {got:e}");
        }
    }

    /// At and below the clamp's lower bound, `exp` is +0, as the formula is there (the
    /// clamp maps every such argument to the bound): the shortcut does not change a bit
    /// (checked over the sweep too).
    #[test]
    fn exp_is_zero_at_and_below_its_floor() {
        assert_eq!(exp_formula(FLOOR).to_bits(), 0);
        for x in [FLOOR, -104.5, -1e9, f32::MIN, f32::NEG_INFINITY] {
            assert_eq!(exp(x).to_bits(), 0, "exp({x:e})");
        }
        // Just above the bound the formula runs: subnormal results down to 0.
        let above = f32::from_bits(FLOOR.to_bits() - 1);
        assert!(exp(above) >= 0.0 && exp(-103.0) > 0.0);
        assert!(exp(f32::NAN).is_nan());
        for x in sweep() {
            assert_eq!(exp(x).to_bits(), exp_formula(x).to_bits(), "exp({x:e})");
        }
    }

    #[test]
    fn exp_is_within_two_ulp() {
        for x in sweep() {
            let (got, want) = (exp(x), (x as f64).exp());
            let rounded = want as f32;
            let ok = if rounded.is_normal() || rounded.is_infinite() || rounded.is_nan() {
                ulps(got, want) <= 2
            } else {
                (got as f64 - want).abs() <= 4.0 * 1.5e-45
            };
            assert!(
                ok,
                "exp({x:e}) = {got:e}, want {want:e} ({} ulp)",
                ulps(got, want)
            );
        }
    }

    #[test]
    fn tanh_is_within_4e7_absolute() {
        for x in sweep() {
            let (got, want) = (tanh(x), (x as f64).tanh());
            if want.is_nan() {
                assert!(got.is_nan(), "tanh({x:e}) = {got:e}");
                continue;
            }
            assert!(
                (got as f64 - want).abs() <= 4e-7 && got.abs() <= 1.0,
                "tanh({x:e}) = {got:e}, want {want:e}"
            );
            assert_eq!(tanh(-x), -got, "tanh is odd at {x:e}");
            if x.abs() >= 9.02 {
                assert_eq!(got, 1f32.copysign(x), "tanh({x:e})");
            }
        }
    }

    #[test]
    fn logistic_is_within_two_ulp_or_1e7() {
        for x in sweep() {
            let (got, want) = (logistic(x), 1.0 / (1.0 + (-(x as f64)).exp()));
            if want.is_nan() {
                assert!(got.is_nan(), "logistic({x:e}) = {got:e}");
                continue;
            }
            let abs = (got as f64 - want).abs();
            assert!(abs <= 1e-7, "logistic({x:e}) = {got:e}, want {want:e}");
            if want >= f64::from(f32::MIN_POSITIVE) {
                assert!(
                    ulps(got, want) <= 2,
                    "logistic({x:e}) = {got:e}, want {want:e}"
                );
            }
        }
    }
}
