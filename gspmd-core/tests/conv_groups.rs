//! Goldens of grouped convolutions (feature groups and batch groups) split on their
//! groups and of base-dilated `reduce_window`, each mirroring a case of
//! XLA's `xla/service/spmd/spmd_partitioner_test.cc` (shapes scaled down to keep the
//! debug-build run short; the bytes per device are compared at gspmd's shapes). The
//! XLA test names are recalled, not re-read: the file is too large for this change's
//! search tools; what each asserts (no collective when the groups are split alike) is
//! XLA's documented behaviour for grouped convolutions. Every program also runs on the
//! thread mesh against the reference interpreter.

use gspmd_core::autodiff::grad;
use gspmd_core::ir::{
    Builder, CollectiveKind, ConvDimensionNumbers, DType, Literal, Padding, Program, ReduceKind,
    Tensor, ValueId, WindowDim,
};
use gspmd_core::runtime::ThreadMesh;
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::{Executable, compile};
use ndarray::{ArrayD, IxDyn};

fn sh(text: &str) -> Sharding {
    text.parse().unwrap()
}

/// The 2x4 mesh (`data` 2, `model` 4).
fn mesh24() -> Mesh {
    Mesh::new([("data", 2), ("model", 4)]).unwrap()
}

fn param(b: &Builder, name: &str, shape: &[usize], sharding: &str) -> Tensor {
    b.parameter(name, shape.to_vec(), DType::F32)
        .annotate(sh(sharding))
}

#[track_caller]
fn build(name: &str, f: impl FnOnce(&Builder) -> Vec<Tensor>) -> Program {
    let b = Builder::new(name);
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    b.finish(&refs).unwrap()
}

fn inputs(program: &Program) -> Vec<Literal> {
    (program.params.iter().enumerate())
        .map(|(k, &p)| {
            let shape = &program.ty(p).shape;
            let n: usize = shape.iter().product();
            let v = (0..n).map(|i| (((i * 7 + k * 13) % 29) as f32 / 9.0 - 1.5) * 0.5);
            Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v.collect()).unwrap())
        })
        .collect()
}

/// Compiles `program` for `mesh`, runs it on the thread mesh and checks every output
/// against the reference interpreter.
#[track_caller]
fn compile_and_check(program: &Program, mesh: &Mesh) -> Executable {
    let exe = compile(program, mesh).unwrap();
    let threads = ThreadMesh::new(mesh.clone()).unwrap();
    let comparisons = exe
        .compare_with_reference(&threads, &inputs(program))
        .unwrap();
    for (k, c) in comparisons.iter().enumerate() {
        assert!(c.within(1e-4), "output {k}: {c}\n{}", exe.report());
    }
    exe
}

fn nhwc() -> ConvDimensionNumbers {
    ConvDimensionNumbers::from_labels("NHWC", "HWIO", "NHWC").unwrap()
}

/// [`compile_and_check`] on the 2x4 mesh, asserting no collective (0 bytes), no warning
/// and `local` (the local convolution's group count or type, as printed) in the
/// per-device program.
#[track_caller]
fn assert_split_free(program: &Program, local: &str) -> Executable {
    let exe = compile_and_check(program, &mesh24());
    assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
    let text = exe.spmd().program.to_string();
    assert!(text.contains(local), "{local} not in\n{}", exe.report());
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
    exe
}

/// The propagated sharding of `value`, as text.
fn propagated(exe: &Executable, value: ValueId) -> String {
    let node = exe.propagated().node(value);
    node.sharding.as_ref().unwrap().to_string()
}

/// [`compile_and_check`] on the 2x4 mesh, asserting a warning that holds every needle.
#[track_caller]
fn assert_warns(program: &Program, needles: &[&str]) {
    let exe = compile_and_check(program, &mesh24());
    let warnings = &exe.spmd().warnings;
    assert!(
        (warnings.iter()).any(|w| needles.iter().all(|n| w.contains(n))),
        "{needles:?} not in {warnings:?}"
    );
}

/// XLA `ConvWithFeatureGroupCount`: a depthwise convolution (`b01f_01io->b01f`, 1024
/// groups, window 5x1 padded 2_2) with the input's features, the kernel's output
/// features and the output's features split alike; XLA convolves the local halves with
/// no collective (0 bytes per device). gspmd: the group factor carries the split, each
/// device convolves its 8 groups of 32: 0 bytes, no warning.
#[test]
fn depthwise_split_on_groups_needs_no_communication() {
    let p = build("depthwise", |b| {
        let x = param(b, "x", &[4, 16, 1, 32], "(_, _, _, model)");
        let k = param(b, "k", &[5, 1, 1, 32], "(_, _, _, model)");
        let pad = Padding::Explicit(vec![(2, 2), (0, 0)]);
        let y = x.conv_general_dilated(&k, &[1, 1], pad, &[], &[], &nhwc(), 32);
        vec![y.annotate(sh("(_, _, _, model)"))]
    });
    assert_split_free(&p, "feature_group_count=8");
}

