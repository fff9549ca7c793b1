//! Manual regions (`shard_map`): bodies with explicit collectives, run by the reference
//! interpreter (per device of the manual axes, in lockstep) and partitioned onto a 2x4
//! thread mesh; each against the other and against the same computation written with
//! automatic sharding; and the typed errors of misuse.

mod differential;

use differential::compile_and_check;
use gspmd_core::autodiff::grad;
use gspmd_core::ir::{Builder, DType, Literal, OpKind, Program, Tensor};
use gspmd_core::runtime::interpret;
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::{Error, Executable, compile};
use ndarray::{ArrayD, IxDyn};

fn mesh() -> Mesh {
    Mesh::new([("data", 2), ("model", 4)]).unwrap()
}

fn spec(text: &str) -> Sharding {
    text.parse().unwrap()
}

/// A deterministic f32 array of `shape` with distinct-ish values in [-1, 1].
fn array(shape: &[usize], seed: usize) -> Literal {
    let mut k = seed;
    Literal::F32(ArrayD::from_shape_fn(IxDyn(shape), |_| {
        k = (k * 1103 + 12345) % 9973;
        k as f32 / 4986.5 - 1.0
    }))
}

fn f32s(l: &Literal) -> &ArrayD<f32> {
    l.as_f32().expect("an f32 output")
}

/// Asserts `got` equals `want` within `1e-5` of the largest magnitude.
fn assert_close(got: &Literal, want: &Literal, what: &str) {
    let (a, b) = (f32s(got), f32s(want));
    assert_eq!(a.shape(), b.shape(), "{what}");
    let scale = b.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff <= 1e-5 * scale, "{what}: max diff {diff}");
}

/// Interprets `program` on `inputs` and compiles it for the 2x4 mesh, checking the
/// thread mesh's outputs against the interpreter's; returns the interpreter's.
fn run_both(program: &Program, inputs: &[Literal]) -> Vec<Literal> {
    assert!(
        program
            .nodes
            .iter()
            .any(|n| n.op.kind() == OpKind::ShardMap)
    );
    compile_and_check(program, &mesh(), inputs, 1e-5);
    interpret(program, inputs).unwrap()
}

/// A one-input, one-output `shard_map` over `model` on a parameter of `shape`
/// annotated `outside` (the automatic axes it brings in), with the given specs and
/// body, traced in `b`.
fn region(
    b: &Builder,
    (shape, outside): (&[usize], &str),
    in_spec: &str,
    out_spec: &str,
    body: impl FnOnce(&Builder, &Tensor) -> Tensor,
) -> Vec<Tensor> {
    let x = b
        .parameter("x", shape.to_vec(), DType::F32)
        .shard(spec(outside));
    b.shard_map(
        &mesh(),
        &["model"],
        &[x],
        &[spec(in_spec)],
        &[spec(out_spec)],
        |b, blocks| vec![body(b, &blocks[0])],
    )
}

/// [`region`] as a program.
fn single(
    shape: (&[usize], &str),
    in_spec: &str,
    out_spec: &str,
    body: impl FnOnce(&Builder, &Tensor) -> Tensor,
) -> Program {
    let b = Builder::new("single");
    let y = region(&b, shape, in_spec, out_spec, body);
    b.finish(&[&y[0]]).unwrap()
}

