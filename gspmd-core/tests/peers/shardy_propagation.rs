//! Cases ported from `shardy/dialect/sdy/transforms/propagation/test/*.mlir`.
//!
//! Translation: Shardy's `[{"a"}, {"b", ?}]` is gspmd's `(a, b?)`, `{"a", "b"}` on one
//! dim `(a, b)`, a sub-axis `"a":(1)2` is `a:(1)2`, a priority `p1` is `@1`, and
//! `replicated={"a"}` is the same. An `sdy.sharding` on an op is that op's annotation;
//! a function result's sharding is a `sharding_constraint` on the returned value;
//! `sdy.sharding_constraint` is one too. Propagated shardings print closed (gspmd
//! closes every dim once propagation is done), so Shardy's `{"a", ?}` reads `a` here.
//! Where a Shardy test applies the same op twice to the same operands (which gspmd's
//! CSE would merge into one value before propagation), the second is another
//! elementwise op (`multiply` for `add`), which has the same sharding rule.

use gspmd_core::Executable;
use gspmd_core::ir::{DotDims, Program, Tensor};
use gspmd_core::sharding::Mesh;

use crate::harness::{
    Case, Verdict, assert_shardings, build_with, compile_and_check, mesh, no_more_than_peer, param,
    region_sharding_of, sh,
};

/// The ported cases, in the order of the peer's files.
pub const CASES: &[Case] = &[
    Case {
        source: "basic_propagation.mlir: @simple",
        verdict: Verdict::Agrees,
        check: simple,
    },
    Case {
        source: "basic_propagation.mlir: @closed_dim",
        verdict: Verdict::Agrees,
        check: closed_dim,
    },
    Case {
        source: "basic_propagation.mlir: @propagate_from_sharding_constraint",
        verdict: Verdict::Agrees,
        check: propagate_from_sharding_constraint,
    },
    Case {
        source: "basic_propagation.mlir: @propagate_to_sharding_constraint",
        verdict: Verdict::Agrees,
        check: propagate_to_sharding_constraint,
    },
    Case {
        source: "basic_propagation.mlir: @multi_axes",
        verdict: Verdict::Agrees,
        check: multi_axes,
    },
    Case {
        source: "basic_propagation.mlir: @multi_axes_conflict",
        verdict: Verdict::Better(
            "the larger conflict's axes win both adds: one permute per add where Shardy gathers",
        ),
        check: multi_axes_conflict,
    },
    Case {
        source: "basic_propagation.mlir: @multi_axes_some_axes_incompatible",
        verdict: Verdict::Agrees,
        check: multi_axes_some_axes_incompatible,
    },
    Case {
        source: "basic_propagation.mlir: @multi_axes_all_axes_incompatible",
        verdict: Verdict::Better(
            "an operand's replicated axis does not block the add: arg1 is sliced locally",
        ),
        check: multi_axes_all_axes_incompatible,
    },
    Case {
        source: "basic_propagation.mlir: @pointwise_size_one_axes",
        verdict: Verdict::Agrees,
        check: pointwise_size_one_axes,
    },
    Case {
        source: "basic_propagation.mlir: @slice_then_concat",
        verdict: Verdict::EqualBytes(
            "the one-row slice stays unsplit: the rotation is one wrapping shift of the argument",
        ),
        check: slice_then_concat,
    },
    Case {
        source: "basic_propagation.mlir: @reshape_merge_dim_only_major_most_factor_sharded",
        verdict: Verdict::Agrees,
        check: reshape_merge_dim_only_major_most_factor_sharded,
    },
    Case {
        source: "basic_propagation.mlir: @reshape_merge_dim_major_factor_fully_sharded",
        verdict: Verdict::Agrees,
        check: reshape_merge_dim_major_factor_fully_sharded,
    },
    Case {
        source: "basic_propagation.mlir: @reshape_merge_dim_major_factor_partially_sharded",
        verdict: Verdict::Agrees,
        check: reshape_merge_dim_major_factor_partially_sharded,
    },
    Case {
        source: "basic_propagation.mlir: @reshape_split_dim_single_axis_fully_shards_major_factor",
        verdict: Verdict::Agrees,
        check: reshape_split_dim_single_axis_fully_shards_major_factor,
    },
    Case {
        source: "basic_propagation.mlir: @reshape_split_dim_only_major_most_factor_sharded",
        verdict: Verdict::Agrees,
        check: reshape_split_dim_only_major_most_factor_sharded,
    },
    Case {
        source: "basic_propagation.mlir: @reshape_split_dim_single_axis_shards_both_factors",
        verdict: Verdict::Agrees,
        check: reshape_split_dim_single_axis_shards_both_factors,
    },
    Case {
        source: "basic_propagation.mlir: @reshape_split_and_merge_dims",
        verdict: Verdict::Agrees,
        check: reshape_split_and_merge_dims,
    },
    Case {
        source: "basic_propagation.mlir: @single_factor_non_divisible",
        verdict: Verdict::Agrees,
        check: single_factor_non_divisible,
    },
    Case {
        source: "basic_propagation.mlir: @single_factor_overflows",
        verdict: Verdict::Agrees,
        check: single_factor_overflows,
    },
    Case {
        source: "basic_propagation.mlir: @minor_most_factor_non_divisible",
        verdict: Verdict::Agrees,
        check: minor_most_factor_non_divisible,
    },
    Case {
        source: "basic_propagation.mlir: @merge_dim_minor_most_factor_non_divisible",
        verdict: Verdict::Agrees,
        check: merge_dim_minor_most_factor_non_divisible,
    },
    Case {
        source: "basic_propagation.mlir: @merge_dim_non_minor_most_factor_non_divisible",
        verdict: Verdict::Agrees,
        check: merge_dim_non_minor_most_factor_non_divisible,
    },
    Case {
        source: "basic_propagation.mlir: @merge_dim_non_minor_most_factor_propagate_sub_axis",
        verdict: Verdict::EqualBytes(
            "the merge carries `b` only; both plans gather the same rows (8 devices on 4 rows)",
        ),
        check: merge_dim_non_minor_most_factor_propagate_sub_axis,
    },
    Case {
        source: "user_priority_propagation.mlir: @no_priorities",
        verdict: Verdict::Agrees,
        check: no_priorities,
    },
    Case {
        source: "user_priority_propagation.mlir: @skipped_priorities",
        verdict: Verdict::Agrees,
        check: skipped_priorities,
    },
    Case {
        source: "user_priority_propagation.mlir: @arg_lower_priority_than_return_value",
        verdict: Verdict::Agrees,
        check: arg_lower_priority_than_return_value,
    },
    Case {
        source: "user_priority_propagation.mlir: @result_lower_priority_than_arg",
        verdict: Verdict::Agrees,
        check: result_lower_priority_than_arg,
    },
    Case {
        source: "user_priority_propagation.mlir: @result_higher_priority_than_arg",
        verdict: Verdict::Agrees,
        check: result_higher_priority_than_arg,
    },
    Case {
        source: "user_priority_propagation.mlir: @dim_with_lower_priority_gets_further_sharded_by_higher",
        verdict: Verdict::Agrees,
        check: dim_with_lower_priority_gets_further_sharded_by_higher,
    },
    Case {
        source: "user_priority_propagation.mlir: @different_priorities_with_closed_empty_dim",
        verdict: Verdict::Agrees,
        check: different_priorities_with_closed_empty_dim,
    },
    Case {
        source: "user_priority_propagation.mlir: @open_empty_dim_with_priority",
        verdict: Verdict::EqualBytes(
            "arg0's `b` runs on to the divide and arg3 is resharded instead of the first add",
        ),
        check: open_empty_dim_with_priority,
    },
    Case {
        source: "op_priority_propagation.mlir: @element_wise_over_dot_general",
        verdict: Verdict::Agrees,
        check: element_wise_over_dot_general,
    },
    Case {
        source: "op_priority_propagation.mlir: @element_wise_over_dot_general_flipped_op_order",
        verdict: Verdict::Agrees,
        check: element_wise_over_dot_general_flipped_op_order,
    },
    Case {
        source: "op_priority_propagation.mlir: @defer_backwards_propagation_for_op_with_multi_use_operand",
        verdict: Verdict::EqualBytes(
            "the argument takes the first result's split; the sine's chain is resharded instead",
        ),
        check: defer_backwards_propagation_for_op_with_multi_use_operand,
    },
    Case {
        source: "aggressive_propagation.mlir: @no_conflict",
        verdict: Verdict::Agrees,
        check: no_conflict,
    },
    Case {
        source: "aggressive_propagation.mlir: @fake_conflict_between_two_non_contracting_dims",
        verdict: Verdict::Agrees,
        check: fake_conflict_between_two_non_contracting_dims,
    },
    Case {
        source: "aggressive_propagation.mlir: @fake_conflict_between_contracting_and_non_contracting_dims",
        verdict: Verdict::Agrees,
        check: fake_conflict_between_contracting_and_non_contracting_dims,
    },
    Case {
        source: "aggressive_propagation.mlir: @fake_conflict_closed_dims",
        verdict: Verdict::Agrees,
        check: fake_conflict_closed_dims,
    },
    Case {
        source: "aggressive_propagation.mlir: @real_conflict_within_a_factor",
        verdict: Verdict::Better(
            "the add keeps one operand's split: one permute where Shardy gathers both operands",
        ),
        check: real_conflict_within_a_factor,
    },
    Case {
        source: "aggressive_propagation.mlir: @real_conflict_within_a_factor2",
        verdict: Verdict::Better(
            "the add keeps the first operand's `(a, b)`: only the second is resharded",
        ),
        check: real_conflict_within_a_factor2,
    },
    Case {
        source: "aggressive_propagation.mlir: @real_and_fake_conflicts",
        verdict: Verdict::Agrees,
        check: real_and_fake_conflicts,
    },
    Case {
        source: "propagation_pipeline.mlir: @sharding_constraint_applied",
        verdict: Verdict::EqualBytes(
            "the add stays split and its result is gathered at the constraint, not its operand",
        ),
        check: sharding_constraint_applied,
    },
    Case {
        source: "propagation_pipeline.mlir: @while_func_return",
        verdict: Verdict::Agrees,
        check: while_func_return,
    },
    Case {
        source: "propagation_pipeline.mlir: @while_body_propagate_block_arg",
        verdict: Verdict::Agrees,
        check: while_body_propagate_block_arg,
    },
    Case {
        source: "basic_propagation_manual_computation.mlir: @append_in_sharding_from_outside",
        verdict: Verdict::Agrees,
        check: append_in_sharding_from_outside,
    },
    Case {
        source: "basic_propagation_manual_computation.mlir: @append_out_sharding_from_outside",
        verdict: Verdict::Agrees,
        check: append_out_sharding_from_outside,
    },
];

