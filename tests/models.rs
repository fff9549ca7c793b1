//! The library's models (the Transformer language model, the mixture of experts, the
//! U-Net denoiser): traced,
//! compiled for several meshes, run on threads and compared with the reference
//! interpreter, forward and gradient.

use gspmd::autodiff::grad;
use gspmd::compile;
use gspmd::ir::{CollectiveKind, Literal};
use gspmd::models::moe::moe_language_model;
use gspmd::models::mu_transformer::mu_transformer;
use gspmd::models::transformer::{LanguageModel, axlearn, language_model, rotary};
use gspmd::models::unet::denoise;
use gspmd::prelude::*;
use gspmd::runtime::{ThreadMesh, interpret};
use gspmd::train::{Optimizer, TrainStep, Trainer, step_program};
use ndarray::{ArrayD, IxDyn};

fn dims() -> language_model::Dims {
    language_model::Dims {
        B: 4,
        S: 6,
        V: 8,
        D: 16,
        L: 2,
        H: 4,
        K: 4,
        F: 32,
    }
}

/// [`dims()`] as the `Dims` struct `$dims` of another model with the LM's symbols.
macro_rules! dims_of {
    ($($dims:ident)::+) => {{
        let d = dims();
        $($dims)::+ {
            B: d.B,
            S: d.S,
            V: d.V,
            D: d.D,
            L: d.L,
            H: d.H,
            K: d.K,
            F: d.F,
        }
    }};
}

fn inputs(program: &Program) -> Vec<Literal> {
    program
        .params
        .iter()
        .enumerate()
        .map(|(k, &p)| {
            let ty = program.ty(p);
            let f = |i: usize| ((i * 2_654_435_761 + k * 97) % 1000) as f32 / 1000.0 - 0.5;
            let n: usize = ty.shape.iter().product();
            match ty.dtype {
                DType::I32 => Literal::I32(
                    ArrayD::from_shape_vec(
                        IxDyn(&ty.shape),
                        (0..n).map(|i| ((i * 7 + k) % 8) as i32).collect(),
                    )
                    .unwrap(),
                ),
                _ if k == 2 => Literal::F32(ArrayD::from_elem(IxDyn(&ty.shape), 1.0)),
                _ => Literal::F32(
                    ArrayD::from_shape_vec(IxDyn(&ty.shape), (0..n).map(f).collect()).unwrap(),
                ),
            }
        })
        .collect()
}

fn max_rel_diff(want: &Literal, got: &Literal) -> f32 {
    let (a, b) = (want.as_f32().unwrap(), got.as_f32().unwrap());
    let scale = a.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale
}

/// Compiles `program` for `mesh`, runs it on threads with `inputs` and asserts that
/// every output is within 1e-4 (relative to its largest magnitude, at least 1) of the
/// reference's `want`; returns the executable.
fn assert_matches(
    program: &Program,
    mesh: &Mesh,
    inputs: &[Literal],
    want: &[Literal],
) -> Executable {
    let exe = compile(program, mesh).unwrap();
    let threads = ThreadMesh::new(mesh.clone()).unwrap();
    let got = exe.run(&threads, inputs).unwrap();
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        let d = max_rel_diff(w, g);
        assert!(d < 1e-4, "{mesh}: output {k} differs by {d}");
    }
    exe
}

#[test]
fn language_model_and_its_gradient_match_the_reference_on_meshes() {
    // With dropout: every mesh draws the reference's masks from the key input.
    let forward = language_model::trace(dims(), DType::F32, 0.1).unwrap();
    // The weights, between the data and the key `rng`.
    let trained: Vec<usize> = (3..forward.params.len() - 1).collect();
    let program = grad(&forward, 0, &trained).unwrap();
    let inputs = inputs(&program);
    let want = interpret(&program, &inputs).unwrap();
    let loss = want[0].as_f32().unwrap().iter().next().copied().unwrap();
    assert!(
        (loss - (8f32).ln()).abs() < 0.5,
        "initial loss {loss} should be near ln(8)"
    );
    for (data, model) in [(1, 1), (2, 1), (1, 2), (2, 2), (2, 4)] {
        let mesh = language_model::mesh([data, model]).unwrap();
        assert_matches(&program, &mesh, &inputs, &want);
    }
}

