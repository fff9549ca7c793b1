//! Goldens of the propagation barrier (Shardy's `sdy.propagation_barrier`): shardings
//! cross it only in its allowed direction, the partitioner reshards where its two sides
//! differ, and `BOTH` is an error at the user's line. Each program runs on the 2x4
//! thread mesh against the reference interpreter.

#[allow(dead_code)] // the harness's case list and verdicts serve the peer suites
#[path = "peers/harness.rs"]
mod harness;

use gspmd_core::Error;
use gspmd_core::ir::{Builder, CollectiveKind, DType, PropagationDirection as D};
use harness::{build, compile_and_check, mesh, param, sh, sharding_of};

/// `x` is annotated `(data, model)`; its users sit behind a barrier. `Forward` lets the
/// layout through (no communication); `Backward` and `None` keep the far side
/// replicated, so the barrier gathers `x`, one all-gather per split dim (of its 128
/// elements each device holds 16: 112 received, 448 bytes).
#[test]
fn a_barrier_keeps_a_layout_from_its_far_side_and_reshards_there() {
    let m = mesh(&[("data", 2), ("model", 4)]);
    for (allowed, y_want, all_gathers, bytes) in [
        (D::Forward, "(data, model)", 0, 0),
        (D::Backward, "(_, _)", 2, 112 * 4),
        (D::None, "(_, _)", 2, 112 * 4),
    ] {
        let mut y = None;
        let p = build("barrier", |b| {
            let x = param(b, "x", &[8, 16], Some("(data, model)"));
            let t = x.propagation_barrier(allowed);
            y = Some(t.clone());
            vec![t.exp()]
        });
        let exe = compile_and_check(&p, &m);
        assert_eq!(
            sharding_of(&exe, y.as_ref().unwrap()),
            y_want,
            "{allowed:?}"
        );
        let stats = exe.spmd().collectives();
        assert_eq!(
            (
                stats.count(CollectiveKind::AllGather),
                stats.total(),
                stats.bytes()
            ),
            (all_gathers, all_gathers, bytes),
            "{allowed:?}\n{}",
            exe.report()
        );
    }
}

/// A `Forward` barrier after a matmul keeps the output's layout (rows on `model`) from
/// reaching the matmul (Shardy's `@reshard_dot_result_to_match_lhs_with_barrier` does
/// the same with a `BACKWARD` barrier on the lhs): the matmul keeps the rows on `data`
/// that its lhs gives it, and the output gets exactly its annotation.
#[test]
fn a_forward_barrier_keeps_the_producer_on_its_operands_layout() {
    let m = mesh(&[("data", 2), ("model", 4)]);
    let mut t = Vec::new();
    let p = build("producer", |b| {
        let x = param(b, "x", &[8, 16], Some("(data, _)"));
        let w = param(b, "w", &[16, 8], Some("(_, _)"));
        let h = x.matmul(&w);
        let y = h
            .propagation_barrier(D::Forward)
            .tanh()
            .shard(sh("(model, _)"));
        t = vec![h, y.clone()];
        vec![y]
    });
    let exe = compile_and_check(&p, &m);
    assert_eq!(sharding_of(&exe, &t[0]), "(data, _)");
    assert_eq!(sharding_of(&exe, &t[1]), "(model, _)");
}

/// In a `shard_map` body (a per-device program propagated over the automatic axes) a
/// barrier of each direction partitions and runs like the reference.
#[test]
fn a_barrier_in_a_manual_region_runs_like_the_reference() {
    let m = mesh(&[("data", 2), ("model", 4)]);
    for allowed in [D::Forward, D::Backward, D::None] {
        let p = build("manual", |b| {
            let x = param(b, "x", &[8, 16], Some("(data, ?)"));
            let w = param(b, "w", &[16, 4], None);
            let ins = [sh("(_, model)"), sh("(model, _)")];
            let ys = b.shard_map(
                &m,
                &["model"],
                &[x, w],
                &ins,
                &[sh("(_, _)")],
                |_, blocks| {
                    let h = blocks[0].propagation_barrier(allowed).exp();
                    vec![h.matmul(&blocks[1]).psum(&["model"])]
                },
            );
            vec![ys[0].tanh()]
        });
        compile_and_check(&p, &m);
    }
}

/// `BOTH` would block nothing: a typed error naming the op and the user's line.
#[test]
fn a_barrier_allowing_both_directions_is_an_error_at_the_users_line() {
    let b = Builder::new("both");
    let x = b.parameter("x", vec![4], DType::F32);
    let line = line!() + 1;
    let y = x.propagation_barrier(D::Both);
    match b.finish(&[&y]) {
        Err(Error::Shape {
            op,
            location,
            message,
        }) => {
            assert_eq!(
                (op, location.file, location.line),
                ("propagation_barrier", file!(), line)
            );
            assert!(message.contains("BOTH"), "{message}");
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
}
