//! Collective benches on the thread mesh:
//! - `16MiB_f32`: all-reduce (sum) of a 16 MiB f32 buffer on 2, 4 and 8 device threads,
//!   next to a plain memcpy of the same buffer, in one group so the ratio is visible;
//! - `latency_2x4`: all-reduce (sum) of a scalar on a 2x4 mesh over groups of 2
//!   (`[data]`), 4 (`[model]`) and 8 (`[data, model]`) threads, and of a 1 MiB buffer
//!   over all 8: the cost of the rendezvous itself.
//!
//! Times are measured inside the device threads, so a run's dispatch is not counted; the
//! slowest device's time is the collective's.
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

/// Stores zeros of `shape` under `"x"` on every device: zeros stay zeros under repeated
/// sums (no overflow to inf, no denormals).
fn store_zeros(mesh: &ThreadMesh, shape: &[usize]) {
    let shape = shape.to_vec();
    mesh.run(move |ctx| {
        let x = Literal::F32(ArrayD::zeros(IxDyn(&shape)));
        ctx.store_mut().insert("x".into(), x);
        Ok(())
    })
    .expect("setup run");
}

/// The time of `iters` all-reduces (sum) of the stored `"x"` over `axes`, chained on
/// every device: the slowest device's.
fn time_all_reduces(mesh: &ThreadMesh, axes: &[&str], iters: u64) -> Duration {
    let axes: Vec<String> = axes.iter().map(ToString::to_string).collect();
    let times = mesh
        .run(move |ctx| {
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
}

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
        store_zeros(&mesh, &[LEN]);
        group.bench_function(BenchmarkId::new("all_reduce/threads", devices), |b| {
            b.iter_custom(|iters| time_all_reduces(&mesh, &["x"], iters));
        });
    }
    group.finish();
}

fn all_reduce_latency(c: &mut Criterion) {
    let mut group = c.benchmark_group("latency_2x4");
    let mesh =
        ThreadMesh::new(Mesh::new([("data", 2), ("model", 4)]).expect("mesh")).expect("threads");
    store_zeros(&mesh, &[]);
    for (size, axes) in [
        (2, &["data"][..]),
        (4, &["model"][..]),
        (8, &["data", "model"][..]),
    ] {
        group.bench_function(BenchmarkId::new("scalar_all_reduce/group", size), |b| {
            b.iter_custom(|iters| time_all_reduces(&mesh, axes, iters));
        });
    }
    const MIB: usize = 1 << 20;
    store_zeros(&mesh, &[MIB / size_of::<f32>()]);
    group.throughput(Throughput::Bytes(MIB as u64));
    group.bench_function("1MiB_all_reduce/group/8", |b| {
        b.iter_custom(|iters| time_all_reduces(&mesh, &["data", "model"], iters));
    });
    group.finish();
}

criterion_group!(benches, all_reduce_latency, all_reduce_vs_memcpy);
criterion_main!(benches);
