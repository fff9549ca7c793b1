//! Backward reuse of gathered weights (`compile_with`, `GatherReuse`): the language
//! model's training step with its weights split over `data` (each all-gathered before
//! use), compiled keeping the forward gathers for the backward pass or gathering again,
//! run on the thread mesh and compared with the reference interpreter; the memory and
//! bytes it trades; the automatic choice under a memory limit; training losses.
//!
//! `cargo test --test gather_reuse -- --nocapture` prints the figures.

use gspmd::ir::{CollectiveKind, Literal, verify};
use gspmd::models::transformer::language_model;
use gspmd::prelude::*;
use gspmd::runtime::ThreadMesh;
use gspmd::train::{Optimizer, TrainStep, Trainer, step_program};
use gspmd::{CompileOptions, GatherReuse, compile_with};
use ndarray::{ArrayD, IxDyn};

/// The example language model's sizes (`examples/train_transformer.rs`, `small`).
fn dims() -> language_model::Dims {
    language_model::Dims {
        B: 16,
        S: 16,
        V: 16,
        D: 64,
        L: 2,
        H: 4,
        K: 16,
        F: 256,
    }
}

fn lm_step() -> (Program, TrainStep) {
    let model = language_model::trace(dims(), DType::F32, 0.0).unwrap();
    let trained = ["embed", "position", "layers.*", "unembed"];
    let step = step_program(&model, 0, &trained, &Optimizer::adamw(3e-3)).unwrap();
    (model, step)
}

/// Deterministic inputs of `program`: tokens below 8, every f32 input in (0.01, 0.11)
/// (positive scalars and second moments: no step divides by zero or takes a root of a
/// negative, and Adam's update is not the sign of a gradient near zero, which rounding
/// could flip).
fn inputs(program: &Program) -> Vec<Literal> {
    let values = program.params.iter().enumerate().map(|(k, &p)| {
        let ty = program.ty(p);
        let shape = IxDyn(&ty.shape);
        let n: usize = ty.shape.iter().product();
        let f = |i: usize| 0.01 + ((i * 2_654_435_761 + k * 97) % 1000) as f32 / 10_000.0;
        match ty.dtype {
            DType::I32 => {
                let tokens = (0..n).map(|i| ((i * 7 + k) % 8) as i32).collect();
                Literal::I32(ArrayD::from_shape_vec(shape, tokens).unwrap())
            }
            _ => Literal::F32(ArrayD::from_shape_vec(shape, (0..n).map(f).collect()).unwrap()),
        }
    });
    values.collect()
}

fn options(gathers: GatherReuse, memory_limit: Option<usize>) -> CompileOptions {
    CompileOptions {
        memory_limit,
        gathers,
        ..CompileOptions::default()
    }
}

fn all_gather_bytes(exe: &Executable) -> usize {
    exe.spmd()
        .collectives()
        .by_kind
        .get(&CollectiveKind::AllGather)
        .map_or(0, |&(_, bytes)| bytes)
}

/// Runs `exe` on its mesh and on the reference interpreter; every output within 1e-4.
fn assert_matches_reference(exe: &Executable, inputs: &[Literal], what: &str) {
    verify(&exe.spmd().program).unwrap_or_else(|e| panic!("{what}: {e}"));
    let threads = ThreadMesh::new(exe.spmd().mesh.clone()).unwrap();
    let comparisons = exe.compare_with_reference(&threads, inputs).unwrap();
    for (k, c) in comparisons.iter().enumerate() {
        assert!(c.within(1e-4), "{what}: output {k}: {c}");
    }
}

