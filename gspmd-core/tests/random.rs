//! Random numbers (`gspmd_core::ir::random`): the same bits on one device, on a 2x4
//! thread mesh under several shardings of the output (split dims, both axes, uneven
//! and padded blocks) and in the reference interpreter, all equal to threefry-2x32
//! computed here on the host; keys split and folded in as JAX does; the statistics of
//! uniform, normal and bernoulli draws and of dropout; typed errors with the caller's
//! line.

use gspmd_core::autodiff::grad;
use gspmd_core::ir::random::{self, RandomOutput, threefry2x32};
use gspmd_core::ir::{Builder, DType, Literal, Op, Program, Tensor};
use gspmd_core::runtime::{ThreadMesh, interpret};
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::{Error, compile};

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

fn i32s(lit: &Literal) -> Vec<i32> {
    lit.as_i32()
        .expect("an i32 result")
        .iter()
        .copied()
        .collect()
}

fn f32s(lit: &Literal) -> Vec<f32> {
    lit.as_f32()
        .expect("an f32 result")
        .iter()
        .copied()
        .collect()
}

/// The 32-bit draws of `key` at counters `0..n`, computed on the host.
fn host_bits(key: [u32; 2], n: usize) -> Vec<i32> {
    (0..n as u32)
        .map(|i| {
            let [y0, y1] = threefry2x32(key, [0, i]);
            (y0 ^ y1) as i32
        })
        .collect()
}

/// Runs `program` on `inputs` on a 1x1 and a 2x4 thread mesh and in the reference
/// interpreter; asserts all three give bitwise the same outputs, and returns them.
fn same_everywhere(program: &Program, inputs: &[Literal]) -> Vec<Literal> {
    let want = interpret(program, inputs).unwrap();
    for mesh in [
        Mesh::new([("data", 1), ("model", 1)]).unwrap(),
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
    ] {
        let exe = compile(program, &mesh).unwrap();
        let got = exe
            .run(&ThreadMesh::new(mesh.clone()).unwrap(), inputs)
            .unwrap();
        assert_eq!(got, want, "{} on {mesh}\n{}", program.name, exe.report());
    }
    want
}

/// Bits of shapes that divide the 2x4 mesh unevenly, under shardings that split one
/// dim, both, and one dim over both axes: every device's block equals the host's
/// threefry at the global indices.
#[test]
fn bits_are_the_same_on_every_mesh_and_sharding() {
    let cases = [
        ([8, 12], "(data, model)"),
        ([7, 10], "(data, model)"),
        ([5, 3], "(model, data)"),
        ([9, 6], "((data, model), _)"),
        ([3, 13], "(_, (model, data))"),
        ([6, 6], "(_, _)"),
    ];
    for (shape, sharding) in cases {
        let b = Builder::new("bits");
        let key = b.parameter("key", [2], DType::I32);
        let out = random::bits(&key, shape).annotate(s(sharding));
        let program = b.finish(&[&out]).unwrap();
        let key_words = [0x1234_5678, 0x9abc_def0];
        let key_input =
            Literal::I32(ndarray::arr1(&[key_words[0] as i32, key_words[1] as i32]).into_dyn());
        let got = same_everywhere(&program, &[key_input]);
        let n = shape.iter().product();
        assert_eq!(
            i32s(&got[0]),
            host_bits(key_words, n),
            "{shape:?} {sharding}"
        );
    }
}

/// A rank-3 draw with the middle dim split: the counter strides of the outer and inner
/// dims enter each block's base.
#[test]
fn rank_3_bits_with_a_split_middle_dim() {
    let b = Builder::new("bits3");
    let key = random::key(&b, 42);
    let out = random::bits(&key, [3, 10, 5]).annotate(s("(_, (model, data), _)"));
    let program = b.finish(&[&out]).unwrap();
    let got = same_everywhere(&program, &[]);
    assert_eq!(i32s(&got[0]), host_bits([0, 42], 150));
}

