//! The reference interpreter against hand-computed results and naive loops: every
//! primitive op, every composite helper of the builder, input checking and errors.

use gspmd_core::Error;
use gspmd_core::ir::random;
use gspmd_core::ir::{
    Builder, DType, DotDims, GatherDims, Literal, OpKind, Padding, PropagationDirection,
    ReduceKind, ScatterDims, Tensor, WindowDim, einsum, verify,
};
use gspmd_core::runtime::interpret;
use gspmd_core::sharding::{DimSharding, Sharding};
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;

mod conv_cases;
mod op_coverage;

// ---- helpers ---------------------------------------------------------------------------

fn f32s(shape: &[usize], data: &[f32]) -> Literal {
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap())
}

fn i32s(shape: &[usize], data: &[i32]) -> Literal {
    Literal::I32(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap())
}

fn bools(shape: &[usize], data: &[bool]) -> Literal {
    Literal::Bool(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap())
}

/// Traces with `build`, verifies the program and runs it on `inputs`.
fn run(build: impl FnOnce(&Builder) -> Vec<Tensor>, inputs: &[Literal]) -> Vec<Literal> {
    let b = Builder::new("test");
    let outs = build(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    let program = b.finish(&refs).unwrap();
    verify(&program).unwrap();
    let outs = interpret(&program, inputs).unwrap();
    op_coverage::record("interpreted", &program);
    outs
}

/// Like [`run`] for a single output.
fn run1(build: impl FnOnce(&Builder) -> Tensor, inputs: &[Literal]) -> Literal {
    run(|b| vec![build(b)], inputs).remove(0)
}

/// Asserts `lit` is an f32 array of `shape` equal to `expected` within a relative
/// tolerance of 1e-5 (NaN matches NaN).
fn assert_f32(lit: &Literal, shape: &[usize], expected: &[f32]) {
    let a = lit
        .as_f32()
        .unwrap_or_else(|| panic!("expected f32, got {lit:?}"));
    assert_eq!(a.shape(), shape, "shape of {a:?}");
    let got: Vec<f32> = a.iter().copied().collect();
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        let ok = (g.is_nan() && e.is_nan()) || g == e || (g - e).abs() <= 1e-5 * e.abs().max(1.0);
        assert!(
            ok,
            "element {i}: got {g}, expected {e}\n got {got:?}\n exp {expected:?}"
        );
    }
    assert_eq!(got.len(), expected.len());
}

fn assert_i32(lit: &Literal, shape: &[usize], expected: &[i32]) {
    assert_eq!(lit, &i32s(shape, expected));
}

fn assert_bool(lit: &Literal, shape: &[usize], expected: &[bool]) {
    assert_eq!(lit, &bools(shape, expected));
}

/// `[[1,2,3],[4,5,6]]`.
fn m23() -> Literal {
    f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.])
}

fn f32_param(b: &Builder, name: &str, shape: &[usize]) -> Tensor {
    b.parameter(name, shape.to_vec(), DType::F32)
}

// ---- elementwise -----------------------------------------------------------------------

/// A one-operand method of [`Tensor`].
type TensorOp = fn(&Tensor) -> Tensor;
/// The same function in f64, computed by `std`.
type Reference = fn(f64) -> f64;

#[test]
fn unary_f32_matches_std() {
    let xs = [0.25f32, 1.0, 2.5, 9.0];
    let cases: [(TensorOp, Reference); 8] = [
        (Tensor::neg, |v| -v),
        (Tensor::abs, f64::abs),
        (Tensor::exp, f64::exp),
        (Tensor::log, f64::ln),
        (Tensor::sqrt, f64::sqrt),
        (Tensor::rsqrt, |v| 1.0 / v.sqrt()),
        (Tensor::tanh, f64::tanh),
        (Tensor::logistic, |v| 1.0 / (1.0 + (-v).exp())),
    ];
    for (op, reference) in cases {
        for sign in [1.0f32, -1.0] {
            let input: Vec<f32> = xs.iter().map(|v| v * sign).collect();
            let expected: Vec<f32> = input
                .iter()
                .map(|&v| reference(f64::from(v)) as f32)
                .collect();
            let out = run1(|b| op(&f32_param(b, "x", &[4])), &[f32s(&[4], &input)]);
            assert_f32(&out, &[4], &expected);
        }
    }
}

#[test]
fn unary_i32_and_bool() {
    let out = run(
        |b| {
            let x = b.parameter("x", [4], DType::I32);
            let p = b.parameter("p", [2], DType::Bool);
            vec![x.neg(), x.abs(), p.not()]
        },
        &[
            i32s(&[4], &[3, -7, 0, i32::MIN]),
            bools(&[2], &[true, false]),
        ],
    );
    // Wrapping, as in XLA: -MIN and |MIN| are MIN.
    assert_i32(&out[0], &[4], &[-3, 7, 0, i32::MIN]);
    assert_i32(&out[1], &[4], &[3, 7, 0, i32::MIN]);
    assert_bool(&out[2], &[2], &[false, true]);
}

#[test]
fn binary_f32_by_hand() {
    let a = f32s(&[4], &[1., -2., 3., 4.]);
    let b_ = f32s(&[4], &[2., 5., -1., 0.5]);
    let out = run(
        |b| {
            let (x, y) = (f32_param(b, "a", &[4]), f32_param(b, "b", &[4]));
            vec![
                x.add(&y),
                x.sub(&y),
                x.mul(&y),
                x.div(&y),
                x.max(&y),
                x.min(&y),
                x.pow(&y),
            ]
        },
        &[a, b_],
    );
    assert_f32(&out[0], &[4], &[3., 3., 2., 4.5]);
    assert_f32(&out[1], &[4], &[-1., -7., 4., 3.5]);
    assert_f32(&out[2], &[4], &[2., -10., -3., 2.]);
    assert_f32(&out[3], &[4], &[0.5, -0.4, -3., 8.]);
    assert_f32(&out[4], &[4], &[2., 5., 3., 4.]);
    assert_f32(&out[5], &[4], &[1., -2., -1., 0.5]);
    assert_f32(&out[6], &[4], &[1., -32., 1. / 3., 2.]);
}

#[test]
fn max_and_min_propagate_nan() {
    let out = run(
        |b| {
            let (x, y) = (f32_param(b, "a", &[2]), f32_param(b, "b", &[2]));
            vec![x.max(&y), x.min(&y)]
        },
        &[f32s(&[2], &[f32::NAN, 1.]), f32s(&[2], &[1., f32::NAN])],
    );
    assert_f32(&out[0], &[2], &[f32::NAN, f32::NAN]);
    assert_f32(&out[1], &[2], &[f32::NAN, f32::NAN]);
}

#[test]
fn binary_i32_by_hand() {
    let a = i32s(&[6], &[7, -7, 7, -7, 5, i32::MAX]);
    let b_ = i32s(&[6], &[2, 2, -2, -2, 0, 1]);
    let out = run(
        |b| {
            let x = b.parameter("a", [6], DType::I32);
            let y = b.parameter("b", [6], DType::I32);
            vec![
                x.add(&y),
                x.sub(&y),
                x.mul(&y),
                x.div(&y),
                x.max(&y),
                x.min(&y),
            ]
        },
        &[a, b_],
    );
    assert_i32(&out[0], &[6], &[9, -5, 5, -9, 5, i32::MIN]); // MAX + 1 wraps
    assert_i32(&out[1], &[6], &[5, -9, 9, -5, 5, i32::MAX - 1]);
    assert_i32(&out[2], &[6], &[14, -14, -14, 14, 0, i32::MAX]);
    // Truncation toward zero; x / 0 = -1 (XLA).
    assert_i32(&out[3], &[6], &[3, -3, -3, 3, -1, i32::MAX]);
    assert_i32(&out[4], &[6], &[7, 2, 7, -2, 5, i32::MAX]);
    assert_i32(&out[5], &[6], &[2, -7, -2, -7, 0, 1]);
}

#[test]
fn pow_i32_by_hand() {
    let out = run1(
        |b| {
            let x = b.parameter("a", [7], DType::I32);
            let y = b.parameter("b", [7], DType::I32);
            x.pow(&y)
        },
        &[
            i32s(&[7], &[2, -3, 5, 2, 1, -1, -1]),
            i32s(&[7], &[3, 2, 0, -1, -4, -3, -2]),
        ],
    );
    assert_i32(&out, &[7], &[8, 9, 1, 0, 1, -1, 1]);
}

#[test]
fn bool_logic() {
    let out = run(
        |b| {
            let p = b.parameter("p", [4], DType::Bool);
            let q = b.parameter("q", [4], DType::Bool);
            vec![p.and(&q), p.or(&q), p.not()]
        },
        &[
            bools(&[4], &[false, false, true, true]),
            bools(&[4], &[false, true, false, true]),
        ],
    );
    assert_bool(&out[0], &[4], &[false, false, false, true]);
    assert_bool(&out[1], &[4], &[false, true, true, true]);
    assert_bool(&out[2], &[4], &[true, true, false, false]);
}

#[test]
fn compare_all_dtypes() {
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[3]);
            let y = f32_param(b, "y", &[3]);
            let i = b.parameter("i", [3], DType::I32);
            let j = b.parameter("j", [3], DType::I32);
            let p = b.parameter("p", [2], DType::Bool);
            let q = b.parameter("q", [2], DType::Bool);
            vec![
                x.eq(&y),
                x.ne(&y),
                x.lt(&y),
                x.le(&y),
                x.gt(&y),
                x.ge(&y),
                i.lt(&j),
                i.ge(&j),
                p.eq(&q),
                p.lt(&q),
            ]
        },
        &[
            f32s(&[3], &[1., 2., f32::NAN]),
            f32s(&[3], &[2., 2., 1.]),
            i32s(&[3], &[-1, 0, 5]),
            i32s(&[3], &[0, 0, 4]),
            bools(&[2], &[false, true]),
            bools(&[2], &[true, true]),
        ],
    );
    let (t, f) = (true, false);
    assert_bool(&out[0], &[3], &[f, t, f]);
    assert_bool(&out[1], &[3], &[t, f, t]); // NaN != anything
    assert_bool(&out[2], &[3], &[t, f, f]);
    assert_bool(&out[3], &[3], &[t, t, f]);
    assert_bool(&out[4], &[3], &[f, f, f]);
    assert_bool(&out[5], &[3], &[f, t, f]);
    assert_bool(&out[6], &[3], &[t, f, f]);
    assert_bool(&out[7], &[3], &[f, t, t]);
    assert_bool(&out[8], &[2], &[f, t]);
    assert_bool(&out[9], &[2], &[t, f]); // false < true
}

#[test]
fn select_with_broadcast_branches() {
    let out = run1(
        |b| {
            let x = f32_param(b, "x", &[2, 3]);
            let zero = b.scalar(0.0);
            x.gt(&zero).select(&x, &b.scalar(-1.0))
        },
        &[f32s(&[2, 3], &[1., -2., 0., -4., 5., 6.])],
    );
    assert_f32(&out, &[2, 3], &[1., -1., -1., -1., 5., 6.]);
}

#[test]
fn convert_edge_cases() {
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[8]);
            let i = b.parameter("i", [4], DType::I32);
            let p = b.parameter("p", [2], DType::Bool);
            vec![
                x.convert(DType::I32),
                x.convert(DType::Bool),
                i.convert(DType::F32),
                i.convert(DType::Bool),
                p.convert(DType::F32),
                p.convert(DType::I32),
                x.convert(DType::F32),
            ]
        },
        &[
            f32s(&[8], &[-2.7, -0.5, 0.0, -0.0, 0.5, 2.9, 3e9, f32::NAN]),
            i32s(&[4], &[0, -3, 16_777_217, i32::MIN]),
            bools(&[2], &[true, false]),
        ],
    );
    // f32 -> i32 truncates toward zero, saturates, NaN -> 0.
    assert_i32(&out[0], &[8], &[-2, 0, 0, 0, 0, 2, i32::MAX, 0]);
    // Non-zero (including NaN) is true; -0.0 is zero.
    let (t, f) = (true, false);
    assert_bool(&out[1], &[8], &[t, t, f, f, t, t, t, t]);
    // 2^24 + 1 rounds to 2^24 in f32.
    assert_f32(&out[2], &[4], &[0., -3., 16_777_216., -2_147_483_648.]);
    assert_bool(&out[3], &[4], &[f, t, t, t]);
    assert_f32(&out[4], &[2], &[1., 0.]);
    assert_i32(&out[5], &[2], &[1, 0]);
    assert_f32(
        &out[6],
        &[8],
        &[-2.7, -0.5, 0.0, -0.0, 0.5, 2.9, 3e9, f32::NAN],
    );
}

// ---- math ops --------------------------------------------------------------------------

