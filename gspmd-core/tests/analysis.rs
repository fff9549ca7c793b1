//! Memory and cost analysis of compiled programs, against counts by hand.

use gspmd_core::analysis::DeviceModel;
use gspmd_core::compile;
use gspmd_core::ir::{Builder, DType, Program, Tensor, einsum};
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
        assert!(cost.step_seconds(true) <= cost.step_seconds(false));
        assert_eq!(
            cost.step_seconds(false),
            cost.compute_seconds + cost.communication_seconds
        );
    }
}

#[test]
fn the_tpu_preset_is_one_core_of_the_public_chip_figures() {
    let tpu = DeviceModel::tpu_v3_core();
    assert_eq!(tpu.flops_per_second, 61.5e12);
    assert!(tpu.link_bytes_per_second > 1e11);
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
