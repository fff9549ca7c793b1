//! Cases ported from `xla/service/sharding_propagation_test.cc`.
//!
//! Translation: an HLO `devices=[...]` tile assignment becomes mesh axes per dim (the
//! devices' mixed-radix digits, major first: `devices=[1,2,2,1]0,1,2,3` on a 2x2 mesh
//! `x`, `y` is `(_, x, y, _)`; `last_tile_dim_replicate` leaves the last digit's axis
//! out). XLA's `copy` (a value of its own that propagation shards) is a `neg`, which
//! partitions alike. Shapes of thousands of elements per dim are scaled down, keeping
//! which dims the axes divide; each case's doc says so.

use gspmd_core::ir::{
    Builder, ConvDimensionNumbers, DType, DotDims, GatherDims, Padding, ReduceKind, ScatterDims,
    Tensor,
};

use crate::harness::{
    Case, Verdict, assert_shardings, build_with, compile_and_check, mesh, no_more_than_peer, param,
    sh,
};

/// The ported cases, in the order of the peer's file.
pub const CASES: &[Case] = &[
    Case {
        source: "sharding_propagation_test.cc: ElementwiseOperationForwardPass",
        verdict: Verdict::Agrees,
        check: elementwise_operation_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: ElementwiseOperationBackwardPass",
        verdict: Verdict::Agrees,
        check: elementwise_operation_backward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: BroadcastForwardPass",
        verdict: Verdict::Agrees,
        check: broadcast_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: BroadcastBackwardPass",
        verdict: Verdict::Agrees,
        check: broadcast_backward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: BroadcastForwardPartial",
        verdict: Verdict::Agrees,
        check: broadcast_forward_partial,
    },
    Case {
        source: "sharding_propagation_test.cc: BroadcastUser",
        verdict: Verdict::Agrees,
        check: broadcast_user,
    },
    Case {
        source: "sharding_propagation_test.cc: MaximalReduceForwardPass",
        verdict: Verdict::Better(
            "keeps the reduce split on the surviving dim (a reduce-scatter's worth of data) \
             where XLA's non-SPMD mode replicates it",
        ),
        check: maximal_reduce_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: ShardedReduceForwardPass",
        verdict: Verdict::Agrees,
        check: sharded_reduce_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: ReducePartiallyOnTiledDims",
        verdict: Verdict::Agrees,
        check: reduce_partially_on_tiled_dims,
    },
    Case {
        source: "sharding_propagation_test.cc: ReducePartiallyBackward",
        verdict: Verdict::Agrees,
        check: reduce_partially_backward,
    },
    Case {
        source: "sharding_propagation_test.cc: TransposeForwardPass",
        verdict: Verdict::Agrees,
        check: transpose_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: TransposeBackwardPass",
        verdict: Verdict::Agrees,
        check: transpose_backward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: ReshapeForwardPass",
        verdict: Verdict::Agrees,
        check: reshape_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: ReshapeBackwardPass",
        verdict: Verdict::Agrees,
        check: reshape_backward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: PadForwardPass",
        verdict: Verdict::Agrees,
        check: pad_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: PadBackwardPass",
        verdict: Verdict::Agrees,
        check: pad_backward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: ShardedPreferredOverReplicated",
        verdict: Verdict::Agrees,
        check: sharded_preferred_over_replicated,
    },
    Case {
        source: "sharding_propagation_test.cc: ValidConvolution",
        verdict: Verdict::Agrees,
        check: valid_convolution,
    },
    Case {
        source: "sharding_propagation_test.cc: StridedSlice",
        verdict: Verdict::Agrees,
        check: strided_slice,
    },
    Case {
        source: "sharding_propagation_test.cc: ReduceWindowBackwardPass",
        verdict: Verdict::Agrees,
        check: reduce_window_backward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: ConvolutionShardedFeature",
        verdict: Verdict::Agrees,
        check: convolution_sharded_feature,
    },
    Case {
        source: "sharding_propagation_test.cc: ConvolutionDifferentDimensionNumbers",
        verdict: Verdict::Agrees,
        check: convolution_different_dimension_numbers,
    },
    Case {
        source: "sharding_propagation_test.cc: Concatenate",
        verdict: Verdict::Agrees,
        check: concatenate,
    },
    Case {
        source: "sharding_propagation_test.cc: ForwardConvolutionForwardPass",
        verdict: Verdict::Agrees,
        check: forward_convolution_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: While",
        verdict: Verdict::Agrees,
        check: while_loop,
    },
    Case {
        source: "sharding_propagation_test.cc: DotTiledBatchDim",
        verdict: Verdict::Agrees,
        check: dot_tiled_batch_dim,
    },
    Case {
        source: "sharding_propagation_test.cc: DotMergeOperands",
        verdict: Verdict::Agrees,
        check: dot_merge_operands,
    },
    Case {
        source: "sharding_propagation_test.cc: BackwardDotFromContracting",
        verdict: Verdict::Agrees,
        check: backward_dot_from_contracting,
    },
    Case {
        source: "sharding_propagation_test.cc: ConcatFromUserUnshardedDim",
        verdict: Verdict::Agrees,
        check: concat_from_user_unsharded_dim,
    },
    Case {
        source: "sharding_propagation_test.cc: DynamicSliceForwardPass",
        verdict: Verdict::Agrees,
        check: dynamic_slice_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: DynamicSliceBackwardPass",
        verdict: Verdict::Agrees,
        check: dynamic_slice_backward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: DynamicUpdateSliceForwardPassBase",
        verdict: Verdict::Agrees,
        check: dynamic_update_slice_forward_pass_base,
    },
    Case {
        source: "sharding_propagation_test.cc: DynamicUpdateSliceBackwardPass",
        verdict: Verdict::Agrees,
        check: dynamic_update_slice_backward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: GatherFromIndex",
        verdict: Verdict::Agrees,
        check: gather_from_index,
    },
    Case {
        source: "sharding_propagation_test.cc: GatherFromDataOperand",
        verdict: Verdict::Agrees,
        check: gather_from_data_operand,
    },
    Case {
        source: "sharding_propagation_test.cc: GatherToIndex",
        verdict: Verdict::Agrees,
        check: gather_to_index,
    },
    Case {
        source: "sharding_propagation_test.cc: GatherToDataOperand",
        verdict: Verdict::Agrees,
        check: gather_to_data_operand,
    },
    Case {
        source: "sharding_propagation_test.cc: ReplicatedConvolutionLhs",
        verdict: Verdict::Agrees,
        check: replicated_convolution_lhs,
    },
    Case {
        source: "sharding_propagation_test.cc: ForwardConvolutionLargeDilationForwardPass",
        verdict: Verdict::Agrees,
        check: forward_convolution_large_dilation_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: PartialReplicatedPadForwardPass",
        verdict: Verdict::Agrees,
        check: partial_replicated_pad_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: PartialReplicatedStridedSlice",
        verdict: Verdict::Agrees,
        check: partial_replicated_strided_slice,
    },
    Case {
        source: "sharding_propagation_test.cc: PartialReplicateReshapeForwardPass",
        verdict: Verdict::Agrees,
        check: partial_replicate_reshape_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: PartialReplicateReshapeBackwardPass",
        verdict: Verdict::Agrees,
        check: partial_replicate_reshape_backward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: ConvAsDotOnTrivialDimsBackward",
        verdict: Verdict::Agrees,
        check: conv_as_dot_on_trivial_dims_backward,
    },
    Case {
        source: "sharding_propagation_test.cc: ConvolutionFilterIFOFPartitionedInputPartialReplicate",
        verdict: Verdict::Agrees,
        check: convolution_filter_ifof_partitioned_input_partial_replicate,
    },
    Case {
        source: "sharding_propagation_test.cc: DotMergeOperands2",
        verdict: Verdict::Agrees,
        check: dot_merge_operands2,
    },
    Case {
        source: "sharding_propagation_test.cc: DynamicUpdateSliceForwardPassUpdate",
        verdict: Verdict::Agrees,
        check: dynamic_update_slice_forward_pass_update,
    },
    Case {
        source: "sharding_propagation_test.cc: GatherFromIndex_PartialReplicate",
        verdict: Verdict::Agrees,
        check: gather_from_index_partial_replicate,
    },
    Case {
        source: "sharding_propagation_test.cc: GatherFromDataOperand_PartialReplicate",
        verdict: Verdict::Agrees,
        check: gather_from_data_operand_partial_replicate,
    },
    Case {
        source: "sharding_propagation_test.cc: GatherToIndex3",
        verdict: Verdict::Agrees,
        check: gather_to_index3,
    },
    Case {
        source: "sharding_propagation_test.cc: ScatterUpdateToIndex2",
        verdict: Verdict::Agrees,
        check: scatter_update_to_index2,
    },
    Case {
        source: "sharding_propagation_test.cc: ScatterIndexToUpdate",
        verdict: Verdict::Agrees,
        check: scatter_index_to_update,
    },
    Case {
        source: "sharding_propagation_test.cc: PartialShardingOnElementwise",
        verdict: Verdict::Agrees,
        check: partial_sharding_on_elementwise,
    },
    Case {
        source: "sharding_propagation_test.cc: PartialShardingTransposeForwardPass",
        verdict: Verdict::Agrees,
        check: partial_sharding_transpose_forward_pass,
    },
    Case {
        source: "sharding_propagation_test.cc: PartialShardingTransposeBackwardPass",
        verdict: Verdict::Agrees,
        check: partial_sharding_transpose_backward_pass,
    },
];