#[test]
fn sin_cos_and_erf_match_references() {
    let xs = [0.0f32, 0.5, 1.0, -1.0, 2.0, -3.0, 10.0];
    // erf from tables (std has none).
    let erf = [
        0.0,
        0.520_499_9,
        0.842_700_8,
        -0.842_700_8,
        0.995_322_3,
        -0.999_977_9,
        1.0,
    ];
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[7]);
            vec![x.sin(), x.cos(), x.erf()]
        },
        &[f32s(&[7], &xs)],
    );
    let by =
        |f: fn(f64) -> f64| -> Vec<f32> { xs.iter().map(|&v| f(f64::from(v)) as f32).collect() };
    assert_f32(&out[0], &[7], &by(f64::sin));
    assert_f32(&out[1], &[7], &by(f64::cos));
    assert_f32(&out[2], &[7], &erf);
}

#[test]
fn floor_ceil_round_sign_and_is_finite_by_hand() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let xs = [
        -2.5f32, -1.5, -0.5, 0.5, 1.5, 2.5, 1.7, -1.2, 0.0, -0.0, inf, nan,
    ];
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[12]);
            let i = b.parameter("i", [4], DType::I32);
            vec![
                x.floor(),
                x.ceil(),
                x.round(),
                x.sign(),
                x.is_finite(),
                i.sign(),
            ]
        },
        &[f32s(&[12], &xs), i32s(&[4], &[-7, 0, 3, i32::MIN])],
    );
    let tail = [inf, nan];
    let with_tail = |head: &[f32]| [head, &tail].concat();
    assert_f32(
        &out[0],
        &[12],
        &with_tail(&[-3., -2., -1., 0., 1., 2., 1., -2., 0., -0.]),
    );
    assert_f32(
        &out[1],
        &[12],
        &with_tail(&[-2., -1., -0., 1., 2., 3., 2., -1., 0., -0.]),
    );
    // Ties to even, as jnp.round and torch.round.
    assert_f32(
        &out[2],
        &[12],
        &with_tail(&[-2., -2., -0., 0., 2., 2., 2., -1., 0., -0.]),
    );
    assert_f32(
        &out[3],
        &[12],
        &[-1., -1., -1., 1., 1., 1., 1., -1., 0., -0., 1., nan],
    );
    // Signed zeros kept: round(-0.5) and sign(-0) are -0.
    let bits = |l: &Literal, i: usize| l.as_f32().unwrap().as_slice().unwrap()[i].to_bits();
    assert_eq!(bits(&out[2], 2), (-0.0f32).to_bits());
    assert_eq!(bits(&out[3], 9), (-0.0f32).to_bits());
    let mut finite = [true; 12];
    finite[10] = false;
    finite[11] = false;
    assert_bool(&out[4], &[12], &finite);
    assert_i32(&out[5], &[4], &[-1, 0, 1, -1]);
}

#[test]
fn remainder_truncates_like_fmod_and_xla() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let out = run(
        |b| {
            let (x, y) = (f32_param(b, "a", &[7]), f32_param(b, "b", &[7]));
            let i = b.parameter("i", [7], DType::I32);
            let j = b.parameter("j", [7], DType::I32);
            vec![x.rem(&y), &i % &j, i.div(&j), &x % 2.0]
        },
        &[
            f32s(&[7], &[7., -7., 7., 5.5, 1., inf, 3.]),
            f32s(&[7], &[3., 3., -3., 2., 0., 2., inf]),
            i32s(&[7], &[7, -7, 7, -7, 5, i32::MIN, i32::MIN]),
            i32s(&[7], &[2, 2, -2, -2, 0, -1, 3]),
        ],
    );
    // The sign of the dividend; x % 0 and inf % y are NaN, x % inf = x.
    assert_f32(&out[0], &[7], &[1., -1., 1., 1.5, nan, nan, 3.]);
    // XLA's integer remainder and division: x % 0 = x, x / 0 = -1, MIN / -1 = MIN,
    // MIN % -1 = 0; both truncate toward zero.
    assert_i32(&out[1], &[7], &[1, -1, 1, -1, 5, 0, -2]);
    assert_i32(&out[2], &[7], &[3, -3, -3, 3, -1, i32::MIN, -715_827_882]);
    assert_f32(&out[3], &[7], &[1., -1., 1., 1.5, 1., nan, 1.]);
}

#[test]
fn python_remainder_floor_divide_clamp_and_exact_gelu() {
    let out = run(
        |b| {
            let (x, y) = (f32_param(b, "a", &[5]), f32_param(b, "b", &[5]));
            let i = b.parameter("i", [5], DType::I32);
            let j = b.parameter("j", [5], DType::I32);
            let g = f32_param(b, "g", &[5]);
            vec![
                x.remainder(&y),
                i.remainder(&j),
                x.floor_divide(&y),
                i.floor_divide(&j),
                x.clamp_scalar(-1.0, 2.0),
                x.clamp(&y.neg(), &y.abs()),
                g.gelu_exact(),
            ]
        },
        &[
            f32s(&[5], &[7., -7., 7., -7., 6.]),
            f32s(&[5], &[3., 3., -3., -3., 3.]),
            i32s(&[5], &[7, -7, 7, -7, -6]),
            i32s(&[5], &[3, 3, -3, -3, 0]),
            f32s(&[5], &[0., 1., -1., 2., 0.5]),
        ],
    );
    // The sign of the divisor, as Python's %; exact multiples give 0.
    assert_f32(&out[0], &[5], &[1., 2., -2., -1., 0.]);
    assert_i32(&out[1], &[5], &[1, 2, -2, -1, -6]);
    assert_f32(&out[2], &[5], &[2., -3., -3., 2., 2.]);
    // -6 // 0 = -1 (XLA's division by zero; the remainder is -6 then).
    assert_i32(&out[3], &[5], &[2, -3, -3, 2, -1]);
    assert_f32(&out[4], &[5], &[2., -1., 2., -1., 2.]);
    assert_f32(&out[5], &[5], &[3., -3., 3., 3., 3.]);
    // x Phi(x), Phi the standard normal CDF.
    assert_f32(
        &out[6],
        &[5],
        &[0., 0.841_344_7, -0.158_655_25, 1.954_499_7, 0.345_731_23],
    );
}

// ---- generated arrays ------------------------------------------------------------------

#[test]
fn constant_and_iota() {
    let out = run(
        |b| {
            vec![
                b.constant(f32s(&[2], &[1.5, -2.0])),
                b.iota([2, 3], 1, DType::I32),
                b.iota([2, 3], 0, DType::F32),
                b.full([2], DType::I32, 7.0),
            ]
        },
        &[],
    );
    assert_f32(&out[0], &[2], &[1.5, -2.0]);
    assert_i32(&out[1], &[2, 3], &[0, 1, 2, 0, 1, 2]);
    assert_f32(&out[2], &[2, 3], &[0., 0., 0., 1., 1., 1.]);
    assert_i32(&out[3], &[2], &[7, 7]);
}

// ---- data movement ---------------------------------------------------------------------

#[test]
fn broadcast_in_dim_cases() {
    let out = run(
        |b| {
            let row = f32_param(b, "row", &[3]);
            let col = f32_param(b, "col", &[2]);
            let one_row = f32_param(b, "one_row", &[1, 3]);
            let s = f32_param(b, "s", &[]);
            vec![
                row.broadcast_in_dim([2, 3], &[1]),
                col.broadcast_in_dim([2, 3], &[0]),
                one_row.broadcast_in_dim([2, 3], &[0, 1]),
                s.broadcast_in_dim([2, 2], &[]),
                col.broadcast_in_dim([2, 2, 2], &[1]),
            ]
        },
        &[
            f32s(&[3], &[1., 2., 3.]),
            f32s(&[2], &[10., 20.]),
            f32s(&[1, 3], &[4., 5., 6.]),
            f32s(&[], &[9.]),
        ],
    );
    assert_f32(&out[0], &[2, 3], &[1., 2., 3., 1., 2., 3.]);
    assert_f32(&out[1], &[2, 3], &[10., 10., 10., 20., 20., 20.]);
    assert_f32(&out[2], &[2, 3], &[4., 5., 6., 4., 5., 6.]);
    assert_f32(&out[3], &[2, 2], &[9.; 4]);
    assert_f32(
        &out[4],
        &[2, 2, 2],
        &[10., 10., 20., 20., 10., 10., 20., 20.],
    );
}

#[test]
fn reshape_is_row_major_even_after_transpose() {
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[2, 3]);
            vec![x.reshape([3, 2]), x.transpose(&[1, 0]).reshape([6])]
        },
        &[m23()],
    );
    assert_f32(&out[0], &[3, 2], &[1., 2., 3., 4., 5., 6.]);
    assert_f32(&out[1], &[6], &[1., 4., 2., 5., 3., 6.]);
}

#[test]
fn transpose_3d_against_index_formula() {
    // x[i][j][k] = 100 i + 10 j + k; perm [2, 0, 1] gives out[k][i][j] = x[i][j][k].
    let data: Vec<f32> = (0..2)
        .flat_map(|i| (0..3).flat_map(move |j| (0..4).map(move |k| (100 * i + 10 * j + k) as f32)))
        .collect();
    let expected: Vec<f32> = (0..4)
        .flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| (100 * i + 10 * j + k) as f32)))
        .collect();
    let out = run1(
        |b| f32_param(b, "x", &[2, 3, 4]).transpose(&[2, 0, 1]),
        &[f32s(&[2, 3, 4], &data)],
    );
    assert_f32(&out, &[4, 2, 3], &expected);
}

#[test]
fn strided_slices() {
    let out = run(
        |b| {
            let v = b.iota([10], 0, DType::I32);
            // m[r][c] = 10 r + c.
            let m = b
                .iota([3, 4], 0, DType::I32)
                .mul(&b.full([3, 4], DType::I32, 10.0))
                .add(&b.iota([3, 4], 1, DType::I32));
            vec![
                v.slice(&[1], &[8], &[3]),
                v.slice(&[2], &[10], &[4]),
                m.slice(&[0, 1], &[3, 4], &[2, 2]),
                m.slice_axis(-1, 1, 3),
                v.slice(&[4], &[4], &[1]),
            ]
        },
        &[],
    );
    assert_i32(&out[0], &[3], &[1, 4, 7]);
    assert_i32(&out[1], &[2], &[2, 6]);
    assert_i32(&out[2], &[2, 2], &[1, 3, 21, 23]);
    assert_i32(&out[3], &[3, 2], &[1, 2, 11, 12, 21, 22]);
    assert_i32(&out[4], &[0], &[]);
}

#[test]
fn roll_moves_elements_cyclically_like_jnp_roll() {
    let out = run(
        |b| {
            let v = b.iota([5], 0, DType::I32);
            // m[r][c] = 10 r + c.
            let m = b
                .iota([2, 3], 0, DType::I32)
                .mul(&b.full([2, 3], DType::I32, 10.0))
                .add(&b.iota([2, 3], 1, DType::I32));
            vec![
                v.roll(1, 0),
                v.roll(-2, 0),
                v.roll(7, -1),
                v.roll(5, 0),
                m.roll(1, 1),
                m.roll(-1, 0),
            ]
        },
        &[],
    );
    assert_i32(&out[0], &[5], &[4, 0, 1, 2, 3]);
    assert_i32(&out[1], &[5], &[2, 3, 4, 0, 1]);
    assert_i32(&out[2], &[5], &[3, 4, 0, 1, 2]);
    assert_i32(&out[3], &[5], &[0, 1, 2, 3, 4]);
    assert_i32(&out[4], &[2, 3], &[2, 0, 1, 12, 10, 11]);
    assert_i32(&out[5], &[2, 3], &[10, 11, 12, 0, 1, 2]);
}

#[test]
fn pad_negative_edges_and_interior() {
    let out = run(
        |b| {
            let v = f32_param(b, "v", &[3]);
            let m = f32_param(b, "m", &[2, 2]);
            let p = b.parameter("p", [2], DType::Bool);
            let zero = b.scalar(0.0);
            let nine = b.scalar(9.0);
            let yes = b.constant(bools(&[], &[true]));
            vec![
                // [1,2,3] -interior 1-> [1,0,2,0,3] -low -1-> [0,2,0,3] -high 2-> [0,2,0,3,0,0]
                v.pad(&zero, &[-1], &[2], &[1]),
                // dim 1: [[1,9,2],[3,9,4]], high -1 -> [[1,9],[3,9]]; dim 0: low 1 row of 9s.
                m.pad(&nine, &[1, 0], &[0, -1], &[0, 1]),
                // Everything cut away.
                v.pad(&zero, &[-2], &[-1], &[0]),
                p.pad(&yes, &[1], &[0], &[2]),
            ]
        },
        &[
            f32s(&[3], &[1., 2., 3.]),
            f32s(&[2, 2], &[1., 2., 3., 4.]),
            bools(&[2], &[false, false]),
        ],
    );
    assert_f32(&out[0], &[6], &[0., 2., 0., 3., 0., 0.]);
    assert_f32(&out[1], &[3, 2], &[9., 9., 1., 9., 3., 9.]);
    assert_f32(&out[2], &[0], &[]);
    assert_bool(&out[3], &[5], &[true, false, true, true, false]);
}

