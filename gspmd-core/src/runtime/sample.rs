//! Seeded random arrays: sample inputs for a program (examples, smoke tests, benches that
//! need data of the right types but not any data in particular) and the uniform arrays
//! tests draw their data from. One generator everywhere: [`Xoshiro256PlusPlus`] seeded
//! with [`SeedableRng::seed_from_u64`], a portable generator whose stream is fixed for
//! a given seed, so runs reproduce.

use ndarray::{ArrayD, IxDyn};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{Rng, RngExt, SeedableRng};

use crate::ir::{DType, Literal, Program};

/// One input per parameter of `program`, of its type, drawn in parameter order from one
/// generator seeded with `seed`: f32 uniform in `[-0.5, 0.5)` (bf16 and f16: those values
/// rounded), i32 uniform in `0..8`,
/// bool true with probability one half. The same arguments always give the same inputs.
pub fn sample_inputs(program: &Program, seed: u64) -> Vec<Literal> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    program
        .params
        .iter()
        .map(|&p| {
            let ty = program.ty(p);
            match ty.dtype {
                DType::F32 => uniform_f32(&mut rng, &ty.shape, -0.5, 0.5),
                DType::BF16 | DType::F16 => {
                    uniform_f32(&mut rng, &ty.shape, -0.5, 0.5).convert(ty.dtype)
                }
                DType::I32 => uniform_i32(&mut rng, &ty.shape, 0, 8),
                DType::Bool => Literal::Bool(from_fn(&ty.shape, || rng.random_bool(0.5))),
            }
        })
        .collect()
}

/// An f32 array of `shape` with elements uniform in `[lo, hi)` (`lo < hi`, both finite).
pub fn uniform_f32(rng: &mut impl Rng, shape: &[usize], lo: f32, hi: f32) -> Literal {
    Literal::F32(from_fn(shape, || rng.random_range(lo..hi)))
}

/// An i32 array of `shape` with elements uniform in `lo..hi` (`lo < hi`).
pub fn uniform_i32(rng: &mut impl Rng, shape: &[usize], lo: i32, hi: i32) -> Literal {
    Literal::I32(from_fn(shape, || rng.random_range(lo..hi)))
}

/// The array of `shape` whose elements, in row-major order, are successive calls of `f`.
fn from_fn<T>(shape: &[usize], mut f: impl FnMut() -> T) -> ArrayD<T> {
    ArrayD::from_shape_simple_fn(IxDyn(shape), &mut f)
}