/// The μ-Transformer (rotary attention scaled by 1/d_head, RMSNorm, the layers as one
/// `scan`) and its gradient on `rows` x `columns` x `planes` meshes: each splits the
/// batch, d_model or heads and FFN hidden, and together.
#[test]
fn mu_transformer_and_its_gradient_match_the_reference_on_3d_meshes() {
    let forward = mu_transformer::trace(dims_of!(mu_transformer::Dims)).unwrap();
    let scans = (forward.nodes.iter()).filter(|n| n.op.name() == "scan");
    assert_eq!(scans.count(), 1, "the layers are one scan");
    let trained: Vec<usize> = (3..forward.params.len()).collect();
    let program = grad(&forward, 0, &trained).unwrap();
    let inputs = inputs(&program);
    let want = interpret(&program, &inputs).unwrap();
    for shape in [[2, 1, 1], [1, 2, 1], [1, 1, 2], [2, 2, 2]] {
        let mesh = mu_transformer::mesh(shape).unwrap();
        assert_matches(&program, &mesh, &inputs, &want);
    }
}

/// The LM under axlearn's mesh rule (batch over `(data, fsdp)`, weights over `fsdp`
/// and `model`) trains on a 2x2x2 thread mesh as on the reference, from the LM's own
/// initial weights and to the LM's losses (with dropout: the same masks); its collectives are FSDP's: the weights
/// all-gathered over `fsdp`, their gradients reduce-scattered over `fsdp` and the
/// shards all-reduced over `data` (as many elements), and nothing gathered over `data`.
#[test]
fn axlearn_mesh_rule_trains_as_the_reference_with_fsdp_collectives() {
    const TRAINED: [&str; 4] = ["embed", "position", "layers.*", "unembed"];
    let sizes = axlearn::language_model::Dims {
        B: 8,
        ..dims_of!(axlearn::language_model::Dims)
    };
    let model = axlearn::language_model::trace(sizes, DType::F32, 0.1).unwrap();
    let adamw = Optimizer::adamw(1e-2);
    let step = step_program(&model, 0, &TRAINED, &adamw).unwrap();
    let init = axlearn::LanguageModel::initializer(3);
    assert_eq!(init, LanguageModel::initializer(3), "the LM's initialisers");
    let mesh = axlearn::language_model::mesh([2, 2, 2]).unwrap();
    let mut trainer = Trainer::on_mesh(step.clone(), mesh, init.clone()).unwrap();
    let mut reference = Trainer::reference(step, init.clone()).unwrap();
    let lm = language_model::trace(language_model::Dims { B: 8, ..dims() }, DType::F32, 0.1);
    let lm = lm.unwrap();
    let lm_step = step_program(&lm, 0, &TRAINED, &adamw).unwrap();
    let mut lm_reference = Trainer::reference(lm_step, init).unwrap();
    let data = inputs(&model)[..3].to_vec();
    for i in 0..3 {
        let (got, want) = (trainer.step(&data).unwrap(), reference.step(&data).unwrap());
        let lm_loss = lm_reference.step(&data).unwrap();
        let diff = (got - want).abs() / want.abs();
        assert!(
            diff <= 1e-5,
            "step {i}: {got} on the mesh, {want} on the reference"
        );
        assert_eq!(want, lm_loss, "step {i}: the LM's loss");
    }
    let spmd = trainer.executable().spmd();
    println!("{}", spmd.collectives());
    // The output sizes (elements per device) of the `kind` collectives over `axes`.
    let over = |kind: &str, axes: &[&str]| -> Vec<usize> {
        (spmd.program.nodes.iter())
            .filter(|n| n.op.name() == kind)
            .filter(|n| n.op.collective_group().is_some_and(|g| g.axes == axes))
            .map(|n| n.ty.shape.iter().product())
            .collect()
    };
    assert!(
        !over("all_gather", &["fsdp"]).is_empty(),
        "weights gathered over fsdp"
    );
    let scattered = over("reduce_scatter", &["fsdp"]);
    assert!(
        !scattered.is_empty(),
        "gradients reduce-scattered over fsdp"
    );
    let reduced: usize = over("all_reduce", &["data"]).iter().sum();
    let shards: usize = scattered.iter().sum();
    assert_eq!(reduced, shards, "the gradient shards all-reduced over data");
    assert!(
        over("all_gather", &["data"]).is_empty(),
        "nothing gathered over data"
    );
}