#[test]
fn regathered_step_matches_the_reference_and_trades_bytes_for_memory() {
    let (_, step) = lm_step();
    let given = inputs(&step.program);
    for shape in [[2, 4], [2, 1]] {
        let mesh = language_model::mesh(shape).unwrap();
        let keep = compile_with(&step.program, &mesh, &options(GatherReuse::Keep, None)).unwrap();
        let again =
            compile_with(&step.program, &mesh, &options(GatherReuse::Regather, None)).unwrap();
        let plan = again.gathers();
        assert!(!plan.choices.is_empty(), "{mesh}: no weight is gathered");
        assert_eq!(plan.regathered().count(), plan.choices.len());
        assert_eq!(keep.gathers().kept().count(), plan.choices.len());
        assert_matches_reference(&keep, &given, &format!("kept on {mesh}"));
        assert_matches_reference(&again, &given, &format!("regathered on {mesh}"));

        let (keep_peak, again_peak) = (
            keep.memory_analysis().peak_bytes,
            again.memory_analysis().peak_bytes,
        );
        let (keep_bytes, again_bytes) = (all_gather_bytes(&keep), all_gather_bytes(&again));
        println!(
            "LM step on {mesh}: keep: peak {keep_peak} B, all-gather {keep_bytes} B per step; \
             regather: peak {again_peak} B, all-gather {again_bytes} B per step\n{plan}"
        );
        assert!(
            again_bytes > keep_bytes,
            "{mesh}: {again_bytes} <= {keep_bytes}"
        );
        assert!(
            again_peak < keep_peak,
            "{mesh}: {again_peak} >= {keep_peak}"
        );
        let extra: usize = plan.choices.iter().map(|c| c.extra_bytes_received).sum();
        assert_eq!(again_bytes - keep_bytes, extra, "{mesh}");
        assert_eq!(
            (plan.peak, plan.peak_all_kept),
            (Some(again_peak), Some(keep_peak))
        );
        // Each copy sits right before its first user, and the forward gather no longer
        // has users after it.
        let program = &again.spmd().program;
        let users = program.users();
        for choice in &plan.choices {
            let copy = choice.regathered_at.unwrap();
            assert_eq!(
                users[copy.index()][0].index(),
                copy.index() + 1,
                "{choice:?}"
            );
            let forward = users[choice.value.index()].iter().max().unwrap();
            assert!(forward < &copy, "{choice:?}");
        }
        let summary = plan.to_string();
        let summary = summary.lines().next().unwrap();
        assert!(again.report().contains(summary), "{summary}");
        assert!(again.html().contains(r#"<section id="gathers">"#));
        assert!(again.html().contains(summary), "{summary}");
    }
}

#[test]
fn auto_regathers_until_the_peak_fits_the_limit() {
    let (_, step) = lm_step();
    let mesh = language_model::mesh([2, 4]).unwrap();
    let compile = |gathers, limit| compile_with(&step.program, &mesh, &options(gathers, limit));
    let keep_peak = compile(GatherReuse::Keep, None)
        .unwrap()
        .memory_analysis()
        .peak_bytes;
    let all_peak = (compile(GatherReuse::Regather, None)
        .unwrap()
        .memory_analysis())
    .peak_bytes;
    let limit = (keep_peak + all_peak) / 2;
    let auto = compile(GatherReuse::Auto, Some(limit)).unwrap();
    let plan = auto.gathers();
    println!("limit {limit} B:\n{plan}");
    assert_eq!(plan.fits(), Some(true), "{plan}");
    assert!(auto.memory_analysis().peak_bytes <= limit);
    assert!(plan.regathered().count() > 0, "{plan}");
    assert!(plan.kept().count() > 0, "{plan}");
    assert_eq!(plan.peak_all_kept, Some(keep_peak));
    let given = inputs(&step.program);
    assert_matches_reference(&auto, &given, "auto");
    // Deterministic: the same program again.
    let again = compile(GatherReuse::Auto, Some(limit)).unwrap();
    assert_eq!(again.spmd().program, auto.spmd().program);

    // A limit nothing can meet: no error, the lowest peak found, said so.
    let impossible = compile(GatherReuse::Auto, Some(0)).unwrap();
    let plan = impossible.gathers();
    assert_eq!(plan.fits(), Some(false));
    assert!(plan.peak.unwrap() <= all_peak, "{plan}");
    assert!(plan.to_string().contains("does not fit"), "{plan}");
    println!("limit 0 B:\n{plan}");
    assert_matches_reference(&impossible, &given, "auto under an impossible limit");
}

#[test]
fn keep_and_unlimited_auto_compile_as_compile_does() {
    let (_, step) = lm_step();
    let mesh = language_model::mesh([2, 4]).unwrap();
    let plain = gspmd::compile(&step.program, &mesh).unwrap();
    assert!(plain.gathers().regathered().count() == 0);
    assert_eq!(plain.gathers().kept().count(), 13);
    let report = plain.report();
    assert!(
        report.contains("gathered weights: 13 kept (99328 B per device held from forward to backward), 0 regathered"),
        "{}",
        plain.gathers()
    );
    for (gathers, limit) in [
        (GatherReuse::Keep, None),
        (GatherReuse::Auto, None),
        (GatherReuse::Keep, Some(0)),
        (GatherReuse::Auto, Some(usize::MAX)),
    ] {
        let exe = compile_with(&step.program, &mesh, &options(gathers, limit)).unwrap();
        assert_eq!(
            exe.spmd().program.to_string(),
            plain.spmd().program.to_string(),
            "{gathers:?}, limit {limit:?}"
        );
    }
}

#[test]
fn training_with_regathered_weights_gives_the_same_losses() {
    let (model, step) = lm_step();
    let mesh = language_model::mesh([2, 4]).unwrap();
    let given = inputs(&model);
    let data: Vec<Literal> = step.data.iter().map(|&i| given[i].clone()).collect();
    let initial: Vec<Literal> = (step.params.iter())
        .map(|p| given[p.input].clone())
        .collect();
    let losses = |gathers| {
        let options = options(gathers, None);
        let mut trainer =
            Trainer::on_mesh_with(step.clone(), mesh.clone(), initial.clone(), &options).unwrap();
        assert_eq!(trainer.executable().gathers().options.gathers, gathers);
        (0..3)
            .map(|_| trainer.step(&data).unwrap())
            .collect::<Vec<f32>>()
    };
    let (keep, again) = (losses(GatherReuse::Keep), losses(GatherReuse::Regather));
    println!("losses kept {keep:?}, regathered {again:?}");
    for (k, a) in keep.iter().zip(&again) {
        assert!((k - a).abs() <= 1e-6, "kept {keep:?}, regathered {again:?}");
    }
    assert!(keep[2] < keep[0], "the loss should fall: {keep:?}");
}
