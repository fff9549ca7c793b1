//! The convolution kernel (im2col + the `dot_general` matmul) next to the matmul kernel
//! on a product of the same FLOPs: a 3x3 SAME convolution of `[8, 32, 32, 32]` NHWC by
//! `[3, 3, 32, 32]` HWIO is, after im2col, a `[8192, 288] x [288, 32]` product. Both run
//! as one-op programs through the reference interpreter; throughput is in FLOP/s
//! (criterion's `elem/s`).
//!
//! Group `conv_passes`: the three convolutions of a training step — forward, input
//! gradient and kernel gradient, as `grad` writes them — one kernel call each
//! (`runtime::kernels::eval`), for the U-Net's layers (batch 4, 32x32, SAME 3x3 and its
//! 1x1 output conv), a ResNet-style 3x3 on `[8, 32, 32, 64]` and a depthwise 3x3 on the
//! same input. Throughput is the forward's FLOPs.
//!
//! `cargo bench -p gspmd-core --bench conv`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gspmd_core::autodiff::grad;
use gspmd_core::ir::{Builder, ConvDimensionNumbers, DType, Literal, Op, Padding, Program, Tensor};
use gspmd_core::runtime::{interpret, kernels, uniform_f32};
use gspmd_core::types::TensorType;
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

fn one_op(
    name: &str,
    shapes: [&[usize]; 2],
    op: impl FnOnce(&Tensor, &Tensor) -> Tensor,
) -> Program {
    let b = Builder::new(name);
    let x = b.parameter("x", shapes[0].to_vec(), DType::F32);
    let y = b.parameter("y", shapes[1].to_vec(), DType::F32);
    let out = op(&x, &y);
    b.finish(&[&out]).expect("a valid program")
}

fn conv_vs_matmul(c: &mut Criterion) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0);
    let (n, hw, cin, cout, taps) = (8, 32, 32, 32, 9);
    let flops = 2 * n * hw * hw * cout * cin * taps;
    let mut group = c.benchmark_group("conv3x3_vs_matmul");
    group.throughput(Throughput::Elements(flops as u64));
    let cases: [(&str, [&[usize]; 2], Program); 3] = [
        (
            "conv3x3_same",
            [&[n, hw, hw, cin], &[3, 3, cin, cout]],
            one_op("conv", [&[n, hw, hw, cin], &[3, 3, cin, cout]], |x, k| {
                x.conv2d(k, [1, 1], Padding::Same)
            }),
        ),
        (
            "conv3x3_same_lhs_dilated_rhs_dilated",
            [&[n, hw, hw, cin], &[3, 3, cin, cout]],
            one_op("conv", [&[n, hw, hw, cin], &[3, 3, cin, cout]], |x, k| {
                let dn = gspmd_core::ir::ConvDimensionNumbers::from_labels("NHWC", "HWIO", "NHWC")
                    .expect("labels");
                // lhs dilation 2 and stride 2 visit the same number of positions.
                x.conv_general_dilated(k, &[2, 2], Padding::Same, &[2, 2], &[2, 2], &dn, 1)
            }),
        ),
        (
            "matmul_same_flops",
            [&[n * hw * hw, cin * taps], &[cin * taps, cout]],
            one_op(
                "matmul",
                [&[n * hw * hw, cin * taps], &[cin * taps, cout]],
                |x, w| x.matmul(w),
            ),
        ),
    ];
    for (name, shapes, program) in &cases {
        let inputs: Vec<Literal> = shapes
            .iter()
            .map(|s| uniform_f32(&mut rng, s, -1.0, 1.0))
            .collect();
        group.bench_function(*name, |b| {
            b.iter(|| black_box(interpret(program, &inputs).expect("runs")));
        });
    }
    group.finish();
}

/// One convolution layer of the `conv_passes` group: NHWC input, HWIO kernel, SAME
/// padding, stride 1, `groups` feature groups.
struct Layer {
    name: &'static str,
    input: [usize; 4],
    kernel: [usize; 4],
    groups: usize,
}

