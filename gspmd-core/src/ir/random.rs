//! Counter-based random numbers, as `jax.random` with its threefry key in the
//! partitionable layout: the one primitive [`Op::RandomBits`] and, on top of it, keys
//! ([`key`], [`split`], [`split_stacked`], [`fold_in`], [`fold_in_index`]) and draws ([`bits`],
//! [`uniform`], [`normal`], [`bernoulli`], [`dropout`]).
//!
//! As in JAX, a key is either split (or folded) or drawn from, not both: key `i` of a
//! split and `fold_in(key, i)` are the same block of counter `i` whose two words'
//! xor is `bits(key)` at index `i`.
//!
//! A key is an `i32[2]` tensor: two u32 words with their bits reinterpreted, since the
//! IR's integer dtype is i32 (no u32, no 64-bit type; a pair of scalars would make
//! every key two values to carry). The value drawn at global index `i` is a function
//! of the key and `i` only (threefry-2x32 with 20 rounds of the counter `i`), so a
//! program gives the same numbers on one device, on any mesh and under any sharding:
//! each device computes the counters of its own block.
//!
//! Same values as JAX (`jax_threefry_partitionable`, the default since JAX 0.5):
//! `bits` is `random_bits(key, 32, shape)`, `split` and `fold_in` are JAX's, `uniform`
//! is JAX's (the top 23 bits as the mantissa; scaled to `[lo, hi)`, up to the rounding
//! of the product, which XLA's CPU backend fuses into a multiply-add), and so is
//! `bernoulli` (`tests/random.rs` checks values printed by JAX 0.12). `normal` uses
//! Box–Muller on two uniform draws (JAX uses the inverse error function, which the IR
//! has no op for), so its values differ from JAX's but its distribution is the same.
//!
//! Every function is `#[track_caller]`: a bad key (not `i32[2]`) is an
//! [`Error::Shape`] of `random_bits` at the caller's line, a value outside its domain
//! (a probability, a rate, an interval) an [`Error::Random`] there.

use super::builder::{Builder, Tensor, any_poisoned};
use super::literal::Literal;
use super::op::Op;
use crate::error::Error;
use crate::types::{DType, Location, Shape};

/// What [`Op::RandomBits`] makes of the two words `(y0, y1)` of each counter's block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RandomOutput {
    /// `y0 ^ y1`: 32 random bits per element (JAX's 32-bit `random_bits`).
    Bits,
    /// Both words as a new key: the result has a trailing dim of 2 (JAX's `split` and
    /// `fold_in`).
    Key,
}

/// The rotation of the word `x1` in each round (Salmon et al. 2011, table 4).
const ROTATIONS: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];

/// The key-schedule parity constant of Threefish/threefry-2x32.
const PARITY: u32 = 0x1BD1_1BDA;

/// Threefry-2x32 with 20 rounds (Random123's `threefry2x32_20`): the block of the
/// counter `(x0, x1)` under `key`. A bijection of the counter for each key; the
/// published known-answer vectors are checked in this module's tests.
pub fn threefry2x32(key: [u32; 2], counter: [u32; 2]) -> [u32; 2] {
    let [[y0], [y1]] = threefry2x32_lanes(key, [counter[0]], [counter[1]]);
    [y0, y1]
}

/// [`threefry2x32`] of `L` counters `(x0[l], x1[l])` at once: plain arrays, which the
/// compiler turns into vector instructions where the caller enables them (the kernel
/// runs it under `pulp`'s run-time dispatch).
#[inline(always)]
pub(crate) fn threefry2x32_lanes<const L: usize>(
    key: [u32; 2],
    x0: [u32; L],
    x1: [u32; L],
) -> [[u32; L]; 2] {
    let schedule = [key[0], key[1], key[0] ^ key[1] ^ PARITY];
    let mut x0 = x0.map(|x| x.wrapping_add(schedule[0]));
    let mut x1 = x1.map(|x| x.wrapping_add(schedule[1]));
    for injection in 1..=5u32 {
        for r in 0..4 {
            let rotation = ROTATIONS[(4 * (injection as usize - 1) + r) % 8];
            for l in 0..L {
                x0[l] = x0[l].wrapping_add(x1[l]);
                x1[l] = x1[l].rotate_left(rotation) ^ x0[l];
            }
        }
        let i = injection as usize;
        for l in 0..L {
            x0[l] = x0[l].wrapping_add(schedule[i % 3]);
            x1[l] = (x1[l].wrapping_add(schedule[(i + 1) % 3])).wrapping_add(injection);
        }
    }
    [x0, x1]
}

/// The words of a key literal (`i32[2]`, bits reinterpreted), if it is one.
pub(crate) fn key_words(key: &Literal) -> Option<[u32; 2]> {
    let a = key.as_i32()?;
    match a.as_slice()? {
        &[k0, k1] => Some([k0 as u32, k1 as u32]),
        _ => None,
    }
}

