//! Halo capabilities (issue 27, item 2): undilated halos for base-dilated convolutions
//! and reduce_windows (and so for the gradients of strided poolings), batch-to-spatial convolution resharding by all-to-all and halo, multi-hop halos and
//! uneven rotations. Each golden pins gspmd's collectives and bytes received per device,
//! runs the program on a thread mesh against the reference interpreter, and names the
//! XLA test or program it mirrors with XLA's bytes per device on the same program (JAX
//! 0.12 with GSPMD partitioning on 8 CPU devices; collective-permutes count their
//! output, all-to-alls `(k - 1)/k` of their input).

#[path = "peers/harness.rs"]
#[allow(dead_code)]
mod harness;

use gspmd_core::Executable;
use gspmd_core::autodiff::grad;
use gspmd_core::ir::{
    Builder, CollectiveKind, ConvDimensionNumbers, Padding, ReduceKind, Tensor, WindowDim,
};
use gspmd_core::sharding::Mesh;
use harness::{build, compile_and_check, mesh, param, sh};

fn mesh24() -> Mesh {
    mesh(&[("x", 2), ("y", 4)])
}

fn nhwc() -> ConvDimensionNumbers {
    ConvDimensionNumbers::from_labels("NHWC", "HWIO", "NHWC").expect("valid labels")
}

/// `x` convolved with `k` (NHWC / HWIO), stride 1 unless `strides` says.
fn conv(
    x: &Tensor,
    k: &Tensor,
    strides: &[usize],
    padding: &[(i64, i64)],
    lhs: &[usize],
) -> Tensor {
    x.conv_general_dilated(
        k,
        strides,
        Padding::Explicit(padding.to_vec()),
        lhs,
        &[],
        &nhwc(),
        1,
    )
}

/// The program convolving `x` (`x_shape`, split as `x_split`) with a replicated kernel
/// of `kernel` (stride 1), its result split along H over `y`.
fn conv_program(
    name: &str,
    (x_shape, x_split): (&[usize], &str),
    kernel: &[usize],
    padding: &[(i64, i64)],
    lhs_dilation: &[usize],
) -> gspmd_core::ir::Program {
    build(name, |b: &Builder| {
        let x = param(b, "x", x_shape, Some(x_split));
        let k = param(b, "k", kernel, None);
        let y = conv(&x, &k, &[1, 1], padding, lhs_dilation);
        vec![y.annotate(sh("(_, y, _, _)"))]
    })
}

/// Asserts the executable's collectives: `(kind, count)` pairs, exactly these kinds, and
/// the total bytes received per device; no warning (nothing gathered).
#[track_caller]
fn assert_collectives(exe: &Executable, kinds: &[(&str, usize)], bytes: usize) {
    let stats = exe.spmd().collectives();
    let report = exe.report();
    for &(kind, n) in kinds {
        let kind: CollectiveKind = kind.parse().expect("a collective kind");
        assert_eq!(stats.count(kind), n, "{kind}\n{report}");
    }
    assert_eq!(
        stats.total(),
        kinds.iter().map(|k| k.1).sum::<usize>(),
        "{report}"
    );
    assert_eq!(stats.bytes(), bytes, "{report}");
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
}

/// XLA's undilated halo (`lhs_dilate`, as in `spmd_partitioner_test.cc`'s base-dilated
/// convolutions): a convolution with lhs dilation 2 along H, input and output split
/// along H over `y`. Output block `i` (8 rows) reads input rows `4i .. 4i + 5`: one row
/// from the right neighbour; the dilation is local. XLA: 1 collective-permute of
/// f32[2,1,16,8], 1024 bytes. gspmd: the same (it exchanged the dilated halo, 2048
/// bytes, before).
#[test]
fn base_dilated_convolution_exchanges_undilated_rows() {
    let p = conv_program(
        "lhs_dilated",
        (&[2, 16, 16, 8], "(_, y, _, _)"),
        &[3, 3, 8, 8],
        &[(1, 2), (1, 1)],
        &[2, 1],
    );
    let exe = compile_and_check(&p, &mesh24());
    assert_collectives(&exe, &[("collective_shift", 1)], 1024);
}

