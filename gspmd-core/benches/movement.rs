//! The runtime's data-movement kernels next to a plain copy of the same bytes (as many
//! as the largest of the result and the operands, `to_vec` of a slice: an allocation
//! and a memcpy), on the shapes of the
//! example language model's step (`train_transformer`, `small` dims: batch 16 x 16
//! tokens, d_model 64, 4 heads of 16, vocabulary 16): the rotary embedding's
//! concatenate of two halves and its slice, the head transposes, a weight transpose,
//! the broadcast of the rotary angles, the embedding lookup (gather) and its
//! scatter-add, the pad that is a slice's gradient, a dynamic_update_slice and a
//! reshape. The d_model-512 projection transpose and the d_model-1024 attention and FFN
//! weights' (`[1024, 1024]`, `[4096, 1024]`) show larger cases.
//!
//! `cargo bench -p gspmd-core --bench movement`

use std::hint::black_box;

use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use gspmd_core::ir::{DType, GatherDims, Literal, Op, ScatterDims, ScatterKind, TensorType};
use gspmd_core::runtime::kernels::eval;
use gspmd_core::runtime::uniform_f32;
use ndarray::{ArrayD, IxDyn};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

const B: usize = 16;
const S: usize = 16;
const D: usize = 64;
const H: usize = 4;
const K: usize = 16;
const V: usize = 16;

/// Times `op` on `operands` (result `shape`) as `name`, and a copy of as many bytes as
/// the largest of its result and operands as `name/memcpy`.
fn kernel(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    op: Op,
    operands: &[&Literal],
    shape: &[usize],
) {
    let ty = TensorType::new(shape.to_vec(), operands[0].dtype());
    group.bench_function(name, |bench| {
        bench.iter(|| black_box(eval(&op, operands, &ty).expect("runs")))
    });
    let largest = (operands.iter().map(|o| o.shape().iter().product()))
        .chain([shape.iter().product()])
        .max();
    let bytes = vec![0f32; largest.unwrap_or(0)];
    group.bench_function(format!("{name}/memcpy"), |bench| {
        bench.iter(|| black_box(black_box(bytes.as_slice()).to_vec()))
    });
}

fn movement(c: &mut Criterion) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0);
    let mut group = c.benchmark_group("movement");
    let mut uniform = |shape: &[usize]| uniform_f32(&mut rng, shape, -1.0, 1.0);

    // Rotary: [B, H, S, K] from two halves, and one half cut back out.
    let half = [B, H, S, K / 2];
    let (x1, x2) = (uniform(&half), uniform(&half));
    let whole = [B, H, S, K];
    kernel(
        &mut group,
        "concatenate",
        Op::Concatenate(3),
        &[&x1, &x2],
        &whole,
    );
    let x = uniform(&whole);
    let slice = Op::Slice {
        start: vec![0; 4],
        limit: half.to_vec(),
        stride: vec![1; 4],
    };
    kernel(&mut group, "slice", slice, &[&x], &half);
    let zero = Literal::full(&[], DType::F32, 0.0);
    let pad = Op::Pad {
        low: vec![0; 4],
        high: vec![0, 0, 0, (K / 2) as i64],
        interior: vec![0; 4],
    };
    kernel(&mut group, "pad", pad, &[&x1, &zero], &whole);
    let at = |i: i32| Literal::I32(ArrayD::from_elem(IxDyn(&[]), i));
    let (z, k) = (at(0), at((K / 2) as i32));
    kernel(
        &mut group,
        "dynamic_update_slice",
        Op::DynamicUpdateSlice,
        &[&x, &x1, &z, &z, &z, &k],
        &whole,
    );

    // Heads: [B, S, H, K] <-> [B, H, S, K], a weight [D, 4D] transposed.
    let heads = uniform(&[B, S, H, K]);
    let swap = Op::Transpose(vec![0, 2, 1, 3]);
    kernel(&mut group, "transpose/heads", swap, &[&heads], &whole);
    let w = uniform(&[D, 4 * D]);
    let t = Op::Transpose(vec![1, 0]);
    kernel(
        &mut group,
        "transpose/weight",
        t.clone(),
        &[&w],
        &[4 * D, D],
    );
    let w512 = uniform(&[512, 2048]);
    kernel(
        &mut group,
        "transpose/weight512",
        t.clone(),
        &[&w512],
        &[2048, 512],
    );
    let w1024 = uniform(&[1024, 1024]);
    kernel(
        &mut group,
        "transpose/1024x1024",
        t.clone(),
        &[&w1024],
        &[1024, 1024],
    );
    let w4096 = uniform(&[4096, 1024]);
    kernel(
        &mut group,
        "transpose/4096x1024",
        t,
        &[&w4096],
        &[1024, 4096],
    );
    let merged = Op::Reshape(vec![B, S, H * K]);
    kernel(&mut group, "reshape", merged, &[&heads], &[B, S, H * K]);

    // The rotary angles [S, K/2] spread over batch and heads.
    let angle = uniform(&[S, K / 2]);
    let spread = Op::Broadcast {
        shape: half.to_vec(),
        dims: vec![2, 3],
    };
    kernel(&mut group, "broadcast", spread, &[&angle], &half);

    // The embedding (as `Builder::take` makes it): rows of a [V, D] table at [B, S]
    // tokens, and the gradient's scatter-add of [B, S, D] rows.
    let table = uniform(&[V, D]);
    let tokens: Vec<i32> = (0..B * S).map(|i| (i * 7 % V) as i32).collect();
    let tokens = Literal::I32(ArrayD::from_shape_vec(IxDyn(&[B, S]), tokens).expect("fits"));
    let lookup = GatherDims {
        offset_dims: vec![2],
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        index_vector_dim: 2,
        slice_sizes: vec![1, D],
        ..GatherDims::default()
    };
    kernel(
        &mut group,
        "gather",
        Op::Gather(lookup),
        &[&table, &tokens],
        &[B, S, D],
    );
    let rows = uniform(&[B, S, D]);
    let add = Op::Scatter {
        dims: ScatterDims {
            update_window_dims: vec![2],
            inserted_window_dims: vec![0],
            scatter_dims_to_operand_dims: vec![0],
            index_vector_dim: 2,
            ..ScatterDims::default()
        },
        kind: ScatterKind::Add,
    };
    kernel(
        &mut group,
        "scatter_add",
        add,
        &[&table, &tokens, &rows],
        &[V, D],
    );
    group.finish();
}

criterion_group!(benches, movement);
criterion_main!(benches);