/// `split` and `fold_in` are JAX's (partitionable threefry): key `i` of a split is the
/// block of counter `(0, i)`, which is also `fold_in(key, i)`; a key made from a traced
/// step counter draws differently per step.
#[test]
fn split_and_fold_in_are_threefry_of_the_index() {
    let b = Builder::new("keys");
    let key = random::key(&b, 7);
    let step = b.parameter("step", [], DType::I32);
    let keys = random::split(&key, 3);
    let folded = random::fold_in(&key, &step);
    let draws = random::bits(&folded, [4, 4]).annotate(s("(data, model)"));
    let outputs: Vec<&Tensor> = keys.iter().chain([&folded, &draws]).collect();
    let program = b.finish(&outputs).unwrap();
    let mut previous = None;
    for step in [2, 5] {
        let got = same_everywhere(&program, &[Literal::from(ndarray::arr0(step).into_dyn())]);
        for i in 0..3u32 {
            let [y0, y1] = threefry2x32([0, 7], [0, i]);
            assert_eq!(i32s(&got[i as usize]), [y0 as i32, y1 as i32]);
        }
        let [f0, f1] = threefry2x32([0, 7], [0, step as u32]);
        assert_eq!(i32s(&got[3]), [f0 as i32, f1 as i32]);
        // The host's fold_in (a trainer's key per step) is the traced one.
        let host = random::fold_in_data(&random::key_data(7), step as u32).unwrap();
        assert_eq!(host, got[3]);
        assert_eq!(i32s(&got[4]), host_bits([f0, f1], 16));
        assert_ne!(previous.as_ref(), Some(&got[4]), "each step draws anew");
        previous = Some(got[4].clone());
    }
}

/// Values JAX 0.12.0.1 gives for `PRNGKey(42)` (threefry, partitionable: its default),
/// printed by `jax.random.bits(k, (2, 3), uint32)`, `split(k, 3)`, `fold_in(k, 5)`,
/// `uniform(k, (4,))` and `uniform(k, (4,), minval=-2.0, maxval=3.0)` (as f32 bits) and
/// `bernoulli(k, 0.3, (8,))`: the same here, on one device and split over the 2x4 mesh.
/// Scaled to `[-2, 3)` they may differ by the rounding of the product: XLA on the CPU
/// contracts `u * (hi - lo) + lo` into a fused multiply-add, which rounds once where a
/// multiply and an add round twice.
#[test]
fn draws_equal_jax() {
    let b = Builder::new("jax");
    let key = random::key(&b, 42);
    let five = b.constant(Literal::full(&[], DType::I32, 5.0));
    let outputs = [
        random::bits(&key, [2, 3]).annotate(s("(data, model)")),
        random::split_stacked(&key, 3).annotate(s("(model, _)")),
        random::fold_in(&key, &five),
        random::uniform(&key, [4], 0.0, 1.0).annotate(s("(model)")),
        random::uniform(&key, [4], -2.0, 3.0),
        random::bernoulli(&key, 0.3, [8]).annotate(s("((data, model))")),
    ];
    let program = b.finish(&outputs.iter().collect::<Vec<_>>()).unwrap();
    let got = same_everywhere(&program, &[]);
    let words = |ws: &[u32]| ws.iter().map(|&w| w as i32).collect::<Vec<_>>();
    let bits = [
        0x7d1c13a2, 0xae0730d9, 0x9dc3f9f9, 0x8f9ec1d7, 0x735d7315, 0x95fb4ed8,
    ];
    assert_eq!(i32s(&got[0]), words(&bits));
    let keys = [
        0x6d3e048f, 0x1022172d, 0x03d7b32d, 0xadd083f4, 0x92fb20ea, 0x0f38d913,
    ];
    assert_eq!(i32s(&got[1]), words(&keys));
    assert_eq!(i32s(&got[2]), words(&[0xa4d91a96, 0x3122544e]));
    let unit = [1056585764, 1059981104, 1058915320, 1057988288].map(f32::from_bits);
    assert_eq!(f32s(&got[3]), unit);
    let scaled = [0x3ee318b4, 0x3fb311f8, 0x3f8a69ec, 0x3f4e19c0].map(f32::from_bits);
    for (got, jax) in f32s(&got[4]).into_iter().zip(scaled) {
        // The product's rounding: half an ulp of a value below 5.
        assert!(
            (got - jax).abs() <= 5.0 * f32::EPSILON,
            "{got} vs JAX's {jax}"
        );
    }
    let bernoulli: Vec<bool> = got[5].as_bool().unwrap().iter().copied().collect();
    assert_eq!(
        bernoulli,
        [false, false, false, false, false, false, true, false]
    );
}