/// The input gradient of a stride-2 convolution (a base-dilated convolution of the
/// cotangent), H split over `y`, as `jax.grad` of `sum(conv(x, k)^2)` with
/// `in_shardings=(P(None, 'y'), P())`: XLA moves 2048 bytes per device (2
/// collective-permutes of f32[2,1,16,8]: the forward halo and the backward one). gspmd
/// moves one forward halo row (1024 bytes) and one undilated backward row (1024 bytes),
/// plus the all-reduce of the loss, which gspmd's gradient program returns too (6
/// bytes); it moved 3072 bytes of halos before (the backward halo dilated).
#[test]
fn strided_convolution_input_gradient_exchanges_undilated_rows() {
    let loss = build("strided_input_grad", |b: &Builder| {
        let x = param(b, "x", &[2, 16, 16, 8], Some("(_, y, _, _)"));
        let k = param(b, "k", &[3, 3, 8, 8], None);
        let y = conv(&x, &k, &[2, 1], &[(1, 1), (1, 1)], &[]);
        vec![(&y * &y).sum(&[0, 1, 2, 3])]
    });
    let p = grad(&loss, 0, &[0]).expect("differentiates");
    let exe = compile_and_check(&p, &mesh24());
    assert_collectives(&exe, &[("collective_shift", 2), ("all_reduce", 1)], 2054);
}

/// `reduce_window` (max) with base dilation 2 along rows split over `y`, windows of 3
/// every row padded 1_2: output block `i` (8 rows) reads operand rows `4i .. 4i + 5`,
/// one row from the right neighbour; the dilation is local. XLA (JAX 0.12,
/// `lax.reduce_window(..., base_dilation=(1, 2, 1))`, the same shardings): 1
/// collective-permute of f32[1,1,8], 32 bytes. gspmd: the same; it all-gathered the
/// dim (384 bytes) before.
#[test]
fn base_dilated_reduce_window_exchanges_undilated_rows() {
    let p = build("base_dilated_pool", |b: &Builder| {
        let x = param(b, "x", &[2, 16, 8], Some("(x, y, _)"));
        let one = WindowDim::new(1, 1, (0, 0));
        let rows = WindowDim::new(3, 1, (1, 2)).with_base_dilation(2);
        let y = x.reduce_window_with(ReduceKind::Max, &[one, rows, one]);
        vec![y.annotate(sh("(x, y, _)"))]
    });
    let exe = compile_and_check(&p, &mesh24());
    assert_collectives(&exe, &[("collective_shift", 1)], 32);
}

/// Differential sweep of base-dilated `reduce_window`s along a split dim: base
/// dilations 2 to 4 with strides, window dilation, padding (low beyond a dilation
/// step, high cropping nothing), uneven splits of the operand and of the result, over
/// 4 and 8 shards, each kind; each against the reference interpreter. Where the base
/// dilation divides the output block's stride only undilated rows move (the `true`
/// cases); where it does not (an odd output block with stride 1, say), the operand is
/// first spread with the identity by a partitioned interior pad. No dim is gathered.
#[test]
fn base_dilated_reduce_windows_match_the_reference() {
    let m = mesh24();
    // (rows, split, kind, size, stride, padding, window dilation, base dilation, halo)
    let cases = [
        (16, "y", ReduceKind::Max, 3, 1, (1, 2), 1, 2, true),
        (16, "y", ReduceKind::Sum, 2, 1, (0, 0), 1, 3, true),
        (15, "y", ReduceKind::Min, 3, 2, (2, 1), 1, 2, true),
        (13, "y", ReduceKind::Sum, 4, 2, (3, 2), 1, 2, true),
        (16, "y", ReduceKind::Max, 3, 2, (2, 2), 2, 2, true),
        (10, "y", ReduceKind::Sum, 3, 4, (0, 0), 1, 4, true),
        (16, "(x, y)", ReduceKind::Max, 5, 2, (4, 3), 1, 2, true),
        (12, "(x, y)", ReduceKind::Sum, 3, 3, (5, 0), 1, 3, true),
        (6, "y", ReduceKind::Max, 1, 1, (0, 0), 1, 2, false),
        (9, "y", ReduceKind::Sum, 3, 1, (1, 1), 1, 2, false),
        (7, "(x, y)", ReduceKind::Min, 2, 3, (0, 1), 1, 2, false),
    ];
    for (rows, split, kind, size, stride, padding, dilation, base, halo) in cases {
        let p = build("base_dilation_sweep", |b: &Builder| {
            let x = param(b, "x", &[rows, 3], Some(&format!("({split}, _)")));
            let w = WindowDim::new(size, stride, padding)
                .with_window_dilation(dilation)
                .with_base_dilation(base);
            let y = x.reduce_window_with(kind, &[w, WindowDim::new(1, 1, (0, 0))]);
            vec![y.annotate(sh(&format!("({split}, _)")))]
        });
        let exe = compile_and_check(&p, &m);
        assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
        let local_dilation = exe.spmd().program.to_string().contains("lhs_dilate");
        assert_eq!(
            local_dilation,
            halo,
            "{rows} rows, base dilation {base}\n{}",
            exe.report()
        );
    }
}

