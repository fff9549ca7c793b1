//! Compile-time costs of a 100-layer residual MLP (about 1,100 values) on a 2x4 mesh and
//! on a 32x64 mesh: propagation, and building the per-device program (partitioning).
//! Both depend on the mesh's axes, not on its device count.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gspmd_core::ir::{Builder, DType, Program};
use gspmd_core::partition::partition;
use gspmd_core::propagation::propagate;
use gspmd_core::sharding::{Mesh, Sharding};

/// `x = x + relu(x @ w1 + b1) @ w2`, `layers` times; x is split over `data`, each w1
/// column-wise and each w2 row-wise over `model` (Megatron).
fn deep_mlp(layers: usize) -> Program {
    let (batch, d, f) = (256, 128, 512);
    let parse = |text: &str| -> Sharding { text.parse().expect("valid sharding") };
    let b = Builder::new("deep_mlp");
    let mut x = b
        .parameter("x", [batch, d], DType::F32)
        .annotate(parse("(data, _)"));
    for l in 0..layers {
        let w1 = b.parameter(&format!("w1_{l}"), [d, f], DType::F32);
        let b1 = b.parameter(&format!("b1_{l}"), [f], DType::F32);
        let w2 = b.parameter(&format!("w2_{l}"), [f, d], DType::F32);
        let w1 = w1.annotate(parse("(_, model)"));
        let w2 = w2.annotate(parse("(model, _)"));
        let h = (&x.matmul(&w1) + &b1).relu();
        x = &x + &h.matmul(&w2);
    }
    b.finish(&[&x]).expect("traces")
}

fn bench(c: &mut Criterion) {
    let program = deep_mlp(100);
    let meshes = [
        ("2x4", Mesh::new([("data", 2), ("model", 4)])),
        ("32x64", Mesh::new([("data", 32), ("model", 64)])),
    ];
    for (label, mesh) in meshes {
        let mesh = mesh.expect("valid mesh");
        let name = format!("propagate_mlp100_{}values_mesh{label}", program.nodes.len());
        c.bench_function(&name, |bench| {
            bench.iter(|| propagate(black_box(&program), black_box(&mesh)))
        });
        let propagated = propagate(&program, &mesh).expect("propagates");
        let spmd = partition(&propagated, &mesh).expect("partitions");
        let name = format!(
            "partition_mlp100_mesh{label}_{}local_ops",
            spmd.program.nodes.len()
        );
        c.bench_function(&name, |bench| {
            bench.iter(|| partition(black_box(&propagated), black_box(&mesh)))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