/// The key of `seed` as a host value (`i32[2]`): `[0, seed]`, the key
/// `jax.random.PRNGKey(seed)` makes of a 32-bit seed. Pass it as a program's input to
/// change the stream without tracing again.
pub fn key_data(seed: u32) -> Literal {
    key_literal([0, seed])
}

/// The key literal (`i32[2]`, bits reinterpreted) of two words: [`key_words`]' inverse.
fn key_literal([k0, k1]: [u32; 2]) -> Literal {
    Literal::I32(ndarray::arr1(&[k0 as i32, k1 as i32]).into_dyn())
}

/// [`fold_in`] on the host: the key `threefry2x32(key, (0, data))` as a literal, e.g.
/// the key of step `t` made from a seed's key, to pass as a program's input. A `key`
/// that is not an `i32[2]` literal is an [`Error::Random`] at the caller's line.
#[track_caller]
pub fn fold_in_data(key: &Literal, data: u32) -> crate::error::Result<Literal> {
    let location = Location::caller();
    let words = key_words(key).ok_or_else(|| Error::Random {
        op: "fold_in",
        location,
        message: format!(
            "a key is an i32[2] literal, got {}{:?}",
            key.dtype(),
            key.shape()
        ),
    })?;
    Ok(key_literal(threefry2x32(words, [0, data])))
}

/// [`key_data`] as a constant of `b`.
#[track_caller]
pub fn key(b: &Builder, seed: u32) -> Tensor {
    b.constant(key_data(seed))
}

/// The [`Op::RandomBits`] of `key` over `shape` (row-major counters from `base`).
#[track_caller]
fn random_bits(key: &Tensor, base: &Tensor, shape: Shape, output: RandomOutput) -> Tensor {
    let mut strides = vec![1usize; shape.len()];
    for d in (1..shape.len()).rev() {
        strides[d - 1] = strides[d].saturating_mul(shape[d]);
    }
    let op = Op::RandomBits {
        shape,
        strides,
        output,
    };
    super::builder::push(key, op, &[base], Location::caller())
}

/// A zero counter base in `key`'s builder.
#[track_caller]
fn zero_base(key: &Tensor) -> Tensor {
    key.builder().constant(Literal::full(&[], DType::I32, 0.0))
}

/// 32 random bits per element of `shape` (an i32 tensor, bits reinterpreted): element
/// `i` (row-major) is `y0 ^ y1` of `threefry2x32(key, (0, i))`. At most 2^32 elements.
#[track_caller]
pub fn bits(key: &Tensor, shape: impl Into<Shape>) -> Tensor {
    random_bits(key, &zero_base(key), shape.into(), RandomOutput::Bits)
}

/// `n` new keys from `key` (JAX's `split`): key `i` is `threefry2x32(key, (0, i))`,
/// which is also `fold_in(key, i)`. Draw from the new keys, not from `key` (see the
/// module docs).
#[track_caller]
pub fn split(key: &Tensor, n: usize) -> Vec<Tensor> {
    let keys = split_stacked(key, n);
    (0..n)
        .map(|i| keys.slice(&[i, 0], &[i + 1, 2], &[1, 1]).reshape([2]))
        .collect()
}

/// The keys of [`split`] as one `i32[n, 2]` tensor, row `i` key `i` (JAX's array of
/// keys): its rows may be sharded, e.g. one key per example of a split batch.
#[track_caller]
pub fn split_stacked(key: &Tensor, n: usize) -> Tensor {
    random_bits(key, &zero_base(key), vec![n], RandomOutput::Key)
}

/// A new key from `key` and the i32 scalar `data` (read as a u32; JAX's `fold_in`):
/// `threefry2x32(key, (0, data))`. Folding in a traced step counter or a layer index
/// gives each step or layer its own stream from one key.
#[track_caller]
pub fn fold_in(key: &Tensor, data: &Tensor) -> Tensor {
    random_bits(key, data, vec![], RandomOutput::Key)
}

/// [`fold_in`] of a number known when tracing (a layer's index, a dropout site): the
/// key `threefry2x32(key, (0, data))`, as JAX's `fold_in(key, 3)`.
#[track_caller]
pub fn fold_in_index(key: &Tensor, data: u32) -> Tensor {
    let data = key
        .builder()
        .constant(Literal::I32(ndarray::arr0(data as i32).into_dyn()));
    fold_in(key, &data)
}

/// Floats uniform in `[lo, hi)` of `shape` (f32; JAX's `uniform`): the top 23 of
/// [`bits`] as the mantissa of a float in `[1, 2)`, minus 1, scaled to the interval.
/// An [`Error::Random`] unless `lo < hi`, both finite.
#[track_caller]
pub fn uniform(key: &Tensor, shape: impl Into<Shape>, lo: f32, hi: f32) -> Tensor {
    if !(lo.is_finite() && hi.is_finite() && lo < hi) {
        let message = format!("needs finite lo < hi, got [{lo}, {hi})");
        return fail(key, "uniform", message);
    }
    let unit = unit_floats(&bits(key, shape));
    let lo_t = unit.scalar_like(lo as f64);
    (unit * (hi - lo) + lo).max(&lo_t)
}

