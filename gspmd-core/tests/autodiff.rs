//! Reverse-mode `grad` against central finite differences of the forward program, run
//! by the reference interpreter: every primitive's rule alone, composites, sharding
//! annotations on gradients, conventions at ties and kinks, errors. Also the builder's
//! `mse` and `cross_entropy_with_logits` against hand-computed values.
//!
//! Finite differences: `(L(x + eps) - L(x - eps)) / 2 eps` with `eps = 1e-2`, in f32,
//! on inputs drawn away from kinks and ties; an analytic gradient `g` passes when
//! `|g - fd| <= 2e-2 |fd| + 2e-3` (truncation is `O(eps^2)`, f32 rounding of the loss
//! difference about `1e-4` for losses of order 1).

use gspmd_core::Error;
use gspmd_core::autodiff::{grad, is_differentiable};
use gspmd_core::ir::random;
use gspmd_core::ir::{
    AxisGroup, Builder, DType, DotDims, GatherDims, Literal, Location, Node, Op, OpKind, Padding,
    Program, PropagationDirection, ReduceKind, ScatterDims, Tensor, ValueId, WindowDim, einsum,
    verify,
};
use gspmd_core::runtime::interpret;
use gspmd_core::runtime::uniform_f32;
use gspmd_core::sharding::{DimSharding, Sharding};
use ndarray::{ArrayD, IxDyn};
use rand::rngs::Xoshiro256PlusPlus;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

mod conv_cases;
mod op_coverage;

// ---- random inputs ---------------------------------------------------------------------

/// Uniform magnitude in `[lo, hi)` with a random sign: away from 0.
fn signed(rng: &mut Xoshiro256PlusPlus, lo: f32, hi: f32) -> f32 {
    let m = rng.random_range(lo..hi);
    if rng.random_bool(0.5) { m } else { -m }
}

/// An f32 array of `shape` whose elements are successive draws of `f`.
fn array(
    rng: &mut Xoshiro256PlusPlus,
    shape: &[usize],
    mut f: impl FnMut(&mut Xoshiro256PlusPlus) -> f32,
) -> Literal {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| f(rng)).collect();
    f32s(shape, &data)
}

fn f32s(shape: &[usize], data: &[f32]) -> Literal {
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap())
}

fn i32s(shape: &[usize], data: &[i32]) -> Literal {
    Literal::I32(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap())
}

fn values(lit: &Literal) -> Vec<f32> {
    lit.as_f32()
        .expect("an f32 literal")
        .iter()
        .copied()
        .collect()
}

fn scalar(lit: &Literal) -> f32 {
    let v = values(lit);
    assert_eq!(v.len(), 1, "not a scalar: {lit:?}");
    v[0]
}

// ---- tracing and checking ----------------------------------------------------------------

/// Traces a one-output program.
fn trace(build: impl FnOnce(&Builder) -> Tensor) -> Program {
    let b = Builder::new("loss");
    let loss = build(&b);
    b.finish(&[&loss]).unwrap()
}

fn param(b: &Builder, name: &str, shape: &[usize]) -> Tensor {
    b.parameter(name, shape.to_vec(), DType::F32)
}

/// `sum(t * w)` for fixed random weights `w` in `[-1, 1)`: makes every element of `t`
/// matter to a scalar loss, each with its own weight.
fn weighted_sum(t: &Tensor, rng: &mut Xoshiro256PlusPlus) -> Tensor {
    let w = t.builder().constant(uniform_f32(rng, t.shape(), -1.0, 1.0));
    let all: Vec<isize> = (0..t.rank() as isize).collect();
    t.mul(&w).sum(&all)
}

const EPS: f32 = 1e-2;

fn close(analytic: f32, fd: f32) -> bool {
    (analytic - fd).abs() <= 2e-2 * fd.abs() + 2e-3
}

/// Checks the structure of `g = grad(program, 0, wrt)`: verified, forward nodes and
/// outputs unchanged, every backward node used and located at a traced line.
fn check_structure(program: &Program, g: &Program, wrt: &[usize]) {
    verify(g).unwrap();
    let n = program.nodes.len();
    for (f, b) in program.nodes.iter().zip(&g.nodes[..n]) {
        match (&f.op, &b.op) {
            // A differentiated scan gains residual outputs; its results stay.
            (Op::Flow { result: r, .. }, Op::Flow { result: s, .. }) => {
                assert_eq!((r, &f.operands, &f.ty), (s, &b.operands, &b.ty));
            }
            _ => assert_eq!(f, b, "forward part changed"),
        }
    }
    assert_eq!(g.params, program.params);
    assert_eq!(
        &g.outputs[..program.outputs.len()],
        program.outputs.as_slice()
    );
    assert_eq!(g.outputs.len(), program.outputs.len() + wrt.len());
    let users = g.users();
    for v in g.values().skip(n) {
        assert!(
            !users[v.index()].is_empty() || g.outputs.contains(&v),
            "dead backward node {v} in\n{g}"
        );
        assert_ne!(
            g.node(v).location,
            Location::synthetic(),
            "{v} has no location"
        );
    }
}

/// Analytic gradients of output 0 of `program` with respect to `wrt`, checked against
/// central differences element by element. Returns the gradients.
fn check_gradients(program: &Program, inputs: &[Literal], wrt: &[usize]) -> Vec<Literal> {
    let g = grad(program, 0, wrt).unwrap();
    check_structure(program, &g, wrt);
    let mut outs = interpret(&g, inputs).unwrap();
    let forward = interpret(program, inputs).unwrap();
    assert_eq!(
        outs[..forward.len()],
        forward[..],
        "forward outputs changed"
    );
    let grads = outs.split_off(forward.len());
    let loss_at = |p: usize, j: usize, delta: f32| {
        let mut xs = inputs.to_vec();
        let Literal::F32(a) = &mut xs[p] else {
            panic!("parameter {p} is not f32")
        };
        a.as_slice_mut().unwrap()[j] += delta;
        scalar(&interpret(program, &xs).unwrap()[0])
    };
    for (&p, analytic) in wrt.iter().zip(&grads) {
        assert_eq!(analytic.shape(), inputs[p].shape(), "gradient {p} shape");
        for (j, &a) in values(analytic).iter().enumerate() {
            let fd = (loss_at(p, j, EPS) - loss_at(p, j, -EPS)) / (2.0 * EPS);
            assert!(
                close(a, fd),
                "d loss / d param {p} element {j}: analytic {a}, finite difference {fd}\n{g}"
            );
        }
    }
    op_coverage::record("finite_differences", program);
    grads
}

// ---- unary ----------------------------------------------------------------------------

#[test]
fn unary_rules_match_finite_differences() {
    type Method = fn(&Tensor) -> Tensor;
    let cases: [(&str, Method, f32, f32); 11] = [
        ("negate", Tensor::neg, -2.0, 2.0),
        ("abs", Tensor::abs, 0.2, 2.0), // signed below: away from the kink
        ("exponential", Tensor::exp, -2.0, 1.5),
        ("log", Tensor::log, 0.5, 2.0),
        ("sqrt", Tensor::sqrt, 0.5, 2.0),
        ("rsqrt", Tensor::rsqrt, 0.5, 2.0),
        ("tanh", Tensor::tanh, -2.0, 2.0),
        ("logistic", Tensor::logistic, -3.0, 3.0),
        ("sine", Tensor::sin, -4.0, 4.0),
        ("cosine", Tensor::cos, -4.0, 4.0),
        ("erf", Tensor::erf, -2.5, 2.5),
    ];
    for (i, (name, method, lo, hi)) in cases.into_iter().enumerate() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(100 + i as u64);
        let program = trace(|b| weighted_sum(&method(&param(b, "x", &[2, 3])), &mut rng));
        let x = if name == "abs" {
            array(&mut rng, &[2, 3], |r| signed(r, lo, hi))
        } else {
            uniform_f32(&mut rng, &[2, 3], lo, hi)
        };
        println!("{name}");
        check_gradients(&program, &[x], &[0]);
    }
}

#[test]
fn abs_has_zero_gradient_at_zero() {
    let program = trace(|b| param(b, "x", &[3]).abs().sum(&[0]));
    let g = grad(&program, 0, &[0]).unwrap();
    let outs = interpret(&g, &[f32s(&[3], &[-2.0, 0.0, 3.0])]).unwrap();
    assert_eq!(values(&outs[1]), vec![-1.0, 0.0, 1.0]);
}

// ---- binary ---------------------------------------------------------------------------

