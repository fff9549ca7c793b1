//! Pipelining as sharding (GSPMD section 3.3): a stack of `4 x 2` residual MLP layers
//! (`gspmd::models::pipeline`) on a 4x2 thread mesh `(stage, model)`: the layers'
//! stacked weights split over `stage` (4 stages of 2 layers), each layer's hidden dim
//! over `model` (Megatron), the batch cut in 8 microbatches. The whole schedule is one
//! scan whose body shifts the stage-split buffer with one collective-permute
//! (`collective_shift`) per iteration.
//!
//! Two schedules at the same microbatch count: GPipe (each stage applies its 2
//! consecutive layers per iteration, 8 + 3 iterations) and circular (layers
//! round-robin over the stages, one per iteration, 16 + 3 shorter iterations). For each
//! it prints the collectives per loop iteration and outside the loop, the bubble
//! fraction (idle stage-iterations over all; circular's is lower), and checks the
//! partitioned forward against the same layers run one after the other on the
//! single-device reference interpreter.
//!
//! Then it trains both with AdamW to fit `y = tanh(x A)` for a fixed random `A`: the
//! first steps are compared with the same model without pipelining (the layers in
//! sequence) trained on the reference interpreter, and the run fails if they differ,
//! or if the loss does not fall below half the first in the default 200 steps. It
//! prints each schedule's step time.
//!
//! ```text
//! cargo run --release --example train_pipeline            # 200 steps per schedule
//! cargo run --release --example train_pipeline -- 20      # fewer steps
//! ```

mod common;

use std::time::{Duration, Instant};

use gspmd::ir::{Flow, distinct_flows};
use gspmd::models::pipeline::{Pipeline, mlp_loss};
use gspmd::ndarray::{Array2, ArrayD, Ix2, IxDyn};
use gspmd::partition::CollectiveStats;
use gspmd::prelude::*;
use gspmd::runtime::uniform_f32;
use gspmd::train::{Trainer, step_program};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

const STAGES: usize = 4;
/// Layers per stage.
const REPEATS: usize = 2;
const MODEL: usize = 2;
const MICROBATCHES: usize = 8;
/// Rows per microbatch.
const ROWS: usize = 8;
const FEATURES: usize = 16;
const HIDDEN: usize = 64;
/// The data inputs of the model: `x` and the targets `y`.
const DATA: usize = 2;
/// Steps by default: the loss must fall below half the first in as many.
const STEPS: usize = 200;
/// Steps compared with the reference interpreter.
const CHECKED_STEPS: usize = 3;
/// Steps whose mean loss is reported at the end.
const WINDOW: usize = 10;
/// Forward runs timed per schedule.
const FORWARD_RUNS: usize = 20;

fn dims() -> mlp_loss::Dims {
    mlp_loss::Dims {
        M: MICROBATCHES,
        B: ROWS,
        D: FEATURES,
        S: STAGES,
        R: REPEATS,
        F: HIDDEN,
    }
}

/// One batch: `x` uniform in `[-1, 1)` and `y = tanh(x A)`, `[M, B, D]` each.
fn batch(rng: &mut Xoshiro256PlusPlus, teacher: &Array2<f32>) -> Vec<Literal> {
    let shape = [MICROBATCHES, ROWS, FEATURES];
    let x = uniform_f32(rng, &shape, -1.0, 1.0);
    let rows = x
        .as_f32()
        .expect("f32")
        .to_shape((MICROBATCHES * ROWS, FEATURES));
    let y = rows.expect("contiguous").dot(teacher).mapv(f32::tanh);
    let y = y.into_shape_with_order(IxDyn(&shape)).expect("same size");
    vec![x, Literal::F32(y)]
}

/// The teacher's `A`, uniform in `±2/sqrt(D)`.
fn teacher(rng: &mut Xoshiro256PlusPlus) -> Array2<f32> {
    let bound = 2.0 / (FEATURES as f32).sqrt();
    let a = uniform_f32(rng, &[FEATURES, FEATURES], -bound, bound);
    let a: ArrayD<f32> = a.as_f32().expect("f32").clone();
    a.into_dimensionality::<Ix2>().expect("rank 2")
}

