//! Issue-5 acceptance: training steps as one program (forward, backward, optimizer
//! update), run on the thread mesh and compared with the reference interpreter step by
//! step; golden checks of the collectives a partitioned step needs; checkpoints.
//!
//! Tolerance of the differential tests: |got - want| <= 1e-4 * max(1, max |want|) for
//! the loss and every parameter, at every step (f32 sums in another order).

use gspmd_core::Error;
use gspmd_core::error::RequestProblem;
use gspmd_core::ir::{Builder, CollectiveKind, DType, Literal, Program, Tensor, einsum, verify};
use gspmd_core::partition::{CollectiveStats, SpmdProgram, partition};
use gspmd_core::runtime::{Loaded, ThreadMesh, sample_inputs, uniform_f32, uniform_i32};
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::simplify::{Stage, simplify};
use gspmd_core::train::{
    Adafactor, AdamW, Batch, Dataset, Init, Initializer, Mask, Optimizer, RNG, STEP_COUNT,
    Schedule, StepOptions, TrainStep, Trainer, chain, clip_by_global_norm, load_checkpoint,
    save_checkpoint, step_program, step_program_with,
};
use ndarray::{ArrayD, IxDyn};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use std::sync::Arc;

// ---- helpers -------------------------------------------------------------------------

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

fn f32s(shape: &[usize], data: &[f32]) -> Literal {
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap())
}

fn values(lit: &Literal) -> Vec<f32> {
    lit.as_f32().unwrap().iter().copied().collect()
}

fn assert_near(want: &[f32], got: &[f32], tol: f32, what: &str) {
    assert_eq!(want.len(), got.len(), "{what}: lengths");
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert!((w - g).abs() <= tol, "{what}[{i}]: want {w}, got {g}");
    }
}

/// The differential tolerance: 1e-4 relative to the largest magnitude (at least 1).
fn assert_close(want: &Literal, got: &Literal, what: &str) {
    let (w, g) = (values(want), values(got));
    let scale = w.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    assert_near(&w, &g, 1e-4 * scale, what);
}

fn meshes() -> Vec<Mesh> {
    vec![
        Mesh::new([("data", 1), ("model", 1)]).unwrap(),
        Mesh::new([("data", 1), ("model", 2)]).unwrap(),
        Mesh::new([("data", 2), ("model", 1)]).unwrap(),
        Mesh::new([("data", 2), ("model", 2)]).unwrap(),
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
    ]
}

fn sgd(lr: f32, momentum: f32) -> Optimizer {
    Optimizer::sgd(lr, momentum)
}

fn adamw(lr: f32, weight_decay: f32) -> Optimizer {
    AdamW {
        lr,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay,
        mask: Mask::All,
    }
    .into()
}

// ---- (a) single updates against hand-computed numbers ---------------------------------

/// `loss = mean((w - x)^2)` over 2 elements: `grad = w - x`.
fn tiny() -> Program {
    let b = Builder::new("tiny");
    let w = b.parameter("w", [2], DType::F32);
    let x = b.parameter("x", [2], DType::F32);
    let loss = w.mse(&x);
    b.finish(&[&loss]).unwrap()
}

const W0: [f32; 2] = [1.0, -2.0];
const X: [f32; 2] = [0.5, 1.0];

#[test]
fn step_program_layout() {
    let step = step_program(&tiny(), 0, &[0], &adamw(0.1, 0.1)).unwrap();
    let names: Vec<&str> = step
        .program
        .params
        .iter()
        .map(|&p| step.program.node(p).name.as_deref().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "w",
            "x",
            "m(w)",
            "v(w)",
            "bias_correction1",
            "bias_correction2",
            "learning_rate"
        ]
    );
    let outs: Vec<&str> = step
        .program
        .outputs
        .iter()
        .skip(1)
        .map(|&v| step.program.node(v).name.as_deref().unwrap())
        .collect();
    assert_eq!(outs, ["new(w)", "new(m(w))", "new(v(w))"]);
    assert_eq!(step.data, [1]);
    assert_eq!(step.scalars, [4, 5, 6]);
    let feedback: Vec<(usize, usize)> = step.feedback().collect();
    assert_eq!(feedback, [(1, 0), (2, 2), (3, 3)]);
}

#[test]
fn sgd_with_momentum_two_steps_by_hand() {
    let step = step_program(&tiny(), 0, &[0], &sgd(0.1, 0.9)).unwrap();
    let mut t = Trainer::reference(step, vec![f32s(&[2], &W0)]).unwrap();
    let x = f32s(&[2], &X);
    // Step 1: g = w - x = [0.5, -3]; loss = (0.25 + 9) / 2; b = g; w -= 0.1 b.
    let loss = t.step(std::slice::from_ref(&x)).unwrap();
    assert_near(&[4.625], &[loss], 1e-6, "loss 1");
    assert_near(
        &[0.95, -1.7],
        &values(&t.params().unwrap()[0].1),
        1e-6,
        "w after 1",
    );
    // Step 2: g = [0.45, -2.7]; b = 0.9 [0.5, -3] + g = [0.9, -5.4]; w -= 0.1 b.
    let loss = t.step(std::slice::from_ref(&x)).unwrap();
    assert_near(&[(0.45 * 0.45 + 2.7 * 2.7) / 2.0], &[loss], 1e-5, "loss 2");
    assert_near(
        &[0.86, -1.16],
        &values(&t.params().unwrap()[0].1),
        1e-6,
        "w after 2",
    );
    let ckpt = t.checkpoint().unwrap();
    assert_eq!(ckpt[1].0, "momentum(w)");
    assert_near(&[0.9, -5.4], &values(&ckpt[1].1), 1e-6, "momentum after 2");
}

#[test]
fn plain_sgd_has_no_state() {
    let step = step_program(&tiny(), 0, &[0], &sgd(0.5, 0.0)).unwrap();
    assert!(step.params[0].state.is_empty());
    // w, x and the learning rate.
    assert_eq!(step.program.params.len(), 3);
    let mut t = Trainer::reference(step, vec![f32s(&[2], &W0)]).unwrap();
    t.step(&[f32s(&[2], &X)]).unwrap();
    // w - 0.5 (w - x) = (w + x) / 2.
    assert_near(&[0.75, -0.5], &values(&t.params().unwrap()[0].1), 1e-6, "w");
}

/// The learning rate is an input of the step: one program trains under any schedule,
/// step `t` moving `w` by `lr * factor(t) * g`.
#[test]
fn a_schedule_sets_each_steps_learning_rate_without_rebuilding() {
    let step = step_program(&tiny(), 0, &[0], &sgd(0.5, 0.0)).unwrap();
    let schedule = Schedule::WarmupLinear {
        warmup: 2,
        total: 4,
        final_fraction: 0.2,
    };
    let mut t = Trainer::reference(step.clone(), vec![f32s(&[2], &W0)])
        .unwrap()
        .with_schedule(schedule)
        .unwrap();
    let x = f32s(&[2], &X);
    let mut w: Vec<f32> = W0.to_vec();
    for step_number in 1..=5 {
        let lr = 0.5 * schedule.factor(step_number);
        assert_eq!(t.learning_rate(), Some(lr));
        t.step(std::slice::from_ref(&x)).unwrap();
        for (w, x) in w.iter_mut().zip(X) {
            *w -= lr * (*w - x);
        }
        let got = values(&t.params().unwrap()[0].1);
        assert_near(&w, &got, 1e-6, &format!("w after step {step_number}"));
    }
    // Factors 0.5, 1, 0.6, 0.2, 0.2: warm-up, then down to the final fraction.
    assert_eq!(
        (1..=5).map(|t| schedule.factor(t)).collect::<Vec<_>>(),
        [0.5, 1.0, 0.6, 0.2, 0.2]
    );
    let bad = Schedule::WarmupCosine {
        warmup: 3,
        total: 2,
        final_fraction: 0.0,
    };
    let trainer = Trainer::reference(step, vec![f32s(&[2], &W0)]).unwrap();
    assert!(matches!(
        trainer.with_schedule(bad),
        Err(Error::Optimizer { .. })
    ));
}

/// Clipping by global norm: a gradient of norm above the limit is scaled down to it, one
/// below is kept, and a bad limit is a typed error.
#[test]
fn clipping_scales_the_gradients_to_the_global_norm() {
    let clip = |max: f32| chain([clip_by_global_norm(max), sgd(0.1, 0.0)]);
    // g = w - x = [0.5, -3]: norm sqrt(9.25) = 3.041.
    let norm = 9.25f32.sqrt();
    for (max, scale) in [(1.0, 1.0 / norm), (10.0, 1.0)] {
        let step = step_program(&tiny(), 0, &[0], &clip(max)).unwrap();
        let mut t = Trainer::reference(step, vec![f32s(&[2], &W0)]).unwrap();
        t.step(&[f32s(&[2], &X)]).unwrap();
        let want = [1.0 - 0.1 * 0.5 * scale, -2.0 + 0.1 * 3.0 * scale];
        assert_near(
            &want,
            &values(&t.params().unwrap()[0].1),
            1e-6,
            &format!("clip {max}"),
        );
    }
    for max in [0.0, -1.0, f32::NAN] {
        let e = step_program(&tiny(), 0, &[0], &clip(max));
        assert!(matches!(e, Err(Error::Optimizer { .. })), "{max}: {e:?}");
    }
}