/// Stacked split keys sharded on their counter dim, and on their word dim too (which
/// each device computes whole and then cuts), and a split key's own draws.
#[test]
fn split_keys_sharded_on_the_counter_dim() {
    let b = Builder::new("split");
    let key = b.parameter("key", [2], DType::I32);
    let rows = random::split_stacked(&key, 10).annotate(s("(model, _)"));
    let cells = random::split_stacked(&key, 10).annotate(s("(model, data)"));
    let second = random::bits(&random::split(&key, 10)[1], [6]).annotate(s("(model)"));
    let program = b.finish(&[&rows, &cells, &second]).unwrap();
    let is_key = |op: &Op| {
        matches!(
            op,
            Op::RandomBits {
                output: RandomOutput::Key,
                ..
            }
        )
    };
    assert!(program.nodes.iter().any(|n| is_key(&n.op)));
    let got = same_everywhere(&program, &[random::key_data(3)]);
    let want: Vec<i32> = (0..10)
        .flat_map(|i| threefry2x32([0, 3], [0, i]).map(|w| w as i32))
        .collect();
    assert_eq!(i32s(&got[0]), want);
    assert_eq!(i32s(&got[1]), want);
    let [k0, k1] = threefry2x32([0, 3], [0, 1]);
    assert_eq!(i32s(&got[2]), host_bits([k0, k1], 6));
}

/// Mean and variance of `xs` in f64.
fn moments(xs: &[f32]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let var = xs
        .iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n;
    (mean, var)
}

/// Draws of `f(key)` over 1M elements on the 2x4 mesh (split rows), equal to the
/// reference's.
fn million(f: impl Fn(&Tensor) -> Tensor) -> Literal {
    let b = Builder::new("draws");
    let key = random::key(&b, 2026);
    let out = f(&key).annotate(s("(data, model)"));
    let program = b.finish(&[&out]).unwrap();
    let want = interpret(&program, &[]).unwrap();
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let got = (compile(&program, &mesh).unwrap())
        .run(&ThreadMesh::new(mesh).unwrap(), &[])
        .unwrap();
    assert_eq!(got, want);
    want.into_iter().next().unwrap()
}

/// 2^20 draws, as a `[1024, 1024]` array.
const SIDE: usize = 1024;

/// Uniform draws are JAX's (the top 23 bits as the mantissa, exact), and over 2^20
/// draws have mean 1/2 and variance 1/12 within 6 standard errors (the mean's is
/// `sqrt(1/12 / n)`, the variance's `sqrt((1/80 - 1/144) / n)`).
#[test]
fn uniform_is_jax_uniform_with_the_right_moments() {
    let xs = f32s(&million(|key| random::uniform(key, [SIDE, SIDE], 0.0, 1.0)));
    let n = xs.len() as f64;
    let grid = host_bits([0, 2026], 1000)
        .iter()
        .map(|&b| ((b as u32) >> 9) as f32 * (1.0 / (1 << 23) as f32))
        .collect::<Vec<_>>();
    assert_eq!(xs[..1000], grid[..]);
    assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
    let (mean, var) = moments(&xs);
    assert!(
        (mean - 0.5).abs() < 6.0 * (1.0 / 12.0 / n).sqrt(),
        "mean {mean}"
    );
    let var_se = ((1.0 / 80.0 - 1.0 / 144.0) / n).sqrt();
    assert!((var - 1.0 / 12.0).abs() < 6.0 * var_se, "variance {var}");

    let ys = f32s(&million(|key| {
        random::uniform(key, [SIDE, SIDE], -2.0, 3.0)
    }));
    assert!(ys.iter().all(|&y| (-2.0..3.0).contains(&y)));
    let (mean, _) = moments(&ys);
    assert!(
        (mean - 0.5).abs() < 6.0 * 5.0 * (1.0 / 12.0 / n).sqrt(),
        "mean {mean}"
    );
}