#[test]
fn binary_rules_match_finite_differences() {
    type Method = fn(&Tensor, &Tensor) -> Tensor;
    let cases: [(&str, Method); 8] = [
        ("add", Tensor::add),
        ("subtract", Tensor::sub),
        ("multiply", Tensor::mul),
        ("divide", Tensor::div),
        ("maximum", Tensor::max),
        ("minimum", Tensor::min),
        ("power", Tensor::pow),
        ("remainder", Tensor::rem),
    ];
    for (i, (name, method)) in cases.into_iter().enumerate() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(200 + i as u64);
        let program = trace(|b| {
            let (a, c) = (param(b, "a", &[2, 3]), param(b, "b", &[2, 3]));
            weighted_sum(&method(&a, &c), &mut rng)
        });
        let (a, c) = match name {
            "divide" => (
                uniform_f32(&mut rng, &[2, 3], -2.0, 2.0),
                array(&mut rng, &[2, 3], |r| signed(r, 0.5, 2.0)),
            ),
            "power" => (
                uniform_f32(&mut rng, &[2, 3], 0.5, 2.0),
                uniform_f32(&mut rng, &[2, 3], -1.5, 1.5),
            ),
            "remainder" => away_from_multiples(&mut rng, &[2, 3]),
            // `b` a clear distance from `a`: no ties within eps.
            _ => {
                let a = uniform_f32(&mut rng, &[2, 3], -2.0, 2.0);
                let b: Vec<f32> = values(&a)
                    .iter()
                    .map(|v| v + signed(&mut rng, 0.1, 1.0))
                    .collect();
                (a, f32s(&[2, 3], &b))
            }
        };
        println!("{name}");
        check_gradients(&program, &[a, c], &[0, 1]);
    }
}

/// `(a, b)` with `a / b` in `n + [0.2, 0.8]` for an integer `n` in `[-3, 3)` and `|b|`
/// in `[0.5, 2)`: a remainder `a - b trunc(a/b)` at least `0.2 |b|` from its jumps.
fn away_from_multiples(rng: &mut Xoshiro256PlusPlus, shape: &[usize]) -> (Literal, Literal) {
    let b = array(rng, shape, |r| signed(r, 0.5, 2.0));
    let a: Vec<f32> = values(&b)
        .iter()
        .map(|v| v * (rng.random_range(-3..3) as f32 + rng.random_range(0.2..0.8)))
        .collect();
    (f32s(shape, &a), b)
}

/// floor, ceil, round and sign are piecewise constant and `is_finite` bool-valued: no
/// gradient flows through them (JAX's zero derivative), which central differences
/// away from the jumps confirm; `x` still reaches the loss through a select on
/// `is_finite`.
#[test]
fn rounding_ops_and_is_finite_pass_no_gradient() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(250);
    let program = trace(|b| {
        let x = param(b, "x", &[2, 3]);
        let steps = x.floor() + x.ceil() + x.round() + x.sign();
        let guarded = x.is_finite().select(&x.tanh(), &x);
        weighted_sum(&steps, &mut rng).add(&weighted_sum(&guarded, &mut rng))
    });
    // At least 0.1 from integers, half-integers and 0.
    let x = array(&mut rng, &[2, 3], |r| {
        let quarter = if r.random_bool(0.5) { 0.25 } else { 0.75 };
        r.random_range(-3..3) as f32 + quarter + r.random_range(-0.15..0.15)
    });
    check_gradients(&program, std::slice::from_ref(&x), &[0]);
    // Through the steps alone: exactly zero.
    let program = trace(|b| {
        let x = param(b, "x", &[2, 3]);
        (x.floor() + x.ceil() + x.round() + x.sign()).sum(&[0, 1])
    });
    let g = check_gradients(&program, &[x], &[0]);
    assert!(values(&g[0]).iter().all(|&v| v == 0.0), "{g:?}");
}

/// The exact GELU, clamping and Python's floor remainder, composites of the primitives
/// above, away from their kinks and jumps.
#[test]
fn math_composites_match_finite_differences() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(260);
    let program = trace(|b| {
        let (x, a, d) = (
            param(b, "x", &[2, 3]),
            param(b, "a", &[2, 3]),
            param(b, "d", &[2, 3]),
        );
        let clamped = x.clamp_scalar(-1.0, 1.0) + x.clamp(&a.neg().abs().neg(), &a.abs());
        weighted_sum(&x.gelu_exact(), &mut rng)
            .add(&weighted_sum(&clamped, &mut rng))
            .add(&weighted_sum(&a.remainder(&d), &mut rng))
    });
    let (a, d) = away_from_multiples(&mut rng, &[2, 3]);
    // x at least 0.1 from the bounds +-1 and +-|a|.
    let x: Vec<f32> = values(&a)
        .iter()
        .map(|v| {
            loop {
                let x = rng.random_range(-3.0f32..3.0);
                if (x.abs() - 1.0).abs() > 0.1 && (x.abs() - v.abs()).abs() > 0.1 {
                    break x;
                }
            }
        })
        .collect();
    check_gradients(&program, &[f32s(&[2, 3], &x), a, d], &[0, 1, 2]);
}

#[test]
fn maximum_and_minimum_split_ties_in_halves() {
    for method in [Tensor::max as fn(&Tensor, &Tensor) -> Tensor, Tensor::min] {
        let program = trace(|b| method(&param(b, "a", &[3]), &param(b, "b", &[3])).sum(&[0]));
        let g = grad(&program, 0, &[0, 1]).unwrap();
        let a = f32s(&[3], &[1.0, 2.0, -1.0]);
        let b = f32s(&[3], &[1.0, 0.0, 4.0]);
        let outs = interpret(&g, &[a, b]).unwrap();
        // Central differences at a tie measure 1/2 for each side, as here.
        let (ga, gb) = if std::ptr::fn_addr_eq(method, Tensor::max as fn(&_, &_) -> _) {
            (vec![0.5, 1.0, 0.0], vec![0.5, 0.0, 1.0])
        } else {
            (vec![0.5, 0.0, 1.0], vec![0.5, 1.0, 0.0])
        };
        assert_eq!(values(&outs[1]), ga);
        assert_eq!(values(&outs[2]), gb);
    }
}

#[test]
fn power_gradients_are_zero_at_zero_base_and_exponent() {
    let program = trace(|b| param(b, "a", &[2]).pow(&param(b, "b", &[2])).sum(&[0]));
    let g = grad(&program, 0, &[0, 1]).unwrap();
    // a = 0, b = 0: 0^0 = 1 with both derivatives taken as 0 (JAX's convention);
    // a = 2, b = 3: d/da = 3 * 2^2 = 12, d/db = 8 ln 2.
    let outs = interpret(&g, &[f32s(&[2], &[0.0, 2.0]), f32s(&[2], &[0.0, 3.0])]).unwrap();
    let (ga, gb) = (values(&outs[1]), values(&outs[2]));
    assert_eq!(ga[0], 0.0);
    assert_eq!(gb[0], 0.0);
    assert!((ga[1] - 12.0).abs() < 1e-4, "{ga:?}");
    assert!((gb[1] - 8.0 * 2f32.ln()).abs() < 1e-4, "{gb:?}");
}

// ---- compare, select, logical, convert, constants ------------------------------------------

#[test]
fn select_sends_the_cotangent_to_the_chosen_branch() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(300);
    let program = trace(|b| {
        let (x, y) = (param(b, "x", &[2, 3]), param(b, "y", &[2, 3]));
        let (t, f) = (param(b, "t", &[2, 3]), param(b, "f", &[2, 3]));
        let zero = b.scalar(0.0);
        // A predicate through every comparison, not, or and and: no gradient reaches x
        // or y.
        let pred = x.gt(&y).not().or(&x.lt(&zero)).and(&y.lt(&b.scalar(5.0)));
        let pred = pred.or(&x.le(&y).and(&y.ge(&zero)).and(&x.ne(&zero)));
        let pred = pred.and(&x.eq(&x));
        weighted_sum(&pred.select(&t, &f), &mut rng)
    });
    let x = uniform_f32(&mut rng, &[2, 3], -2.0, 2.0);
    let y: Vec<f32> = values(&x)
        .iter()
        .map(|v| v + signed(&mut rng, 0.1, 1.0))
        .collect();
    let inputs = [
        x,
        f32s(&[2, 3], &y),
        uniform_f32(&mut rng, &[2, 3], -2.0, 2.0),
        uniform_f32(&mut rng, &[2, 3], -2.0, 2.0),
    ];
    let grads = check_gradients(&program, &inputs, &[0, 1, 2, 3]);
    assert!(values(&grads[0]).iter().all(|&v| v == 0.0));
    assert!(values(&grads[1]).iter().all(|&v| v == 0.0));
    // Each position's cotangent goes to exactly one branch.
    for (t, f) in values(&grads[2]).iter().zip(values(&grads[3])) {
        assert!(*t == 0.0 || f == 0.0, "both branches got a cotangent");
    }
}

#[test]
fn convert_passes_f32_and_blocks_integers_and_bools() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(400);
    let program = trace(|b| {
        let x = param(b, "x", &[2, 3]);
        let same = x.convert(DType::F32);
        let via_int = x.convert(DType::I32).convert(DType::F32);
        let via_bool = x.convert(DType::Bool).convert(DType::F32);
        weighted_sum(&same, &mut rng)
            .add(&weighted_sum(&via_int, &mut rng))
            .add(&weighted_sum(&via_bool, &mut rng))
    });
    // Away from integers (where truncation jumps) and from 0 (where `!= 0` does).
    let x = array(&mut rng, &[2, 3], |r| {
        (r.random_range(-3.0..3.0) as i32) as f32 + signed(r, 0.2, 0.8)
    });
    check_gradients(&program, &[x], &[0]);
}

