//! The paper's dense Transformer table (GSPMD, arXiv 2105.04663 v2, Table 2) planned
//! symbolically — traced, propagated and partitioned with shapes only (no tensor data
//! exists anywhere: every constant the pipeline makes is a scalar) — and predicted per
//! device beside the published figures: peak memory ([`Executable::memory_analysis`]),
//! step time on a TPUv3 core ([`DeviceModel::tpu_v3_core`], [`Executable::cost_analysis`])
//! and FLOPS utilisation.
//!
//! ```text
//! cargo run --release --example paper_scale
//! ```
//!
//! Each row is the paper's configuration: M = 8192, H = 65536, 128 heads of 256 (the
//! 1T model 4x wider: M = 16384, H = 131072, 256 heads of 256), sequences of 1024
//! tokens, its layers, batch and mesh `(X, Y)` of TPUv3 cores, weights split `(X, Y)`
//! and activations `(X, _, Y)` (`gspmd::models::dense`), f32 weights and optimizer
//! state, bf16 activations, Adafactor (second moments factored), the layers under one
//! `scan` whose backward pass reads each layer's matrix products from the forward scan
//! and recomputes the rest (the remat policy `dots_saveable`, [`PAPER_REMAT`]: the
//! policy whose saved bytes make the paper's peaks), and the weights and optimizer state
//! donated (updated in place, as XLA's input-output aliasing does).
//!
//! The predicted step is the per-device program scheduled on one compute and one
//! communication stream, each collective overlapping the compute independent of it
//! ([`Overlap::Scheduled`]); the table also prints it with every collective after the
//! compute (`serial`) and fully overlapped (`ovl`).
//!
//! The device model has one fitted constant, the fraction of peak FLOP/s the compute
//! reaches, set so that the first row's predicted step is the paper's, then held fixed;
//! the table prints each row's error, and below it the worst error on the other rows for
//! every choice of the fitted row (leave-one-out). FLOPS utilisation is counted as the
//! paper counts it, model FLOPs without the recomputation (`6 P T` plus attention's
//! `12 L B S^2 N D`) over the step time and the devices' peak.
//!
//! Checks (the example exits with an error if one fails): every configuration plans in
//! under 2 s; weight memory per device is parameters x 4 bytes / devices; predicted
//! step times within 20% of the paper's and predicted peak memory within 10% on every
//! row; and for one model (1T, batch 64)
//! across five meshes, memory per device x devices stays within 10% (memory O(1/XY))
//! and bytes per device fit `a/X + b/Y` within 10% (`gspmd::models::dense::scaling_failures`).

use std::time::{Duration, Instant};

use gspmd::analysis::{CostAnalysis, DeviceModel, Overlap};
use gspmd::models::dense::{self, Config};
use gspmd::prelude::*;
use gspmd::train::Optimizer;
use gspmd::{CompileOptions, Executable, compile_with};

/// One row of the paper's Table 2.
struct Published {
    name: &'static str,
    layers: usize,
    /// The 1T model: every layer 4x the parameters.
    wide: bool,
    mesh: (usize, usize),
    batch: usize,
    /// Peak memory per core, GiB.
    peak_gib: f64,
    step_seconds: f64,
    /// FLOPS utilisation, percent.
    utilisation: f64,
}

/// The paper's Table 2 (dense Transformer, 2-D finalized sharding, TPUv3 cores of
/// 16 GiB), as read in issue 30.
const TABLE_2: [Published; 7] = [
    row("64B", 32, false, (8, 16), 64, 15.3, 5.74, 62.7),
    row("64B", 32, false, (16, 32), 256, 13.3, 6.25, 57.1),
    row("64B", 32, false, (32, 64), 1024, 15.56, 6.30, 56.9),
    row("128B", 64, false, (32, 64), 512, 14.0, 6.31, 56.5),
    row("256B", 128, false, (32, 64), 256, 12.9, 6.71, 54.1),
    row("512B", 256, false, (32, 64), 128, 13.6, 7.64, 47.5),
    row("1T", 128, true, (32, 64), 128, 15.8, 12.66, 55.6),
];

#[allow(clippy::too_many_arguments)]
const fn row(
    name: &'static str,
    layers: usize,
    wide: bool,
    mesh: (usize, usize),
    batch: usize,
    peak_gib: f64,
    step_seconds: f64,
    utilisation: f64,
) -> Published {
    Published {
        name,
        layers,
        wide,
        mesh,
        batch,
        peak_gib,
        step_seconds,
        utilisation,
    }
}

/// The remat policy of the layers' scan that the paper's peaks imply: each layer's
/// matrix products kept for the backward pass (`dots_saveable`). Per layer that is
/// `q, k, v`, the attention scores (`N S / M` = 16 layer inputs' worth), the context,
/// the output projection, the FFN's hidden layer (`H / M` = 8) and its output: 30
/// layer inputs `[B/X, S, M/Y]` in bf16, what the paper's peaks hold beyond
/// `nothing_saveable`'s (28-46 per layer, see `benches/README.md`).
const PAPER_REMAT: Remat = Remat::DotsSaveable;