/// AdamW as PyTorch defines it, in f64, one element at a time: (w, m, v) after step `t`.
fn adamw_reference(w: f64, m: f64, v: f64, g: f64, t: i32, lr: f64, wd: f64) -> [f64; 3] {
    let (b1, b2, eps) = (0.9, 0.999, 1e-8);
    let w = w * (1.0 - lr * wd);
    let m = b1 * m + (1.0 - b1) * g;
    let v = b2 * v + (1.0 - b2) * g * g;
    let m_hat = m / (1.0 - b1.powi(t));
    let v_hat = v / (1.0 - b2.powi(t));
    [w - lr * m_hat / (v_hat.sqrt() + eps), m, v]
}

#[test]
fn adamw_two_steps_by_hand() {
    let step = step_program(&tiny(), 0, &[0], &adamw(0.1, 0.1)).unwrap();
    let mut t = Trainer::reference(step, vec![f32s(&[2], &W0)]).unwrap();
    let x = f32s(&[2], &X);
    t.step(std::slice::from_ref(&x)).unwrap();
    // Step 1: g = [0.5, -3]; m_hat = g, v_hat = g^2, so the step is lr sign(g) (up to
    // eps); decay first: w (1 - 0.01) = [0.99, -1.98]. m = 0.1 g, v = 0.001 g^2.
    let ckpt = t.checkpoint().unwrap();
    assert_near(&[0.89, -1.88], &values(&ckpt[0].1), 1e-6, "w after 1");
    assert_near(&[0.05, -0.3], &values(&ckpt[1].1), 1e-7, "m after 1");
    // (f32 holds 1 - 0.999 as 0.00099999, 1.3e-5 relative off.)
    assert_near(
        &[0.00025, 0.009],
        &values(&ckpt[2].1),
        1e-4 * 0.009,
        "v after 1",
    );
    // Step 2 against the f64 formula.
    t.step(std::slice::from_ref(&x)).unwrap();
    let mut want = [[0.0f32; 2]; 3];
    for i in 0..2 {
        let (w1, m1, v1) = ([0.89, -1.88][i], [0.05, -0.3][i], [0.00025, 0.009][i]);
        let g = w1 - f64::from(X[i]);
        let r = adamw_reference(w1, m1, v1, g, 2, 0.1, 0.1);
        for k in 0..3 {
            want[k][i] = r[k] as f32;
        }
    }
    let ckpt = t.checkpoint().unwrap();
    for (k, what) in ["w", "m", "v"].iter().enumerate() {
        let got = values(&ckpt[k].1);
        let tol = 1e-4 * want[k].iter().fold(0.0f32, |a, x| a.max(x.abs()));
        assert_near(&want[k], &got, tol, &format!("{what} after 2"));
    }
    assert_eq!(ckpt[3].0, STEP_COUNT);
    assert_eq!(ckpt[3].1, Literal::full(&[], DType::I32, 2.0));
}

#[test]
fn bad_requests_are_typed_errors() {
    let p = tiny();
    assert!(matches!(
        step_program(&p, 0, &[0], &sgd(-1.0, 0.0)),
        Err(Error::Optimizer { .. })
    ));
    assert!(matches!(
        step_program(
            &p,
            0,
            &[0],
            &AdamW {
                beta1: 1.5,
                ..AdamW::new(0.1)
            }
            .into()
        ),
        Err(Error::Optimizer { .. })
    ));
    assert!(matches!(
        step_program(&p, 0, &[] as &[usize], &sgd(0.1, 0.0)),
        Err(Error::TrainRequest { .. })
    ));
    assert!(matches!(
        step_program(&p, 0, &[0, 0], &sgd(0.1, 0.0)),
        Err(Error::TrainRequest { .. })
    ));
    assert!(matches!(
        step_program(&p, 0, &[7], &sgd(0.1, 0.0)),
        Err(Error::GradRequest { .. })
    ));
    let step = step_program(&p, 0, &[0], &sgd(0.1, 0.0)).unwrap();
    assert!(matches!(
        Trainer::reference(step.clone(), vec![f32s(&[3], &[0.0; 3])]),
        Err(Error::TrainerInput { .. })
    ));
    let mut t = Trainer::reference(step, vec![f32s(&[2], &W0)]).unwrap();
    assert!(matches!(t.step(&[]), Err(Error::TrainerInput { .. })));
    assert!(matches!(
        t.step(&[f32s(&[3], &[0.0; 3])]),
        Err(Error::Input { .. })
    ));
    // A failed step changes nothing.
    assert_eq!(t.steps_done(), 0);
    assert_eq!(values(&t.params().unwrap()[0].1), W0);
}

// ---- (b) training on meshes against the interpreter -------------------------------------

/// A model, the parameters to train with their initial values, and the data of each
/// step (the same every step).
struct Problem {
    model: Program,
    trained: Vec<usize>,
    initial: Vec<Literal>,
    data: Vec<Literal>,
}

/// Megatron MLP: `mse(relu(x w1) w2, target)` with `x: [batch, 16]`.
fn megatron(rng: &mut Xoshiro256PlusPlus, batch: usize) -> Problem {
    let (d, f) = (16, 32);
    let b = Builder::new("megatron");
    let x = b
        .parameter("x", [batch, d], DType::F32)
        .annotate(s("(data, _)"));
    let w1 = b
        .parameter("w1", [d, f], DType::F32)
        .annotate(s("(_, model)"));
    let w2 = b
        .parameter("w2", [f, d], DType::F32)
        .annotate(s("(model, _)"));
    let target = b
        .parameter("target", [batch, d], DType::F32)
        .annotate(s("(data, _)"));
    let loss = x.matmul(&w1).relu().matmul(&w2).mse(&target);
    Problem {
        model: b.finish(&[&loss]).unwrap(),
        trained: vec![1, 2],
        initial: vec![
            uniform_f32(rng, &[d, f], -0.5, 0.5),
            uniform_f32(rng, &[f, d], -0.3, 0.3),
        ],
        data: vec![
            uniform_f32(rng, &[batch, d], -1.0, 1.0),
            uniform_f32(rng, &[batch, d], -1.0, 1.0),
        ],
    }
}

/// One-hot of i32 `ids` `[b, s]` over `n` classes: `[b, s, n]` f32.
fn one_hot(ids: &Tensor, n: usize) -> Tensor {
    let (bsz, seq) = (ids.shape()[0], ids.shape()[1]);
    let classes = ids.builder().iota([bsz, seq, n], 2, DType::I32);
    let ids = ids.broadcast_in_dim([bsz, seq, n], &[0, 1]);
    classes.eq(&ids).convert(DType::F32)
}

