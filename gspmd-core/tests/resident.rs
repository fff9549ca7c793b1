//! Inputs and outputs that stay on the devices between runs (parameters across training
//! steps), per-device shards in and out, and their errors.

use gspmd_core::compile;
use gspmd_core::error::InputProblem;
use gspmd_core::ir::{Builder, DType, Literal};
use gspmd_core::runtime::shard_literal;
use gspmd_core::runtime::{Backend, Input, Output, ThreadMesh, Value, interpret};
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::{Error, Executable};
use ndarray::{ArrayD, IxDyn};

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

fn lit(shape: &[usize], seed: f32) -> Literal {
    let n: usize = shape.iter().product();
    Literal::F32(
        ArrayD::from_shape_vec(
            IxDyn(shape),
            (0..n).map(|i| (i as f32 * 0.3 + seed).cos()).collect(),
        )
        .unwrap(),
    )
}

fn mesh() -> Mesh {
    Mesh::with_device_order([("data", 2), ("model", 4)], vec![6, 1, 4, 3, 0, 7, 2, 5]).unwrap()
}

/// One "step": w' = w - 0.5 * (x^T x) @ w / 10 with w `(_, model)`, x `(data, _)`;
/// returns (loss = sum(x @ w), w').
fn step() -> (gspmd_core::ir::Program, Executable) {
    let b = Builder::new("step");
    let x = b
        .parameter("x", [6, 10], DType::F32)
        .annotate(s("(data, _)"));
    let w = b
        .parameter("w", [10, 7], DType::F32)
        .annotate(s("(_, model)"));
    let y = x.matmul(&w);
    let loss = y.sum(&[0, 1]);
    let g = x.transpose(&[1, 0]).matmul(&y) * 0.05;
    let w_new = (&w - &g).shard(s("(_, model)"));
    let p = b.finish(&[&loss, &w_new]).unwrap();
    let exe = compile(&p, &mesh()).unwrap();
    (p, exe)
}

#[test]
fn upload_fetch_round_trip_with_uneven_dims() {
    let threads = ThreadMesh::new(mesh()).unwrap();
    let v = lit(&[10, 7], 0.5);
    threads.upload("v", &v, &s("((model, data), _)")).unwrap();
    assert_eq!(threads.fetch("v").unwrap(), v);
    threads.remove("v").unwrap();
    assert!(threads.fetch("v").is_err());
}

#[test]
fn resident_parameters_across_steps_match_the_interpreter() {
    let (p, exe) = step();
    let threads = ThreadMesh::new(mesh()).unwrap();
    let mut w = lit(&[10, 7], 0.1);
    threads.upload("w", &w, &exe.spmd().inputs[1].1).unwrap();
    for k in 0..3 {
        let x = lit(&[6, 10], k as f32);
        let out = exe
            .execute(
                &threads,
                &[Input::Global(&x), Input::Resident("w")],
                &[Output::Global, Output::Resident("w".into())],
            )
            .unwrap();
        let want = interpret(&p, &[x.clone(), w.clone()]).unwrap();
        let Value::Global(loss) = &out[0] else {
            panic!("{out:?}")
        };
        let (a, b) = (loss.as_f32().unwrap(), want[0].as_f32().unwrap());
        assert!(
            (a.sum() - b.sum()).abs() < 1e-4 * b.sum().abs().max(1.0),
            "step {k}: {a} vs {b}"
        );
        assert_eq!(out[1], Value::Resident);
        w = want[1].clone();
        let got = threads.fetch("w").unwrap();
        let d = got
            .as_f32()
            .unwrap()
            .iter()
            .zip(w.as_f32().unwrap().iter())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(d < 1e-4, "step {k}: w differs by {d}");
    }
}

#[test]
fn shards_in_and_out_equal_the_global_path() {
    let (_, exe) = step();
    let threads = ThreadMesh::new(mesh()).unwrap();
    let (x, w) = (lit(&[6, 10], 1.0), lit(&[10, 7], 2.0));
    let global = exe.run(&threads, &[x.clone(), w.clone()]).unwrap();
    let m = mesh();
    let xs: Vec<Literal> = (0..8)
        .map(|d| shard_literal(&x, &exe.spmd().inputs[0].1, &m, d))
        .collect();
    let out = exe
        .execute(
            &threads,
            &[Input::Shards(&xs), Input::Global(&w)],
            &[Output::Global, Output::Shards],
        )
        .unwrap();
    assert_eq!(out[0], Value::Global(global[0].clone()));
    let Value::Shards(blocks) = &out[1] else {
        panic!()
    };
    for (d, block) in blocks.iter().enumerate() {
        assert_eq!(
            block,
            &shard_literal(&global[1], &exe.spmd().outputs[1].1, &m, d),
            "device {d}"
        );
    }
}

