//! Allocations (and the bytes they ask for) per training step of the language model of
//! `train_transformer` (AdamW, all devices together) on each mesh given (default `1x1
//! 2x4`), counted by an instrumented global allocator — here rather than in
//! `train_transformer --bench`, whose timings the counting would slow. `tests/allocations.rs` asserts the figures.
//!
//! ```text
//! cargo run --release --example count_allocations -- 1x1 2x4
//! ```

use std::alloc::System;

use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

mod steps;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Allocations per step before the buffer pool and the removal of per-call
/// allocations (issue 13), by mesh.
const BEFORE: [([usize; 2], usize); 2] = [([1, 1], 6_695), ([2, 4], 39_179)];

fn main() -> Result<(), String> {
    let mut meshes: Vec<String> = std::env::args().skip(1).collect();
    if meshes.is_empty() {
        meshes = vec!["1x1".into(), "2x4".into()];
    }
    for text in meshes {
        let shape = text
            .split_once('x')
            .and_then(|(d, m)| Some([d.parse().ok()?, m.parse().ok()?]))
            .ok_or(format!("a mesh is DATAxMODEL such as 2x4, not `{text}`"))?;
        let steps::PerStep { allocations, bytes } = steps::allocations_per_step(shape, 10);
        let kib = bytes as f64 / 1024.0;
        match BEFORE.iter().find(|(mesh, _)| *mesh == shape) {
            Some((_, before)) => println!(
                "mesh {text}: {allocations} allocations per step, {kib:.0} KiB ({:.1}x fewer \
                 allocations than the {before} before the buffer pool)",
                *before as f64 / allocations.max(1) as f64
            ),
            None => println!("mesh {text}: {allocations} allocations per step, {kib:.0} KiB"),
        }
    }
    Ok(())
}
