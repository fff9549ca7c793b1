//! Step time of a Megatron MLP block (forward) on a 1x2 thread mesh relative to the
//! reference interpreter on one thread, in one criterion group so the ratio can be read
//! off one run (2 cores here: ideal is 2x). First prints the allocations and bytes
//! allocated per step (an instrumented global allocator; its counting is a few atomic
//! adds per allocation).

use std::alloc::System;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gspmd_core::compile;
use gspmd_core::ir::{Builder, DType, Literal, Program};
use gspmd_core::runtime::{ThreadMesh, interpret};
use gspmd_core::sharding::{Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Prints the allocations and bytes allocated by one call of `step` (after a warm-up
/// call).
fn count_allocations(label: &str, mut step: impl FnMut()) {
    step();
    let region = Region::new(GLOBAL);
    step();
    let stats = region.change();
    println!(
        "{label}: {} allocations, {:.1} MiB allocated per step",
        stats.allocations,
        stats.bytes_allocated as f64 / (1 << 20) as f64
    );
}

fn mlp(batch: usize, d: usize, f: usize) -> Program {
    let parse = |text: &str| -> Sharding { text.parse().expect("valid sharding") };
    let b = Builder::new("mlp");
    let x = b
        .parameter("x", [batch, d], DType::F32)
        .annotate(parse("(data, _)"));
    let w1 = b
        .parameter("w1", [d, f], DType::F32)
        .annotate(parse("(_, model)"));
    let w2 = b
        .parameter("w2", [f, d], DType::F32)
        .annotate(parse("(model, _)"));
    let y = x.matmul(&w1).gelu().matmul(&w2);
    b.finish(&[&y]).expect("traces")
}

fn input(shape: &[usize]) -> Literal {
    let n: usize = shape.iter().product();
    let v = (0..n).map(|i| ((i % 17) as f32 - 8.0) * 0.01).collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).expect("shape fits"))
}

fn bench(c: &mut Criterion) {
    let (batch, d, f) = (256, 512, 2048);
    let program = mlp(batch, d, f);
    let inputs = vec![input(&[batch, d]), input(&[d, f]), input(&[f, d])];
    let mut group = c.benchmark_group(format!("mlp_step_b{batch}_d{d}_f{f}"));
    group.sample_size(20);
    count_allocations("interpreter_1_thread", || {
        interpret(&program, &inputs).expect("runs");
    });
    group.bench_function("interpreter_1_thread", |bench| {
        bench.iter(|| interpret(black_box(&program), black_box(&inputs)).expect("runs"))
    });
    for (label, data, model) in [("mesh_1x2_model", 1, 2), ("mesh_2x1_data", 2, 1)] {
        let mesh = Mesh::new([("data", data), ("model", model)]).expect("valid mesh");
        let exe = compile(&program, &mesh).expect("compiles");
        let threads = ThreadMesh::new(mesh).expect("threads start");
        count_allocations(label, || {
            exe.run(&threads, &inputs).expect("runs");
        });
        group.bench_function(label, |bench| {
            bench.iter(|| {
                exe.run(black_box(&threads), black_box(&inputs))
                    .expect("runs")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
