//! Allocations per training step: the language model's AdamW step of
//! `examples/train_transformer.rs` on 1x1 and 2x4 thread meshes, counted by an
//! instrumented global allocator over steps after the first (which make the plans, the
//! collectives' groups and the buffer pools).
//!
//! Before the execution plan's buffer pool and the per-op allocations were removed
//! (issue 13), a step made 6,695 allocations on 1x1 and 39,179 on 2x4 (all 8 devices).
//!
//! The allocator counts the whole process: this file holds one test.

use std::alloc::System;

use gspmd::models::transformer::language_model;
use gspmd::prelude::*;
use gspmd::runtime::sample_inputs;
use gspmd::train::{Init, Initializer, Optimizer, Trainer, step_program};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The steps counted, after the warm-up steps.
const STEPS: usize = 5;

/// Allocations per step of the example's language model on `mesh`, over [`STEPS`]
/// steps after three warm-up steps.
fn allocations_per_step(mesh: [usize; 2]) -> usize {
    let dims = language_model::Dims {
        B: 16,
        S: 16,
        V: 16,
        D: 64,
        L: 2,
        H: 4,
        K: 16,
        F: 256,
    };
    let model = language_model::trace(dims, DType::F32).expect("traces");
    let trained: Vec<usize> = (3..model.params.len()).collect();
    let step = step_program(&model, 0, &trained, &Optimizer::adamw(1e-3)).expect("step");
    let mesh = language_model::mesh(mesh).expect("mesh");
    let init = Initializer::new(1).rule("*", Init::Uniform { bound: 0.1 });
    let mut trainer = Trainer::on_mesh(step, mesh, init).expect("trainer");
    let data: Vec<Literal> = sample_inputs(&model, 3).into_iter().take(3).collect();
    for _ in 0..3 {
        trainer.step(&data).expect("steps");
    }
    let region = Region::new(GLOBAL);
    for _ in 0..STEPS {
        trainer.step(&data).expect("steps");
    }
    let change = region.change();
    (change.allocations + change.reallocations) / STEPS
}

#[test]
fn allocations_per_training_step_stay_within_what_was_reached() {
    let one = allocations_per_step([1, 1]);
    let eight = allocations_per_step([2, 4]);
    println!("allocations per step: 1x1 {one}, 2x4 {eight}");
    // Reached: about 5,850 and 32,450 (the 2x4 count varies by a few dozen with the
    // collectives' timing). Most of what remains is made inside kernels and fused
    // loops (their scratch and results), one operand list per op, one post per
    // collective.
    assert!(one <= 6_000, "1x1: {one} allocations per step");
    assert!(eight <= 33_500, "2x4: {eight} allocations per step");
}