/// Normal draws over 2^20: mean 0 and variance 1 within 6 standard errors
/// (`sqrt(1/n)`, `sqrt(2/n)`), and the two-sided tail beyond 2 sigma (0.0455) within 6
/// binomial standard errors: the shape, not only the moments.
#[test]
fn normal_has_the_moments_and_tails_of_a_standard_normal() {
    let xs = f32s(&million(|key| random::normal(key, [SIDE, SIDE])));
    let n = xs.len() as f64;
    assert!(xs.iter().all(|x| x.is_finite()));
    let (mean, var) = moments(&xs);
    assert!(mean.abs() < 6.0 * (1.0 / n).sqrt(), "mean {mean}");
    assert!((var - 1.0).abs() < 6.0 * (2.0 / n).sqrt(), "variance {var}");
    let tail = xs.iter().filter(|x| x.abs() > 2.0).count() as f64 / n;
    let p = 0.045_500_263_9;
    assert!(
        (tail - p).abs() < 6.0 * (p * (1.0 - p) / n).sqrt(),
        "tail {tail}"
    );
}

/// Bernoulli(0.3) over 2^20: the fraction of trues within 6 binomial standard errors.
#[test]
fn bernoulli_is_true_with_probability_p() {
    let draws = million(|key| random::bernoulli(key, 0.3, [SIDE, SIDE]));
    let bools = draws.as_bool().expect("a bool result");
    let n = bools.len() as f64;
    let fraction = bools.iter().filter(|&&b| b).count() as f64 / n;
    assert!(
        (fraction - 0.3).abs() < 6.0 * (0.21 / n).sqrt(),
        "fraction {fraction}"
    );
}

/// Dropout at rate 1/4 of ones: about 3/4 kept (6 binomial standard errors), each kept
/// element `1 / (1 - rate)` exactly, the others 0, so the mean stays near 1; rate 0
/// is the identity.
#[test]
fn dropout_keeps_one_minus_rate_scaled_up() {
    let out = million(|key| {
        let ones = key.builder().full([SIDE, SIDE], DType::F32, 1.0);
        random::dropout(&ones, 0.25, key)
    });
    let xs = f32s(&out);
    let n = xs.len() as f64;
    let scale = 1.0f32 / 0.75;
    assert!(xs.iter().all(|&x| x == 0.0 || x == scale));
    let kept = xs.iter().filter(|&&x| x == scale).count() as f64 / n;
    assert!(
        (kept - 0.75).abs() < 6.0 * (0.75 * 0.25 / n).sqrt(),
        "kept {kept}"
    );

    let b = Builder::new("no_dropout");
    let x = b.parameter("x", [4], DType::F32);
    let key = random::key(&b, 1);
    let y = random::dropout(&x, 0.0, &key);
    assert_eq!(y.id(), x.id());
}

/// The gradient of `sum(dropout(x) * w)` with respect to `x` is `w` scaled where kept,
/// 0 where dropped: the draw is a constant of the sweep (no gradient to the key), and
/// the gradient program runs on the mesh as on one device.
#[test]
fn dropout_gradient_flows_through_kept_elements() {
    let b = Builder::new("dropout_grad");
    let x = b.parameter("x", [8, 6], DType::F32);
    let w = b.parameter("w", [8, 6], DType::F32);
    let key = b.parameter("key", [2], DType::I32);
    let y = random::dropout(&x.annotate(s("(data, model)")), 0.5, &key);
    let mask = random::bernoulli(&key, 0.5, [8, 6]);
    let loss = (y * &w).sum(&[0, 1]);
    let program = b.finish(&[&loss, &mask]).unwrap();
    let g = grad(&program, 0, &[0]).unwrap();
    let w_in: Vec<f32> = (0..48).map(|i| i as f32 - 20.0).collect();
    let inputs = [
        Literal::F32(ndarray::ArrayD::zeros(ndarray::IxDyn(&[8, 6]))),
        Literal::F32(
            ndarray::Array::from_shape_vec(ndarray::IxDyn(&[8, 6]), w_in.clone()).unwrap(),
        ),
        random::key_data(11),
    ];
    let got = same_everywhere(&g, &inputs);
    let mask = got[1]
        .as_bool()
        .unwrap()
        .iter()
        .copied()
        .collect::<Vec<_>>();
    let dx = f32s(got.last().unwrap());
    assert!(mask.iter().any(|&m| m) && mask.iter().any(|&m| !m));
    for ((&dx, &kept), &w) in dx.iter().zip(&mask).zip(&w_in) {
        assert_eq!(dx, if kept { w * 2.0 } else { 0.0 });
    }
}