#[test]
fn constants_and_iota_get_no_cotangent() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(500);
    let program = trace(|b| {
        let x = param(b, "x", &[2, 3]);
        let shifted = x
            .add(&b.iota(vec![2, 3], 1, DType::F32))
            .add(&b.scalar(0.5));
        weighted_sum(
            &shifted.mul(&b.constant(uniform_f32(&mut rng, &[2, 3], -1.0, 1.0))),
            &mut rng,
        )
    });
    let x = uniform_f32(&mut rng, &[2, 3], -1.0, 1.0);
    check_gradients(&program, &[x], &[0]);
}

// ---- shape ops ------------------------------------------------------------------------------

#[test]
fn broadcast_sums_over_broadcast_dims() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(600);
    let program = trace(|b| {
        let a = param(b, "a", &[3]).broadcast_in_dim(vec![2, 3, 4], &[1]);
        let c = param(b, "c", &[1, 4]).broadcast_in_dim(vec![3, 4], &[0, 1]);
        let s = param(b, "s", &[]).broadcast_in_dim(vec![2, 2], &[]);
        let d = param(b, "d", &[2, 1, 3]).broadcast_in_dim(vec![2, 5, 3], &[0, 1, 2]);
        let e = param(b, "e", &[1, 3]).broadcast_in_dim(vec![4, 2, 3], &[0, 2]);
        [a, c, s, d, e]
            .iter()
            .map(|t| weighted_sum(t, &mut rng))
            .reduce(|x, y| x.add(&y))
            .unwrap()
    });
    let shapes: [&[usize]; 5] = [&[3], &[1, 4], &[], &[2, 1, 3], &[1, 3]];
    let inputs: Vec<Literal> = shapes
        .iter()
        .map(|s| uniform_f32(&mut rng, s, -1.0, 1.0))
        .collect();
    check_gradients(&program, &inputs, &[0, 1, 2, 3, 4]);
}

#[test]
fn reshape_and_transpose_move_the_cotangent_back() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(700);
    let program = trace(|b| {
        let x = param(b, "x", &[2, 3, 4]);
        let r = x.reshape(vec![6, 4]);
        let t = x.transpose(&[2, 0, 1]);
        let rt = x.reshape(vec![4, 6]).transpose(&[1, 0]);
        weighted_sum(&r, &mut rng)
            .add(&weighted_sum(&t, &mut rng))
            .add(&weighted_sum(&rt, &mut rng))
    });
    let x = uniform_f32(&mut rng, &[2, 3, 4], -1.0, 1.0);
    check_gradients(&program, &[x], &[0]);
}

#[test]
fn reduce_rules_match_finite_differences() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(800);
    let program = trace(|b| {
        let x = param(b, "x", &[2, 3, 4]);
        [
            x.sum(&[0, 2]),
            x.sum(&[0, 1, 2]),
            x.max_over(&[1]),
            x.max_over(&[0, 2]),
            x.min_over(&[0]),
            x.min_over(&[0, 1, 2]),
        ]
        .iter()
        .map(|t| weighted_sum(t, &mut rng))
        .reduce(|p, q| p.add(&q))
        .unwrap()
    });
    // Distinct values a clear distance apart: no ties within eps.
    let mut perm: Vec<f32> = (0..24).map(|i| i as f32 * 0.1).collect();
    perm.shuffle(&mut rng);
    check_gradients(&program, &[f32s(&[2, 3, 4], &perm)], &[0]);
}

#[test]
fn reduce_max_and_min_share_the_cotangent_among_ties() {
    let program = trace(|b| {
        let x = param(b, "x", &[2, 4]);
        let w = b.constant(f32s(&[2], &[1.0, 10.0]));
        x.max_over(&[1]).mul(&w).sum(&[0]).add(&x.min_over(&[0, 1]))
    });
    let g = grad(&program, 0, &[0]).unwrap();
    let x = f32s(&[2, 4], &[1.0, 3.0, 3.0, 2.0, 5.0, 5.0, 5.0, 0.0]);
    let outs = interpret(&g, &[x]).unwrap();
    // Row 0's max 3 appears twice (1/2 each), row 1's max 5 three times (10/3 each);
    // the overall min 0 once.
    let third = 10.0 / 3.0;
    let expected = [0.0, 0.5, 0.5, 0.0, third, third, third, 1.0];
    for (got, want) in values(&outs[1]).iter().zip(expected) {
        assert!((got - want).abs() < 1e-6, "{:?}", values(&outs[1]));
    }
}

/// Distinct values `0.1` apart in random order, centred on 0: no ties within `eps`.
fn distinct(rng: &mut Xoshiro256PlusPlus, shape: &[usize]) -> Literal {
    let n: usize = shape.iter().product();
    let mut v: Vec<f32> = (0..n).map(|i| (i as f32 - n as f32 / 2.0) * 0.1).collect();
    v.shuffle(rng);
    f32s(shape, &v)
}

#[test]
fn reduce_window_rules_match_finite_differences() {
    let one = || WindowDim::new(1, 1, (0, 0));
    let cases: Vec<(Vec<usize>, Vec<WindowDim>)> = vec![
        // strides = window, uneven: the last window is cut by padding.
        (vec![7], vec![WindowDim::new(2, 2, (0, 1))]),
        // overlapping windows, padding both sides.
        (vec![6], vec![WindowDim::new(3, 1, (1, 1))]),
        (
            vec![5, 6],
            vec![WindowDim::new(2, 1, (1, 0)), WindowDim::new(3, 2, (1, 2))],
        ),
        // NHWC pooling: 2x2 stride 2 and 3x3 stride 2 SAME-like.
        (
            vec![2, 4, 5, 2],
            vec![
                one(),
                WindowDim::new(2, 2, (0, 0)),
                WindowDim::new(2, 2, (0, 1)),
                one(),
            ],
        ),
        (
            vec![1, 5, 4, 2],
            vec![
                one(),
                WindowDim::new(3, 2, (1, 1)),
                WindowDim::new(3, 2, (1, 1)),
                one(),
            ],
        ),
        // dilated windows with a stride that skips elements.
        (
            vec![9, 4],
            vec![
                WindowDim::new(2, 3, (0, 1)).with_window_dilation(3),
                WindowDim::new(2, 1, (1, 0)).with_window_dilation(2),
            ],
        ),
        // base dilation (XLA's base_dilations), with padding and strides; every
        // window sees an element (a max of holes only would be -inf).
        (
            vec![4, 5],
            vec![
                WindowDim::new(3, 2, (1, 2)).with_base_dilation(2),
                WindowDim::new(3, 1, (0, 1)).with_base_dilation(3),
            ],
        ),
    ];
    for (i, (shape, window)) in cases.into_iter().enumerate() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1300 + i as u64);
        let program = trace(|b| {
            let x = param(b, "x", &shape);
            [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min]
                .map(|kind| weighted_sum(&x.reduce_window_with(kind, &window), &mut rng))
                .iter()
                .cloned()
                .reduce(|p, q| p.add(&q))
                .unwrap()
        });
        let x = distinct(&mut rng, &shape);
        check_gradients(&program, &[x], &[0]);
    }
}

#[test]
fn pooling_and_upsampling_match_finite_differences() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1400);
    let program = trace(|b| {
        let x = param(b, "x", &[1, 5, 5, 2]);
        let (win, strides) = ([1, 2, 2, 1], [1, 2, 2, 1]);
        let m = x.max_pool(&win, &strides, Padding::Same);
        let a = x.avg_pool(&[1, 3, 3, 1], &[1, 2, 2, 1], Padding::Same, false);
        let v = x.avg_pool(&win, &[1, 1, 1, 1], Padding::Valid, true);
        let u = m.upsample_nearest(&[1, 2, 3, 1]);
        [m, a, v, u]
            .iter()
            .map(|t| weighted_sum(t, &mut rng))
            .reduce(|p, q| p.add(&q))
            .unwrap()
    });
    let x = distinct(&mut rng, &[1, 5, 5, 2]);
    check_gradients(&program, &[x], &[0]);
}