/// The paper's layer sizes (4x the parameters per layer when `wide`).
fn config(layers: usize, wide: bool, batch: usize, dtype: DType, remat: Remat) -> Config {
    let k = if wide { 2 } else { 1 };
    Config {
        layers,
        model: 8192 * k,
        hidden: 65536 * k,
        heads: 128 * k,
        head_dim: 256,
        batch,
        seq: 1024,
        dtype,
        remat,
    }
}

/// Model FLOPs of one training step as the paper counts them (no recomputation):
/// `6 P T` for the weights plus `12 L B S^2 N D` for attention's two products.
fn model_flops(c: &Config) -> f64 {
    let tokens = (c.batch * c.seq) as f64;
    let attention = 12.0 * (c.layers * c.batch * c.seq * c.seq * c.heads * c.head_dim) as f64;
    6.0 * c.params() as f64 * tokens + attention
}

/// What one planned configuration gives per device.
struct Plan {
    plan_time: Duration,
    weights: usize,
    peak: usize,
    bytes: usize,
    exe: Executable,
}

impl Plan {
    /// The cost on a TPUv3 core reaching `efficiency` of its peak FLOP rate.
    fn cost(&self, efficiency: f64) -> CostAnalysis {
        self.exe
            .cost_analysis(&DeviceModel::tpu_v3_core().with_efficiency(efficiency))
    }

    /// The predicted step: the program scheduled with its collectives overlapped
    /// where they can be ([`Overlap::Scheduled`]).
    fn step(&self, efficiency: f64) -> f64 {
        self.cost(efficiency).step_seconds(Overlap::Scheduled)
    }
}