/// `grad` of `sum(pool(x)^2)` for a stride-2 pool of `kind` (3x3 windows, padding 1) of
/// x f32[2,16,8,4] split along H over `y`.
fn strided_pool_gradient(kind: ReduceKind) -> gspmd_core::ir::Program {
    let loss = build("strided_pool_grad", |b: &Builder| {
        let x = param(b, "x", &[2, 16, 8, 4], Some("(_, y, _, _)"));
        let y = x.reduce_window(
            kind,
            &[1, 3, 3, 1],
            &[1, 2, 2, 1],
            &[(0, 0), (1, 1), (1, 1), (0, 0)],
        );
        vec![(&y * &y).sum(&[0, 1, 2, 3])]
    });
    grad(&loss, 0, &[0]).expect("differentiates")
}

/// The gradient of a stride-2 sum (average) pool, H split 4 ways: the cotangent is
/// strided back onto the input by interior pads, each taking a one-row halo of the
/// result-shaped cotangent, and the forward pool one row of the input; nothing is
/// gathered. XLA (`jax.grad` of the same loss with `in_shardings=P(None, 'y')`; its
/// transpose is a pad and a base-dilated reduce_window): 4 collective-permutes, 1664
/// bytes. gspmd: 3 collective shifts (512 bytes) and the loss's all-reduce (6 bytes),
/// which gspmd's gradient program returns too.
#[test]
fn strided_sum_pool_gradient_exchanges_halos() {
    let exe = compile_and_check(&strided_pool_gradient(ReduceKind::Sum), &mesh24());
    assert_collectives(&exe, &[("collective_shift", 3), ("all_reduce", 1)], 518);
}

/// The gradient of a stride-2 max pool, as [`strided_sum_pool_gradient_exchanges_halos`]:
/// nothing gathered, but the VJP materialises the operand padded with `-inf` (18 rows,
/// blocks of 5 misaligned with the input's 4) and compares strided slices of it with
/// the pool, each realigned by halo exchange: 11 collective shifts, 3456 bytes, plus
/// the loss's all-reduce (6 bytes). XLA (`select_and_scatter`, same program): 6
/// collective-permutes, 2944 bytes; gspmd moves 1.17x that (pinned so a change shows).
#[test]
fn strided_max_pool_gradient_exchanges_halos() {
    let exe = compile_and_check(&strided_pool_gradient(ReduceKind::Max), &mesh24());
    assert_collectives(&exe, &[("collective_shift", 11), ("all_reduce", 1)], 3462);
}

/// XLA's batch-to-spatial plan (`spmd_partitioner_test.cc`'s convolutions whose input
/// is split on batch and output on a spatial dim): the input [8,16,16,8] split on batch
/// over `y`, the output wanted split on H over `y`. XLA: one all-to-all (batch ->
/// spatial, 12288 bytes) and 2 collective-permutes of f32[8,1,16,8] (8192 bytes): 20480
/// bytes. gspmd: the same; it all-gathered the batch (49152 bytes) before.
#[test]
fn batch_split_convolution_to_spatial_output_is_all_to_all_and_halo() {
    let p = conv_program(
        "batch_to_spatial",
        (&[8, 16, 16, 8], "(y, _, _, _)"),
        &[3, 3, 8, 8],
        &[(1, 1), (1, 1)],
        &[],
    );
    let exe = compile_and_check(&p, &mesh24());
    assert_collectives(&exe, &[("all_to_all", 1), ("collective_shift", 2)], 20480);
}

/// A replicated input with the output split on H stays a local slice (no halo): the
/// cost comparison keeps the cheaper plan.
#[test]
fn replicated_convolution_input_is_not_windowed() {
    let p = conv_program(
        "replicated_to_spatial",
        (&[2, 16, 16, 8], "(_, _, _, _)"),
        &[3, 3, 8, 8],
        &[(1, 1), (1, 1)],
        &[],
    );
    let exe = compile_and_check(&p, &mesh24());
    assert_collectives(&exe, &[], 0);
}