#[test]
fn reduce_window_max_and_min_route_a_tie_to_the_first_element_only() {
    let program = trace(|b| {
        let x = param(b, "x", &[5]);
        let w = b.constant(f32s(&[3], &[1.0, 10.0, 100.0]));
        let m = x.reduce_window(ReduceKind::Max, &[3], &[1], &[(0, 0)]);
        // Windows [0,5], [5,5], [5,1], [1,0] of -x, padded by 1: minima at the first 5.
        let n = x
            .neg()
            .reduce_window(ReduceKind::Min, &[2], &[1], &[(1, 0)]);
        let v = b.constant(f32s(&[5], &[1e3, 1e4, 1e5, 1e6, 1e7]));
        m.mul(&w).sum(&[0]).add(&n.mul(&v).sum(&[0]))
    });
    let g = grad(&program, 0, &[0]).unwrap();
    let x = f32s(&[5], &[2.0, 5.0, 5.0, 1.0, 5.0]);
    let outs = interpret(&g, &[x]).unwrap();
    // Max windows [2,5,5] [5,5,1] [5,1,5] take elements 1, 1, 2. Min windows of -x:
    // [pad,-2] [-2,-5] [-5,-5] [-5,-1] [-1,-5] take elements 0, 1, 1, 2, 4 (negated).
    let expected = [-1e3, 11.0 - 1e4 - 1e5, 100.0 - 1e6, 0.0, -1e7];
    assert_eq!(values(&outs[1]), expected);
    // A 2x2 window of equal values: its cotangent goes to the first, once.
    let program = trace(|b| {
        let x = param(b, "x", &[2, 3]);
        x.reduce_window(ReduceKind::Max, &[2, 2], &[1, 1], &[(0, 0), (0, 0)])
            .sum(&[0, 1])
    });
    let g = grad(&program, 0, &[0]).unwrap();
    let outs = interpret(&g, &[f32s(&[2, 3], &[7.0; 6])]).unwrap();
    assert_eq!(values(&outs[1]), [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
}

#[test]
fn dot_general_rules_match_finite_differences() {
    let dims = |lb: &[usize], rb: &[usize], lc: &[usize], rc: &[usize]| DotDims {
        lhs_batch: lb.to_vec(),
        rhs_batch: rb.to_vec(),
        lhs_contracting: lc.to_vec(),
        rhs_contracting: rc.to_vec(),
    };
    type Case = (&'static [usize], &'static [usize], DotDims);
    let cases: [Case; 6] = [
        // plain matrix product
        (&[2, 3], &[3, 4], dims(&[], &[], &[1], &[0])),
        // batch dims not leading
        (&[3, 2, 4], &[4, 5, 2], dims(&[1], &[2], &[2], &[0])),
        // two contracting dims, paired out of order
        (&[3, 2, 4], &[4, 3, 5], dims(&[], &[], &[2, 0], &[0, 1])),
        (&[3, 2, 4], &[4, 3, 5], dims(&[], &[], &[0, 2], &[1, 0])),
        // outer product
        (&[2], &[3], dims(&[], &[], &[], &[])),
        // batch and two contracting dims
        (
            &[2, 3, 4],
            &[2, 4, 3, 5],
            dims(&[0], &[0], &[1, 2], &[2, 1]),
        ),
    ];
    for (i, (ls, rs, dd)) in cases.into_iter().enumerate() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(900 + i as u64);
        let program = trace(|b| {
            let out = param(b, "lhs", ls).dot_general(&param(b, "rhs", rs), dd.clone());
            weighted_sum(&out, &mut rng)
        });
        let inputs = [
            uniform_f32(&mut rng, ls, -1.0, 1.0),
            uniform_f32(&mut rng, rs, -1.0, 1.0),
        ];
        println!("{dd:?}");
        check_gradients(&program, &inputs, &[0, 1]);
    }
}

#[test]
fn slice_pads_the_cotangent_with_zeros() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1000);
    let program = trace(|b| {
        let x = param(b, "x", &[5, 7]);
        let strided = x.slice(&[1, 2], &[5, 7], &[2, 3]);
        let plain = x.slice(&[0, 3], &[4, 4], &[1, 1]);
        weighted_sum(&strided, &mut rng).add(&weighted_sum(&plain, &mut rng))
    });
    let x = uniform_f32(&mut rng, &[5, 7], -1.0, 1.0);
    check_gradients(&program, &[x], &[0]);
}

#[test]
fn pad_slices_the_cotangent_and_sums_the_padding() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1100);
    let program = trace(|b| {
        let (x, v) = (param(b, "x", &[3, 4]), param(b, "v", &[]));
        // Negative edges cut operand elements off; interior padding interleaves.
        let cut = x.pad(&v, &[1, -1], &[-1, 2], &[1, 0]);
        let grown = x.pad(&v, &[0, 2], &[1, 0], &[2, 1]);
        weighted_sum(&cut, &mut rng).add(&weighted_sum(&grown, &mut rng))
    });
    let inputs = [
        uniform_f32(&mut rng, &[3, 4], -1.0, 1.0),
        uniform_f32(&mut rng, &[], -1.0, 1.0),
    ];
    check_gradients(&program, &inputs, &[0, 1]);
}

#[test]
fn concatenate_slices_the_cotangent() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1200);
    let program = trace(|b| {
        let parts = [
            param(b, "a", &[2, 1]),
            param(b, "b", &[2, 3]),
            param(b, "c", &[2, 2]),
        ];
        let refs: Vec<&Tensor> = parts.iter().collect();
        weighted_sum(&b.concatenate(&refs, 1), &mut rng)
    });
    let inputs: Vec<Literal> = [[2, 1], [2, 3], [2, 2]]
        .iter()
        .map(|s| uniform_f32(&mut rng, s, -1.0, 1.0))
        .collect();
    check_gradients(&program, &inputs, &[0, 1, 2]);
}

#[test]
fn roll_rotates_the_cotangent_back() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1300);
    let program = trace(|b| {
        let x = param(b, "x", &[4, 5]);
        let rolled = x.roll(2, 1).roll(-1, 0);
        weighted_sum(&rolled, &mut rng)
    });
    let x = uniform_f32(&mut rng, &[4, 5], -1.0, 1.0);
    check_gradients(&program, &[x], &[0]);
}

#[test]
fn convolution_rules_match_finite_differences() {
    // 1-D, 2-D, 3-D; strides, positive and negative padding, lhs and rhs dilation,
    // feature groups and depthwise (see `conv_cases`).
    for (i, case) in conv_cases::cases().iter().enumerate() {
        println!("{}", case.name);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1300 + i as u64);
        let program = trace(|b| {
            let (_, _, y) = case.trace(b, DType::F32);
            weighted_sum(&y, &mut rng)
        });
        let inputs = [
            uniform_f32(&mut rng, case.input, -1.0, 1.0),
            uniform_f32(&mut rng, case.kernel, -1.0, 1.0),
        ];
        check_gradients(&program, &inputs, &[0, 1]);
    }
}

#[test]
fn reverse_reverses_the_cotangent() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1400);
    let program = trace(|b| {
        let x = param(b, "x", &[3, 4, 2]);
        weighted_sum(&x.reverse(&[0, 2]), &mut rng)
    });
    let x = uniform_f32(&mut rng, &[3, 4, 2], -1.0, 1.0);
    check_gradients(&program, &[x], &[0]);
}

fn start(b: &Builder, v: i32) -> Tensor {
    b.constant(i32s(&[], &[v]))
}

#[test]
fn dynamic_slice_writes_the_cotangent_into_zeros() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1500);
    let program = trace(|b| {
        let x = param(b, "x", &[4, 5]);
        let inside = x.dynamic_slice(&[&start(b, 1), &start(b, 2)], &[2, 3]);
        // Clamped to (2, 0); dim 1 whole.
        let clamped = x.dynamic_slice(&[&start(b, 9), &start(b, -4)], &[2, 5]);
        weighted_sum(&inside, &mut rng).add(&weighted_sum(&clamped, &mut rng))
    });
    let x = uniform_f32(&mut rng, &[4, 5], -1.0, 1.0);
    check_gradients(&program, &[x], &[0]);
}

#[test]
fn dynamic_update_slice_splits_the_cotangent_at_the_window() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1600);
    let program = trace(|b| {
        let (x, u) = (param(b, "x", &[4, 5]), param(b, "u", &[2, 2]));
        let once = x.dynamic_update_slice(&u, &[&start(b, 1), &start(b, 7)]);
        let twice = once.dynamic_update_slice(&u.mul(&u), &[&start(b, -1), &start(b, 3)]);
        weighted_sum(&twice, &mut rng)
    });
    let inputs = [
        uniform_f32(&mut rng, &[4, 5], -1.0, 1.0),
        uniform_f32(&mut rng, &[2, 2], -1.0, 1.0),
    ];
    check_gradients(&program, &inputs, &[0, 1]);
}

#[test]
fn cumsum_gradient_is_the_reversed_cumsum() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1700);
    let program = trace(|b| {
        let x = param(b, "x", &[3, 5]);
        let forward = x.cumsum(1);
        let backward = x.cumulative(gspmd_core::ir::CumulativeKind::Sum, 0, true);
        weighted_sum(&forward, &mut rng).add(&weighted_sum(&backward, &mut rng))
    });
    let x = uniform_f32(&mut rng, &[3, 5], -1.0, 1.0);
    check_gradients(&program, &[x], &[0]);
}

/// The cumprod rule divides by nothing: exact with zeros in `x`, one or two per lane.
#[test]
fn cumprod_gradient_is_exact_with_zeros() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1800);
    let program = trace(|b| {
        let x = param(b, "x", &[3, 5]);
        let forward = x.cumprod(1);
        let backward = x.cumulative(gspmd_core::ir::CumulativeKind::Prod, 1, true);
        let columns = x.cumprod(0);
        weighted_sum(&forward, &mut rng)
            .add(&weighted_sum(&backward, &mut rng))
            .add(&weighted_sum(&columns, &mut rng))
    });
    let mut x = values(&uniform_f32(&mut rng, &[3, 5], 0.5, 1.5));
    for (i, v) in x.iter_mut().enumerate() {
        if rng.random_bool(0.5) {
            *v = -*v;
        }
        // Row 0 has one zero, row 1 two, row 2 none.
        if [2, 6, 8].contains(&i) {
            *v = 0.0;
        }
    }
    let grads = check_gradients(&program, &[f32s(&[3, 5], &x)], &[0]);
    assert!(values(&grads[0]).iter().all(|g| g.is_finite()));
}

