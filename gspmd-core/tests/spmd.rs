//! Issue-3 acceptance: programs annotated as users would, compiled (propagate +
//! partition) for a matrix of meshes, run on the thread mesh and compared with the
//! reference interpreter; golden checks of the collectives the partitioner emits.
//!
//! Tolerance: |got - want| <= 1e-4 * max(1, max |want|) (f32 sums in another order).

use gspmd_core::autodiff::grad;
use gspmd_core::ir::{
    Builder, CollectiveKind, ConvDimensionNumbers, DType, Literal, Padding, Program, ReduceKind,
    Tensor, einsum,
};
use gspmd_core::runtime::{ThreadMesh, interpret};
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::{Executable, compile};
use ndarray::{ArrayD, IxDyn};

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

fn input(shape: &[usize], seed: usize) -> Literal {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| (((i * 7 + seed * 13) % 29) as f32 / 9.0 - 1.5) * 0.5)
        .collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
}

fn max_diff(want: &Literal, got: &Literal) -> f32 {
    let (a, b) = (want.as_f32().unwrap(), got.as_f32().unwrap());
    assert_eq!(a.shape(), b.shape());
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// max(1, max |x|) over `want`'s elements: what the tolerance 1e-4 is relative to.
fn scale(want: &Literal) -> f32 {
    want.as_f32()
        .unwrap()
        .iter()
        .fold(1.0f32, |m, x| m.max(x.abs()))
}

/// Every output within 1e-4 of the reference's, relative to [`scale`].
fn assert_close(want: &[Literal], got: &[Literal]) {
    for (w, o) in want.iter().zip(got) {
        let scale = scale(w);
        assert!(
            max_diff(w, o) <= 1e-4 * scale,
            "{} vs {scale}",
            max_diff(w, o)
        );
    }
}

/// The mesh matrix: {1}, {2}, {4}, {8} (1-D meshes carry the other axis with size 1),
/// {2x2}, {2x4}, {4x2} with a non-default device order, and {2x2x2}.
fn meshes() -> Vec<Mesh> {
    vec![
        Mesh::new([("data", 1), ("model", 1)]).unwrap(),
        Mesh::new([("data", 1), ("model", 2)]).unwrap(),
        Mesh::new([("data", 4), ("model", 1)]).unwrap(),
        Mesh::new([("data", 1), ("model", 8)]).unwrap(),
        Mesh::new([("data", 2), ("model", 2)]).unwrap(),
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
        Mesh::with_device_order([("data", 4), ("model", 2)], vec![5, 2, 7, 0, 3, 6, 1, 4]).unwrap(),
        Mesh::new([("pipe", 2), ("data", 2), ("model", 2)]).unwrap(),
    ]
}

/// Compiles and runs `program` on every mesh of the matrix; checks each result.
fn check_on_all_meshes(program: &Program) {
    let inputs: Vec<Literal> = program
        .params
        .iter()
        .enumerate()
        .map(|(i, &p)| input(&program.ty(p).shape, i))
        .collect();
    let want = interpret(program, &inputs).unwrap();
    for mesh in meshes() {
        let exe =
            compile(program, &mesh).unwrap_or_else(|e| panic!("{} on {mesh}: {e}", program.name));
        let threads = ThreadMesh::new(mesh.clone()).unwrap();
        let got = exe
            .run(&threads, &inputs)
            .unwrap_or_else(|e| panic!("{} on {mesh}: {e}", program.name));
        for (k, (w, g)) in want.iter().zip(&got).enumerate() {
            let d = max_diff(w, g);
            assert!(
                d <= 1e-4 * scale(w),
                "{} on {mesh}, output {k}: max diff {d}\n{}",
                program.name,
                exe.report()
            );
        }
    }
}

fn build(name: &str, f: impl FnOnce(&Builder) -> Vec<Tensor>) -> Program {
    let b = Builder::new(name);
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    b.finish(&refs).unwrap()
}

fn megatron(b: &Builder, batch: usize, d: usize, f: usize) -> Tensor {
    let x = b
        .parameter("x", [batch, d], DType::F32)
        .annotate(s("(data, _)"));
    let w1 = b
        .parameter("w1", [d, f], DType::F32)
        .annotate(s("(_, model)"));
    let w2 = b
        .parameter("w2", [f, d], DType::F32)
        .annotate(s("(model, _)"));
    x.matmul(&w1).relu().matmul(&w2)
}

// ---- differential -------------------------------------------------------------------

#[test]
fn megatron_mlp() {
    check_on_all_meshes(&build("megatron", |b| vec![megatron(b, 8, 16, 32)]));
}

#[test]
fn finalized_2d_transformer_ffn() {
    // GSPMD's 2-D finalized sharding: weights on both axes, activations (data, _, model).
    let p = build("ffn2d", |b| {
        let x = b
            .parameter("x", [4, 6, 8], DType::F32)
            .annotate(s("(data, _, model)"));
        let w1 = b
            .parameter("w1", [8, 16], DType::F32)
            .annotate(s("(data, model)"));
        let w2 = b
            .parameter("w2", [16, 8], DType::F32)
            .annotate(s("(model, data)"));
        let h = einsum("bsm,mh->bsh", &x, &w1)
            .shard(s("(data, _, model)"))
            .gelu();
        vec![einsum("bsh,hm->bsm", &h, &w2).shard(s("(data, _, model)"))]
    });
    check_on_all_meshes(&p);
}

#[test]
fn attention_with_heads_on_the_model_axis() {
    let p = build("attention", |b| {
        let x = b
            .parameter("x", [2, 4, 8], DType::F32)
            .annotate(s("(data, _, _)"));
        let wq = b
            .parameter("wq", [8, 4, 2], DType::F32)
            .annotate(s("(_, model, _)"));
        let wk = b
            .parameter("wk", [8, 4, 2], DType::F32)
            .annotate(s("(_, model, _)"));
        let wv = b
            .parameter("wv", [8, 4, 2], DType::F32)
            .annotate(s("(_, model, _)"));
        let wo = b
            .parameter("wo", [4, 2, 8], DType::F32)
            .annotate(s("(model, _, _)"));
        let q = einsum("bsm,mhd->bshd", &x, &wq);
        let k = einsum("bsm,mhd->bshd", &x, &wk);
        let v = einsum("bsm,mhd->bshd", &x, &wv);
        let scores = einsum("bqhd,bkhd->bhqk", &q, &k) * 0.5;
        let probs = scores.softmax(-1);
        let o = einsum("bhqk,bkhd->bqhd", &probs, &v);
        vec![einsum("bqhd,hdm->bqm", &o, &wo)]
    });
    check_on_all_meshes(&p);
}

#[test]
fn reductions_over_sharded_and_unsharded_dims() {
    let p = build("reductions", |b| {
        let x = b
            .parameter("x", [8, 6, 4], DType::F32)
            .annotate(s("(data, _, model)"));
        vec![
            x.sum(&[0]),
            x.sum(&[1]),
            x.max_over(&[2]),
            x.min_over(&[0, 2]),
            x.mean(&[0, 1, 2]),
        ]
    });
    check_on_all_meshes(&p);
}

#[test]
fn reshape_and_transpose_chains() {
    let p = build("shapes", |b| {
        let x = b
            .parameter("x", [8, 16], DType::F32)
            .annotate(s("(data, model)"));
        let y = x
            .reshape([2, 4, 16])
            .transpose(&[2, 0, 1])
            .reshape([16, 8])
            .transpose(&[1, 0]);
        vec![(&y + &x).reshape([128])]
    });
    check_on_all_meshes(&p);
}

#[test]
fn a_dim_of_10_over_4_devices() {
    let p = build("uneven", |b| {
        let x = b
            .parameter("x", [10, 6], DType::F32)
            .annotate(s("((data, model), _)"));
        let w = b
            .parameter("w", [6, 10], DType::F32)
            .annotate(s("(_, (data, model))"));
        let e = (x.exp() * 0.5).neg();
        let r = e.sum(&[0]);
        let m = x.matmul(&w); // [10, 10], both dims uneven
        let c = w.matmul(&x); // contracting over the uneven dim
        vec![e, r, m, c, x.max_over(&[0])]
    });
    check_on_all_meshes(&p);
}

#[test]
fn resharding_chain() {
    let p = build("chain", |b| {
        let x = b
            .parameter("x", [8, 8], DType::F32)
            .annotate(s("(data, model)"));
        let y = x.exp().shard(s("(model, data)")).neg().shard(s("(_, _)"));
        vec![y.shard(s("((model, data), _)")).abs()]
    });
    check_on_all_meshes(&p);
}

#[test]
fn contracting_dim_sharded_on_both_operands() {
    let p = build("contracting", |b| {
        let x = b
            .parameter("x", [8, 16], DType::F32)
            .annotate(s("(_, model)"));
        let w = b
            .parameter("w", [16, 8], DType::F32)
            .annotate(s("(model, _)"));
        let replicated = x.matmul(&w).shard(s("(_, _)"));
        let sharded = x.matmul(&w).shard(s("(_, model)"));
        vec![replicated, sharded]
    });
    check_on_all_meshes(&p);
}

#[test]
fn partially_replicated_tensors_meet() {
    let p = build("partial", |b| {
        let a = b
            .parameter("a", [8, 8], DType::F32)
            .annotate(s("(data, _)"));
        let c = b
            .parameter("c", [8, 8], DType::F32)
            .annotate(s("(_, model)"));
        vec![&a * &c, a.matmul(&c)]
    });
    check_on_all_meshes(&p);
}

// ---- golden: collectives --------------------------------------------------------------

fn mesh24() -> Mesh {
    Mesh::new([("data", 2), ("model", 4)]).unwrap()
}

fn compile24(p: &Program) -> Executable {
    compile(p, &mesh24()).unwrap()
}

#[test]
fn megatron_forward_has_one_all_reduce_per_block_and_nothing_else() {
    let p = build("megatron2", |b| {
        let y = megatron(b, 8, 16, 32);
        let w3 = b
            .parameter("w3", [16, 32], DType::F32)
            .annotate(s("(_, model)"));
        let w4 = b
            .parameter("w4", [32, 16], DType::F32)
            .annotate(s("(model, _)"));
        vec![y.matmul(&w3).relu().matmul(&w4)]
    });
    let exe = compile24(&p);
    let stats = exe.spmd().collectives();
    assert_eq!(
        (stats.count(CollectiveKind::AllReduce), stats.total()),
        (2, 2),
        "{}",
        exe.report()
    );
    // Each all-reduce is of the [B, D] activation: local [B/2, D] f32.
    for node in exe
        .spmd()
        .program
        .nodes
        .iter()
        .filter(|n| n.op.is_collective())
    {
        assert_eq!(node.ty.shape, vec![4, 16], "{}", exe.report());
    }
}

#[test]
fn contracting_sharded_dot_with_sharded_result_reduce_scatters() {
    let p = build("rs", |b| {
        let x = b
            .parameter("x", [8, 16], DType::F32)
            .annotate(s("(_, model)"));
        let w = b
            .parameter("w", [16, 8], DType::F32)
            .annotate(s("(model, _)"));
        vec![x.matmul(&w).shard(s("(_, model)"))]
    });
    let exe = compile24(&p);
    let stats = exe.spmd().collectives();
    assert_eq!(
        (stats.count(CollectiveKind::ReduceScatter), stats.total()),
        (1, 1),
        "{}",
        exe.report()
    );
}

#[test]
fn data_to_model_on_one_dim_never_gathers_the_whole_dim() {
    let p = build("d2m", |b| {
        let x = b
            .parameter("x", [64, 4], DType::F32)
            .annotate(s("(data, _)"));
        vec![x.shard(s("(model, _)"))]
    });
    let exe = compile24(&p);
    let stats = exe.spmd().collectives();
    assert!(
        stats.count(CollectiveKind::AllToAll) + stats.count(CollectiveKind::CollectivePermute) >= 1,
        "{}",
        exe.report()
    );
    // No all-gather may produce the whole dim (64 rows) on a device.
    for node in exe
        .spmd()
        .program
        .nodes
        .iter()
        .filter(|n| n.op.name() == "all_gather")
    {
        assert!(node.ty.shape[0] < 64, "{}", exe.report());
    }
    // It receives less than a full gather (64x4 minus the 32x4 held).
    assert!(stats.bytes() < 32 * 4 * 4, "{}", exe.report());
}

/// A parameter of `shape` split as `from`, constrained to `to`.
fn resharding(shape: &[usize], from: &str, to: &str) -> Program {
    build(&format!("{from} -> {to}"), |b| {
        let x = b
            .parameter("x", shape.to_vec(), DType::F32)
            .annotate(s(from));
        vec![x.shard(s(to))]
    })
}

/// `(data, _) -> (model, _)` on `[32, 64]`, data=2, model=4: each device keeps the
/// quarter of its rows given by model's minor digit (a local slice), then one
/// collective-permute swaps data and model's major digit: 8x64 f32 received per device
/// (was a permute of 16x64 plus an all-gather).
#[test]
fn data_to_model_is_a_local_slice_and_one_collective_permute() {
    let p = resharding(&[32, 64], "(data, _)", "(model, _)");
    let exe = compile24(&p);
    let stats = exe.spmd().collectives();
    assert_eq!(
        (
            stats.count(CollectiveKind::CollectivePermute),
            stats.total(),
            stats.bytes()
        ),
        (1, 1, 8 * 64 * 4),
        "{}",
        exe.report()
    );
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
    check_on_all_meshes(&p);
}

/// Issue 12: a reshape `[8, 16] -> [2, 4, 16]` with dim 0 split over `model`=4 gives
/// the result `model`'s digits as sub-axes, `(model:(1)2, model:(2)2, _)`: every device
/// keeps its two rows, no collective. The reshape back merges them into `model`.
#[test]
fn reshape_splitting_a_sharded_dim_moves_nothing() {
    let p = build("split_model", |b| {
        let x = b
            .parameter("x", [8, 16], DType::F32)
            .annotate(s("(model, _)"));
        let y = x.reshape([2, 4, 16]);
        let z = (&y * &y).reshape([8, 16]);
        vec![y, z]
    });
    let exe = compile24(&p);
    assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
    let shardings: Vec<String> = (exe.spmd().outputs.iter())
        .map(|(_, sharding)| sharding.to_string())
        .collect();
    assert_eq!(shardings, ["(model:(1)2, model:(2)2, _)", "(model, _)"]);
    check_on_all_meshes(&p);
}

/// A value annotated with sub-axes of `model`, used by a dot whose result is split over
/// `model`'s digits, then resharded to the digits swapped; the input's tiling spelled
/// as `model` moves nothing. The dot gathers only `model`'s minor digit of `x` (not the
/// whole of it); the swap is one all-to-all and one collective-permute.
#[test]
fn sub_axis_shardings_partition_like_their_axis() {
    let p = build("sub_axes", |b| {
        let x = b
            .parameter("x", [8, 16], DType::F32)
            .annotate(s("((model:(1)2, model:(2)2), _)"));
        let w = b
            .parameter("w", [16, 4], DType::F32)
            .annotate(s("(_, model:(2)2)"));
        let y = x.matmul(&w).shard(s("(model:(1)2, model:(2)2)"));
        vec![
            y.shard(s("((model:(2)2, model:(1)2), _)")),
            x.shard(s("(model, _)")),
        ]
    });
    let exe = compile24(&p);
    let stats = exe.spmd().collectives();
    let counts = [
        CollectiveKind::AllGather,
        CollectiveKind::AllToAll,
        CollectiveKind::CollectivePermute,
    ]
    .map(|c| stats.count(c));
    assert_eq!((counts, stats.total()), ([1, 1, 1], 3), "{}", exe.report());
    // The all-gather is over `model:(2)2` only: 4 of x's 8 rows on each device.
    let gathers = (exe.spmd().program.nodes.iter()).filter(|n| n.op.name() == "all_gather");
    for node in gathers {
        assert_eq!(node.ty.shape, [4, 16], "{}", exe.report());
    }
    let inputs = [input(&[8, 16], 0), input(&[16, 4], 1)];
    let want = interpret(&p, &inputs).unwrap();
    let got = exe
        .run(&ThreadMesh::new(mesh24()).unwrap(), &inputs)
        .unwrap();
    assert_close(&want, &got);
}

/// `(data) -> (model)` on `[10]`: blocks of 5 and of 3 nest nowhere, so the value is
/// gathered whole and sliced again: a full rematerialization, warned with the op, the
/// line, both shardings, the bytes, the annotation to add and the reason; `report()`
/// lists it.
#[test]
fn full_rematerialization_is_warned_with_shardings_bytes_and_a_suggestion() {
    let p = resharding(&[10], "(data)", "(model)");
    let exe = compile24(&p);
    let warning = "sharding_constraint: full rematerialization: resharding f32[10] from \
                   (data) to (model) replicates it on every device (20 bytes received per \
                   device); annotate the value `.shard(\"(model)\")` where it is defined, so \
                   it is produced split as used here";
    assert_eq!(exe.spmd().warnings.len(), 1, "{:?}", exe.spmd().warnings);
    assert!(
        exe.spmd().warnings[0].contains(&format!("{warning}; why: operand %0")),
        "{}",
        exe.spmd().warnings[0]
    );
    assert!(exe.spmd().warnings[0].starts_with("gspmd-core/tests/spmd.rs:"));
    assert!(exe.report().contains("warning: "), "{}", exe.report());
    assert!(exe.report().contains(warning), "{}", exe.report());
    check_on_all_meshes(&p);
}

/// Swapping mesh axes between dims: `(data, model) -> (model, data)` on `[64, 128]`,
/// data=2, model=4 (local 32x32 f32): an all-to-all over model's minor half (sub-axis
/// `model:(2)2`) moves it to dim 0, then one collective-permute deals the 16x64 blocks:
/// 6144 bytes per device, XLA's plan (was an all-gather plus an all-to-all, 15360).
#[test]
fn swapping_mesh_axes_between_dims_is_cheap_and_exact() {
    let p = resharding(&[64, 128], "(data, model)", "(model, data)");
    let exe = compile24(&p);
    let stats = exe.spmd().collectives();
    assert_eq!(
        (
            stats.count(CollectiveKind::AllToAll),
            stats.count(CollectiveKind::CollectivePermute),
            stats.bytes()
        ),
        (1, 1, 2048 + 4096),
        "{}",
        exe.report()
    );
    check_on_all_meshes(&p);
}

#[test]
fn per_device_program_size_does_not_depend_on_the_device_count() {
    let p = build("size", |b| {
        let y = megatron(b, 64, 128, 256);
        vec![y.softmax(-1).sum(&[0])]
    });
    let small = compile(&p, &Mesh::new([("data", 2), ("model", 4)]).unwrap()).unwrap();
    let large = compile(&p, &Mesh::new([("data", 32), ("model", 64)]).unwrap()).unwrap();
    assert_eq!(
        small.spmd().program.nodes.len(),
        large.spmd().program.nodes.len()
    );
    let kinds = |e: &Executable| {
        e.spmd()
            .program
            .nodes
            .iter()
            .map(|n| n.op.name())
            .collect::<Vec<_>>()
    };
    assert_eq!(kinds(&small), kinds(&large));
}

#[test]
fn gathering_a_split_dim_for_a_window_is_reported() {
    let p = build("window", |b| {
        let x = b
            .parameter("x", [16, 8], DType::F32)
            .annotate(s("(model, data)"));
        // A window of 15 over 16 rows in blocks of 4: block 0 reads 7 rows right of it,
        // block 3 7 rows left, 14 rows in all where gathering receives 12.
        vec![x.reduce_window(ReduceKind::Max, &[15, 1], &[1, 1], &[(7, 7), (0, 0)])]
    });
    let exe = compile24(&p);
    assert!(
        exe.spmd().warnings.iter().any(|w| {
            w.contains(
                "reduce_window gathers split dims whole (dim 0: a halo exchange would receive more than gathering)",
            ) && w.contains("spmd.rs")
        }),
        "{:?}",
        exe.spmd().warnings
    );
}

// ---- convolution --------------------------------------------------------------------

/// A small conv net on NHWC images: 3x3 SAME, ReLU, a strided 3x3 with dilation, a
/// depthwise 3x3, a reversed 1x1; `x` and the kernels annotated as given.
fn conv_net(b: &Builder, x: &str, k: &str) -> Tensor {
    let x = b.parameter("x", [4, 8, 6, 3], DType::F32).annotate(s(x));
    let k1 = b.parameter("k1", [3, 3, 3, 8], DType::F32).annotate(s(k));
    let k2 = b.parameter("k2", [3, 3, 8, 8], DType::F32).annotate(s(k));
    let k3 = b.parameter("k3", [3, 3, 1, 8], DType::F32);
    let k4 = b.parameter("k4", [1, 1, 8, 4], DType::F32);
    let nhwc = ConvDimensionNumbers::from_labels("NHWC", "HWIO", "NHWC").unwrap();
    let h = x.conv2d(&k1, [1, 1], Padding::Same).relu();
    let h = h.conv_general_dilated(&k2, &[2, 1], Padding::Same, &[], &[1, 2], &nhwc, 1);
    let h = h.conv_general_dilated(&k3, &[1, 1], Padding::Same, &[], &[], &nhwc, 8);
    h.tanh()
        .conv2d(&k4, [1, 1], Padding::Valid)
        .reverse(&[1, 2])
}

#[test]
fn conv_net_and_its_gradient_on_every_mesh() {
    for (x, k) in [
        ("(data, _, _, _)", "(_, _, _, model)"),
        ("(_, model, _, _)", "(_, _, _, _)"),
        ("(data, _, _, model)", "(_, _, model, _)"),
    ] {
        let p = build("conv_net", |b| vec![conv_net(b, x, k)]);
        check_on_all_meshes(&p);
        let loss = build("conv_loss", |b| {
            let y = conv_net(b, x, k);
            vec![y.mul(&y).sum(&[0, 1, 2, 3])]
        });
        check_on_all_meshes(&grad(&loss, 0, &[0, 1, 2, 3, 4]).unwrap());
    }
}

#[test]
fn conv_split_on_batch_and_output_features_needs_no_communication() {
    let p = build("conv", |b| {
        let x = b
            .parameter("x", [8, 16, 16, 4], DType::F32)
            .annotate(s("(data, _, _, _)"));
        let k = b
            .parameter("k", [3, 3, 4, 8], DType::F32)
            .annotate(s("(_, _, _, model)"));
        vec![x.conv2d(&k, [1, 1], Padding::Same)]
    });
    let exe = compile24(&p);
    assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
}

#[test]
fn conv_split_on_input_features_all_reduces_like_a_dot() {
    let p = build("conv", |b| {
        let x = b
            .parameter("x", [8, 16, 16, 4], DType::F32)
            .annotate(s("(data, _, _, model)"));
        let k = b
            .parameter("k", [3, 3, 4, 8], DType::F32)
            .annotate(s("(_, _, model, _)"));
        vec![
            x.conv2d(&k, [1, 1], Padding::Same)
                .shard(s("(data, _, _, _)")),
        ]
    });
    let exe = compile24(&p);
    let stats = exe.spmd().collectives();
    assert_eq!(
        (stats.count(CollectiveKind::AllReduce), stats.total()),
        (1, 1),
        "{}",
        exe.report()
    );
}

/// x: [8, 32, 32, 8] (NHWC) with H split over `h`, convolved 3x3 SAME at stride 1.
fn conv_on_split_rows(b: &Builder) -> Tensor {
    let x = b
        .parameter("x", [8, 32, 32, 8], DType::F32)
        .annotate(s("(_, h, _, _)"));
    let k = b.parameter("k", [3, 3, 8, 8], DType::F32);
    x.conv2d(&k, [1, 1], Padding::Same)
}

#[test]
fn conv_split_on_rows_exchanges_one_row_each_way() {
    let p = build("conv", |b| vec![conv_on_split_rows(b)]);
    let exe = compile(&p, &h4()).unwrap();
    assert_one_row_shifted_each_way(&exe);
    let inputs = [input(&[8, 32, 32, 8], 0), input(&[3, 3, 8, 8], 1)];
    let want = interpret(&p, &inputs).unwrap();
    let got = exe.run(&ThreadMesh::new(h4()).unwrap(), &inputs).unwrap();
    assert!(
        max_diff(&want[0], &got[0]) <= 1e-5,
        "{}",
        max_diff(&want[0], &got[0])
    );
}

#[test]
fn conv_gradient_on_split_rows_exchanges_halos_and_reduce_scatters_the_kernel_gradient() {
    let loss = build("conv_loss", |b| {
        let y = conv_on_split_rows(b);
        vec![y.mul(&y).sum(&[0, 1, 2, 3])]
    });
    let g = grad(&loss, 0, &[0, 1]).unwrap();
    let exe = compile(&g, &h4()).unwrap();
    let stats = exe.spmd().collectives();
    // The forward's and the input gradient's halos: one row of x, one of the
    // cotangent, each way; the kernel gradient's window of x is the forward's (CSE),
    // its partial sums are reduce-scattered to the [3, 3, 8, 8] gradient split 4 ways
    // on its first dim; the loss's partial sum is all-reduced.
    let row = 8 * 32 * 8 * 4;
    let counts = [
        CollectiveKind::CollectiveShift,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
    ]
    .map(|kind| stats.count(kind));
    assert_eq!(
        (counts, stats.total(), stats.bytes()),
        ([4, 1, 1, 0], 6, 4 * row + 2304 + 6),
        "{}",
        exe.report()
    );
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
    let inputs = [input(&[8, 32, 32, 8], 0), input(&[3, 3, 8, 8], 1)];
    let want = interpret(&g, &inputs).unwrap();
    let got = exe.run(&ThreadMesh::new(h4()).unwrap(), &inputs).unwrap();
    assert_close(&want, &got);
}

#[test]
fn strided_conv_gradient_on_split_rows_gathers_nothing() {
    // Stride 2: the input gradient is a convolution with base dilation 2, partitioned
    // as an interior pad (halos) and an undilated convolution (halos).
    let loss = build("strided_conv_loss", |b| {
        let x = b
            .parameter("x", [8, 32, 32, 8], DType::F32)
            .annotate(s("(_, h, _, _)"));
        let k = b.parameter("k", [3, 3, 8, 8], DType::F32);
        let y = x.conv2d(&k, [2, 2], Padding::Same);
        vec![y.mul(&y).sum(&[0, 1, 2, 3])]
    });
    let g = grad(&loss, 0, &[0, 1]).unwrap();
    let exe = compile(&g, &h4()).unwrap();
    let stats = exe.spmd().collectives();
    assert_eq!(
        stats.count(CollectiveKind::AllGather),
        0,
        "{}",
        exe.report()
    );
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
    let inputs = [input(&[8, 32, 32, 8], 0), input(&[3, 3, 8, 8], 1)];
    let want = interpret(&g, &inputs).unwrap();
    let got = exe.run(&ThreadMesh::new(h4()).unwrap(), &inputs).unwrap();
    assert_close(&want, &got);
    println!(
        "strided conv fwd+bwd on h=4: {} collectives, {} bytes per device",
        stats.total(),
        stats.bytes()
    );
}

#[test]
fn pooling_on_an_image_split_by_batch_and_height() {
    let p = build("pool", |b| {
        let x = b
            .parameter("x", [4, 10, 7, 3], DType::F32)
            .annotate(s("(data, model, _, _)"));
        let pooled = x.max_pool(&[1, 2, 2, 1], &[1, 2, 2, 1], Padding::Same);
        let smooth = pooled.avg_pool(&[1, 3, 3, 1], &[1, 1, 1, 1], Padding::Same, false);
        vec![smooth.upsample_nearest(&[1, 2, 2, 1]).relu()]
    });
    check_on_all_meshes(&p);
}

#[test]
fn pooling_along_a_split_dim_exchanges_halos_only() {
    // [8, 32, 32, 8] with H split 4 ways (8 rows per device).
    let pooled = |window: [usize; 4], strides: [usize; 4]| {
        build("pool", |b| {
            let x = b
                .parameter("x", [8, 32, 32, 8], DType::F32)
                .annotate(s("(_, h, _, _)"));
            vec![x.max_pool(&window, &strides, Padding::Same)]
        })
    };
    let row = 8 * 32 * 8 * 4;
    // 2x2 windows at stride 2 never cross a block boundary: no communication.
    // 3x3 SAME windows at stride 1 need one row from each neighbour.
    for (window, strides, shifts) in [
        ([1, 2, 2, 1], [1, 2, 2, 1], 0),
        ([1, 3, 3, 1], [1, 1, 1, 1], 2),
    ] {
        let p = pooled(window, strides);
        let exe = compile(&p, &h4()).unwrap();
        let stats = exe.spmd().collectives();
        assert_eq!(
            (
                stats.count(CollectiveKind::CollectiveShift),
                stats.total(),
                stats.bytes()
            ),
            (shifts, shifts, shifts * row),
            "{}",
            exe.report()
        );
        assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
        let inputs = [input(&[8, 32, 32, 8], 0)];
        let want = interpret(&p, &inputs).unwrap();
        let got = exe.run(&ThreadMesh::new(h4()).unwrap(), &inputs).unwrap();
        assert_eq!(want, got);
    }
}

#[test]
fn gathering_a_split_dim_is_reported_at_the_user_line() {
    let b = Builder::new("slice");
    let x = b
        .parameter("x", [8, 16, 16, 4], DType::F32)
        .annotate(s("(data, model, _, _)"));
    // A window of 15 over 16 rows in blocks of 4 reaches 7 rows past block 0 and 7 past
    // block 3: more than gathering the dim receives, so it is gathered.
    let (window, padding) = ([1, 15, 1, 1], [(0, 0), (7, 7), (0, 0), (0, 0)]);
    let y = x.reduce_window(ReduceKind::Max, &window, &[1; 4], &padding);
    let line = line!() - 1;
    let exe = compile24(&b.finish(&[&y]).unwrap());
    let at = format!("spmd.rs:{line}");
    assert!(
        exe.spmd()
            .warnings
            .iter()
            .any(|w| w.contains(&at)
                && w.contains("a halo exchange would receive more than gathering")),
        "{:?}",
        exe.spmd().warnings
    );
}

#[test]
fn compare_with_reference_reports_the_difference() {
    let p = build("megatron_cmp", |b| vec![megatron(b, 8, 16, 32)]);
    let exe = compile24(&p);
    let threads = ThreadMesh::new(mesh24()).unwrap();
    let inputs: Vec<Literal> = p
        .params
        .iter()
        .enumerate()
        .map(|(i, &v)| input(&p.ty(v).shape, i))
        .collect();
    let cmp = exe.compare_with_reference(&threads, &inputs).unwrap();
    assert_eq!(cmp.len(), 1);
    assert!(cmp[0].max_abs > 0.1 && cmp[0].within(1e-4), "{cmp:?}");
    assert!(
        !gspmd_core::Comparison {
            max_abs: 1.0,
            max_diff: 0.5
        }
        .within(1e-4)
    );
}

/// Pending sums the user asks for: kept from a split contraction, made from operands
/// that are not split (a free slice of the contracting dim), and made after a value was
/// already reduced (all but one copy zeroed); each is then reduced by the consumer.
#[test]
fn unreduced_annotations_are_exact() {
    let p = build("unreduced", |b| {
        let x = b
            .parameter("x", [8, 4], DType::F32)
            .annotate(s("(_, model)"));
        let w = b
            .parameter("w", [4, 6], DType::F32)
            .annotate(s("(model, _)"));
        let kept = x.matmul(&w).shard(s("(_, _) unreduced={model}"));
        let xr = b.parameter("xr", [8, 4], DType::F32).annotate(s("(_, _)"));
        let wr = b.parameter("wr", [4, 6], DType::F32).annotate(s("(_, _)"));
        let made = xr.matmul(&wr).shard(s("(_, _) unreduced={data}"));
        let after = x.matmul(&w).exp().shard(s("(_, _) unreduced={model}"));
        vec![
            (&kept + &made).shard(s("(_, _)")),
            after.shard(s("(data, _)")),
        ]
    });
    check_on_all_meshes(&p);
    let exe = compile24(&p);
    // `kept` stays partial until the add's consumer reduces it: one all-reduce over
    // model (the two pending sums of `kept + made` are reduced together or apart).
    assert!(
        exe.spmd().collectives().count(CollectiveKind::AllReduce) >= 1,
        "{}",
        exe.report()
    );
}

/// No math op is linear: asked for pending sums (a result kept unreduced), each first
/// reduces its split-contraction operand, since the sign, floor or remainder of each
/// device's summand is not that of the sum. The operands are rounded to integers
/// first, so the contraction is exact in any order and the ops with jumps see the same
/// values on the mesh as in the reference.
#[test]
fn math_ops_reduce_pending_sums_first() {
    let p = build("math", |b| {
        let x = b
            .parameter("x", [8, 4], DType::F32)
            .annotate(s("(_, model)"));
        let w = b
            .parameter("w", [4, 6], DType::F32)
            .annotate(s("(model, _)"));
        let (x, w) = ((&x * 4.0).round(), (&w * 4.0).round());
        // Each op's own result annotated with pending sums: its handler's target.
        let partial = |t: Tensor| t.annotate(s("(_, _) unreduced={model}"));
        let y = partial(x.matmul(&w));
        let yi = y.convert(DType::I32);
        let results = [
            y.sign(),
            y.floor(),
            y.ceil(),
            (&y * 0.25).round(),
            (&y * 0.1).sin(),
            (&y * 0.1).cos(),
            (&y * 0.1).erf(),
            &y % 3.0,
            y.remainder(&y.scalar_like(-3.0)),
            (&y / &y).is_finite().select(&y, &y.abs()),
            // i32: y / sign(y) is |y|, and -1 where y = 0 (XLA's division by zero).
            (&yi / &yi.sign() + &yi % &yi.sign()).convert(DType::F32),
        ];
        let sum = results
            .into_iter()
            .map(partial)
            .reduce(|a, b| a + b)
            .unwrap();
        vec![sum.shard(s("(data, _)"))]
    });
    check_on_all_meshes(&p);
}

/// An output the user keeps unreduced comes back as a global array holding the sum of
/// the partial values; the dot's partial sums flow into the constraint with no
/// collective at all.
#[test]
fn an_unreduced_output_assembles_to_the_sum() {
    let p = build("partial_out", |b| {
        let x = b
            .parameter("x", [6, 8], DType::F32)
            .annotate(s("(data, model)"));
        let w = b
            .parameter("w", [8, 5], DType::F32)
            .annotate(s("(model, _)"));
        vec![x.matmul(&w).shard(s("(data, _) unreduced={model}"))]
    });
    check_on_all_meshes(&p);
    let exe = compile24(&p);
    assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
}

// ---- halo exchange ----------------------------------------------------------------------

/// A 3x3 SAME convolution of `x` (NHWC, one weight per tap, no channel mixing) written
/// as one pad by 1 on H and W and nine shifted slices, summed.
fn same_conv_as_pad_and_slices(x: &Tensor) -> Tensor {
    let shape = x.shape().to_vec();
    let zero = x.scalar_like(0.0);
    let padded = x.pad(&zero, &[0, 1, 1, 0], &[0, 1, 1, 0], &[0; 4]);
    let mut sum: Option<Tensor> = None;
    for di in 0..3 {
        for dj in 0..3 {
            let start = [0, di, dj, 0];
            let limit = [shape[0], di + shape[1], dj + shape[2], shape[3]];
            let tap = &padded.slice(&start, &limit, &[1; 4]) * (1 + 3 * di + dj) as f32;
            sum = Some(match sum {
                Some(s) => s + tap,
                None => tap,
            });
        }
    }
    sum.unwrap()
}

#[test]
fn slices_pads_rolls_and_concatenates_on_split_dims_match_the_reference() {
    for annotation in ["(data, model)", "(model, data)", "((data, model), _)"] {
        let p = build("windowed", |b| {
            let x = b
                .parameter("x", [10, 7], DType::F32)
                .annotate(s(annotation));
            let v = b.scalar(0.5);
            vec![
                x.slice_axis(0, 1, 9),
                x.slice_axis(1, 3, 7),
                x.slice(&[2, 1], &[10, 6], &[1, 1]),
                x.pad(&v, &[2, -1], &[-1, 3], &[0, 0]),
                x.pad(&v, &[0, 4], &[5, 0], &[0, 0]),
                x.pad(&v, &[-3, 0], &[-2, 0], &[0, 0]),
                x.pad(&v, &[1, 1], &[1, 1], &[0, 0])
                    .slice(&[2, 0], &[11, 8], &[1, 1]),
                x.roll(1, 0),
                x.roll(-3, 1),
                x.roll(7, 0),
                b.concatenate(&[&x, &x.slice_axis(0, 0, 3)], 0),
            ]
        });
        check_on_all_meshes(&p);
    }
    let conv = build("conv", |b| {
        let x = b
            .parameter("x", [2, 10, 6, 3], DType::F32)
            .annotate(s("(_, data, model, _)"));
        vec![same_conv_as_pad_and_slices(&x)]
    });
    check_on_all_meshes(&conv);
}

fn h4() -> Mesh {
    Mesh::new([("h", 4)]).unwrap()
}

#[test]
fn same_conv_as_pad_and_slices_exchanges_one_row_each_way() {
    let p = build("conv", |b| {
        let x = b
            .parameter("x", [8, 32, 32, 8], DType::F32)
            .annotate(s("(_, h, _, _)"));
        vec![same_conv_as_pad_and_slices(&x)]
    });
    let exe = compile(&p, &h4()).unwrap();
    assert_one_row_shifted_each_way(&exe);
}

/// `exe`'s only collectives are two shifts of one row of W x C f32 ([8, 1, 32, 8] of an
/// [8, 32, 32, 8] image with H split over `h`), and it has no warning.
fn assert_one_row_shifted_each_way(exe: &Executable) {
    let stats = exe.spmd().collectives();
    let row = 8 * 32 * 8 * 4;
    assert_eq!(
        (
            stats.count(CollectiveKind::CollectiveShift),
            stats.total(),
            stats.bytes()
        ),
        (2, 2, 2 * row),
        "{}",
        exe.report()
    );
    let shifts = exe
        .spmd()
        .program
        .nodes
        .iter()
        .filter(|n| n.op.is_collective());
    for node in shifts {
        assert_eq!(node.ty.shape, vec![8, 1, 32, 8], "{}", exe.report());
    }
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
}

#[test]
fn interior_pad_along_a_split_dim_exchanges_halos_only() {
    // [16, 8] with rows split 4 ways (4 per device); the output has 33 rows, 9 per
    // device: block i spreads input rows 4i - 1 .. 4i + 6 (one row from the left
    // neighbour, two from the right) and cuts 9 rows from i + 1.
    let p = build("interior_pad", |b| {
        let x = b.parameter("x", [16, 8], DType::F32).annotate(s("(h, _)"));
        let v = x.scalar_like(0.5);
        vec![x.pad(&v, &[1, 0], &[1, 0], &[1, 0])]
    });
    let exe = compile(&p, &h4()).unwrap();
    let stats = exe.spmd().collectives();
    let row = 8 * 4;
    assert_eq!(
        (
            stats.count(CollectiveKind::CollectiveShift),
            stats.count(CollectiveKind::AllGather),
            stats.total(),
            stats.bytes()
        ),
        (2, 0, 2, 3 * row),
        "{}",
        exe.report()
    );
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
    let inputs = [input(&[16, 8], 0)];
    let want = interpret(&p, &inputs).unwrap();
    let got = exe.run(&ThreadMesh::new(h4()).unwrap(), &inputs).unwrap();
    assert_eq!(want, got);
}

#[test]
fn roll_by_one_along_a_split_dim_is_one_collective_shift() {
    let p = build("roll", |b| {
        let x = b.parameter("x", [32, 8], DType::F32).annotate(s("(h, _)"));
        vec![x.roll(1, 0)]
    });
    let exe = compile(&p, &h4()).unwrap();
    let stats = exe.spmd().collectives();
    assert_eq!(
        (
            stats.count(CollectiveKind::CollectiveShift),
            stats.total(),
            stats.bytes()
        ),
        (1, 1, 8 * 4),
        "{}",
        exe.report()
    );
    let inputs = [input(&[32, 8], 0)];
    let want = interpret(&p, &inputs).unwrap();
    let got = exe.run(&ThreadMesh::new(h4()).unwrap(), &inputs).unwrap();
    assert_eq!(want, got);
}

#[test]
fn strided_slice_of_a_split_dim_needs_no_collective() {
    let p = build("strided", |b| {
        let x = b.parameter("x", [32, 8], DType::F32).annotate(s("(h, _)"));
        // x[::2]: output block i (4 rows) reads rows 8i, 8i + 2, .., 8i + 6 of block i.
        vec![x.slice(&[0, 0], &[32, 8], &[2, 1]).annotate(s("(h, _)"))]
    });
    let exe = compile(&p, &h4()).unwrap();
    assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
    let inputs = [input(&[32, 8], 0)];
    let want = interpret(&p, &inputs).unwrap();
    let got = exe.run(&ThreadMesh::new(h4()).unwrap(), &inputs).unwrap();
    assert_eq!(want, got);
}

#[test]
fn reverse_of_a_split_dim_moves_nothing() {
    let p = build("reverse", |b| {
        let x = b.parameter("x", [32, 8], DType::F32).annotate(s("(h, _)"));
        vec![x.reverse(&[0]).annotate(s("(h, _)"))]
    });
    let exe = compile(&p, &h4()).unwrap();
    // Device i reverses its block in place: it holds block 3 - i of the result, whose
    // dim 0 is in reversed device order (tests/device_order.rs has the rest).
    assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
    assert_eq!(exe.spmd().outputs[0].1, s("(-h, _)"));
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
    let inputs = [input(&[32, 8], 0)];
    let want = interpret(&p, &inputs).unwrap();
    let got = exe.run(&ThreadMesh::new(h4()).unwrap(), &inputs).unwrap();
    assert_eq!(want, got);
}