/// XLA `ConvWithFeatureGroupCountAlignOuputWithRHS` in spirit: only the input is split
/// on its features; propagation carries the split through the group factor to the
/// kernel's output features and the output, so nothing moves (XLA: 0 bytes once the
/// kernel is aligned; gspmd aligns it at propagation). A grouped (not depthwise)
/// convolution: 8 groups of 2 input and 3 output features, split over `model` (4): 2
/// groups per device.
#[test]
fn grouped_conv_split_propagates_to_kernel_and_output() {
    let p = build("grouped", |b| {
        let x = param(b, "x", &[4, 6, 6, 16], "(data, _, _, model)");
        let k = b.parameter("k", vec![3, 3, 2, 24], DType::F32);
        vec![x.conv_general_dilated(&k, &[1, 1], Padding::Same, &[], &[], &nhwc(), 8)]
    });
    let exe = assert_split_free(&p, "feature_group_count=2 : f32[2,6,6,6]");
    assert_eq!(propagated(&exe, p.params[1]), "(_, _, _, model)");
    assert_eq!(propagated(&exe, p.outputs[0]), "(data, _, _, model)");
}

/// A split that does not cut whole groups (2 groups over 4 shards) computes the
/// features whole and says why; the numbers stay right.
#[test]
fn split_finer_than_the_groups_gathers_and_warns() {
    let p = build("coarse_groups", |b| {
        let x = param(b, "x", &[2, 6, 6, 8], "(_, _, _, model)");
        let k = param(b, "k", &[3, 3, 4, 8], "(_, _, _, _)");
        let y = x.conv_general_dilated(&k, &[1, 1], Padding::Same, &[], &[], &nhwc(), 2);
        vec![y.annotate(sh("(_, _, _, model)"))]
    });
    assert_warns(&p, &["features in 2 groups gathered whole", "in 4, which"]);
}

/// The gradients of a depthwise convolution with the batch over `data` and the groups
/// over `model` (XLA `ConvWithFeatureGroupCountBackProp` and `ConvWithBatchGroupCount`
/// are its input and kernel cotangents): the input's cotangent is a depthwise
/// convolution split on its groups (no collective), the kernel's a convolution in 8
/// batch groups split on them, whose partial sums over the batch are all-reduced over
/// `data` (72 bytes: the local f32[3,3,1,2] kernel gradient), as data parallelism
/// needs; with the loss's scalar all-reduce (6 bytes), 2 collectives, 78 bytes per
/// device. (Before batch groups, the kernel gradient regrouped the input by reshapes
/// that gathered it: 3 all-gathers, 4,608 bytes more.)
#[test]
fn depthwise_gradients_split_on_groups_reduce_only_over_the_batch() {
    let loss = build("depthwise_loss", |b| {
        let x = param(b, "x", &[2, 8, 8, 8], "(data, _, _, model)");
        let k = param(b, "k", &[3, 3, 1, 8], "(_, _, _, model)");
        let y = x.conv_general_dilated(&k, &[1, 1], Padding::Same, &[], &[], &nhwc(), 8);
        vec![y.mul(&y).sum(&[0, 1, 2, 3])]
    });
    let g = grad(&loss, 0, &[0, 1]).unwrap();
    let exe = compile_and_check(&g, &mesh24());
    let stats = exe.spmd().collectives();
    assert_eq!(
        (
            stats.count(CollectiveKind::AllReduce),
            stats.total(),
            stats.bytes()
        ),
        (2, 2, 78),
        "{}",
        exe.report()
    );
}

/// XLA `ConvWithBatchGroupCount`: `f01b_i01o->01bf` with 1024 batch groups (a depthwise
/// convolution's kernel gradient), the input's batch, the kernel's output features and
/// the output's features split alike; XLA convolves the local halves with no collective
/// (0 bytes). gspmd: 32 batch groups over `model` (4), 8 per device, 0 bytes.
#[test]
fn batch_groups_split_on_groups_need_no_communication() {
    let p = build("batch_groups", |b| {
        let x = param(b, "x", &[4, 12, 1, 32], "(_, _, _, model)");
        let k = param(b, "k", &[4, 12, 1, 32], "(_, _, _, model)");
        let dn = ConvDimensionNumbers::from_labels("CHWN", "IHWO", "HWNC").unwrap();
        let pad = Padding::Explicit(vec![(2, 2), (0, 0)]);
        let y = x.conv_general_dilated_grouped(&k, &[1, 1], pad, &[], &[], &dn, 1, 32);
        vec![y.annotate(sh("(_, _, _, model)"))]
    });
    assert_split_free(&p, "batch_group_count=8");
}