/// `m * 2^-23` for the top 23 bits `m` of the u32 `bits` (i32, reinterpreted): floats
/// in `[0, 1)` on a grid of `2^-23`, each exact.
#[track_caller]
fn unit_floats(bits: &Tensor) -> Tensor {
    // The IR has no shifts: the low 31 bits are `bits - i32::MIN` where the top bit is
    // set (wrapping i32 arithmetic), their top 22 bits a division by 2^9, and the top
    // bit adds 2^22.
    let negative = bits.lt(&bits.scalar_like(0.0));
    let low = negative.select(&(bits - &bits.scalar_like(i32::MIN as f64)), bits);
    let top = negative.select(&bits.scalar_like((1 << 22) as f64), &bits.scalar_like(0.0));
    let mantissa = low.div(&bits.scalar_like(512.0)) + top;
    mantissa.convert(DType::F32) * (1.0 / (1 << 23) as f32)
}

/// Standard normal floats of `shape` (f32), by Box–Muller on two uniform draws from
/// the keys of `split(key, 2)`: `sqrt(-2 ln u) cos(2 pi v)` with `u` in `(0, 1]`.
#[track_caller]
pub fn normal(key: &Tensor, shape: impl Into<Shape>) -> Tensor {
    let shape: Shape = shape.into();
    let keys = split(key, 2);
    let u = 1.0 - unit_floats(&bits(&keys[0], shape.clone()));
    let v = unit_floats(&bits(&keys[1], shape));
    let radius = (u.log() * -2.0).sqrt();
    radius * (v * std::f32::consts::TAU).cos()
}

/// Bools of `shape`, true with probability `p` (JAX's `bernoulli`: `uniform < p`).
/// An [`Error::Random`] unless `0 <= p <= 1`.
#[track_caller]
pub fn bernoulli(key: &Tensor, p: f64, shape: impl Into<Shape>) -> Tensor {
    if !(0.0..=1.0).contains(&p) {
        return fail(
            key,
            "bernoulli",
            format!("needs a probability in [0, 1], got {p}"),
        );
    }
    let u = unit_floats(&bits(key, shape));
    u.lt(&u.scalar_like(p))
}

/// Inverted dropout of the float tensor `x`: each element kept with probability
/// `1 - rate` (an independent [`bernoulli`] draw from `key` per element) and divided
/// by `1 - rate` (as Flax's `Dropout`), the others zero, so the expectation is `x`;
/// `rate = 0` is `x` itself. The gradient flows to `x` through the kept elements; none
/// to the key. An [`Error::Random`] unless `0 <= rate < 1`, an [`Error::Shape`] for a
/// non-float `x`.
#[track_caller]
pub fn dropout(x: &Tensor, rate: f64, key: &Tensor) -> Tensor {
    let location = Location::caller();
    if any_poisoned(&[x, key]) {
        return x.poisoned();
    }
    if !x.dtype().is_float() {
        return x.fail(
            "dropout",
            location,
            format!("needs a float tensor, got {}", x.ty()),
        );
    }
    if !(0.0..1.0).contains(&rate) {
        return fail(x, "dropout", format!("needs a rate in [0, 1), got {rate}"));
    }
    if rate == 0.0 {
        return x.clone();
    }
    let keep_probability = 1.0 - rate;
    let keep = bernoulli(key, keep_probability, x.shape().to_vec());
    let scaled = x / &x.scalar_like(keep_probability);
    keep.select(&scaled, &x.scalar_like(0.0))
}

/// Records an [`Error::Random`] of `op` at the caller's line; a poisoned handle.
#[track_caller]
fn fail(t: &Tensor, op: &'static str, message: String) -> Tensor {
    let location = Location::caller();
    if !any_poisoned(&[t]) {
        t.builder().record_error(Error::Random {
            op,
            location,
            message,
        });
    }
    t.poisoned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known-answer vectors for `threefry2x32_20` (`kat_vectors`: counter,
    /// key, result), which JAX's `random_test.py` checks too.
    #[test]
    fn threefry_matches_the_known_answers() {
        let cases = [
            ([0, 0], [0, 0], [0x6b20_0159, 0x99ba_4efe]),
            (
                [u32::MAX, u32::MAX],
                [u32::MAX, u32::MAX],
                [0x1cb9_96fc, 0xbb00_2be7],
            ),
            (
                [0x243f_6a88, 0x85a3_08d3],
                [0x1319_8a2e, 0x0370_7344],
                [0xc492_3a9c, 0x483d_f7a0],
            ),
        ];
        for (counter, key, expected) in cases {
            assert_eq!(threefry2x32(key, counter), expected, "counter {counter:x?}");
        }
    }

    #[test]
    fn key_data_holds_the_seed_in_the_low_word() {
        assert_eq!(key_words(&key_data(7)), Some([0, 7]));
        assert_eq!(key_words(&key_data(u32::MAX)), Some([0, u32::MAX]));
        assert_eq!(key_words(&Literal::scalar_f32(1.0)), None);
    }
}