/// `x @ w` by hand: `x` split by columns and `w` by rows over `model`, each device's
/// product summed by `psum` (the result replicated over `model`), plus `bias`, a value
/// of the enclosing program captured whole, if given.
fn row_parallel(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Tensor {
    let y = x.builder().shard_map(
        &mesh(),
        &["model"],
        &[x.clone(), w.clone()],
        &[spec("(_, model)"), spec("(model, _)")],
        &[spec("(_, _)")],
        |_, blocks| {
            let y = blocks[0].matmul(&blocks[1]).psum(&["model"]);
            vec![match bias {
                Some(bias) => &y + bias,
                None => y,
            }]
        },
    );
    y[0].clone()
}

/// A row-parallel matmul by hand (local product, then `psum` over `model`) equals the
/// reference and the same product with automatic sharding, on 2x4.
#[test]
fn row_parallel_matmul_with_psum() {
    let inputs = [array(&[4, 16], 1), array(&[16, 6], 2)];
    let [manual, automatic] = [true, false].map(|manual| {
        let b = Builder::new("matmul");
        let x = b.parameter("x", vec![4, 16], DType::F32);
        let w = b.parameter("w", vec![16, 6], DType::F32);
        let y = match manual {
            true => row_parallel(&x, &w, None),
            false => x
                .shard(spec("(_, model)"))
                .matmul(&w.shard(spec("(model, _)"))),
        };
        b.finish(&[&y]).unwrap()
    });
    let got = run_both(&manual, &inputs);
    let want = compile_and_check(&automatic, &mesh(), &inputs, 1e-5);
    assert_close(
        &got[0],
        &interpret(&automatic, &inputs).unwrap()[0],
        "vs automatic",
    );
    // Both reduce the partial products with one all-reduce.
    for exe in [compile(&manual, &mesh()).unwrap(), want] {
        assert_eq!(collectives(&exe), [("all_reduce", 1)], "{}", exe.report());
    }
}

/// The collectives of `exe`'s per-device program: kind and count.
fn collectives(exe: &Executable) -> Vec<(&'static str, usize)> {
    let stats = exe.spmd().collectives();
    stats
        .by_kind
        .iter()
        .map(|(&kind, &(n, _))| (kind.name(), n))
        .collect()
}

/// A body of one collective over `model` (4 devices): its input's shape, in- and
/// out-spec, body, and its meaning on the global array (element at `[row, col]` of
/// the input `x`).
type Case = (
    &'static str,
    [usize; 2],
    &'static str,
    &'static str,
    fn(&Builder, &Tensor) -> Tensor,
    fn(&ArrayD<f32>, usize, usize) -> f32,
);

/// Each collective alone in a body, on the 2x4 mesh and the reference, equals its
/// meaning worked out on the global array, whichever dim the automatic axis `data`
/// splits inside the body (none, the one the collective moves along, the other).
#[test]
fn single_collective_bodies() {
    let cases: [Case; 5] = [
        // The row blocks gathered: every device holds the whole array.
        (
            "all_gather",
            [8, 3],
            "(model, _)",
            "(_, _)",
            |_, x| x.all_gather(&["model"], 0),
            |x, r, c| x[[r, c]],
        ),
        // Row blocks exchanged into column blocks: the same global array.
        (
            "all_to_all",
            [8, 8],
            "(model, _)",
            "(_, model)",
            |_, x| x.all_to_all(&["model"], 1, 0),
            |x, r, c| x[[r, c]],
        ),
        // Each row block passed to the next device: the rows roll by one block (2).
        (
            "ppermute",
            [8, 3],
            "(model, _)",
            "(model, _)",
            |_, x| x.ppermute(&["model"], 1),
            |x, r, c| x[[(r + 6) % 8, c]],
        ),
        // Device i (rows 2i, 2i + 1) adds i.
        (
            "axis_index",
            [8, 3],
            "(model, _)",
            "(model, _)",
            |b, x| x + &b.axis_index(&["model"]).convert(DType::F32),
            |x, r, c| x[[r, c]] + (r / 2) as f32,
        ),
        // Four copies summed, device i keeping row block i.
        (
            "psum_scatter",
            [8, 3],
            "(_, _)",
            "(model, _)",
            |_, x| x.psum_scatter(&["model"], 0),
            |x, r, c| 4.0 * x[[r, c]],
        ),
    ];
    for (k, (name, shape, in_spec, out_spec, body, meaning)) in cases.into_iter().enumerate() {
        for outside in ["(?, ?)", "(data, ?)", "(?, data)"] {
            let program = single((&shape, outside), in_spec, out_spec, body);
            let x = array(&shape, k + 3);
            let got = run_both(&program, std::slice::from_ref(&x));
            let a = f32s(&x);
            let want = ArrayD::from_shape_fn(a.raw_dim(), |ix| meaning(a, ix[0], ix[1]));
            assert_close(
                &got[0],
                &Literal::F32(want),
                &format!("{name}, x {outside}"),
            );
        }
    }
}

/// A body with a loop (no collective inside it) and an annotation of the automatic
/// axis `data`: the loop runs per device on the reference and on the mesh, and the
/// annotated value is split over `data` inside the body.
#[test]
fn loops_and_automatic_annotations_inside_a_body() {
    let program = single((&[8, 6], "(?, ?)"), "(model, _)", "(model, _)", |b, x| {
        let x = x.shard(spec("(_, data)"));
        let looped = b.fori_loop(3, std::slice::from_ref(&x), |_, c| vec![c[0].tanh()]);
        looped[0].psum(&["model"])
    });
    let x = array(&[8, 6], 21);
    let got = run_both(&program, std::slice::from_ref(&x));
    let a = f32s(&x);
    // Each device's block: the sum over the 4 row blocks of tanh applied 3 times.
    let want = ArrayD::from_shape_fn(a.raw_dim(), |ix| {
        (0..4)
            .map(|k| a[[2 * k + ix[0] % 2, ix[1]]].tanh().tanh().tanh())
            .sum::<f32>()
    });
    assert_close(&got[0], &Literal::F32(want), "the summed loop");
    let exe = compile(&program, &mesh()).unwrap();
    assert_eq!(local_shape(&exe, "scan"), [2, 3], "{}", exe.report());
}

/// The per-device shape of the first `op` of `exe`'s per-device program.
fn local_shape(exe: &Executable, op: &str) -> Vec<usize> {
    let node = (exe.spmd().program.nodes.iter()).find(|n| n.op.name() == op);
    node.map(|n| n.ty.shape.clone()).unwrap_or_default()
}

/// A block split unevenly over an automatic axis (2 rows over `x`'s 3 devices) is not
/// the whole value's split over `z` then `x`: the boundary keeps only even splits, and
/// the result equals the reference (a case `pipeline_random` found).
#[test]
fn uneven_automatic_split_of_a_block() {
    let mesh = Mesh::new([("x", 3), ("z", 2)]).unwrap();
    let b = Builder::new("uneven");
    let x = b.parameter("x", vec![4, 5], DType::F32);
    let y = b.shard_map(
        &mesh,
        &["z"],
        &[x],
        &[spec("(z, _)")],
        &[spec("(z, _)")],
        |_, blocks| vec![blocks[0].shard(spec("(x, _)")).ppermute(&["z"], 1)],
    );
    let y = y[0].shard(spec("((z, x), _)")).exp();
    let program = b.finish(&[&y]).unwrap();
    let x = array(&[4, 5], 31);
    compile_and_check(&program, &mesh, std::slice::from_ref(&x), 1e-5);
    let a = f32s(&x);
    let want = ArrayD::from_shape_fn(a.raw_dim(), |ix| a[[(ix[0] + 2) % 4, ix[1]]].exp());
    let got = interpret(&program, std::slice::from_ref(&x)).unwrap();
    assert_close(&got[0], &Literal::F32(want), "rolled by one block");
}

/// `tanh(x) @ w + bias` with the batch split over `data`, the matmul written by hand
/// ([`row_parallel`]) when `manual`; with `loss`, then a scalar loss.
fn mlp(manual: bool, loss: bool) -> Program {
    let b = Builder::new("mlp");
    let x = b.parameter("x", vec![8, 16], DType::F32);
    let w = b.parameter("w", vec![16, 6], DType::F32);
    let bias = b.parameter("bias", vec![6], DType::F32);
    let h = x.shard(spec("(data, _)")).tanh();
    let y = match manual {
        true => row_parallel(&h, &w, Some(&bias)),
        false => &h.matmul(&w.shard(spec("(model, _)"))) + &bias,
    };
    let out = match loss {
        true => (&y * &y).sum(&[0, 1]),
        false => y.shard(spec("(data, _)")).exp(),
    };
    b.finish(&[&out]).unwrap()
}

fn mlp_inputs() -> [Literal; 3] {
    [array(&[8, 16], 8), array(&[16, 6], 9), array(&[6], 10)]
}

/// Partially manual: manual over `model`, automatic over `data` (the batch dim is
/// split over `data` around the region and inside it); a captured outer value reaches
/// every body whole.
#[test]
fn partially_manual_over_model() {
    let inputs = mlp_inputs();
    let got = run_both(&mlp(true, false), &inputs);
    let want = interpret(&mlp(false, false), &inputs).unwrap();
    assert_close(&got[0], &want[0], "vs automatic");
    // `data` stays automatic inside: the body runs on its batch rows (no gather over
    // `data`); the psum is the one collective, as the automatic version's all-reduce.
    let exe = compile(&mlp(true, false), &mesh()).unwrap();
    assert_eq!(collectives(&exe), [("all_reduce", 1)], "{}", exe.report());
    assert_eq!(local_shape(&exe, "dot_general"), [4, 6], "{}", exe.report());
}

/// The gradient of a loss through a hand-written row-parallel matmul (partially
/// manual: `data` automatic) runs on the 2x4 mesh as the reference says, and equals the
/// gradient of the same loss with automatic sharding.
#[test]
fn gradient_through_a_manual_region_on_the_mesh() {
    let inputs = mlp_inputs();
    let manual = grad(&mlp(true, true), 0, &[0, 1, 2]).unwrap();
    let backward_regions = (manual.nodes.iter())
        .filter(|n| n.op.kind() == OpKind::ShardMap)
        .count();
    assert!(
        backward_regions >= 3,
        "a forward region and the backward one's results\n{manual}"
    );
    let got = run_both(&manual, &inputs);
    let automatic = grad(&mlp(false, true), 0, &[0, 1, 2]).unwrap();
    let want = interpret(&automatic, &inputs).unwrap();
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(g, w, &format!("output {k}"));
    }
}