#[test]
fn concatenate_three_operands() {
    let out = run1(
        |b| {
            let a = f32_param(b, "a", &[2, 1]);
            let c = f32_param(b, "c", &[2, 2]);
            let d = f32_param(b, "d", &[2, 3]);
            b.concatenate(&[&a, &c, &d], 1)
        },
        &[
            f32s(&[2, 1], &[1., 2.]),
            f32s(&[2, 2], &[3., 4., 5., 6.]),
            f32s(&[2, 3], &[7., 8., 9., 10., 11., 12.]),
        ],
    );
    assert_f32(
        &out,
        &[2, 6],
        &[1., 3., 4., 7., 8., 9., 2., 5., 6., 10., 11., 12.],
    );
}

#[test]
fn sharding_constraint_is_identity() {
    let out = run1(
        |b| {
            let x = f32_param(b, "x", &[2, 3]);
            x.shard(Sharding {
                dims: vec![DimSharding::default(); 2],
                ..Sharding::default()
            })
        },
        &[m23()],
    );
    assert_eq!(out, m23());
}

#[test]
fn propagation_barrier_is_identity() {
    let outs = run(
        |b| {
            let x = f32_param(b, "x", &[2, 3]);
            // The second barrier's operand is still used afterwards (no buffer reuse).
            let y = x.propagation_barrier(PropagationDirection::Forward);
            let z = y.propagation_barrier(PropagationDirection::None);
            vec![z, y.propagation_barrier(PropagationDirection::Backward)]
        },
        &[m23()],
    );
    assert_eq!(outs, [m23(), m23()]);
}

// ---- reductions ------------------------------------------------------------------------

#[test]
fn reduce_over_dims_0_and_2() {
    // x[i][j][k] = 12 i + 4 j + k over [2,3,4]. Over i in {0,1}, k in 0..4:
    // sum = 4*12 + 8*4j + 2*(0+1+2+3) = 60 + 32 j; max = 12 + 4j + 3; min = 4j.
    let out = run(
        |b| {
            let x = b.iota([24], 0, DType::F32).reshape([2, 3, 4]);
            let xi = x.convert(DType::I32);
            vec![
                x.sum(&[0, 2]),
                x.max_over(&[0, -1]),
                x.min_over(&[2, 0]),
                xi.sum(&[0, 2]),
                x.sum(&[0, 1, 2]),
                x.reduce(ReduceKind::Sum, &[1], true),
            ]
        },
        &[],
    );
    assert_f32(&out[0], &[3], &[60., 92., 124.]);
    assert_f32(&out[1], &[3], &[15., 19., 23.]);
    assert_f32(&out[2], &[3], &[0., 4., 8.]);
    assert_i32(&out[3], &[3], &[60, 92, 124]);
    assert_f32(&out[4], &[], &[276.]); // 0 + 1 + ... + 23
    // keep_dims: sum over j of 12 i + 4 j + k = 36 i + 12 + 3 k.
    let expected: Vec<f32> = (0..2)
        .flat_map(|i| (0..4).map(move |k| (36 * i + 12 + 3 * k) as f32))
        .collect();
    assert_f32(&out[5], &[2, 1, 4], &expected);
}

#[test]
fn reduce_identities_on_empty_dims() {
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[0, 3]);
            let i = b.parameter("i", [0, 2], DType::I32);
            vec![
                x.sum(&[0]),
                x.max_over(&[0]),
                x.min_over(&[0]),
                i.sum(&[0]),
                i.max_over(&[0]),
                i.min_over(&[0]),
            ]
        },
        &[f32s(&[0, 3], &[]), i32s(&[0, 2], &[])],
    );
    let inf = f32::INFINITY;
    assert_f32(&out[0], &[3], &[0.; 3]);
    assert_f32(&out[1], &[3], &[-inf; 3]);
    assert_f32(&out[2], &[3], &[inf; 3]);
    assert_i32(&out[3], &[2], &[0, 0]);
    assert_i32(&out[4], &[2], &[i32::MIN; 2]);
    assert_i32(&out[5], &[2], &[i32::MAX; 2]);
}

// ---- contractions ----------------------------------------------------------------------

/// Row-major flat index of `idx` in `shape`.
fn flat(shape: &[usize], idx: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i)
}

#[test]
fn dot_general_with_batch_dims_matches_naive_loop() {
    // lhs [k=4, b=2, m=3], rhs [b=2, n=5, k=4]: out[b][m][n] = sum_k lhs[k][b][m] rhs[b][n][k].
    let lhs: Vec<f32> = (0..24).map(|v| (v as f32) * 0.5 - 3.0).collect();
    let rhs: Vec<f32> = (0..40).map(|v| ((v * 7) % 11) as f32 - 5.0).collect();
    let mut expected = vec![0f32; 30];
    for b in 0..2 {
        for m in 0..3 {
            for n in 0..5 {
                expected[flat(&[2, 3, 5], &[b, m, n])] = (0..4)
                    .map(|k| lhs[flat(&[4, 2, 3], &[k, b, m])] * rhs[flat(&[2, 5, 4], &[b, n, k])])
                    .sum();
            }
        }
    }
    let out = run1(
        |bd| {
            let l = f32_param(bd, "l", &[4, 2, 3]);
            let r = f32_param(bd, "r", &[2, 5, 4]);
            l.dot_general(
                &r,
                DotDims {
                    lhs_batch: vec![1],
                    rhs_batch: vec![0],
                    lhs_contracting: vec![0],
                    rhs_contracting: vec![2],
                },
            )
        },
        &[f32s(&[4, 2, 3], &lhs), f32s(&[2, 5, 4], &rhs)],
    );
    assert_f32(&out, &[2, 3, 5], &expected);
}

#[test]
fn dot_general_two_contracting_dims_and_i32() {
    // lhs [a=2, m=3, c=4], rhs [c=4, a=2, n=2]: out[m][n] = sum_{a,c} lhs[a][m][c] rhs[c][a][n].
    let lhs: Vec<i32> = (0..24).map(|v| v % 5 - 2).collect();
    let rhs: Vec<i32> = (0..16).map(|v| v % 3 - 1).collect();
    let mut expected = vec![0i32; 6];
    for m in 0..3 {
        for n in 0..2 {
            for a in 0..2 {
                for c in 0..4 {
                    expected[m * 2 + n] +=
                        lhs[flat(&[2, 3, 4], &[a, m, c])] * rhs[flat(&[4, 2, 2], &[c, a, n])];
                }
            }
        }
    }
    let dims = DotDims {
        lhs_contracting: vec![0, 2],
        rhs_contracting: vec![1, 0],
        ..DotDims::default()
    };
    let out = run(
        |b| {
            let l = b.parameter("l", [2, 3, 4], DType::I32);
            let r = b.parameter("r", [4, 2, 2], DType::I32);
            let lf = l.convert(DType::F32);
            let rf = r.convert(DType::F32);
            vec![
                l.dot_general(&r, dims.clone()),
                lf.dot_general(&rf, dims.clone()),
            ]
        },
        &[i32s(&[2, 3, 4], &lhs), i32s(&[4, 2, 2], &rhs)],
    );
    assert_i32(&out[0], &[3, 2], &expected);
    let expected_f: Vec<f32> = expected.iter().map(|&v| v as f32).collect();
    assert_f32(&out[1], &[3, 2], &expected_f);
}

#[test]
fn dot_general_with_empty_contraction_is_zero() {
    let out = run1(
        |b| f32_param(b, "a", &[2, 0]).matmul(&f32_param(b, "b", &[0, 3])),
        &[f32s(&[2, 0], &[]), f32s(&[0, 3], &[])],
    );
    assert_f32(&out, &[2, 3], &[0.; 6]);
}

#[test]
fn matmul_forms() {
    let w = f32s(&[3, 2], &[7., 8., 9., 10., 11., 12.]);
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[2, 3]);
            let w = f32_param(b, "w", &[3, 2]);
            let xb = f32_param(b, "xb", &[2, 2, 3]);
            let wb = f32_param(b, "wb", &[2, 3, 2]);
            vec![x.matmul(&w), xb.matmul(&w), xb.matmul(&wb)]
        },
        &[
            m23(),
            w,
            // Batch 0: m23; batch 1: -m23.
            f32s(
                &[2, 2, 3],
                &[1., 2., 3., 4., 5., 6., -1., -2., -3., -4., -5., -6.],
            ),
            // Batch 0: w; batch 1: identity-like [[1,0],[0,1],[0,0]].
            f32s(
                &[2, 3, 2],
                &[7., 8., 9., 10., 11., 12., 1., 0., 0., 1., 0., 0.],
            ),
        ],
    );
    // [[1,2,3],[4,5,6]] x [[7,8],[9,10],[11,12]] = [[58,64],[139,154]].
    assert_f32(&out[0], &[2, 2], &[58., 64., 139., 154.]);
    assert_f32(
        &out[1],
        &[2, 2, 2],
        &[58., 64., 139., 154., -58., -64., -139., -154.],
    );
    assert_f32(
        &out[2],
        &[2, 2, 2],
        &[58., 64., 139., 154., -1., -2., -4., -5.],
    );
}

#[test]
fn einsum_two_operand_forms_match_naive_loops() {
    // x[b][s][d], w[d][f]: "bsd,df->bsf"; u[i][j], v[i][j]: "ij,ij->i";
    // p[b][i][j], q[b][j][k]: "bij,bjk->bki".
    let x: Vec<f32> = (0..24).map(|v| v as f32 * 0.25).collect();
    let w: Vec<f32> = (0..20).map(|v| 2.0 - v as f32 * 0.3).collect();
    let mut bsf = vec![0f32; 2 * 3 * 5];
    for b in 0..2 {
        for s in 0..3 {
            for f in 0..5 {
                bsf[flat(&[2, 3, 5], &[b, s, f])] = (0..4)
                    .map(|d| x[flat(&[2, 3, 4], &[b, s, d])] * w[flat(&[4, 5], &[d, f])])
                    .sum();
            }
        }
    }
    let rows: Vec<f32> = (0..3)
        .map(|i| (0..4).map(|j| x[i * 4 + j] * w[i * 4 + j]).sum())
        .collect();
    let mut bki = vec![0f32; 2 * 4 * 3];
    for b in 0..2 {
        for i in 0..3 {
            for k in 0..4 {
                bki[flat(&[2, 4, 3], &[b, k, i])] = (0..2)
                    .map(|j| x[flat(&[2, 3, 2], &[b, i, j])] * w[flat(&[2, 2, 4], &[b, j, k])])
                    .sum();
            }
        }
    }
    let out = run(
        |bd| {
            let xt = f32_param(bd, "x", &[2, 3, 4]);
            let wt = f32_param(bd, "w", &[4, 5]);
            let u = xt.reshape([6, 4]).slice_axis(0, 0, 3);
            let v = wt.reshape([20]).slice_axis(0, 0, 12).reshape([3, 4]);
            let p = xt.reshape([24]).slice_axis(0, 0, 12).reshape([2, 3, 2]);
            let q = wt.reshape([20]).slice_axis(0, 0, 16).reshape([2, 2, 4]);
            vec![
                einsum("bsd,df->bsf", &xt, &wt),
                einsum("ij,ij->i", &u, &v),
                einsum("bij,bjk->bki", &p, &q),
            ]
        },
        &[f32s(&[2, 3, 4], &x), f32s(&[4, 5], &w)],
    );
    assert_f32(&out[0], &[2, 3, 5], &bsf);
    assert_f32(&out[1], &[3], &rows);
    assert_f32(&out[2], &[2, 4, 3], &bki);
}

#[test]
fn einsum_one_operand_forms() {
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[2, 3]);
            let y = b.iota([24], 0, DType::F32).reshape([2, 3, 4]);
            vec![x.einsum("ij->ji"), y.einsum("bsd->bd"), x.einsum("ij->")]
        },
        &[m23()],
    );
    assert_f32(&out[0], &[3, 2], &[1., 4., 2., 5., 3., 6.]);
    // y[b][s][d] = 12 b + 4 s + d; sum over s = 36 b + 12 + 3 d.
    let expected: Vec<f32> = (0..2)
        .flat_map(|b| (0..4).map(move |d| (36 * b + 12 + 3 * d) as f32))
        .collect();
    assert_f32(&out[1], &[2, 4], &expected);
    assert_f32(&out[2], &[], &[21.]);
}

// ---- composite helpers -----------------------------------------------------------------

