//! Donated inputs (JAX's `donate_argnums`, `CompileOptions::donated`): a training step
//! that consumes its parameters and optimizer state updates them in place.
//!
//! - the same losses and parameters, bit for bit, as without donation, on a 2x4 thread
//!   mesh and on the reference;
//! - the process's allocator counts what the memory analysis predicts, and the new
//!   weights and state no longer beside the old ones (the language model's and the
//!   U-Net's steps);
//! - a donating step that fails loses what it was given (a typed error at the next
//!   step, no panic), and a donated index that is no input is an error at compile time.
//!
//! The allocator counts the whole process, so the measuring test holds a lock that the
//! other tests of this file take too.

use std::sync::Mutex;

use gspmd::models::transformer::language_model;
use gspmd::models::unet::denoise;
use gspmd::prelude::*;
use gspmd::runtime::pooled_bytes;
use gspmd::train::{Initializer, Optimizer, TrainStep, Trainer, step_program};
use gspmd::{CompileOptions, compile_with};
use peak_alloc::PeakAlloc;

#[global_allocator]
static ALLOCATOR: PeakAlloc = PeakAlloc;

/// Held by every test: the allocator's counts are the process's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The language model's AdamW step, every weight trained; a small batch, so that the
/// weights and state, not the activations, make the peak (at the update).
fn step() -> TrainStep {
    let dims = language_model::Dims {
        B: 2,
        S: 8,
        V: 64,
        D: 256,
        L: 2,
        H: 4,
        K: 64,
        F: 1024,
    };
    let model = language_model::trace(dims, DType::F32, 0.0).expect("traces");
    step_program(
        &model,
        0,
        &["*.*", "embed", "position", "unembed"],
        &Optimizer::adamw(1e-2),
    )
    .expect("step")
}

fn donating(step: &TrainStep) -> CompileOptions {
    CompileOptions {
        donated: step.carried(),
        ..CompileOptions::default()
    }
}

fn init() -> Initializer {
    Initializer::new(3).rule("*", gspmd::train::Init::Normal { std: 0.05 })
}

/// Tokens, next tokens and weights of batch `k`.
fn batch(k: usize) -> Vec<Literal> {
    let tokens = |shift: usize| {
        Literal::I32(gspmd::ndarray::ArrayD::from_shape_fn(
            gspmd::ndarray::IxDyn(&[2, 8]),
            |ix| ((ix[0] * 7 + ix[1] * 3 + k + shift) % 64) as i32,
        ))
    };
    vec![
        tokens(0),
        tokens(1),
        Literal::full(&[2, 8], DType::F32, 1.0),
    ]
}

/// Three steps of `trainer`: the losses and the parameters after them.
fn train(mut trainer: Trainer) -> (Vec<u32>, Vec<(String, Vec<u32>)>) {
    let losses = (0..3)
        .map(|k| trainer.step(&batch(k)).expect("steps").to_bits())
        .collect();
    let params = (trainer.params().expect("params").into_iter())
        .map(|(name, value)| (name, value.bit_patterns()))
        .collect();
    (losses, params)
}

#[test]
fn donating_steps_train_bitwise_like_lending_ones() {
    let _one = lock();
    let step = step();
    let mesh = || language_model::mesh([2, 4]).expect("mesh");
    let lent = train(Trainer::on_mesh(step.clone(), mesh(), init()).expect("trainer"));
    let options = donating(&step);
    let donated = Trainer::on_mesh_with(step.clone(), mesh(), init(), &options);
    assert_eq!(train(donated.expect("trainer")), lent, "2x4 thread mesh");
    let reference = train(Trainer::reference(step.clone(), init()).expect("trainer"));
    let donated = Trainer::with_options(step, Reference::new(), init(), &options);
    assert_eq!(train(donated.expect("trainer")), reference, "reference");
}

/// The bytes one step of `step` on one device (`mesh`, of one device) allocates beyond
/// what is allocated before it (what the device's pool holds included), the memory
/// analysis's prediction of them, and the most the pool may hold beyond that (its
/// headroom), compiled with `options`. (On one device no weight is gathered: the
/// weights, their gradients and their state make the peak.)
fn step_allocation(
    step: &TrainStep,
    mesh: Mesh,
    batch: &dyn Fn(usize) -> Vec<Literal>,
    options: &CompileOptions,
) -> (usize, usize, usize) {
    let devices = mesh.num_devices();
    let mut trainer = Trainer::on_mesh_with(step.clone(), mesh, init(), options).expect("trainer");
    let analysis = trainer.executable().memory_analysis();
    let inputs: usize = (trainer.executable().spmd().program.params.iter())
        .map(|&p| trainer.executable().spmd().program.ty(p).size_in_bytes())
        .sum();
    // A first step makes the plan and fills the pools.
    trainer.step(&batch(0)).expect("steps");
    ALLOCATOR.reset_peak_usage();
    let before = ALLOCATOR.current_usage() - pooled_bytes();
    trainer.step(&batch(1)).expect("steps");
    let counted = ALLOCATOR.peak_usage() - before;
    (
        counted,
        devices * (analysis.peak_bytes - inputs),
        devices * analysis.pool_headroom_bytes(),
    )
}