/// XLA's `copy`: a value of its own, elementwise (see the module doc).
fn copy(t: &Tensor) -> Tensor {
    t.neg()
}

/// An i32 scalar parameter (a run-time index).
fn index(b: &Builder, name: &str) -> Tensor {
    b.parameter(name, Vec::<usize>::new(), DType::I32)
}

/// The 2x2 mesh of most cases (XLA's four devices `0,1,2,3`).
fn mesh_2x2() -> gspmd_core::sharding::Mesh {
    mesh(&[("x", 2), ("y", 2)])
}

/// An add of a [5,7,11,13] operand split `devices=[1,2,2,1]` and an unannotated one
/// takes the split: XLA expects the add sharded `[1,2,2,1]`.
fn elementwise_operation_forward_pass() {
    let (p, [sum]) = build_with("elementwise_forward", |b| {
        let a = param(b, "a", &[5, 7, 11, 13], Some("(_, x, y, _)"));
        let c = param(b, "c", &[5, 7, 11, 13], None);
        let y = &a + &c;
        (vec![copy(&y)], [y])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&sum, "(_, x, y, _)")]);
}

/// The copy of an add of two unannotated operands is split `[1,2,2,1]`: XLA gives the
/// add that sharding backwards.
fn elementwise_operation_backward_pass() {
    let (p, [sum, a]) = build_with("elementwise_backward", |b| {
        let a = param(b, "a", &[5, 7, 11, 13], None);
        let c = param(b, "c", &[5, 7, 11, 13], None);
        let y = &a + &c;
        (vec![copy(&y).annotate(sh("(_, x, y, _)"))], [y, a])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&sum, "(_, x, y, _)"), (&a, "(_, x, y, _)")]);
}

/// A [3,2048,2048] operand split `[1,2,2]` broadcast to [3,2048,2048,3] along dims
/// {0,1,2}: XLA expects `[1,2,2,1]` (scaled to [3,16,16]).
fn broadcast_forward_pass() {
    let (p, [bc]) = build_with("broadcast_forward", |b| {
        let a = param(b, "a", &[3, 16, 16], Some("(_, x, y)"));
        let bc = a.broadcast_in_dim([3, 16, 16, 3], &[0, 1, 2]);
        (vec![copy(&bc)], [bc])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&bc, "(_, x, y, _)")]);
}

/// A [13] vector broadcast along dim 3 of [5,7,11,13] whose copy is split `[1,2,2,1]`:
/// XLA gives the broadcast that sharding (the operand's dim stays whole).
fn broadcast_backward_pass() {
    let (p, [bc, a]) = build_with("broadcast_backward", |b| {
        let a = param(b, "a", &[13], None);
        let bc = a.broadcast_in_dim([5, 7, 11, 13], &[3]);
        (vec![copy(&bc).annotate(sh("(_, x, y, _)"))], [bc, a])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&bc, "(_, x, y, _)"), (&a, "(_)")]);
}

