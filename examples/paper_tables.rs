//! The paper's sparse and image-model tables (GSPMD, arXiv 2105.04663 v2, Table 6: a
//! mixture of experts with one expert per core; Table 8: a 3-D U-Net with spatial
//! partitioning) planned symbolically and predicted on the TPUv3 device model beside the
//! published figures: for the MoE, step time, utilisation and the all-to-all's share of
//! the step from 32 to 2048 cores; for the U-Net, the step-time reduction on 2 to 16
//! partitions of 128^3 images, and how many partitions 256^3 images need to fit a
//! core's 16 GiB.
//!
//! The MoE is GShard's (Lepikhin et al. 2020): 36 layers (M = 1024, 16 heads of 64,
//! feed-forward H = 8192) whose every second feed-forward is a mixture of `E` experts,
//! `E` the number of cores (10B parameters on 32 cores, 577B, in binary billions, on
//! 2048), top-2 gating ([`gspmd::models::moe::top2_gating`]) with capacity `2 S / E`
//! per group of `S = 1024` tokens (at least 1), 4 groups per core, f32 weights and
//! Adafactor, bf16 activations, the layers (in pairs) under one `scan`. Tokens, dense
//! weights' gradients and experts are split over all cores (mesh `(x, y)`, a 2-D torus):
//! data-parallel dense layers, one expert per core, the dispatch and combine an
//! all-to-all over the whole mesh. The tokens per core are our assumption (the paper's
//! batch is not in our reading of it); the example prints how many the paper's
//! utilisation implies.
//!
//! ```text
//! cargo run --release --example paper_tables
//! ```
//!
//! The model is the 3-D U-Net of Çiçek et al. (2016): four levels of two 3x3x3
//! convolutions (32/64, 64/128, 128/256, 256/512 channels), 2x2x2 max pooling down,
//! nearest upsampling and a 3x3x3 convolution up, joined with the skip connection, and a
//! 1x1x1 output convolution to 3 classes, trained by SGD on the mean square error;
//! weights f32, activations bf16, one image per step. The paper's exact U-Net (its
//! channels, batch, optimizer) is not in our reading of it; these are the published
//! architecture's. Spatial partitioning splits depth and height over a mesh `(d, h)`
//! of `k = d h` cores (the convolutions exchange halos), the weights replicated (their
//! gradients all-reduced). The device model's one constant, the compute efficiency, is
//! the one `paper_scale` fits on Table 2's first row (0.668), not refitted here. Step
//! times are the program scheduled on a compute and a communication stream, each
//! collective overlapping the compute that does not depend on it
//! ([`Overlap::Scheduled`]: the U-Net's halo exchanges beside the convolutions of other
//! blocks, the MoE's all-to-alls beside independent compute); Table 8 also prints the
//! step with every collective after the compute before it.
//!
//! Not checked against the paper (the example prints, and `benches/README.md`, "The
//! paper's tables", discusses the differences); it fails only if a plan fails.

use std::time::Instant;

use gspmd::analysis::{DeviceModel, Overlap};
use gspmd::models::moe::top2_gating;
use gspmd::models::transformer::causal;
use gspmd::prelude::*;
use gspmd::train::{Optimizer, step_program};
use gspmd::{CompileOptions, compile_with};

/// The compute efficiency `paper_scale` fits on Table 2's first row (its layers under
/// `dots_saveable`, the step scheduled with its collectives overlapped).
const EFFICIENCY: f64 = 0.668;

/// Channels of the four levels.
const CHANNELS: [usize; 4] = [32, 64, 128, 256];

/// NDHWC input, DHWIO kernels.
fn conv3d(x: &Tensor, w: &Tensor) -> Tensor {
    let dims = ConvDimensionNumbers {
        input_batch: 0,
        input_feature: 4,
        input_spatial: vec![1, 2, 3],
        kernel_input_feature: 3,
        kernel_output_feature: 4,
        kernel_spatial: vec![0, 1, 2],
        output_batch: 0,
        output_feature: 4,
        output_spatial: vec![1, 2, 3],
    };
    x.conv_general_dilated(w, &[1, 1, 1], Padding::Same, &[], &[], &dims, 1)
}