/// XLA `ConvWithBatchGroupCountRHSAlignWithLHS` in spirit: only the input is split on
/// its batch (by whole groups); propagation gives the kernel's output features and the
/// output's features the same axes through the batch-group factor: 0 bytes, as XLA
/// once it aligns the kernel. 4 batch groups of 2 over `model`; 3 output features
/// per group.
#[test]
fn batch_group_split_propagates_to_kernel_and_output() {
    let p = build("batch_groups", |b| {
        let x = param(b, "x", &[8, 6, 6, 2], "(model, _, _, _)");
        let k = b.parameter("k", vec![3, 3, 2, 12], DType::F32);
        let y = x.conv_general_dilated_grouped(&k, &[1, 1], Padding::Same, &[], &[], &nhwc(), 1, 4);
        vec![y]
    });
    let exe = assert_split_free(&p, "dim_labels=b01f_01io->b01f : f32[2,6,6,3]");
    assert_eq!(propagated(&exe, p.params[1]), "(_, _, _, model)");
    assert_eq!(propagated(&exe, p.outputs[0]), "(_, _, _, model)");
}

/// Batch groups with the output features split finer than the groups (2 groups over
/// 4 shards): computed whole with a warning saying why; the numbers stay right.
#[test]
fn batch_groups_split_finer_than_the_groups_gather_and_warn() {
    let p = build("coarse_batch_groups", |b| {
        let x = param(b, "x", &[4, 6, 6, 2], "(_, _, _, _)");
        let k = param(b, "k", &[3, 3, 2, 8], "(_, _, _, model)");
        let y = x.conv_general_dilated_grouped(&k, &[1, 1], Padding::Same, &[], &[], &nhwc(), 1, 2);
        vec![y.annotate(sh("(_, _, _, model)"))]
    });
    assert_warns(&p, &["batch in 2 groups gathered whole", "in 4, which"]);
}

/// A batch-grouped convolution and its gradients (a feature-grouped convolution for the
/// kernel's, a feature-grouped one regrouped into the batch for the input's) on the
/// thread mesh, split on batch groups and spatially.
#[test]
fn batch_group_gradients_are_right() {
    let loss = build("batch_groups_loss", |b| {
        let x = param(b, "x", &[8, 6, 6, 2], "(model, data, _, _)");
        let k = param(b, "k", &[3, 3, 2, 12], "(_, _, _, model)");
        let y = x.conv_general_dilated_grouped(&k, &[1, 1], Padding::Same, &[], &[], &nhwc(), 1, 4);
        vec![y.mul(&y).sum(&[0, 1, 2, 3])]
    });
    compile_and_check(&grad(&loss, 0, &[0, 1]).unwrap(), &mesh24());
}

/// `reduce_window` with base dilation 2 (XLA's `base_dilations`: the operand spread with
/// the identity between its elements, what the gradient of a strided pooling reads)
/// split along the dilated dim: 16 rows over `model` (4), windows of 3 every 2 padded
/// 1_1, the batch over `data`. Output row `j` reads dilated positions `2j - 1 .. 2j + 1`,
/// which hold only operand row `j`: every output block reads exactly its own input
/// block (`halo::sliding_window`'s undilated window). XLA (JAX 0.12,
/// `lax.reduce_window(..., base_dilation=(1, 2, 1))` on the same shardings): no
/// collective. gspmd: none either; it all-gathered the dim (384 bytes per device)
/// before.
#[test]
fn base_dilated_reduce_window_split_along_the_dilated_dim() {
    let p = build("base_dilated", |b| {
        let x = param(b, "x", &[2, 16, 8], "(data, model, _)");
        let one = WindowDim::new(1, 1, (0, 0));
        let rows = WindowDim::new(3, 2, (1, 1)).with_base_dilation(2);
        let y = x.reduce_window_with(ReduceKind::Max, &[one, rows, one]);
        vec![y.annotate(sh("(data, model, _)"))]
    });
    let exe = compile_and_check(&p, &mesh24());
    assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
}