/// Scratch inside kernels that the memory analysis does not model (its module doc says
/// so): about 100 KB on both steps here, the matrix kernel's packing buffers.
const UNMODELLED_SCRATCH: usize = 128 << 10;

/// Lending, the update's new weights and state (some written into the gradients'
/// buffers) sit beside the old ones: the peak. Donating, they overwrite the old ones,
/// and the peak moves into the backward pass: the counted and the predicted peak both
/// drop by at least a quarter of the weights and state, and the count is within 10%
/// (plus [`UNMODELLED_SCRATCH`]) of the range from the prediction to it plus the pool's
/// headroom.
fn donation_lowers_the_peak(
    step: &TrainStep,
    mesh: impl Fn() -> Mesh,
    batch: &dyn Fn(usize) -> Vec<Literal>,
) {
    let carried: usize = (step.carried().iter())
        .map(|&i| step.program.ty(step.program.params[i]).size_in_bytes())
        .sum();
    let (lending, lending_predicted, lending_headroom) =
        step_allocation(step, mesh(), batch, &CompileOptions::default());
    let (donating, predicted, headroom) = step_allocation(step, mesh(), batch, &donating(step));
    println!(
        "{}: one step allocates {lending} bytes lending (predicted {lending_predicted}), \
         {donating} donating (predicted {predicted}); weights and state: {carried} bytes",
        step.program.name
    );
    assert!(
        donating + carried / 4 <= lending,
        "donating saved {} of {carried} bytes",
        lending.saturating_sub(donating)
    );
    assert!(
        predicted + carried / 4 <= lending_predicted,
        "the analysis predicts donating saves {} of {carried} bytes",
        lending_predicted.saturating_sub(predicted)
    );
    for (counted, predicted, headroom) in [
        (lending, lending_predicted, lending_headroom),
        (donating, predicted, headroom),
    ] {
        let nearest = counted.clamp(predicted, predicted + headroom);
        assert!(
            counted.abs_diff(nearest) <= counted / 10 + UNMODELLED_SCRATCH,
            "predicted {predicted} (pool headroom {headroom}), counted {counted}"
        );
    }
}

#[test]
fn a_donating_step_writes_the_new_weights_and_state_over_the_old() {
    let _one = lock();
    let mesh = || language_model::mesh([1, 1]).expect("mesh");
    donation_lowers_the_peak(&step(), mesh, &batch);
}

/// The U-Net's AdamW step on small images (1x8x8), so that its weights and state, not
/// its activations, make the peak.
#[test]
fn a_donating_unet_step_writes_the_new_weights_and_state_over_the_old() {
    let _one = lock();
    let model = denoise::trace(denoise::Dims { B: 1, H: 8, W: 8 }).expect("traces");
    // Parameters 0 and 1 are the noisy and the clean images; the rest are trained.
    let trained: Vec<usize> = (2..model.params.len()).collect();
    let step = step_program(&model, 0, &trained, &Optimizer::adamw(1e-3)).expect("step");
    let image = |k: usize, shift: usize| {
        Literal::from(gspmd::ndarray::ArrayD::from_shape_fn(
            gspmd::ndarray::IxDyn(&[1, 8, 8, 1]),
            |ix| ((ix[1] * 5 + ix[2] * 3 + k + shift) % 7) as f32 / 7.0,
        ))
    };
    let batch = |k: usize| vec![image(k, 1), image(k, 0)];
    donation_lowers_the_peak(&step, || denoise::mesh([1, 1]).expect("mesh"), &batch);
}

#[test]
fn a_failed_donating_step_loses_its_inputs_with_a_typed_error() {
    let _one = lock();
    let step = step();
    let mesh = language_model::mesh([2, 4]).expect("mesh");
    let threads = ThreadMesh::new(mesh)
        .expect("threads")
        .with_memory_limit(64 << 10);
    let mut trainer =
        Trainer::with_options(step.clone(), threads, init(), &donating(&step)).expect("trainer");
    let failed = trainer.step(&batch(0));
    assert!(
        matches!(
            failed,
            Err(gspmd::Error::DeviceFailed { .. } | gspmd::Error::OutOfMemory { .. })
        ),
        "{failed:?}"
    );
    let next = trainer.step(&batch(1));
    assert!(
        matches!(
            &next,
            Err(gspmd::Error::Input {
                problem: gspmd::error::InputProblem::NoResident { .. },
                ..
            })
        ),
        "{next:?}"
    );
    let program = &step.program;
    let beyond = CompileOptions {
        donated: vec![program.params.len()],
        ..CompileOptions::default()
    };
    let mesh = language_model::mesh([2, 4]).expect("mesh");
    let error = compile_with(program, &mesh, &beyond);
    assert!(
        matches!(error, Err(gspmd::Error::Input { .. })),
        "{error:?}"
    );
}
