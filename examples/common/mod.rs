//! What the training examples share: the report of the compiled step and the training
//! loop (progress bar, the first steps checked against the single-device reference,
//! the loss at step 1 and the mean of the last ones).

use std::time::{Duration, Instant};

use gspmd::prelude::*;
use gspmd::runtime::uniform_f32;
use gspmd::train::{Engine, Trainer};
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

/// Prints how long `trainer`'s step took to compile (`compile_time`), its op counts
/// before and after partitioning and its collectives per step; returns the compiled
/// step (`None` on the reference interpreter).
pub fn report_compiled(trainer: &Trainer, compile_time: Duration) -> Option<&Executable> {
    let Engine::Mesh { exe, .. } = trainer.engine() else {
        return None;
    };
    println!(
        "compiled the training step for {} in {compile_time:.2?}: {} global ops -> {} per-device ops",
        exe.spmd.mesh,
        exe.propagated.nodes.len(),
        exe.spmd.program.nodes.len()
    );
    println!("collectives per step:\n{}", exe.spmd.collectives());
    Some(exe)
}

/// Initial values of `program`'s parameters `trained`, each uniform in `±bound(name,
/// shape)` (its name and shape), drawn in order from a generator seeded with `seed`.
pub fn uniform_init(
    program: &Program,
    trained: &[usize],
    seed: u64,
    bound: impl Fn(&str, &[usize]) -> f32,
) -> Vec<Literal> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    trained
        .iter()
        .map(|&i| {
            let node = program.node(program.params[i]);
            let b = bound(node.name.as_deref().unwrap_or_default(), &node.ty.shape);
            uniform_f32(&mut rng, &node.ty.shape, -b, b)
        })
        .collect()
}

/// What [`train`] measured.
pub struct Run {
    /// The loss of step 1.
    pub first: f32,
    /// The mean loss of the last `window` steps.
    pub mean_last: f32,
    /// How many steps `mean_last` averages.
    pub window: usize,
    /// The largest relative difference of the checked steps' losses from the reference.
    pub max_diff: f32,
    /// Wall time of the loop.
    pub elapsed: Duration,
}

/// Trains `trainer` for `steps` steps on `batch()`es; the first `checked` steps also run
/// on `reference` and their losses are compared (the difference relative to the
/// reference's loss). The
/// progress bar shows the loss and `items_per_step` `unit`s per second.
#[allow(clippy::too_many_arguments)]
pub fn train(
    trainer: &mut Trainer,
    reference: &mut Trainer,
    steps: usize,
    checked: usize,
    window: usize,
    items_per_step: usize,
    unit: &str,
    mut batch: impl FnMut() -> Vec<Literal>,
) -> gspmd::Result<Run> {
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} step {pos}/{len}  loss {msg}  [{elapsed_precise}]")
            .expect("valid template"),
    );
    let (mut first, mut max_diff) = (None, 0.0f32);
    let mut last = Vec::new();
    let timer = Instant::now();
    for i in 0..steps {
        let data = batch();
        let loss = trainer.step(&data)?;
        if i < checked {
            let want = reference.step(&data)?;
            max_diff = max_diff.max((loss - want).abs() / want.abs().max(1e-12));
        }
        first.get_or_insert(loss);
        last.push(loss);
        if last.len() > window {
            last.remove(0);
        }
        let rate = ((i + 1) * items_per_step) as f64 / timer.elapsed().as_secs_f64();
        bar.set_message(format!("{loss:.4}  {rate:.0} {unit}/s"));
        bar.inc(1);
    }
    bar.finish();
    Ok(Run {
        first: first.unwrap_or(f32::NAN),
        mean_last: last.iter().sum::<f32>() / last.len().max(1) as f32,
        window: last.len(),
        max_diff,
        elapsed: timer.elapsed(),
    })
}