/// Shardy's `@mesh_a_2_b_2`.
fn mesh_ab() -> Mesh {
    mesh(&[("a", 2), ("b", 2)])
}

/// The `@mesh = <["a"=2, "b"=2, "c"=2]>` of the priority tests.
fn mesh_abc() -> Mesh {
    mesh(&[("a", 2), ("b", 2), ("c", 2)])
}

/// `[8,8] x [8,n]` contracting lhs dim 1 with rhs dim 0 (`contracting_dims = [1] x [0]`).
fn matmul(lhs: &Tensor, rhs: &Tensor) -> Tensor {
    lhs.dot_general(
        rhs,
        DotDims {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contracting: vec![1],
            rhs_contracting: vec![0],
        },
    )
}

/// `add(arg0 [{"a"}, {"b"}], arg1)` then a matmul with `arg2` [8,16]: the add takes
/// `(a, b)`, the product `(a, _)`, and `arg2` the contracting dim's `b`.
fn simple() {
    let (p, [arg1, arg2, add, dot]) = build_with("simple", |b| {
        let arg0 = param(b, "arg0", &[8, 8], Some("(a, b)"));
        let arg1 = param(b, "arg1", &[8, 8], None);
        let arg2 = param(b, "arg2", &[8, 16], None);
        let add = &arg0 + &arg1;
        let dot = matmul(&add, &arg2);
        (vec![dot.clone()], [arg1, arg2, add, dot])
    });
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(
        &p,
        &exe,
        &[
            (&arg1, "(a, b)"),
            (&arg2, "(b, _)"),
            (&add, "(a, b)"),
            (&dot, "(a, _)"),
        ],
    );
}