#[test]
fn relu_and_gelu_against_formulas() {
    let xs = [-3.0f32, -0.5, 0.0, 0.7, 2.0, 4.0];
    let gelu: Vec<f32> = xs
        .iter()
        .map(|&v| {
            let x = f64::from(v);
            let c = (2.0 / std::f64::consts::PI).sqrt();
            (0.5 * x * (1.0 + (c * (x + 0.044715 * x.powi(3))).tanh())) as f32
        })
        .collect();
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[6]);
            vec![x.relu(), x.gelu()]
        },
        &[f32s(&[6], &xs)],
    );
    assert_f32(&out[0], &[6], &[0., 0., 0., 0.7, 2., 4.]);
    assert_f32(&out[1], &[6], &gelu);
}

#[test]
fn softmax_and_log_softmax_by_hand() {
    // Row 0: [1,2,3] -> e^(x-3) / (e^-2 + e^-1 + 1); row 1: equal logits -> 1/3 each.
    let z = (-2f64).exp() + (-1f64).exp() + 1.0;
    let soft = [
        ((-2f64).exp() / z) as f32,
        ((-1f64).exp() / z) as f32,
        (1.0 / z) as f32,
        1. / 3.,
        1. / 3.,
        1. / 3.,
    ];
    let log_soft: Vec<f32> = soft.iter().map(|&p| p.ln()).collect();
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[2, 3]);
            let s = x.softmax(-1);
            vec![s.clone(), s.sum(&[1]), x.log_softmax(1)]
        },
        &[f32s(&[2, 3], &[1., 2., 3., 5., 5., 5.])],
    );
    assert_f32(&out[0], &[2, 3], &soft);
    assert_f32(&out[1], &[2], &[1., 1.]);
    assert_f32(&out[2], &[2, 3], &log_soft);
}

#[test]
fn layer_norm_and_mean() {
    // Row [1,2,3,4]: mean 2.5, variance 1.25; row [2,2,2,2]: centred to 0.
    let eps = 1e-5f32;
    let inv = 1.0 / (1.25f64 + f64::from(eps)).sqrt();
    let row0: Vec<f32> = [1.0, 2.0, 3.0, 4.0]
        .iter()
        .map(|&v: &f64| ((v - 2.5) * inv) as f32)
        .collect();
    let expected: Vec<f32> = row0.into_iter().chain([0.; 4]).collect();
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[2, 4]);
            vec![x.layer_norm(-1, eps), x.mean(&[1]), x.mean(&[0, 1])]
        },
        &[f32s(&[2, 4], &[1., 2., 3., 4., 2., 2., 2., 2.])],
    );
    assert_f32(&out[0], &[2, 4], &expected);
    assert_f32(&out[1], &[2], &[2.5, 2.]);
    assert_f32(&out[2], &[], &[2.25]);
}

#[test]
fn numpy_broadcasting_and_scalar_operators() {
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[2, 3]);
            let row = f32_param(b, "row", &[3]);
            let col = f32_param(b, "col", &[2, 1]);
            let i = b.parameter("i", [2], DType::I32);
            vec![
                &x + &row,
                &col * &row.reshape([1, 3]),
                &x * 2.0,
                2.0 - &x,
                &x / 2.0,
                -&x,
                &i * 3.0,
                col.lt(&row),
            ]
        },
        &[
            m23(),
            f32s(&[3], &[10., 20., 30.]),
            f32s(&[2, 1], &[1., 2.]),
            i32s(&[2], &[4, -5]),
        ],
    );
    assert_f32(&out[0], &[2, 3], &[11., 22., 33., 14., 25., 36.]);
    assert_f32(&out[1], &[2, 3], &[10., 20., 30., 20., 40., 60.]);
    assert_f32(&out[2], &[2, 3], &[2., 4., 6., 8., 10., 12.]);
    assert_f32(&out[3], &[2, 3], &[1., 0., -1., -2., -3., -4.]);
    assert_f32(&out[4], &[2, 3], &[0.5, 1., 1.5, 2., 2.5, 3.]);
    assert_f32(&out[5], &[2, 3], &[-1., -2., -3., -4., -5., -6.]);
    assert_i32(&out[6], &[2], &[12, -15]);
    assert_bool(&out[7], &[2, 3], &[true; 6]);
}

// ---- the interpreter itself ------------------------------------------------------------

#[test]
fn shared_values_repeated_outputs_and_parameter_outputs() {
    // y = x + 1 is used three times after its definition and returned twice.
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[2]);
            let y = &x + 1.0;
            let z = &y * &y;
            let w = &y - &z;
            vec![w, y.clone(), y, x]
        },
        &[f32s(&[2], &[1., -3.])],
    );
    assert_f32(&out[0], &[2], &[2. - 4., -2. - 4.]);
    assert_f32(&out[1], &[2], &[2., -2.]);
    assert_f32(&out[2], &[2], &[2., -2.]);
    assert_f32(&out[3], &[2], &[1., -3.]);
}

fn two_param_program() -> gspmd_core::ir::Program {
    let b = Builder::new("p");
    let x = f32_param(&b, "x", &[2, 3]);
    let w = f32_param(&b, "w", &[3, 4]);
    let y = x.matmul(&w);
    b.finish(&[&y]).unwrap()
}

fn input_error(inputs: &[Literal]) -> (usize, String, String) {
    match interpret(&two_param_program(), inputs) {
        Err(e @ Error::Input { .. }) => {
            let shown = e.to_string();
            let Error::Input { index, name, .. } = e else {
                unreachable!()
            };
            (index, name, shown)
        }
        other => panic!("expected an input error, got {other:?}"),
    }
}

#[test]
fn wrong_input_count_names_the_parameter() {
    let (index, name, shown) = input_error(&[m23()]);
    assert_eq!((index, name.as_str()), (1, "w"));
    assert!(
        shown.contains("input 1 (w)") && shown.contains("2 inputs but 1"),
        "{shown}"
    );
    let w = f32s(&[3, 4], &[0.; 12]);
    let (index, _, shown) = input_error(&[m23(), w.clone(), w]);
    assert_eq!(index, 2);
    assert!(shown.contains("2 inputs but 3"), "{shown}");
}

#[test]
fn wrong_input_dtype_names_the_parameter() {
    let (index, name, shown) = input_error(&[m23(), i32s(&[3, 4], &[0; 12])]);
    assert_eq!((index, name.as_str()), (1, "w"));
    assert!(
        shown.contains("expected f32[3,4], given i32[3,4]"),
        "{shown}"
    );
}

#[test]
fn wrong_input_shape_names_the_parameter() {
    let (index, name, shown) = input_error(&[f32s(&[3, 2], &[0.; 6]), f32s(&[3, 4], &[0.; 12])]);
    assert_eq!((index, name.as_str()), (0, "x"));
    assert!(
        shown.contains("input 0 (x)") && shown.contains("expected f32[2,3], given f32[3,2]"),
        "{shown}"
    );
}

#[test]
fn transcendental_of_i32_is_a_trace_error_with_location() {
    let b = Builder::new("bad");
    let i = b.parameter("i", [2], DType::I32);
    let e = i.exp();
    match b.finish(&[&e]) {
        Err(Error::Shape {
            op,
            location,
            message,
        }) => {
            assert_eq!(op, "exponential");
            assert!(location.file.ends_with("interpreter.rs"), "{location}");
            assert!(message.contains("i32"), "{message}");
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn spmd_only_op_is_a_runtime_error_with_location() {
    let b = Builder::new("spmd");
    let x = b.parameter("x", [2], DType::F32);
    let mut program = b.finish(&[&x]).unwrap();
    let group = gspmd_core::ir::AxisGroup {
        axes: vec!["data".into()],
        size: 2,
    };
    let op = gspmd_core::ir::Op::AllReduce {
        group,
        kind: gspmd_core::ir::ReduceKind::Sum,
    };
    let location = program.node(x.id().unwrap()).location;
    let reduced = program.push_op(op, &[x.id().unwrap()], location).unwrap();
    program.outputs = vec![reduced];
    verify(&program).unwrap();
    match interpret(&program, &[f32s(&[2], &[1., 2.])]) {
        Err(Error::Runtime {
            value,
            op,
            location,
            message,
        }) => {
            assert_eq!(value, reduced);
            assert_eq!(op, "all_reduce");
            assert!(location.file.ends_with("interpreter.rs"), "{location}");
            assert!(message.contains("device mesh"), "{message}");
        }
        other => panic!("expected a runtime error, got {other:?}"),
    }
}

// ---- properties ------------------------------------------------------------------------

/// A shape of rank 1..=4 with dims 1..=4, and data for it.
fn shape_and_data() -> impl Strategy<Value = (Vec<usize>, Vec<f32>)> {
    prop::collection::vec(1usize..=4, 1..=4).prop_flat_map(|shape| {
        let n: usize = shape.iter().product();
        (Just(shape), prop::collection::vec(-10f32..10.0, n))
    })
}

/// Multi-index of row-major flat index `i` in `shape`.
fn unflat(shape: &[usize], mut i: usize) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random batch/M/K/N sizes, random dim order in both operands, vs a naive loop.
    #[test]
    fn dot_general_matches_naive_loop(
        sizes in (0usize..4, 1usize..5, 0usize..5, 1usize..5),
        lhs_order in Just(vec![0usize, 1, 2]).prop_shuffle(),
        rhs_order in Just(vec![0usize, 1, 2]).prop_shuffle(),
        seed in prop::collection::vec(-1f32..1.0, 64),
    ) {
        // Logical dims: lhs (b, m, k), rhs (b, k, n); `*_order[p]` is the logical dim at
        // physical position p. A batch size of 0 means no batch dim.
        let (nb, m, k, n) = sizes;
        let has_batch = nb > 0;
        let nb = nb.max(1);
        let keep = |order: &Vec<usize>| -> Vec<usize> {
            order.iter().copied().filter(|&d| has_batch || d != 0).collect()
        };
        let (lo, ro) = (keep(&lhs_order), keep(&rhs_order));
        let lhs_sizes = [nb, m, k];
        let rhs_sizes = [nb, k, n];
        let lhs_shape: Vec<usize> = lo.iter().map(|&d| lhs_sizes[d]).collect();
        let rhs_shape: Vec<usize> = ro.iter().map(|&d| rhs_sizes[d]).collect();
        let pos = |order: &[usize], d: usize| order.iter().position(|&x| x == d).unwrap();
        let lhs_data: Vec<f32> = (0..lhs_shape.iter().product::<usize>()).map(|i| seed[i % 64]).collect();
        let rhs_data: Vec<f32> = (0..rhs_shape.iter().product::<usize>()).map(|i| seed[(i * 7 + 3) % 64]).collect();
        let lhs_at = |b: usize, i: usize, kk: usize| {
            let logical = [b, i, kk];
            let idx: Vec<usize> = lo.iter().map(|&d| logical[d]).collect();
            lhs_data[flat(&lhs_shape, &idx)]
        };
        let rhs_at = |b: usize, kk: usize, j: usize| {
            let logical = [b, kk, j];
            let idx: Vec<usize> = ro.iter().map(|&d| logical[d]).collect();
            rhs_data[flat(&rhs_shape, &idx)]
        };
        let mut expected = Vec::new();
        for b in 0..nb {
            for i in 0..m {
                for j in 0..n {
                    expected.push((0..k).map(|kk| lhs_at(b, i, kk) * rhs_at(b, kk, j)).sum::<f32>());
                }
            }
        }
        let dims = DotDims {
            lhs_batch: if has_batch { vec![pos(&lo, 0)] } else { vec![] },
            rhs_batch: if has_batch { vec![pos(&ro, 0)] } else { vec![] },
            lhs_contracting: vec![pos(&lo, 2)],
            rhs_contracting: vec![pos(&ro, 1)],
        };
        let out = run1(
            |bd| f32_param(bd, "l", &lhs_shape).dot_general(&f32_param(bd, "r", &rhs_shape), dims),
            &[f32s(&lhs_shape, &lhs_data), f32s(&rhs_shape, &rhs_data)],
        );
        let out_shape: Vec<usize> = if has_batch { vec![nb, m, n] } else { vec![m, n] };
        assert_f32(&out, &out_shape, &expected);
    }

    #[test]
    fn transpose_then_inverse_is_identity(
        (shape, data) in shape_and_data(),
        perm_seed in Just(vec![0usize, 1, 2, 3]).prop_shuffle(),
    ) {
        let perm: Vec<usize> = perm_seed.into_iter().filter(|&d| d < shape.len()).collect();
        let mut inverse = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        let input = f32s(&shape, &data);
        let out = run1(
            |b| f32_param(b, "x", &shape).transpose(&perm).transpose(&inverse),
            std::slice::from_ref(&input),
        );
        prop_assert_eq!(out, input);
    }

    #[test]
    fn reshape_round_trip_keeps_row_major_order((shape, data) in shape_and_data()) {
        let n = data.len();
        let outs = run(
            |b| {
                let x = f32_param(b, "x", &shape);
                let flat = x.reshape([n]);
                vec![flat.clone(), flat.reshape([1, n]).reshape(shape.clone())]
            },
            &[f32s(&shape, &data)],
        );
        assert_f32(&outs[0], &[n], &data);
        prop_assert_eq!(&outs[1], &f32s(&shape, &data));
    }

    #[test]
    fn reduce_sum_matches_naive_sum(
        (shape, data) in shape_and_data(),
        mask in prop::collection::vec(any::<bool>(), 4),
    ) {
        let dims: Vec<usize> = (0..shape.len()).filter(|&d| mask[d]).collect();
        let kept: Vec<usize> = (0..shape.len()).filter(|&d| !mask[d]).collect();
        let out_shape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
        let mut expected = vec![0f32; out_shape.iter().product()];
        for (i, &v) in data.iter().enumerate() {
            let idx = unflat(&shape, i);
            let out_idx: Vec<usize> = kept.iter().map(|&d| idx[d]).collect();
            expected[flat(&out_shape, &out_idx)] += v;
        }
        let signed: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
        let out = run1(|b| f32_param(b, "x", &shape).sum(&signed), &[f32s(&shape, &data)]);
        let got = out.as_f32().unwrap();
        prop_assert_eq!(got.shape(), out_shape.as_slice());
        for (g, e) in got.iter().zip(&expected) {
            prop_assert!((g - e).abs() <= 1e-4 * e.abs().max(1.0), "{} vs {}", g, e);
        }
    }
}

#[test]
fn column_major_inputs_are_read_logically() {
    use ndarray::ShapeBuilder;
    // Logical [[1,2,3],[4,5,6]] stored column-major.
    let fortran = ArrayD::from_shape_vec(IxDyn(&[2, 3]).f(), vec![1., 4., 2., 5., 3., 6.]).unwrap();
    let out = run(
        |b| {
            let x = f32_param(b, "x", &[2, 3]);
            vec![x.reshape([6]), x.transpose(&[1, 0]), &x + 0.0]
        },
        &[Literal::F32(fortran)],
    );
    assert_f32(&out[0], &[6], &[1., 2., 3., 4., 5., 6.]);
    assert_f32(&out[1], &[3, 2], &[1., 4., 2., 5., 3., 6.]);
    let sum = out[2].as_f32().unwrap();
    assert!(sum.is_standard_layout());
    assert_f32(&out[2], &[2, 3], &[1., 2., 3., 4., 5., 6.]);
}

#[test]
fn malformed_programs_give_typed_errors_not_panics() {
    let fresh = || {
        let b = Builder::new("m");
        let x = f32_param(&b, "x", &[2, 3]);
        let y = x.exp();
        let z = &y + &x;
        (
            b.finish(&[&z]).unwrap(),
            x.id().unwrap(),
            y.id().unwrap(),
            z.id().unwrap(),
        )
    };
    let input = [m23()];
    // A node whose recorded type disagrees with its operands.
    let (mut p, _, y, _) = fresh();
    p.node_mut(y).ty = gspmd_core::ir::TensorType::new([3, 2], DType::F32);
    let err = interpret(&p, &input).unwrap_err();
    assert!(
        matches!(&err, Error::Many(errors) if matches!(errors[0], Error::Verify { value, .. } if value == y)),
        "{err:?}"
    );
    // Programs that fail `verify` are rejected by it before anything runs, with the
    // verifier's error naming the value: an operand used before it is defined, an
    // operand past the end of the program.
    for operand in [2, 99] {
        let (mut p, _, y, _) = fresh();
        p.node_mut(y).operands = vec![gspmd_core::ir::ValueId(operand)];
        let err = interpret(&p, &input).unwrap_err();
        assert!(
            matches!(err, Error::Verify { value, .. } if value == y),
            "{err:?}"
        );
    }
    // An output or a parameter that is not a value of the program.
    let (mut p, ..) = fresh();
    p.outputs.push(gspmd_core::ir::ValueId(99));
    let err = interpret(&p, &input).unwrap_err();
    assert!(matches!(err, Error::Verify { .. }), "{err:?}");
    let (mut p, ..) = fresh();
    p.params.push(gspmd_core::ir::ValueId(99));
    let err = interpret(&p, &input).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Verify { .. } | Error::Many(_) | Error::Runtime { .. }
        ),
        "{err:?}"
    );
}