/// A one-layer Transformer: token embedding (one-hot matmul), self-attention with heads
/// on `model`, layer norm with a learned scale, a GELU FFN with its hidden dim on
/// `model`, and cross-entropy over the vocabulary.
fn transformer(rng: &mut Xoshiro256PlusPlus) -> Problem {
    let (bsz, seq, vocab, m, heads, hd, f) = (4, 8, 16, 8, 4, 2, 16);
    let b = Builder::new("transformer");
    let tokens = b
        .parameter("tokens", [bsz, seq], DType::I32)
        .annotate(s("(data, _)"));
    let labels = b
        .parameter("labels", [bsz, seq], DType::I32)
        .annotate(s("(data, _)"));
    let emb = b
        .parameter("emb", [vocab, m], DType::F32)
        .annotate(s("(_, _)"));
    let wq = b
        .parameter("wq", [m, heads, hd], DType::F32)
        .annotate(s("(_, model, _)"));
    let wk = b
        .parameter("wk", [m, heads, hd], DType::F32)
        .annotate(s("(_, model, _)"));
    let wv = b
        .parameter("wv", [m, heads, hd], DType::F32)
        .annotate(s("(_, model, _)"));
    let wo = b
        .parameter("wo", [heads, hd, m], DType::F32)
        .annotate(s("(model, _, _)"));
    let ln_scale = b.parameter("ln_scale", [m], DType::F32);
    let w1 = b
        .parameter("w1", [m, f], DType::F32)
        .annotate(s("(_, model)"));
    let w2 = b
        .parameter("w2", [f, m], DType::F32)
        .annotate(s("(model, _)"));
    let unembed = b.parameter("unembed", [m, vocab], DType::F32);

    let x = einsum("bsv,vm->bsm", &one_hot(&tokens, vocab), &emb).shard(s("(data, _, _)"));
    let q = einsum("bsm,mhd->bshd", &x, &wq);
    let k = einsum("bsm,mhd->bshd", &x, &wk);
    let v = einsum("bsm,mhd->bshd", &x, &wv);
    let probs = (einsum("bqhd,bkhd->bhqk", &q, &k) * (1.0 / (hd as f32).sqrt())).softmax(-1);
    let attn = einsum("bqhd,hdm->bqm", &einsum("bhqk,bkhd->bqhd", &probs, &v), &wo);
    let h = (&x + &attn).layer_norm(-1, 1e-5) * &ln_scale;
    let ffn = einsum("bsm,mf->bsf", &h, &w1)
        .shard(s("(data, _, model)"))
        .gelu();
    let h = &h + &einsum("bsf,fm->bsm", &ffn, &w2);
    let logits = einsum("bsm,mv->bsv", &h, &unembed);
    let loss = logits.cross_entropy_with_logits(&labels);
    let ones = f32s(&[m], &[1.0; 8]);
    Problem {
        model: b.finish(&[&loss]).unwrap(),
        trained: (2..11).collect(),
        initial: vec![
            uniform_f32(rng, &[vocab, m], -1.0, 1.0),
            uniform_f32(rng, &[m, heads, hd], -0.5, 0.5),
            uniform_f32(rng, &[m, heads, hd], -0.5, 0.5),
            uniform_f32(rng, &[m, heads, hd], -0.5, 0.5),
            uniform_f32(rng, &[heads, hd, m], -0.5, 0.5),
            ones,
            uniform_f32(rng, &[m, f], -0.5, 0.5),
            uniform_f32(rng, &[f, m], -0.3, 0.3),
            uniform_f32(rng, &[m, vocab], -0.5, 0.5),
        ],
        data: vec![
            uniform_i32(rng, &[bsz, seq], 0, vocab as i32),
            uniform_i32(rng, &[bsz, seq], 0, vocab as i32),
        ],
    }
}

const STEPS: usize = 5;

/// Trains `problem` for [`STEPS`] steps on the interpreter and on every mesh; compares
/// the loss and every parameter after every step; checks that the loss decreases.
fn train_everywhere(problem: &Problem, optimizer: Optimizer) {
    let step = step_program(&problem.model, 0, &problem.trained, &optimizer).unwrap();
    train_step_everywhere(problem, step, Schedule::Constant);
}

/// Trains `step` on the reference and on every mesh with `schedule` and compares the
/// loss and parameters step by step.
fn train_step_everywhere(problem: &Problem, step: TrainStep, schedule: Schedule) {
    let reference = Trainer::reference(step.clone(), problem.initial.clone()).unwrap();
    let mut reference = reference.with_schedule(schedule).unwrap();
    let mut want = Vec::new();
    for _ in 0..STEPS {
        let loss = reference.step(&problem.data).unwrap();
        let params: Vec<Literal> = reference
            .params()
            .unwrap()
            .into_iter()
            .map(|p| p.1)
            .collect();
        want.push((loss, params));
    }
    let losses: Vec<f32> = want.iter().map(|w| w.0).collect();
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "{}: loss does not decrease: {losses:?}",
        problem.model.name
    );
    println!("{}: losses {losses:?}", problem.model.name);
    for mesh in meshes() {
        let mut t = Trainer::on_mesh(step.clone(), mesh.clone(), problem.initial.clone())
            .and_then(|t| t.with_schedule(schedule))
            .unwrap_or_else(|e| panic!("{} on {mesh}: {e}", problem.model.name));
        println!("{mesh}:\n{}", t.executable().spmd().collectives());
        for (i, (loss, params)) in want.iter().enumerate() {
            let what = format!("{} on {mesh}, step {}", problem.model.name, i + 1);
            let got = t
                .step(&problem.data)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_near(&[*loss], &[got], 1e-4 * loss.abs().max(1.0), &what);
            for ((name, got), want) in t.params().unwrap().iter().zip(params) {
                assert_close(want, got, &format!("{what}: {name}"));
            }
        }
    }
}

#[test]
fn megatron_mlp_trains_like_the_interpreter_sgd() {
    train_everywhere(
        &megatron(&mut Xoshiro256PlusPlus::seed_from_u64(1), 8),
        sgd(0.05, 0.9),
    );
}

#[test]
fn megatron_mlp_trains_like_the_interpreter_adamw() {
    train_everywhere(
        &megatron(&mut Xoshiro256PlusPlus::seed_from_u64(2), 8),
        adamw(0.01, 0.01),
    );
}

/// A warm-up/cosine schedule and clipping on the Megatron MLP: the partitioned step
/// (clipping's sum of squares is a partial sum per device) follows the interpreter.
#[test]
fn megatron_mlp_trains_like_the_interpreter_with_schedule_and_clipping() {
    let problem = megatron(&mut Xoshiro256PlusPlus::seed_from_u64(5), 8);
    let clipped = chain([clip_by_global_norm(0.5), adamw(0.05, 0.01)]);
    let step = step_program(&problem.model, 0, &problem.trained, &clipped);
    let schedule = Schedule::WarmupCosine {
        warmup: 2,
        total: 5,
        final_fraction: 0.1,
    };
    train_step_everywhere(&problem, step.unwrap(), schedule);
}

/// Gradient accumulation over 2 microbatches of 4 rows trains like one batch of 8 (the
/// loss is a mean, so the mean of the microbatch losses is the batch's), on the
/// reference, and partitioned on every mesh like the reference.
#[test]
fn accumulating_two_microbatches_trains_like_one_batch() {
    let full = megatron(&mut Xoshiro256PlusPlus::seed_from_u64(6), 8);
    let micro_model = megatron(&mut Xoshiro256PlusPlus::seed_from_u64(0), 4).model;
    let split = |lit: &Literal| {
        let a = lit.as_f32().unwrap();
        let shape: Vec<usize> = [2, 4]
            .into_iter()
            .chain(a.shape()[1..].iter().copied())
            .collect();
        Literal::F32(a.to_shape(IxDyn(&shape)).unwrap().to_owned())
    };
    let micro = Problem {
        model: micro_model,
        trained: full.trained.clone(),
        initial: full.initial.clone(),
        data: full.data.iter().map(split).collect(),
    };
    let options = StepOptions {
        accumulate: Some(2),
        ..StepOptions::default()
    };
    let optimizer = adamw(0.01, 0.01);
    let whole = step_program(&full.model, 0, &full.trained, &optimizer).unwrap();
    let accumulated =
        step_program_with(&micro.model, 0, &micro.trained, &optimizer, &options).unwrap();
    let mut a = Trainer::reference(whole, full.initial.clone()).unwrap();
    let mut b = Trainer::reference(accumulated.clone(), micro.initial.clone()).unwrap();
    for i in 1..=3 {
        let (la, lb) = (a.step(&full.data).unwrap(), b.step(&micro.data).unwrap());
        assert_near(&[la], &[lb], 1e-5 * la.abs().max(1.0), &format!("loss {i}"));
        for ((name, pa), (_, pb)) in a.params().unwrap().iter().zip(&b.params().unwrap()) {
            assert_close(pa, pb, &format!("{name} after step {i}"));
        }
    }
    train_step_everywhere(&micro, accumulated, Schedule::Constant);
    let bad = StepOptions {
        accumulate: Some(0),
        ..StepOptions::default()
    };
    let e = step_program_with(&micro.model, 0, &micro.trained, &optimizer, &bad);
    assert!(matches!(e, Err(Error::TrainRequest { .. })), "{e:?}");
}

#[test]
fn transformer_trains_like_the_interpreter_adamw() {
    train_everywhere(
        &transformer(&mut Xoshiro256PlusPlus::seed_from_u64(3)),
        adamw(0.01, 0.01),
    );
}

// ---- (c), (d) golden: the collectives of a partitioned step -----------------------------

/// The collectives of a per-device program: (kind, axes, elements of the local operand),
/// sorted.
fn collectives(spmd: &SpmdProgram) -> Vec<(&'static str, String, usize)> {
    let p = &spmd.program;
    let mut list: Vec<_> = p
        .nodes
        .iter()
        .filter(|n| n.op.is_collective())
        .map(|n| {
            let group = n.op.collective_group().expect("a collective has a group");
            let axes = group.axes.join(",");
            let elements = p.ty(n.operands[0]).shape.iter().product();
            (n.op.name(), axes, elements)
        })
        .collect();
    list.sort();
    list
}

