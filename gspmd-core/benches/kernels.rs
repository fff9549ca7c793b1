//! The runtime's `dot_general` and `reduce` kernels next to what they should reach:
//! ndarray's `general_mat_mul` on the same 2-D shapes (one call per batch, contiguous
//! operands, the result allocated once or, as the runtime's, afresh each time), and a
//! plain row loop for the reductions.
//! Shapes are the d_model-512 Transformer's (batch 16 x seq 128 tokens, 8 heads of
//! 64): projections `bsm,mf->bsf` and `bsm,mhk->bshk`, the weight gradient
//! `bsm,bsf->mf` (and a square weight's `bsm,bsn->mn`), the attention scores `bqhd,bkhd->bhqk` and context
//! `bhqk,bkhd->bhqd` (and `bhqk,bhkd->bhqd`), and the same products at the example
//! LM's dims on one device (prefix `lm_`: 256 tokens, d_model 64, 4 heads of 16);
//! a reduction over the last dim (softmax, layer norm) and over the token dims (a
//! bias gradient); `tanh` and `exp` against the library's (glibc's).
//!
//! `cargo bench -p gspmd-core --bench kernels`

use std::hint::black_box;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
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

/// The `[S, D]`-like 2-D blocks of a 4-D literal along its dims `outer` (each pair of
/// indices one block, in row-major order of the pair), copied contiguous.
fn blocks(lit: &Literal, outer: [usize; 2]) -> Vec<Array2<f32>> {
    let a = lit.as_f32().expect("f32");
    let mut out = Vec::new();
    for x in a.axis_iter(Axis(outer[0])) {
        for y in x.axis_iter(Axis(outer[1] - 1)) {
            out.push(y.into_dimensionality::<Ix2>().expect("2-D").to_owned());
        }
    }
    out
}

/// A Transformer's dims, as one device multiplies them.
struct Model {
    /// The bench names' prefix.
    name: &'static str,
    batch: usize,
    seq: usize,
    model: usize,
    ffn: usize,
    heads: usize,
    head: usize,
}

/// The d_model-512 LM on one device, and the example LM's (`train_transformer`) on one
/// device: d_model 64, 4 heads of 16, FFN 256, batch 16 x seq 16 tokens.
const MODELS: [Model; 2] = [
    Model {
        name: "",
        batch: BATCH,
        seq: SEQ,
        model: MODEL,
        ffn: FFN,
        heads: HEADS,
        head: HEAD,
    },
    Model {
        name: "lm_",
        batch: 16,
        seq: 16,
        model: 64,
        ffn: 256,
        heads: 4,
        head: 16,
    },
];

fn contractions(c: &mut Criterion) {
    let mut group = c.benchmark_group("dot_general");
    group.sample_size(10);
    for m in &MODELS {
        products(&mut group, m);
    }
    group.finish();
}

