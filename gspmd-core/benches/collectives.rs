//! All-reduce (sum) of a 16 MiB f32 buffer on 2, 4 and 8 device threads, next to a plain
//! memcpy of the same buffer, in one group so the ratio is visible.
//!
//! `cargo bench -p gspmd-core --bench collectives`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use gspmd_core::ir::{Literal, ReduceKind};
use gspmd_core::runtime::ThreadMesh;
use gspmd_core::sharding::Mesh;
use ndarray::{ArrayD, IxDyn};

const BYTES: usize = 16 << 20;
const LEN: usize = BYTES / size_of::<f32>();

fn all_reduce_vs_memcpy(c: &mut Criterion) {
    let mut group = c.benchmark_group("16MiB_f32");
    group.throughput(Throughput::Bytes(BYTES as u64));

    let source = vec![1.0_f32; LEN];
    let mut target = vec![0.0_f32; LEN];
    group.bench_function("memcpy/copy_from_slice", |b| {
        b.iter(|| target.copy_from_slice(black_box(&source)));
    });
    group.bench_function("memcpy/clone", |b| b.iter(|| black_box(source.clone())));

    for devices in [2, 4, 8] {
        let mesh = ThreadMesh::new(Mesh::new([("x", devices)]).expect("mesh")).expect("threads");
        // Zeros stay zeros under repeated sums: no overflow to inf, no denormals.
        mesh.run(|ctx| {
            let x = Literal::F32(ArrayD::zeros(IxDyn(&[LEN])));
            ctx.store_mut().insert("x".into(), x);
            Ok(())
        })
        .expect("setup run");
        group.bench_function(BenchmarkId::new("all_reduce/threads", devices), |b| {
            // Timed inside the device threads, so the run's dispatch is not counted; the
            // slowest device's time is the collective's.
            b.iter_custom(|iters| {
                let times = mesh
                    .run(move |ctx| {
                        let axes = ["x".to_string()];
                        let (comm, store) = ctx.communicator_and_store();
                        let mut x = store.remove("x").expect("resident buffer");
                        let start = Instant::now();
                        for _ in 0..iters {
                            x = comm.all_reduce(&axes, ReduceKind::Sum, x)?;
                        }
                        let elapsed = start.elapsed();
                        store.insert("x".into(), x);
                        Ok(elapsed)
                    })
                    .expect("bench run");
                times.into_iter().max().unwrap_or(Duration::ZERO)
            });
        });
    }
    group.finish();
}

criterion_group!(benches, all_reduce_vs_memcpy);
criterion_main!(benches);
