//! Trains a small 2-D U-Net (`gspmd::models::unet`) to denoise images on a 2x4 thread
//! mesh with spatial partitioning: the batch over `data` (2), the image height over
//! `space` (4), every weight replicated.
//!
//! The data is synthetic and seeded: each 32x32 image holds a few rectangles and discs
//! of random brightness on a dark background (`clean`), and the model sees it with
//! uniform noise added (`noisy`); the loss is the mean squared error of its prediction
//! against `clean`.
//!
//! Printed: the collectives of the compiled step (by kind, bytes received per device),
//! the bytes an all-gather plan would move (each convolution of the step, forward and
//! backward, with its input gathered along its split spatial dims), the loss at step 1
//! and the mean of the last 10 steps (the example fails unless it is below half the
//! first), and the first 3 losses against the single-device reference (it fails if one
//! differs by more than 1e-4 relative).
//!
//! ```text
//! cargo run --release --example train_unet            # 150 steps
//! cargo run --release --example train_unet -- 20      # fewer steps
//! ```
//!
//! With `--bench` the step is timed instead (`benches/jax` compares it with JAX): no
//! reference run, no plot; `--mesh DxS` picks the `data`x`space` mesh (default 2x4),
//! `--warmup N` the untimed steps and `--dump PATH` writes the initial weights, the
//! first batches (`noisy.<i>`, `clean.<i>`) and their losses for
//! `benches/jax/unet_step.py` to replay.
//!
//! ```text
//! cargo run --release --example train_unet -- 20 --bench --mesh 1x1
//! ```

#[path = "common/bench.rs"]
mod bench;
mod common;

use std::time::Instant;

use gspmd::ir::Op;
use gspmd::models::unet::denoise;
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::train::{Init, Initializer, Trainer, step_program};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

const BATCH: usize = 8;
const SIZE: usize = 32;
const NOISE: f32 = 0.3;
/// Steps compared with the reference interpreter.
const CHECKED_STEPS: usize = 3;
/// Steps whose mean loss is reported at the end.
const WINDOW: usize = 10;

/// One batch: the noisy images and the clean ones, `[BATCH, SIZE, SIZE, 1]` each.
fn batch(rng: &mut Xoshiro256PlusPlus) -> Vec<Literal> {
    let mut clean = vec![0.0f32; BATCH * SIZE * SIZE];
    for image in clean.chunks_mut(SIZE * SIZE) {
        for _ in 0..rng.random_range(1..4) {
            let brightness = rng.random_range(0.5..1.0f32);
            let (cy, cx) = (
                rng.random_range(4..28) as f32,
                rng.random_range(4..28) as f32,
            );
            let (ry, rx) = (rng.random_range(3..9) as f32, rng.random_range(3..9) as f32);
            let disc = rng.random_bool(0.5);
            for (k, pixel) in image.iter_mut().enumerate() {
                let (dy, dx) = ((k / SIZE) as f32 - cy, (k % SIZE) as f32 - cx);
                let inside = if disc {
                    (dy / ry).powi(2) + (dx / rx).powi(2) <= 1.0
                } else {
                    dy.abs() <= ry && dx.abs() <= rx
                };
                if inside {
                    *pixel = brightness;
                }
            }
        }
    }
    let noisy: Vec<f32> = clean
        .iter()
        .map(|&c| c + rng.random_range(-NOISE..NOISE))
        .collect();
    let shape = IxDyn(&[BATCH, SIZE, SIZE, 1]);
    vec![
        Literal::F32(ArrayD::from_shape_vec(shape.clone(), noisy).expect("shape fits")),
        Literal::F32(ArrayD::from_shape_vec(shape, clean).expect("shape fits")),
    ]
}