/// A [3,2048] operand split in 2 on dim 1 and replicated over the other 2 devices
/// (`[1,2,2] last_tile_dim_replicate`) broadcast to [3,2048,3]: XLA expects `[1,2,1,2]
/// last_tile_dim_replicate`, dim 1 split, `y` replicated (scaled to [3,16]).
fn broadcast_forward_partial() {
    let (p, [bc]) = build_with("broadcast_forward_partial", |b| {
        let a = param(b, "a", &[3, 16], Some("(_, x)"));
        let bc = a.broadcast_in_dim([3, 16, 3], &[0, 1]);
        (vec![copy(&bc)], [bc])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&bc, "(_, x, _)")]);
}

/// A [24,8] copy broadcast to [4,24,6,8] along dims {1,3}, the broadcast split
/// `[1,2,1,4]` on 8 devices: XLA gives the copy `[2,4]`.
fn broadcast_user() {
    let (p, [c]) = build_with("broadcast_user", |b| {
        let a = param(b, "a", &[24, 8], None);
        let c = copy(&a);
        let bc = c
            .broadcast_in_dim([4, 24, 6, 8], &[1, 3])
            .annotate(sh("(_, x, _, y)"));
        (vec![bc], [c])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2), ("y", 4)]));
    assert_shardings(&p, &exe, &[(&c, "(x, y)")]);
}

/// A [5,7,11,13] operand split `[1,2,2,1]` summed over dims {2,3}: XLA (non-SPMD mode)
/// replicates the [5,7] result. gspmd keeps dim 1's `x` split (its factor survives), so
/// its partial sums over `y` are all-reduced on half the data and nothing is gathered
/// over `x`; the peer's plan (the reduce annotated replicated) also all-gathers.
fn maximal_reduce_forward_pass() {
    let program = |replicated: bool| {
        build_with("maximal_reduce", |b| {
            let a = param(b, "a", &[5, 7, 11, 13], Some("(_, x, y, _)"));
            let mut r = a.sum(&[2, 3]);
            if replicated {
                r = r.annotate(sh("(_, _)"));
            }
            (vec![copy(&r)], [r])
        })
    };
    let m = mesh_2x2();
    let (p, [r]) = program(false);
    let exe = compile_and_check(&p, &m);
    assert_shardings(&p, &exe, &[(&r, "(_, x)")]);
    let (ours, peer) = no_more_than_peer(&exe, &program(true).0, &m);
    assert!(ours < peer, "{ours} vs {peer}");
}

/// Summing the [5,7,11,13] operand split `[1,2,2,1]` over dims {0,3} keeps both splits:
/// XLA expects the [7,11] result `[2,2]`.
fn sharded_reduce_forward_pass() {
    let (p, [r]) = build_with("sharded_reduce", |b| {
        let a = param(b, "a", &[5, 7, 11, 13], Some("(_, x, y, _)"));
        let r = a.sum(&[0, 3]);
        (vec![copy(&r)], [r])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&r, "(x, y)")]);
}

/// An [8,8] operand split `[2,2]` summed over dim 0: XLA keeps dim 1's split (devices
/// `0,2 | 1,3`: the minor axis) with the major one replicated.
fn reduce_partially_on_tiled_dims() {
    let (p, [r]) = build_with("reduce_partially", |b| {
        let a = param(b, "a", &[8, 8], Some("(x, y)"));
        let r = a.sum(&[0]);
        (vec![copy(&r)], [r])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&r, "(y)")]);
}

/// A reduce over dim 0 of a copy, the reduce split `[2,2] last_tile_dim_replicate`: XLA
/// gives the copy `[1,2,2] last_tile_dim_replicate` (its surviving dim split alike).
fn reduce_partially_backward() {
    let (p, [input]) = build_with("reduce_partially_backward", |b| {
        let a = param(b, "a", &[8, 8], None);
        let input = copy(&a);
        let r = input.sum(&[0]).annotate(sh("(x)"));
        (vec![copy(&r)], [input])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&input, "(_, x)")]);
}

/// A [7,11,13] operand split `[2,1,2]` transposed by {1,2,0}: XLA expects
/// `[1,2,2]0,2,1,3`, i.e. dim 1 split by the minor axis, dim 2 by the major one.
fn transpose_forward_pass() {
    let (p, [t]) = build_with("transpose_forward", |b| {
        let a = param(b, "a", &[7, 11, 13], Some("(x, _, y)"));
        let t = a.transpose(&[1, 2, 0]);
        (vec![copy(&t)], [t])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&t, "(_, y, x)")]);
}

/// A transpose {1,2,0} split `[1,2,2]`: XLA gives its operand `[2,1,2]0,2,1,3`.
fn transpose_backward_pass() {
    let (p, [c]) = build_with("transpose_backward", |b| {
        let a = param(b, "a", &[7, 11, 13], None);
        let c = copy(&a);
        let t = c.transpose(&[1, 2, 0]).annotate(sh("(_, x, y)"));
        (vec![t], [c])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&c, "(y, _, x)")]);
}

/// [1430,1] split `[2,1]` reshaped to [10,11,13]: XLA expects `[2,1,1]` (the split
/// lands on the major dim of the split).
fn reshape_forward_pass() {
    let (p, [r]) = build_with("reshape_forward", |b| {
        let a = param(b, "a", &[1430, 1], Some("(x, _)"));
        let r = a.reshape([10, 11, 13]);
        (vec![copy(&r)], [r])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&r, "(x, _, _)")]);
}

/// A reshape [2002,1] -> [14,11,13] split `[2,1,1]`: XLA gives the operand `[2,1]`.
fn reshape_backward_pass() {
    let (p, [c]) = build_with("reshape_backward", |b| {
        let a = param(b, "a", &[2002, 1], None);
        let c = copy(&a);
        let r = c.reshape([14, 11, 13]).annotate(sh("(x, _, _)"));
        (vec![r], [c])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&c, "(x, _)")]);
}

/// The pad of XLA's Pad tests: [11,17] padded `2_4_1x1_1_2` (low, high, interior) to
/// [27,51].
fn pad_11x17(t: &Tensor, b: &Builder) -> Tensor {
    let value = param(b, "pad_value", &[], None);
    t.pad(&value, &[2, 1], &[4, 1], &[1, 2])
}

