//! The fused loops of the execution plan against handwritten loops doing the same math,
//! on the example language model's elementwise pieces (`d_model` 64, 4 heads of 16
//! keys, FFN 256, vocabulary 16, batch 16 x 16 tokens) at the shapes one device sees on
//! a 1x1 mesh and on a 2x4 mesh (batch over `data`; heads, FFN and the weights' blocks
//! over `model`): layer norm over `d_model`, softmax over the keys (of random scores,
//! and of scores masked causally as the models mask them), GELU over the FFN
//! hidden, the cross-entropy over the vocabulary, and the AdamW update of a weight;
//! the MoE router's gating chain (the example `train_moe`'s shapes); and the ReLU's
//! gradient (compares and selects) on a U-Net activation; and first, `exp`, `tanh`
//! and `logistic` alone over a vector, and GELU's forward and backward loops at the
//! MoE's shape (`gelu_grad`).
//!
//! Each program runs planned once ([`Prepared`]: its groups and the unfused ops around
//! them, the plan not remade per call); the handwritten loop computes the same values
//! with the same `exp` and `tanh` ([`elementary`]) into a preallocated output, and the
//! plan's run gives its outputs back to the pool after each call
//! ([`recycle`](gspmd_core::runtime::recycle), as a training loop's next step reuses
//! the buffers of the outputs it replaces), so both write into buffers they had and the
//! ratio is the plan's overhead over a loop the compiler sees whole. Each group first
//! prints `ratio GROUP: fused/handwritten R`, the two timed alternately (medians), then
//! criterion times each side. The fused loops run on the CPU's widest vectors (`pulp`'s
//! dispatch; the first line printed says which); the handwritten loops are compiled
//! for the build's target (baseline x86-64: SSE2), as the unfused kernels are.
//!
//! `cargo bench -p gspmd-core --bench fusion` (the ratios alone: append `-- none`,
//! a filter no criterion bench matches). For a profile of one group: `FUSION_ONLY=adamw`
//! (groups whose name contains it) and `FUSION_ROUNDS=2000` (rounds of the ratio, 41
//! by default).

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use gspmd_core::autodiff::grad;
use gspmd_core::ir::{Builder, DType, Literal, Program};
use gspmd_core::runtime::kernels::elementary;
use gspmd_core::runtime::{Prepared, fusion_groups, recycle};
use ndarray::{ArrayD, IxDyn};

#[path = "../tests/gating_chain/mod.rs"]
mod gating_chain;
use gating_chain::{CAPACITY, EXPERTS, SEQ as GATING_SEQ, gating_program, shapes};

/// The per-device shapes of one mesh.
struct Shapes {
    name: &'static str,
    /// Tokens per device (batch x sequence).
    tokens: usize,
    /// Heads per device.
    heads: usize,
    /// FFN hidden units per device.
    ffn: usize,
    /// Elements of a weight block per device (`[L, D, F]` over the mesh).
    weight: usize,
}

const SEQ: usize = 16;
const MODEL: usize = 64;
const VOCAB: usize = 16;

const MESHES: [Shapes; 2] = [
    Shapes {
        name: "1x1",
        tokens: 16 * SEQ,
        heads: 4,
        ffn: 256,
        weight: 2 * MODEL * 256,
    },
    Shapes {
        name: "2x4",
        tokens: 8 * SEQ,
        heads: 1,
        ffn: 64,
        weight: 2 * MODEL * 256 / 8,
    },
];

fn values(shape: &[usize], scale: f32) -> Literal {
    let n: usize = shape.iter().product();
    let v = (0..n)
        .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * scale)
        .collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).expect("shape fits"))
}

fn f32s(lit: &Literal) -> &[f32] {
    lit.as_f32()
        .expect("f32")
        .as_slice()
        .expect("standard layout")
}

