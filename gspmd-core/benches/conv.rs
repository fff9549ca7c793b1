//! The convolution kernel (im2col + the `dot_general` matmul) next to the matmul kernel
//! on a product of the same FLOPs: a 3x3 SAME convolution of `[8, 32, 32, 32]` NHWC by
//! `[3, 3, 32, 32]` HWIO is, after im2col, a `[8192, 288] x [288, 32]` product. Both run
//! as one-op programs through the reference interpreter; throughput is in FLOP/s
//! (criterion's `elem/s`).
//!
//! `cargo bench -p gspmd-core --bench conv`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gspmd_core::ir::{Builder, DType, Literal, Padding, Program, Tensor};
use gspmd_core::runtime::{interpret, uniform_f32};
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

criterion_group!(benches, conv_vs_matmul);
criterion_main!(benches);