/// Sorted values and the top k are gathers of the input: each picked element gets the
/// cotangent of its place.
#[test]
fn sort_and_top_k_values_pass_the_gradient_to_the_picked_elements() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1950);
    let program = trace(|b| {
        let x = param(b, "x", &[3, 4]);
        let (sorted, _) = x.sort(1, false);
        let (top, _) = x.top_k(2, 0);
        weighted_sum(&sorted, &mut rng).add(&weighted_sum(&top, &mut rng))
    });
    // Distinct values, at least 0.1 apart: the order does not change within `EPS`.
    let mut grid: Vec<f32> = (0..12).map(|v| v as f32 / 10.0 - 0.55).collect();
    grid.shuffle(&mut rng);
    let grads = check_gradients(&program, &[f32s(&[3, 4], &grid)], &[0]);
    // Column-wise, the smallest of three elements is not in the top 2: only the sort
    // reaches it.
    assert!(values(&grads[0]).iter().all(|g| *g != 0.0));
}

/// `argsort`, `argmax` and `argmin` have integer results: no gradient flows through
/// them, but one flows around them (here through values they select).
#[test]
fn sorting_indices_pass_no_gradient() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1900);
    let program = trace(|b| {
        let x = param(b, "x", &[3, 4]);
        let order = x.argsort(1, true).convert(DType::F32);
        let first = x
            .argmax(1)
            .convert(DType::F32)
            .add(&x.argmin(1).convert(DType::F32));
        let picked = x.mul(&order).sum(&[1]).mul(&first);
        weighted_sum(&picked, &mut rng)
    });
    // Distinct values, at least 0.1 apart: the order does not change within `EPS`.
    let mut grid: Vec<f32> = (0..12).map(|v| v as f32 / 10.0 - 0.55).collect();
    grid.shuffle(&mut rng);
    check_gradients(&program, &[f32s(&[3, 4], &grid)], &[0]);
}

#[test]
fn gather_adds_the_cotangent_back_at_the_clamped_starts() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1500);
    // Repeated, negative and too large ids; slices of two rows with an index vector.
    let dims = GatherDims {
        offset_dims: vec![1, 2],
        start_index_map: vec![0, 1],
        index_vector_dim: 1,
        slice_sizes: vec![2, 2],
        ..GatherDims::default()
    };
    let program = trace(|b| {
        let table = param(b, "table", &[5, 3]);
        let ids = b.parameter("ids", [2, 3], DType::I32);
        let starts = b.parameter("starts", [3, 2], DType::I32);
        let rows = weighted_sum(&table.embedding(&ids), &mut rng);
        rows.add(&weighted_sum(&table.gather(&starts, &dims), &mut rng))
    });
    let table = uniform_f32(&mut rng, &[5, 3], -1.0, 1.0);
    let ids = i32s(&[2, 3], &[1, 4, 1, -2, 7, 0]);
    let starts = i32s(&[3, 2], &[0, 1, 4, 2, -1, 0]);
    check_gradients(&program, &[table, ids, starts], &[0]);
}

#[test]
fn scatter_add_passes_the_cotangent_and_gathers_it_for_the_updates() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1501);
    let program = trace(|b| {
        let x = param(b, "x", &[4, 3]);
        let index = b.parameter("index", [5], DType::I32);
        let source = param(b, "source", &[5, 3]);
        weighted_sum(&x.index_add(0, &index, &source), &mut rng)
    });
    let x = uniform_f32(&mut rng, &[4, 3], -1.0, 1.0);
    let source = uniform_f32(&mut rng, &[5, 3], -1.0, 1.0);
    // Row 9 and -1 are skipped: their updates get no gradient.
    let index = i32s(&[5], &[2, 9, 2, -1, 0]);
    let grads = check_gradients(&program, &[x, index, source], &[0, 2]);
    let updates = grads[1].as_f32().unwrap().as_slice().unwrap();
    assert!(
        updates[3..6]
            .iter()
            .chain(&updates[9..12])
            .all(|&v| v == 0.0)
    );
}

#[test]
fn scatter_replace_zeroes_the_written_positions_of_the_operand_cotangent() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1502);
    let dims = ScatterDims::along(0, 2);
    let program = trace(|b| {
        let x = param(b, "x", &[5, 2]);
        let index = b.parameter("index", [3], DType::I32);
        let updates = param(b, "updates", &[3, 2]);
        weighted_sum(&x.scatter(&index, &updates, &dims), &mut rng)
    });
    let x = uniform_f32(&mut rng, &[5, 2], -1.0, 1.0);
    let updates = uniform_f32(&mut rng, &[3, 2], -1.0, 1.0);
    // Distinct rows; 5 is out of range.
    let index = i32s(&[3], &[3, 5, 0]);
    check_gradients(&program, &[x, index, updates], &[0, 2]);
}

// ---- shardings --------------------------------------------------------------------------------

fn spec(dims: &[&[&str]]) -> Sharding {
    Sharding::new(
        dims.iter()
            .map(|axes| DimSharding::closed(axes.iter().copied())),
    )
}

#[test]
fn a_constrained_value_has_a_cotangent_with_the_same_constraint() {
    let s = spec(&[&["data"], &[]]);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1300);
    let program = trace(|b| {
        let h = param(b, "x", &[4, 2]).tanh().shard(s.clone());
        weighted_sum(&h.mul(&h), &mut rng)
    });
    check_gradients(&program, &[uniform_f32(&mut rng, &[4, 2], -1.0, 1.0)], &[0]);
    let g = grad(&program, 0, &[0]).unwrap();
    let n = program.nodes.len();
    let constrained: Vec<&Node> = g.nodes[n..]
        .iter()
        .filter(|node| node.op == Op::ShardingConstraint)
        .collect();
    assert_eq!(constrained.len(), 1, "{g}");
    assert_eq!(constrained[0].annotation.as_ref(), Some(&s));
}

/// A propagation barrier is an identity: its cotangent passes through a barrier of the
/// mirrored direction (the backward pass crosses it from the result's side).
#[test]
fn a_barrier_passes_the_cotangent_through_the_mirrored_barrier() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1301);
    for (forward, backward) in [
        (
            PropagationDirection::Forward,
            PropagationDirection::Backward,
        ),
        (
            PropagationDirection::Backward,
            PropagationDirection::Forward,
        ),
        (PropagationDirection::None, PropagationDirection::None),
    ] {
        let program = trace(|b| {
            let h = param(b, "x", &[4, 2]).tanh().propagation_barrier(forward);
            weighted_sum(&h.mul(&h), &mut rng)
        });
        check_gradients(&program, &[uniform_f32(&mut rng, &[4, 2], -1.0, 1.0)], &[0]);
        let g = grad(&program, 0, &[0]).unwrap();
        let n = program.nodes.len();
        let barriers: Vec<&Op> = (g.nodes[n..].iter())
            .map(|node| &node.op)
            .filter(|op| op.kind() == OpKind::PropagationBarrier)
            .collect();
        assert_eq!(barriers, [&Op::PropagationBarrier(backward)], "{g}");
    }
}

#[test]
fn an_annotated_weight_gets_a_gradient_with_its_annotation() {
    let (sx, sw) = (spec(&[&["data"], &[]]), spec(&[&[], &["model"]]));
    let program = trace(|b| {
        let x = param(b, "x", &[4, 3]).annotate(sx.clone());
        let w = param(b, "w", &[3, 2]).annotate(sw.clone());
        let bias = param(b, "bias", &[2]);
        x.matmul(&w).add(&bias).sum(&[0, 1])
    });
    let g = grad(&program, 0, &[1, 2]).unwrap();
    check_structure(&program, &g, &[1, 2]);
    let (gw, gb) = (g.node(g.outputs[1]), g.node(g.outputs[2]));
    assert_eq!(gw.op, Op::ShardingConstraint);
    assert_eq!(gw.annotation.as_ref(), Some(&sw));
    assert_eq!(gw.name.as_deref(), Some("grad(w)"));
    assert_eq!(
        gb.annotation, None,
        "an unannotated parameter's gradient is free"
    );
    assert_eq!(gb.name.as_deref(), Some("grad(bias)"));
    // d sum(x w + bias) / dw = column sums of x, for every column of w.
    let x = f32s(
        &[4, 3],
        &[1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12.],
    );
    let w = f32s(&[3, 2], &[0.0; 6]);
    let outs = interpret(&g, &[x, w, f32s(&[2], &[0.0, 0.0])]).unwrap();
    assert_eq!(values(&outs[1]), vec![22., 22., 26., 26., 30., 30.]);
    assert_eq!(values(&outs[2]), vec![4., 4.]);
}

// ---- reachability --------------------------------------------------------------------------------