fn spatial() -> Sharding {
    "(_, d, h, _, _)".parse().expect("sharding parses")
}

/// The U-Net's training loss on `size`^3 images: the program's inputs are the image,
/// the target, then the kernels in order.
fn unet(size: usize) -> Result<Program> {
    let b = Builder::new("unet3d");
    let image = b.parameter("image", [1, size, size, size, 1], DType::BF16);
    let target = b.parameter("target", [1, size, size, size, 3], DType::F32);
    let (image, target) = (image.annotate(spatial()), target.annotate(spatial()));
    let kernel = |name: String, k: usize, i: usize, o: usize| {
        b.parameter(&name, [k, k, k, i, o], DType::F32)
            .annotate("(_, _, _, _, _)".parse().expect("sharding parses"))
            .convert(DType::BF16)
    };
    let block = |x: &Tensor, name: &str, i: usize, o: usize| {
        let a = conv3d(x, &kernel(format!("{name}_a"), 3, i, o)).relu();
        conv3d(&a.shard(spatial()), &kernel(format!("{name}_b"), 3, o, o))
            .relu()
            .shard(spatial())
    };
    let pool = |x: &Tensor| x.max_pool(&[1, 2, 2, 2, 1], &[1, 2, 2, 2, 1], Padding::Valid);
    let mut skips = Vec::new();
    let mut x = image;
    let mut inputs = 1;
    for (level, &c) in CHANNELS.iter().enumerate() {
        x = block(&x, &format!("down{level}"), inputs, c);
        skips.push(x.clone());
        x = pool(&x).shard(spatial());
        inputs = c;
    }
    x = block(&x, "bottom", inputs, 2 * inputs);
    inputs *= 2;
    for (level, &c) in CHANNELS.iter().enumerate().rev() {
        let up = conv3d(
            &x.upsample_nearest(&[1, 2, 2, 2, 1]),
            &kernel(format!("up{level}"), 3, inputs, c),
        )
        .shard(spatial());
        let joined = b.concatenate(&[&up, &skips[level]], 4);
        x = block(&joined, &format!("merge{level}"), 2 * c, c);
        inputs = c;
    }
    let logits = conv3d(&x, &kernel("out".into(), 1, inputs, 3)).convert(DType::F32);
    let error = &logits - &target;
    let loss = (&error * &error).mean(&[0, 1, 2, 3, 4]);
    b.finish(&[&loss])
}

/// One plan: predicted step seconds and peak bytes per device.
#[derive(Clone, Copy)]
struct Planned {
    /// Under the scheduled overlap ([`Overlap::Scheduled`]).
    step: f64,
    /// Collectives after the compute ([`Overlap::None`]).
    serial: f64,
    compute: f64,
    communication: f64,
    peak: usize,
    plan_seconds: f64,
}

fn plan(size: usize, (d, h): (usize, usize)) -> Result<Planned> {
    let started = Instant::now();
    let model = unet(size)?;
    let weights: Vec<usize> = (2..model.params.len()).collect();
    let step = step_program(&model, 0, weights.as_slice(), &Optimizer::sgd(1e-3, 0.0))?;
    let options = CompileOptions {
        donated: weights,
        ..CompileOptions::default()
    };
    let exe = compile_with(&step.program, &Mesh::new([("d", d), ("h", h)])?, &options)?;
    let peak = exe.memory_analysis().peak_bytes;
    let plan_seconds = started.elapsed().as_secs_f64();
    let tpu = DeviceModel::tpu_v3_core().with_efficiency(EFFICIENCY);
    let cost = exe.cost_analysis(&tpu);
    Ok(Planned {
        step: cost.step_seconds(Overlap::Scheduled),
        serial: cost.step_seconds(Overlap::None),
        compute: cost.compute_seconds,
        communication: cost.communication_seconds,
        peak,
        plan_seconds,
    })
}

/// `k` partitions as a mesh `(d, h)`: depth first, then height.
fn mesh_of(k: usize) -> (usize, usize) {
    let h = (1..=k)
        .filter(|h| k.is_multiple_of(*h) && *h * *h <= k)
        .max()
        .unwrap_or(1);
    (k / h, h)
}

