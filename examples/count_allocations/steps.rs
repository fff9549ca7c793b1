//! Allocations per training step, counted by the instrumented global allocator `GLOBAL`
//! of the crate that includes this file (`examples/count_allocations`,
//! `tests/allocations.rs`).

use gspmd::models::transformer::{WEIGHTS, language_model};
use gspmd::prelude::*;
use gspmd::runtime::sample_inputs;
use gspmd::train::{Init, Initializer, Optimizer, Trainer, step_program};
use stats_alloc::Region;

/// What the allocator did in a step, on average.
pub struct PerStep {
    /// Allocations and reallocations.
    pub allocations: usize,
    /// The bytes they asked for (what the buffer pools did not hand out again).
    pub bytes: usize,
}

/// Allocations per step (all devices) of the language model's AdamW step of
/// `examples/train_transformer.rs` on `mesh`, over `steps` steps after three warm-up
/// steps (which make the plan, the collectives' groups and the buffer pools).
pub fn allocations_per_step(mesh: [usize; 2], steps: usize) -> PerStep {
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
    let model = language_model::trace(dims, DType::F32, 0.0).expect("traces");
    let step = step_program(&model, 0, WEIGHTS, &Optimizer::adamw(1e-3)).expect("step");
    let mesh = language_model::mesh(mesh).expect("mesh");
    let init = Initializer::new(1).rule("*", Init::Uniform { bound: 0.1 });
    let mut trainer = Trainer::on_mesh(step, mesh, init).expect("trainer");
    let data: Vec<Literal> = sample_inputs(&model, 3).into_iter().take(3).collect();
    for _ in 0..3 {
        trainer.step(&data).expect("steps");
    }
    let region = Region::new(crate::GLOBAL);
    for _ in 0..steps {
        trainer.step(&data).expect("steps");
    }
    let change = region.change();
    PerStep {
        allocations: (change.allocations + change.reallocations) / steps.max(1),
        bytes: change.bytes_allocated / steps.max(1),
    }
}