#[test]
fn a_resident_value_of_another_sharding_is_an_input_error() {
    let (_, exe) = step();
    let threads = ThreadMesh::new(mesh()).unwrap();
    threads
        .upload("w", &lit(&[10, 7], 0.0), &s("(model, _)"))
        .unwrap();
    let x = lit(&[6, 10], 0.0);
    let r = exe.execute(
        &threads,
        &[Input::Global(&x), Input::Resident("w")],
        &[Output::Global, Output::Global],
    );
    match r {
        Err(Error::Input {
            index: 1,
            problem: InputProblem::Resident { key, .. },
            ..
        }) => assert_eq!(key, "w"),
        other => panic!("{other:?}"),
    }
    let missing = exe.execute(
        &threads,
        &[Input::Global(&x), Input::Resident("nope")],
        &[Output::Global, Output::Global],
    );
    assert!(
        matches!(missing, Err(Error::Input { index: 1, .. })),
        "{missing:?}"
    );
    let bad_shards = exe.execute(
        &threads,
        &[Input::Shards(std::slice::from_ref(&x)), Input::Global(&x)],
        &[Output::Global, Output::Global],
    );
    assert!(
        matches!(bad_shards, Err(Error::Input { index: 0, .. })),
        "{bad_shards:?}"
    );
}

#[test]
fn a_failed_step_leaves_resident_values_unchanged() {
    let (_, exe) = step();
    let threads = ThreadMesh::new(mesh()).unwrap();
    let (x, w) = (lit(&[6, 10], 0.0), lit(&[10, 7], 3.0));
    threads.upload("w", &w, &exe.spmd().inputs[1].1).unwrap();
    threads.upload("x", &x, &exe.spmd().inputs[0].1).unwrap();
    // Device 3 loses `x`: it fails while the others run the step into a collective.
    threads
        .run(|ctx| {
            if ctx.device() == 3 {
                ctx.store_mut().remove("x");
            }
            Ok(())
        })
        .unwrap();
    let r = exe.execute(
        &threads,
        &[Input::Resident("x"), Input::Resident("w")],
        &[Output::Global, Output::Resident("w".into())],
    );
    assert!(r.is_err());
    assert_eq!(
        threads.fetch("w").unwrap(),
        w,
        "a failed step must not update any device"
    );
}

#[test]
fn an_unreduced_parameter_takes_only_per_device_partial_sums() {
    let b = Builder::new("partial");
    let x = b
        .parameter("x", [4, 4], DType::F32)
        .annotate(s("(_, _) unreduced={model}"));
    let y = x.shard(s("(_, _)"));
    let p = b.finish(&[&y]).unwrap();
    let exe = compile(&p, &mesh()).unwrap();
    let threads = ThreadMesh::new(mesh()).unwrap();
    let global = exe.run(&threads, &[lit(&[4, 4], 0.0)]);
    assert!(
        matches!(global, Err(Error::Input { index: 0, .. })),
        "{global:?}"
    );
    // Each device holds 1/4 of the value: the all-reduce over `model` sums 4 of them.
    let quarter = Literal::F32(lit(&[4, 4], 0.0).as_f32().unwrap().mapv(|v| v / 4.0));
    let shards = vec![quarter; 8];
    let out = exe
        .execute(&threads, &[Input::Shards(&shards)], &[Output::Global])
        .unwrap();
    let Value::Global(got) = &out[0] else {
        panic!()
    };
    let want = lit(&[4, 4], 0.0);
    let d = got
        .as_f32()
        .unwrap()
        .iter()
        .zip(want.as_f32().unwrap().iter())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(d < 1e-6, "{d}");
    assert!(
        threads
            .upload("x", &want, &s("(_, _) unreduced={model}"))
            .is_err()
    );
}

#[test]
fn a_mesh_whose_device_count_overflows_is_an_error() {
    assert!(Mesh::new([("a", usize::MAX), ("b", 2)]).is_err());
}