/// The error of tracing `f`, which must be one [`Error::Manual`] of `op`.
fn manual_error(f: impl FnOnce(&Builder) -> Vec<Tensor>) -> (String, String) {
    let b = Builder::new("bad");
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    match b.finish(&refs) {
        Err(Error::Manual {
            op,
            location,
            message,
        }) => {
            assert_eq!(location.file, file!(), "{message}");
            (op.to_string(), message)
        }
        other => panic!("expected one Error::Manual, got {other:?}"),
    }
}

/// A one-input region over `model` on an `f32[8, 6]`, with the given specs and body.
type BadCase = (&'static str, &'static str, fn(&Builder, &Tensor) -> Tensor);

/// Each misuse of one region is one `Error::Manual` of the op naming the problem.
#[test]
fn misuses_are_typed_errors_at_the_line() {
    let cases: [(BadCase, &str, &str); 6] = [
        (
            ("(data, _)", "(data, _)", |_, x| x.clone()),
            "shard_map",
            "`data`, which is not a manual axis",
        ),
        (
            ("(_, model)", "(_, model)", |_, x| x.clone()),
            "shard_map",
            "not divisible by the 4 devices",
        ),
        (
            ("(model, _)", "(model, _, _)", |_, x| x.clone()),
            "shard_map",
            "has 3 dims but the tensor has rank 2",
        ),
        (
            ("(model, _)", "(model, _)", |_, x| x.sum(&[0])),
            "shard_map",
            "result 0",
        ),
        (
            ("(model, _)", "(model, _)", |_, x| x.psum(&["data"])),
            "psum",
            "`data` is not a manual axis",
        ),
        (
            ("(model, _)", "(model, _)", |_, x| {
                x.shard(spec("(_, model)"))
            }),
            "shard_map",
            "names manual axis `model`",
        ),
    ];
    for ((in_spec, out_spec, body), want_op, fragment) in cases {
        let (op, message) =
            manual_error(|b| region(b, (&[8, 6], "(?, ?)"), in_spec, out_spec, body));
        assert_eq!(op, want_op, "{message}");
        assert!(message.contains(fragment), "{message}");
    }
}