/// A matmul of `[{"a"}, {}]` and `[{}, {"b"}]` whose own sharding `[{}, {?}]` closes
/// dim 0: only `b` comes in, on dim 1.
fn closed_dim() {
    let (p, [dot]) = build_with("closed_dim", |b| {
        let arg0 = param(b, "arg0", &[8, 8], Some("(a, _)"));
        let arg1 = param(b, "arg1", &[8, 16], Some("(_, b)"));
        let dot = matmul(&arg0, &arg1).annotate(sh("(_, ?)"));
        (vec![dot.clone()], [dot])
    });
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(&p, &exe, &[(&dot, "(_, b)")]);
}

/// A constraint `[{"a"}, {?}]` on an unannotated argument shards the argument and the
/// add after it `(a, _)`.
fn propagate_from_sharding_constraint() {
    let (p, [arg0, add]) = build_with("from_constraint", |b| {
        let arg0 = param(b, "arg0", &[8, 8], None);
        let c = arg0.shard(sh("(a, ?)"));
        let add = &c + &c;
        (vec![add.clone()], [arg0, add])
    });
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(&p, &exe, &[(&arg0, "(a, _)"), (&add, "(a, _)")]);
}

/// An open constraint `[{?}, {?}]` on an argument `[{"a"}, {}]` takes `(a, _)`.
fn propagate_to_sharding_constraint() {
    let (p, [c]) = build_with("to_constraint", |b| {
        let arg0 = param(b, "arg0", &[8, 8], Some("(a, _)"));
        let c = arg0.shard(sh("(?, ?)"));
        (vec![c.clone()], [c])
    });
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(&p, &exe, &[(&c, "(a, _)")]);
}

/// `[{"b", "a"}, {}]` plus `[{"b", ?}, {}]`: the open one is refined to `(b, a)`, and
/// the add and the matmul after it are `((b, a), _)`.
fn multi_axes() {
    let (p, [arg1, add, dot]) = build_with("multi_axes", |b| {
        let arg0 = param(b, "arg0", &[8, 8], Some("((b, a), _)"));
        let arg1 = param(b, "arg1", &[8, 8], Some("(b?, _)"));
        let arg2 = param(b, "arg2", &[8, 16], None);
        let add = &arg0 + &arg1;
        let dot = matmul(&add, &arg2);
        (vec![dot.clone()], [arg1, add, dot])
    });
    let exe = compile_and_check(&p, &mesh_ab());
    let ba = "((b, a), _)";
    assert_shardings(&p, &exe, &[(&arg1, ba), (&add, ba), (&dot, ba)]);
}

/// `(b, a) + (b, c)` agree on the prefix `b`, which Shardy gives the add; `(b, a) +
/// (a, b)` share no prefix and Shardy leaves that add replicated. gspmd gives both adds
/// the larger conflict's winner, `(b, a)`: each reshards one operand by a permute where
/// the peer gathers (twice, fully, for the replicated add).
fn multi_axes_conflict() {
    let program = |peer: bool| {
        build_with("multi_axes_conflict", |b| {
            let arg0 = param(b, "arg0", &[8, 8], Some("((b, a), _)"));
            let arg1 = param(b, "arg1", &[8, 8], Some("((b, c), _)"));
            let arg2 = param(b, "arg2", &[8, 8], Some("((a, b), _)"));
            let (mut add0, mut add1) = (&arg0 + &arg1, &arg0 + &arg2);
            if peer {
                add0 = add0.annotate(sh("(b, _)"));
                add1 = add1.annotate(sh("(_, _)"));
            }
            (vec![add0.clone(), add1.clone()], [add0, add1])
        })
    };
    let m = mesh_abc();
    let (p, [add0, add1]) = program(false);
    let exe = compile_and_check(&p, &m);
    assert_shardings(&p, &exe, &[(&add0, "((b, a), _)"), (&add1, "((b, a), _)")]);
    let (ours, peer) = no_more_than_peer(&exe, &program(true).0, &m);
    assert!(ours < peer, "{ours} vs {peer}");
}

/// Axes of size 1 count as axes: an argument `[{?}, {"a", "b", "c"}]` (a, c of size 1)
/// and an add `[{"d"}, {?}]` give both `(d, (a, b, c))`.
fn pointwise_size_one_axes() {
    let (p, [arg0, add]) = build_with("pointwise_size_one_axes", |b| {
        let arg0 = param(b, "arg0", &[4, 8], Some("(?, (a, b, c))"));
        let add = (&arg0 + &arg0).annotate(sh("(d, ?)"));
        (vec![add.clone()], [arg0, add])
    });
    let exe = compile_and_check(&p, &mesh(&[("a", 1), ("b", 2), ("c", 1), ("d", 2)]));
    let both = "(d, (a, b, c))";
    assert_shardings(&p, &exe, &[(&arg0, both), (&add, both)]);
}

/// A rotation by one row (`concatenate(x[1:8], x[0:1])`) of `[{"a", "b"}, {}]`: Shardy
/// gives both slices and the result `(a, b)` on the rotated dim. gspmd gives the
/// result and the long slice `(a, b)` but leaves the one-row slice unsplit: the
/// rotation is partitioned from `x` as one wrapping shift (neither slice is computed),
/// so the peer's plan moves no fewer bytes.
fn slice_then_concat() {
    let program = |peer: bool| {
        build_with("slice_then_concat", |b| {
            let arg0 = param(b, "arg0", &[8, 8], Some("((a, b), _)"));
            let mut s0 = arg0.slice(&[0, 0], &[1, 8], &[1, 1]);
            if peer {
                s0 = s0.annotate(sh("((a, b), _)"));
            }
            let s1 = arg0.slice(&[1, 0], &[8, 8], &[1, 1]);
            let cat = b.concatenate(&[&s1, &s0], 0);
            (vec![cat.clone()], [s0, s1, cat])
        })
    };
    let m = mesh_ab();
    let (p, [s0, s1, cat]) = program(false);
    let exe = compile_and_check(&p, &m);
    let ab = "((a, b), _)";
    assert_shardings(&p, &exe, &[(&s0, "(_, _)"), (&s1, ab), (&cat, ab)]);
    let (ours, peer) = no_more_than_peer(&exe, &program(true).0, &m);
    assert_eq!(ours, peer);
}