/// GShard's MoE Transformer sizes.
const MOE_LAYERS: usize = 36;
const MOE_MODEL: usize = 1024;
const MOE_HIDDEN: usize = 8192;
const MOE_HEADS: usize = 16;
const MOE_HEAD_DIM: usize = 64;
const MOE_SEQ: usize = 1024;
/// Groups (sequences) per core: our assumption.
const MOE_GROUPS_PER_CORE: usize = 4;

fn sharding(text: &str) -> Sharding {
    text.parse().expect("sharding parses")
}

/// Self-attention of `x: [G, S, M]` (data-parallel: weights whole on every core).
fn attention(x: &Tensor, w: &[Tensor]) -> Tensor {
    let tokens = "((x, y), _, _)";
    let a = x.layer_norm(-1, 1e-5);
    let q = einsum("gsm,mnd->gnsd", &a, &w[0]);
    let k = einsum("gtm,mnd->gntd", &a, &w[1]);
    let v = einsum("gtm,mnd->gntd", &a, &w[2]);
    let scale = 1.0 / (MOE_HEAD_DIM as f32).sqrt();
    let scores = causal(&(einsum("gnsd,gntd->gnst", &q, &k) * scale)).softmax(-1);
    let context = einsum("gnst,gntd->gnsd", &scores, &v);
    (x + &einsum("gnsd,ndm->gsm", &context, &w[3])).shard(sharding(tokens))
}

/// A dense feed-forward layer.
fn dense_ffn(x: &Tensor, w1: &Tensor, w2: &Tensor) -> Tensor {
    let hidden = einsum("gsm,mh->gsh", &x.layer_norm(-1, 1e-5), w1).gelu();
    (x + &einsum("gsh,hm->gsm", &hidden, w2)).shard(sharding("((x, y), _, _)"))
}

/// A mixture-of-experts feed-forward layer, one expert per core: router `wg: [M, E]`
/// (f32: the gating runs in f32), experts `wi: [E, M, H]`, `wo: [E, H, M]`.
fn moe_ffn(x: &Tensor, wg: &Tensor, wi: &Tensor, wo: &Tensor, capacity: usize) -> Tensor {
    let routing = top2_gating(&x.layer_norm(-1, 1e-5).convert(DType::F32), wg, capacity);
    let by_group = sharding("((x, y), _, _, _)");
    let dispatch = routing.dispatch.convert(x.dtype()).shard(by_group.clone());
    let combine = routing.combine.convert(x.dtype()).shard(by_group);
    let by_expert = sharding("((x, y), _, _, _)");
    let dispatched = einsum("gsec,gsm->egcm", &dispatch, x).shard(by_expert.clone());
    let hidden = einsum("egcm,emh->egch", &dispatched, wi)
        .gelu()
        .shard(by_expert.clone());
    let out = einsum("egch,ehm->egcm", &hidden, wo).shard(by_expert);
    (x + &einsum("gsec,egcm->gsm", &combine, &out)).shard(sharding("((x, y), _, _)"))
}

