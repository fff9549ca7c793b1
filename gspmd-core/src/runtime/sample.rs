//! Deterministic sample inputs for a program: for examples, smoke tests and benches
//! that need data of the right types but not any data in particular.

use ndarray::{ArrayD, IxDyn};

use crate::ir::{DType, Literal, Program};

/// One input per parameter of `program`, of its type, filled from a hash of `seed`, the
/// parameter's index and the element's position: f32 in `[-0.5, 0.5)`, i32 in `0..8`,
/// bool half true. The same arguments always give the same inputs.
pub fn sample_inputs(program: &Program, seed: u64) -> Vec<Literal> {
    program
        .params
        .iter()
        .enumerate()
        .map(|(k, &p)| {
            let ty = program.ty(p);
            let mut state = seed ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut next = move || {
                // splitmix64
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^ (z >> 31)
            };
            let n: usize = ty.shape.iter().product();
            let values: Vec<u64> = (0..n).map(|_| next()).collect();
            let shape = IxDyn(&ty.shape);
            // The element count is the shape's, so every array fits its shape.
            let lit = match ty.dtype {
                DType::F32 => ArrayD::from_shape_vec(
                    shape,
                    values
                        .iter()
                        .map(|&v| (v >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
                        .collect(),
                )
                .map(Literal::F32),
                DType::I32 => {
                    ArrayD::from_shape_vec(shape, values.iter().map(|&v| (v % 8) as i32).collect())
                        .map(Literal::I32)
                }
                DType::Bool => {
                    ArrayD::from_shape_vec(shape, values.iter().map(|&v| v & 1 == 1).collect())
                        .map(Literal::Bool)
                }
            };
            lit.unwrap_or_else(|_| Literal::full(&ty.shape, ty.dtype, 0.0))
        })
        .collect()
}