/// An [11,17] operand split `[2,2]` padded with interior padding: XLA expects the pad
/// `[2,2]`.
fn pad_forward_pass() {
    let (p, [pad]) = build_with("pad_forward", |b| {
        let a = param(b, "a", &[11, 17], Some("(x, y)"));
        let pad = pad_11x17(&a, b);
        (vec![copy(&pad)], [pad])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&pad, "(x, y)")]);
}

/// The pad split `[2,2]`: XLA gives its operand's copy `[2,2]`.
fn pad_backward_pass() {
    let (p, [c]) = build_with("pad_backward", |b| {
        let a = param(b, "a", &[11, 17], None);
        let c = copy(&a);
        let pad = pad_11x17(&c, b).annotate(sh("(x, y)"));
        (vec![copy(&pad)], [c])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&c, "(x, y)")]);
}

/// The copy of a parameter annotated replicated meets, in an add, the copy of one split
/// `[1,2,2,1]`: XLA prefers the split for both copies and the add.
fn sharded_preferred_over_replicated() {
    let (p, [c0, c1, sum]) = build_with("sharded_preferred", |b| {
        let a = param(b, "a", &[5, 7, 11, 13], Some("(_, _, _, _)"));
        let c = param(b, "c", &[5, 7, 11, 13], Some("(_, x, y, _)"));
        let (c0, c1) = (copy(&a), c.abs());
        let sum = &c0 + &c1;
        (vec![copy(&sum)], [c0, c1, sum])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    let split = "(_, x, y, _)";
    assert_shardings(&p, &exe, &[(&c0, split), (&c1, split), (&sum, split)]);
}

/// A 1-D convolution of an input of shape `lhs.0` split `lhs.1` by an unannotated
/// kernel of shape `kernel`, with JAX's dimension labels (input, kernel, output), a
/// window `stride` and `rhs_dilation`, unpadded, on a mesh of one axis `x` of `devices`;
/// asserts the output's propagated sharding.
#[allow(clippy::too_many_arguments)]
fn conv_1d(
    name: &str,
    lhs: (&[usize], &str),
    kernel: &[usize],
    labels: [&str; 3],
    stride: usize,
    rhs_dilation: usize,
    devices: usize,
    output: &str,
) {
    let (p, [conv]) = build_with(name, |b| {
        let input = param(b, "lhs", lhs.0, Some(lhs.1));
        let kernel = param(b, "rhs", kernel, None);
        let dims = ConvDimensionNumbers::from_labels(labels[0], labels[1], labels[2]).unwrap();
        let conv = input.conv_general_dilated(
            &kernel,
            &[stride],
            Padding::Valid,
            &[],
            &[rhs_dilation],
            &dims,
            1,
        );
        (vec![conv.clone()], [conv])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", devices)]));
    assert_shardings(&p, &exe, &[(&conv, output)]);
}

/// A 1-D convolution `b0f_i0o->b0f` (window 5, no padding) of a [13,17,19] input split
/// on its spatial dim: XLA expects the [13,13,19] output split alike.
fn valid_convolution() {
    let labels = ["NWC", "IWO", "NWC"];
    conv_1d(
        "valid_convolution",
        (&[13, 17, 19], "(_, x, _)"),
        &[19, 5, 19],
        labels,
        1,
        1,
        2,
        "(_, x, _)",
    );
}

/// A strided slice `[1:15:2], [5:10:1]` of a [17,13] operand split `[2,1]`: XLA
/// expects the [7,5] slice `[2,1]`.
fn strided_slice() {
    let (p, [s]) = build_with("strided_slice", |b| {
        let a = param(b, "a", &[17, 13], Some("(x, _)"));
        let s = a.slice(&[1, 5], &[15, 10], &[2, 1]);
        (vec![copy(&s)], [s])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&s, "(x, _)")]);
}

/// A sum `reduce_window` (3x2, stride 2x1, padding 1_1x0_1) split `[2,1]`: XLA gives
/// the operand's copy `[2,1]`.
fn reduce_window_backward_pass() {
    let (p, [c]) = build_with("reduce_window_backward", |b| {
        let a = param(b, "a", &[13, 17], None);
        let c = copy(&a);
        let rw = c
            .reduce_window(ReduceKind::Sum, &[3, 2], &[2, 1], &[(1, 1), (0, 1)])
            .annotate(sh("(x, _)"));
        (vec![rw], [c])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&c, "(x, _)")]);
}

/// A 1x1 convolution `bf0_oi0->bf0` whose [3,2,3] input is split on its feature dim
/// (the contracted one): XLA leaves the output replicated.
fn convolution_sharded_feature() {
    let labels = ["NCW", "OIW", "NCW"];
    conv_1d(
        "convolution_sharded_feature",
        (&[3, 2, 3], "(_, x, _)"),
        &[2, 2, 1],
        labels,
        1,
        1,
        2,
        "(_, _, _)",
    );
}

/// A strided 1-D convolution `f0b_i0o->0bf` (window 2, stride 5) of an [8,16,512] input
/// split on its spatial dim: XLA expects the [3,512,512] output split on its spatial
/// dim, now dim 0 (batch and feature scaled from 512 to 8).
fn convolution_different_dimension_numbers() {
    let labels = ["CWN", "IWO", "WNC"];
    conv_1d(
        "convolution_dimension_numbers",
        (&[8, 16, 8], "(_, x, _)"),
        &[8, 2, 8],
        labels,
        5,
        1,
        2,
        "(x, _, _)",
    );
}

/// [5,7] and [5,9] operands split `[2,1]` concatenated along dim 1: XLA expects `[2,1]`.
fn concatenate() {
    let (p, [c]) = build_with("concatenate", |b| {
        let a = param(b, "a", &[5, 7], Some("(x, _)"));
        let d = param(b, "d", &[5, 9], Some("(x, _)"));
        let c = b.concatenate(&[&a, &d], 1);
        (vec![c.clone()], [c])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&c, "(x, _)")]);
}

/// A 3x3 convolution `b01f_01io->b01f` (padding 1) of a [5,7,11,13] input split
/// `[2,2,2,1]` on 8 devices: XLA expects the output split alike (batch and both
/// spatial dims).
fn forward_convolution_forward_pass() {
    let (p, [conv]) = build_with("forward_convolution", |b| {
        let lhs = param(b, "lhs", &[5, 7, 11, 13], Some("(x, y, z, _)"));
        let rhs = param(b, "rhs", &[3, 3, 13, 17], None);
        let padding = Padding::Explicit(vec![(1, 1), (1, 1)]);
        let conv = lhs.conv2d(&rhs, [1, 1], padding);
        (vec![copy(&conv)], [conv])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2), ("y", 2), ("z", 2)]));
    assert_shardings(&p, &exe, &[(&conv, "(x, y, z, _)")]);
}