/// One reshape of an argument with `from` sharding on `mesh`, asserting the reshape's
/// sharding.
fn reshape_case(name: &str, mesh: Mesh, from: (&[usize], &str), to: (&[usize], &str)) {
    let (p, [r]) = build_with(name, |b| {
        let arg0 = param(b, "arg0", from.0, Some(from.1));
        let r = arg0.reshape(to.0);
        (vec![r.clone()], [r])
    });
    let exe = compile_and_check(&p, &mesh);
    assert_shardings(&p, &exe, &[(&r, to.1)]);
}

/// [2,4] `[{"a"}, {}]` merged into [8]: `a`.
fn reshape_merge_dim_only_major_most_factor_sharded() {
    reshape_case(
        "reshape_merge_major",
        mesh_ab(),
        (&[2, 4], "(a, _)"),
        (&[8], "(a)"),
    );
}

/// [2,4] `[{"a"}, {"b"}]` merged into [8]: the major factor is split whole, so both
/// axes merge, `(a, b)`.
fn reshape_merge_dim_major_factor_fully_sharded() {
    reshape_case(
        "reshape_merge_fully",
        mesh_ab(),
        (&[2, 4], "(a, b)"),
        (&[8], "((a, b))"),
    );
}

/// [4,4] `[{"a"}, {"b"}]` merged into [16]: the major factor is split only in part,
/// so only `a` carries over.
fn reshape_merge_dim_major_factor_partially_sharded() {
    reshape_case(
        "reshape_merge_partially",
        mesh_ab(),
        (&[4, 4], "(a, b)"),
        (&[16], "(a)"),
    );
}

/// [8] `[{"b", "a"}]` split into [2,4]: `b` shards the major factor whole, `a` goes to
/// the minor one.
fn reshape_split_dim_single_axis_fully_shards_major_factor() {
    reshape_case(
        "reshape_split_fully",
        mesh_ab(),
        (&[8], "((b, a))"),
        (&[2, 4], "(b, a)"),
    );
}

/// [16] `[{"b", "a"}]` split into [4,4]: both axes fit the major factor.
fn reshape_split_dim_only_major_most_factor_sharded() {
    reshape_case(
        "reshape_split_major",
        mesh_ab(),
        (&[16], "((b, a))"),
        (&[4, 4], "((b, a), _)"),
    );
}

/// [8] `[{"a"}]` (a of 4) split into [2,4]: `a` is cut into sub-axes, `a:(1)2` for
/// the major factor and `a:(2)2` for the minor one.
fn reshape_split_dim_single_axis_shards_both_factors() {
    reshape_case(
        "reshape_split_sub_axes",
        mesh(&[("a", 4), ("b", 2)]),
        (&[8], "(a)"),
        (&[2, 4], "(a:(1)2, a:(2)2)"),
    );
}

/// [8,4] `[{"c", "a"}, {"b"}]` (a of 4) reshaped to [2,16]: `c` shards the new major
/// dim, `a` and `b` merge into the other.
fn reshape_split_and_merge_dims() {
    reshape_case(
        "reshape_split_and_merge",
        mesh(&[("a", 4), ("b", 2), ("c", 2)]),
        (&[8, 4], "((c, a), b)"),
        (&[2, 16], "(c, (a, b))"),
    );
}

/// A dim of 4 over an axis of 3 (not dividing it) still propagates through an add.
fn single_factor_non_divisible() {
    let (p, [add]) = build_with("single_factor_non_divisible", |b| {
        let arg0 = param(b, "arg0", &[2, 4], Some("(_, a)"));
        let add = &arg0 + &arg0;
        (vec![add.clone()], [add])
    });
    let exe = compile_and_check(&p, &mesh(&[("a", 3)]));
    assert_shardings(&p, &exe, &[(&add, "(_, a)")]);
}

/// A dim of 2 over an axis of 4 (larger than the dim) still propagates through an add.
fn single_factor_overflows() {
    let (p, [add]) = build_with("single_factor_overflows", |b| {
        let arg0 = param(b, "arg0", &[2, 4], Some("(a, _)"));
        let add = &arg0 + &arg0;
        (vec![add.clone()], [add])
    });
    let exe = compile_and_check(&p, &mesh(&[("a", 4), ("b", 2)]));
    assert_shardings(&p, &exe, &[(&add, "(a, _)")]);
}

/// [8] over `a` of 6 split into [2,4]: `a:(1)2` shards the major factor and the rest,
/// `a:(2)3`, the minor one (which 3 does not divide).
fn minor_most_factor_non_divisible() {
    reshape_case(
        "minor_most_factor_non_divisible",
        mesh(&[("a", 6)]),
        (&[8], "(a)"),
        (&[2, 4], "(a:(1)2, a:(2)3)"),
    );
}

/// [2,4] `[{"a"}, {"b"}]` (b of 3) merged into [8]: the major factor is split whole by
/// `a`, so `b` follows on the minor one, `(a, b)`.
fn merge_dim_minor_most_factor_non_divisible() {
    reshape_case(
        "merge_minor_non_divisible",
        mesh(&[("a", 2), ("b", 3)]),
        (&[2, 4], "(a, b)"),
        (&[8], "((a, b))"),
    );
}

/// [2,4] `[{"a"}, {}]` (a of 3) merged into [8]: 3 does not divide the major factor
/// 2, so nothing propagates.
fn merge_dim_non_minor_most_factor_non_divisible() {
    reshape_case(
        "merge_major_non_divisible",
        mesh(&[("a", 3)]),
        (&[2, 4], "(a, _)"),
        (&[8], "(_)"),
    );
}