/// The language model's AdamW step training every weight (the parameters between the
/// data and the key `rng`), its data and initial weights.
fn lm_step(model: &Program) -> (TrainStep, Vec<Literal>, Vec<Literal>) {
    let weights = 3..model.params.len() - 1;
    let trained: Vec<usize> = weights.clone().collect();
    let step = step_program(model, 0, &trained, &Optimizer::adamw(1e-2)).unwrap();
    let given = inputs(model);
    (step, given[..3].to_vec(), given[weights].to_vec())
}

/// With dropout the 2x2 mesh draws the reference's masks (the trainer feeds both the
/// same key per step): its losses track the reference's, and differ from those without
/// dropout.
#[test]
fn language_model_dropout_draws_the_same_masks_on_a_mesh_as_the_reference() {
    let losses = |mut trainer: Trainer, data: &[Literal]| -> Vec<f32> {
        (0..4).map(|_| trainer.step(data).unwrap()).collect()
    };
    let model = language_model::trace(dims(), DType::F32, 0.2).unwrap();
    let (step, data, initial) = lm_step(&model);
    assert_eq!(step.rng, Some(model.params.len() - 1));
    let reference = losses(
        Trainer::reference(step.clone(), initial.clone()).unwrap(),
        &data,
    );
    let mesh = language_model::mesh([2, 2]).unwrap();
    let on_mesh = losses(
        Trainer::on_mesh(step, mesh, initial.clone()).unwrap(),
        &data,
    );
    for (got, want) in on_mesh.iter().zip(&reference) {
        assert!(
            (got - want).abs() <= 1e-5 * want.abs(),
            "{on_mesh:?} vs {reference:?}"
        );
    }
    let plain = language_model::trace(dims(), DType::F32, 0.0).unwrap();
    let (step, _, _) = lm_step(&plain);
    let without = losses(Trainer::reference(step, initial).unwrap(), &data);
    assert!(
        (without[0] - reference[0]).abs() > 1e-3,
        "dropout changed nothing: {without:?} vs {reference:?}"
    );
}

/// Mixed precision (bf16 activations, f32 master weights): the step program keeps the
/// weights f32 and computes the layers in bf16, and training on a 2x2 mesh reaches,
/// at the same step, a loss within 10% of f32 training's from the same start.
#[test]
fn bf16_training_of_the_language_model_tracks_f32() {
    const STEPS: usize = 40;
    let mesh = language_model::mesh([2, 2]).unwrap();
    let mut last = Vec::new();
    for compute in [DType::F32, DType::BF16] {
        let model = language_model::trace(dims(), compute, 0.0).unwrap();
        let (step, data, initial) = lm_step(&model);
        let narrow = (step.program.nodes.iter()).filter(|n| n.ty.dtype == DType::BF16);
        assert_eq!(narrow.count() > 0, compute == DType::BF16);
        let data = &data[..];
        let mut trainer = Trainer::on_mesh(step, mesh.clone(), initial).unwrap();
        let first = trainer.step(data).unwrap();
        let losses: Vec<f32> = (1..STEPS).map(|_| trainer.step(data).unwrap()).collect();
        let params = trainer.params().unwrap();
        assert!(params.iter().all(|(_, p)| p.dtype() == DType::F32));
        let loss = losses[STEPS - 2];
        assert!(
            loss < 0.5 * first,
            "{compute}: {first} -> {loss} did not learn"
        );
        last.push(loss);
    }
    let (f32_loss, bf16_loss) = (last[0], last[1]);
    println!("loss at step {STEPS}: f32 {f32_loss}, bf16 {bf16_loss}");
    assert!(
        (bf16_loss - f32_loss).abs() <= 0.1 * f32_loss,
        "bf16 loss {bf16_loss} vs f32 loss {f32_loss} at step {STEPS}"
    );
}