/// The MoE Transformer's loss on `cores` cores (experts): the tokens, then the stacked
/// weights of the layer pairs.
fn moe_model(cores: usize) -> Result<Program> {
    let b = Builder::new("moe_transformer");
    let (l, m, h, n, d) = (
        MOE_LAYERS / 2,
        MOE_MODEL,
        MOE_HIDDEN,
        MOE_HEADS,
        MOE_HEAD_DIM,
    );
    let groups = cores * MOE_GROUPS_PER_CORE;
    let capacity = (2 * MOE_SEQ / cores).max(1);
    let x = b.parameter("x", [groups, MOE_SEQ, m], DType::BF16);
    let x = x.annotate(sharding("((x, y), _, _)"));
    let weight = |name: &str, shape: Vec<usize>, s: &str| {
        b.parameter(name, shape, DType::F32).annotate(sharding(s))
    };
    let whole = |name: &str, shape: Vec<usize>| {
        let spec = format!("({})", vec!["_"; shape.len()].join(", "));
        weight(name, shape, &spec)
    };
    let mut stacked = Vec::new();
    for pair in ["a", "b"] {
        for (name, shape) in [
            ("wq", vec![l, m, n, d]),
            ("wk", vec![l, m, n, d]),
            ("wv", vec![l, m, n, d]),
            ("wo", vec![l, n, d, m]),
        ] {
            stacked.push(whole(&format!("{name}_{pair}"), shape));
        }
    }
    stacked.push(whole("w1", vec![l, m, h]));
    stacked.push(whole("w2", vec![l, h, m]));
    stacked.push(whole("wg", vec![l, m, cores]));
    stacked.push(weight("wi", vec![l, cores, m, h], "(_, (x, y), _, _)"));
    stacked.push(weight("wo_e", vec![l, cores, h, m], "(_, (x, y), _, _)"));
    let (last, _) = b.scan(&stacked, &[x], |carried, w| {
        // Every weight in bf16 but the router's (gating runs in f32, as GShard's).
        let w: Vec<Tensor> = (w.iter().enumerate())
            .map(|(i, t)| {
                if i == 10 {
                    t.clone()
                } else {
                    t.convert(DType::BF16)
                }
            })
            .collect();
        let x = attention(&carried[0], &w[0..4]);
        let x = dense_ffn(&x, &w[8], &w[9]);
        let x = attention(&x, &w[4..8]);
        let x = moe_ffn(&x, &w[10], &w[11], &w[12], capacity);
        (vec![x], vec![])
    });
    let y = last[0].convert(DType::F32);
    let loss = (&y * &y).mean(&[0, 1, 2]);
    b.finish(&[&loss])
}

/// Parameters of the MoE Transformer on `cores` experts.
fn moe_params(cores: usize) -> usize {
    let (m, h, n, d) = (MOE_MODEL, MOE_HIDDEN, MOE_HEADS, MOE_HEAD_DIM);
    let attention = 4 * m * n * d;
    let ffn = 2 * m * h;
    MOE_LAYERS * attention + MOE_LAYERS / 2 * (ffn + m * cores + cores * ffn)
}

/// Model FLOPs per token as the paper counts them: `6` per active weight (attention,
/// dense feed-forward, two experts) plus attention's `12 S M` per layer.
fn moe_flops_per_token() -> f64 {
    let (m, h) = (MOE_MODEL as f64, MOE_HIDDEN as f64);
    let layers = MOE_LAYERS as f64;
    let active = layers * 4.0 * m * m + layers / 2.0 * (2.0 * m * h + 2.0 * 2.0 * m * h);
    6.0 * active + 12.0 * layers * MOE_SEQ as f64 * m
}

/// One row of the paper's Table 6 (the endpoints, as read in issue 30).
struct MoeRow {
    cores: usize,
    mesh: (usize, usize),
    /// Published: parameters (binary billions), step seconds, utilisation %, all-to-all
    /// share of the step %.
    paper: Option<(f64, f64, f64, f64)>,
}

