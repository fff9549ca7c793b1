//! Trains a GShard mixture-of-experts language model (paper section 5.2) on a 2x4 thread
//! mesh `(data, expert)`: token groups split over all 8 devices, 4 experts split over
//! `expert`, top-2 gating with an expert capacity and the load-balancing loss. Dispatch
//! and combine are all-to-alls over `expert`.
//!
//! The task has 4 topics of 8 tokens each. A sequence visits the topics in turn, and the
//! token after `x_i` (topic `t`, offset `o_i` in it) is offset `(3 o_i + o_{i-1} + t) mod 8`
//! of topic `t + 1`: predictable from the last two tokens, by a rule that differs per
//! topic — work that experts can split between them. Guessing uniformly costs ln(32) =
//! 3.47; a model that has learned the rule drives the loss towards 0.
//!
//! The first steps also run on the reference interpreter (one device) and their losses
//! are compared; the run fails if they differ, or if the loss does not halve in the
//! default 300 steps. Before and after training it prints how many tokens pick each expert
//! first: the load-balancing loss keeps them near equal.
//!
//! ```text
//! cargo run --release --example train_moe            # 300 steps
//! cargo run --release --example train_moe -- 50      # fewer steps
//! ```
//!
//! With `--bench` the step is timed instead (`benches/jax` compares it with JAX): no
//! reference run, no plot; `--mesh DxE` picks the `data`x`expert` mesh (default 2x4),
//! `--warmup N` the untimed steps and `--dump PATH` writes the initial weights, the
//! first batches (`tokens.<i>`, `targets.<i>`, `weights.<i>`) and their losses for
//! `benches/jax/moe_step.py` to replay.
//!
//! ```text
//! cargo run --release --example train_moe -- 20 --bench --mesh 1x1
//! ```

#[path = "common/bench.rs"]
mod bench;
mod common;

use std::time::Instant;

use gspmd::models::moe::{MoeLanguageModel, moe_language_model};
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::train::{Fetch, Trainer, output_name, step_program};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

const TOPICS: usize = 4;
const PER_TOPIC: usize = 8;
const VOCAB: usize = TOPICS * PER_TOPIC;
const SEQ: usize = 16;
/// Groups of tokens that route independently: the batch, two per device.
const GROUPS: usize = 16;
const EXPERTS: usize = 4;
/// At most this many tokens of a group per expert (1.5x an even share of the
/// `2 * SEQ` choices).
const CAPACITY: usize = 3 * SEQ / EXPERTS;
/// The data inputs of the model: tokens, targets and loss weights.
const DATA: usize = 3;
/// Steps by default: the loss must at least halve in as many.
const STEPS: usize = 300;
/// Steps compared with the reference interpreter.
const CHECKED_STEPS: usize = 3;

