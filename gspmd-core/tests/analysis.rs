//! Memory and cost analysis of compiled programs, against counts by hand.

use gspmd_core::analysis::{DeviceModel, Overlap};
use gspmd_core::compile;
use gspmd_core::ir::{Builder, CollectiveKind, DType, Program, Tensor, einsum};
use gspmd_core::sharding::{Mesh, Sharding};

fn s(text: &str) -> Sharding {
    text.parse().expect("sharding parses")
}

fn build(name: &str, f: impl FnOnce(&Builder) -> Vec<Tensor>) -> Program {
    let b = Builder::new(name);
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    b.finish(&refs).expect("traces")
}

fn mesh(data: usize, model: usize) -> Mesh {
    Mesh::new([("data", data), ("model", model)]).expect("mesh")
}

const N: usize = 256;
const KIB: usize = N * 4;

#[test]
fn an_elementwise_chain_holds_one_buffer() {
    // exp makes the one array; tanh and the product with the input overwrite it.
    let program = build("chain", |b| {
        let x = b.parameter("x", [N], DType::F32);
        vec![x.exp().tanh().mul(&x)]
    });
    let exe = compile(&program, &mesh(1, 1)).expect("compiles");
    let m = exe.memory_analysis();
    assert_eq!(m.peak_bytes, 2 * KIB, "{m}");
    assert_eq!(m.breakdown.parameters, KIB);
    assert_eq!(m.breakdown.activations_kept, 0);
    assert_eq!(m.breakdown.temporaries, KIB);
    assert_eq!(m.timeline.len(), exe.spmd().program.nodes.len());
    assert!(m.timeline.iter().all(|&t| t <= m.peak_bytes));
}

#[test]
fn a_value_kept_across_another_is_an_activation() {
    let line = line!() + 4;
    let program = build("kept", |b| {
        let x = b.parameter("x", [N], DType::F32);
        let m = b.parameter("m(x)", [N], DType::F32);
        let y = x.exp();
        let z = x.tanh();
        vec![y.clone(), y.add(&z).add(&m)]
    });
    let exe = compile(&program, &mesh(1, 1)).expect("compiles");
    let m = exe.memory_analysis();
    // exp's result is an output, so it is not fused: it is held while the loop of
    // tanh and the two sums runs (kept), and that loop's result is the node's own
    // (no leaf it reads dies there).
    assert_eq!(m.peak_bytes, 4 * KIB, "{m}");
    assert_eq!(m.breakdown.parameters, KIB);
    assert_eq!(m.breakdown.optimizer_state, KIB);
    assert_eq!(m.breakdown.activations_kept, KIB);
    assert_eq!(m.breakdown.temporaries, KIB);
    let (_, location) = m.peak_value.expect("a value is live at the peak");
    assert_eq!(location.map(|l| l.line), Some(line), "{m}");
    assert!(m.to_string().contains("optimizer state"));
}

/// `tanh(x @ w1) @ w2` with Megatron's sharding: batch over `data`, the hidden dim
/// over `model`, the result's partial sums all-reduced.
fn megatron(b: &Builder, batch: usize, d: usize, f: usize) -> Tensor {
    let [x, w1, w2] = [
        ("x", [batch, d], "(data, _)"),
        ("w1", [d, f], "(_, model)"),
        ("w2", [f, d], "(model, _)"),
    ]
    .map(|(name, shape, sharding)| b.parameter(name, shape, DType::F32).annotate(s(sharding)));
    einsum("bf,fd->bd", &einsum("bd,df->bf", &x, &w1).tanh(), &w2).shard(s("(data, _)"))
}