/// A while loop carrying a counter and a [10,10] accumulator (`acc + acc` in the body,
/// annotated `[2,1]`), its result multiplied by its initial value: XLA gives the loop,
/// the body's parameter and root, and the initial copy `[2,1]`.
fn while_loop() {
    let (p, [init, res]) = build_with("while", |b| {
        let p0 = param(b, "p0", &[10, 10], None);
        let init = copy(&p0);
        let zero = b.full(Vec::<usize>::new(), DType::I32, 0.0);
        let out = b.while_loop(
            |s| s[0].lt(&s[0].scalar_like(10.0)),
            |s| {
                let count = &s[0] + &s[0].scalar_like(1.0);
                let acc = (&s[1] + &s[1]).annotate(sh("(x, _)"));
                vec![count, acc]
            },
            &[zero, init.clone()],
        );
        let res = &out[1] * &init;
        (vec![res, out[0].clone()], [init, out[1].clone()])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&init, "(x, _)"), (&res, "(x, _)")]);
}

/// An add feeding a batched matmul whose [8,256,128] result is reshaped to [8,32768]
/// and split `[2,2]`: XLA gives the add `[2,2,1]` (scaled to [8,16,8] x [8,8,4]).
fn dot_tiled_batch_dim() {
    let (p, [sum]) = build_with("dot_tiled_batch_dim", |b| {
        let p0 = param(b, "p0", &[8, 16, 8], None);
        let p1 = param(b, "p1", &[8, 8, 4], None);
        let sum = &p0 + &p0;
        let dims = DotDims {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contracting: vec![2],
            rhs_contracting: vec![1],
        };
        let res = sum
            .dot_general(&p1, dims)
            .reshape([8, 64])
            .annotate(sh("(x, y)"));
        (vec![res], [sum])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&sum, "(x, y, _)")]);
}

/// `bij,bkj->bik` (batch dim 0, contracting dims 2 and 2): XLA's `dot` of the DotMerge
/// tests.
fn bij_bkj() -> DotDims {
    DotDims {
        lhs_batch: vec![0],
        rhs_batch: vec![0],
        lhs_contracting: vec![2],
        rhs_contracting: vec![2],
    }
}

/// `bij,bkj->bik` of [8,16,8] and [8,4,8] operands split `lhs` and `rhs` on 8 devices;
/// asserts the product's propagated sharding.
fn dot_merge(name: &str, lhs: &str, rhs: &str, product: &str) {
    let (p, [d]) = build_with(name, |b| {
        let p0 = param(b, "p0", &[8, 16, 8], Some(lhs));
        let p1 = param(b, "p1", &[8, 4, 8], Some(rhs));
        let d = p0.dot_general(&p1, bij_bkj());
        (vec![copy(&d)], [d])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2), ("y", 2), ("z", 2)]));
    assert_shardings(&p, &exe, &[(&d, product)]);
}

/// `bij,bkj->bik` of operands split `[2,2,1,2] last_tile_dim_replicate` with different
/// device orders (8 devices): the lhs's `i` over the middle axis, the rhs's `k` over
/// the minor one. XLA merges both into the product, `[2,2,2]`.
fn dot_merge_operands() {
    dot_merge("dot_merge_operands", "(x, y, _)", "(x, z, _)", "(x, y, z)");
}

/// `bij,bkj->bik` with the lhs split `[2,2,2]` and the product `[2,1,2,2]
/// last_tile_dim_replicate`: XLA gives the rhs's copy `[2,2,2]`, its contracting dim
/// split as the lhs's and its `k` as the product's.
fn backward_dot_from_contracting() {
    let (p, [c1]) = build_with("backward_dot_from_contracting", |b| {
        let p0 = param(b, "p0", &[8, 16, 8], Some("(x, y, z)"));
        let p1 = param(b, "p1", &[8, 4, 8], None);
        let c1 = copy(&p1);
        let d = p0.dot_general(&c1, bij_bkj()).annotate(sh("(x, _, y)"));
        (vec![copy(&d)], [c1])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2), ("y", 2), ("z", 2)]));
    assert_shardings(&p, &exe, &[(&c1, "(x, y, z)")]);
}

/// Two [8,128] copies concatenated along dim 0 into [16,128] split `[1,2]` (the
/// unconcatenated dim): XLA gives both copies `[1,2]`.
fn concat_from_user_unsharded_dim() {
    let (p, [c0, c1]) = build_with("concat_from_user", |b| {
        let p0 = param(b, "p0", &[8, 128], None);
        let p1 = param(b, "p1", &[8, 128], None);
        let (c0, c1) = (copy(&p0), copy(&p1));
        let cat = b.concatenate(&[&c0, &c1], 0).annotate(sh("(_, x)"));
        (vec![cat], [c0, c1])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&c0, "(_, x)"), (&c1, "(_, x)")]);
}

/// A dynamic slice of one row (dim 1) of an [11,13,15] copy split `[1,1,2]`: XLA
/// expects the slice `[1,1,2]`.
fn dynamic_slice_forward_pass() {
    let (p, [ds]) = build_with("dynamic_slice_forward", |b| {
        let a = param(b, "a", &[11, 13, 15], None);
        let c = copy(&a).annotate(sh("(_, _, x)"));
        let (i0, i) = (index(b, "zero"), index(b, "i"));
        let ds = c.dynamic_slice(&[&i0, &i, &i0], &[11, 1, 15]);
        (vec![ds.clone()], [ds])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&ds, "(_, _, x)")]);
}