/// A kernel of 11 rows over blocks of 4 rows: 5 halo rows each side, from two
/// neighbours each (XLA's multi-hop `ExchangeHalo`). XLA: 4 collective-permutes
/// (f32[2,4,16,8] twice, f32[2,1,16,8] twice), 10240 bytes. gspmd: the same; it
/// gathered H (12288 bytes) before.
#[test]
fn wide_kernel_exchanges_halos_with_two_neighbours() {
    let p = conv_program(
        "wide_kernel",
        (&[2, 16, 16, 8], "(_, y, _, _)"),
        &[11, 1, 8, 8],
        &[(5, 5), (0, 0)],
        &[],
    );
    let exe = compile_and_check(&p, &mesh24());
    assert_collectives(&exe, &[("collective_shift", 4)], 10240);
}

/// `spmd_partitioner_test.cc: ReduceWindowTiledOneSideHaloBeyondNeighbor`: f32[9,2] over
/// 5 devices, window 4, stride 2, padding 3 low: block `i` reads 3 rows left of it, 2
/// from the neighbour and 1 from the next. XLA's expectation: collective-permutes of
/// f32[2,2] and f32[1,2], 24 bytes. gspmd: the same.
#[test]
fn reduce_window_halo_beyond_neighbour() {
    let p = build("reduce_window_beyond", |b: &Builder| {
        let x = param(b, "x", &[9, 2], Some("(x, _)"));
        let y = x.reduce_window(ReduceKind::Sum, &[4, 1], &[2, 1], &[(3, 0), (0, 0)]);
        vec![y.annotate(sh("(x, _)"))]
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 5)]));
    assert_collectives(&exe, &[("collective_shift", 2)], 24);
}

/// A max-pool window of 7 over blocks of 2 rows (16 rows over all 8 devices). XLA: 4
/// collective-permutes, 192 bytes. gspmd: the same; it gathered (448 bytes) before.
#[test]
fn wide_pool_window_exchanges_multi_hop_halos() {
    let p = build("wide_pool", |b: &Builder| {
        let x = param(b, "x", &[16, 8], Some("((x, y), _)"));
        let y = x.reduce_window(ReduceKind::Max, &[7, 1], &[1, 1], &[(3, 3), (0, 0)]);
        vec![y.annotate(sh("((x, y), _)"))]
    });
    let exe = compile_and_check(&p, &mesh24());
    assert_collectives(&exe, &[("collective_shift", 4)], 192);
}

/// `x[12:]` of 24 rows, both split over `y`: output block `i` (3 rows) reads rows `12 +
/// 3i ..`, two blocks to the right of block 0. XLA: 2 collective-permutes of f32[3,8]
/// with per-device sources, 192 bytes. gspmd: the same bytes, 2 collective shifts of 3
/// rows (hop 1 and hop 2), each sender cutting the rows its receiver needs at an offset
/// from `axis_index`; the contiguous halo (6 rows and 3) would receive 288 bytes, and
/// gathering 576.
#[test]
fn far_slice_exchanges_multi_hop_halos() {
    let p = build("far_slice", |b: &Builder| {
        let x = param(b, "x", &[24, 8], Some("(y, _)"));
        vec![x.slice_axis(0, 12, 24).annotate(sh("(y, _)"))]
    });
    let exe = compile_and_check(&p, &mesh24());
    assert_collectives(&exe, &[("collective_shift", 2)], 192);
}

/// `jnp.pad(x, ((20, 4), (0, 0)))` of 24 rows split over `y`: output block 2 reads 8 rows
/// left of its input block, from two neighbours. XLA: 3 collective-permutes, 448
/// bytes. gspmd: 2 shifts (6 rows and 2), 256 bytes.
#[test]
fn far_pad_exchanges_multi_hop_halos() {
    let p = build("far_pad", |b: &Builder| {
        let x = param(b, "x", &[24, 8], Some("(y, _)"));
        let zero = b.scalar(0.0);
        vec![
            x.pad(&zero, &[20, 0], &[4, 0], &[0, 0])
                .annotate(sh("(y, _)")),
        ]
    });
    let exe = compile_and_check(&p, &mesh24());
    assert_collectives(&exe, &[("collective_shift", 2)], 256);
}