/// The sharding propagation gave the node named `name`.
fn sharding_of(program: &Program, name: &str) -> String {
    let node = program
        .nodes
        .iter()
        .find(|n| n.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no value named {name}"));
    node.sharding.as_ref().unwrap().to_string()
}

/// GSPMD's Megatron step on a `data x model` mesh, for `x: [batch, 16]`, `w1: [16, 32]`.
/// Derivation, with `a = |data|`, `m = |model|`:
/// - forward: `x w1` contracts the replicated `D`: no collective; `h w2` contracts `F`,
///   split on `model` in both operands: a partial sum, all-reduced over `model` into
///   the `(data, _)` output, `[batch/a, 16]`; the loss sums a `(data, _)` tensor: an
///   all-reduce over `data` of a scalar;
/// - backward: `dy` is `(data, _)` like `y`; `dh = dy w2^T` contracts the replicated
///   `D`: no collective; the weight gradients `h^T dy` and `x^T dh` contract the batch,
///   split on `data` in both operands: each a partial sum all-reduced over `data`, of
///   the local gradient `16 * 32 / m` elements; nothing else needs communication
///   (`relu`'s mask is `(data, model)` like `dh`);
/// - the update and the optimizer state are sharded like each weight: elementwise, no
///   collective;
/// - the three all-reduces over `data` (the loss and the two weight gradients) are
///   independent: the combiner makes them one of their elements flattened.
fn expected_megatron(batch: usize, a: usize, m: usize) -> Vec<(&'static str, String, usize)> {
    let mut want = vec![
        ("all_reduce", "model".to_string(), batch / a * 16),
        ("all_reduce", "data".to_string(), 1 + 2 * (16 * 32 / m)),
    ];
    want.sort();
    want
}

fn check_megatron_step(batch: usize) {
    let p = megatron(&mut Xoshiro256PlusPlus::seed_from_u64(4), batch);
    let step = step_program(&p.model, 0, &p.trained, &adamw(0.01, 0.01)).unwrap();
    for (a, m) in [(2, 2), (2, 4)] {
        let mesh = Mesh::new([("data", a), ("model", m)]).unwrap();
        let exe = gspmd_core::compile(&step.program, &mesh).unwrap();
        // The gradient keeps the weight's sharding, and so do the new weight and state.
        assert_eq!(sharding_of(exe.propagated(), "grad(w1)"), "(_, model)");
        for name in ["new(w1)", "m(w1)", "v(w1)", "new(m(w1))", "new(v(w1))"] {
            assert_eq!(sharding_of(exe.propagated(), name), "(_, model)", "{name}");
        }
        assert_eq!(
            collectives(exe.spmd()),
            expected_megatron(batch, a, m),
            "batch {batch} on {mesh}:\n{}",
            exe.spmd().report()
        );
    }
}

#[test]
fn golden_megatron_step_only_all_reduces_gradients_over_data() {
    check_megatron_step(32);
}

/// The same at batch 8, where the activations are smaller than the weights.
#[test]
fn golden_megatron_step_at_small_batch() {
    check_megatron_step(8);
}

/// GSPMD's weight-update sharding (paper section 3.4 and ZeRO): a weight `(data, model)`
/// used by a layer whose activations are `(data, _)`. The forward pass all-gathers the
/// weight (its `data` split must go: the activations use `data` for the batch); the
/// weight gradient, a partial sum over the batch (`data`), is reduce-scattered over
/// `data` straight into the weight's sharding, never all-reduced whole.
#[test]
fn golden_weight_update_sharding() {
    let b = Builder::new("zero");
    let x = b
        .parameter("x", [8, 16], DType::F32)
        .annotate(s("(data, _)"));
    let w = b
        .parameter("w", [16, 8], DType::F32)
        .annotate(s("(data, model)"));
    let t = b
        .parameter("target", [8, 8], DType::F32)
        .annotate(s("(data, _)"));
    let loss = x.matmul(&w).shard(s("(data, _)")).mse(&t);
    let model = b.finish(&[&loss]).unwrap();
    let step = step_program(&model, 0, &[1], &adamw(0.01, 0.0)).unwrap();
    for (a, m) in [(2, 2), (2, 4), (4, 2)] {
        let mesh = Mesh::new([("data", a), ("model", m)]).unwrap();
        let exe = gspmd_core::compile(&step.program, &mesh).unwrap();
        let report = exe.spmd().report();
        let stats = exe.spmd().collectives();
        assert!(
            stats.count(CollectiveKind::AllGather) >= 1,
            "{mesh}:\n{report}"
        );
        assert!(
            stats.count(CollectiveKind::ReduceScatter) >= 1,
            "{mesh}:\n{report}"
        );
        // No all-reduce of a weight-sized block: neither the full weight nor its
        // model-split part (the gradient before a data split) is all-reduced.
        let weight_sized = [16 * 8, 16 * 8 / m];
        for (kind, axes, elements) in collectives(exe.spmd()) {
            assert!(
                !(kind == "all_reduce" && weight_sized.contains(&elements)),
                "{mesh}: all_reduce over {axes} of {elements} elements:\n{report}"
            );
        }
        assert_eq!(sharding_of(exe.propagated(), "grad(w)"), "(data, model)");
        assert_eq!(sharding_of(exe.propagated(), "m(w)"), "(data, model)");
    }
}

/// A step of `layers` (weights of those shapes, each annotated `weights`, tanh between),
/// batch over `data`, trained by SGD.
fn mlp_step(layers: &[[usize; 2]], weights: &str) -> Program {
    let b = Builder::new("mlp_step");
    let mut h = b
        .parameter("x", [16, layers[0][0]], DType::F32)
        .annotate(s("(data, _)"));
    for (i, &shape) in layers.iter().enumerate() {
        let w = b.parameter(&format!("w{i}"), shape, DType::F32);
        h = h.matmul(&w.annotate(s(weights)));
        if i + 1 < layers.len() {
            h = h.tanh();
        }
    }
    let out = layers[layers.len() - 1][1];
    let t = b
        .parameter("target", [16, out], DType::F32)
        .annotate(s("(data, _)"));
    let model = b.finish(&[&h.mse(&t)]).unwrap();
    let trained: Vec<usize> = (1..=layers.len()).collect();
    step_program(&model, 0, &trained, &sgd(0.1, 0.0))
        .unwrap()
        .program
}

/// Compiles `step` for `mesh` and partitions and simplifies it again without combining;
/// checks that the combined program verifies, runs bitwise like the uncombined one and
/// receives the same bytes, and returns both collective counts (uncombined, combined).
fn combined_and_not(step: &Program, mesh: &Mesh) -> (CollectiveStats, CollectiveStats) {
    let exe = gspmd_core::compile(step, mesh).unwrap();
    let mut uncombined = partition(exe.propagated(), mesh).unwrap();
    uncombined.program = simplify(&uncombined.program, Stage::Sharded).unwrap();
    verify(&exe.spmd().program).unwrap();
    let (before, after) = (uncombined.collectives(), exe.spmd().collectives());
    assert_eq!(
        after.bytes(),
        before.bytes(),
        "{mesh}:\n{}",
        exe.spmd().report()
    );
    let inputs = sample_inputs(step, 7);
    let threads = ThreadMesh::new(mesh.clone()).unwrap();
    let want = Arc::new(Loaded::new(uncombined))
        .run(&threads, &inputs)
        .unwrap();
    assert_eq!(exe.run(&threads, &inputs).unwrap(), want, "{mesh}");
    (before, after)
}

/// A data-parallel MLP step (batch over `data`, four replicated weights): the four
/// weight-gradient all-reduces (and the loss's) are independent, so the combiner makes
/// them one all-reduce of the same bytes, and the step computes bitwise what it computes
/// uncombined (every element is summed in the same order).
#[test]
fn golden_data_parallel_gradients_are_one_combined_all_reduce() {
    let step = mlp_step(&[[8, 16], [16, 16], [16, 16], [16, 4]], "(_, _)");
    for mesh in [
        Mesh::new([("data", 4)]).unwrap(),
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
    ] {
        let (before, after) = combined_and_not(&step, &mesh);
        assert_eq!(before.count(CollectiveKind::AllReduce), 5, "{mesh}");
        assert_eq!(
            (after.count(CollectiveKind::AllReduce), after.total()),
            (1, 1),
            "{mesh}"
        );
    }
}

/// Weight-update sharding (weights split over `data` like the batch): the forward's
/// weight all-gathers are independent of each other, and so are the weight gradients'
/// reduce-scatters: one of each, bitwise equal.
#[test]
fn golden_sharded_weights_gather_and_reduce_scatter_once_each() {
    let step = mlp_step(&[[8, 16], [16, 16], [16, 4]], "(data, _)");
    let mesh = Mesh::new([("data", 4)]).unwrap();
    let (before, after) = combined_and_not(&step, &mesh);
    assert!(before.count(CollectiveKind::AllGather) >= 3, "{before}");
    assert!(before.count(CollectiveKind::ReduceScatter) >= 2, "{before}");
    assert_eq!(after.count(CollectiveKind::AllGather), 1, "{after}");
    assert_eq!(after.count(CollectiveKind::ReduceScatter), 1, "{after}");
}

// ---- checkpoints -------------------------------------------------------------------------

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "gspmd_train_{}_{name}.safetensors",
        std::process::id()
    ))
}