/// Plans `c` on the mesh `(x, y)` with `optimizer`, the weights and state donated.
fn plan(c: &Config, (x, y): (usize, usize), optimizer: &Optimizer) -> Result<Plan> {
    let started = Instant::now();
    let step = dense::step_with(c, optimizer)?;
    let donated = (step.params.iter())
        .flat_map(|p| std::iter::once(p.input).chain(p.state.iter().map(|s| s.input)))
        .collect();
    let options = CompileOptions {
        donated,
        ..CompileOptions::default()
    };
    let exe = compile_with(&step.program, &dense::mesh(x, y)?, &options)?;
    let memory = exe.memory_analysis();
    let plan_time = started.elapsed();
    let bytes = exe
        .cost_analysis(&DeviceModel::tpu_v3_core())
        .bytes_received();
    let program = &exe.spmd().program;
    let weights = (step.params.iter())
        .map(|p| program.ty(program.params[p.input]).size_in_bytes())
        .sum();
    Ok(Plan {
        plan_time,
        weights,
        peak: memory.peak_bytes,
        bytes,
        exe,
    })
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

/// The efficiency that makes `plan`'s predicted step `published` seconds (bisection:
/// the step falls as the efficiency rises).
fn fit(plan: &Plan, published: f64) -> f64 {
    let (mut low, mut high) = (0.01, 4.0);
    for _ in 0..40 {
        let mid = 0.5 * (low + high);
        if plan.step(mid) > published {
            low = mid;
        } else {
            high = mid;
        }
    }
    0.5 * (low + high)
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut failures: Vec<String> = Vec::new();
    let adafactor = Optimizer::adafactor(1e-3);
    let tpu = DeviceModel::tpu_v3_core();
    let mut plans = Vec::new();
    for p in &TABLE_2 {
        let c = config(p.layers, p.wide, p.batch, DType::BF16, PAPER_REMAT);
        let planned = plan(&c, p.mesh, &adafactor)?;
        if planned.plan_time > Duration::from_secs(2) {
            failures.push(format!(
                "{} on {:?}: planned in {:?} (over 2 s)",
                p.name, p.mesh, planned.plan_time
            ));
        }
        let want = (c.params() * 4) as f64 / (p.mesh.0 * p.mesh.1) as f64;
        if (planned.weights as f64 / want - 1.0).abs() > 0.01 {
            failures.push(format!(
                "{}: weights {} bytes per device, expected {want:.0}",
                p.name, planned.weights
            ));
        }
        plans.push((c, planned));
    }
    let efficiency = fit(&plans[0].1, TABLE_2[0].step_seconds);
    let tpu = tpu.with_efficiency(efficiency);
    println!(
        "Table 2 (dense), TPUv3 model: {:.1} TFLOP/s peak per core at {:.3} of peak (fitted on row 1), ICI torus",
        tpu.flops_per_second / 1e12,
        efficiency
    );
    println!(
        "(layers' scan: {PAPER_REMAT}; gap/layer: the paper's peak less ours, in layer inputs per layer; step: the program scheduled on a compute and a communication stream, serial: collectives after compute, ovl: fully overlapped)\n"
    );
    println!(
        "{:>5} {:>6} {:>8} {:>5} {:>6} | {:>9} {:>9} {:>6} {:>9} | {:>7} {:>7} {:>6} {:>7} {:>7} | {:>6} {:>6} | {:>7} {:>8}",
        "model",
        "layers",
        "mesh",
        "batch",
        "plan",
        "peak",
        "paper",
        "ratio",
        "gap/layer",
        "step",
        "paper",
        "ratio",
        "serial",
        "ovl",
        "util",
        "paper",
        "comm",
        "recv/dev"
    );
    for (i, (p, (c, planned))) in TABLE_2.iter().zip(&plans).enumerate() {
        let cost = planned.cost(efficiency);
        let step = cost.step_seconds(Overlap::Scheduled);
        let serial = cost.step_seconds(Overlap::None);
        let overlapped = cost.step_seconds(Overlap::Full);
        let devices = (p.mesh.0 * p.mesh.1) as f64;
        let utilisation = 100.0 * model_flops(c) / (devices * tpu.flops_per_second * step);
        let memory_ratio = gib(planned.peak) / p.peak_gib;
        // The paper's extra bytes in units of one layer's input `[B/X, S, M/Y]` per layer.
        let layer_input = (c.batch / p.mesh.0 * c.seq * c.model / p.mesh.1 * 2) as f64;
        let gap = (p.peak_gib * f64::from(1u32 << 30) - planned.peak as f64)
            / (layer_input * c.layers as f64);
        let step_ratio = step / p.step_seconds;
        println!(
            "{:>5} {:>6} {:>8} {:>5} {:>4.2} s | {:>5.2} GiB {:>5.2} GiB {:>6.3} {:>9.1} | {:>5.2} s {:>5.2} s {:>6.3} {:>5.2} s {:>5.2} s | {:>5.1}% {:>5.1}% | {:>5.2} s {:>6.1} GiB",
            p.name,
            p.layers,
            format!("({},{})", p.mesh.0, p.mesh.1),
            p.batch,
            planned.plan_time.as_secs_f64(),
            gib(planned.peak),
            p.peak_gib,
            memory_ratio,
            gap,
            step,
            p.step_seconds,
            step_ratio,
            serial,
            overlapped,
            utilisation,
            p.utilisation,
            cost.communication_seconds,
            gib(planned.bytes),
        );
        let row = i + 1;
        if (step_ratio - 1.0).abs() > 0.20 {
            failures.push(format!(
                "row {row} ({} on {:?}): predicted step {step:.2} s, the paper's {} s",
                p.name, p.mesh, p.step_seconds
            ));
        }
        if (memory_ratio - 1.0).abs() > 0.10 {
            failures.push(format!(
                "row {row} ({} on {:?}): predicted peak {:.2} GiB, the paper's {} GiB",
                p.name,
                p.mesh,
                gib(planned.peak),
                p.peak_gib
            ));
        }
    }
    // The paper's utilisation implies its model FLOPs: check we count as it does.
    let implied: Vec<String> = (TABLE_2.iter().zip(&plans))
        .map(|(p, (c, _))| {
            let devices = (p.mesh.0 * p.mesh.1) as f64;
            let flops = p.utilisation / 100.0 * devices * tpu.flops_per_second * p.step_seconds;
            format!("{:.3}", flops / model_flops(c))
        })
        .collect();
    println!(
        "\nthe paper's utilisation x peak x step / our model FLOPs, per row: {}",
        implied.join(" ")
    );
    println!("leave-one-out: efficiency fitted on one row, worst step-time error on the others");
    for (j, (_, planned)) in plans.iter().enumerate() {
        let e = fit(planned, TABLE_2[j].step_seconds);
        let worst = (TABLE_2.iter().zip(&plans).enumerate())
            .filter(|&(i, _)| i != j)
            .map(|(_, (p, (_, q)))| (q.step(e) / p.step_seconds - 1.0).abs())
            .fold(0.0, f64::max);
        println!(
            "  fitted on row {}: efficiency {e:.3}, worst error {:.1}%",
            j + 1,
            100.0 * worst
        );
    }

    // One model (1T, batch 64, f32 activations, SGD) on every mesh: the scaling of memory
    // and communication.
    println!("\n1T model, batch 64, across meshes:");
    let c = config(512, false, 64, DType::F32, Remat::NothingSaveable);
    let sgd = Optimizer::sgd(1e-3, 0.0);
    let mut points = Vec::new();
    for (x, y) in [(8, 16), (16, 16), (16, 32), (32, 32), (32, 64)] {
        let planned = plan(&c, (x, y), &sgd)?;
        println!(
            "  ({x:>2},{y:>2}): memory {:>7.2} GiB/device (x devices: {:>8.1} GiB), received {:>6.2} GiB/step/device",
            gib(planned.peak),
            gib(planned.peak * x * y),
            gib(planned.bytes)
        );
        points.push(dense::Point {
            x,
            y,
            memory: planned.peak,
            bytes: planned.bytes,
        });
    }
    failures.extend(dense::scaling_failures(&points, 0.10));
    if failures.is_empty() {
        println!("\nall checks pass");
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}
