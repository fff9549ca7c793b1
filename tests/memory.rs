//! The memory analysis against the allocator: for the training steps of the examples'
//! models (the language model, the U-Net, the mixture of experts; AdamW) on 1x1, 2x1
//! and 2x4 meshes, the peak that [`Executable::memory_analysis`] predicts is within 10%
//! of the peak the process's allocator counts while the step runs.
//!
//! What is compared: the bytes a step allocates beyond its inputs. Every input
//! (weights, optimizer state, data) is resident on the devices before the measured run,
//! so the allocator's peak during the run, less what was allocated when it started, is
//! what the devices allocate together; the prediction is the number of devices times
//! the analysis's peak less its inputs (every device runs the same program on blocks of
//! the same shapes). Collectives keep the devices of a group nearly in step, not in
//! lockstep: a device can be ahead while a slower peer still holds the operand it
//! posted, which [`MemoryAnalysis::in_flight_bytes`] bounds. The prediction is therefore
//! the range from the in-step peak to it plus that bound, and the counted peak must lie
//! within 10% of the range.
//!
//! Each device keeps the buffers a run frees in a pool for the next run, within the
//! analysis's peak (see `runtime::pooled_bytes`): what the pools hold when the measured
//! run starts counts as allocated by it.
//!
//! The allocator counts the whole process: this file holds one test, so that no other
//! test allocates while it measures.

use gspmd::models::moe::moe_language_model;
use gspmd::models::transformer::language_model;
use gspmd::models::unet::denoise;
use gspmd::prelude::*;
use gspmd::runtime::{Input, Output, pooled_bytes, sample_inputs};
use gspmd::train::{Optimizer, TrainStep, step_program};
use peak_alloc::PeakAlloc;

#[global_allocator]
static ALLOCATOR: PeakAlloc = PeakAlloc;

/// The AdamW step of `model` training every float parameter from `first` on (not the
/// language model's key `rng`).
fn adamw_step(model: &Program, first: usize) -> TrainStep {
    let trained: Vec<usize> = (first..model.params.len())
        .filter(|&i| model.ty(model.params[i]).dtype == DType::F32)
        .collect();
    step_program(model, 0, &trained, &Optimizer::adamw(1e-3)).expect("step")
}

/// The language model of `examples/train_transformer.rs`, larger.
fn language_model_step() -> TrainStep {
    let dims = language_model::Dims {
        B: 8,
        S: 32,
        V: 64,
        D: 128,
        L: 2,
        H: 4,
        K: 32,
        F: 512,
    };
    adamw_step(
        &language_model::trace(dims, DType::F32, 0.0).expect("traces"),
        3,
    )
}

/// The U-Net denoiser of `examples/train_unet.rs`, on larger images.
fn unet_step() -> TrainStep {
    let dims = denoise::Dims { B: 8, H: 64, W: 64 };
    adamw_step(&denoise::trace(dims).expect("traces"), 2)
}

/// The mixture of experts of `examples/train_moe.rs`, larger.
fn moe_step() -> TrainStep {
    let dims = moe_language_model::Dims {
        G: 16,
        S: 32,
        V: 32,
        M: 64,
        N: 4,
        K: 16,
        E: 4,
        H: 256,
    };
    adamw_step(&moe_language_model::trace(dims, 24).expect("traces"), 3)
}

/// `(predicted, most predicted, counted)` bytes allocated by one run of `step` on
/// `mesh`.
fn step_peak(step: &TrainStep, mesh: Mesh) -> (usize, usize, usize) {
    let devices = mesh.num_devices();
    let exe = compile(&step.program, &mesh).expect("compiles");
    let analysis = exe.memory_analysis();
    let b = analysis.breakdown;
    let inputs = b.parameters + b.optimizer_state;
    let threads = ThreadMesh::new(mesh).expect("threads");
    let values = sample_inputs(&step.program, 3);
    let keys: Vec<String> = (0..values.len()).map(|i| format!("in/{i}")).collect();
    for ((key, value), (_, sharding)) in keys.iter().zip(&values).zip(&exe.spmd().inputs) {
        threads.upload(key, value, sharding).expect("uploads");
    }
    drop(values);
    let inputs_resident: Vec<Input> = keys.iter().map(|k| Input::Resident(k)).collect();
    let outputs: Vec<Output> = (0..exe.spmd().outputs.len())
        .map(|k| Output::Resident(format!("out/{k}")))
        .collect();
    // A first run makes the plan, the outputs' slots and whatever the threads keep.
    exe.execute(&threads, &inputs_resident, &outputs)
        .expect("runs");
    ALLOCATOR.reset_peak_usage();
    // The devices' pools keep the first run's free buffers for the second: memory the
    // step holds, not what it held before.
    let before = ALLOCATOR.current_usage() - pooled_bytes();
    exe.execute(&threads, &inputs_resident, &outputs)
        .expect("runs");
    let counted = ALLOCATOR.peak_usage() - before;
    let in_step = devices * (analysis.peak_bytes - inputs);
    (
        in_step,
        in_step + devices * analysis.in_flight_bytes,
        counted,
    )
}

#[test]
fn predicted_peak_is_within_ten_percent_of_the_counted_peak() {
    type Model = (
        &'static str,
        fn() -> TrainStep,
        fn([usize; 2]) -> Result<Mesh>,
    );
    let models: [Model; 3] = [
        ("language model", language_model_step, language_model::mesh),
        ("U-Net", unet_step, denoise::mesh),
        ("mixture of experts", moe_step, moe_language_model::mesh),
    ];
    let mut failures = Vec::new();
    for (name, step, mesh_of) in models {
        let step = step();
        for mesh in [[1, 1], [2, 1], [2, 4]] {
            let (low, high, counted) = step_peak(&step, mesh_of(mesh).expect("mesh"));
            let nearest = counted.clamp(low, high);
            let error = nearest as f64 / counted as f64 - 1.0;
            println!(
                "{name} {}x{}: predicted {low}..={high} bytes, counted {counted} bytes \
                 ({:+.1}%)",
                mesh[0],
                mesh[1],
                100.0 * error
            );
            if error.abs() > 0.10 {
                failures.push(format!("{name} on {}x{}", mesh[0], mesh[1]));
            }
        }
    }
    assert!(failures.is_empty(), "off by more than 10% on {failures:?}");
}