#[test]
fn checkpoint_round_trip() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
    let tensors = vec![
        ("w1".to_string(), uniform_f32(&mut rng, &[3, 4], -2.0, 2.0)),
        (
            "m(w1)".to_string(),
            uniform_f32(&mut rng, &[3, 4], -1e-3, 1e-3),
        ),
        (
            "tokens".to_string(),
            uniform_i32(&mut rng, &[2, 5], 0, 1000),
        ),
        (
            "mask".to_string(),
            Literal::Bool(ArrayD::from_shape_vec(IxDyn(&[3]), vec![true, false, true]).unwrap()),
        ),
        ("a.scalar".to_string(), Literal::scalar_f32(-0.25)),
        (STEP_COUNT.to_string(), Literal::full(&[], DType::I32, 7.0)),
    ];
    let path = temp_path("round_trip");
    save_checkpoint(&path, &tensors).unwrap();
    let loaded = load_checkpoint(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded, tensors);
}

#[test]
fn checkpoint_errors() {
    let path = temp_path("errors");
    let twice = vec![
        ("a".to_string(), Literal::scalar_f32(1.0)),
        ("a".to_string(), Literal::scalar_f32(2.0)),
    ];
    assert!(matches!(
        save_checkpoint(&path, &twice),
        Err(Error::Checkpoint { .. })
    ));
    assert!(matches!(
        load_checkpoint(temp_path("does_not_exist")),
        Err(Error::Checkpoint { .. })
    ));
    // A file written by another tool: f64 is not supported.
    let data = 1.5f64.to_le_bytes();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F64, vec![1], &data).unwrap();
    safetensors::serialize_to_file([("x", view)], None, &path).unwrap();
    let err = load_checkpoint(&path);
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(err, Err(Error::Checkpoint { .. })), "{err:?}");
}

