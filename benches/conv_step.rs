//! Step time (forward, backward, AdamW update) of the U-Net denoiser
//! (`gspmd::models::unet`) with the image height split over `space` on 1, 2 and 4
//! devices, and on the reference interpreter, in one criterion group. Images/s = 4 /
//! step time (batch 4 of 32x32). 2 cores here: 4 device threads share them.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gspmd::models::unet::denoise;
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::train::{Optimizer, Trainer, step_program};

const BATCH: usize = 4;
const SIZE: usize = 32;

fn literal(shape: &[usize], f: impl Fn(usize) -> f32) -> Literal {
    let n: usize = shape.iter().product();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(f).collect()).expect("shape fits"))
}

fn bench(c: &mut Criterion) {
    let model = denoise::trace(denoise::Dims {
        B: BATCH,
        H: SIZE,
        W: SIZE,
    })
    .expect("traces");
    let trained: Vec<usize> = (2..model.params.len()).collect();
    let optimizer = Optimizer::AdamW {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let step = step_program(&model, 0, &trained, &optimizer).expect("builds");
    let initial: Vec<Literal> = trained
        .iter()
        .map(|&i| {
            literal(&model.ty(model.params[i]).shape, |k| {
                ((k * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.2
            })
        })
        .collect();
    let image = [BATCH, SIZE, SIZE, 1];
    let clean = |k: usize| if (k / 7) % 3 == 0 { 0.8 } else { 0.0 };
    let data = vec![
        literal(&image, |k| {
            clean(k) + ((k * 31 % 17) as f32 / 17.0 - 0.5) * 0.4
        }),
        literal(&image, clean),
    ];

    let mut group = c.benchmark_group("train_step_unet_b4x32x32");
    group.sample_size(10);
    group.throughput(Throughput::Elements(BATCH as u64));
    let mut reference = Trainer::reference(step.clone(), initial.clone()).expect("starts");
    group.bench_function("reference_interpreter", |b| {
        b.iter(|| reference.step(&data).expect("steps"))
    });
    for (label, space) in [("space_1", 1), ("space_2", 2), ("space_4", 4)] {
        let mesh = denoise::mesh([1, space]).expect("valid mesh");
        let mut trainer = Trainer::on_mesh(step.clone(), mesh, initial.clone()).expect("compiles");
        group.bench_function(label, |b| b.iter(|| trainer.step(&data).expect("steps")));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