/// [4,4] `[{"b", "a"}, {}]` (a of 4) merged into [16]: Shardy gives the merge `b` and
/// `a:(1)2`, the sub-axis that fits the major factor. gspmd carries `b` only; with 8
/// devices on 4 rows the operand's blocks do not tile either result sharding, so both
/// plans all-gather the same rows.
fn merge_dim_non_minor_most_factor_propagate_sub_axis() {
    let program = |peer: bool| {
        build_with("merge_sub_axis", |b| {
            let arg0 = param(b, "arg0", &[4, 4], Some("((b, a), _)"));
            let mut r = arg0.reshape([16]);
            if peer {
                r = r.annotate(sh("((b, a:(1)2))"));
            }
            (vec![r.clone()], [r])
        })
    };
    let m = mesh(&[("a", 4), ("b", 2), ("c", 2)]);
    let (p, [r]) = program(false);
    let exe = compile_and_check(&p, &m);
    assert_shardings(&p, &exe, &[(&r, "(b)")]);
    let (ours, peer) = no_more_than_peer(&exe, &program(true).0, &m);
    assert_eq!(ours, peer);
}

/// The chain of the priority tests: `add0 = arg0 + arg1`, `add1 = add0 + arg2`,
/// `div = add1 / arg3` on [8,8]s, each argument and op annotated as `annotations` says
/// (`None`: not annotated), and the function result constrained to `result` when given.
struct Chain {
    args: [Option<&'static str>; 4],
    add0: Option<&'static str>,
    add1: Option<&'static str>,
    div: Option<&'static str>,
    result: Option<&'static str>,
}

impl Chain {
    /// The chain's program, its arguments 0..4 and its ops add0, add1, div.
    fn build(&self, name: &str) -> (Program, [Tensor; 7]) {
        build_with(name, |b| {
            let a: Vec<Tensor> = (0..4)
                .map(|k| param(b, &format!("arg{k}"), &[8, 8], self.args[k]))
                .collect();
            let note = |t: Tensor, s: Option<&str>| match s {
                Some(s) => t.annotate(sh(s)),
                None => t,
            };
            let add0 = note(&a[0] + &a[1], self.add0);
            let add1 = note(&add0 + &a[2], self.add1);
            let div = note(&add1 / &a[3], self.div);
            let out = match self.result {
                Some(s) => div.shard(sh(s)),
                None => div.clone(),
            };
            let [a0, a1, a2, a3] = [0, 1, 2, 3].map(|k| a[k].clone());
            (vec![out], [a0, a1, a2, a3, add0, add1, div])
        })
    }