#[test]
fn unet_denoiser_and_its_gradient_match_the_reference_on_spatial_meshes() {
    let forward = denoise::trace(denoise::Dims { B: 2, H: 16, W: 8 }).unwrap();
    let trained: Vec<usize> = (2..forward.params.len()).collect();
    let program = grad(&forward, 0, &trained).unwrap();
    let inputs: Vec<Literal> = (program.params.iter().enumerate())
        .map(|(k, &p)| {
            let shape = &program.ty(p).shape;
            let n: usize = shape.iter().product();
            let f = |i: usize| ((i * 2_654_435_761 + k * 97) % 1000) as f32 / 2000.0 - 0.2;
            Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(f).collect()).unwrap())
        })
        .collect();
    let want = interpret(&program, &inputs).unwrap();
    for (data, space) in [(1, 2), (2, 2), (1, 4), (2, 4)] {
        let mesh = denoise::mesh([data, space]).unwrap();
        assert_matches(&program, &mesh, &inputs, &want);
    }
}

#[test]
fn mixture_of_experts_and_its_gradient_match_the_reference_with_all_to_all_dispatch() {
    let dims = moe_language_model::Dims {
        G: 8,
        S: 6,
        V: 8,
        M: 8,
        N: 2,
        K: 4,
        E: 4,
        H: 8,
    };
    // Capacity 2 of the 12 choices per group and 4 experts: some tokens are dropped.
    let forward = moe_language_model::trace(dims, 2).unwrap();
    let trained: Vec<usize> = (3..forward.params.len()).collect();
    let program = grad(&forward, 0, &trained).unwrap();
    let inputs = inputs(&program);
    let want = interpret(&program, &inputs).unwrap();
    let counts = want[1].as_f32().unwrap();
    assert_eq!(
        counts.sum(),
        8.0 * 6.0,
        "every token chooses one expert first"
    );
    for (data, expert) in [(1, 1), (2, 1), (1, 4), (2, 2), (2, 4)] {
        let mesh = moe_language_model::mesh([data, expert]).unwrap();
        let exe = assert_matches(&program, &mesh, &inputs, &want);
        if expert > 1 {
            // Dispatch and combine forward, and their mirror images backward.
            let forward_exe = compile(&forward, &mesh).unwrap();
            assert_eq!(
                forward_exe
                    .spmd()
                    .collectives()
                    .count(CollectiveKind::AllToAll),
                2,
                "{mesh}"
            );
            assert_eq!(
                exe.spmd().collectives().count(CollectiveKind::AllToAll),
                4,
                "{mesh}"
            );
            assert_eq!(
                exe.spmd().collectives().count(CollectiveKind::AllGather),
                0,
                "{mesh}"
            );
        }
    }
}

#[test]
fn rotary_positions_rotate_pairs_by_position_times_frequency() {
    let (b, h, s, k) = (1, 2, 5, 4);
    let builder = Builder::new("rotary");
    let x = builder.parameter("x", [b, h, s, k], DType::F32);
    let program = builder.finish(&[&rotary(&x)]).unwrap();
    let x = inputs(&program).remove(0);
    let got = interpret(&program, std::slice::from_ref(&x))
        .unwrap()
        .remove(0);
    let (x, got) = (x.as_f32().unwrap(), got.as_f32().unwrap());
    for (index, &value) in got.indexed_iter() {
        let (pos, i) = (index[2], index[3] % (k / 2));
        let angle = pos as f64 * 10000f64.powf(-2.0 * i as f64 / k as f64);
        let at = |j: usize| f64::from(x[[index[0], index[1], pos, j]]);
        let (x1, x2) = (at(i), at(i + k / 2));
        let want = if index[3] < k / 2 {
            x1 * angle.cos() - x2 * angle.sin()
        } else {
            x2 * angle.cos() + x1 * angle.sin()
        };
        assert!(
            (f64::from(value) - want).abs() < 1e-5,
            "{index:?}: {value} vs {want}"
        );
    }
}