/// Times `program` planned once on `inputs` and `handwritten` (writing the outputs'
/// elements, in order, into a buffer allocated once) as `group/{gspmd,loop}`, after
/// checking they agree within `tolerance` (relative to the largest output element).
fn compare(
    c: &mut Criterion,
    group: &str,
    program: &Program,
    inputs: &[Literal],
    tolerance: f32,
    handwritten: impl Fn(&[Literal], &mut [f32]) + Sync,
) {
    if std::env::var("FUSION_ONLY").is_ok_and(|only| !group.contains(&only)) {
        return;
    }
    let prepared = Prepared::new(program);
    let got = prepared.run(inputs).expect("runs");
    let got: Vec<f32> = got.iter().flat_map(|o| f32s(o).to_vec()).collect();
    let mut want = vec![0.0; got.len()];
    handwritten(inputs, &mut want);
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    assert_eq!(got.len(), want.len(), "{group}");
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance * scale,
            "{group}: element {k}: {g} vs {w}"
        );
    }
    let groups = fusion_groups(program).len();
    let elements = inputs
        .first()
        .map_or(1, |x| x.shape().iter().product::<usize>())
        .max(1);
    print_ratio(
        group,
        groups,
        elements,
        inputs,
        want.len(),
        |inputs| {
            recycle(black_box(prepared.run(inputs).expect("runs")));
        },
        |inputs, want| {
            handwritten(inputs, want);
            black_box(want);
        },
    );
    let mut g = c.benchmark_group(group);
    g.bench_function(format!("gspmd ({groups} fused loops)"), |b| {
        b.iter(|| recycle(black_box(prepared.run(inputs).expect("runs"))))
    });
    g.bench_function("loop", |b| {
        b.iter(|| {
            handwritten(inputs, &mut want);
            black_box(&want);
        })
    });
    g.finish();
}