#[test]
fn a_parameter_not_reaching_the_loss_gets_zeros_and_dead_values_no_cotangent() {
    let b = Builder::new("two");
    let (a, unused) = (param(&b, "a", &[2]), param(&b, "unused", &[3, 2]));
    let other = unused.exp().sum(&[0, 1]); // a second output, not on the loss path
    let loss = a.mul(&a).sum(&[0]);
    let program = b.finish(&[&other, &loss]).unwrap();
    let g = grad(&program, 1, &[0, 1]).unwrap();
    verify(&g).unwrap();
    // Only the loss path is differentiated: seed, broadcast, two products, their sum.
    let backward: Vec<&str> = g.nodes[program.nodes.len()..]
        .iter()
        .map(|n| n.op.name())
        .collect();
    assert!(!backward.contains(&"exponential"), "{g}");
    let outs = interpret(&g, &[f32s(&[2], &[3.0, -1.0]), f32s(&[3, 2], &[1.0; 6])]).unwrap();
    assert_eq!(outs.len(), 4);
    assert_eq!(values(&outs[2]), vec![6.0, -2.0]);
    assert_eq!(outs[3], f32s(&[3, 2], &[0.0; 6]));
    assert_eq!(g.node(g.outputs[3]).name.as_deref(), Some("grad(unused)"));
}

// ---- composites -------------------------------------------------------------------------------

#[test]
fn matmul_and_einsum() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1400);
    let program = trace(|b| {
        let (x, w) = (param(b, "x", &[2, 3, 4]), param(b, "w", &[4, 5]));
        let y = param(b, "y", &[2, 4, 3]);
        let batched = x.matmul(&y); // [2, 3, 3]
        let e = einsum("bsd,df->bfs", &x, &w); // [2, 5, 3]
        let r = einsum("bsd,df->f", &x, &w); // b and s summed first
        weighted_sum(&x.matmul(&w), &mut rng)
            .add(&weighted_sum(&batched, &mut rng))
            .add(&weighted_sum(&e, &mut rng))
            .add(&weighted_sum(&r, &mut rng))
    });
    let inputs = [
        uniform_f32(&mut rng, &[2, 3, 4], -1.0, 1.0),
        uniform_f32(&mut rng, &[4, 5], -1.0, 1.0),
        uniform_f32(&mut rng, &[2, 4, 3], -1.0, 1.0),
    ];
    check_gradients(&program, &inputs, &[0, 1, 2]);
}

#[test]
fn softmax_log_softmax_layer_norm_gelu_relu_mean() {
    type Method = fn(&Tensor) -> Tensor;
    let cases: [(&str, Method); 6] = [
        ("softmax", |t| t.softmax(-1)),
        ("log_softmax", |t| t.log_softmax(0)),
        ("layer_norm", |t| t.layer_norm(-1, 1e-5)),
        ("gelu", Tensor::gelu),
        ("relu", Tensor::relu),
        ("mean", |t| t.mean(&[1])),
    ];
    for (i, (name, method)) in cases.into_iter().enumerate() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1500 + i as u64);
        let program = trace(|b| weighted_sum(&method(&param(b, "x", &[3, 4])), &mut rng));
        // Away from relu's kink; distinct enough for the max inside softmax.
        let x = array(&mut rng, &[3, 4], |r| signed(r, 0.1, 2.0));
        println!("{name}");
        check_gradients(&program, &[x], &[0]);
    }
}

#[test]
fn two_layer_mlp_with_mse_loss() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1600);
    let target = uniform_f32(&mut rng, &[4, 2], -1.0, 1.0);
    let program = trace(|b| {
        let x = param(b, "x", &[4, 3]);
        let (w1, b1) = (param(b, "w1", &[3, 5]), param(b, "b1", &[5]));
        let w2 = param(b, "w2", &[5, 2]);
        let h = x.matmul(&w1).add(&b1).relu();
        h.matmul(&w2).mse(&b.constant(target.clone()))
    });
    let inputs = [
        uniform_f32(&mut rng, &[4, 3], -1.0, 1.0),
        uniform_f32(&mut rng, &[3, 5], -1.0, 1.0),
        uniform_f32(&mut rng, &[5], -0.5, 0.5),
        uniform_f32(&mut rng, &[5, 2], -1.0, 1.0),
    ];
    check_gradients(&program, &inputs, &[0, 1, 2, 3]);
}

/// `softmax` of each row, in f64.
fn softmax_rows(logits: &[f32], classes: usize) -> Vec<f64> {
    logits
        .chunks(classes)
        .flat_map(|row| {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / s)
        })
        .collect()
}

#[test]
fn cross_entropy_gradient_is_softmax_minus_one_hot() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1700);
    let program = trace(|b| {
        let logits = param(b, "logits", &[3, 4]);
        let labels = b.parameter("labels", vec![3], DType::I32);
        logits.cross_entropy_with_logits(&labels)
    });
    let logits = uniform_f32(&mut rng, &[3, 4], -2.0, 2.0);
    let labels = [2, 0, 3];
    let inputs = [logits.clone(), i32s(&[3], &labels)];
    let grads = check_gradients(&program, &inputs, &[0]);
    // Closed form: (softmax(logits) - one_hot(labels)) / rows.
    let p = softmax_rows(&values(&logits), 4);
    for (k, (&g, p)) in values(&grads[0]).iter().zip(p).enumerate() {
        let one_hot = if labels[k / 4] == (k % 4) as i32 {
            1.0
        } else {
            0.0
        };
        let want = (p - one_hot) / 3.0;
        assert!((g as f64 - want).abs() < 1e-5, "element {k}: {g} vs {want}");
    }
}

#[test]
fn cross_entropy_of_an_mlp_built_from_primitives() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1800);
    let program = trace(|b| {
        let x = param(b, "x", &[4, 3]);
        let w = param(b, "w", &[3, 5]);
        let labels = b.parameter("labels", vec![4], DType::I32);
        let logits = x.matmul(&w).tanh();
        // One-hot by hand: iota == label, converted.
        let classes = b.iota(vec![4, 5], 1, DType::I32);
        let one_hot = classes
            .eq(&labels.broadcast_in_dim(vec![4, 5], &[0]))
            .convert(DType::F32);
        logits
            .log_softmax(-1)
            .mul(&one_hot)
            .sum(&[1])
            .mean(&[0])
            .neg()
    });
    let inputs = [
        uniform_f32(&mut rng, &[4, 3], -1.0, 1.0),
        uniform_f32(&mut rng, &[3, 5], -1.0, 1.0),
        i32s(&[4], &[4, 0, 2, 2]),
    ];
    check_gradients(&program, &inputs, &[0, 1]);
}

// ---- errors -------------------------------------------------------------------------------------

fn is_request(r: Result<Program, Error>, needle: &str) {
    match r {
        Err(Error::GradRequest { problem, .. }) => {
            let message = problem.to_string();
            assert!(message.contains(needle), "{message:?} lacks {needle:?}")
        }
        other => panic!("expected a GradRequest error, got {other:?}"),
    }
}

#[test]
fn bad_requests_are_errors() {
    let b = Builder::new("p");
    let x = param(&b, "x", &[2, 3]);
    let n = b.parameter("n", vec![], DType::I32);
    let program = b.finish(&[&x.exp(), &x.sum(&[0, 1]), &n]).unwrap();
    is_request(grad(&program, 0, &[0]), "f32[2,3], not a float scalar");
    is_request(grad(&program, 2, &[0]), "i32[], not a float scalar");
    is_request(grad(&program, 3, &[0]), "loss output 3 is out of range");
    is_request(grad(&program, 1, &[2]), "parameter 2 is out of range");
    is_request(grad(&program, 1, &[1]), "parameter 1 (n) is i32");
    let shown = grad(&program, 0, &[0]).unwrap_err().to_string();
    assert!(shown.starts_with("grad of program `p`"), "{shown}");
}

/// Every op that is not `is_differentiable` (the SPMD-only ones) makes `grad` fail
/// with `NotDifferentiable` at the op's node and location, on the path to the loss or
/// not (axis_index has no operands, so it never is).
#[test]
fn spmd_ops_are_not_differentiable() {
    let location = Location {
        file: "model.rs",
        line: 7,
        column: 1,
    };
    let node = |op: Op, operands: Vec<ValueId>, shape: Vec<usize>, dtype: DType| Node {
        op,
        operands,
        ty: gspmd_core::ir::TensorType::new(shape, dtype),
        annotation: None,
        sharding: None,
        origin: None,
        name: None,
        location,
        why: Vec::new(),
    };
    let group = AxisGroup {
        axes: vec!["data".into()],
        size: 2,
    };
    let kind = ReduceKind::Sum;
    // Each op on `x: f32[4]`, with its result shape.
    let ops = [
        (Op::AxisIndex(group.clone()), vec![]),
        (
            Op::AllReduce {
                group: group.clone(),
                kind,
            },
            vec![4],
        ),
        (
            Op::AllGather {
                group: group.clone(),
                dim: 0,
            },
            vec![8],
        ),
        (
            Op::ReduceScatter {
                group: group.clone(),
                kind,
                dim: 0,
            },
            vec![2],
        ),
        (
            Op::AllToAll {
                group: group.clone(),
                split_dim: 0,
                concat_dim: 0,
            },
            vec![4],
        ),
        (
            Op::CollectivePermute {
                group: group.clone(),
                from: group.axes.clone(),
            },
            vec![4],
        ),
        (
            Op::CollectiveShift {
                group: group.clone(),
                offset: 1,
                wrap: false,
                mirror: false,
            },
            vec![4],
        ),
    ];
    for (op, shape) in ops {
        let b = Builder::new("spmd");
        let x = param(&b, "x", &[4]);
        let mut program = b.finish(&[&x]).unwrap();
        let x = program.params[0];
        let (operands, dtype) = match op {
            Op::AxisIndex(_) => (vec![], DType::I32),
            _ => (vec![x], DType::F32),
        };
        let name = op.name();
        let op_kind = op.kind();
        let rank = shape.len();
        let spmd = program.push(node(op, operands, shape, dtype));
        let summed = if dtype == DType::F32 { spmd } else { x };
        let sum = Op::Reduce {
            kind,
            dims: (0..rank.max(1)).collect(),
        };
        let loss = program.push(node(sum, vec![summed], vec![], DType::F32));
        program.outputs = vec![loss];
        match grad(&program, 0, &[0]) {
            Err(e @ Error::NotDifferentiable { .. }) => {
                let shown = e.to_string();
                let at = format!("model.rs:7: {spmd} = {name}");
                assert!(shown.contains(&at), "{shown}");
                assert!(shown.contains("global program"), "{shown}");
            }
            other => panic!("{name}: expected NotDifferentiable, got {other:?}"),
        }
        op_coverage::record_kinds("not_differentiable", [op_kind]);
    }
}

