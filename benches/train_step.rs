//! Step time (forward, backward, AdamW update) of the training example's Transformer
//! language model on meshes of 1, 2 and 8 devices, and on the reference interpreter, in
//! one criterion group so ratios are read off one run. Tokens/s = 256 / step time
//! (batch 16 x 16 tokens). 2 cores here: 8 device threads share them.

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gspmd::models::transformer::language_model;
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::train::Trainer;

const BATCH: usize = 16;
const SEQ: usize = 16;
const VOCAB: usize = 16;

fn bench(c: &mut Criterion) {
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
    let model = language_model::trace(dims, DType::F32).expect("traces");
    let (step, initial) = common::adamw_step(&model, 3);
    let tokens = Literal::I32(ArrayD::from_shape_fn(IxDyn(&[BATCH, SEQ]), |ix| {
        ((ix[0] * 5 + ix[1] * 3) % VOCAB) as i32
    }));
    let targets = Literal::I32(ArrayD::from_shape_fn(IxDyn(&[BATCH, SEQ]), |ix| {
        ((ix[0] + ix[1] * 7) % VOCAB) as i32
    }));
    let data = vec![tokens, targets, common::literal(&[BATCH, SEQ], |_| 1.0)];

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

criterion_group!(benches, bench);
criterion_main!(benches);
