//! bf16 and f16: arithmetic runs in f32 and rounds once per op (float normalisation),
//! data movement keeps the narrow type, the reference interpreter and the thread mesh
//! round at the same points, gradients of narrow values are narrow, and checkpoints
//! store them as safetensors BF16/F16.

use gspmd_core::autodiff::grad;
use gspmd_core::ir::{Builder, DType, Literal, Program, ReduceKind, Tensor};
use gspmd_core::runtime::{ThreadMesh, interpret};
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::train::{load_checkpoint, save_checkpoint};
use gspmd_core::{bf16, compile, f16};
use ndarray::{ArrayD, IxDyn};

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

/// Values on a grid in [-1.5, 1.5) that bf16 does not all hold exactly once multiplied.
fn input(shape: &[usize], seed: usize, dtype: DType) -> Literal {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + seed * 13) % 29) as f32 / 9.7 - 1.5)
        .collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()).convert(dtype)
}

fn inputs(program: &Program) -> Vec<Literal> {
    (program.params.iter().enumerate())
        .map(|(i, &p)| {
            let ty = program.ty(p);
            input(&ty.shape, i, ty.dtype)
        })
        .collect()
}

fn build(name: &str, f: impl FnOnce(&Builder) -> Vec<Tensor>) -> Program {
    let b = Builder::new(name);
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    b.finish(&refs).unwrap()
}

/// A small layer using every kind of op the normalisation treats differently: a
/// contraction, elementwise math, reductions with broadcasts (a softmax), data movement
/// (transpose, slice, concatenate, reshape) and a comparison with select. `round` is
/// applied after every op that computes: the identity for a narrow program, a round
/// trip through the narrow type for its f32 twin.
fn layer(x: Tensor, w: Tensor, round: &dyn Fn(Tensor) -> Tensor) -> Vec<Tensor> {
    let h = round(x.matmul(&w));
    let h = round(&round(h.tanh()) * &round(h.exp()));
    let max = round(h.reduce(ReduceKind::Max, &[1], true));
    let e = round(round(&h - &max).exp());
    let p = round(&e / &round(e.reduce(ReduceKind::Sum, &[1], true)));
    let t = p.transpose(&[1, 0]).slice(&[0, 0], &[6, 8], &[1, 1]);
    let moved = t.builder().concatenate(&[&t, &t], 0).reshape([8, 12]);
    let zero = moved.scalar_like(0.0);
    let picked = round(moved.gt(&zero)).select(&round(&moved * &h), &zero);
    vec![picked, round(h.sum(&[1]))]
}

/// A narrow program equals, bitwise, its f32 twin that rounds to the narrow type after
/// every op: each op computes in f32 and rounds once.
#[test]
fn narrow_ops_compute_in_f32_and_round_once() {
    for narrow in [DType::BF16, DType::F16] {
        let program = build("narrow", |b| {
            let x = b.parameter("x", [8, 16], narrow);
            let w = b.parameter("w", [16, 12], narrow);
            layer(x, w, &|t| t)
        });
        let twin = build("twin", |b| {
            let x = b.parameter("x", [8, 16], narrow).convert(DType::F32);
            let w = b.parameter("w", [16, 12], narrow).convert(DType::F32);
            let round = |t: Tensor| match t.dtype() {
                DType::F32 => t.convert(narrow).convert(DType::F32),
                _ => t,
            };
            let outs = layer(x, w, &round);
            outs.iter().map(|t| t.convert(narrow)).collect()
        });
        let given = inputs(&program);
        let got = interpret(&program, &given).unwrap();
        let want = interpret(&twin, &given).unwrap();
        assert_eq!(got[0].dtype(), narrow);
        assert_eq!(got, want, "{narrow}");
    }
}