#[test]
fn resuming_from_a_checkpoint_continues_training() {
    let p = megatron(&mut Xoshiro256PlusPlus::seed_from_u64(6), 8);
    let step = step_program(&p.model, 0, &p.trained, &adamw(0.01, 0.01)).unwrap();
    let mesh = Mesh::new([("data", 2), ("model", 2)]).unwrap();
    let mut first = Trainer::on_mesh(step.clone(), mesh.clone(), p.initial.clone()).unwrap();
    for _ in 0..2 {
        first.step(&p.data).unwrap();
    }
    let path = temp_path("resume");
    first.save(&path).unwrap();

    // A fresh trainer from other initial values, restored from the file.
    let other: Vec<Literal> = p
        .initial
        .iter()
        .map(|l| Literal::full(&l.shape(), DType::F32, 0.5))
        .collect();
    let mut resumed = Trainer::on_mesh(step, mesh, other).unwrap();
    resumed.load(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(resumed.steps_done(), 2);
    assert_eq!(resumed.checkpoint().unwrap(), first.checkpoint().unwrap());
    for _ in 0..2 {
        // The same program on bit-identical inputs: the same loss, bit for bit.
        assert_eq!(resumed.step(&p.data).unwrap(), first.step(&p.data).unwrap());
    }
    assert_eq!(resumed.checkpoint().unwrap(), first.checkpoint().unwrap());

    // A checkpoint missing a state tensor is refused and changes nothing.
    let mut partial = first.checkpoint().unwrap();
    partial.retain(|(name, _)| name != "v(w2)");
    let before = resumed.checkpoint().unwrap();
    assert!(matches!(
        resumed.restore(&partial),
        Err(Error::TrainerInput { name, .. }) if name == "v(w2)"
    ));
    assert_eq!(resumed.checkpoint().unwrap(), before);
}

// ---- (c) parameters by name, weight-decay masks, Adafactor --------------------------

/// `loss = mse(x w + b, target)` with `x: [8, 16]` split over `data`, `w: [16, 8]` over
/// both axes and `b: [8]` over `model`; parameters named as a tree (`dense.w`,
/// `dense.bias`).
fn dense(rng: &mut Xoshiro256PlusPlus) -> Problem {
    let (batch, d, f) = (8, 16, 8);
    let b = Builder::new("dense");
    let x = b
        .parameter("x", [batch, d], DType::F32)
        .annotate(s("(data, _)"));
    let w = b
        .parameter("dense.w", [d, f], DType::F32)
        .annotate(s("(data, model)"));
    let bias = b
        .parameter("dense.bias", [f], DType::F32)
        .annotate(s("(model)"));
    let target = b
        .parameter("target", [batch, f], DType::F32)
        .annotate(s("(data, _)"));
    let y = &x.matmul(&w) + &bias.broadcast_in_dim([batch, f], &[1]);
    let loss = y.mse(&target);
    Problem {
        model: b.finish(&[&loss]).unwrap(),
        trained: vec![1, 2],
        initial: vec![
            uniform_f32(rng, &[d, f], -0.5, 0.5),
            uniform_f32(rng, &[f], -0.5, 0.5),
        ],
        data: vec![
            uniform_f32(rng, &[batch, d], -1.0, 1.0),
            uniform_f32(rng, &[batch, f], -1.0, 1.0),
        ],
    }
}

/// Patterns pick the same parameters as their indices, in index order; a pattern that
/// matches nothing is a typed error naming it.
#[test]
fn trained_parameters_by_name_pattern() {
    let problem = dense(&mut Xoshiro256PlusPlus::seed_from_u64(3));
    let by_index = step_program(&problem.model, 0, &problem.trained, &sgd(0.1, 0.0)).unwrap();
    for patterns in [
        &["dense.*"][..],
        &["dense.bias", "dense.w"],
        &["*.w", "*bias"],
    ] {
        let by_name = step_program(&problem.model, 0, patterns, &sgd(0.1, 0.0)).unwrap();
        assert_eq!(by_name.params, by_index.params, "{patterns:?}");
        assert_eq!(by_name.data, [0, 3]);
    }
    let only_bias = step_program(&problem.model, 0, &["*.bias"], &sgd(0.1, 0.0)).unwrap();
    assert_eq!(only_bias.params[0].name, "dense.bias");
    assert_eq!(only_bias.data, [0, 1, 3]);
    let err = step_program(&problem.model, 0, &["layers.*"], &sgd(0.1, 0.0)).unwrap_err();
    assert!(
        matches!(&err, Error::TrainRequest { problem: RequestProblem::UnmatchedPattern { pattern, .. }, .. } if pattern == "layers.*"),
        "{err}"
    );
}

/// A [`Mask`] exempts the matching parameters from AdamW's weight decay: one step moves
/// `dense.bias` as AdamW without decay and `dense.w` as AdamW with it.
#[test]
fn weight_decay_mask_by_name() {
    let problem = dense(&mut Xoshiro256PlusPlus::seed_from_u64(4));
    let (lr, wd) = (0.1, 0.5);
    let optimizer = |no_decay: &[&str], weight_decay: f32| -> Optimizer {
        AdamW {
            weight_decay,
            mask: Mask::except(no_decay),
            ..AdamW::new(lr)
        }
        .into()
    };
    let run = |no_decay: &[&str], weight_decay: f32| {
        let step = step_program(
            &problem.model,
            0,
            &["dense.*"],
            &optimizer(no_decay, weight_decay),
        );
        let step = step.unwrap();
        let mut t = Trainer::reference(step, problem.initial.clone()).unwrap();
        t.step(&problem.data).unwrap();
        t.params().unwrap()
    };
    let masked = run(&["*.bias"], wd);
    let decayed = run(&[], wd);
    let undecayed = run(&[], 0.0);
    assert_eq!(masked[0], decayed[0], "dense.w decays");
    assert_eq!(masked[1], undecayed[1], "dense.bias does not");
    assert_ne!(decayed[1], undecayed[1], "the decay changes the bias");
    assert!(matches!(
        step_program(
            &problem.model,
            0,
            &["dense.*"],
            &optimizer(&["*.scale"], wd)
        ),
        Err(Error::Optimizer { .. })
    ));
}

/// Adafactor as the paper's and T5's: every matrix's second moment factored (optax
/// factors only dims of 128 and more).
fn factoring_every_matrix() -> Optimizer {
    Adafactor {
        min_dim_size_to_factor: 0,
        ..Adafactor::new(1e-2)
    }
    .into()
}

/// Adafactor's state for one weight, on the host in f64: `[v_row, v_col]` for a
/// matrix, `[v]` for a vector.
struct HostAdafactor {
    /// The weight's rows and columns (`rows == 1` for a vector, unfactored).
    rows: usize,
    cols: usize,
    state: Vec<Vec<f64>>,
}

impl HostAdafactor {
    fn new(shape: &[usize]) -> Self {
        match *shape {
            [rows, cols] => HostAdafactor {
                rows,
                cols,
                state: vec![vec![0.0; rows], vec![0.0; cols]],
            },
            [n] => HostAdafactor {
                rows: 1,
                cols: n,
                state: vec![vec![0.0; n]],
            },
            _ => panic!("rank 1 or 2"),
        }
    }

    /// The paper's step `t` (relative step capped at `lr`, weight-scaled, clipped to an
    /// update RMS of 1, `eps1 = 1e-30`, `eps2 = 1e-3`, `beta2_t = 1 - t^-0.8`).
    fn step(&mut self, w: &mut [f64], g: &[f64], t: i32, lr: f64) {
        let beta = 1.0 - f64::from(t).powf(-0.8);
        let s: Vec<f64> = g.iter().map(|g| g * g + 1e-30).collect();
        let (n, m) = (self.rows, self.cols);
        let v: Vec<f64> = if self.state.len() == 2 {
            for i in 0..n {
                let mean = (0..m).map(|j| s[i * m + j]).sum::<f64>() / m as f64;
                self.state[0][i] = beta * self.state[0][i] + (1.0 - beta) * mean;
            }
            for j in 0..m {
                let mean = (0..n).map(|i| s[i * m + j]).sum::<f64>() / n as f64;
                self.state[1][j] = beta * self.state[1][j] + (1.0 - beta) * mean;
            }
            let row_mean = self.state[0].iter().sum::<f64>() / n as f64;
            (0..n * m)
                .map(|k| self.state[0][k / m] * self.state[1][k % m] / row_mean)
                .collect()
        } else {
            for (v, s) in self.state[0].iter_mut().zip(&s) {
                *v = beta * *v + (1.0 - beta) * s;
            }
            self.state[0].clone()
        };
        let u: Vec<f64> = g.iter().zip(&v).map(|(g, v)| g / v.sqrt()).collect();
        let rms = |x: &[f64]| (x.iter().map(|x| x * x).sum::<f64>() / x.len() as f64).sqrt();
        let clip = (rms(&u) / 1.0).max(1.0);
        let rho = lr.min(1.0 / f64::from(t).sqrt());
        let alpha = rho * rms(w).max(1e-3);
        for (w, u) in w.iter_mut().zip(&u) {
            *w -= alpha * u / clip;
        }
    }
}

/// Three Adafactor steps of `dense` (a factored matrix and an unfactored vector)
/// against the f64 host computation of the paper's algorithm, with the gradients of
/// `mse(x w + b, target)` computed by hand.
#[test]
fn adafactor_three_steps_by_hand() {
    let problem = dense(&mut Xoshiro256PlusPlus::seed_from_u64(5));
    let step = step_program(&problem.model, 0, &["dense.*"], &factoring_every_matrix()).unwrap();
    let slots: Vec<(String, Vec<usize>)> = step
        .params
        .iter()
        .flat_map(|p| &p.state)
        .map(|s| {
            let ty = step.program.ty(step.program.params[s.input]);
            (s.name.clone(), ty.shape.clone())
        })
        .collect();
    assert_eq!(
        slots,
        [
            ("v_row(dense.w)".to_string(), vec![16]),
            ("v_col(dense.w)".to_string(), vec![8]),
            ("v(dense.bias)".to_string(), vec![8]),
        ]
    );
    let mut t = Trainer::reference(step, problem.initial.clone()).unwrap();
    let f64s = |lit: &Literal| values(lit).into_iter().map(f64::from).collect::<Vec<_>>();
    let (x, target) = (f64s(&problem.data[0]), f64s(&problem.data[1]));
    let (mut w, mut b) = (f64s(&problem.initial[0]), f64s(&problem.initial[1]));
    let (batch, d, f) = (8, 16, 8);
    let (mut host_w, mut host_b) = (HostAdafactor::new(&[d, f]), HostAdafactor::new(&[f]));
    for step_number in 1..=3 {
        // dy = 2 (x w + b - target) / (batch f); gw = x^T dy; gb = sum over the batch.
        let mut dy = vec![0.0; batch * f];
        for r in 0..batch {
            for c in 0..f {
                let y = b[c] + (0..d).map(|k| x[r * d + k] * w[k * f + c]).sum::<f64>();
                dy[r * f + c] = 2.0 * (y - target[r * f + c]) / (batch * f) as f64;
            }
        }
        let gw: Vec<f64> = (0..d * f)
            .map(|k| {
                (0..batch)
                    .map(|r| x[r * d + k / f] * dy[r * f + k % f])
                    .sum()
            })
            .collect();
        let gb: Vec<f64> = (0..f)
            .map(|c| (0..batch).map(|r| dy[r * f + c]).sum())
            .collect();
        host_w.step(&mut w, &gw, step_number, 1e-2);
        host_b.step(&mut b, &gb, step_number, 1e-2);
        t.step(&problem.data).unwrap();
        let ckpt = t.checkpoint().unwrap();
        let want = [&w, &host_w.state[0], &host_w.state[1], &b, &host_b.state[0]];
        for ((name, got), want) in ckpt.iter().zip(want) {
            let want: Vec<f32> = want.iter().map(|&x| x as f32).collect();
            let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert_near(
                &want,
                &values(got),
                1e-5 * scale,
                &format!("{name} after step {step_number}"),
            );
        }
    }
}

/// On a 2x4 mesh, Adafactor's factored accumulators of `dense.w` (split `(data,
/// model)`) are split like the dims they keep: `v_row` over `data`, `v_col` over
/// `model`; and training matches the interpreter on every mesh.
#[test]
fn adafactor_state_is_sharded_like_the_weights_dims() {
    let problem = dense(&mut Xoshiro256PlusPlus::seed_from_u64(6));
    let step = step_program(&problem.model, 0, &["dense.*"], &factoring_every_matrix()).unwrap();
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let exe = gspmd_core::compile(&step.program, &mesh).unwrap();
    let sharding = |name: &str| {
        let slot = step
            .params
            .iter()
            .flat_map(|p| &p.state)
            .find(|s| s.name == name);
        exe.spmd().inputs[slot.unwrap().input].1.to_string()
    };
    assert_eq!(sharding("v_row(dense.w)"), s("(data)").to_string());
    assert_eq!(sharding("v_col(dense.w)"), s("(model)").to_string());
    assert_eq!(sharding("v(dense.bias)"), s("(model)").to_string());
    train_step_everywhere(&problem, step, Schedule::Constant);
}

// ---- (d) initialisers by name, sharded at creation ------------------------------------

fn dense_init(seed: u64) -> Initializer {
    Initializer::new(seed)
        .rule(
            "*.w",
            Init::FanIn {
                scale: 1.0,
                in_dims: vec![0],
            },
        )
        .rule("*.bias", Init::Normal { std: 0.1 })
}

/// Each device of a 2x4 mesh makes only its blocks of `dense.w` (split over both axes)
/// and `dense.bias` (over `model`); fetched, they equal the unsharded initialisation
/// bit for bit, and the interpreter's trainer starts from the same values.
#[test]
fn initialised_by_name_on_the_devices_equals_the_global_init() {
    let problem = dense(&mut Xoshiro256PlusPlus::seed_from_u64(7));
    let step = step_program(&problem.model, 0, &["dense.*"], &adamw(0.1, 0.0)).unwrap();
    let init = dense_init(11);
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let on_mesh = Trainer::on_mesh(step.clone(), mesh, &init).unwrap();
    let reference = Trainer::reference(step, &init).unwrap();
    let want = [
        init.global("dense.w", &[16, 8]).unwrap(),
        init.global("dense.bias", &[8]).unwrap(),
    ];
    let bound = 1.0 / 4.0;
    assert!(values(&want[0]).iter().all(|x| x.abs() <= bound));
    assert!(values(&want[1]).iter().any(|x| x.abs() > 0.0));
    for trainer in [&on_mesh, &reference] {
        let got: Vec<Literal> = trainer.params().unwrap().into_iter().map(|p| p.1).collect();
        assert_eq!(got, want);
    }
    // The state starts at zero on the devices too.
    for (name, value) in on_mesh.checkpoint().unwrap() {
        if name.starts_with("m(") || name.starts_with("v(") {
            assert!(values(&value).iter().all(|&x| x == 0.0), "{name}");
        }
    }
    // Another seed or name draws other values; an unnamed parameter is an error.
    assert_ne!(dense_init(12).global("dense.w", &[16, 8]).unwrap(), want[0]);
    assert_ne!(init.global("other.w", &[16, 8]).unwrap(), want[0]);
    assert!(matches!(
        init.global("dense.scale", &[8]),
        Err(Error::TrainerInput { .. })
    ));
}

/// Uneven blocks (`[5, 3]` over a 2x2 mesh) assemble to the global array, and a normal
/// init has about the asked standard deviation.
#[test]
fn initialiser_blocks_assemble_to_the_global_array() {
    let init = Initializer::new(3).rule("*", Init::Normal { std: 2.0 });
    let mesh = Mesh::new([("data", 2), ("model", 2)]).unwrap();
    let sharding = s("(data, model)");
    let shape = [5, 3];
    let blocks: Vec<Literal> = (0..4)
        .map(|d| {
            let block = sharding.device_block(&mesh, &shape, d);
            init.block("x", &shape, &block).unwrap()
        })
        .collect();
    let assembled = gspmd_core::runtime::assemble(&blocks, &sharding, &mesh, &shape).unwrap();
    assert_eq!(assembled, init.global("x", &shape).unwrap());
    let many = values(&init.global("x", &[10_000]).unwrap());
    let mean = many.iter().sum::<f32>() / many.len() as f32;
    let var = many.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / many.len() as f32;
    assert!(
        mean.abs() < 0.1 && (var.sqrt() - 2.0).abs() < 0.1,
        "{mean} {var}"
    );
}

/// `NormalFanIn` (μP's `N(0, 1/fan_in)`): blocks assemble to the global array, and the
/// draws of a `[layers, 64, 4, 4]` stack with fan-in dims 1 and 2 (`64 x 4`) have a
/// standard deviation of about `1/16`.
#[test]
fn normal_fan_in_has_variance_one_over_fan_in() {
    let init = Initializer::new(5).rule(
        "*",
        Init::NormalFanIn {
            in_dims: vec![1, 2],
        },
    );
    let mesh = Mesh::new([("data", 2), ("model", 2)]).unwrap();
    let sharding = s("(_, data, model, _)");
    let shape = [3, 64, 4, 4];
    let blocks: Vec<Literal> = (0..4)
        .map(|d| {
            let block = sharding.device_block(&mesh, &shape, d);
            init.block("x", &shape, &block).unwrap()
        })
        .collect();
    let global = init.global("x", &shape).unwrap();
    let assembled = gspmd_core::runtime::assemble(&blocks, &sharding, &mesh, &shape).unwrap();
    assert_eq!(assembled, global);
    let many = values(&global);
    let mean = many.iter().sum::<f32>() / many.len() as f32;
    let var = many.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / many.len() as f32;
    assert!(
        mean.abs() < 0.01 && (var.sqrt() * 16.0 - 1.0).abs() < 0.05,
        "{mean} {var}"
    );
}

// ---- (e) datasets: shuffled batches cut for the mesh -----------------------------------

/// 20 examples of `dense`'s data (`x: [16]`, `target: [8]` each).
fn dense_dataset() -> Dataset {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(8);
    Dataset::new(vec![
        uniform_f32(&mut rng, &[20, 16], -1.0, 1.0),
        uniform_f32(&mut rng, &[20, 8], -1.0, 1.0),
    ])
    .unwrap()
}

/// An epoch's order is a permutation fixed by the seed and epoch; batches of 8 from 20
/// examples give 2 per epoch, from the order's first 16 examples.
#[test]
fn dataset_shuffles_by_seed() {
    let data = dense_dataset();
    let order = data.order(1, 0);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..20).collect::<Vec<_>>());
    assert_eq!(order, data.order(1, 0));
    assert_ne!(order, data.order(2, 0));
    assert_ne!(order, data.order(1, 1));
    let batches: Vec<(u64, Batch)> = data
        .batches(8, 2, 1, None)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        batches.iter().map(|b| b.0).collect::<Vec<_>>(),
        [0, 0, 1, 1]
    );
    assert_eq!(
        batches[1].1,
        Batch::Global(data.gather(&order[8..16]).unwrap())
    );
    assert_eq!(
        batches[2].1,
        Batch::Global(data.gather(&data.order(1, 1)[..8]).unwrap())
    );
    assert!(data.batches(21, 1, 1, None).is_err());
    assert!(Dataset::new(vec![f32s(&[2], &[0.0; 2]), f32s(&[3], &[0.0; 3])]).is_err());
}