#[test]
fn flops_and_bytes_of_a_megatron_mlp_are_the_hand_counts() {
    let (batch, d, f) = (8u64, 16u64, 32u64);
    let program = build("mlp", |b| vec![megatron(b, 8, 16, 32)]);
    for (data, model) in [(1u64, 1u64), (2, 1), (1, 4), (2, 4)] {
        let exe = compile(&program, &mesh(data as usize, model as usize)).expect("compiles");
        let device = DeviceModel::this_machine();
        let cost = exe.cost_analysis(&device);
        let (b, h) = (batch / data, f / model);
        // Two products of 2*M*N*K each, tanh once per hidden element.
        assert_eq!(
            cost.flops.get("dot_general"),
            Some(&(2 * 2 * b * h * d)),
            "{cost}"
        );
        assert_eq!(cost.flops.get("tanh"), Some(&(b * h)), "{cost}");
        assert_eq!(cost.total_flops(), 4 * b * h * d + b * h, "{cost}");
        // The partial sums over `model` are all-reduced: a ring moves 2 (k-1)/k of them.
        let partial = (b * d * 4) as usize;
        let k = model as usize;
        let want = if k > 1 { 2 * partial * (k - 1) / k } else { 0 };
        assert_eq!(cost.bytes_received(), want, "{cost}");
        let compute = cost.total_flops() as f64 / device.flops_per_second;
        assert!((cost.compute_seconds - compute).abs() < 1e-15);
        // (The schedule adds up its ops in another order: equal up to rounding.)
        let [none, scheduled, full] =
            [Overlap::None, Overlap::Scheduled, Overlap::Full].map(|o| cost.step_seconds(o));
        assert!(
            full <= scheduled * (1.0 + 1e-12) && scheduled <= none * (1.0 + 1e-12),
            "{cost}"
        );
        // Each kind's time, one latency per run plus its bytes at 12 GB/s, adds up.
        let by_kind: f64 = cost.communication_by_kind.values().sum();
        assert!((by_kind - cost.communication_seconds).abs() < 1e-12);
        if let Some(&(n, bytes)) = cost.collectives.get(&CollectiveKind::AllReduce) {
            let want = n as f64 * device.collective_latency + bytes as f64 / 12e9;
            assert!((cost.communication_by_kind[&CollectiveKind::AllReduce] - want).abs() < 1e-12);
        }
        assert_eq!(
            cost.step_seconds(Overlap::None),
            cost.compute_seconds + cost.communication_seconds
        );
    }
}

#[test]
fn bf16_and_f16_values_count_like_f32_ones() {
    // The same MLP (unannotated: replicated, every device computes all of it) in each
    // float type: the same FLOPs (a TPU's bf16 matmul is its peak), and an i32 product
    // none.
    let count = |dtype: DType| {
        let program = build("mlp", |b| {
            let x = b.parameter("x", [8, 16], dtype);
            let w = b.parameter("w", [16, 32], dtype);
            vec![einsum("bd,df->bf", &x, &w).tanh()]
        });
        let exe = compile(&program, &mesh(2, 1)).expect("compiles");
        exe.cost_analysis(&DeviceModel::this_machine())
            .total_flops()
    };
    let want = 2 * 8 * 16 * 32 + 8 * 32;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        assert_eq!(count(dtype), want, "{dtype}");
    }
    let ints = build("ints", |b| {
        let x = b.parameter("x", [8, 16], DType::I32);
        let w = b.parameter("w", [16, 32], DType::I32);
        vec![einsum("bd,df->bf", &x, &w)]
    });
    let exe = compile(&ints, &mesh(1, 1)).expect("compiles");
    assert_eq!(
        exe.cost_analysis(&DeviceModel::this_machine())
            .total_flops(),
        0
    );
}

#[test]
fn a_scan_of_bf16_layers_counts_each_iteration() {
    let (layers, d) = (6usize, 16usize);
    let program = build("stack", |b| {
        let x = b.parameter("x", [4, d], DType::BF16);
        let w = b.parameter("w", [layers, d, d], DType::BF16);
        let (last, _) = b.scan(&[w], &[x], |h, w| {
            (vec![einsum("bd,de->be", &h[0], &w[0]).tanh()], vec![])
        });
        vec![last[0].clone()]
    });
    let exe = compile(&program, &mesh(1, 1)).expect("compiles");
    let cost = exe.cost_analysis(&DeviceModel::this_machine());
    let per_layer = (2 * 4 * d * d + 4 * d) as u64;
    assert_eq!(cost.total_flops(), layers as u64 * per_layer, "{cost}");
}