/// A `shard_map` body through every collective (psum, all_gather, psum_scatter,
/// all_to_all, ppermute, axis_index), with a block-split and a replicated operand and a
/// replicated and a block-split result: the transposes and the boundary's scaling give
/// the gradients of the region's single-device meaning.
#[test]
fn shard_map_matches_finite_differences() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(41);
    let mesh = gspmd_core::sharding::Mesh::new([("data", 2), ("model", 2)]).unwrap();
    let spec = |t: &str| -> Sharding { t.parse().unwrap() };
    let program = trace(|b| {
        let x = param(b, "x", &[4, 4]);
        let w = param(b, "w", &[4, 4]);
        let ys = b.shard_map(
            &mesh,
            &["model"],
            &[x, w],
            &[spec("(model, _)"), spec("(_, _)")],
            &[spec("(_, _)"), spec("(_, model)")],
            |b, blocks| {
                let h = blocks[0].matmul(&blocks[1]).tanh();
                let g = h.all_gather(&["model"], 0).sin();
                let s = g.psum_scatter(&["model"], 0);
                let t = s.all_to_all(&["model"], 1, 0);
                let index = b.axis_index(&["model"]).convert(DType::F32);
                let u = t.ppermute(&["model"], 1).mul(&(index + 1.0));
                vec![u.psum(&["model"]), u.mul(&t)]
            },
        );
        weighted_sum(&ys[0], &mut rng).add(&weighted_sum(&ys[1], &mut rng))
    });
    let x = array(&mut rng, &[4, 4], |r| r.random_range(-1.0..1.0));
    let w = array(&mut rng, &[4, 4], |r| r.random_range(-1.0..1.0));
    check_gradients(&program, &[x, w], &[0, 1]);
}

/// `while_loop` has a run-time trip count: `grad` of a loss reached through one is
/// [`Error::NotDifferentiable`] at the line that traced it, naming the alternatives.
#[test]
fn while_loop_is_not_differentiable() {
    let b = Builder::new("while");
    let x = param(&b, "x", &[4]);
    let r = b.while_loop(
        |s| s[0].sum(&[0]).lt(&s[0].builder().scalar(10.0)),
        |s| vec![s[0].mul(&s[0].builder().scalar(2.0))],
        &[x.abs().add(&b.scalar(1.0))],
    );
    let program = b.finish(&[&r[0]]).unwrap();
    let flow = program.node(r[0].id().unwrap()).op.kind();
    match grad(&program, 0, &[0]) {
        Err(e @ Error::NotDifferentiable { .. }) => {
            let shown = e.to_string();
            assert!(shown.contains("= while"), "{shown}");
            assert!(shown.contains("fori_loop or scan"), "{shown}");
            assert!(shown.contains("tests/autodiff.rs:"), "{shown}");
        }
        other => panic!("expected NotDifferentiable, got {other:?}"),
    }
    op_coverage::record_kinds("not_differentiable", [flow]);
}

/// A `while_loop` inside a scan body is found when the sweep reaches the scan.
#[test]
fn while_loop_inside_a_scan_is_not_differentiable() {
    let b = Builder::new("nested_while");
    let x = param(&b, "x", &[3, 2]);
    let (carry, _) = b.scan(std::slice::from_ref(&x), &[b.scalar(1.0)], |c, x| {
        let grown = c[0].builder().while_loop(
            |s| s[0].lt(&s[0].builder().scalar(100.0)),
            |s| vec![s[0].mul(&s[0].builder().scalar(3.0))],
            &[c[0].abs().add(&c[0].builder().scalar(1.0))],
        );
        (vec![grown[0].add(&x[0].sum(&[0]))], vec![])
    });
    let program = b.finish(&[&carry[0]]).unwrap();
    let shown = grad(&program, 0, &[0]).unwrap_err().to_string();
    assert!(shown.contains("= while"), "{shown}");
}

/// A scan with every kind of operand: carried values (one f32 with a gradient, one i32
/// counter), stacked operands, a captured weight; its final carry and stacked outputs
/// both reach the loss. Forward and reversed.
#[test]
fn scan_matches_finite_differences() {
    for reverse in [false, true] {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(71);
        let b = Builder::new("scan");
        let init = param(&b, "init", &[3]);
        let xs = param(&b, "xs", &[4, 3]);
        let w = param(&b, "w", &[3, 3]);
        let count = b.constant(Literal::full(&[], DType::I32, 0.0));
        let body = |c: &[Tensor], x: &[Tensor]| {
            let step = c[1].convert(DType::F32).add(&c[1].builder().scalar(1.0));
            let h = einsum("i,ij->j", &c[0], &w).add(&x[0]).tanh();
            let y = h.mul(&x[0]).mul(&step);
            let one = c[1].builder().constant(Literal::full(&[], DType::I32, 1.0));
            (vec![h, c[1].add(&one)], vec![y])
        };
        let (carry, ys) = if reverse {
            b.scan_reverse(std::slice::from_ref(&xs), &[init, count], body)
        } else {
            b.scan(std::slice::from_ref(&xs), &[init, count], body)
        };
        let loss = weighted_sum(&carry[0], &mut rng).add(&weighted_sum(&ys[0], &mut rng));
        let program = b.finish(&[&loss]).unwrap();
        let inputs = [
            array(&mut rng, &[3], |r| r.random_range(-1.0..1.0)),
            array(&mut rng, &[4, 3], |r| r.random_range(-1.0..1.0)),
            array(&mut rng, &[3, 3], |r| r.random_range(-0.8..0.8)),
        ];
        check_gradients(&program, &inputs, &[0, 1, 2]);
    }
}

/// `fori_loop` (a scan with a counter): the counter feeds the body, a captured weight
/// is used every iteration.
#[test]
fn fori_loop_matches_finite_differences() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(72);
    let b = Builder::new("fori");
    let x = param(&b, "x", &[2, 3]);
    let w = param(&b, "w", &[3, 3]);
    let out = b.fori_loop(3, std::slice::from_ref(&x), |i, c| {
        let scale = i.convert(DType::F32).add(&i.builder().scalar(1.0));
        vec![c[0].matmul(&w).mul(&scale).sin()]
    });
    let loss = weighted_sum(&out[0], &mut rng);
    let program = b.finish(&[&loss]).unwrap();
    let inputs = [
        array(&mut rng, &[2, 3], |r| r.random_range(-1.0..1.0)),
        array(&mut rng, &[3, 3], |r| r.random_range(-0.6..0.6)),
    ];
    check_gradients(&program, &inputs, &[0, 1]);
}

/// Checks the gradients of a `cond` on the sign of a parameter `s`, each branch taken in
/// turn, over `x`, `w` (f32[3]) and `s` (numbered `wrt`): `branch(builder, x, w,
/// taken)` builds a branch's results (in the branch's builder or outside),
/// `loss(results, s, rng)` the loss.
fn check_cond(
    seed: u64,
    branch: impl Fn(&Builder, &Tensor, &Tensor, bool) -> Vec<Tensor>,
    loss: impl Fn(&[Tensor], &Tensor, &mut Xoshiro256PlusPlus) -> Tensor,
    wrt: &[usize],
) {
    for sign in [1.0f32, -1.0] {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let b = Builder::new("cond");
        let x = param(&b, "x", &[3]);
        let w = param(&b, "w", &[3]);
        let s = param(&b, "s", &[]);
        let pred = s.gt(&b.scalar(0.0));
        let r = b.cond(
            &pred,
            |bb| branch(bb, &x, &w, true),
            |bb| branch(bb, &x, &w, false),
        );
        let loss = loss(&r, &s, &mut rng);
        let program = b.finish(&[&loss]).unwrap();
        let inputs = [
            array(&mut rng, &[3], |r| r.random_range(-1.0..1.0)),
            array(&mut rng, &[3], |r| r.random_range(-1.0..1.0)),
            f32s(&[], &[0.5 * sign]),
        ];
        check_gradients(&program, &inputs, wrt);
    }
}

