//! The memory analysis against the allocator: for the example language model's training
//! step on 1x1, 2x1 and 2x4 meshes, the peak that [`Executable::memory_analysis`]
//! predicts is within 10% of the peak the process's allocator counts while the step
//! runs.
//!
//! What is compared: the bytes a step allocates beyond its inputs. Every input
//! (weights, optimizer state, data) is resident on the devices before the measured run,
//! so the allocator's peak during the run, less what was allocated when it started, is
//! what the devices allocate together; the prediction is the number of devices times
//! the analysis's peak less its inputs (every device runs the same program on blocks of
//! the same shapes, and collectives keep them in step).
//!
//! The allocator counts the whole process: this file holds one test, so that no other
//! test allocates while it measures.

use gspmd::models::transformer::language_model;
use gspmd::prelude::*;
use gspmd::runtime::{Input, Output, sample_inputs};
use gspmd::train::{Optimizer, step_program};
use peak_alloc::PeakAlloc;

#[global_allocator]
static ALLOCATOR: PeakAlloc = PeakAlloc;

fn dims() -> language_model::Dims {
    language_model::Dims {
        B: 8,
        S: 32,
        V: 64,
        D: 128,
        L: 2,
        H: 4,
        K: 32,
        F: 512,
    }
}

/// `(predicted, counted)` bytes allocated by one step on a `data` x `model` mesh.
fn step_peak(mesh: [usize; 2]) -> (usize, usize) {
    let model = language_model::trace(dims(), DType::F32).expect("traces");
    let trained: Vec<usize> = (3..model.params.len()).collect();
    let step = step_program(&model, 0, &trained, &Optimizer::adamw(1e-3)).expect("step");
    let mesh = language_model::mesh(mesh).expect("mesh");
    let devices = mesh.num_devices();
    let exe = compile(&step.program, &mesh).expect("compiles");
    let analysis = exe.memory_analysis();
    let b = analysis.breakdown;
    let inputs = b.parameters + b.optimizer_state;
    let threads = ThreadMesh::new(mesh).expect("threads");
    let values = sample_inputs(&step.program, 3);
    let keys: Vec<String> = (0..values.len()).map(|i| format!("in/{i}")).collect();
    for ((key, value), (_, sharding)) in keys.iter().zip(&values).zip(&exe.spmd.inputs) {
        threads.upload(key, value, sharding).expect("uploads");
    }
    drop(values);
    let inputs_resident: Vec<Input> = keys.iter().map(|k| Input::Resident(k)).collect();
    let outputs: Vec<Output> = (0..exe.spmd.outputs.len())
        .map(|k| Output::Resident(format!("out/{k}")))
        .collect();
    // A first run makes the plan, the outputs' slots and whatever the threads keep.
    exe.execute(&threads, &inputs_resident, &outputs)
        .expect("runs");
    ALLOCATOR.reset_peak_usage();
    let before = ALLOCATOR.current_usage();
    exe.execute(&threads, &inputs_resident, &outputs)
        .expect("runs");
    let counted = ALLOCATOR.peak_usage() - before;
    (devices * (analysis.peak_bytes - inputs), counted)
}

#[test]
fn predicted_peak_is_within_ten_percent_of_the_counted_peak() {
    let mut failures = Vec::new();
    for mesh in [[1, 1], [2, 1], [2, 4]] {
        let (predicted, counted) = step_peak(mesh);
        let error = (predicted as f64 - counted as f64).abs() / counted as f64;
        println!(
            "{}x{}: predicted {predicted} bytes, counted {counted} bytes ({:+.1}%)",
            mesh[0],
            mesh[1],
            100.0 * (predicted as f64 / counted as f64 - 1.0)
        );
        if error > 0.10 {
            failures.push(mesh);
        }
    }
    assert!(failures.is_empty(), "off by more than 10% on {failures:?}");
}