/// The model's products, each by the runtime and by `general_mat_mul`.
fn products(group: &mut BenchmarkGroup<'_, WallTime>, model: &Model) {
    let Model {
        name: prefix,
        batch,
        seq,
        model,
        ffn,
        heads,
        head,
    } = *model;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0);
    let mut runtime = |name: &str, op: Op, ty: TensorType, a: &Literal, b: &Literal| {
        group.bench_function(format!("{prefix}{name}/runtime"), |bench| {
            bench.iter(|| black_box(eval(&op, &[a, b], &ty).expect("runs")))
        });
    };

    // Projection [B, S, M] x [M, F] and its weight gradient [B, S, M] x [B, S, F].
    let x = uniform_f32(&mut rng, &[batch, seq, model], -1.0, 1.0);
    let w = uniform_f32(&mut rng, &[model, ffn], -1.0, 1.0);
    let dy = uniform_f32(&mut rng, &[batch, seq, ffn], -1.0, 1.0);
    let op = Op::DotGeneral(DotDims::new(&[], &[], &[2], &[0]));
    runtime("projection", op, f32_type(&[batch, seq, ffn]), &x, &w);
    let op = Op::DotGeneral(DotDims::new(&[], &[], &[0, 1], &[0, 1]));
    runtime("weight_gradient", op, f32_type(&[model, ffn]), &x, &dy);
    // A square weight's gradient [B, S, M] x [B, S, M] (the attention projections').
    let dx = uniform_f32(&mut rng, &[batch, seq, model], -1.0, 1.0);
    let op = Op::DotGeneral(DotDims::new(&[], &[], &[0, 1], &[0, 1]));
    runtime(
        "weight_gradient_square",
        op,
        f32_type(&[model, model]),
        &x,
        &dx,
    );
    // The heads' projection bsm,mhk->bshk.
    let wq = uniform_f32(&mut rng, &[model, heads, head], -1.0, 1.0);
    let op = Op::DotGeneral(DotDims::new(&[], &[], &[2], &[0]));
    let ty = f32_type(&[batch, seq, heads, head]);
    runtime("head_projection", op, ty, &x, &wq);
    // Attention scores bqhd,bkhd->bhqk: batch (b, h), contracting d; the context
    // bhqk,bkhd->bhqd, and on head-major values bhqk,bhkd->bhqd.
    let q = uniform_f32(&mut rng, &[batch, seq, heads, head], -1.0, 1.0);
    let k = uniform_f32(&mut rng, &[batch, seq, heads, head], -1.0, 1.0);
    let p = uniform_f32(&mut rng, &[batch, heads, seq, seq], -1.0, 1.0);
    let vh = uniform_f32(&mut rng, &[batch, heads, seq, head], -1.0, 1.0);
    let op = Op::DotGeneral(DotDims::new(&[0, 2], &[0, 2], &[3], &[3]));
    runtime("attention", op, f32_type(&[batch, heads, seq, seq]), &q, &k);
    let op = Op::DotGeneral(DotDims::new(&[0, 1], &[0, 2], &[3], &[1]));
    runtime("context", op, f32_type(&[batch, heads, seq, head]), &p, &k);
    let op = Op::DotGeneral(DotDims::new(&[0, 1], &[0, 1], &[3], &[2]));
    runtime(
        "context_head_major",
        op,
        f32_type(&[batch, heads, seq, head]),
        &p,
        &vh,
    );

    // ndarray's general_mat_mul on the same products over contiguous 2-D operands
    // (the best case for it), into a result allocated once.
    let rows = |lit: &Literal, n: usize| {
        let a = lit.as_f32().expect("f32");
        a.to_shape((a.len() / n, n)).expect("contiguous").to_owned()
    };
    let (x2, dy2, dx2) = (rows(&x, model), rows(&dy, ffn), rows(&dx, model));
    let mut gemm = |name: &str, pairs: Vec<(Array2<f32>, Array2<f32>)>, transpose_a: bool| {
        let shape = |(a, b): &(Array2<f32>, Array2<f32>)| {
            let m = if transpose_a { a.ncols() } else { a.nrows() };
            (m, b.ncols())
        };
        let mut outs: Vec<Array2<f32>> = pairs.iter().map(|p| Array2::zeros(shape(p))).collect();
        group.bench_function(format!("{prefix}{name}/general_mat_mul"), |bench| {
            bench.iter(|| {
                for ((a, b), out) in pairs.iter().zip(&mut outs) {
                    let a = if transpose_a { a.t() } else { a.view() };
                    general_mat_mul(1.0, &a, b, 0.0, out);
                }
                black_box(&outs);
            })
        });
        // The same with a fresh (zeroed) result each time, as the runtime allocates its.
        group.bench_function(
            format!("{prefix}{name}/general_mat_mul_fresh_result"),
            |bench| {
                bench.iter(|| {
                    for ((a, b), out) in pairs.iter().zip(&outs) {
                        let a = if transpose_a { a.t() } else { a.view() };
                        let mut fresh = Array2::zeros(out.dim());
                        general_mat_mul(1.0, &a, b, 0.0, &mut fresh);
                        black_box(fresh);
                    }
                })
            },
        );
    };
    gemm(
        "projection",
        vec![(x2.clone(), matrix(&w).to_owned())],
        false,
    );
    gemm("weight_gradient", vec![(x2.clone(), dy2)], true);
    gemm("weight_gradient_square", vec![(x2.clone(), dx2)], true);
    gemm(
        "head_projection",
        vec![(x2, rows(&wq, heads * head))],
        false,
    );
    // Per (b, h): [S, D] blocks, the scores with the keys transposed.
    let (qs, ks, ps, vs) = (
        blocks(&q, [0, 2]),
        blocks(&k, [0, 2]),
        blocks(&p, [0, 1]),
        blocks(&vh, [0, 1]),
    );
    let pairs = qs
        .into_iter()
        .zip(ks.iter().map(|k| k.t().to_owned()))
        .collect();
    gemm("attention", pairs, false);
    let pairs: Vec<_> = ps.into_iter().zip(ks).collect();
    gemm("context", pairs.clone(), false);
    gemm(
        "context_head_major",
        pairs
            .into_iter()
            .zip(vs)
            .map(|((p, _), v)| (p, v))
            .collect(),
        false,
    );
}