/// `cond`: the gradient follows the branch taken (each one, by the sign of a
/// parameter), and reaches values captured by either branch.
#[test]
fn cond_matches_finite_differences() {
    check_cond(
        73,
        |_, x, w, taken| match taken {
            true => vec![x.mul(w).tanh(), x.sum(&[0])],
            false => vec![w.exp(), x.mul(x).sum(&[0])],
        },
        |r, s, rng| weighted_sum(&r[0], rng).add(&r[1].mul(s)),
        &[0, 1, 2],
    );
}

/// Control flow nested in control flow: a scan whose body runs an inner scan over a
/// captured stack and a cond on the carry.
#[test]
fn nested_control_flow_matches_finite_differences() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(74);
    let b = Builder::new("nested");
    let xs = param(&b, "xs", &[3, 2]);
    let inner = param(&b, "inner", &[2, 2]);
    let init = param(&b, "init", &[2]);
    let (carry, ys) = b.scan(
        std::slice::from_ref(&xs),
        std::slice::from_ref(&init),
        |c, x| {
            let bb = c[0].builder();
            let (h, _) = bb.scan(
                std::slice::from_ref(&inner),
                std::slice::from_ref(&c[0]),
                |h, row| (vec![h[0].mul(&row[0]).add(&x[0]).tanh()], vec![]),
            );
            let positive = h[0].sum(&[0]).gt(&bb.scalar(0.0));
            let r = bb.cond(&positive, |_| vec![h[0].mul(&x[0])], |_| vec![h[0].sin()]);
            (vec![r[0].clone()], vec![r[0].sum(&[0])])
        },
    );
    let loss = weighted_sum(&carry[0], &mut rng).add(&weighted_sum(&ys[0], &mut rng));
    let program = b.finish(&[&loss]).unwrap();
    let inputs = [
        array(&mut rng, &[3, 2], |r| r.random_range(-1.0..1.0)),
        array(&mut rng, &[2, 2], |r| r.random_range(-1.0..1.0)),
        array(&mut rng, &[2], |r| r.random_range(-1.0..1.0)),
    ];
    check_gradients(&program, &inputs, &[0, 1, 2]);
}

// ---- builder losses -------------------------------------------------------------------------------

#[test]
fn mse_is_the_mean_of_squared_differences() {
    let b = Builder::new("mse");
    let (p, t) = (param(&b, "p", &[2, 2]), param(&b, "t", &[2, 2]));
    let program = b.finish(&[&p.mse(&t)]).unwrap();
    let outs = interpret(
        &program,
        &[
            f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]),
            f32s(&[2, 2], &[0.0, 2.0, 5.0, 1.0]),
        ],
    )
    .unwrap();
    // (1 + 0 + 4 + 9) / 4
    assert_eq!(outs[0], f32s(&[], &[3.5]));

    let b = Builder::new("bad");
    let (p, t) = (param(&b, "p", &[2, 2]), param(&b, "t", &[4]));
    let _ = p.mse(&t).exp();
    match b.finish(&[]) {
        Err(Error::Shape {
            op: "mse", message, ..
        }) => {
            assert!(message.contains("f32[2,2] and target f32[4]"), "{message}")
        }
        other => panic!("expected one mse error, got {other:?}"),
    }
}

#[test]
fn cross_entropy_with_logits_matches_hand_computed_values() {
    let b = Builder::new("xent");
    let logits = param(&b, "logits", &[2, 3]);
    let labels = b.parameter("labels", vec![2], DType::I32);
    let program = b
        .finish(&[&logits.cross_entropy_with_logits(&labels)])
        .unwrap();
    let out = interpret(
        &program,
        &[
            f32s(&[2, 3], &[1.0, 2.0, 3.0, 1.0, 1.0, 1.0]),
            i32s(&[2], &[2, 0]),
        ],
    )
    .unwrap();
    // Row 0: -(3 - ln(e + e^2 + e^3)); row 1: ln 3; then their mean.
    let e = std::f64::consts::E;
    let row0 = (e + e * e + e * e * e).ln() - 3.0;
    let want = (row0 + 3f64.ln()) / 2.0;
    assert!(
        (scalar(&out[0]) as f64 - want).abs() < 1e-6,
        "{out:?} vs {want}"
    );

    // No leading dims: a single example, the label a scalar.
    let b = Builder::new("one");
    let logits = param(&b, "logits", &[3]);
    let label = b.parameter("label", vec![], DType::I32);
    let program = b
        .finish(&[&logits.cross_entropy_with_logits(&label)])
        .unwrap();
    let out = interpret(&program, &[f32s(&[3], &[0.0, 0.0, 0.0]), i32s(&[], &[1])]).unwrap();
    assert!((scalar(&out[0]) as f64 - 3f64.ln()).abs() < 1e-6);

    let b = Builder::new("bad");
    let logits = param(&b, "logits", &[2, 3]);
    let float_labels = param(&b, "labels", &[2]);
    let _ = logits.cross_entropy_with_logits(&float_labels);
    match b.finish(&[]) {
        Err(Error::Shape { op, message, .. }) => {
            assert_eq!(op, "cross_entropy_with_logits");
            assert!(message.contains("got f32[2]"), "{message}");
        }
        other => panic!("expected one error, got {other:?}"),
    }
}

/// Dropout's gradient: the cotangent through the kept elements, scaled by
/// `1 / (1 - rate)`; none to the key (an i32 input the sweep never differentiates).
#[test]
fn dropout_matches_finite_differences() {
    let b = Builder::new("dropout");
    let x = b.parameter("x", [4, 6], DType::F32);
    let key = b.parameter("key", [2], DType::I32);
    let loss = (random::dropout(&x, 0.4, &key) * &x).sum(&[0, 1]);
    let program = b.finish(&[&loss]).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(26);
    let inputs = [
        uniform_f32(&mut rng, &[4, 6], -1.0, 1.0),
        random::key_data(5),
    ];
    let g = check_gradients(&program, &inputs, &[0]);
    let zeros = values(&g[0]).iter().filter(|&&d| d == 0.0).count();
    assert!(zeros > 0 && zeros < 24, "{zeros} of 24 elements dropped");
}

/// Every differentiable op kind is in a program whose gradients a test above checks
/// against finite differences (through [`check_gradients`]); every other kind is shown
/// to be `NotDifferentiable`.
#[test]
fn covers_every_op_kind() {
    let kinds = op_coverage::kinds_checked("covers_every_op_kind");
    let fd = kinds.get("finite_differences");
    op_coverage::assert_kinds(
        "finite_differences",
        fd,
        is_differentiable,
        is_differentiable,
    );
    let not = |k: OpKind| !is_differentiable(k);
    op_coverage::assert_kinds(
        "not_differentiable",
        kinds.get("not_differentiable"),
        not,
        not,
    );
}

/// A scan whose body returns one value as its carry and as its output (JAX's
/// `return h, h`): the two cotangents of that value add up in the backward body.
/// Forward and reversed; the final carry and the stacked outputs both reach the loss.
#[test]
fn scan_returning_its_carry_as_its_output_matches_finite_differences() {
    for reverse in [false, true] {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(74);
        let b = Builder::new("rnn");
        let h0 = param(&b, "h0", &[2, 3]);
        let xs = param(&b, "xs", &[4, 2, 3]);
        let w = param(&b, "w", &[3, 3]);
        let body = |c: &[Tensor], x: &[Tensor]| {
            let h = c[0].matmul(&w).add(&x[0]).tanh();
            (vec![h.clone()], vec![h])
        };
        let (carry, hs) = if reverse {
            b.scan_reverse(std::slice::from_ref(&xs), std::slice::from_ref(&h0), body)
        } else {
            b.scan(std::slice::from_ref(&xs), std::slice::from_ref(&h0), body)
        };
        let loss = weighted_sum(&carry[0], &mut rng).add(&weighted_sum(&hs[0], &mut rng));
        let program = b.finish(&[&loss]).unwrap();
        let inputs = [
            array(&mut rng, &[2, 3], |r| r.random_range(-1.0..1.0)),
            array(&mut rng, &[4, 2, 3], |r| r.random_range(-1.0..1.0)),
            array(&mut rng, &[3, 3], |r| r.random_range(-0.8..0.8)),
        ];
        check_gradients(&program, &inputs, &[0, 1, 2]);
    }
}

/// A `cond` whose branches return one value twice, or two values of one name: each
/// result gets its own cotangent parameter in the backward branches (distinct names),
/// and the gradient matches finite differences for either branch.
#[test]
fn cond_returning_a_value_twice_matches_finite_differences() {
    check_cond(
        75,
        |bb, x, w, taken| {
            // Computed in the branch: `one * x` captures `x`.
            let (x, w) = (bb.scalar(1.0).mul(x), bb.scalar(1.0).mul(w));
            match taken {
                true => {
                    let h = x.mul(&w).tanh();
                    vec![h.clone(), h]
                }
                false => vec![w.exp().named("h"), x.mul(&x).named("h")],
            }
        },
        |r, _, rng| weighted_sum(&r[0], rng).add(&weighted_sum(&r[1], rng)),
        &[0, 1],
    );
}