#[test]
fn large_matmul_runs_fast_in_debug() {
    // 256 x 512 x 256 through matrixmultiply; a naive kernel would take seconds here.
    let (m, k, n) = (256, 512, 256);
    let a: Vec<f32> = (0..m * k).map(|i| ((i % 13) as f32 - 6.0) / 8.0).collect();
    let w: Vec<f32> = (0..k * n).map(|i| ((i % 7) as f32 - 3.0) / 4.0).collect();
    let start = std::time::Instant::now();
    let out = run1(
        |b| f32_param(b, "a", &[m, k]).matmul(&f32_param(b, "w", &[k, n])),
        &[f32s(&[m, k], &a), f32s(&[k, n], &w)],
    );
    let elapsed = start.elapsed();
    let got = out.as_f32().unwrap();
    for &(i, j) in &[(0, 0), (17, 200), (255, 255)] {
        let e: f32 = (0..k).map(|kk| a[i * k + kk] * w[kk * n + j]).sum();
        assert!(
            (got[[i, j]] - e).abs() <= 1e-3 * e.abs().max(1.0),
            "{i},{j}"
        );
    }
    assert!(elapsed.as_secs_f64() < 2.0, "matmul took {elapsed:?}");
}

#[test]
fn sample_inputs_are_typed_in_range_and_reproducible() {
    let b = Builder::new("sample");
    let x = b.parameter("x", [3, 5], DType::F32);
    let t = b.parameter("t", [4], DType::I32);
    let m = b.parameter("m", [2, 2], DType::Bool);
    let program = b.finish(&[&x, &t, &m]).unwrap();
    let inputs = gspmd_core::runtime::sample_inputs(&program, 7);
    assert_eq!(inputs.len(), 3);
    let xs = inputs[0].as_f32().unwrap();
    assert_eq!(xs.shape(), &[3, 5]);
    assert!(xs.iter().all(|v| (-0.5..0.5).contains(v)));
    assert!(xs.iter().any(|&v| v != xs[[0, 0]]), "values vary");
    assert!(
        inputs[1]
            .as_i32()
            .unwrap()
            .iter()
            .all(|v| (0..8).contains(v))
    );
    assert_eq!(inputs[2].shape(), vec![2, 2]);
    assert_eq!(inputs, gspmd_core::runtime::sample_inputs(&program, 7));
    assert_ne!(
        inputs[0],
        gspmd_core::runtime::sample_inputs(&program, 8)[0]
    );
    // The interpreter accepts them.
    interpret(&program, &inputs).unwrap();
}

// ---- windowed reductions ------------------------------------------------------------------

#[test]
fn reduce_window_by_hand() {
    let outs = run(
        |b| {
            let x = f32_param(b, "x", &[5]);
            vec![
                // [1,2,3,4,5,0]: pairs.
                x.reduce_window(ReduceKind::Sum, &[2], &[2], &[(0, 1)]),
                // [-inf,1,2,3,4,5]: windows of 3 every 2.
                x.reduce_window(ReduceKind::Max, &[3], &[2], &[(1, 0)]),
                // Elements 2 apart.
                x.neg().reduce_window_with(
                    ReduceKind::Min,
                    &[WindowDim::new(2, 1, (0, 0)).with_window_dilation(2)],
                ),
                // Windows wholly in the padding give the identity.
                x.reduce_window(ReduceKind::Max, &[1], &[1], &[(2, 0)]),
                x.reduce_window(ReduceKind::Min, &[1], &[3], &[(0, 1)]),
                // Base dilation 2: [0,1,0,2,0,3,0,4,0,5,0] (holes and padding add
                // nothing), windows of 3 every 2.
                x.reduce_window_with(
                    ReduceKind::Sum,
                    &[WindowDim::new(3, 2, (1, 1)).with_base_dilation(2)],
                ),
                // [1,-inf,-inf,2,...]: a window of 2 between two elements is -inf.
                x.reduce_window_with(
                    ReduceKind::Max,
                    &[WindowDim::new(2, 1, (0, 0)).with_base_dilation(3)],
                ),
            ]
        },
        &[f32s(&[5], &[1., 2., 3., 4., 5.])],
    );
    assert_f32(&outs[0], &[3], &[3., 7., 5.]);
    assert_f32(&outs[1], &[2], &[2., 4.]);
    assert_f32(&outs[2], &[3], &[-3., -4., -5.]);
    let ninf = f32::NEG_INFINITY;
    assert_f32(&outs[3], &[7], &[ninf, ninf, 1., 2., 3., 4., 5.]);
    assert_f32(&outs[4], &[2], &[1., 4.]);
    assert_f32(&outs[5], &[5], &[1., 2., 3., 4., 5.]);
    let max = [1., ninf, 2., 2., ninf, 3., 3., ninf, 4., 4., ninf, 5.];
    assert_f32(&outs[6], &[12], &max);
    // i32: identities are i32::MIN / MAX; 2-D windows.
    let outs = run(
        |b| {
            let x = b.parameter("x", [2, 3], DType::I32);
            vec![
                x.reduce_window(ReduceKind::Max, &[2, 2], &[1, 1], &[(0, 0), (0, 1)]),
                x.reduce_window(ReduceKind::Sum, &[2, 2], &[1, 2], &[(1, 0), (0, 0)]),
                x.reduce_window(ReduceKind::Min, &[1, 1], &[1, 1], &[(1, 0), (0, 0)]),
            ]
        },
        &[i32s(&[2, 3], &[1, -2, 3, -4, 5, -6])],
    );
    assert_i32(&outs[0], &[1, 3], &[5, 5, 3]);
    assert_i32(&outs[1], &[2, 1], &[-1, 0]);
    assert_i32(
        &outs[2],
        &[3, 3],
        &[i32::MAX, i32::MAX, i32::MAX, 1, -2, 3, -4, 5, -6],
    );
}

/// `reduce_window` by the definition: every result index, every window offset; a
/// position between base-dilated elements, like padding, adds nothing.
fn naive_reduce_window(
    kind: ReduceKind,
    shape: &[usize],
    data: &[f32],
    window: &[WindowDim],
) -> (Vec<usize>, Vec<f32>) {
    let out_shape: Vec<usize> = (shape.iter().zip(window))
        .map(|(&n, w)| {
            let dilated = (n as i64 - 1) * w.base_dilation as i64 + 1;
            (dilated + w.padding_low + w.padding_high
                - ((w.size - 1) * w.window_dilation) as i64
                - 1) as usize
                / w.stride
                + 1
        })
        .collect();
    let sizes: Vec<usize> = window.iter().map(|w| w.size).collect();
    let mut out = Vec::new();
    for j in 0..out_shape.iter().product() {
        let at = unflat(&out_shape, j);
        let mut acc = match kind {
            ReduceKind::Sum => 0.0,
            ReduceKind::Max => f32::NEG_INFINITY,
            ReduceKind::Min => f32::INFINITY,
            other => panic!("not covered by this test: {other:?}"),
        };
        for k in 0..sizes.iter().product() {
            let off = unflat(&sizes, k);
            let idx: Vec<i64> = (0..shape.len())
                .map(|d| {
                    let w = &window[d];
                    (at[d] * w.stride + off[d] * w.window_dilation) as i64 - w.padding_low
                })
                .collect();
            let b = |d: usize| window[d].base_dilation as i64;
            let inside = (idx.iter().zip(shape).enumerate())
                .all(|(d, (&i, &n))| i >= 0 && i % b(d) == 0 && i / b(d) < n as i64);
            if inside {
                let idx: Vec<usize> = (idx.iter().enumerate())
                    .map(|(d, &i)| (i / b(d)) as usize)
                    .collect();
                let v = data[flat(shape, &idx)];
                acc = match kind {
                    ReduceKind::Sum => acc + v,
                    ReduceKind::Max => acc.max(v),
                    ReduceKind::Min => acc.min(v),
                    other => panic!("not covered by this test: {other:?}"),
                };
            }
        }
        out.push(acc);
    }
    (out_shape, out)
}