/// Bytes per device that gathering the input of every convolution of `exe`'s step
/// (forward and backward) along its split spatial dims would receive: the input's
/// per-device block times (shards of its spatial dims - 1). Returns the bytes and the
/// number of convolutions that read a spatially split input.
fn all_gather_plan_bytes(exe: &Executable) -> (usize, usize) {
    let (program, mesh) = (exe.propagated(), &exe.spmd().mesh);
    let (mut bytes, mut convs) = (0, 0);
    for node in &program.nodes {
        let Op::Convolution(config) = &node.op else {
            continue;
        };
        let input = program.node(node.operands[0]);
        let Some(sharding) = &input.sharding else {
            continue;
        };
        let shards: usize = (config.dims.input_spatial.iter())
            .map(|&d| sharding.num_shards(d, mesh))
            .product();
        if shards > 1 {
            let local: usize = sharding.local_shape(mesh, &input.ty.shape).iter().product();
            bytes += local * input.ty.dtype.size_in_bytes() * (shards - 1);
            convs += 1;
        }
    }
    (bytes, convs)
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = bench::Args::parse(20, |arg, _| Err(format!("unknown option {arg}")))?;
    let steps = args.steps.unwrap_or(150);
    let model = denoise::trace(denoise::Dims {
        B: BATCH,
        H: SIZE,
        W: SIZE,
    })?;
    // Parameters 0 and 1 are the noisy and the clean images; the rest are trained.
    let trained: Vec<usize> = (2..model.params.len()).collect();
    let optimizer = common::adamw(3e-3);
    let step = step_program(&model, 0, &trained, &optimizer)?;
    let mesh = denoise::mesh(args.mesh.unwrap_or([2, 4]))?;
    // He-uniform: `±sqrt(6 / fan_in)`, fan-in the kernel's window times its input
    // channels (HWIO).
    let initial = Initializer::new(7).rule(
        "*",
        Init::FanIn {
            scale: 6f32.sqrt(),
            in_dims: vec![0, 1, 2],
        },
    );
    if let Some(timing) = &args.bench {
        let mut trainer = bench::trainer(step, mesh, initial)?;
        let [a, b] = args.mesh.unwrap_or([2, 4]);
        let label = format!("U-Net, mesh {a}x{b}");
        let mut data_rng = Xoshiro256PlusPlus::seed_from_u64(42);
        return bench::run(timing, &mut trainer, &label, &["noisy", "clean"], || {
            batch(&mut data_rng)
        });
    }

    println!(
        "U-Net denoiser: {BATCH} images of {SIZE}x{SIZE}, channels 8 and 16, batch over `data`, height over `space`"
    );
    let started = Instant::now();
    let mut trainer = Trainer::on_mesh(step.clone(), mesh, initial.clone())?;
    if let Some(exe) = common::report_compiled(&trainer, started.elapsed()) {
        let (bytes, convs) = all_gather_plan_bytes(exe);
        println!(
            "all-gather plan: {bytes} bytes received per device gathering the input of the {convs} \
             convolutions (forward and backward) that read a spatially split one"
        );
        println!("partitioner warnings: {}", exe.spmd().warnings.len());
    }

    let mut reference = Trainer::reference(step, initial)?;
    let mut data_rng = Xoshiro256PlusPlus::seed_from_u64(42);
    let run = common::train(
        &mut trainer,
        &mut reference,
        steps,
        CHECKED_STEPS,
        WINDOW,
        BATCH,
        "images",
        || batch(&mut data_rng),
        None,
    )?;
    common::write_curves(
        &common::output_path("train_unet_loss.svg"),
        "U-Net denoising",
        &run,
    )?;
    println!(
        "loss {:.4} at step 1 -> {:.4} (mean of the last {} steps, {:.2}x); {:.1} ms/step",
        run.first,
        run.mean_last,
        run.window,
        run.mean_last / run.first,
        run.elapsed.as_secs_f64() * 1e3 / steps.max(1) as f64,
    );
    println!(
        "first {CHECKED_STEPS} losses vs the single-device reference: max relative difference {:.2e}",
        run.max_diff
    );
    if run.max_diff > 1e-4 {
        return Err(format!("reference difference {} > 1e-4", run.max_diff).into());
    }
    if steps > WINDOW && run.mean_last >= 0.5 * run.first {
        return Err(format!(
            "loss {} did not fall below half of {}",
            run.mean_last, run.first
        )
        .into());
    }
    Ok(())
}