/// The dynamic slice split `[1,1,2]`: XLA gives its operand's copy `[1,1,2]`.
fn dynamic_slice_backward_pass() {
    let (p, [c]) = build_with("dynamic_slice_backward", |b| {
        let a = param(b, "a", &[11, 13, 15], None);
        let c = copy(&a);
        let (i0, i) = (index(b, "zero"), index(b, "i"));
        let ds = c
            .dynamic_slice(&[&i0, &i, &i0], &[11, 1, 15])
            .annotate(sh("(_, _, x)"));
        (vec![ds], [c])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&c, "(_, _, x)")]);
}

/// A dynamic update of one row (dim 1) of an [11,13,15] copy split `[1,1,2]`: XLA
/// gives the result and the update's copy `[1,1,2]`.
fn dynamic_update_slice_forward_pass_base() {
    let (p, [dus, c1]) = build_with("dynamic_update_slice_forward", |b| {
        let a = param(b, "a", &[11, 13, 15], None);
        let u = param(b, "u", &[11, 1, 15], None);
        let c0 = copy(&a).annotate(sh("(_, _, x)"));
        let c1 = copy(&u);
        let (i0, i) = (index(b, "zero"), index(b, "i"));
        let dus = c0.dynamic_update_slice(&c1, &[&i0, &i, &i0]);
        (vec![dus.clone()], [dus, c1])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&dus, "(_, _, x)"), (&c1, "(_, _, x)")]);
}

/// The dynamic update split `[1,1,2]`: XLA gives the operand's and the update's copies
/// `[1,1,2]`.
fn dynamic_update_slice_backward_pass() {
    let (p, [c0, c1]) = build_with("dynamic_update_slice_backward", |b| {
        let a = param(b, "a", &[11, 13, 15], None);
        let u = param(b, "u", &[11, 1, 15], None);
        let (c0, c1) = (copy(&a), copy(&u));
        let (i0, i) = (index(b, "zero"), index(b, "i"));
        let dus = c0
            .dynamic_update_slice(&c1, &[&i0, &i, &i0])
            .annotate(sh("(_, _, x)"));
        (vec![dus], [c0, c1])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&c0, "(_, _, x)"), (&c1, "(_, _, x)")]);
}

/// The lookup of XLA's gather tests: rows of a [2,9] operand by a vector of 3 indices
/// (`offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}`).
fn row_lookup() -> GatherDims {
    GatherDims {
        offset_dims: vec![1],
        collapsed_slice_dims: vec![0],
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        start_index_map: vec![0],
        index_vector_dim: 1,
        slice_sizes: vec![1, 9],
    }
}

/// A gather of [1,1,9] windows from a replicated [2,2,9] operand by [2,3,4] indices
/// (index vectors along dim 0) split `[1,2,1]`: XLA gives the [3,4,9] result `[2,1,1]`.
fn gather_from_index() {
    let (p, [g]) = build_with("gather_from_index", |b| {
        let input = param(b, "input", &[2, 2, 9], Some("(_, _, _)"));
        let indices = b
            .parameter("indices", vec![2, 3, 4], DType::I32)
            .annotate(sh("(_, x, _)"));
        let dims = GatherDims {
            offset_dims: vec![2],
            collapsed_slice_dims: vec![0, 1],
            operand_batching_dims: vec![],
            start_indices_batching_dims: vec![],
            start_index_map: vec![0, 1],
            index_vector_dim: 0,
            slice_sizes: vec![1, 1, 9],
        };
        let g = input.gather(&indices, &dims);
        (vec![copy(&g)], [g])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&g, "(x, _, _)")]);
}

/// Rows of a [2,9] operand split `[1,2]` (the window dim) by replicated indices: XLA
/// gives the [3,9] result `[1,2]`.
fn gather_from_data_operand() {
    let (p, [g]) = build_with("gather_from_data_operand", |b| {
        let input = param(b, "input", &[2, 9], Some("(_, x)"));
        let indices = b
            .parameter("indices", vec![3], DType::I32)
            .annotate(sh("(_)"));
        let g = input.gather(&indices, &row_lookup());
        (vec![copy(&g)], [g])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&g, "(_, x)")]);
}

/// The gather split `[2,1]` from a replicated operand: XLA gives the indices' copy
/// `[2]`.
fn gather_to_index() {
    let (p, [indices]) = build_with("gather_to_index", |b| {
        let input = param(b, "input", &[2, 9], Some("(_, _)"));
        let p1 = b.parameter("p1", vec![3], DType::I32);
        let indices = p1.abs();
        let g = input.gather(&indices, &row_lookup()).annotate(sh("(x, _)"));
        (vec![g], [indices])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&indices, "(x)")]);
}

/// The gather split `[1,2]` with replicated indices: XLA gives the operand's copy
/// `[1,2]`.
fn gather_to_data_operand() {
    let (p, [input]) = build_with("gather_to_data_operand", |b| {
        let p0 = param(b, "p0", &[2, 9], None);
        let input = copy(&p0);
        let indices = b
            .parameter("indices", vec![3], DType::I32)
            .annotate(sh("(_)"));
        let g = input.gather(&indices, &row_lookup()).annotate(sh("(_, x)"));
        (vec![g], [input])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&input, "(_, x)")]);
}

/// A 1x1 convolution `bf0_oi0->bf0` of a [3,2,3] input annotated replicated: XLA
/// leaves the output replicated.
fn replicated_convolution_lhs() {
    let labels = ["NCW", "OIW", "NCW"];
    conv_1d(
        "replicated_convolution_lhs",
        (&[3, 2, 3], "(_, _, _)"),
        &[2, 2, 1],
        labels,
        1,
        1,
        2,
        "(_, _, _)",
    );
}

/// A 1-D convolution `b0f_0io->b0f` with a window of 3 dilated by 16 over an [8,64,2]
/// input split 4 ways on its spatial dim: XLA expects the [8,32,2] output split alike
/// (the partitioner then gathers the input: each window spans 33 rows, more than one
/// neighbour's 16).
fn forward_convolution_large_dilation_forward_pass() {
    let labels = ["NWC", "WIO", "NWC"];
    conv_1d(
        "forward_convolution_large_dilation",
        (&[8, 64, 2], "(_, x, _)"),
        &[3, 2, 2],
        labels,
        1,
        16,
        4,
        "(_, x, _)",
    );
}