/// The thread mesh rounds where the interpreter does: a data-parallel bf16 layer (no
/// reduction split across devices) gives the same bits on every mesh.
#[test]
fn mesh_and_interpreter_agree_bitwise_on_bf16() {
    let program = build("bf16_data_parallel", |b| {
        let x = b
            .parameter("x", [8, 16], DType::BF16)
            .annotate(s("(data, _)"));
        let w = b
            .parameter("w", [16, 12], DType::BF16)
            .annotate(s("(_, _)"));
        let h = x.matmul(&w).tanh();
        vec![h.softmax(-1), h.sum(&[1])]
    });
    let given = inputs(&program);
    let want = interpret(&program, &given).unwrap();
    for shape in [[8, 1], [2, 4], [4, 2]] {
        let mesh = Mesh::new([("data", shape[0]), ("model", shape[1])]).unwrap();
        let exe = compile(&program, &mesh).unwrap();
        let got = exe
            .run(&ThreadMesh::new(mesh.clone()).unwrap(), &given)
            .unwrap();
        assert_eq!(got, want, "on {mesh}");
    }
}

/// A Megatron layer in bf16 with its contraction split over `model`: each device's
/// partial product is rounded to bf16 before the all-reduce sums the partials in f32,
/// so the result is within a few bf16 ulps of the reference (one rounding more).
#[test]
fn split_bf16_contractions_are_close() {
    let program = build("bf16_megatron", |b| {
        let x = b
            .parameter("x", [8, 16], DType::BF16)
            .annotate(s("(data, _)"));
        let w1 = b
            .parameter("w1", [16, 32], DType::BF16)
            .annotate(s("(_, model)"));
        let w2 = b
            .parameter("w2", [32, 16], DType::BF16)
            .annotate(s("(model, _)"));
        vec![x.matmul(&w1).relu().matmul(&w2)]
    });
    let given = inputs(&program);
    let want = interpret(&program, &given).unwrap()[0].convert(DType::F32);
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let exe = compile(&program, &mesh).unwrap();
    let got = exe
        .run(&ThreadMesh::new(mesh.clone()).unwrap(), &given)
        .unwrap();
    assert_eq!(got[0].dtype(), DType::BF16);
    let got = got[0].convert(DType::F32);
    let (w, g) = (want.as_f32().unwrap(), got.as_f32().unwrap());
    let scale = w.iter().fold(1f32, |m, v| m.max(v.abs()));
    let worst = w
        .iter()
        .zip(g)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    // bf16 keeps 8 significant bits: an ulp is 2^-7 relative.
    assert!(
        worst <= 4.0 * scale * 2f32.powi(-7),
        "{worst} vs scale {scale}"
    );
}

/// `convert` between floats is differentiable: its cotangent converts back. In f32 the
/// gradient of `sum(convert(convert(x, bf16), f32) * w)` with respect to `x` is `w`
/// converted to bf16 and back (the VJP's structure), and the gradient of a bf16
/// parameter is bf16.
#[test]
fn gradients_of_narrow_values_are_narrow() {
    let program = build("mixed", |b| {
        let x = b.parameter("x", [4, 3], DType::F32);
        let w = b.parameter("w", [4, 3], DType::F32);
        let down = x.convert(DType::BF16);
        vec![(&down.convert(DType::F32) * &w).sum(&[0, 1])]
    });
    let g = grad(&program, 0, &[0]).unwrap();
    let given = inputs(&program);
    let out = interpret(&g, &given).unwrap();
    assert_eq!(out[1], given[1].convert(DType::BF16).convert(DType::F32));

    let narrow = build("narrow_loss", |b| {
        let x = b.parameter("x", [4, 3], DType::BF16);
        vec![x.tanh().sum(&[0, 1]).convert(DType::F32)]
    });
    let g = grad(&narrow, 0, &[0]).unwrap();
    let given = inputs(&narrow);
    let out = interpret(&g, &given).unwrap();
    assert_eq!(out[1].dtype(), DType::BF16);
    // d tanh = 1 - tanh^2, within bf16's precision (the tanh and the product round).
    let x = given[0].convert(DType::F32);
    let got = out[1].convert(DType::F32);
    for (v, d) in x.as_f32().unwrap().iter().zip(got.as_f32().unwrap()) {
        let want = 1.0 - v.tanh().powi(2);
        assert!((want - d).abs() <= 3.0 * 2f32.powi(-8), "{d} vs {want}");
    }
}

