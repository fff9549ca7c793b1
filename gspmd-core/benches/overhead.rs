//! The fixed cost of an op: a program of ~200 ops on tiny tensors (a few dozen
//! elements: dots, elementwise, reshapes, reductions), so a run's time is mostly what
//! the evaluation loop does around each kernel. Timed on
//! - `interpreter`: the reference interpreter (plans the program on every call);
//! - `mesh_1x1`: a compiled executable on a 1-device thread mesh, inputs and outputs
//!   resident (the plan made once, one thread dispatched per run);
//! - `mesh_2x4`: the same with the batch split over `data` on a 2x4 mesh, eight device
//!   threads running the program at once with no collective.
//!
//! and the same three on `tiny_groups` (`groups_*`): layers of a product and two small
//! fused loops around a reshape, so a run's time is mostly the fixed cost of a fused
//! loop's call.
//!
//! Prints the number of ops the loop runs per device (fusion groups counted once), so a
//! run's time divided by it is the per-op cost.
//!
//! `cargo bench -p gspmd-core --bench overhead`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gspmd_core::compile;
use gspmd_core::ir::{Builder, DType, Literal, Program, Tensor};
use gspmd_core::runtime::{Backend, Input, Output, ThreadMesh, fusion_groups, interpret};
use gspmd_core::sharding::{Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};

const BATCH: usize = 4;
const WIDTH: usize = 8;
const LAYERS: usize = 25;

/// `LAYERS` layers of `x <- layer(x, w)`, `x` `[BATCH, WIDTH]` split over `data`, `w`
/// `[WIDTH, WIDTH]`.
fn layers(name: &str, layer: impl Fn(&Tensor, &Tensor) -> Tensor) -> Program {
    let b = Builder::new(name);
    let parse = |text: &str| -> Sharding { text.parse().expect("valid sharding") };
    let mut x = b
        .parameter("x", [BATCH, WIDTH], DType::F32)
        .annotate(parse("(data, _)"));
    let w = b.parameter("w", [WIDTH, WIDTH], DType::F32);
    for _ in 0..LAYERS {
        x = layer(&x, &w);
    }
    b.finish(&[&x]).expect("traces")
}

/// Layers of `x <- tanh(x w) - rowsum(tanh(x w))` through reshapes: eight ops a
/// layer, an unfusable dot in each.
fn tiny_layers() -> Program {
    layers("tiny_layers", |x, w| {
        let h = x.matmul(w).tanh();
        let flat = h.reshape([BATCH * WIDTH]).reshape([BATCH, WIDTH]);
        let rows = flat.sum(&[1]).reshape([BATCH, 1]);
        &flat - &rows
    })
}

/// Layers of `y <- tanh(x w) * (x w) + x w; x <- tanh(y - rowsum(y * y))`: per layer
/// a product, a fused loop of the chain and the row sums (two results), a reshape and
/// a fused loop of the broadcast difference.
fn tiny_groups() -> Program {
    layers("tiny_groups", |x, w| {
        let h = x.matmul(w);
        let y = &(&h.tanh() * &h) + &h;
        let rows = (&y * &y).sum(&[1]).reshape([BATCH, 1]);
        (&y - &rows).tanh()
    })
}

fn input(shape: &[usize]) -> Literal {
    let n: usize = shape.iter().product();
    let v = (0..n).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).expect("shape fits"))
}

/// The ops the evaluation loop runs for `program`: its nodes less parameters and the
/// members of fusion groups other than their roots.
fn ops_run(program: &Program) -> usize {
    let fused: usize = fusion_groups(program).iter().map(|g| g.len() - 1).sum();
    let params = program.params.len();
    program.nodes.len() - params - fused
}

fn bench(c: &mut Criterion) {
    let inputs = vec![input(&[BATCH, WIDTH]), input(&[WIDTH, WIDTH])];
    let mut group = c.benchmark_group("overhead_tiny_ops");
    for (prefix, program) in [("", tiny_layers()), ("groups_", tiny_groups())] {
        println!(
            "{prefix}interpreter: {} nodes, {} ops run",
            program.nodes.len(),
            ops_run(&program)
        );
        group.bench_function(format!("{prefix}interpreter"), |bench| {
            bench.iter(|| interpret(black_box(&program), black_box(&inputs)).expect("runs"))
        });
        for (label, data, model) in [("mesh_1x1", 1, 1), ("mesh_2x4", 2, 4)] {
            let mesh = Mesh::new([("data", data), ("model", model)]).expect("valid mesh");
            let exe = compile(&program, &mesh).expect("compiles");
            let local = &exe.spmd().program;
            println!(
                "{prefix}{label}: {} nodes, {} ops run per device",
                local.nodes.len(),
                ops_run(local)
            );
            let threads = ThreadMesh::new(mesh).expect("threads start");
            let resident = [Input::Resident("x"), Input::Resident("w")];
            let out = [Output::Resident("y".into())];
            let x_sharding = &exe.spmd().inputs[0].1;
            threads.upload("x", &inputs[0], x_sharding).expect("x");
            let w_sharding = &exe.spmd().inputs[1].1;
            threads.upload("w", &inputs[1], w_sharding).expect("w");
            group.bench_function(format!("{prefix}{label}"), |bench| {
                bench.iter(|| exe.execute(&threads, &resident, &out).expect("runs"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
