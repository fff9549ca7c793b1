//! Compile time against depth: an `L`-layer MLP (`x <- tanh(x @ w_l)`, activations
//! split over `data`, weights' output features over `model`) traced with its layers
//! unrolled by a Rust `for` loop vs as one `scan` over the stacked weights `[L, D, D]`,
//! for L = 2, 12, 48 on a 2x2 mesh. Each measurement is trace + `compile` (verify,
//! simplify, propagate, partition, simplify). Before timing, prints the per-device
//! program's op count (nodes, regions included) for each variant and depth.
//!
//! `cargo bench -p gspmd-core --bench depth`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use gspmd_core::compile;
use gspmd_core::ir::{Builder, DType, Program, distinct_flows};
use gspmd_core::sharding::{Mesh, Sharding};

const BATCH: usize = 16;
const D: usize = 64;

fn sharding(text: &str) -> Sharding {
    text.parse().expect("sharding")
}

/// The MLP with its layers unrolled: one `[D, D]` weight parameter per layer.
fn unrolled(layers: usize) -> Program {
    let b = Builder::new("unrolled");
    let mut x = b
        .parameter("x", [BATCH, D], DType::F32)
        .annotate(sharding("(data, _)"));
    for l in 0..layers {
        let w =
            (b.parameter(&format!("w{l}"), [D, D], DType::F32)).annotate(sharding("(_, model)"));
        x = x.matmul(&w).tanh();
    }
    b.finish(&[&x]).expect("traced")
}

/// The MLP as one scan over the stacked weights.
fn scanned(layers: usize) -> Program {
    let b = Builder::new("scanned");
    let x = b
        .parameter("x", [BATCH, D], DType::F32)
        .annotate(sharding("(data, _)"));
    let w = (b.parameter("w", [layers, D, D], DType::F32)).annotate(sharding("(_, _, model)"));
    let (h, _) = b.scan(&[w], &[x], |c, w| (vec![c[0].matmul(&w[0]).tanh()], vec![]));
    b.finish(&[&h[0]]).expect("traced")
}

/// Nodes of `program`, counting its regions' nodes once per region.
fn op_count(program: &Program) -> usize {
    let regions = distinct_flows(program)
        .into_iter()
        .flat_map(|(_, f)| f.regions());
    program.nodes.len() + regions.map(op_count).sum::<usize>()
}

/// A model of `layers` layers, written one way.
type Variant = (&'static str, fn(usize) -> Program);

fn depth(c: &mut Criterion) {
    let mesh = Mesh::new([("data", 2), ("model", 2)]).expect("mesh");
    let variants: [Variant; 2] = [("unrolled", unrolled), ("scan", scanned)];
    for (name, build) in variants {
        for layers in [2, 12, 48] {
            let exe = compile(&build(layers), &mesh).expect("compiles");
            println!(
                "{name:>8} L={layers:<2}: {} per-device ops",
                op_count(&exe.spmd().program)
            );
        }
    }
    let mut group = c.benchmark_group("trace_and_compile");
    for (name, build) in variants {
        for layers in [2, 12, 48] {
            group.bench_function(BenchmarkId::new(name, layers), |b| {
                b.iter(|| compile(&build(black_box(layers)), &mesh).expect("compiles"));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, depth);
criterion_main!(benches);