/// The small steps' products that ran at half the big projections' rate in a per-node
/// profile (issue 28, the example LM and MoE on one device), each in the operand layout
/// the step gives it, next to the LM's big projection `[256, 64] x [64, 256]` as the
/// rate reference (`step_products/<name>`; the multiply-adds per call in the name).
fn step_products(c: &mut Criterion) {
    let mut group = c.benchmark_group("step_products");
    group.sample_size(20);
    group.warm_up_time(std::time::Duration::from_millis(500));
    group.measurement_time(std::time::Duration::from_secs(2));
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
    // (name, lhs shape, rhs shape, lhs batch, rhs batch, lhs contracting, rhs contracting)
    type Case = (
        &'static str,
        &'static [usize],
        &'static [usize],
        &'static [usize],
        &'static [usize],
        &'static [usize],
        &'static [usize],
    );
    let cases: [Case; 16] = [
        // LM: the big projection bsm,mf->bsf (the rate reference), 4.2 M.
        (
            "lm_projection_4m",
            &[16, 16, 64],
            &[64, 256],
            &[],
            &[],
            &[2],
            &[0],
        ),
        // LM: Q/K/V projections bsm,mhk->bshk, 1 M.
        (
            "lm_qkv_1m",
            &[16, 16, 64],
            &[64, 4, 16],
            &[],
            &[],
            &[2],
            &[0],
        ),
        // Their weight gradients bsm,bshk->mhk, 1 M.
        (
            "lm_qkv_gradient_1m",
            &[16, 16, 64],
            &[16, 16, 4, 16],
            &[],
            &[],
            &[0, 1],
            &[0, 1],
        ),
        // The output projection bshk,mhk->bsm (rhs transposed), 1 M.
        (
            "lm_out_1m",
            &[16, 16, 4, 16],
            &[64, 4, 16],
            &[],
            &[],
            &[2, 3],
            &[1, 2],
        ),
        // A head-major weight gradient bhsk,bsm->hkm (lhs contracting dims apart), 1 M.
        (
            "lm_head_gradient_1m",
            &[16, 4, 16, 16],
            &[16, 16, 64],
            &[],
            &[],
            &[0, 2],
            &[0, 1],
        ),
        // MoE: expert inputs bsm,ebfm->bsef (rhs batch dim second, b transposed), 0.4 M.
        (
            "moe_expert_in_393k",
            &[16, 16, 32],
            &[4, 16, 12, 32],
            &[0],
            &[1],
            &[2],
            &[3],
        ),
        // Its input gradient bsef,ebfm->bsm (rhs contracting dims apart), 0.4 M.
        (
            "moe_expert_in_grad_393k",
            &[16, 16, 4, 12],
            &[4, 16, 12, 32],
            &[0],
            &[1],
            &[2, 3],
            &[0, 2],
        ),
        // Its weight gradients bsef,bsm->befm and bsm,bsef->bmef, 0.4 M.
        (
            "moe_expert_w_grad_393k",
            &[16, 16, 4, 12],
            &[16, 16, 32],
            &[0],
            &[0],
            &[1],
            &[1],
        ),
        (
            "moe_expert_w_grad_t_393k",
            &[16, 16, 32],
            &[16, 16, 4, 12],
            &[0],
            &[0],
            &[1],
            &[1],
        ),
        // Attention's context bhqk,bhkd->bhqd: 64 products of [16, 16] x [16, 8], 131 k.
        (
            "moe_context_131k",
            &[16, 4, 16, 16],
            &[16, 4, 16, 8],
            &[0, 1],
            &[0, 1],
            &[3],
            &[2],
        ),
        // Scores bhqd,bhkd->bhqk: 64 products of [16, 8] x [8, 16] (rhs transposed), 131 k.
        (
            "moe_scores_131k",
            &[16, 4, 16, 8],
            &[16, 4, 16, 8],
            &[0, 1],
            &[0, 1],
            &[3],
            &[3],
        ),
        // MoE: the experts' forward product ebm,emf->ebf per expert, 4 x 192x32x64, 1.6 M.
        (
            "moe_expert_forward_1573k",
            &[4, 192, 32],
            &[4, 32, 64],
            &[0],
            &[0],
            &[2],
            &[1],
        ),
        // Their weight gradients ebsf,ebsm->efm (`a` transposed), 4 x 64x192x32, 1.6 M.
        (
            "moe_expert_w_grad_n32_1573k",
            &[4, 16, 12, 64],
            &[4, 16, 12, 32],
            &[0],
            &[0],
            &[1, 2],
            &[1, 2],
        ),
        // And 4 x 32x192x64, 1.6 M.
        (
            "moe_expert_w_grad_n64_1573k",
            &[4, 16, 12, 32],
            &[4, 16, 12, 64],
            &[0],
            &[0],
            &[1, 2],
            &[1, 2],
        ),
        // Attention's weight gradients bsm,bshk->mhk: 32x256x32 (`a` transposed), 262 k.
        (
            "moe_attention_w_grad_262k",
            &[16, 16, 32],
            &[16, 16, 4, 8],
            &[],
            &[],
            &[0, 1],
            &[0, 1],
        ),
        // Its head-major weight gradient bhsk,bsm->hkm (lhs contracting dims apart, copied), 262 k.
        (
            "moe_head_gradient_262k",
            &[16, 4, 16, 8],
            &[16, 16, 32],
            &[],
            &[],
            &[0, 2],
            &[0, 1],
        ),
    ];
    for (name, ls, rs, lb, rb, lc, rc) in cases {
        let dd = DotDims::new(lb, rb, lc, rc);
        let free = |shape: &[usize], b: &[usize], c: &[usize]| -> Vec<usize> {
            (0..shape.len())
                .filter(|d| !b.contains(d) && !c.contains(d))
                .map(|d| shape[d])
                .collect()
        };
        let shape: Vec<usize> = (lb.iter().map(|&d| ls[d]))
            .chain(free(ls, lb, lc))
            .chain(free(rs, rb, rc))
            .collect();
        let a = uniform_f32(&mut rng, ls, -1.0, 1.0);
        let b = uniform_f32(&mut rng, rs, -1.0, 1.0);
        let (op, ty) = (Op::DotGeneral(dd), f32_type(&shape));
        group.bench_function(name, |bench| {
            bench.iter(|| black_box(eval(&op, &[&a, &b], &ty).expect("runs")))
        });
    }
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

criterion_group!(
    benches,
    contractions,
    step_products,
    reductions,
    elementwise
);
criterion_main!(benches);
