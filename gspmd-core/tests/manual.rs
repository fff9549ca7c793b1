//! Manual regions (`shard_map`): bodies with explicit collectives, run by the reference
//! interpreter (per device of the manual axes, in lockstep) and partitioned onto a 2x4
//! thread mesh; each against the other and against the same computation written with
//! automatic sharding; and the typed errors of misuse.

mod differential;

use differential::compile_and_check;
use gspmd_core::Error;
use gspmd_core::autodiff::grad;
use gspmd_core::ir::{Builder, DType, Literal, OpKind, Program, Tensor};
use gspmd_core::runtime::interpret;
use gspmd_core::sharding::{Mesh, Sharding};
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

/// A one-input, one-output `shard_map` over `model` with the given specs.
fn single(
    shape: &[usize],
    in_spec: &str,
    out_spec: &str,
    body: impl FnOnce(&Builder, &Tensor) -> Tensor,
) -> Program {
    let b = Builder::new("single");
    let x = b.parameter("x", shape.to_vec(), DType::F32);
    let y = b.shard_map(
        &mesh(),
        &["model"],
        &[x],
        &[spec(in_spec)],
        &[spec(out_spec)],
        |b, blocks| vec![body(b, &blocks[0])],
    );
    b.finish(&[&y[0]]).unwrap()
}

/// A row-parallel matmul by hand (local product, then `psum` over `model`) equals the
/// reference and the same product with automatic sharding, on 2x4.
#[test]
fn row_parallel_matmul_with_psum() {
    let b = Builder::new("row_parallel");
    let x = b.parameter("x", vec![4, 16], DType::F32);
    let w = b.parameter("w", vec![16, 6], DType::F32);
    let y = b.shard_map(
        &mesh(),
        &["model"],
        &[x, w],
        &[spec("(_, model)"), spec("(model, _)")],
        &[spec("(_, _)")],
        |_, blocks| {
            assert_eq!(blocks[0].ty().shape, vec![4, 4]);
            assert_eq!(blocks[1].ty().shape, vec![4, 6]);
            vec![blocks[0].matmul(&blocks[1]).psum(&["model"])]
        },
    );
    let manual = b.finish(&[&y[0]]).unwrap();
    let inputs = [array(&[4, 16], 1), array(&[16, 6], 2)];
    let got = run_both(&manual, &inputs);

    let b = Builder::new("automatic");
    let x = b.parameter("x", vec![4, 16], DType::F32);
    let w = b.parameter("w", vec![16, 6], DType::F32);
    let x = x.shard(spec("(_, model)"));
    let w = w.shard(spec("(model, _)"));
    let automatic = b.finish(&[&x.matmul(&w)]).unwrap();
    let want = compile_and_check(&automatic, &mesh(), &inputs, 1e-5);
    assert_close(
        &got[0],
        &interpret(&automatic, &inputs).unwrap()[0],
        "vs automatic",
    );
    // The automatic version also reduces its partial sums with one all-reduce.
    assert!(want.report().contains("all_reduce"), "{}", want.report());
}

/// `all_gather` of row blocks gives every device the whole array back.
#[test]
fn all_gather_body() {
    let program = single(&[8, 3], "(model, _)", "(_, _)", |_, x| {
        x.all_gather(&["model"], 0)
    });
    let x = array(&[8, 3], 3);
    let got = run_both(&program, std::slice::from_ref(&x));
    assert_eq!(got[0], x);
}

/// `all_to_all` from row blocks to column blocks is the identity on the global array.
#[test]
fn all_to_all_body() {
    let program = single(&[8, 8], "(model, _)", "(_, model)", |_, x| {
        x.all_to_all(&["model"], 1, 0)
    });
    let x = array(&[8, 8], 4);
    let got = run_both(&program, std::slice::from_ref(&x));
    assert_eq!(got[0], x);
}