#[test]
fn sorts_and_scatter_adds_have_their_flops() {
    let program = build("sort", |b| {
        let x = b.parameter("x", [4, 8], DType::F32);
        vec![x.argsort(1, false)]
    });
    let exe = compile(&program, &mesh(1, 1)).expect("compiles");
    let cost = exe.cost_analysis(&DeviceModel::this_machine());
    // 4 rows of 8: 8 log2 8 = 24 comparisons each.
    assert_eq!(cost.flops.get("argsort"), Some(&(4 * 24)), "{cost}");
    // 3 source rows of 8 added into a [5, 8] table: 24 additions.
    let program = build("index_add", |b| {
        let table = b.parameter("table", [5, 8], DType::BF16);
        let index = b.parameter("index", [3], DType::I32);
        let source = b.parameter("source", [3, 8], DType::BF16);
        vec![table.index_add(0, &index, &source)]
    });
    let exe = compile(&program, &mesh(1, 1)).expect("compiles");
    let cost = exe.cost_analysis(&DeviceModel::this_machine());
    assert_eq!(cost.flops.get("scatter_add"), Some(&24), "{cost}");
}

#[test]
fn the_tpu_preset_is_one_core_of_the_public_chip_figures() {
    use gspmd_core::analysis::Interconnect;
    use gspmd_core::ir::{AxisGroup, Op, ReduceKind};
    let tpu = DeviceModel::tpu_v3_core();
    assert_eq!(tpu.flops_per_second, 61.5e12);
    assert_eq!(tpu.memory_bytes, 16 << 30);
    let Interconnect::Torus {
        link_bytes_per_second: link,
        devices_per_chip: 2,
    } = tpu.interconnect
    else {
        panic!("{tpu:?}")
    };
    // 340 TB/s per pod of 1024 chips over 4 links each.
    assert!((link - 83.0e9).abs() < 0.1e9, "{link}");
    let half = tpu.clone().with_efficiency(0.5);
    assert_eq!(half.sustained_flops_per_second(), 30.75e12);
    // A (32, 64) mesh of 2048 cores: 32 x 32 chips.
    let pod = Mesh::new([("x", 32), ("y", 64)]).expect("mesh");
    let group = |axes: &[&str]| AxisGroup {
        axes: axes.iter().map(|a| a.to_string()).collect(),
        size: pod.axes_size(axes),
    };
    let gather = |axes: &[&str]| Op::AllGather {
        group: group(axes),
        dim: 0,
    };
    let bytes = 1usize << 30;
    // Along one torus dim a device gets half its chip's two links; along two, all four.
    let one = tpu.collective_seconds(&gather(&["x"]), &pod, bytes);
    assert!((one - bytes as f64 / link).abs() < 1e-9, "{one}");
    let y = tpu.collective_seconds(&gather(&["y"]), &pod, bytes);
    assert_eq!(one, y);
    let reduce = Op::ReduceScatter {
        group: group(&["x", "y"]),
        kind: ReduceKind::Sum,
        dim: 0,
    };
    let two = tpu.collective_seconds(&reduce, &pod, bytes);
    assert!((two - one / 2.0).abs() < 1e-9, "{two}");
    // An all-to-all over y's 32 chips is bisection bound: 32 / 8 times a link's time
    // for the chip's two devices' bytes.
    let a2a = Op::AllToAll {
        group: group(&["y"]),
        split_dim: 0,
        concat_dim: 1,
    };
    let t = tpu.collective_seconds(&a2a, &pod, bytes);
    let want = 2.0 * bytes as f64 * 32.0 / (8.0 * link);
    assert!((t - want).abs() < 1e-9, "{t} vs {want}");
}

