//! Step time (forward, backward, AdamW update) of the U-Net denoiser
//! (`gspmd::models::unet`) with the image height split over `space` on 1, 2 and 4
//! devices, and on the reference interpreter, in one criterion group. Images/s = 4 /
//! step time (batch 4 of 32x32). 2 cores here: 4 device threads share them.

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gspmd::models::unet::denoise;
use gspmd::train::Trainer;

const BATCH: usize = 4;
const SIZE: usize = 32;

fn bench(c: &mut Criterion) {
    let model = denoise::trace(denoise::Dims {
        B: BATCH,
        H: SIZE,
        W: SIZE,
    })
    .expect("traces");
    let (step, initial) = common::adamw_step(&model, 2);
    let image = [BATCH, SIZE, SIZE, 1];
    let clean = |k: usize| if (k / 7).is_multiple_of(3) { 0.8 } else { 0.0 };
    let data = vec![
        common::literal(&image, |k| {
            clean(k) + ((k * 31 % 17) as f32 / 17.0 - 0.5) * 0.4
        }),
        common::literal(&image, clean),
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