/// `ppermute` by one passes each row block to the next device (a ring): the global
/// rows roll by one block.
#[test]
fn ppermute_body() {
    let program = single(&[8, 3], "(model, _)", "(model, _)", |_, x| {
        x.ppermute(&["model"], 1)
    });
    let x = array(&[8, 3], 5);
    let got = run_both(&program, std::slice::from_ref(&x));
    let (a, g) = (f32s(&x), f32s(&got[0]));
    for r in 0..8 {
        for c in 0..3 {
            assert_eq!(g[[r, c]], a[[(r + 6) % 8, c]], "row {r}");
        }
    }
}

/// `axis_index` adds each device's index over `model` to its block.
#[test]
fn axis_index_body() {
    let program = single(&[8, 3], "(model, _)", "(model, _)", |b, x| {
        x + &b.axis_index(&["model"]).convert(DType::F32)
    });
    let x = array(&[8, 3], 6);
    let got = run_both(&program, std::slice::from_ref(&x));
    let (a, g) = (f32s(&x), f32s(&got[0]));
    for r in 0..8 {
        assert_eq!(g[[r, 1]], a[[r, 1]] + (r / 2) as f32, "row {r}");
    }
}

/// `psum_scatter` sums over `model` and leaves device `i` the `i`-th row block.
#[test]
fn psum_scatter_body() {
    let program = single(&[8, 3], "(_, _)", "(model, _)", |_, x| {
        x.psum_scatter(&["model"], 0)
    });
    let x = array(&[8, 3], 7);
    let got = run_both(&program, std::slice::from_ref(&x));
    let want = f32s(&x).mapv(|v| 4.0 * v);
    assert_close(&got[0], &Literal::F32(want), "4 x");
}

/// Partially manual: manual over `model`, automatic over `data` (the batch dim is
/// split over `data` around the region); a captured outer value reaches every body
/// whole.
#[test]
fn partially_manual_over_model() {
    let b = Builder::new("partial");
    let x = b.parameter("x", vec![8, 16], DType::F32);
    let w = b.parameter("w", vec![16, 6], DType::F32);
    let bias = b.parameter("bias", vec![6], DType::F32);
    let h = x.shard(spec("(data, _)")).tanh();
    let y = b.shard_map(
        &mesh(),
        &["model"],
        &[h, w],
        &[spec("(_, model)"), spec("(model, _)")],
        &[spec("(_, _)")],
        |_, blocks| {
            let partial = blocks[0].matmul(&blocks[1]).psum(&["model"]);
            vec![&partial + &bias]
        },
    );
    let out = y[0].shard(spec("(data, _)")).exp();
    let program = b.finish(&[&out]).unwrap();
    let inputs = [array(&[8, 16], 8), array(&[16, 6], 9), array(&[6], 10)];
    let got = run_both(&program, &inputs);

    let b = Builder::new("automatic");
    let x = b.parameter("x", vec![8, 16], DType::F32);
    let w = b.parameter("w", vec![16, 6], DType::F32);
    let bias = b.parameter("bias", vec![6], DType::F32);
    let y = x.tanh().matmul(&w);
    let out = (&y + &bias).exp();
    let want = interpret(&b.finish(&[&out]).unwrap(), &inputs).unwrap();
    assert_close(&got[0], &want[0], "vs automatic");
}

/// `x -> tanh(x) @ w + bias` (batch split over `data`), with the matmul written by
/// hand as a row-parallel `shard_map` over `model` when `manual`, then a scalar loss.
fn mlp_loss(manual: bool) -> Program {
    let b = Builder::new(if manual {
        "manual_loss"
    } else {
        "automatic_loss"
    });
    let x = b.parameter("x", vec![8, 16], DType::F32);
    let w = b.parameter("w", vec![16, 6], DType::F32);
    let bias = b.parameter("bias", vec![6], DType::F32);
    let h = x.shard(spec("(data, _)")).tanh();
    let y = if manual {
        let y = b.shard_map(
            &mesh(),
            &["model"],
            &[h, w],
            &[spec("(_, model)"), spec("(model, _)")],
            &[spec("(_, _)")],
            |_, blocks| vec![blocks[0].matmul(&blocks[1]).psum(&["model"])],
        );
        y[0].clone()
    } else {
        h.matmul(&w.shard(spec("(model, _)")))
    };
    let y = &y + &bias;
    let loss = (&y * &y).sum(&[0, 1]);
    b.finish(&[&loss]).unwrap()
}