/// The U-Net's layers (`gspmd::models::unet`, batch 4 of 32x32), a ResNet-style 3x3
/// and a depthwise 3x3.
const LAYERS: [Layer; 11] = {
    const fn layer(name: &'static str, input: [usize; 4], kernel: [usize; 4]) -> Layer {
        Layer {
            name,
            input,
            kernel,
            groups: 1,
        }
    }
    [
        layer("unet_down1a", [4, 32, 32, 1], [3, 3, 1, 8]),
        layer("unet_down1b", [4, 32, 32, 8], [3, 3, 8, 8]),
        layer("unet_down2", [4, 16, 16, 8], [3, 3, 8, 16]),
        layer("unet_bottleneck", [4, 8, 8, 16], [3, 3, 16, 16]),
        layer("unet_up2", [4, 16, 16, 16], [3, 3, 16, 16]),
        layer("unet_merge2", [4, 16, 16, 32], [3, 3, 32, 16]),
        layer("unet_up1", [4, 32, 32, 16], [3, 3, 16, 8]),
        layer("unet_merge1", [4, 32, 32, 16], [3, 3, 16, 8]),
        layer("unet_out1x1", [4, 32, 32, 8], [1, 1, 8, 1]),
        layer("resnet3x3_8x32x32x64", [8, 32, 32, 64], [3, 3, 64, 64]),
        Layer {
            name: "depthwise3x3_8x32x32x64",
            input: [8, 32, 32, 64],
            kernel: [3, 3, 1, 64],
            groups: 64,
        },
    ]
};

/// The forward, input-gradient and kernel-gradient convolutions of `layer`, as
/// `grad` of `mean(conv(x, k) * dy)` writes them: each op with its operand and
/// result types.
fn passes(layer: &Layer) -> Vec<(&'static str, Op, Vec<TensorType>, TensorType)> {
    let [n, h, w, _] = layer.input;
    let out = [n, h, w, layer.kernel[3]];
    let b = Builder::new(layer.name);
    let x = b.parameter("x", layer.input.to_vec(), DType::F32);
    let k = b.parameter("k", layer.kernel.to_vec(), DType::F32);
    let dy = b.parameter("dy", out.to_vec(), DType::F32);
    let dn = ConvDimensionNumbers::from_labels("NHWC", "HWIO", "NHWC").expect("labels");
    let y = x.conv_general_dilated(&k, &[1, 1], Padding::Same, &[], &[], &dn, layer.groups);
    let loss = (&y * &dy).mean(&[0, 1, 2, 3]);
    let forward = b.finish(&[&loss]).expect("a valid program");
    let backward = grad(&forward, 0, &[0, 1]).expect("differentiable");
    let (x, k) = (backward.params[0], backward.params[1]);
    let k_ty = backward.ty(k);
    let passes: Vec<_> = (backward.nodes.iter())
        .filter(|node| matches!(node.op, Op::Convolution(_)))
        .map(|node| {
            let pass = if node.operands == [x, k] {
                "forward"
            } else if node.ty == *k_ty {
                "kernel_grad"
            } else {
                "input_grad"
            };
            let operands = node.operands.iter().map(|&o| backward.ty(o).clone());
            (pass, node.op.clone(), operands.collect(), node.ty.clone())
        })
        .collect();
    assert_eq!(passes.len(), 3, "{}: one convolution per pass", layer.name);
    passes
}

fn conv_passes(c: &mut Criterion) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0);
    let mut group = c.benchmark_group("conv_passes");
    group.warm_up_time(std::time::Duration::from_secs(1));
    group.measurement_time(std::time::Duration::from_secs(2));
    for layer in &LAYERS {
        let [n, h, w, _] = layer.input;
        let [kh, kw, ci, co] = layer.kernel;
        group.throughput(Throughput::Elements(
            (2 * n * h * w * kh * kw * ci * co) as u64,
        ));
        for (pass, op, operands, result) in passes(layer) {
            let inputs: Vec<Literal> = (operands.iter())
                .map(|t| uniform_f32(&mut rng, &t.shape, -1.0, 1.0))
                .collect();
            let refs: Vec<&Literal> = inputs.iter().collect();
            group.bench_function(format!("{}/{pass}", layer.name), |b| {
                b.iter(|| black_box(kernels::eval(&op, &refs, &result).expect("runs")));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, conv_vs_matmul, conv_passes);
criterion_main!(benches);