/// The one error a call records, at the line `line` of this file.
fn one_error(b: Builder, out: &Tensor, line: u32) -> Error {
    let errors = match b.finish(&[out]) {
        Err(Error::Many(errors)) => errors,
        Err(error) => vec![error],
        Ok(_) => panic!("expected an error at line {line}"),
    };
    assert_eq!(errors.len(), 1, "{errors:?}");
    let error = errors.into_iter().next().unwrap();
    let location = match &error {
        Error::Shape { location, .. } | Error::Random { location, .. } => *location,
        other => panic!("unexpected error {other:?}"),
    };
    assert_eq!((location.file, location.line), (file!(), line), "{error}");
    error
}

#[test]
fn bad_keys_and_bounds_are_typed_errors_at_the_callers_line() {
    let shape_error = |make: &dyn Fn(&Builder) -> (Tensor, u32), needle: &str| {
        let b = Builder::new("bad");
        let (out, line) = make(&b);
        match one_error(b, &out, line) {
            Error::Shape { op, message, .. } => {
                assert_eq!(op, "random_bits");
                assert!(message.contains(needle), "{message}");
            }
            other => panic!("expected a shape error, got {other:?}"),
        }
    };
    shape_error(
        &|b| {
            let key = b.parameter("key", [2], DType::F32);
            (random::bits(&key, [3]), line!())
        },
        "the key must be i32[2]",
    );
    shape_error(
        &|b| {
            let key = b.parameter("key", [3], DType::I32);
            (random::uniform(&key, [3], 0.0, 1.0), line!())
        },
        "the key must be i32[2]",
    );
    shape_error(
        &|b| {
            let key = random::key(b, 0);
            let data = b.parameter("data", [1], DType::I32);
            (random::fold_in(&key, &data), line!())
        },
        "the counter base must be an i32 scalar",
    );
    shape_error(
        &|b| {
            let key = random::key(b, 0);
            (random::bits(&key, [1 << 16, 1 << 16, 2]), line!())
        },
        "more than 2^32 counters",
    );

    let random_error = |make: &dyn Fn(&Builder, &Tensor) -> (Tensor, u32), op_name: &str| {
        let b = Builder::new("bad");
        let key = random::key(&b, 0);
        let (out, line) = make(&b, &key);
        match one_error(b, &out, line) {
            Error::Random { op, .. } => assert_eq!(op, op_name),
            other => panic!("expected a random error, got {other:?}"),
        }
    };
    random_error(
        &|_, key| (random::uniform(key, [2], 1.0, 1.0), line!()),
        "uniform",
    );
    random_error(
        &|_, key| (random::uniform(key, [2], 0.0, f32::INFINITY), line!()),
        "uniform",
    );
    random_error(
        &|_, key| (random::bernoulli(key, 1.5, [2]), line!()),
        "bernoulli",
    );
    random_error(
        &|_, key| (random::bernoulli(key, f64::NAN, [2]), line!()),
        "bernoulli",
    );
    random_error(
        &|b, key| (random::dropout(&b.scalar(1.0), 1.0, key), line!()),
        "dropout",
    );
    random_error(
        &|b, key| (random::dropout(&b.scalar(1.0), -0.1, key), line!()),
        "dropout",
    );
    let b = Builder::new("int_dropout");
    let key = random::key(&b, 0);
    let ints = b.iota([4], 0, DType::I32);
    let (out, line) = (random::dropout(&ints, 0.5, &key), line!());
    assert!(matches!(
        one_error(b, &out, line),
        Error::Shape { op: "dropout", .. }
    ));
    // The host's fold_in of a literal that is no key.
    let not_a_key = Literal::full(&[3], DType::I32, 0.0);
    let (e, line) = (random::fold_in_data(&not_a_key, 1), line!());
    match e {
        Err(Error::Random {
            op,
            location,
            message,
        }) => {
            assert_eq!((op, location.line), ("fold_in", line));
            assert!(message.contains("i32[3]"), "{message}");
        }
        other => panic!("expected a random error, got {other:?}"),
    }
}