    /// Compiles the chain on the a, b, c mesh, asserts the shardings of arguments 0..4
    /// and of add0, add1 and div (`None`: not checked), and returns the executable.
    #[track_caller]
    fn expect(&self, name: &str, args: [Option<&str>; 4], ops: [Option<&str>; 3]) -> Executable {
        let (p, values) = self.build(name);
        let exe = compile_and_check(&p, &mesh_abc());
        let wanted = args.iter().chain(&ops);
        let expected: Vec<(&Tensor, &str)> = values
            .iter()
            .zip(wanted)
            .filter_map(|(t, w)| w.map(|w| (t, w)))
            .collect();
        assert_shardings(&p, &exe, &expected);
        exe
    }
}

/// No priorities: `[{"a"}, {"b"}]` on arg0 reaches every value.
fn no_priorities() {
    let ab = Some("(a, b)");
    Chain {
        args: [ab, None, None, None],
        add0: None,
        add1: None,
        div: None,
        result: None,
    }
    .expect("no_priorities", [ab, ab, ab, ab], [ab, None, ab]);
}

/// Priorities 1 and 4 (none between): the divide's `c` (priority 1) wins dim 1 over
/// arg0's `b` (priority 4), which stays on arg0 only.
fn skipped_priorities() {
    let ac = Some("(a, c)");
    Chain {
        args: [Some("(a, b@4)"), None, None, None],
        add0: None,
        add1: None,
        div: Some("(?, c?@1)"),
        result: None,
    }
    .expect(
        "skipped_priorities",
        [Some("(a, b)"), ac, ac, ac],
        [ac, ac, ac],
    );
}

/// arg0 `[{"a", ?}p1, {"b"}p1]`, the divide `[{"c"}p0, {?}]`: the divide's `c` goes
/// first and takes dim 0 everywhere but arg0; arg0's `b` then fills dim 1.
fn arg_lower_priority_than_return_value() {
    let cb = Some("(c, b)");
    Chain {
        args: [Some("(a?@1, b@1)"), None, None, None],
        add0: None,
        add1: None,
        div: Some("(c@0, ?)"),
        result: None,
    }
    .expect(
        "arg_lower_priority",
        [Some("(a, b)"), cb, cb, cb],
        [cb, cb, cb],
    );
}

/// arg1 `[{"c"}p0, {?}]`, the result `[{"a", ?}p1, {"b"}p1]`: arg1's `c` takes dim 0
/// of every op; the result's `b` fills dim 1.
fn result_lower_priority_than_arg() {
    let cb = Some("(c, b)");
    Chain {
        args: [None, Some("(c@0, ?)"), None, None],
        add0: None,
        add1: None,
        div: None,
        result: Some("(a?@1, b@1)"),
    }
    .expect("result_lower_priority", [cb, cb, cb, cb], [cb, cb, cb]);
}

/// arg0 `[{"c", ?}p1, {?}]`, the result `[{"a"}p0, {"b"}p0]`: the result's axes reach
/// every op first; arg0 keeps `c` and takes `b`.
fn result_higher_priority_than_arg() {
    let (cb, ab) = (Some("(c, b)"), Some("(a, b)"));
    Chain {
        args: [Some("(c?@1, ?)"), None, None, None],
        add0: None,
        add1: None,
        div: None,
        result: Some("(a@0, b@0)"),
    }
    .expect("result_higher_priority", [cb, ab, ab, ab], [ab, ab, ab]);
}

/// arg0 `[{"b", ?}p1, {}]` feeds `arg0 + arg1`, then a divide `[{"c", ?}p0, {}]`, and
/// `arg0 + arg2` annotated `[{"b", "a", ?}p0, {}]`: at priority 0 arg0 is refined to
/// `(b, a)` and the first add takes the divide's `c`.
fn dim_with_lower_priority_gets_further_sharded_by_higher() {
    let (p, [arg0, arg1, arg2, add0, add1, div]) = build_with("further_sharded", |b| {
        let a: Vec<Tensor> = (0..4)
            .map(|k| param(b, &format!("arg{k}"), &[8, 8], None))
            .collect();
        let arg0 = a[0].annotate(sh("(b?@1, _)"));
        let add0 = &arg0 + &a[1];
        let add1 = (&arg0 + &a[2]).annotate(sh("((b, a)?@0, _)"));
        let div = (&add0 / &a[3]).annotate(sh("(c?@0, _)"));
        (
            vec![add1.clone(), div.clone()],
            [arg0, a[1].clone(), a[2].clone(), add0, add1, div],
        )
    });
    let exe = compile_and_check(&p, &mesh_abc());
    assert_shardings(
        &p,
        &exe,
        &[
            (&arg0, "((b, a), _)"),
            (&arg1, "(c, _)"),
            (&arg2, "((b, a), _)"),
            (&add0, "(c, _)"),
            (&add1, "((b, a), _)"),
            (&div, "(c, _)"),
        ],
    );
}

/// arg0 `[{"a"}p0, {"b"}p0]`, the second add `[{"c"}p1, {}]`: the first add takes
/// arg0's axes; the second keeps its own, and the divide and arg3 take `(c, _)`.
fn different_priorities_with_closed_empty_dim() {
    let ab = Some("(a, b)");
    let c = Some("(c, _)");
    Chain {
        args: [Some("(a@0, b@0)"), None, None, None],
        add0: None,
        add1: Some("(c@1, _)"),
        div: None,
        result: None,
    }
    .expect("closed_empty_dim", [ab, ab, None, c], [ab, c, c]);
}

/// arg0 `[{"a"}p0, {"b"}p0]` and arg3 `[{?}, {"c"}p0]`; the first add's own `[{?},
/// {?}p1]`: Shardy gives the first add arg0's axes and the second add and the divide
/// arg3's `(a, c)`, resharding the first add's result. gspmd lets arg0's `b` run on
/// to the divide and reshards arg3 instead: one permute of an [8,8] over `b`/`c`
/// either way.
fn open_empty_dim_with_priority() {
    let (ab, ac) = (Some("(a, b)"), Some("(a, c)"));
    let exe = Chain {
        args: [Some("(a@0, b@0)"), None, None, Some("(?, c@0)")],
        add0: Some("(?, ?@1)"),
        add1: None,
        div: None,
        result: None,
    }
    .expect("open_empty_dim", [ab, ab, ab, ac], [ab, ab, ab]);
    let peer = Chain {
        args: [ab, ab, ac, ac],
        add0: ab,
        add1: ac,
        div: ac,
        result: None,
    }
    .build("open_empty_dim_peer")
    .0;
    let (ours, peer) = no_more_than_peer(&exe, &peer, &mesh_abc());
    assert_eq!(ours, peer);
}

/// arg0 `[{"a", ?}, {?}]` meets, through a matmul, a result `[{?}, {"a", ?}]` behind
/// two adds. Elementwise ops go first, so the product takes the result's `(_, a)` and
/// arg0's `a` stays out of it (it would need `a` twice).
fn element_wise_over_dot_general() {
    let (p, [arg1, dot]) = build_with("element_wise_over_dot", |b| {
        let arg0 = param(b, "arg0", &[8, 8], Some("(a?, ?)"));
        let arg1 = param(b, "arg1", &[8, 8], None);
        let dot = matmul(&arg0, &arg1);
        let add1 = &dot + &dot;
        let add2 = &add1 + &add1;
        (vec![add2.shard(sh("(?, a?)"))], [arg1, dot])
    });
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(&p, &exe, &[(&arg1, "(_, a)"), (&dot, "(_, a)")]);
}

/// As [`element_wise_over_dot_general`] with the adds before the matmul (on each
/// operand): the product still takes the result's `(_, a)`.
fn element_wise_over_dot_general_flipped_op_order() {
    let (p, [add1, add2, dot]) = build_with("element_wise_over_dot_flipped", |b| {
        let arg0 = param(b, "arg0", &[8, 8], Some("(a?, ?)"));
        let arg1 = param(b, "arg1", &[8, 8], None);
        let add1 = &arg0 + &arg0;
        let add2 = &arg1 + &arg1;
        let dot = matmul(&add1, &add2);
        (vec![dot.shard(sh("(?, a?)"))], [add1, add2, dot])
    });
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(
        &p,
        &exe,
        &[(&add1, "(a, _)"), (&add2, "(_, a)"), (&dot, "(_, a)")],
    );
}

/// An unannotated argument read by two elementwise ops, one returned as `[{}, {"a"}]`,
/// the other through a sine returned as `[{"a"}, {}]`: Shardy gives the argument
/// `(a, _)` from the sine's chain and reshards it for the first result; gspmd gives it
/// the first result's `(_, a)` and reshards it for the sine's chain: one all-to-all
/// of the argument either way.
fn defer_backwards_propagation_for_op_with_multi_use_operand() {
    let program = |peer: bool| {
        build_with("defer_backward_multi_use", |b| {
            let arg0 = param(b, "arg0", &[8, 8], peer.then_some("(a, _)"));
            let (add1, add2) = (&arg0 + &arg0, &arg0 * &arg0);
            let outs = vec![add2.shard(sh("(_, a)")), add1.sin().shard(sh("(a, _)"))];
            (outs, [arg0, add1, add2])
        })
    };
    let m = mesh_ab();
    let (p, [arg0, add1, add2]) = program(false);
    let exe = compile_and_check(&p, &m);
    assert_shardings(
        &p,
        &exe,
        &[(&arg0, "(_, a)"), (&add1, "(a, _)"), (&add2, "(_, a)")],
    );
    let (ours, peer) = no_more_than_peer(&exe, &program(true).0, &m);
    assert_eq!(ours, peer);
}

/// As `@simple` under the aggressive strategy: no conflict, the same shardings.
fn no_conflict() {
    simple();
}

/// `[256,512] x [128,512]^T` with the lhs `[{"a", ?}, {?}]` and the product `[{?},
/// {"a", ?}]`: `a` cannot split both of the product's dims; the product keeps its own
/// and the rhs takes `a` on its rows (shapes scaled to [16,16] x [8,16]).
fn fake_conflict_between_two_non_contracting_dims() {
    let (p, [arg1, dot]) = build_with("fake_conflict_non_contracting", |b| {
        let arg0 = param(b, "arg0", &[16, 16], Some("(a?, ?)"));
        let arg1 = param(b, "arg1", &[8, 16], None);
        let dot = arg0
            .dot_general(&arg1, transposed_rhs())
            .annotate(sh("(?, a?)"));
        (vec![dot.clone()], [arg1, dot])
    });
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(&p, &exe, &[(&arg1, "(a, _)"), (&dot, "(_, a)")]);
}

/// `lhs · rhs^T` (`contracting_dims = [1] x [1]`).
fn transposed_rhs() -> DotDims {
    DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contracting: vec![1],
        rhs_contracting: vec![1],
    }
}