/// On a 2x4 mesh each device's blocks of a batch assemble to the global batch, and a
/// step on the blocks gives the loss and parameters of a step on the global batch.
#[test]
fn dataset_blocks_reassemble_and_train_like_the_global_batch() {
    let problem = dense(&mut Xoshiro256PlusPlus::seed_from_u64(9));
    let data = dense_dataset();
    let step = step_program(&problem.model, 0, &["dense.*"], &adamw(0.1, 0.0)).unwrap();
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let mut by_blocks = Trainer::on_mesh(step.clone(), mesh.clone(), dense_init(1)).unwrap();
    let mut by_global = Trainer::on_mesh(step, mesh, dense_init(1)).unwrap();
    let layout = by_blocks.data_layout();
    assert_eq!(layout.shardings[0].to_string(), s("(data, _)").to_string());
    let cut = data.batches(8, 2, 5, Some(layout.clone())).unwrap();
    let whole = data.batches(8, 2, 5, None).unwrap();
    for ((_, blocks), (_, global)) in cut.map(Result::unwrap).zip(whole.map(Result::unwrap)) {
        let (Batch::Blocks(blocks), Batch::Global(global)) = (&blocks, &global) else {
            panic!("a layout gives blocks, none global arrays");
        };
        for ((blocks, sharding), want) in blocks.iter().zip(&layout.shardings).zip(global) {
            assert_eq!(blocks[0].shape()[0], 4, "half the batch per data row");
            let got = gspmd_core::runtime::assemble(blocks, sharding, &layout.mesh, &want.shape())
                .unwrap();
            assert_eq!(&got, want);
        }
        let loss = by_blocks
            .step_batch(&Batch::Blocks(blocks.clone()))
            .unwrap();
        assert_eq!(loss, by_global.step(global).unwrap());
        assert_eq!(by_blocks.params().unwrap(), by_global.params().unwrap());
    }
    let mut reference = Trainer::reference(
        step_program(&problem.model, 0, &["dense.*"], &adamw(0.1, 0.0)).unwrap(),
        dense_init(1),
    )
    .unwrap();
    // Blocks cut for the 2x4 mesh do not fit the reference's one device; blocks cut
    // for its own layout (the whole batch) train like the global batch.
    let first = |layout| {
        data.batches(8, 1, 5, Some(layout))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .1
    };
    let blocks = first(layout);
    let error = reference.step_batch(&blocks);
    assert!(matches!(error, Err(Error::Input { .. })), "{error:?}");
    let own = first(reference.data_layout());
    let Batch::Blocks(whole) = &own else {
        panic!("a layout gives blocks")
    };
    let global: Vec<Literal> = whole.iter().map(|b| b[0].clone()).collect();
    let mut again = Trainer::reference(
        step_program(&problem.model, 0, &["dense.*"], &adamw(0.1, 0.0)).unwrap(),
        dense_init(1),
    )
    .unwrap();
    assert_eq!(
        reference.step_batch(&own).unwrap(),
        again.step(&global).unwrap()
    );
}

/// A warm-up + cosine schedule changes the learning rate of every step of a mesh
/// trainer while the step is compiled once (the compile count on this thread), and the
/// steps match the interpreter's under the same schedule.
#[test]
fn a_schedule_changes_the_lr_per_step_without_recompiling() {
    let problem = dense(&mut Xoshiro256PlusPlus::seed_from_u64(10));
    let step = step_program(&problem.model, 0, &["dense.*"], &adamw(0.05, 0.0)).unwrap();
    let schedule = Schedule::WarmupCosine {
        warmup: 2,
        total: 5,
        final_fraction: 0.1,
    };
    let before = gspmd_core::test_hooks::compilations_on_this_thread();
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let mut t = Trainer::on_mesh(step.clone(), mesh, dense_init(2))
        .and_then(|t| t.with_schedule(schedule))
        .unwrap();
    let mut reference = Trainer::reference(step, dense_init(2))
        .and_then(|t| t.with_schedule(schedule))
        .unwrap();
    let mut rates = Vec::new();
    for _ in 0..5 {
        rates.push(t.learning_rate());
        let loss = t.step(&problem.data).unwrap();
        let want = reference.step(&problem.data).unwrap();
        assert_near(&[want], &[loss], 1e-4 * want.abs().max(1.0), "loss");
    }
    assert_eq!(
        gspmd_core::test_hooks::compilations_on_this_thread(),
        before + 1
    );
    let want: Vec<Option<f32>> = (1..=5).map(|t| Some(0.05 * schedule.factor(t))).collect();
    assert_eq!(rates, want);
    assert!(rates.windows(2).all(|w| w[0] != w[1]), "{rates:?}");
}