/// A bf16 loss differentiated by finite differences in f32: the gradient of
/// `sum(x^2 * w)` for bf16 `x` is within bf16 tolerance of the central difference.
#[test]
fn bf16_gradient_matches_finite_differences() {
    let program = build("fd", |b| {
        let x = b.parameter("x", [3, 4], DType::BF16);
        let w = b.parameter("w", [3, 4], DType::BF16);
        vec![(&(&x * &x) * &w).sum(&[0, 1])]
    });
    let g = grad(&program, 0, &[0]).unwrap();
    let given = inputs(&program);
    let out = interpret(&g, &given).unwrap();
    let analytic = out[1].convert(DType::F32);
    let x = given[0].convert(DType::F32);
    let w = given[1].convert(DType::F32);
    let eps = 0.125f32; // exact steps on bf16's grid for these magnitudes
    for (i, (&xi, &wi)) in x
        .as_f32()
        .unwrap()
        .iter()
        .zip(w.as_f32().unwrap())
        .enumerate()
    {
        // The loss is separable: its difference along x_i is w_i ((x+e)^2 - (x-e)^2) / 2e.
        let fd = wi * ((xi + eps).powi(2) - (xi - eps).powi(2)) / (2.0 * eps);
        let d = analytic.as_f32().unwrap().iter().nth(i).copied().unwrap();
        assert!(
            (fd - d).abs() <= 0.02 * fd.abs().max(1.0),
            "{i}: {d} vs {fd}"
        );
    }
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gspmd-dtypes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn narrow_checkpoints_round_trip() {
    let tensors = vec![
        ("a".to_string(), input(&[3, 5], 1, DType::BF16)),
        ("b".to_string(), input(&[7], 2, DType::F16)),
        ("c".to_string(), input(&[2, 2], 3, DType::F32)),
    ];
    let path = scratch("narrow.safetensors");
    save_checkpoint(&path, &tensors).unwrap();
    assert_eq!(load_checkpoint(&path).unwrap(), tensors);
}

/// `tests/data/reference_bf16.safetensors` was written by Python's `safetensors` package
/// (`tests/data/make_bf16.py`): bf16 `w` = `[[1, -2, 0.5], [3.140625, -0.0078125, 65280]]`
/// and f16 `h` = `[0.1, -1.5, 65504]` (0.1 rounded to f16), f32 `f` = `[1.25, -3]`.
#[test]
fn python_bf16_file_loads() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/reference_bf16.safetensors"
    );
    let tensors = load_checkpoint(path).unwrap();
    let get = |name: &str| &tensors.iter().find(|(n, _)| n == name).unwrap().1;
    let w: Vec<f32> = [1.0, -2.0, 0.5, 3.140625, -0.0078125, 65280.0].to_vec();
    let want_w = ArrayD::from_shape_vec(
        IxDyn(&[2, 3]),
        w.iter().map(|&v| bf16::from_f32(v)).collect(),
    )
    .unwrap();
    assert_eq!(get("w"), &Literal::BF16(want_w));
    let h: Vec<f16> = [0.1f32, -1.5, 65504.0]
        .iter()
        .map(|&v| f16::from_f32(v))
        .collect();
    assert_eq!(
        get("h"),
        &Literal::F16(ArrayD::from_shape_vec(IxDyn(&[3]), h).unwrap())
    );
    let f = ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.25f32, -3.0]).unwrap();
    assert_eq!(get("f"), &Literal::F32(f));
}