/// `[{"a"}, {"b", "c"}] x ([{"c", "b"}, {"a"}])^T`: the contracting dims disagree, but
/// each operand's free dim is unrivalled: the product is `(a, (c, b))` (shapes scaled
/// to [16,16] x [8,16]).
fn fake_conflict_between_contracting_and_non_contracting_dims() {
    let (p, [dot]) = build_with("fake_conflict_contracting", |b| {
        let arg0 = param(b, "arg0", &[16, 16], Some("(a, (b, c))"));
        let arg1 = param(b, "arg1", &[8, 16], Some("((c, b), a)"));
        let dot = arg0.dot_general(&arg1, transposed_rhs());
        (vec![dot.clone()], [dot])
    });
    let exe = compile_and_check(&p, &mesh_abc());
    assert_shardings(&p, &exe, &[(&dot, "(a, (c, b))")]);
}

/// `[{"a", ?}, {"b"}] + [{}, {"b", "c", ?}]`: the add takes `a` from the first and the
/// longer `(b, c)` from the second.
fn fake_conflict_closed_dims() {
    let (p, [add]) = build_with("fake_conflict_closed_dims", |b| {
        let arg0 = param(b, "arg0", &[8, 8], Some("(a?, b)"));
        let arg1 = param(b, "arg1", &[8, 8], Some("(_, (b, c)?)"));
        let add = &arg0 + &arg1;
        (vec![add.clone()], [add])
    });
    let exe = compile_and_check(&p, &mesh_abc());
    assert_shardings(&p, &exe, &[(&add, "(a, (b, c))")]);
}

/// `[{"a", ?}, {}] + [{"b", ?}, {}]`: the operands disagree on dim 0 and Shardy leaves
/// the add replicated. gspmd gives it the first operand's `(a, _)` and reshards the
/// second by one permute (128 bytes per device), where the peer gathers both (256).
fn real_conflict_within_a_factor() {
    let program = |peer: bool| {
        build_with("real_conflict_within_a_factor", |b| {
            let arg0 = param(b, "arg0", &[8, 8], Some("(a?, _)"));
            let arg1 = param(b, "arg1", &[8, 8], Some("(b?, _)"));
            let mut add = &arg0 + &arg1;
            if peer {
                add = add.annotate(sh("(_, _)"));
            }
            (vec![add.clone()], [add])
        })
    };
    let m = mesh_abc();
    let (p, [add]) = program(false);
    let exe = compile_and_check(&p, &m);
    assert_shardings(&p, &exe, &[(&add, "(a, _)")]);
    let (ours, peer) = no_more_than_peer(&exe, &program(true).0, &m);
    assert!(ours < peer, "{ours} vs {peer}");
}

/// `[{"a"}, {"b"}] + [{}, {"a", "b", "c"}]`: dim 1 conflicts and Shardy gives the add
/// `(a, _)`. gspmd keeps the first operand's `(a, b)` and reshards the second only
/// (80 bytes per device against the peer's 188).
fn real_conflict_within_a_factor2() {
    let program = |peer: bool| {
        build_with("real_conflict_within_a_factor2", |b| {
            let arg0 = param(b, "arg0", &[8, 8], Some("(a, b)"));
            let arg1 = param(b, "arg1", &[8, 8], Some("(_, (a, b, c))"));
            let mut add = &arg0 + &arg1;
            if peer {
                add = add.annotate(sh("(a, _)"));
            }
            (vec![add.clone()], [add])
        })
    };
    let m = mesh_abc();
    let (p, [add]) = program(false);
    let exe = compile_and_check(&p, &m);
    assert_shardings(&p, &exe, &[(&add, "(a, b)")]);
    let (ours, peer) = no_more_than_peer(&exe, &program(true).0, &m);
    assert!(ours < peer, "{ours} vs {peer}");
}

/// `[{"a", ?}, {?}] + [{"b", ?}, {"a", ?}]`: dim 0 conflicts, dim 1 takes `a`.
fn real_and_fake_conflicts() {
    let (p, [add]) = build_with("real_and_fake_conflicts", |b| {
        let arg0 = param(b, "arg0", &[8, 8], Some("(a?, ?)"));
        let arg1 = param(b, "arg1", &[8, 8], Some("(b?, a?)"));
        let add = &arg0 + &arg1;
        (vec![add.clone()], [add])
    });
    let exe = compile_and_check(&p, &mesh_abc());
    assert_shardings(&p, &exe, &[(&add, "(_, a)")]);
}

/// A closed constraint `[{}, {}]` after an add of `[{"a"}, {}]`: Shardy replicates the
/// add (gathering its operand); gspmd keeps the add split and gathers its result at
/// the constraint: one all-gather of the same [8,8] either way.
fn sharding_constraint_applied() {
    let program = |peer: bool| {
        build_with("sharding_constraint_applied", |b| {
            let arg0 = param(b, "arg0", &[8, 8], Some("(a, _)"));
            let mut add = &arg0 + &arg0;
            if peer {
                add = add.annotate(sh("(_, _)"));
            }
            (vec![add.shard(sh("(_, _)"))], [add])
        })
    };
    let m = mesh_ab();
    let (p, [add]) = program(false);
    let exe = compile_and_check(&p, &m);
    assert_shardings(&p, &exe, &[(&add, "(a, _)")]);
    let (ours, peer) = no_more_than_peer(&exe, &program(true).0, &m);
    assert_eq!(ours, peer);
}

