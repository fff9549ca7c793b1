//! Step time of a Megatron MLP block (forward) on a 1x2 thread mesh relative to the
//! reference interpreter on one thread, in one criterion group so the ratio can be read
//! off one run (2 cores here: ideal is 2x).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gspmd_core::compile;
use gspmd_core::ir::{Builder, DType, Literal, Program};
use gspmd_core::runtime::{ThreadMesh, interpret};
use gspmd_core::sharding::{Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};

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
    group.bench_function("interpreter_1_thread", |bench| {
        bench.iter(|| interpret(black_box(&program), black_box(&inputs)).expect("runs"))
    });
    for (label, data, model) in [("mesh_1x2_model", 1, 2), ("mesh_2x1_data", 2, 1)] {
        let mesh = Mesh::new([("data", data), ("model", model)]).expect("valid mesh");
        let exe = compile(&program, &mesh).expect("compiles");
        let threads = ThreadMesh::new(mesh).expect("threads start");
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