/// One batch: tokens, next-token targets, and loss weights (0 for the first position,
/// whose successor depends on a token before the sequence).
fn batch(rng: &mut Xoshiro256PlusPlus) -> Vec<Literal> {
    let mut tokens = Vec::with_capacity(GROUPS * SEQ);
    let mut targets = Vec::with_capacity(GROUPS * SEQ);
    let mut weights = Vec::with_capacity(GROUPS * SEQ);
    for _ in 0..GROUPS {
        let mut topic = rng.random_range(0..TOPICS);
        let mut offsets = [
            rng.random_range(0..PER_TOPIC),
            rng.random_range(0..PER_TOPIC),
        ];
        let mut seq = Vec::with_capacity(SEQ + 1);
        // Offsets of the previous and the current token; the first token is at `topic`.
        seq.push((topic * PER_TOPIC + offsets[1]) as i32);
        while seq.len() <= SEQ {
            let next = (3 * offsets[1] + offsets[0] + topic) % PER_TOPIC;
            topic = (topic + 1) % TOPICS;
            offsets = [offsets[1], next];
            seq.push((topic * PER_TOPIC + next) as i32);
        }
        tokens.extend(&seq[..SEQ]);
        targets.extend(&seq[1..]);
        weights.extend((0..SEQ).map(|i| if i == 0 { 0.0f32 } else { 1.0 }));
    }
    let shape = IxDyn(&[GROUPS, SEQ]);
    vec![
        Literal::I32(ArrayD::from_shape_vec(shape.clone(), tokens).expect("shape fits")),
        Literal::I32(ArrayD::from_shape_vec(shape.clone(), targets).expect("shape fits")),
        Literal::F32(ArrayD::from_shape_vec(shape, weights).expect("shape fits")),
    ]
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = bench::Args::parse(20, |arg, _| Err(format!("unknown option {arg}")))?;
    let steps = args.steps.unwrap_or(STEPS);
    let dims = moe_language_model::Dims {
        G: GROUPS,
        S: SEQ,
        V: VOCAB,
        M: 32,
        N: 4,
        K: 8,
        E: EXPERTS,
        H: 64,
    };
    let model = moe_language_model::trace(dims, CAPACITY)?;
    let trained: Vec<usize> = (DATA..model.params.len()).collect();
    let optimizer = common::adamw(3e-3);
    let step = step_program(&model, 0, &trained, &optimizer)?;
    let mesh = moe_language_model::mesh(args.mesh.unwrap_or([2, 4]))?;
    // Uniform in ±1/sqrt(fan-in), from the `#[init]`s of the struct's fields.
    let initial = MoeLanguageModel::initializer(7);
    if let Some(timing) = &args.bench {
        let mut trainer = bench::trainer(step, mesh, initial)?;
        let [a, b] = args.mesh.unwrap_or([2, 4]);
        let label = format!("MoE, mesh {a}x{b}");
        let mut data_rng = Xoshiro256PlusPlus::seed_from_u64(42);
        let names = ["tokens", "targets", "weights"];
        return bench::run(timing, &mut trainer, &label, &names, || {
            batch(&mut data_rng)
        });
    }

    println!(
        "model: d_model {}, {} heads, {EXPERTS} experts of hidden {} (capacity {CAPACITY} per group), vocabulary {VOCAB}, {GROUPS} groups x {SEQ} tokens",
        dims.M, dims.N, dims.H
    );
    let started = Instant::now();
    let mut trainer = Trainer::on_mesh(step.clone(), mesh, initial.clone())?;
    common::report_compiled(&trainer, started.elapsed());
    let mut reference = Trainer::reference(step, initial)?;

    let mut data_rng = Xoshiro256PlusPlus::seed_from_u64(42);
    let probe = batch(&mut Xoshiro256PlusPlus::seed_from_u64(1));
    // The router load, the model's second output: per expert, how many of the probe's
    // tokens pick it first, by name from the model run forward on the mesh.
    let evaluator = trainer.evaluator(&model, 0)?;
    let load = output_name(&model, 1);
    let show = |when: &str, trainer: &Trainer| -> gspmd::Result<()> {
        let out = trainer.evaluate_with(&evaluator, &probe, &[(&load, Fetch::Global)])?;
        let counts: Vec<f32> = (out.global(&load).and_then(Literal::as_f32))
            .map(|a| a.iter().copied().collect())
            .unwrap_or_default();
        println!("tokens choosing each expert first, {when}: {counts:?}");
        Ok(())
    };
    show("before training", &trainer)?;
    let run = common::train(
        &mut trainer,
        &mut reference,
        steps,
        CHECKED_STEPS,
        20,
        GROUPS * SEQ,
        "tokens",
        || batch(&mut data_rng),
        None,
    )?;
    common::write_curves(
        &common::output_path("train_moe_loss.svg"),
        "MoE language model",
        &run,
    )?;
    show("after training", &trainer)?;
    println!(
        "loss {:.4} at step 1 -> {:.4} (mean of the last {} steps); {:.1} ms/step",
        run.first,
        run.mean_last,
        run.window,
        run.elapsed.as_secs_f64() * 1e3 / steps.max(1) as f64,
    );
    println!(
        "first {CHECKED_STEPS} losses vs the single-device reference: max relative difference {:.2e}",
        run.max_diff
    );
    if run.max_diff > 1e-4 {
        return Err(format!("the mesh differs from the reference by {}", run.max_diff).into());
    }
    if steps >= STEPS && run.mean_last >= 0.5 * run.first {
        return Err(format!(
            "the loss did not halve in {steps} steps: {} -> {}",
            run.first, run.mean_last
        )
        .into());
    }
    Ok(())
}