/// The interpreter's loss of the dense `model` on `data` with `t`'s current parameters.
fn dense_loss(model: &Program, t: &Trainer, data: &[Literal]) -> Vec<Literal> {
    let params: Vec<Literal> = t.params().unwrap().into_iter().map(|p| p.1).collect();
    let inputs = [
        data[0].clone(),
        params[0].clone(),
        params[1].clone(),
        data[1].clone(),
    ];
    gspmd_core::runtime::interpret(model, &inputs).unwrap()
}

/// The validation loss of the model compiled once for the mesh, on the trainer's current
/// (resident) parameters, equals the interpreter's loss of the model on the fetched
/// parameters, and leaves training unchanged.
#[test]
fn evaluating_held_out_data_on_the_resident_weights() {
    let problem = dense(&mut Xoshiro256PlusPlus::seed_from_u64(12));
    let held_out = dense(&mut Xoshiro256PlusPlus::seed_from_u64(13)).data;
    let step = step_program(&problem.model, 0, &["dense.*"], &adamw(0.1, 0.0)).unwrap();
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let mut t = Trainer::on_mesh(step.clone(), mesh, dense_init(3)).unwrap();
    let mut reference = Trainer::reference(step, dense_init(3)).unwrap();
    let eval = t.evaluator(&problem.model, 0).unwrap();
    let eval_reference = reference.evaluator(&problem.model, 0).unwrap();
    for _ in 0..3 {
        let got = t.evaluate(&eval, &held_out).unwrap();
        let want = dense_loss(&problem.model, &t, &held_out);
        assert_near(&values(&want[0]), &[got], 1e-5, "validation loss");
        let on_reference = reference.evaluate(&eval_reference, &held_out).unwrap();
        assert_near(
            &[on_reference],
            &[got],
            1e-5,
            "validation loss on the interpreter",
        );
        let loss = t.step(&problem.data).unwrap();
        assert_near(
            &[reference.step(&problem.data).unwrap()],
            &[loss],
            1e-5,
            "loss",
        );
    }
    assert!(matches!(
        t.evaluator(&problem.model, 1),
        Err(Error::TrainRequest { .. })
    ));
}

/// A model that shards a weight otherwise than the step (here: the transpose of the
/// step's `(data, model)`) is evaluated on the weight resharded on the devices: its
/// loss equals the interpreter's on the fetched parameters, training goes on unchanged,
/// and nothing is left on the devices.
#[test]
fn evaluating_a_model_that_shards_a_weight_otherwise() {
    let problem = dense(&mut Xoshiro256PlusPlus::seed_from_u64(14));
    let held_out = dense(&mut Xoshiro256PlusPlus::seed_from_u64(15)).data;
    let step = step_program(&problem.model, 0, &["dense.*"], &adamw(0.1, 0.0)).unwrap();
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let mut t = Trainer::on_mesh(step, mesh, dense_init(3)).unwrap();
    let b = Builder::new("dense");
    let x = b
        .parameter("x", [8, 16], DType::F32)
        .annotate(s("(data, _)"));
    let w = (b.parameter("dense.w", [16, 8], DType::F32)).annotate(s("(model, data)"));
    let bias = b
        .parameter("dense.bias", [8], DType::F32)
        .annotate(s("(model)"));
    let target = b
        .parameter("target", [8, 8], DType::F32)
        .annotate(s("(data, _)"));
    let loss = (&x.matmul(&w) + &bias.broadcast_in_dim([8, 8], &[1])).mse(&target);
    let other = b.finish(&[&loss]).unwrap();
    let eval = t.evaluator(&other, 0).unwrap();
    for _ in 0..2 {
        let got = t.evaluate(&eval, &held_out).unwrap();
        let want = dense_loss(&other, &t, &held_out);
        assert_near(&values(&want[0]), &[got], 1e-5, "validation loss");
        assert_eq!(
            t.backend().resident("evaluate/1"),
            None,
            "a resharded copy is left"
        );
        t.step(&problem.data).unwrap();
    }
}

/// A model parameter named `rng` (an `i32[2]` key) is the step's random key: not data,
/// fed by the trainer with `fold_in(key(seed), t)` at step `t`. The loss here counts the
/// kept elements of a dropout (exact in any summation order; the trained weight does not
/// change it), so it shows the masks: each step draws anew, the 2x4 mesh draws the
/// reference's bitwise, the seed gives its stream again and another seed another.
#[test]
fn the_trainer_feeds_the_step_a_new_random_key_each_step() {
    let b = Builder::new("kept");
    let x = b
        .parameter("x", [64], DType::F32)
        .annotate("(data)".parse().unwrap());
    let w = b.parameter("w", [1], DType::F32);
    let rng = b.parameter(RNG, [2], DType::I32);
    let kept = gspmd_core::ir::random::dropout(&x, 0.5, &rng).sum(&[0]);
    let loss = &kept + &(&w * 0.0).sum(&[0]);
    let model = b.finish(&[&loss]).unwrap();
    let step = step_program(&model, 0, &["w"], &Optimizer::sgd(0.1, 0.0)).unwrap();
    assert_eq!((step.rng, &step.data[..]), (Some(2), &[0][..]));
    let data = [Literal::full(&[64], DType::F32, 1.0)];
    let losses = |trainer: Trainer| -> Vec<u32> {
        let mut trainer = trainer;
        (0..4)
            .map(|_| trainer.step(&data).unwrap().to_bits())
            .collect()
    };
    let initial = || vec![Literal::full(&[1], DType::F32, 0.0)];
    let reference = losses(Trainer::reference(step.clone(), initial()).unwrap());
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let on_mesh = Trainer::on_mesh(step.clone(), mesh, initial()).unwrap();
    assert_eq!(losses(on_mesh), reference, "2x4 mesh");
    let counts: Vec<f32> = reference.iter().map(|&l| f32::from_bits(l)).collect();
    assert!(
        counts.iter().all(|&c| c > 0.0 && c < 128.0) && counts.windows(2).any(|w| w[0] != w[1]),
        "{counts:?}: every step the same mask, or none kept"
    );
    let again = Trainer::reference(step.clone(), initial()).unwrap();
    assert_eq!(losses(again.with_rng_seed(0)), reference, "seed 0 again");
    let other = Trainer::reference(step.clone(), initial()).unwrap();
    assert_ne!(losses(other.with_rng_seed(1)), reference, "seed 1");

    // A parameter named `rng` that is no key, and a key with accumulation.
    let b = Builder::new("bad_rng");
    let w = b.parameter("w", [1], DType::F32);
    let rng = b.parameter(RNG, [3], DType::I32);
    let loss = (&w * &rng.convert(DType::F32).sum(&[0])).sum(&[0]);
    let bad = b.finish(&[&loss]).unwrap();
    let e = step_program(&bad, 0, &["w"], &Optimizer::sgd(0.1, 0.0));
    assert!(
        matches!(&e, Err(Error::TrainRequest { problem: RequestProblem::RandomKey { ty, .. }, .. }) if ty.shape[..] == [3]),
        "{e:?}"
    );
    let accumulate = StepOptions {
        accumulate: Some(2),
        ..StepOptions::default()
    };
    let e = step_program_with(&model, 0, &["w"], &Optimizer::sgd(0.1, 0.0), &accumulate);
    assert!(matches!(e, Err(Error::TrainRequest { .. })), "{e:?}");
}

/// A model input named like an input the training step adds (an optimizer state slot,
/// a scalar, the accumulation loop's loss sum) is a [`Error::TrainRequest`] naming the model's parameter, where it was
/// declared and what the step adds under that name.
#[test]
fn a_model_input_named_like_a_step_input_is_a_request_error() {
    for (name, added, accumulate) in [
        ("learning_rate", "an optimizer scalar", false),
        ("m(w)", "the optimizer's state `m` of `w`", false),
        ("loss_sum", "the microbatch loop's loss sum", true),
    ] {
        let b = Builder::new("clash");
        let w = b.parameter("w", [2], DType::F32);
        let (x, line) = (b.parameter(name, [2], DType::F32), line!());
        let loss = w.mse(&x);
        let model = b.finish(&[&loss]).unwrap();
        let options = StepOptions {
            accumulate: accumulate.then_some(2),
            ..StepOptions::default()
        };
        let err = step_program_with(&model, 0, &[0], &adamw(0.1, 0.1), &options).unwrap_err();
        let shown = err.to_string();
        assert!(matches!(err, Error::TrainRequest { .. }), "{shown}");
        let declared = format!("`{name}` (declared at {}:{line})", file!());
        assert!(shown.contains(&declared), "{shown}");
        assert!(shown.contains(added), "{shown}");
    }
}