/// The while loops of the pipeline tests: a [32,96] value carried with an i32 counter
/// for 32 iterations, the body's `add` of the value to itself annotated `body_add` and
/// passed through `neg` (Shardy's opaque `custom_call`) when `opaque`; the loop's value
/// result constrained to `result`. The body's add is named `sum`. Returns the program,
/// the argument and the loop's value result.
fn pipeline_while(
    name: &str,
    body_add: Option<&str>,
    opaque: bool,
    result: Option<&str>,
) -> (Program, [Tensor; 2]) {
    build_with(name, |b| {
        let arg0 = param(b, "arg0", &[32, 96], None);
        let zero = b.full(Vec::<usize>::new(), gspmd_core::ir::DType::I32, 0.0);
        let out = b.while_loop(
            |s| s[1].lt(&s[1].scalar_like(32.0)),
            |s| {
                let count = &s[1] + &s[1].scalar_like(1.0);
                let mut sum = (&s[0] + &s[0]).named("sum");
                if let Some(sharding) = body_add {
                    sum = sum.annotate(sh(sharding));
                }
                let next = if opaque { sum.neg() } else { sum };
                vec![next, count]
            },
            &[arg0.clone(), zero],
        );
        let value = match result {
            Some(s) => out[0].shard(sh(s)),
            None => out[0].clone(),
        };
        (vec![value, out[1].clone()], [arg0, out[0].clone()])
    })
}

/// A while loop whose value result is returned as `[{"a"}, {"b"}]`: the argument,
/// the loop and the body's add all take `(a, b)`.
fn while_func_return() {
    let (p, [arg0, out]) = pipeline_while("while_func_return", None, false, Some("(a, b)"));
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(&p, &exe, &[(&arg0, "(a, b)"), (&out, "(a, b)")]);
    assert_eq!(region_sharding_of(&exe, &out, 1, "sum"), "(a, b)");
}

/// A while loop whose body's add is annotated `[{"a"}, {"b"}]` (its result then through
/// an opaque op): the block argument, so the loop's operand and result, take `(a, b)`.
fn while_body_propagate_block_arg() {
    let (p, [arg0, out]) = pipeline_while("while_body_block_arg", Some("(a, b)"), true, None);
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(&p, &exe, &[(&arg0, "(a, b)"), (&out, "(a, b)")]);
}

/// The manual regions of the manual-computation tests: a [32,32] operand whose blocks
/// along `b` (manual) the body adds to themselves (the add named `sum`); the result
/// assembled along `b`. Returns the program, the argument and the region's result.
fn manual_add(name: &str, outside: &str, after: Option<&str>) -> (Program, [Tensor; 2]) {
    build_with(name, |b| {
        let arg0 = param(b, "arg0", &[32, 32], None);
        let input = (&arg0 + &arg0).annotate(sh(outside));
        let spec = sh("(b, _)");
        let out = b.shard_map(
            &mesh_ab(),
            &["b"],
            &[input],
            std::slice::from_ref(&spec),
            std::slice::from_ref(&spec),
            |_, x| vec![(&x[0] + &x[0]).named("sum").abs()],
        );
        let value = match after {
            Some(s) => (&out[0] + &out[0]).annotate(sh(s)),
            None => out[0].clone(),
        };
        (vec![value], [arg0, out[0].clone()])
    })
}

/// An operand `[{"b", "a", ?}, {?}]` of a region manual over `b`: the free axis `a`
/// enters the body, whose add takes `(a, _)`; the result stays `(b, _)`.
fn append_in_sharding_from_outside() {
    let (p, [arg0, out]) = manual_add("append_in_from_outside", "((b, a)?, ?)", None);
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(&p, &exe, &[(&arg0, "((b, a), _)"), (&out, "(b, _)")]);
    assert_eq!(region_sharding_of(&exe, &out, 0, "sum"), "(a, _)");
}

/// The region's result is used by an add `[{"b", "a", ?}, {?}]`: the free axis `a`
/// enters the result and, backwards, the body's values.
fn append_out_sharding_from_outside() {
    let (p, [_, out]) = manual_add("append_out_from_outside", "(b?, ?)", Some("((b, a)?, ?)"));
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(&p, &exe, &[(&out, "((b, a), _)")]);
    assert_eq!(region_sharding_of(&exe, &out, 0, "sum"), "(a, _)");
}

/// `[{"a", "b"}, {}] + arg1`, the add's own `[{?}, {"b", ?}]`: `b` is taken on dim 1,
/// so only `a` of the first operand's dim 0 carries over.
fn multi_axes_some_axes_incompatible() {
    let (p, [add]) = build_with("multi_axes_some_incompatible", |b| {
        let arg0 = param(b, "arg0", &[8, 8], Some("((a, b), _)"));
        let arg1 = param(b, "arg1", &[8, 8], None);
        let add = (&arg0 + &arg1).annotate(sh("(?, b?)"));
        (vec![add.clone()], [add])
    });
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(&p, &exe, &[(&add, "(a, b)")]);
}

/// As [`multi_axes_some_axes_incompatible`] with arg1 `[{?}, {?}], replicated={"a"}`:
/// Shardy takes `a` on an operand's explicitly replicated axis as a conflict and
/// leaves dim 0 of the add unsplit. gspmd's replication is the operand's own (it is
/// sliced locally), so the add keeps `(a, b)`: 32 bytes per device against the peer's
/// 96, which gathers arg0's dim 0.
fn multi_axes_all_axes_incompatible() {
    let program = |peer: bool| {
        build_with("multi_axes_all_incompatible", |b| {
            let arg0 = param(b, "arg0", &[8, 8], Some("((a, b), _)"));
            let arg1 = param(b, "arg1", &[8, 8], Some("(?, ?) replicated={a}"));
            let own = if peer { "(_, b)" } else { "(?, b?)" };
            let add = (&arg0 + &arg1).annotate(sh(own));
            (vec![add.clone()], [add])
        })
    };
    let (p, [add]) = program(false);
    let exe = compile_and_check(&p, &mesh_ab());
    assert_shardings(&p, &exe, &[(&add, "(a, b)")]);
    let (ours, peer) = no_more_than_peer(&exe, &program(true).0, &mesh_ab());
    assert!(ours < peer, "{ours} vs {peer}");
}