/// An uneven rotation: `jnp.roll` by 5 of 30 rows over 4 devices (blocks of 8, the last
/// holding 6), as XLA's program `pad(wsc(roll(wsc(x[:30]), 5)), 2)` from a [32,8] input
/// (JAX needs even shardings at the boundary). XLA: 2 collective-permutes (f32[7,8],
/// f32[5,8]), 384 bytes. gspmd: two rotations of the padded blocks (7 and 5 rows move)
/// and a select, 384 bytes; it gathered the dim (768 bytes) before.
#[test]
fn uneven_rotation_moves_pieces_not_the_whole_dim() {
    let p = build("uneven_roll", |b: &Builder| {
        let x = param(b, "x", &[32, 8], Some("(y, _)"));
        let x = x.slice_axis(0, 0, 30).annotate(sh("(y, _)"));
        let r = x.roll(5, 0).annotate(sh("(y, _)"));
        let zero = b.scalar(0.0);
        vec![
            r.pad(&zero, &[0, 0], &[2, 0], &[0, 0])
                .annotate(sh("(y, _)")),
        ]
    });
    let exe = compile_and_check(&p, &mesh24());
    assert_collectives(&exe, &[("collective_shift", 2)], 384);
}

/// Differential sweep: rotations of unevenly split dims, multi-hop windows of
/// convolutions (kernel sizes, dilations, strides, padding, base dilation), and slices
/// and pads whose windows drift from the blocks (piece by piece), each against the
/// reference interpreter; none gathers a dim a halo can serve.
#[test]
fn uneven_rotations_and_multi_hop_windows_match_the_reference() {
    let m = mesh24();
    for (start, limit, stride) in [
        (12, 24, 1),
        (5, 24, 1),
        (1, 20, 2),
        (3, 24, 3),
        (0, 23, 4),
        (9, 13, 1),
    ] {
        let p = build("slice_sweep", |b: &Builder| {
            let x = param(b, "x", &[24, 3], Some("((x, y), _)"));
            vec![
                x.slice(&[start, 0], &[limit, 3], &[stride, 1])
                    .annotate(sh("((x, y), _)")),
            ]
        });
        let exe = compile_and_check(&p, &m);
        assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
    }
    for (low, high, interior) in [(20, 4, 0), (-10, 3, 0), (2, -9, 1), (11, 0, 2), (-5, 7, 3)] {
        let p = build("pad_sweep", |b: &Builder| {
            let x = param(b, "x", &[22, 3], Some("(y, _)"));
            let v = b.scalar(0.5);
            let y = x.pad(&v, &[low, 0], &[high, 0], &[interior, 0]);
            vec![y.annotate(sh("(y, _)"))]
        });
        compile_and_check(&p, &m);
    }
    for (size, shift) in [
        (30, 1),
        (30, 7),
        (30, 8),
        (30, 13),
        (30, 29),
        (13, 3),
        (13, 10),
        (6, 5),
    ] {
        let p = build("roll_sweep", |b: &Builder| {
            let x = param(b, "x", &[size, 3], Some("(y, _)"));
            vec![x.roll(shift, 0).annotate(sh("(y, _)"))]
        });
        compile_and_check(&p, &m);
    }
    for (kernel, dilation, stride, padding) in [
        (9, 1, 1, (4, 4)),
        (5, 3, 1, (6, 6)),
        (7, 2, 2, (5, 6)),
        (13, 1, 1, (12, 0)),
        (4, 3, 1, (0, 9)),
    ] {
        let p = build("conv_sweep", |b: &Builder| {
            let x = param(b, "x", &[2, 16, 3, 4], Some("(_, y, _, _)"));
            let k = param(b, "k", &[kernel, 1, 4, 2], None);
            let y = x.conv_general_dilated(
                &k,
                &[stride, 1],
                Padding::Explicit(vec![padding, (0, 0)]),
                &[],
                &[dilation, 1],
                &nhwc(),
                1,
            );
            vec![y.annotate(sh("(_, y, _, _)"))]
        });
        let exe = compile_and_check(&p, &m);
        assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
    }
    for (lhs_dilation, stride, padding) in [
        (2, 1, (1, 2)),
        (3, 1, (2, 0)),
        (2, 2, (0, 1)),
        (4, 2, (3, 3)),
    ] {
        let p = build("lhs_dilation_sweep", |b: &Builder| {
            let x = param(b, "x", &[2, 8, 3, 4], Some("(_, y, _, _)"));
            let k = param(b, "k", &[3, 1, 4, 2], None);
            let y = conv(&x, &k, &[stride, 1], &[padding, (0, 0)], &[lhs_dilation, 1]);
            vec![y.annotate(sh("(_, y, _, _)"))]
        });
        compile_and_check(&p, &m);
    }
}