#[test]
fn reduce_window_matches_naive_loops() {
    let cases: Vec<(Vec<usize>, Vec<WindowDim>)> = vec![
        (vec![7], vec![WindowDim::new(3, 2, (1, 1))]),
        (
            vec![5, 6],
            vec![
                WindowDim::new(2, 2, (0, 1)),
                WindowDim::new(3, 1, (1, 1)).with_window_dilation(2),
            ],
        ),
        // NHWC 2x2 pooling, and overlapping 3x3 windows with stride 2.
        (
            vec![2, 5, 4, 3],
            vec![
                WindowDim::new(1, 1, (0, 0)),
                WindowDim::new(2, 2, (0, 1)),
                WindowDim::new(2, 2, (0, 0)),
                WindowDim::new(1, 1, (0, 0)),
            ],
        ),
        (
            vec![2, 5, 4, 3],
            vec![
                WindowDim::new(1, 1, (0, 0)),
                WindowDim::new(3, 2, (1, 1)),
                WindowDim::new(3, 2, (1, 1)),
                WindowDim::new(1, 1, (0, 0)),
            ],
        ),
        // Window over the batch and feature dims too, dilated, larger padding than input.
        (
            vec![3, 2, 4],
            vec![
                WindowDim::new(2, 1, (0, 0)),
                WindowDim::new(3, 3, (2, 3)),
                WindowDim::new(2, 3, (0, 2)).with_window_dilation(3),
            ],
        ),
        // Base dilation (XLA's base_dilations): with padding, strides and window
        // dilation; a window can fall wholly between two elements.
        (
            vec![5, 4],
            vec![
                WindowDim::new(3, 2, (1, 1)).with_base_dilation(2),
                WindowDim::new(2, 1, (0, 2))
                    .with_base_dilation(3)
                    .with_window_dilation(2),
            ],
        ),
        (
            vec![4],
            vec![WindowDim::new(2, 1, (0, 0)).with_base_dilation(3)],
        ),
        (vec![], vec![]),
    ];
    for (i, (shape, window)) in cases.into_iter().enumerate() {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|j| ((j * 37 + i * 11) % 19) as f32 - 9.0)
            .collect();
        for kind in [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min] {
            let out = run1(
                |b| f32_param(b, "x", &shape).reduce_window_with(kind, &window),
                &[f32s(&shape, &data)],
            );
            let (out_shape, expected) = naive_reduce_window(kind, &shape, &data, &window);
            assert_f32(&out, &out_shape, &expected);
        }
    }
}