#[test]
fn collective_outside_a_body() {
    let (op, message) =
        manual_error(|b| vec![b.parameter("x", vec![4], DType::F32).psum(&["model"])]);
    assert_eq!(op, "psum");
    assert!(message.contains("inside a shard_map body"), "{message}");
}

#[test]
fn misused_regions_are_typed_errors() {
    let (_, message) = manual_error(|b| {
        let x = b.parameter("x", vec![8], DType::F32);
        b.shard_map(
            &mesh(),
            &["expert"],
            &[x],
            &[spec("(_)")],
            &[spec("(_)")],
            |_, xs| xs.to_vec(),
        )
    });
    assert!(
        message.contains("`expert` is not an axis of the mesh"),
        "{message}"
    );
    let (_, message) = manual_error(|b| {
        let x = b.parameter("x", vec![8], DType::F32);
        b.shard_map(&mesh(), &["model"], &[x], &[], &[spec("(_)")], |_, xs| {
            xs.to_vec()
        })
    });
    assert!(message.contains("1 inputs but 0 in-specs"), "{message}");
    let (_, message) = manual_error(|b| {
        region(
            b,
            (&[8, 6], "(?, ?)"),
            "(model, _)",
            "(model, _)",
            |b, x| {
                let inner = b.shard_map(
                    &mesh(),
                    &["data"],
                    std::slice::from_ref(x),
                    &[spec("(_, _)")],
                    &[spec("(_, _)")],
                    |_, xs| xs.to_vec(),
                );
                inner[0].clone()
            },
        )
    });
    assert!(message.contains("inside a shard_map body"), "{message}");
}
