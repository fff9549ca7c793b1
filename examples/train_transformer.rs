//! Trains a small decoder-only Transformer language model on a 2x4 thread mesh with
//! GSPMD's 2-D sharding (batch over `data`; heads and FFN hidden over `model`; weights
//! split over both axes and gathered just in time, their gradients reduce-scattered).
//!
//! The task is sequence reversal: each sequence is `BOS a1..a7 SEP a7..a1`, and the loss
//! is the next-token cross-entropy over the reversed half (the first half is random and
//! cannot be predicted). A model that has learned to reverse drives it towards 0; one
//! that guesses uniformly sits at ln(14) = 2.64.
//!
//! The first steps also run on the reference interpreter (one device, no partitioning)
//! and their losses are compared; at the end the sharded parameters are saved as a
//! safetensors checkpoint, loaded into a fresh trainer, and one more step from each must
//! give the same loss.
//!
//! ```text
//! cargo run --release --example train_transformer            # 300 steps
//! cargo run --release --example train_transformer -- 50      # fewer steps
//! ```

mod common;

use std::time::Instant;

use gspmd::models::transformer::language_model;
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::train::{Optimizer, Trainer, load_checkpoint, save_checkpoint, step_program};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

const BOS: i32 = 0;
const SEP: i32 = 1;
/// Content tokens are `2..VOCAB`.
const VOCAB: usize = 16;
const HALF: usize = 7;
/// `BOS`, the content, `SEP`, the content reversed.
const SEQ: usize = 2 * HALF + 2;
const BATCH: usize = 16;
/// Steps compared with the reference interpreter.
const CHECKED_STEPS: usize = 3;

/// One batch: tokens, next-token targets, and loss weights (1 on the reversed half).
fn batch(rng: &mut Xoshiro256PlusPlus) -> Vec<Literal> {
    let mut tokens = Vec::with_capacity(BATCH * SEQ);
    let mut targets = Vec::with_capacity(BATCH * SEQ);
    let mut weights = Vec::with_capacity(BATCH * SEQ);
    for _ in 0..BATCH {
        let content: Vec<i32> = (0..HALF)
            .map(|_| rng.random_range(2..VOCAB as i32))
            .collect();
        let mut seq = vec![BOS];
        seq.extend(&content);
        seq.push(SEP);
        seq.extend(content.iter().rev());
        for i in 0..SEQ {
            tokens.push(seq[i]);
            targets.push(seq.get(i + 1).copied().unwrap_or(BOS));
            // Position i predicts seq[i + 1]: the reversed half starts after SEP.
            weights.push(if (HALF + 1..SEQ - 1).contains(&i) {
                1.0
            } else {
                0.0
            });
        }
    }
    let shape = IxDyn(&[BATCH, SEQ]);
    vec![
        Literal::I32(ArrayD::from_shape_vec(shape.clone(), tokens).expect("shape fits")),
        Literal::I32(ArrayD::from_shape_vec(shape.clone(), targets).expect("shape fits")),
        Literal::F32(ArrayD::from_shape_vec(shape, weights).expect("shape fits")),
    ]
}

/// The bound of a weight's uniform initial values: 1/sqrt(fan-in) (the first dim after
/// the stacked layer dim; all of it for embeddings).
fn init_bound(name: &str, shape: &[usize]) -> f32 {
    let fan_in = match name {
        "embed" | "position" => 1,
        "wo" => shape[1] * shape[2],
        _ if shape.len() > 2 => shape[1],
        _ => shape[0],
    };
    1.0 / (fan_in as f32).sqrt()
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300);
    let dims = language_model::Dims {
        B: BATCH,
        S: SEQ,
        V: VOCAB,
        D: 64,
        L: 2,
        H: 4,
        K: 16,
        F: 256,
    };
    let model = language_model::trace(dims)?;
    // Parameters 0..3 are tokens, targets and loss weights; the rest are trained.
    let trained: Vec<usize> = (3..model.params.len()).collect();
    let optimizer = Optimizer::adamw(3e-3);
    let step = step_program(&model, 0, &trained, &optimizer)?;
    let mesh = language_model::mesh([2, 4])?;
    let initial = common::uniform_init(&model, &trained, 7, init_bound);

    println!(
        "model: {} layers, d_model {}, {} heads, vocabulary {VOCAB}, batch {BATCH} x {SEQ} tokens",
        dims.L, dims.D, dims.H
    );
    let started = Instant::now();
    let mut trainer = Trainer::on_mesh(step.clone(), mesh.clone(), initial.clone())?;
    common::report_compiled(&trainer, started.elapsed());

    // The first steps on one device, as the oracle.
    let mut reference = Trainer::reference(step.clone(), initial)?;
    let mut data_rng = Xoshiro256PlusPlus::seed_from_u64(42);
    let run = common::train(
        &mut trainer,
        &mut reference,
        steps,
        CHECKED_STEPS,
        20,
        BATCH * SEQ,
        "tokens",
        || batch(&mut data_rng),
    )?;
    let max_diff = run.max_diff;
    println!(
        "loss {:.4} at step 1 -> {:.4} (mean of the last {} steps); {:.1} ms/step, {:.0} tokens/s",
        run.first,
        run.mean_last,
        run.window,
        run.elapsed.as_secs_f64() * 1e3 / steps.max(1) as f64,
        (steps * BATCH * SEQ) as f64 / run.elapsed.as_secs_f64()
    );
    println!(
        "first {CHECKED_STEPS} losses vs the single-device reference: max relative difference {max_diff:.2e}"
    );

    // Checkpoint: save, load into a fresh trainer, and take one more step from both.
    let path = std::env::temp_dir().join("gspmd_train_transformer.safetensors");
    save_checkpoint(&path, &trainer.checkpoint()?)?;
    let mut resumed = Trainer::on_mesh(
        step,
        mesh,
        common::uniform_init(&model, &trained, 0, init_bound),
    )?;
    resumed.restore(&load_checkpoint(&path)?)?;
    let data = batch(&mut data_rng);
    let (continued, reloaded) = (trainer.step(&data)?, resumed.step(&data)?);
    println!(
        "checkpoint {}: next loss {continued:.6} continuing, {reloaded:.6} after save+load",
        path.display()
    );
    if continued != reloaded || max_diff > 1e-4 {
        return Err(format!(
            "mismatch: continued {continued} vs reloaded {reloaded}, reference difference {max_diff}"
        )
        .into());
    }
    Ok(())
}
