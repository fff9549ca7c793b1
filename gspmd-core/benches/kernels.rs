//! The runtime's `dot_general` and `reduce` kernels next to what they should reach:
//! ndarray's `general_mat_mul` on the same 2-D shapes (one call per batch), and a
//! plain row loop for the reductions. Shapes are the d_model-512 Transformer's (batch
//! 16 x seq 128 tokens, 8 heads of 64): a projection, the attention scores
//! `bqhd,bkhd->bhqk`, a reduction over the last dim (softmax, layer norm) and over
//! the token dims (a bias gradient); `tanh` and `exp` against the library's (glibc's).
//!
//! `cargo bench -p gspmd-core --bench kernels`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gspmd_core::ir::{DType, DotDims, Literal, Op, ReduceKind, TensorType, UnaryOp};
use gspmd_core::runtime::kernels::eval;
use gspmd_core::runtime::uniform_f32;
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView2, Axis, Ix2};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

const TOKENS: usize = 16 * 128;
const MODEL: usize = 512;
const FFN: usize = 2048;
const BATCH: usize = 16;
const SEQ: usize = 128;
const HEADS: usize = 8;
const HEAD: usize = 64;

fn f32_type(shape: &[usize]) -> TensorType {
    TensorType::new(shape.to_vec(), DType::F32)
}

fn matrix(lit: &Literal) -> ArrayView2<'_, f32> {
    let a = lit.as_f32().expect("f32");
    a.view().into_dimensionality::<Ix2>().expect("2-D")
}

fn contractions(c: &mut Criterion) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0);
    let mut group = c.benchmark_group("dot_general");
    group.sample_size(10);

    // Projection [B, S, M] x [M, F].
    let x = uniform_f32(&mut rng, &[BATCH, SEQ, MODEL], -1.0, 1.0);
    let w = uniform_f32(&mut rng, &[MODEL, FFN], -1.0, 1.0);
    let dims = DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contracting: vec![2],
        rhs_contracting: vec![0],
    };
    let op = Op::DotGeneral(dims);
    let ty = f32_type(&[BATCH, SEQ, FFN]);
    group.bench_function("projection/runtime", |bench| {
        bench.iter(|| black_box(eval(&op, &[&x, &w], &ty).expect("runs")))
    });
    let x2 = x
        .as_f32()
        .expect("f32")
        .to_shape((TOKENS, MODEL))
        .expect("contiguous")
        .to_owned();
    let mut out = Array2::<f32>::zeros((TOKENS, FFN));
    group.bench_function("projection/general_mat_mul", |bench| {
        bench.iter(|| {
            general_mat_mul(1.0, &x2, &matrix(&w), 0.0, &mut out);
            black_box(&out);
        })
    });

    // Attention scores bqhd,bkhd->bhqk: batch (b, h), contracting d.
    let q = uniform_f32(&mut rng, &[BATCH, SEQ, HEADS, HEAD], -1.0, 1.0);
    let k = uniform_f32(&mut rng, &[BATCH, SEQ, HEADS, HEAD], -1.0, 1.0);
    let dims = DotDims {
        lhs_batch: vec![0, 2],
        rhs_batch: vec![0, 2],
        lhs_contracting: vec![3],
        rhs_contracting: vec![3],
    };
    let op = Op::DotGeneral(dims);
    let ty = f32_type(&[BATCH, HEADS, SEQ, SEQ]);
    group.bench_function("attention/runtime", |bench| {
        bench.iter(|| black_box(eval(&op, &[&q, &k], &ty).expect("runs")))
    });
    // The same products on contiguous [S, D] blocks, one general_mat_mul each.
    let blocks = |lit: &Literal| -> Vec<Array2<f32>> {
        let a = lit.as_f32().expect("f32");
        let mut out = Vec::new();
        for b in a.axis_iter(Axis(0)) {
            for h in b.axis_iter(Axis(1)) {
                out.push(h.into_dimensionality::<Ix2>().expect("2-D").to_owned());
            }
        }
        out
    };
    let (qs, ks) = (blocks(&q), blocks(&k));
    let mut scores = vec![Array2::<f32>::zeros((SEQ, SEQ)); qs.len()];
    group.bench_function("attention/general_mat_mul", |bench| {
        bench.iter(|| {
            for ((q, k), s) in qs.iter().zip(&ks).zip(&mut scores) {
                general_mat_mul(1.0, q, &k.t(), 0.0, s);
            }
            black_box(&scores);
        })
    });
    group.finish();
}

fn reductions(c: &mut Criterion) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
    let mut group = c.benchmark_group("reduce");
    group.sample_size(10);
    let x = uniform_f32(&mut rng, &[BATCH, SEQ, FFN], -1.0, 1.0);
    let rows = x
        .as_f32()
        .expect("f32")
        .to_shape((TOKENS, FFN))
        .expect("contiguous")
        .to_owned();

    let last = Op::Reduce {
        kind: ReduceKind::Sum,
        dims: vec![2],
    };
    let ty = f32_type(&[BATCH, SEQ]);
    group.bench_function("last_dim/runtime", |bench| {
        bench.iter(|| black_box(eval(&last, &[&x], &ty).expect("runs")))
    });
    group.bench_function("last_dim/row_loop", |bench| {
        bench.iter(|| {
            let sums: Vec<f32> = (rows.rows().into_iter())
                .map(|r| r.as_slice().expect("contiguous").iter().sum())
                .collect();
            black_box(sums)
        })
    });

    let tokens = Op::Reduce {
        kind: ReduceKind::Sum,
        dims: vec![0, 1],
    };
    let ty = f32_type(&[FFN]);
    group.bench_function("token_dims/runtime", |bench| {
        bench.iter(|| black_box(eval(&tokens, &[&x], &ty).expect("runs")))
    });
    group.bench_function("token_dims/row_loop", |bench| {
        bench.iter(|| {
            let mut sum = vec![0.0f32; FFN];
            for r in rows.rows() {
                for (s, v) in sum.iter_mut().zip(r.as_slice().expect("contiguous")) {
                    *s += v;
                }
            }
            black_box(sum)
        })
    });
    group.finish();
}

fn elementwise(c: &mut Criterion) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(2);
    let mut group = c.benchmark_group("elementwise");
    group.sample_size(10);
    let x = uniform_f32(&mut rng, &[BATCH, SEQ, FFN], -4.0, 4.0);
    let ty = f32_type(&[BATCH, SEQ, FFN]);
    for (name, op, libm) in [
        ("tanh", UnaryOp::Tanh, f32::tanh as fn(f32) -> f32),
        ("exp", UnaryOp::Exp, f32::exp),
    ] {
        let op = Op::Unary(op);
        group.bench_function(format!("{name}/runtime"), |bench| {
            bench.iter(|| black_box(eval(&op, &[&x], &ty).expect("runs")))
        });
        let a = x.as_f32().expect("f32");
        group.bench_function(format!("{name}/libm"), |bench| {
            bench.iter(|| black_box(a.mapv(libm)))
        });
    }
    group.finish();
}

criterion_group!(benches, contractions, reductions, elementwise);
criterion_main!(benches);
