//! Step time (forward, backward, AdamW update) of the training example's Transformer
//! language model on meshes of 1, 2 and 8 devices, and on the reference interpreter, in
//! one criterion group so ratios are read off one run. Tokens/s = 256 / step time
//! (batch 16 x 16 tokens). 2 cores here: 8 device threads share them.
//!
//! A second group compares mixed precision with f32 on the 2x4 mesh
//! (`language_model`'s `compute` dtype: bf16 activations, f32 master weights converted
//! to bf16 where used) and prints, before timing, the bytes each device receives per
//! step in collectives (weights are gathered and gradients reduced in bf16).

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gspmd::models::transformer::language_model;
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::train::Trainer;

const BATCH: usize = 16;
const SEQ: usize = 16;
const VOCAB: usize = 16;

/// The example's model (`small`), its activations in `compute`.
fn model(compute: DType) -> Program {
    let dims = language_model::Dims {
        B: BATCH,
        S: SEQ,
        V: VOCAB,
        D: 64,
        L: 2,
        H: 4,
        K: 16,
        F: 256,
    };
    language_model::trace(dims, compute, 0.0).expect("traces")
}

/// One fixed batch: tokens, targets and unit loss weights.
fn data() -> Vec<Literal> {
    let tokens = Literal::I32(ArrayD::from_shape_fn(IxDyn(&[BATCH, SEQ]), |ix| {
        ((ix[0] * 5 + ix[1] * 3) % VOCAB) as i32
    }));
    let targets = Literal::I32(ArrayD::from_shape_fn(IxDyn(&[BATCH, SEQ]), |ix| {
        ((ix[0] + ix[1] * 7) % VOCAB) as i32
    }));
    vec![tokens, targets, common::literal(&[BATCH, SEQ], |_| 1.0)]
}

fn bench(c: &mut Criterion) {
    let (step, initial) = common::adamw_step(&model(DType::F32), 3);
    let data = data();

    let mut group = c.benchmark_group("train_step_lm_2x64_b16x16");
    group.sample_size(15);
    group.throughput(Throughput::Elements((BATCH * SEQ) as u64));
    let mut reference = Trainer::reference(step.clone(), initial.clone()).expect("starts");
    group.bench_function("reference_interpreter", |b| {
        b.iter(|| reference.step(&data).expect("steps"))
    });
    for (label, shape) in [
        ("mesh_1", [1, 1]),
        ("mesh_2_data", [2, 1]),
        ("mesh_2x4", [2, 4]),
    ] {
        let mesh = language_model::mesh(shape).expect("valid mesh");
        let mut trainer = Trainer::on_mesh(step.clone(), mesh, initial.clone()).expect("compiles");
        group.bench_function(label, |b| b.iter(|| trainer.step(&data).expect("steps")));
    }
    group.finish();
}

fn mixed_precision(c: &mut Criterion) {
    let data = data();
    let mut group = c.benchmark_group("train_step_lm_2x64_b16x16_mesh_2x4_precision");
    group.sample_size(15);
    group.throughput(Throughput::Elements((BATCH * SEQ) as u64));
    for compute in [DType::F32, DType::BF16] {
        let (step, initial) = common::adamw_step(&model(compute), 3);
        let mesh = language_model::mesh([2, 4]).expect("valid mesh");
        let mut trainer = Trainer::on_mesh(step, mesh, initial).expect("compiles");
        let stats = trainer.executable().spmd().collectives();
        println!(
            "{compute}: {} collectives, {} bytes received per device per step",
            stats.total(),
            stats.bytes()
        );
        group.bench_function(compute.to_string(), |b| {
            b.iter(|| trainer.step(&data).expect("steps"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench, mixed_precision);
criterion_main!(benches);