/// `stats` on one line: `1 x collective_shift, 2 x all_reduce`.
fn one_line(stats: &CollectiveStats) -> String {
    if stats.by_kind.is_empty() {
        return "none".into();
    }
    let kinds: Vec<String> = (stats.by_kind.iter())
        .map(|(kind, (n, bytes))| format!("{n} x {kind} ({bytes} B)"))
        .collect();
    kinds.join(", ")
}

/// One line per loop of `exe`'s per-device program (its trip count and its body's
/// collectives, run once per iteration), then the collectives outside the loops (the
/// totals, which count each body `length` times, less the loops').
fn loop_report(exe: &Executable) -> String {
    let (program, mesh) = (&exe.spmd().program, &exe.spmd().mesh);
    let mut out = String::new();
    let mut outside = CollectiveStats::of(program, mesh);
    for (_, flow) in distinct_flows(program) {
        if let Flow::Scan { body, length, .. } = &**flow {
            let stats = CollectiveStats::of(body, mesh);
            for (kind, (n, bytes)) in &stats.by_kind {
                let total = outside.by_kind.entry(*kind).or_default();
                (total.0, total.1) = (total.0 - length * n, total.1 - length * bytes);
            }
            out += &format!(
                "    scan of {length} iterations, per iteration: {}\n",
                one_line(&stats)
            );
        }
    }
    outside.by_kind.retain(|_, (n, _)| *n > 0);
    out + &format!("    outside the loops: {}", one_line(&outside))
}