#[test]
fn pooling_layers_by_hand() {
    let x = f32s(&[1, 3, 3, 1], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let (win, strides) = ([1, 2, 2, 1], [1, 2, 2, 1]);
    let outs = run(
        |b| {
            let x = f32_param(b, "x", &[1, 3, 3, 1]);
            vec![
                // SAME: 2x2 results, the 3x3 image padded by one row and column after.
                x.max_pool(&win, &strides, Padding::Same),
                x.avg_pool(&win, &strides, Padding::Same, true),
                x.avg_pool(&win, &strides, Padding::Same, false),
                // VALID: only the top-left window fits.
                x.max_pool(&win, &strides, Padding::Valid),
                x.avg_pool(&win, &strides, Padding::Valid, false),
                // SAME with stride 1 and a 3x3 window: padded by one on each side.
                x.max_pool(&[1, 3, 3, 1], &[1, 1, 1, 1], Padding::Same),
            ]
        },
        &[x],
    );
    assert_f32(&outs[0], &[1, 2, 2, 1], &[5., 6., 8., 9.]);
    assert_f32(&outs[1], &[1, 2, 2, 1], &[3., 2.25, 3.75, 2.25]);
    assert_f32(&outs[2], &[1, 2, 2, 1], &[3., 4.5, 7.5, 9.]);
    assert_f32(&outs[3], &[1, 1, 1, 1], &[5.]);
    assert_f32(&outs[4], &[1, 1, 1, 1], &[3.]);
    assert_f32(
        &outs[5],
        &[1, 3, 3, 1],
        &[5., 6., 6., 8., 9., 9., 8., 9., 9.],
    );
}

#[test]
fn upsample_nearest_repeats_each_element() {
    let outs = run(
        |b| {
            let x = f32_param(b, "x", &[2, 2]);
            vec![
                x.upsample_nearest(&[2, 3]),
                x.upsample_nearest(&[1, 2]),
                x.upsample_nearest(&[1, 1]),
            ]
        },
        &[f32s(&[2, 2], &[1., 2., 3., 4.])],
    );
    #[rustfmt::skip]
    let expected = [
        1., 1., 1., 2., 2., 2.,
        1., 1., 1., 2., 2., 2.,
        3., 3., 3., 4., 4., 4.,
        3., 3., 3., 4., 4., 4.,
    ];
    assert_f32(&outs[0], &[4, 6], &expected);
    assert_f32(&outs[1], &[2, 4], &[1., 1., 2., 2., 3., 3., 4., 4.]);
    assert_f32(&outs[2], &[2, 2], &[1., 2., 3., 4.]);
}

#[test]
fn reduce_window_prints_like_xla() {
    let b = Builder::new("pool");
    let x = f32_param(&b, "x", &[3, 4, 4, 2]);
    let y = x.reduce_window(
        ReduceKind::Max,
        &[1, 2, 2, 1],
        &[1, 2, 2, 1],
        &[(0, 0), (0, 1), (0, 1), (0, 0)],
    );
    let w = WindowDim::new(2, 1, (0, 0)).with_window_dilation(2);
    let one = WindowDim::new(1, 1, (0, 0));
    let z = x.reduce_window_with(ReduceKind::Sum, &[w, w, w, one]);
    let text = b.finish(&[&y, &z]).unwrap().to_string();
    assert!(
        text.contains(
            "reduce_window.max(%0), window={size=1x2x2x1 stride=1x2x2x1 pad=0_0x0_1x0_1x0_0} : f32[3,2,2,2]"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "reduce_window.sum(%0), window={size=2x2x2x1 stride=1x1x1x1 pad=0_0x0_0x0_0x0_0 rhs_dilate=2x2x2x1} : f32[1,2,2,2]"
        ),
        "{text}"
    );
}

// ---- convolution and reverse ------------------------------------------------------------

/// The convolution by its definition: output element `[b, o, p..]` sums, over the
/// input features `c` of `o`'s group `g` and the kernel taps `t..`, input `[b, g * cg +
/// c, i..]` (feature groups; `[g * batch + b, c, i..]` with batch groups) times kernel
/// `[o, c, t..]`, where `i * lhs_dilation = p * stride + t * rhs_dilation -
/// padding_low` (no term where that has no integer solution in range).
fn naive_conv(
    x: &ArrayD<f32>,
    k: &ArrayD<f32>,
    config: &gspmd_core::ir::ConvConfig,
    out_shape: &[usize],
) -> ArrayD<f32> {
    let (dn, window) = (&config.dims, &config.window);
    let (feature_groups, batch_groups) = (config.feature_group_count, config.batch_group_count);
    let cg = k.shape()[dn.kernel_input_feature];
    let og = k.shape()[dn.kernel_output_feature] / (feature_groups * batch_groups);
    let taps: Vec<usize> = dn.kernel_spatial.iter().map(|&d| k.shape()[d]).collect();
    let mut out = ArrayD::zeros(IxDyn(out_shape));
    for (oi, v) in out.indexed_iter_mut() {
        let o = oi[dn.output_feature];
        let mut acc = 0.0;
        for c in 0..cg {
            for t in ndarray::indices(IxDyn(&taps)) {
                let mut xi = vec![0; x.ndim()];
                let mut ki = vec![0; k.ndim()];
                let g = o / og;
                xi[dn.input_batch] =
                    (g % batch_groups) * out_shape[dn.output_batch] + oi[dn.output_batch];
                xi[dn.input_feature] = (g % feature_groups) * cg + c;
                ki[dn.kernel_input_feature] = c;
                ki[dn.kernel_output_feature] = o;
                let mut inside = true;
                for (d, w) in window.iter().enumerate() {
                    let q = (oi[dn.output_spatial[d]] * w.stride + t[d] * w.window_dilation) as i64
                        - w.padding_low;
                    let l = w.base_dilation as i64;
                    let n = x.shape()[dn.input_spatial[d]] as i64;
                    inside &= q >= 0 && q % l == 0 && q / l < n;
                    xi[dn.input_spatial[d]] = (q.max(0) / l) as usize;
                    ki[dn.kernel_spatial[d]] = t[d];
                }
                if inside {
                    acc += x[IxDyn(&xi)] * k[IxDyn(&ki)];
                }
            }
        }
        *v = acc;
    }
    out
}

/// Deterministic values in [-1, 1] on a 1/8 grid.
fn grid_values(shape: &[usize], seed: usize) -> ArrayD<f32> {
    let n: usize = shape.iter().product();
    let v = (0..n).map(|i| ((i * 7 + seed * 5) % 17) as f32 / 8.0 - 1.0);
    ArrayD::from_shape_vec(IxDyn(shape), v.collect()).unwrap()
}

#[test]
fn convolution_matches_the_definition_in_every_configuration() {
    for case in conv_cases::cases() {
        let (x, k) = (grid_values(case.input, 1), grid_values(case.kernel, 2));
        let b = Builder::new("conv");
        let (_, _, y) = case.trace(&b, DType::F32);
        let program = b.finish(&[&y]).unwrap();
        verify(&program).unwrap();
        let out = interpret(
            &program,
            &[Literal::F32(x.clone()), Literal::F32(k.clone())],
        )
        .unwrap();
        op_coverage::record("interpreted", &program);
        let Some(gspmd_core::ir::Op::Convolution(config)) = program.nodes.last().map(|n| &n.op)
        else {
            panic!("{}: not a convolution:\n{program}", case.name);
        };
        let shape = program.ty(program.outputs[0]).shape.clone();
        let want = naive_conv(&x, &k, config, &shape);
        let want: Vec<f32> = want.iter().copied().collect();
        println!("{}: {shape:?}", case.name);
        assert_f32(&out[0], &shape, &want);
    }
}

/// Shapes past the f32 kernel's blocking (`kernels/convolution.rs`): more rows than a
/// chunk (256 > 240), output features over two vector registers (3 panels of 16 with
/// AVX2, 2 of 32 with AVX-512, the last one partial), a reduction of several blocks
/// (9 taps x 30 features), windows both in place (VALID) and over a padded copy (SAME,
/// and lhs dilation); grid values keep every sum exact, so any order must match.
#[test]
fn convolution_past_the_kernel_blocking_matches_the_definition() {
    type Window = (&'static [(i64, i64)], &'static [usize]);
    let windows: [Window; 3] = [
        (&[(1, 1), (1, 1)], &[]),
        (&[(0, 0), (0, 0)], &[]),
        (&[(1, 0), (2, 1)], &[2, 1]),
    ];
    for (padding, lhs_dilation) in windows {
        let case = conv_cases::ConvCase {
            name: "blocked",
            labels: ["NHWC", "HWIO", "NHWC"],
            input: &[1, 16, 16, 30],
            kernel: &[3, 3, 30, 36],
            strides: &[1, 1],
            padding,
            lhs_dilation,
            rhs_dilation: &[],
            groups: 1,
            batch_groups: 1,
        };
        matches_the_definition(&case, 3);
    }
}

/// Interprets `case` on grid values (seeds `seed` and `seed + 1`) and compares it with
/// the naive loop; returns the result's shape.
fn matches_the_definition(case: &conv_cases::ConvCase, seed: usize) -> Vec<usize> {
    let (x, k) = (
        grid_values(case.input, seed),
        grid_values(case.kernel, seed + 1),
    );
    let b = Builder::new("conv");
    let (_, _, y) = case.trace(&b, DType::F32);
    let program = b.finish(&[&y]).unwrap();
    let out = interpret(
        &program,
        &[Literal::F32(x.clone()), Literal::F32(k.clone())],
    );
    let Some(gspmd_core::ir::Op::Convolution(config)) = program.nodes.last().map(|n| &n.op) else {
        panic!("not a convolution:\n{program}");
    };
    let shape = program.ty(program.outputs[0]).shape.clone();
    let want: Vec<f32> = naive_conv(&x, &k, config, &shape).iter().copied().collect();
    assert_f32(&out.unwrap()[0], &shape, &want);
    shape
}

/// Few output features over many adjacent input features: the f32 kernel's dot path
/// (`kernels/convolution.rs`, `dots`) when the outputs fill at most half a vector
/// register and the features at least half (AVX2: 1-4 outputs, 4 or more features; a
/// tap's features whole registers and a partial one), and shapes at its edges: 5
/// outputs, 3 features, rows not a multiple of the block, two feature groups, a
/// 1x1 window (the U-Net's output conv), padded (SAME, lhs dilation) and in place.
#[test]
fn convolution_with_few_output_features_matches_the_definition() {
    type Shapes = (&'static [usize], &'static [usize], usize);
    let shapes: [Shapes; 9] = [
        (&[2, 7, 5, 8], &[3, 3, 8, 1], 1),
        (&[1, 5, 6, 13], &[3, 2, 13, 2], 1),
        (&[3, 4, 3, 4], &[2, 3, 4, 4], 1),
        (&[1, 6, 5, 20], &[3, 3, 20, 3], 1),
        (&[2, 5, 5, 8], &[3, 3, 8, 5], 1),
        (&[2, 5, 5, 3], &[3, 3, 3, 1], 1),
        (&[2, 5, 4, 16], &[3, 3, 8, 2], 2),
        (&[3, 5, 7, 8], &[1, 1, 8, 1], 1),
        (&[1, 9, 9, 24], &[3, 3, 24, 1], 1),
    ];
    type Window = (&'static [(i64, i64)], &'static [usize], &'static [usize]);
    let windows: [Window; 3] = [
        (&[(1, 1), (1, 1)], &[], &[1, 1]),
        (&[(0, 0), (0, 0)], &[], &[1, 2]),
        (&[(1, 0), (2, 1)], &[2, 1], &[1, 1]),
    ];
    for (input, kernel, groups) in shapes {
        for (padding, lhs_dilation, strides) in windows {
            let case = conv_cases::ConvCase {
                name: "few outputs",
                labels: ["NHWC", "HWIO", "NHWC"],
                input,
                kernel,
                strides,
                padding,
                lhs_dilation,
                rhs_dilation: &[],
                groups,
                batch_groups: 1,
            };
            let shape = matches_the_definition(&case, 5);
            println!("{input:?} * {kernel:?}, padding {padding:?}: {shape:?}");
        }
    }
}

#[test]
fn convolution_output_shapes_by_hand() {
    // (input, kernel, output) per case, from the window arithmetic
    // (low + dilated input + high - dilated window) / stride + 1.
    let shapes: [&[usize]; 13] = [
        &[2, 4, 4],
        &[2, 3, 3, 5],
        &[1, 3, 6, 4],
        &[2, 5, 5, 6],
        &[1, 3, 3, 8],
        &[3, 2, 3, 7, 3],
        &[3, 5, 6, 6],
        &[2, 5, 4, 6],
        &[3, 2, 5],
        &[2, 5, 6, 4],
        &[4, 2, 4, 5],
        &[3, 6, 4, 6],
        &[2, 2, 2, 4],
    ];
    for (case, want) in conv_cases::cases().iter().zip(shapes) {
        let b = Builder::new("conv");
        let (_, _, y) = case.trace(&b, DType::F32);
        assert_eq!(y.shape(), want, "{}", case.name);
    }
}

#[test]
fn conv2d_same_and_valid_and_i32() {
    // 1 image 4x4x1, 3x3 kernel of ones: SAME sums each 3x3 neighbourhood, VALID the
    // 2x2 interior ones; i32 runs the same kernel with integer arithmetic.
    let x: Vec<i32> = (0..16).collect();
    let outs = run(
        |b| {
            let x = b.parameter("x", [1, 4, 4, 1], DType::I32);
            let k = b.full([3, 3, 1, 1], DType::I32, 1.0);
            vec![
                x.conv2d(&k, [1, 1], gspmd_core::ir::Padding::Same),
                x.conv2d(&k, [1, 1], gspmd_core::ir::Padding::Valid),
                x.conv2d(&k, [2, 2], gspmd_core::ir::Padding::Same),
            ]
        },
        &[i32s(&[1, 4, 4, 1], &x)],
    );
    let at = |r: i64, c: i64| -> i32 {
        let mut s = 0;
        for i in r - 1..=r + 1 {
            for j in c - 1..=c + 1 {
                if (0..4).contains(&i) && (0..4).contains(&j) {
                    s += (i * 4 + j) as i32;
                }
            }
        }
        s
    };
    let same: Vec<i32> = (0..16).map(|p| at(p / 4, p % 4)).collect();
    assert_i32(&outs[0], &[1, 4, 4, 1], &same);
    assert_i32(
        &outs[1],
        &[1, 2, 2, 1],
        &[at(1, 1), at(1, 2), at(2, 1), at(2, 2)],
    );
    // Stride 2, SAME: out 2x2, total padding (2-1)*2+3-4 = 1, all of it high.
    assert_i32(
        &outs[2],
        &[1, 2, 2, 1],
        &[at(1, 1), at(1, 3), at(3, 1), at(3, 3)],
    );
}

#[test]
fn convolution_of_empty_operands() {
    // No batch, no features, an empty spatial dim reached only through padding: zeros
    // (or nothing) of the shapes the window arithmetic gives.
    let outs = run(
        |b| {
            let case = |i: usize, x: &[usize], k: &[usize], pad: i64| {
                let x = f32_param(b, &format!("x{i}"), x);
                let k = f32_param(b, &format!("k{i}"), k);
                let p = gspmd_core::ir::Padding::Explicit(vec![(pad, pad); 2]);
                x.conv2d(&k, [1, 1], p)
            };
            vec![
                case(0, &[0, 4, 4, 2], &[3, 3, 2, 3], 1),
                case(1, &[1, 4, 4, 0], &[3, 3, 0, 3], 1),
                case(2, &[1, 0, 4, 2], &[1, 3, 2, 3], 1),
            ]
        },
        &[
            f32s(&[0, 4, 4, 2], &[]),
            f32s(&[3, 3, 2, 3], &[1.0; 54]),
            f32s(&[1, 4, 4, 0], &[]),
            f32s(&[3, 3, 0, 3], &[]),
            f32s(&[1, 0, 4, 2], &[]),
            f32s(&[1, 3, 2, 3], &[1.0; 18]),
        ],
    );
    assert_f32(&outs[0], &[0, 4, 4, 3], &[]);
    assert_f32(&outs[1], &[1, 4, 4, 3], &[0.0; 48]);
    assert_f32(&outs[2], &[1, 2, 4, 3], &[0.0; 24]);
}

#[test]
fn reverse_along_some_dims() {
    let out = run(
        |b| {
            let x = b.parameter("x", [2, 3], DType::I32);
            vec![x.reverse(&[1]), x.reverse(&[0, 1]), x.reverse(&[])]
        },
        &[i32s(&[2, 3], &[0, 1, 2, 3, 4, 5])],
    );
    assert_i32(&out[0], &[2, 3], &[2, 1, 0, 5, 4, 3]);
    assert_i32(&out[1], &[2, 3], &[5, 4, 3, 2, 1, 0]);
    assert_i32(&out[2], &[2, 3], &[0, 1, 2, 3, 4, 5]);
}

/// An i32 scalar constant (a start index).
fn start(b: &Builder, v: i32) -> Tensor {
    b.constant(i32s(&[], &[v]))
}

#[test]
fn dynamic_slice_clamps_its_starts_so_the_block_fits() {
    let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let outs = run(
        |b| {
            let x = f32_param(b, "x", &[3, 4]);
            let s = |v| start(b, v);
            vec![
                x.dynamic_slice(&[&s(1), &s(1)], &[2, 2]),
                // Out of range on both sides: the block at the far edges.
                x.dynamic_slice(&[&s(-5), &s(9)], &[2, 3]),
                // A whole dim ignores its start.
                x.dynamic_slice(&[&s(2), &s(7)], &[1, 4]),
                x.dynamic_slice(&[&s(0), &s(0)], &[3, 4]),
            ]
        },
        &[f32s(&[3, 4], &x)],
    );
    assert_f32(&outs[0], &[2, 2], &[5., 6., 9., 10.]);
    assert_f32(&outs[1], &[2, 3], &[1., 2., 3., 5., 6., 7.]);
    assert_f32(&outs[2], &[1, 4], &[8., 9., 10., 11.]);
    assert_f32(&outs[3], &[3, 4], &x);
}

#[test]
fn dynamic_update_slice_writes_a_clamped_block() {
    let outs = run(
        |b| {
            let x = b.parameter("x", [2, 4], DType::I32);
            let u = b.parameter("u", [1, 2], DType::I32);
            let flags = b.parameter("flags", [5], DType::Bool);
            let on = b.constant(bools(&[2], &[true, true]));
            let s = |v| start(b, v);
            vec![
                x.dynamic_update_slice(&u, &[&s(1), &s(1)]),
                x.dynamic_update_slice(&u, &[&s(-3), &s(100)]),
                flags.dynamic_update_slice(&on, &[&s(2)]),
            ]
        },
        &[
            i32s(&[2, 4], &[0, 1, 2, 3, 4, 5, 6, 7]),
            i32s(&[1, 2], &[-1, -2]),
            bools(&[5], &[false; 5]),
        ],
    );
    assert_i32(&outs[0], &[2, 4], &[0, 1, 2, 3, 4, -1, -2, 7]);
    assert_i32(&outs[1], &[2, 4], &[0, 1, -1, -2, 4, 5, 6, 7]);
    assert_bool(&outs[2], &[5], &[false, false, true, true, false]);
}

#[test]
fn cumulative_sums_and_products_forward_and_reversed() {
    let outs = run(
        |b| {
            let x = f32_param(b, "x", &[2, 3]);
            let n = b.parameter("n", [3], DType::I32);
            vec![
                x.cumsum(1),
                x.cumsum(-2),
                x.cumprod(1),
                x.cumulative(gspmd_core::ir::CumulativeKind::Sum, 1, true),
                x.cumulative(gspmd_core::ir::CumulativeKind::Prod, 0, true),
                n.cumprod(0),
            ]
        },
        &[m23(), i32s(&[3], &[i32::MAX, 2, 3])],
    );
    assert_f32(&outs[0], &[2, 3], &[1., 3., 6., 4., 9., 15.]);
    assert_f32(&outs[1], &[2, 3], &[1., 2., 3., 5., 7., 9.]);
    assert_f32(&outs[2], &[2, 3], &[1., 2., 6., 4., 20., 120.]);
    assert_f32(&outs[3], &[2, 3], &[6., 5., 3., 15., 11., 6.]);
    assert_f32(&outs[4], &[2, 3], &[4., 10., 18., 4., 5., 6.]);
    // i32 products wrap.
    let wrapped = i32::MAX.wrapping_mul(2);
    assert_i32(
        &outs[5],
        &[3],
        &[i32::MAX, wrapped, wrapped.wrapping_mul(3)],
    );
}

#[test]
fn argsort_is_stable_and_orders_nan_as_the_largest() {
    let nan = f32::NAN;
    let outs = run(
        |b| {
            let x = f32_param(b, "x", &[2, 4]);
            let f = b.parameter("f", [3], DType::Bool);
            vec![
                x.argsort(1, false),
                x.argsort(-1, true),
                x.argsort(0, false),
                f.argsort(0, false),
            ]
        },
        &[
            f32s(&[2, 4], &[3., nan, -0.0, 0.0, 2., 2., 1., 2.]),
            bools(&[3], &[true, false, true]),
        ],
    );
    // Ties (-0 and 0; the 2s) keep their order in both directions.
    assert_i32(&outs[0], &[2, 4], &[2, 3, 0, 1, 2, 0, 1, 3]);
    assert_i32(&outs[1], &[2, 4], &[1, 0, 2, 3, 0, 1, 3, 2]);
    assert_i32(&outs[2], &[2, 4], &[1, 1, 0, 0, 0, 0, 1, 1]);
    assert_i32(&outs[3], &[3], &[1, 0, 2]);
}

#[test]
fn sort_and_top_k_pick_values_with_their_indices() {
    let outs = run(
        |b| {
            let x = f32_param(b, "x", &[2, 4]);
            let (values, indices) = x.sort(1, false);
            let (top, top_indices) = x.top_k(2, -1);
            let (column_max, column_argmax) = x.top_k(1, 0);
            vec![values, indices, top, top_indices, column_max, column_argmax]
        },
        &[f32s(&[2, 4], &[3., 1., 2., 1., 0., 5., 5., -1.])],
    );
    assert_f32(&outs[0], &[2, 4], &[1., 1., 2., 3., -1., 0., 5., 5.]);
    assert_i32(&outs[1], &[2, 4], &[1, 3, 2, 0, 3, 0, 1, 2]);
    // Ties: the lower index first.
    assert_f32(&outs[2], &[2, 2], &[3., 2., 5., 5.]);
    assert_i32(&outs[3], &[2, 2], &[0, 2, 1, 2]);
    assert_f32(&outs[4], &[1, 4], &[3., 5., 5., 1.]);
    assert_i32(&outs[5], &[1, 4], &[0, 1, 1, 0]);
}

#[test]
fn argmax_and_argmin_pick_the_first_extreme() {
    let nan = f32::NAN;
    let outs = run(
        |b| {
            let x = f32_param(b, "x", &[3, 3]);
            let n = b.parameter("n", [4], DType::I32);
            vec![
                x.argmax(1),
                x.argmin(-1),
                x.argmax(0),
                n.argmax(0),
                n.argmin(0),
            ]
        },
        &[
            f32s(&[3, 3], &[1., 5., 5., 2., nan, nan, -1., -1., 0.]),
            i32s(&[4], &[3, -2, 7, -2]),
        ],
    );
    assert_i32(&outs[0], &[3], &[1, 1, 2]);
    assert_i32(&outs[1], &[3], &[0, 1, 0]);
    assert_i32(&outs[2], &[3], &[1, 1, 1]);
    assert_i32(&outs[3], &[], &[2]);
    assert_i32(&outs[4], &[], &[1]);
}

#[test]
fn take_and_embedding_clamp_indices() {
    let out = run(
        |b| {
            let table = f32_param(b, "table", &[4, 2]);
            let ids = b.parameter("ids", [2, 2], DType::I32);
            let cols = b.parameter("cols", [2], DType::I32);
            vec![
                table.embedding(&ids),
                table.take(&cols, -1),
                table.take(&cols, 0),
            ]
        },
        &[
            f32s(&[4, 2], &[0., 1., 2., 3., 4., 5., 6., 7.]),
            i32s(&[2, 2], &[3, 0, 5, -1]),
            i32s(&[2], &[1, -7]),
        ],
    );
    // Ids 5 and -1 clamp to rows 3 and 0.
    assert_f32(&out[0], &[2, 2, 2], &[6., 7., 0., 1., 6., 7., 0., 1.]);
    // Columns 1 and 0 of each row.
    assert_f32(&out[1], &[4, 2], &[1., 0., 3., 2., 5., 4., 7., 6.]);
    assert_f32(&out[2], &[2, 2], &[2., 3., 0., 1.]);
}

#[test]
fn take_along_dim_pairs_the_other_dims() {
    let out = run1(
        |b| {
            let x = b.parameter("x", [2, 3], DType::I32);
            let i = b.parameter("i", [2, 2], DType::I32);
            x.take_along_dim(&i, 1)
        },
        &[
            i32s(&[2, 3], &[0, 1, 2, 3, 4, 5]),
            i32s(&[2, 2], &[2, 0, 1, 9]),
        ],
    );
    assert_i32(&out, &[2, 2], &[2, 0, 4, 5]);
}

#[test]
fn gather_with_an_index_vector_clamps_each_slice_into_the_operand() {
    let dims = GatherDims {
        offset_dims: vec![1, 2],
        start_index_map: vec![0, 1],
        index_vector_dim: 1,
        slice_sizes: vec![2, 2],
        ..GatherDims::default()
    };
    let out = run(
        |b| {
            let x = b.parameter("x", [4, 3], DType::I32);
            let flags = b.parameter("flags", [4, 3], DType::Bool);
            let i = b.parameter("i", [2, 2], DType::I32);
            vec![x.gather(&i, &dims), flags.gather(&i, &dims)]
        },
        &[
            i32s(&[4, 3], &(0..12).collect::<Vec<_>>()),
            bools(
                &[4, 3],
                &[
                    true, false, true, false, true, false, true, false, true, false, true, false,
                ],
            ),
            i32s(&[2, 2], &[0, 1, 3, 2]),
        ],
    );
    // (0, 1): rows 0-1, cols 1-2; (3, 2) clamps to (2, 1).
    assert_i32(&out[0], &[2, 2, 2], &[1, 2, 4, 5, 7, 8, 10, 11]);
    assert_bool(
        &out[1],
        &[2, 2, 2],
        &[false, true, true, false, false, true, true, false],
    );
}

#[test]
fn index_add_accumulates_duplicates_and_skips_rows_out_of_range() {
    let out = run1(
        |b| {
            let x = f32_param(b, "x", &[4, 2]);
            let index = b.parameter("index", [5], DType::I32);
            let source = f32_param(b, "source", &[5, 2]);
            x.index_add(0, &index, &source)
        },
        &[
            f32s(&[4, 2], &[1.; 8]),
            i32s(&[5], &[1, 1, 7, -1, 3]),
            f32s(
                &[5, 2],
                &[1., 2., 10., 20., 100., 200., 1000., 2000., 5., 6.],
            ),
        ],
    );
    assert_f32(&out, &[4, 2], &[1., 1., 12., 23., 1., 1., 6., 7.]);
}

#[test]
fn scatter_replace_skips_windows_out_of_range_and_the_last_duplicate_wins() {
    let dims = ScatterDims {
        update_window_dims: vec![1],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: 1,
        ..ScatterDims::default()
    };
    let out = run(
        |b| {
            let x = b.parameter("x", [5], DType::I32);
            let i = b.parameter("i", [4, 1], DType::I32);
            let u = b.parameter("u", [4, 2], DType::I32);
            vec![x.scatter(&i, &u, &dims), x.scatter_add(&i, &u, &dims)]
        },
        &[
            i32s(&[5], &[0; 5]),
            i32s(&[4, 1], &[3, 4, 1, 3]),
            i32s(&[4, 2], &[1, 2, 3, 4, 5, 6, 7, 8]),
        ],
    );
    // Start 4 would write past the end: skipped; start 3 twice: the second wins.
    assert_i32(&out[0], &[5], &[0, 5, 6, 7, 8]);
    assert_i32(&out[1], &[5], &[0, 5, 6, 8, 10]);
}

// ---- control flow (regions) -------------------------------------------------------------

/// `while i < n { i += 1; x *= 2 }` with the trip count `n` a run-time input.
#[test]
fn while_loop_with_run_time_trip_count() {
    let build = |b: &Builder| {
        let x = b.parameter("x", [2], DType::F32);
        let n = b.parameter("n", [], DType::I32);
        let zero = b.constant(Literal::full(&[], DType::I32, 0.0));
        b.while_loop(
            |s| s[0].lt(&n),
            |s| {
                let one = s[0].builder().constant(Literal::full(&[], DType::I32, 1.0));
                vec![s[0].add(&one), s[1].mul(&s[1].builder().scalar(2.0))]
            },
            &[zero, x],
        )
    };
    let x = f32s(&[2], &[1.5, -3.0]);
    for (n, factor) in [(0, 1.0), (1, 2.0), (3, 8.0)] {
        let out = run(build, &[x.clone(), i32s(&[], &[n])]);
        assert_i32(&out[0], &[], &[n]);
        assert_f32(&out[1], &[2], &[1.5 * factor, -3.0 * factor]);
    }
}

/// A running sum over the rows of `xs` with the row sums as per-iteration outputs,
/// forwards and in reverse, against a loop by hand.
#[test]
fn scan_carries_state_and_stacks_outputs() {
    let data = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
    for reverse in [false, true] {
        let out = run(
            |b| {
                let xs = b.parameter("xs", [4, 2], DType::F32);
                let init = b.parameter("init", [2], DType::F32);
                let body = |c: &[Tensor], x: &[Tensor]| {
                    let next = c[0].add(&x[0]);
                    (vec![next.clone()], vec![next.sum(&[0]), x[0].neg()])
                };
                let (carry, ys) = if reverse {
                    b.scan_reverse(&[xs], &[init], body)
                } else {
                    b.scan(&[xs], &[init], body)
                };
                carry.into_iter().chain(ys).collect()
            },
            &[f32s(&[4, 2], &data), f32s(&[2], &[10.0, 20.0])],
        );
        let mut carry = [10.0f32, 20.0];
        let mut sums = [0.0f32; 4];
        let order: Vec<usize> = if reverse {
            vec![3, 2, 1, 0]
        } else {
            vec![0, 1, 2, 3]
        };
        for i in order {
            carry = [carry[0] + data[2 * i], carry[1] + data[2 * i + 1]];
            sums[i] = carry[0] + carry[1];
        }
        assert_f32(&out[0], &[2], &carry);
        assert_f32(&out[1], &[4], &sums);
        let negated: Vec<f32> = data.iter().map(|v| -v).collect();
        assert_f32(&out[2], &[4, 2], &negated);
    }
}

/// A `fori_loop` nested in a `fori_loop`, the inner body reading a parameter of the
/// outermost program (captured through both regions) and both counters.
#[test]
fn nested_loops_capture_through_every_level() {
    let out = run1(
        |b| {
            let w = b.parameter("w", [], DType::F32);
            let acc = b.scalar(0.0);
            let outer = b.fori_loop(3, &[acc], |i, c| {
                let fi = i.convert(DType::F32);
                b.fori_loop(2, c, |j, c| {
                    let fj = j.convert(DType::F32);
                    vec![c[0].add(&w.mul(&fi.add(&fj)))]
                })
            });
            outer[0].clone()
        },
        &[f32s(&[], &[0.5])],
    );
    // sum over i < 3, j < 2 of 0.5 * (i + j) = 0.5 * (2 * 3 + 3 * 1) = 4.5
    assert_f32(&out, &[], &[4.5]);
}

/// `cond` runs the branch the predicate picks; branches capture values of the program.
#[test]
fn cond_takes_one_branch() {
    for (p, expected) in [(true, [2.0f32, 4.0]), (false, [0.0, 1.0])] {
        let out = run1(
            |b| {
                let pred = b.parameter("p", [], DType::Bool);
                let x = b.parameter("x", [2], DType::F32);
                let r = b.cond(
                    &pred,
                    |_| vec![x.add(&x)],
                    |inner| vec![x.sub(&inner.full([2], DType::F32, 1.0))],
                );
                r[0].clone()
            },
            &[bools(&[], &[p]), f32s(&[2], &[1.0, 2.0])],
        );
        assert_f32(&out, &[2], &expected);
    }
}

/// A `shard_map` over `model` (2 devices) runs its body once per device on the blocks
/// and assembles the results: worked out by hand. Device `i` holds `x[2i..2i+2]`.
#[test]
fn shard_map_runs_the_body_per_device() {
    let mesh = gspmd_core::sharding::Mesh::new([("data", 3), ("model", 2)]).unwrap();
    let spec = |t: &str| -> Sharding { t.parse().unwrap() };
    let outs = run(
        |b| {
            let x = b.parameter("x", [4], DType::F32);
            let c = b.parameter("c", [2], DType::F32);
            b.shard_map(
                &mesh,
                &["model"],
                &[x],
                &[spec("(model)")],
                &[spec("(_)"), spec("(model)"), spec("(_)")],
                |inner, blocks| {
                    let index = inner.axis_index(&["model"]).convert(DType::F32);
                    // [1, 2] and [6, 8].
                    let y = blocks[0].mul(&(index + 1.0));
                    // c is captured: every device reads it whole.
                    let summed = y.psum(&["model"]).add(&c);
                    let gathered = blocks[0].all_gather(&["model"], 0);
                    vec![summed, y.ppermute(&["model"], 1), gathered]
                },
            )
        },
        &[
            f32s(&[4], &[1.0, 2.0, 3.0, 4.0]),
            f32s(&[2], &[100.0, 200.0]),
        ],
    );
    assert_f32(&outs[0], &[2], &[107.0, 210.0]);
    assert_f32(&outs[1], &[4], &[6.0, 8.0, 1.0, 2.0]);
    assert_f32(&outs[2], &[4], &[1.0, 2.0, 3.0, 4.0]);
}

/// Every op kind of a global program is interpreted by some test above (through
/// [`run`]); the SPMD-only ones are rejected (`spmd_only_op_is_a_runtime_error_with_location`).
/// `random_bits` against Random123's known answer for threefry2x32_20 at key and
/// counter zero (`6b200159 99ba4efe`): `fold_in(key, 0)` is that block, the first
/// draw of `bits` its xor; a stacked split counts from 0 in row-major order.
#[test]
fn random_bits_give_the_known_threefry_answer() {
    let outs = run(
        |b| {
            let key = b.parameter("key", [2], DType::I32);
            let zero = b.constant(Literal::full(&[], DType::I32, 0.0));
            vec![
                random::fold_in(&key, &zero),
                random::bits(&key, [2, 3]),
                random::split_stacked(&key, 3),
            ]
        },
        &[i32s(&[2], &[0, 0])],
    );
    let (y0, y1) = (0x6b20_0159u32 as i32, 0x99ba_4efeu32 as i32);
    assert_eq!(outs[0], i32s(&[2], &[y0, y1]));
    let bits = outs[1].as_i32().unwrap();
    assert_eq!(bits.shape(), [2, 3]);
    assert_eq!(bits[[0, 0]], y0 ^ y1);
    let keys = outs[2].as_i32().unwrap();
    assert_eq!(keys.shape(), [3, 2]);
    assert_eq!((keys[[0, 0]], keys[[0, 1]]), (y0, y1));
    for (i, row) in keys.outer_iter().enumerate().skip(1) {
        assert_eq!(row[0] ^ row[1], bits.as_slice().unwrap()[i], "counter {i}");
    }
}

#[test]
fn covers_every_op_kind() {
    let kinds = op_coverage::kinds_checked("covers_every_op_kind");
    let global = |k: OpKind| !k.is_spmd_only();
    op_coverage::assert_kinds("interpreted", kinds.get("interpreted"), global, global);
}

/// Two nodes reading the same result of one loop (a program no simplification has
/// merged) both get it; the loop runs once.
#[test]
fn a_loop_result_read_by_two_nodes() {
    let b = Builder::new("twice");
    let x = b.parameter("x", [2], DType::F32);
    let r = b.fori_loop(2, &[x], |_, c| vec![c[0].add(&c[0])]);
    let mut program = b.finish(&[&r[0]]).unwrap();
    let node = program.node(r[0].id().unwrap()).clone();
    let again = program.push(node);
    program.outputs.push(again);
    verify(&program).unwrap();
    let out = interpret(&program, &[f32s(&[2], &[1.0, -2.0])]).unwrap();
    assert_f32(&out[0], &[2], &[4.0, -8.0]);
    assert_f32(&out[1], &[2], &[4.0, -8.0]);
}