#[test]
fn every_optimizers_slots_are_optimizer_state() {
    use gspmd_core::train::{Adafactor, Optimizer, step_program};
    // A loss of two weights: a matrix (Adafactor factors its second moment into
    // `v_row` and `v_col`) and a vector (one `v`); the data is a parameter, not state.
    let model = build("model", |b| {
        let x = b.parameter("x", [8, 16], DType::F32);
        let w = b.parameter("w", [16, 32], DType::F32);
        let bias = b.parameter("bias", [32], DType::F32);
        let y = einsum("bd,df->bf", &x, &w).add(&bias.broadcast_to([8, 32]));
        vec![y.mul(&y).sum(&[0, 1])]
    });
    for (optimizer, state_bytes) in [
        // Adafactor: v_row(w) f32[16], v_col(w) f32[32], v(bias) f32[32].
        (
            Adafactor {
                min_dim_size_to_factor: 0,
                ..Adafactor::new(1e-2)
            }
            .into(),
            (16 + 32 + 32) * 4,
        ),
        // AdamW: m and v like each weight.
        (Optimizer::adamw(1e-3), 2 * (16 * 32 + 32) * 4),
    ] {
        let step = step_program(&model, 0, &[1, 2], &optimizer).expect("step");
        let exe = compile(&step.program, &mesh(1, 1)).expect("compiles");
        let m = exe.memory_analysis();
        assert_eq!(
            m.breakdown.optimizer_state, state_bytes,
            "{optimizer:?}: {m}"
        );
    }
}

/// The scheduled overlap on compiled programs: a product whose partial sums are
/// all-reduced and then used has nothing to overlap (its step is compute plus
/// communication); a second product independent of the all-reduce hides it.
#[test]
fn a_collective_overlaps_only_compute_independent_of_it() {
    let device = DeviceModel::this_machine();
    let reduced = |b: &Builder| {
        let x = b
            .parameter("x", [64, 512], DType::F32)
            .annotate(s("(_, model)"));
        let w = b
            .parameter("w", [512, 256], DType::F32)
            .annotate(s("(model, _)"));
        x.matmul(&w).annotate(s("(_, _)")).tanh()
    };
    let chain = build("chain", |b| vec![reduced(b)]);
    let exe = compile(&chain, &mesh(1, 2)).expect("compiles");
    let cost = exe.cost_analysis(&device);
    assert!(cost.communication_seconds > 0.0, "{cost}");
    let serial = cost.step_seconds(Overlap::None);
    assert!(
        (cost.step_seconds(Overlap::Scheduled) - serial).abs() <= 1e-12 * serial,
        "{cost}"
    );

    let beside = build("beside", |b| {
        let a = b.parameter("a", [256, 256], DType::F32);
        let c = b.parameter("c", [256, 256], DType::F32);
        vec![reduced(b), a.matmul(&c).annotate(s("(_, _)"))]
    });
    let exe = compile(&beside, &mesh(1, 2)).expect("compiles");
    let cost = exe.cost_analysis(&device);
    let (serial, scheduled, full) = (
        cost.step_seconds(Overlap::None),
        cost.step_seconds(Overlap::Scheduled),
        cost.step_seconds(Overlap::Full),
    );
    // The independent product (2 * 256^3 FLOPs) is longer than the all-reduce, so the
    // all-reduce is hidden entirely: the step is the compute alone.
    let independent = 2.0 * 256f64.powi(3) / device.sustained_flops_per_second();
    assert!(independent > cost.communication_seconds, "{cost}");
    assert!(scheduled < serial, "{cost}");
    assert!((scheduled - full).abs() <= 1e-12 * full, "{cost}");
    assert!(
        (full - cost.compute_seconds).abs() <= 1e-12 * full,
        "{cost}"
    );
}