fn table_6() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let rows = [
        MoeRow {
            cores: 32,
            mesh: (4, 8),
            paper: Some((10.0, 0.98, 58.2, 2.0)),
        },
        MoeRow {
            cores: 128,
            mesh: (8, 16),
            paper: None,
        },
        MoeRow {
            cores: 512,
            mesh: (16, 32),
            paper: None,
        },
        MoeRow {
            cores: 2048,
            mesh: (32, 64),
            paper: Some((577.0, 1.51, 46.8, 11.0)),
        },
    ];
    let tpu = DeviceModel::tpu_v3_core().with_efficiency(EFFICIENCY);
    println!(
        "Table 6 (MoE, one expert per core), TPUv3 model at {EFFICIENCY} of peak; {MOE_GROUPS_PER_CORE} x {MOE_SEQ} tokens per core\n"
    );
    println!(
        "{:>5} {:>8} | {:>7} {:>7} | {:>7} {:>7} | {:>6} {:>6} | {:>6} {:>6} | {:>6} {:>9}",
        "cores",
        "mesh",
        "params",
        "paper",
        "step",
        "paper",
        "util",
        "paper",
        "a2a",
        "paper",
        "plan",
        "peak/core"
    );
    for row in &rows {
        let started = Instant::now();
        let model = moe_model(row.cores)?;
        let weights: Vec<usize> = (1..model.params.len()).collect();
        let step = step_program(&model, 0, &weights, &Optimizer::adafactor(1e-3))?;
        let donated = (step.params.iter())
            .flat_map(|p| std::iter::once(p.input).chain(p.state.iter().map(|s| s.input)))
            .collect();
        let options = CompileOptions {
            donated,
            ..CompileOptions::default()
        };
        let mesh = Mesh::new([("x", row.mesh.0), ("y", row.mesh.1)])?;
        let exe = compile_with(&step.program, &mesh, &options)?;
        let peak = exe.memory_analysis().peak_bytes;
        let planned = started.elapsed().as_secs_f64();
        let cost = exe.cost_analysis(&tpu);
        let seconds = cost.step_seconds(Overlap::Scheduled);
        let tokens = (MOE_GROUPS_PER_CORE * MOE_SEQ) as f64;
        let utilisation = 100.0 * tokens * moe_flops_per_token() / (tpu.flops_per_second * seconds);
        let a2a = cost
            .communication_by_kind
            .get(&CollectiveKind::AllToAll)
            .copied()
            .unwrap_or(0.0);
        let params = moe_params(row.cores) as f64 / f64::from(1u32 << 30);
        let shown =
            |v: Option<f64>, unit: &str| v.map_or("-".to_string(), |v| format!("{v}{unit}"));
        let paper = row.paper;
        println!(
            "{:>5} {:>8} | {:>6.1}B {:>7} | {:>5.2} s {:>7} | {:>5.1}% {:>6} | {:>5.1}% {:>6} | {:>4.2} s {:>5.2} GiB",
            row.cores,
            format!("{:?}", row.mesh),
            params,
            shown(paper.map(|p| p.0), "B"),
            seconds,
            shown(paper.map(|p| p.1), " s"),
            utilisation,
            shown(paper.map(|p| p.2), "%"),
            100.0 * a2a / seconds,
            shown(paper.map(|p| p.3), "%"),
            planned,
            gib(peak),
        );
        if let Some((_, step_seconds, util, _)) = paper {
            let implied =
                util / 100.0 * tpu.flops_per_second * step_seconds / moe_flops_per_token();
            println!("      the paper's utilisation implies {implied:.0} tokens per core per step");
        }
    }
    println!();
    Ok(())
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    table_6()?;
    println!("Table 8 (3-D U-Net, spatial partitioning), TPUv3 model at {EFFICIENCY} of peak\n");
    println!("128^3 images: step-time reduction (paper: 15.7x on 16 partitions)");
    let one = plan(128, (1, 1))?;
    for k in [1, 2, 4, 8, 16] {
        let p = if k == 1 { one } else { plan(128, mesh_of(k))? };
        println!(
            "  {k:>2} partitions {:>8}: step {:>6.1} ms scheduled, {:>6.1} ms serial (compute {:>5.1}, communication {:>4.1}), reduction {:>5.2}x scheduled, {:>5.2}x serial, peak {:>6.2} GiB/core (planned in {:.2} s)",
            format!("{:?}", mesh_of(k)),
            1e3 * p.step,
            1e3 * p.serial,
            1e3 * p.compute,
            1e3 * p.communication,
            one.step / p.step,
            one.serial / p.serial,
            gib(p.peak),
            p.plan_seconds
        );
    }
    println!("256^3 images: peak per core against 16 GiB (paper: 16-32 partitions needed)");
    for k in [4, 8, 16, 32, 64] {
        let p = plan(256, mesh_of(k))?;
        let fits = p.peak <= DeviceModel::tpu_v3_core().memory_bytes;
        println!(
            "  {k:>2} partitions {:>8}: peak {:>6.2} GiB/core, {}, step {:.3} s",
            format!("{:?}", mesh_of(k)),
            gib(p.peak),
            if fits { "fits" } else { "does not fit" },
            p.step
        );
    }
    Ok(())
}