/// The [11,17] operand split `[2,2,2] last_tile_dim_replicate` (8 devices, the minor
/// axis replicated) padded with interior padding: XLA expects the pad split alike.
fn partial_replicated_pad_forward_pass() {
    let (p, [pad]) = build_with("partial_replicated_pad", |b| {
        let a = param(b, "a", &[11, 17], Some("(x, y)"));
        let pad = pad_11x17(&a, b);
        (vec![copy(&pad)], [pad])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2), ("y", 2), ("z", 2)]));
    assert_shardings(&p, &exe, &[(&pad, "(x, y)")]);
}

/// The strided slice of [`strided_slice`] on `[2,1,2] last_tile_dim_replicate`: XLA
/// expects the slice split alike.
fn partial_replicated_strided_slice() {
    let (p, [s]) = build_with("partial_replicated_strided_slice", |b| {
        let a = param(b, "a", &[17, 13], Some("(x, _)"));
        let s = a.slice(&[1, 5], &[15, 10], &[2, 1]);
        (vec![copy(&s)], [s])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&s, "(x, _)")]);
}

/// [`reshape_forward_pass`] on `[2,1,2] last_tile_dim_replicate`: XLA expects
/// `[2,1,1,2] last_tile_dim_replicate`.
fn partial_replicate_reshape_forward_pass() {
    let (p, [r]) = build_with("partial_replicate_reshape_forward", |b| {
        let a = param(b, "a", &[1430, 1], Some("(x, _)"));
        let r = a.reshape([10, 11, 13]);
        (vec![copy(&r)], [r])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&r, "(x, _, _)")]);
}

/// [`reshape_backward_pass`] with the reshape `[2,1,1,2] last_tile_dim_replicate`: XLA
/// gives the operand `[2,1,2] last_tile_dim_replicate`.
fn partial_replicate_reshape_backward_pass() {
    let (p, [c]) = build_with("partial_replicate_reshape_backward", |b| {
        let a = param(b, "a", &[2002, 1], None);
        let c = copy(&a);
        let r = c.reshape([14, 11, 13]).annotate(sh("(x, _, _)"));
        (vec![r], [c])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&c, "(x, _)")]);
}

/// A 5x5 convolution `b01f_01io->b01f` of a [128,5,5,128] input into a
/// [128,1,1,768] output split on its size-1 spatial dim: nothing to split backwards,
/// XLA leaves both operands' copies replicated (batch and features scaled to 8).
fn conv_as_dot_on_trivial_dims_backward() {
    let (p, [lhs, rhs]) = build_with("conv_as_dot_backward", |b| {
        let p0 = param(b, "p0", &[8, 5, 5, 8], None);
        let p1 = param(b, "p1", &[5, 5, 8, 8], None);
        let (lhs, rhs) = (copy(&p0), copy(&p1));
        let conv = lhs
            .conv2d(&rhs, [1, 1], Padding::Valid)
            .annotate(sh("(_, x, _, _)"));
        (vec![copy(&conv)], [lhs, rhs])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    let whole = "(_, _, _, _)";
    assert_shardings(&p, &exe, &[(&lhs, whole), (&rhs, whole)]);
}

/// A 7x7 stride-2 convolution (padding 3) of an input split on its features over the
/// major axis (`[1,1,1,2,2] last_tile_dim_replicate`) with a kernel split `[1,1,2,2]`
/// (input features major, output features minor): XLA gives the output the kernel's
/// output-feature split, `[1,1,1,2,2]0,2,1,3 last_tile_dim_replicate` (batch 128 and
/// spatial 112 scaled to 2 and 8).
fn convolution_filter_ifof_partitioned_input_partial_replicate() {
    let (p, [conv]) = build_with("convolution_filter_ifof", |b| {
        let p0 = param(b, "lhs", &[2, 8, 8, 12], None);
        let p1 = param(b, "rhs", &[7, 7, 12, 64], None);
        let lhs = copy(&p0).annotate(sh("(_, _, _, x)"));
        let rhs = copy(&p1).annotate(sh("(_, _, x, y)"));
        let padding = Padding::Explicit(vec![(3, 3), (3, 3)]);
        let conv = lhs.conv2d(&rhs, [2, 2], padding);
        (vec![copy(&conv)], [conv])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&conv, "(_, _, _, y)")]);
}

/// `bij,bkj->bik` with both operands split `[2,2,2]` (8 devices): the rhs's `k` would
/// need the axis the lhs's `i` holds, so XLA gives the product the lhs's `[2,2,1,2]
/// last_tile_dim_replicate`.
fn dot_merge_operands2() {
    dot_merge("dot_merge_operands2", "(x, y, z)", "(x, y, z)", "(x, y, _)");
}

/// A dynamic update of one row whose update's copy is split `[1,1,2]`: XLA gives the
/// result and the operand's copy `[1,1,2]`.
fn dynamic_update_slice_forward_pass_update() {
    let (p, [dus, c0]) = build_with("dynamic_update_slice_update", |b| {
        let a = param(b, "a", &[11, 13, 15], None);
        let u = param(b, "u", &[11, 1, 15], None);
        let c0 = copy(&a);
        let c1 = copy(&u).annotate(sh("(_, _, x)"));
        let (i0, i) = (index(b, "zero"), index(b, "i"));
        let dus = c0.dynamic_update_slice(&c1, &[&i0, &i, &i0]);
        (vec![dus.clone()], [dus, c0])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&dus, "(_, _, x)"), (&c0, "(_, _, x)")]);
}

/// Rows of a replicated [2,9] operand by indices split `[2,2]
/// last_tile_dim_replicate`: XLA gives the [3,9] result `[2,1,2]
/// last_tile_dim_replicate`.
fn gather_from_index_partial_replicate() {
    let (p, [g]) = build_with("gather_from_index_partial", |b| {
        let input = param(b, "input", &[2, 9], Some("(_, _)"));
        let indices = b
            .parameter("indices", vec![3], DType::I32)
            .annotate(sh("(x)"));
        let g = input.gather(&indices, &row_lookup());
        (vec![copy(&g)], [g])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&g, "(x, _)")]);
}