/// The largest difference of `got` from `want`, relative to `want`'s largest magnitude
/// (at least 1).
fn relative_diff(want: &Literal, got: &Literal) -> f32 {
    let (a, b) = (want.as_f32().expect("f32"), got.as_f32().expect("f32"));
    let scale = a.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    (a.iter().zip(b)).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// The value of an f32 scalar.
fn scalar(value: &Literal) -> f32 {
    value.as_f32().map_or(f32::NAN, |a| a.iter().sum())
}

/// Compiles the pipelined loss of `p` for `mesh`, prints its loop's collectives and
/// bubble fraction, checks its value on `inputs` against the sequential layers on the
/// reference interpreter, and returns the mean forward time.
fn forward_report(
    name: &str,
    p: Pipeline,
    mesh: &Mesh,
    inputs: &[Literal],
) -> Result<Duration, Box<dyn std::error::Error>> {
    let pipelined = mlp_loss::trace(dims(), p, true)?;
    let sequential = mlp_loss::trace(dims(), p, false)?;
    let exe = compile(&pipelined, mesh)?;
    let all = p.stages * p.iterations();
    let idle = (0..all)
        .filter(|&k| p.work(k / p.stages, k % p.stages).is_none())
        .count();
    println!(
        "{name}: {} iterations, bubble fraction {:.1}% ({idle} idle of {all} stage-iterations)",
        p.iterations(),
        100.0 * p.bubble_fraction(),
    );
    println!("  forward collectives:\n{}", loop_report(&exe));
    let threads = ThreadMesh::new(mesh.clone())?;
    let want = interpret(&sequential, inputs)?;
    let got = exe.run(&threads, inputs)?;
    let diff = relative_diff(&want[0], &got[0]);
    println!(
        "  forward loss {:.5} vs the layers in sequence on one device {:.5}: relative difference {diff:.1e}",
        scalar(&got[0]),
        scalar(&want[0]),
    );
    if diff > 1e-4 {
        return Err(format!("{name}: the pipelined forward differs by {diff}").into());
    }
    let started = Instant::now();
    for _ in 0..FORWARD_RUNS {
        exe.run(&threads, inputs)?;
    }
    Ok(started.elapsed() / FORWARD_RUNS as u32)
}

/// Trains the pipelined loss of `p` on `mesh` for `steps` steps from `initial`, the
/// first steps checked against the sequential model on the reference interpreter.
fn train(
    p: Pipeline,
    mesh: &Mesh,
    initial: &[Literal],
    steps: usize,
    teacher: &Array2<f32>,
) -> Result<common::Run, Box<dyn std::error::Error>> {
    let optimizer = common::adamw(3e-3);
    let pipelined = mlp_loss::trace(dims(), p, true)?;
    let trained: Vec<usize> = (DATA..pipelined.params.len()).collect();
    let step = step_program(&pipelined, 0, &trained, &optimizer)?;
    let sequential = mlp_loss::trace(dims(), p, false)?;
    let reference_step = step_program(&sequential, 0, &trained, &optimizer)?;
    let started = Instant::now();
    let mut trainer = Trainer::on_mesh(step, mesh.clone(), initial.to_vec())?;
    if let Some(exe) = common::report_compiled(&trainer, started.elapsed()) {
        println!("  per loop (forward, then backward):\n{}", loop_report(exe));
    }
    let mut reference = Trainer::reference(reference_step, initial.to_vec())?;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(42);
    Ok(common::train(
        &mut trainer,
        &mut reference,
        steps,
        CHECKED_STEPS,
        WINDOW,
        MICROBATCHES * ROWS,
        "rows",
        || batch(&mut rng, teacher),
        None,
    )?)
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(STEPS);
    let mesh = mlp_loss::mesh([STAGES, MODEL])?;
    let teacher = teacher(&mut Xoshiro256PlusPlus::seed_from_u64(3));
    let probe = batch(&mut Xoshiro256PlusPlus::seed_from_u64(1), &teacher);
    let model = mlp_loss::trace(dims(), Pipeline::gpipe(STAGES, REPEATS, MICROBATCHES), true)?;
    let trained: Vec<usize> = (DATA..model.params.len()).collect();
    // Uniform in ±0.5/sqrt(fan-in), the fan-in after the stage and repeat dims.
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
    let initial: Vec<Literal> = (trained.iter())
        .map(|&i| {
            let shape = &model.node(model.params[i]).ty.shape;
            let bound = 0.5 / (shape[2] as f32).sqrt();
            uniform_f32(&mut rng, shape, -bound, bound)
        })
        .collect();
    println!(
        "model: {} residual MLP layers (d {FEATURES}, hidden {HIDDEN}) on {STAGES} stages x {MODEL}-way model parallelism, {MICROBATCHES} microbatches of {ROWS} rows",
        STAGES * REPEATS
    );
    let schedules = [
        ("GPipe", Pipeline::gpipe(STAGES, REPEATS, MICROBATCHES)),
        (
            "circular",
            Pipeline::circular(STAGES, REPEATS, MICROBATCHES),
        ),
    ];
    let mut inputs = probe.clone();
    inputs.extend(initial.iter().cloned());
    for (name, p) in schedules {
        let time = forward_report(name, p, &mesh, &inputs)?;
        println!("  forward time {:.2} ms", time.as_secs_f64() * 1e3);
    }
    let (gpipe, circular) = (schedules[0].1, schedules[1].1);
    if circular.bubble_fraction() >= gpipe.bubble_fraction() {
        return Err("the circular schedule's bubble fraction is not below GPipe's".into());
    }
    for (name, p) in schedules {
        println!("training the {name} pipeline:");
        let run = train(p, &mesh, &initial, steps, &teacher)?;
        let file = format!("train_pipeline_{}_loss.svg", name.to_lowercase());
        common::write_curves(
            &common::output_path(&file),
            &format!("{name} pipeline"),
            &run,
        )?;
        println!(
            "  loss {:.4} at step 1 -> {:.4} (mean of the last {} steps); {:.2} ms/step",
            run.first,
            run.mean_last,
            run.window,
            run.elapsed.as_secs_f64() * 1e3 / steps.max(1) as f64
        );
        println!(
            "  first {CHECKED_STEPS} losses vs the layers in sequence on one device: max relative difference {:.2e}",
            run.max_diff
        );
        if run.max_diff > 1e-4 {
            return Err(format!(
                "{name}: the mesh differs from the reference by {}",
                run.max_diff
            )
            .into());
        }
        if steps >= STEPS && run.mean_last >= 0.5 * run.first {
            return Err(format!(
                "{name}: the loss did not halve in {steps} steps: {} -> {}",
                run.first, run.mean_last
            )
            .into());
        }
    }
    Ok(())
}