/// The gradient of a loss through a hand-written row-parallel matmul (partially
/// manual: `data` automatic) runs on the 2x4 mesh as the reference says, and equals the
/// gradient of the same loss with automatic sharding.
#[test]
fn gradient_through_a_manual_region_on_the_mesh() {
    let inputs = [array(&[8, 16], 11), array(&[16, 6], 12), array(&[6], 13)];
    let manual = grad(&mlp_loss(true), 0, &[0, 1, 2]).unwrap();
    let backward_regions = (manual.nodes.iter())
        .filter(|n| n.op.kind() == OpKind::ShardMap)
        .count();
    assert!(
        backward_regions >= 3,
        "a forward region and the backward one's results\n{manual}"
    );
    let got = run_both(&manual, &inputs);
    let automatic = grad(&mlp_loss(false), 0, &[0, 1, 2]).unwrap();
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

fn bad_single(
    b: &Builder,
    in_spec: &str,
    out_spec: &str,
    body: impl FnOnce(&Builder, &Tensor) -> Tensor,
) -> Vec<Tensor> {
    let x = b.parameter("x", vec![8, 6], DType::F32);
    b.shard_map(
        &mesh(),
        &["model"],
        &[x],
        &[spec(in_spec)],
        &[spec(out_spec)],
        |b, blocks| vec![body(b, &blocks[0])],
    )
}

#[test]
fn spec_naming_an_axis_that_is_not_manual() {
    let (op, message) = manual_error(|b| bad_single(b, "(data, _)", "(data, _)", |_, x| x.clone()));
    assert_eq!(op, "shard_map");
    assert!(
        message.contains("`data`, which is not a manual axis"),
        "{message}"
    );
}

#[test]
fn dim_not_divisible_by_its_axes() {
    let (_, message) =
        manual_error(|b| bad_single(b, "(_, model)", "(_, model)", |_, x| x.clone()));
    assert!(
        message.contains("not divisible by the 4 devices"),
        "{message}"
    );
}

#[test]
fn body_result_not_fitting_its_out_spec() {
    let (_, message) =
        manual_error(|b| bad_single(b, "(model, _)", "(model, _, _)", |_, x| x.clone()));
    assert!(
        message.contains("has 3 dims but the tensor has rank 2"),
        "{message}"
    );
    let (_, message) =
        manual_error(|b| bad_single(b, "(model, _)", "(model, _)", |_, x| x.sum(&[0])));
    assert!(message.contains("result 0"), "{message}");
}

#[test]
fn collective_over_an_axis_that_is_not_manual() {
    let (op, message) =
        manual_error(|b| bad_single(b, "(model, _)", "(model, _)", |_, x| x.psum(&["data"])));
    assert_eq!(op, "psum");
    assert!(message.contains("`data` is not a manual axis"), "{message}");
}

#[test]
fn collective_outside_a_body() {
    let (op, message) =
        manual_error(|b| vec![b.parameter("x", vec![4], DType::F32).psum(&["model"])]);
    assert_eq!(op, "psum");
    assert!(message.contains("inside a shard_map body"), "{message}");
}

#[test]
fn manual_axis_not_in_the_mesh_and_spec_count() {
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
}

#[test]
fn annotation_inside_a_body() {
    let (_, message) = manual_error(|b| {
        bad_single(b, "(model, _)", "(model, _)", |_, x| {
            x.shard(spec("(_, _)"))
        })
    });
    assert!(
        message.contains("automatic axes are replicated inside"),
        "{message}"
    );
}