/// Prints the median time of `fused` over that of `handwritten` on `inputs`, timed
/// alternately (rounds of as many calls as take about a millisecond, one side then the
/// other) so that both see the same machine load; and each per element of the first
/// input.
///
/// Where the buffers fall relative to each other modulo the 4 KiB page decides whether
/// a store and a later load look alike to the CPU (4K aliasing): one binary's AdamW ran
/// at 1.35 or at 2.0 times the handwritten loop depending on which groups ran before
/// it. So each round places the buffers anew: it runs on a thread of its own (its own
/// pool of buffers, see [`recycle`]), on fresh copies of the inputs with a fresh buffer
/// of `len` elements for `handwritten`, allocated after a spacer of another multiple of
/// 64 bytes, both sides warmed up first. The medians are over those placements; the
/// spread of the rounds' ratios is printed too.
fn print_ratio(
    group: &str,
    groups: usize,
    elements: usize,
    inputs: &[Literal],
    len: usize,
    fused: impl Fn(&[Literal]) + Sync,
    handwritten: impl Fn(&[Literal], &mut [f32]) + Sync,
) {
    let time = |f: &mut dyn FnMut(), calls: usize| {
        let start = Instant::now();
        for _ in 0..calls {
            f();
        }
        start.elapsed().as_secs_f64() / calls as f64
    };
    let once = time(&mut || fused(inputs), 10).max(1e-9);
    let calls = ((1e-3 / once) as usize).clamp(1, 10_000);
    let rounds = std::env::var("FUSION_ROUNDS").map_or(41, |r| r.parse().expect("a count"));
    let (mut a, mut b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (fused_time, loop_time) = std::thread::scope(|scope| {
            let placed = scope.spawn(|| {
                let spacer = black_box(vec![0u8; 64 * (round * 23 % 64) + 8]);
                let placed = inputs.to_vec();
                let mut want = vec![0.0f32; len];
                time(&mut || fused(&placed), calls.div_ceil(10));
                time(&mut || handwritten(&placed, &mut want), calls.div_ceil(10));
                let times = (
                    time(&mut || fused(&placed), calls),
                    time(&mut || handwritten(&placed, &mut want), calls),
                );
                drop(spacer);
                times
            });
            placed.join().expect("a round runs")
        });
        a.push(fused_time);
        b.push(loop_time);
        ratios.push(fused_time / loop_time);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (a, b) = (median(&mut a), median(&mut b));
    median(&mut ratios);
    let tenth = |q: usize| ratios[(ratios.len() - 1) * q / 10];
    println!(
        "ratio {group}: fused/handwritten {:.2} (rounds {:.2}-{:.2}, a tenth each side left out; \
         fused {:.2} us in {groups} loops, handwritten {:.2} us; per element of the first \
         input: {:.2} and {:.2} ns)",
        a / b,
        tenth(1),
        tenth(9),
        a * 1e6,
        b * 1e6,
        a * 1e9 / elements as f64,
        b * 1e9 / elements as f64
    );
}

/// `f` over each row of `row` elements of `x` into `out`.
fn rows(x: &[f32], row: usize, out: &mut [f32], f: impl Fn(&[f32], &mut [f32])) {
    for (x, o) in x.chunks_exact(row).zip(out.chunks_exact_mut(row)) {
        f(x, o);
    }
}

fn layer_norm(c: &mut Criterion, s: &Shapes) {
    let b = Builder::new("layer_norm");
    let x = b.parameter("x", [s.tokens, MODEL], DType::F32);
    let program = b.finish(&[&x.layer_norm(-1, 1e-5)]).expect("traces");
    let inputs = [values(&[s.tokens, MODEL], 4.0)];
    compare(
        c,
        &format!("layer_norm {}", s.name),
        &program,
        &inputs,
        1e-5,
        |inputs, out| {
            rows(f32s(&inputs[0]), MODEL, out, |x, o| {
                let n = x.len() as f32;
                let mean = x.iter().sum::<f32>() / n;
                let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
                let inv = (var + 1e-5).sqrt().recip();
                for (o, &v) in o.iter_mut().zip(x) {
                    *o = (v - mean) * inv;
                }
            });
        },
    );
}

/// Softmax over the keys of random scores, or (`causal`) of scores masked as the models
/// mask them (`models::transformer::causal`: every key after its query set to -1e9):
/// the input the LM's and the MoE's attention softmax see, about half of each row
/// masked, whose `exp` is 0.
fn softmax(c: &mut Criterion, s: &Shapes, causal: bool) {
    let shape = [s.tokens / SEQ, s.heads, SEQ, SEQ];
    let b = Builder::new("softmax");
    let x = b.parameter("x", shape, DType::F32);
    let program = b.finish(&[&x.softmax(-1)]).expect("traces");
    let mut scores = values(&shape, 8.0);
    if let (true, Literal::F32(a)) = (causal, &mut scores) {
        for (ix, v) in a.indexed_iter_mut() {
            if ix[3] > ix[2] {
                *v = -1e9;
            }
        }
    }
    let name = if causal { "softmax_causal" } else { "softmax" };
    compare(
        c,
        &format!("{name} {}", s.name),
        &program,
        &[scores],
        1e-6,
        |inputs, out| {
            rows(f32s(&inputs[0]), SEQ, out, |x, o| {
                let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                for (o, &v) in o.iter_mut().zip(x) {
                    *o = elementary::exp(v - max);
                }
                let sum: f32 = o.iter().sum();
                for o in o.iter_mut() {
                    *o /= sum;
                }
            });
        },
    );
}

fn gelu(c: &mut Criterion, s: &Shapes) {
    let shape = [s.tokens, s.ffn];
    let b = Builder::new("gelu");
    let x = b.parameter("x", shape, DType::F32);
    let program = b.finish(&[&x.gelu()]).expect("traces");
    let inputs = [values(&shape, 6.0)];
    let k = (2.0 / std::f32::consts::PI).sqrt();
    compare(
        c,
        &format!("gelu {}", s.name),
        &program,
        &inputs,
        1e-6,
        |inputs, out| {
            for (o, &v) in out.iter_mut().zip(f32s(&inputs[0])) {
                *o = 0.5 * v * (1.0 + elementary::tanh(k * (v + 0.044715 * v * v * v)));
            }
        },
    );
}

/// GELU's forward loop and its gradient's (the autodiff's backward loop) as the MoE's
/// expert FFN runs them on one device (`train_moe`: `[4, 16, 12, 64]` hidden units,
/// 49,152 elements): the program `x -> (sum(gelu(x) * ct), d/dx)`, its forward and
/// backward loops, against one handwritten loop computing the loss and the gradient.
fn gelu_grad(c: &mut Criterion) {
    let shape = [4 * 16 * 12, 64];
    let b = Builder::new("gelu_grad");
    let x = b.parameter("x", shape, DType::F32);
    let ct = b.parameter("ct", shape, DType::F32);
    let loss = x.gelu().mul(&ct).sum(&[0, 1]);
    let forward = b.finish(&[&loss]).expect("traces");
    let program = grad(&forward, 0, &[0]).expect("differentiates");
    let inputs = [values(&shape, 6.0), values(&shape, 1.0)];
    let k = (2.0 / std::f32::consts::PI).sqrt();
    compare(
        c,
        "gelu_grad 1x1",
        &program,
        &inputs,
        1e-4,
        |inputs, out| {
            let (x, ct) = (f32s(&inputs[0]), f32s(&inputs[1]));
            let (loss, dx) = out.split_at_mut(1);
            let mut total = 0.0;
            for ((d, &v), &c) in dx.iter_mut().zip(x).zip(ct) {
                let t = elementary::tanh(k * (v + 0.044715 * v * v * v));
                total += 0.5 * v * (1.0 + t) * c;
                let inner = k * (1.0 + 3.0 * 0.044715 * v * v);
                *d = c * 0.5 * ((1.0 + t) + v * (1.0 - t * t) * inner);
            }
            loss[0] = total;
        },
    );
}

fn cross_entropy(c: &mut Criterion, s: &Shapes) {
    let b = Builder::new("cross_entropy");
    let logits = b.parameter("logits", [s.tokens, VOCAB], DType::F32);
    let labels = b.parameter("labels", [s.tokens], DType::I32);
    let loss = logits.cross_entropy_with_logits(&labels);
    let program = b.finish(&[&loss]).expect("traces");
    let ids = (0..s.tokens).map(|i| (i * 5 % VOCAB) as i32).collect();
    let inputs = [
        values(&[s.tokens, VOCAB], 8.0),
        Literal::I32(ArrayD::from_shape_vec(IxDyn(&[s.tokens]), ids).expect("shape fits")),
    ];
    compare(
        c,
        &format!("cross_entropy {}", s.name),
        &program,
        &inputs,
        1e-5,
        |inputs, out| {
            let ids = inputs[1].as_i32().expect("i32");
            let mut total = 0.0;
            for (x, &id) in f32s(&inputs[0]).chunks_exact(VOCAB).zip(ids) {
                let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let sum: f32 = x.iter().map(|&v| elementary::exp(v - max)).sum();
                total += x[id as usize] - max - sum.ln();
            }
            out[0] = -total / s.tokens as f32;
        },
    );
}

/// The AdamW update of one weight as `Optimizer::adamw` emits it into a training step
/// for a weight it does not decay (optax's `scale_by_adam`, `scale_by_learning_rate`
/// with the step's `-lr(t)` as an input, `apply_updates`): the same ops as the model
/// library's steps run, so the same compiled loop.
fn adamw(c: &mut Criterion, s: &Shapes) {
    let (beta1, beta2, eps) = (0.9f32, 0.99f32, 1e-8f32);
    let b = Builder::new("adamw");
    let n = [s.weight];
    let w = b.parameter("w", n, DType::F32);
    let g = b.parameter("g", n, DType::F32);
    let m = b.parameter("m", n, DType::F32);
    let v = b.parameter("v", n, DType::F32);
    let rate = b.parameter("rate", [], DType::F32);
    let c1 = b.parameter("c1", [], DType::F32);
    let c2 = b.parameter("c2", [], DType::F32);
    let like = |t: &gspmd_core::ir::Tensor| t.broadcast_in_dim(n, &[]);
    let m2 = m
        .mul(&m.scalar_like(f64::from(beta1)))
        .add(&g.mul(&g.scalar_like(f64::from(1.0 - beta1))));
    let v2 = v
        .mul(&v.scalar_like(f64::from(beta2)))
        .add(&g.mul(&g).mul(&g.scalar_like(f64::from(1.0 - beta2))));
    let direction = m2.div(&like(&c1)).div(
        &v2.div(&like(&c2))
            .sqrt()
            .add(&v2.scalar_like(f64::from(eps))),
    );
    // `apply_updates`: the update scaled by minus the learning rate, added.
    let w2 = w.add(&direction.mul(&like(&rate)));
    let program = b.finish(&[&w2, &m2, &v2]).expect("traces");
    let scalar = Literal::scalar_f32;
    let inputs = [
        values(&n, 1.0),
        values(&n, 0.1),
        values(&n, 0.01),
        Literal::F32(values(&n, 0.001).as_f32().expect("f32").mapv(f32::abs)),
        scalar(-3e-3),
        scalar(0.19),
        scalar(0.0199),
    ];
    compare(
        c,
        &format!("adamw {}", s.name),
        &program,
        &inputs,
        1e-6,
        |inputs, out| {
            let [w, g, m, v] = [0, 1, 2, 3].map(|k| f32s(&inputs[k]));
            let [rate, c1, c2] = [4, 5, 6].map(|k| f32s(&inputs[k])[0]);
            let (ws, rest) = out.split_at_mut(s.weight);
            let (ms, vs) = rest.split_at_mut(s.weight);
            for k in 0..s.weight {
                let m = beta1 * m[k] + (1.0 - beta1) * g[k];
                let v = beta2 * v[k] + (1.0 - beta2) * g[k] * g[k];
                ws[k] = w[k] + m / c1 / ((v / c2).sqrt() + eps) * rate;
                ms[k] = m;
                vs[k] = v;
            }
        },
    );
}

/// The ReLU's gradient as the autodiff writes it (`max(x, 0)`'s cotangent: the
/// compares of the input and of zero with the output, the selects of the cotangent and
/// its half at ties) on a U-Net activation (`[8, 32, 32, 16]`; on a 2x4 mesh an eighth
/// of the batch and channels). The ops are built in another order than the U-Net's step
/// has them (`0 == y` first): a group runs the compiled chain of the same ops in any
/// order (see `runtime::fusion::chains`).
fn relu_grad(c: &mut Criterion, s: &Shapes) {
    let shape = if s.name == "1x1" {
        [8, 32, 32, 16]
    } else {
        [4, 32, 32, 4]
    };
    let b = Builder::new("relu_grad");
    let x = b.parameter("x", shape, DType::F32);
    let y = b.parameter("y", shape, DType::F32);
    let ct = b.parameter("ct", shape, DType::F32);
    let zero = x.scalar_like(0.0);
    let share = zero.eq(&y).select(&ct.mul(&ct.scalar_like(0.5)), &ct);
    let dx = x.eq(&y).select(&share, &zero);
    let program = b.finish(&[&dx]).expect("traces");
    let x = values(&shape, 2.0);
    let y = Literal::F32(x.as_f32().expect("f32").mapv(|v| v.max(0.0)));
    let inputs = [x, y, values(&shape, 1.0)];
    compare(
        c,
        &format!("relu_grad {}", s.name),
        &program,
        &inputs,
        0.0,
        |inputs, out| {
            let [x, y, ct] = [0, 1, 2].map(|k| f32s(&inputs[k]));
            for (((o, &x), &y), &ct) in out.iter_mut().zip(x).zip(y).zip(ct) {
                let share = if y == 0.0 { ct * 0.5 } else { ct };
                *o = if x == y { share } else { 0.0 };
            }
        },
    );
}

/// The MoE router's gating chain ([`gating_program`]); on a 2x4 mesh a device holds 2
/// of the 16 groups.
fn gating(c: &mut Criterion, s: &Shapes) {
    let groups = if s.name == "1x1" { 16 } else { 2 };
    let (gse, full) = shapes(groups);
    let program = gating_program(groups);
    // One-hot choices: expert `t % 4` first, `(t + 1) % 4` second; slot masks with a
    // one at slot `t % 12` (as the router's are).
    let tokens = groups * GATING_SEQ;
    let hot = |shift: usize| {
        let v = (0..tokens * EXPERTS)
            .map(|k| f32::from(u8::from((k / EXPERTS + shift) % EXPERTS == k % EXPERTS)))
            .collect();
        Literal::F32(ArrayD::from_shape_vec(IxDyn(&gse), v).expect("shape fits"))
    };
    let slots = |shift: usize| {
        let v = (0..tokens * EXPERTS * CAPACITY)
            .map(|k| {
                let (t, e, c) = (
                    k / (EXPERTS * CAPACITY),
                    k / CAPACITY % EXPERTS,
                    k % CAPACITY,
                );
                f32::from(u8::from((t + shift) % EXPERTS == e && t % CAPACITY == c))
            })
            .collect();
        Literal::F32(ArrayD::from_shape_vec(IxDyn(&full), v).expect("shape fits"))
    };
    let inputs = [values(&gse, 4.0), hot(0), hot(1), slots(0), slots(1)];
    compare(
        c,
        &format!("gating {}", s.name),
        &program,
        &inputs,
        1e-6,
        |inputs, out| {
            let [x, f1, f2, r1, r2] = [0, 1, 2, 3, 4].map(|k| f32s(&inputs[k]));
            let mut gates = [0.0f32; EXPERTS];
            for t in 0..tokens {
                let x = &x[t * EXPERTS..][..EXPERTS];
                let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                for (g, &v) in gates.iter_mut().zip(x) {
                    *g = elementary::exp(v - max);
                }
                let sum: f32 = gates.iter().sum();
                let (mut g1, mut g2) = (0.0, 0.0);
                for e in 0..EXPERTS {
                    let g = gates[e] / sum;
                    g1 += g * f1[t * EXPERTS + e];
                    g2 += g * f2[t * EXPERTS + e];
                }
                let norm = g1 + g2 + 1e-9;
                let (w1, w2) = (g1 / norm, g2 / norm);
                let span = t * EXPERTS * CAPACITY..(t + 1) * EXPERTS * CAPACITY;
                for ((o, &a), &b) in out[span.clone()]
                    .iter_mut()
                    .zip(&r1[span.clone()])
                    .zip(&r2[span])
                {
                    *o = w1 * a + w2 * b;
                }
            }
        },
    );
}

/// `exp`, `tanh` and `logistic` alone over a vector of 16,384 elements (64 KiB, in
/// the cache) spread over `[-8, 8]`: the cost per element of each function, fused
/// (the CPU's widest vectors) and in a loop for the build's target.
fn transcendentals(c: &mut Criterion) {
    transcendental(c, "exp", |x| x.exp(), elementary::exp);
    transcendental(c, "tanh", |x| x.tanh(), elementary::tanh);
    transcendental(c, "logistic", |x| x.logistic(), elementary::logistic);
}

/// One of [`transcendentals`]: the program `op(x)` against a loop of `f` (inlined).
fn transcendental(
    c: &mut Criterion,
    name: &str,
    op: impl Fn(&gspmd_core::ir::Tensor) -> gspmd_core::ir::Tensor,
    f: impl Fn(f32) -> f32 + Sync,
) {
    let n = [16_384];
    let b = Builder::new(name);
    let x = b.parameter("x", n, DType::F32);
    let program = b.finish(&[&op(&x)]).expect("traces");
    compare(
        c,
        name,
        &program,
        &[values(&n, 16.0)],
        0.0,
        |inputs, out| {
            for (o, &v) in out.iter_mut().zip(f32s(&inputs[0])) {
                *o = f(v);
            }
        },
    );
}

fn bench(c: &mut Criterion) {
    #[cfg(target_arch = "x86_64")]
    println!(
        "vector path of the fused loops: {}",
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512cd")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
        {
            "AVX-512 (pulp V4)"
        } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            "AVX2 and FMA (pulp V3)"
        } else {
            "scalar"
        }
    );
    transcendentals(c);
    gelu_grad(c);
    for s in &MESHES {
        layer_norm(c, s);
        softmax(c, s, false);
        softmax(c, s, true);
        gelu(c, s);
        cross_entropy(c, s);
        adamw(c, s);
        gating(c, s);
        relu_grad(c, s);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