/// [`gather_from_data_operand`] with the operand `[1,2,2] last_tile_dim_replicate`:
/// XLA gives the result `[1,2,2] last_tile_dim_replicate`.
fn gather_from_data_operand_partial_replicate() {
    let (p, [g]) = build_with("gather_from_data_operand_partial", |b| {
        let input = param(b, "input", &[2, 9], Some("(_, x)"));
        let indices = b
            .parameter("indices", vec![3], DType::I32)
            .annotate(sh("(_)"));
        let g = input.gather(&indices, &row_lookup());
        (vec![copy(&g)], [g])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    assert_shardings(&p, &exe, &[(&g, "(_, x)")]);
}

/// A gather of [1,1,4] windows from a replicated [2,4819,4] operand by [2,2,1000]
/// indices (index vectors along dim 1), the [2,1000,4] result split `[1,2,1]`: XLA
/// gives the indices' copy `[1,1,2]` (4819 and 1000 scaled to 37 and 10).
fn gather_to_index3() {
    let (p, [indices]) = build_with("gather_to_index3", |b| {
        let input = param(b, "input", &[2, 37, 4], Some("(_, _, _)"));
        let p1 = b.parameter("p1", vec![2, 2, 10], DType::I32);
        let indices = p1.abs();
        let dims = GatherDims {
            offset_dims: vec![2],
            collapsed_slice_dims: vec![0, 1],
            operand_batching_dims: vec![],
            start_indices_batching_dims: vec![],
            start_index_map: vec![0, 1],
            index_vector_dim: 1,
            slice_sizes: vec![1, 1, 4],
        };
        let g = input.gather(&indices, &dims).annotate(sh("(_, x, _)"));
        (vec![g], [indices])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&indices, "(_, _, x)")]);
}

/// The scatter-add of XLA's scatter tests: rows of [3,9] updates into a [2,9] operand
/// at `indices` (`update_window_dims={1}, inserted_window_dims={0}`), index vectors
/// along `index_vector_dim`.
fn row_scatter(
    input: &Tensor,
    indices: &Tensor,
    updates: &Tensor,
    index_vector_dim: usize,
) -> Tensor {
    let dims = ScatterDims {
        update_window_dims: vec![1],
        inserted_window_dims: vec![0],
        input_batching_dims: vec![],
        scatter_indices_batching_dims: vec![],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim,
    };
    input
        .scatter_add(indices, updates, &dims)
        .annotate(sh("(_, _)"))
}

/// A replicated scatter-add whose updates are split `[2,1]` along their rows, the
/// [1,3] indices (index vectors along dim 0) a copy: XLA gives the indices `[1,2]`.
fn scatter_update_to_index2() {
    let (p, [indices]) = build_with("scatter_update_to_index2", |b| {
        let input = param(b, "input", &[2, 9], Some("(_, _)"));
        let p1 = b
            .parameter("p1", vec![1, 3], DType::I32)
            .annotate(sh("(_, _)"));
        let indices = p1.abs();
        let updates = param(b, "updates", &[3, 9], Some("(x, _)"));
        (vec![row_scatter(&input, &indices, &updates, 0)], [indices])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&indices, "(_, x)")]);
}

/// A replicated scatter-add with indices split `[2]`, the updates a copy of a
/// replicated parameter: XLA gives the updates `[2,1]`.
fn scatter_index_to_update() {
    let (p, [updates]) = build_with("scatter_index_to_update", |b| {
        let input = param(b, "input", &[2, 9], Some("(_, _)"));
        let indices = b
            .parameter("indices", vec![3], DType::I32)
            .annotate(sh("(x)"));
        let p2 = param(b, "p2", &[3, 9], Some("(_, _)"));
        let updates = copy(&p2);
        (vec![row_scatter(&input, &indices, &updates, 1)], [updates])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_shardings(&p, &exe, &[(&updates, "(x, _)")]);
}

/// Copies of two [2,9] operands split on different dims over different axes (`[1,2,2]`
/// and `[2,1,2]0,2,1,3`, both `last_tile_dim_replicate`) meet in an add: XLA merges the
/// two into `[2,2]0,2,1,3` for both copies and the add.
fn partial_sharding_on_elementwise() {
    let (p, [lhs, rhs, sum]) = build_with("partial_sharding_on_elementwise", |b| {
        let p0 = param(b, "p0", &[2, 9], Some("(_, x)"));
        let p1 = param(b, "p1", &[2, 9], Some("(y, _)"));
        let (lhs, rhs) = (copy(&p0), copy(&p1));
        let sum = &lhs + &rhs;
        (vec![copy(&sum)], [lhs, rhs, sum])
    });
    let exe = compile_and_check(&p, &mesh_2x2());
    let merged = "(y, x)";
    assert_shardings(&p, &exe, &[(&lhs, merged), (&rhs, merged), (&sum, merged)]);
}

/// [`transpose_forward_pass`] on 8 devices with the minor axis replicated (`[2,1,2,2]
/// last_tile_dim_replicate`): XLA expects `[1,2,2,2]0,1,4,5,2,3,6,7
/// last_tile_dim_replicate`, i.e. dim 1 over the middle axis and dim 2 the major one.
fn partial_sharding_transpose_forward_pass() {
    let (p, [t]) = build_with("partial_sharding_transpose_forward", |b| {
        let a = param(b, "a", &[7, 11, 13], Some("(x, _, y)"));
        let t = a.transpose(&[1, 2, 0]);
        (vec![copy(&t)], [t])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2), ("y", 2), ("z", 2)]));
    assert_shardings(&p, &exe, &[(&t, "(_, y, x)")]);
}

/// [`transpose_backward_pass`] on 8 devices, the transpose `[1,2,2,2]
/// last_tile_dim_replicate`: XLA gives the copy `[2,1,2,2]0,1,4,5,2,3,6,7
/// last_tile_dim_replicate`.
fn partial_sharding_transpose_backward_pass() {
    let (p, [c]) = build_with("partial_sharding_transpose_backward", |b| {
        let a = param(b, "a", &[7, 11, 13], None);
        let c = copy(&a);
        let t = c.transpose(&[1, 2, 0]).annotate(sh("(_, x, y)"));
        (vec![t], [c])
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2), ("y", 2), ("z", 2)]));
    assert_shardings(&p, &exe, &[(&c, "(y, _, x)")]);
}
