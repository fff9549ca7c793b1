//! Collectives inside loop bodies count as often as they run, in every summary:
//! `collectives()`, the text report, the HTML page and the cost analysis agree, and the
//! partitioned programs still compute what the reference interpreter does.
//!
//! Counting rules under test ([`Runs`]): a scan body counts its trip count times (nested
//! loops multiply), a `while` body once and marked per iteration, both `cond` branches.
//!
//! Tolerance: |got - want| <= 1e-4 * max(1, max |want|) (f32 sums in another order).

mod differential;
mod loop_programs;

use std::collections::BTreeMap;

use differential::compile_and_check;
use gspmd_core::Executable;
use gspmd_core::analysis::DeviceModel;
use gspmd_core::ir::{CollectiveKind, DType, Flow, Literal};
use gspmd_core::partition::{CollectiveStats, Runs};
use loop_programs::{build, flows, inputs, mesh_2x2, nested_loops, own, sharded, while_loop};

/// `a + times * b`, kind by kind.
fn add(
    a: &mut BTreeMap<CollectiveKind, (usize, usize)>,
    b: &BTreeMap<CollectiveKind, (usize, usize)>,
    times: usize,
) {
    for (kind, (n, bytes)) in b {
        let e = a.entry(*kind).or_default();
        e.0 += times * n;
        e.1 += times * bytes;
    }
}

/// The report's and the HTML page's totals are `stats`', and the cost analysis has the
/// same bytes per kind (and the same counts: every collective here moves data).
fn summaries_agree(exe: &Executable, stats: &CollectiveStats) {
    let report = exe.report();
    let total = format!(
        "{:>18}: {:>4} x, {:>12} bytes received per device",
        "total",
        stats.total(),
        stats.bytes()
    );
    assert!(report.contains(&total), "{total}\n{report}");
    let html = exe.html();
    let headline = format!(
        "{} per step, {} bytes received per device",
        stats.total(),
        stats.bytes()
    );
    assert!(html.contains(&headline), "{headline}");
    for (kind, (n, bytes)) in &stats.by_kind {
        let chip = format!("{kind} × {n}: {bytes} B");
        assert!(html.contains(&chip), "{chip}");
    }
    let cost = exe.cost_analysis(&DeviceModel::this_machine());
    assert_eq!(cost.collectives, stats.by_kind, "{cost}");
}

/// An RNN step `h <- tanh(h @ w + x_t)` under a scan of 5 steps on a 2x2 mesh (the
/// weight split on `model`, the batch on `data`: the body gathers `h` back each step),
/// then a projection outside the loop needing an all-reduce: the totals are 5 times the
/// body's plus the outside ones, everywhere.
#[test]
fn a_scan_body_counts_once_per_iteration() {
    let steps = 5;
    let p = build("rnn", |b| {
        let xs = sharded(b, "xs", &[steps, 8, 16], "(_, data, _)");
        let h0 = sharded(b, "h0", &[8, 16], "(data, _)");
        let w = sharded(b, "w", &[16, 16], "(_, model)");
        let v = sharded(b, "v", &[16, 4], "(model, _)");
        let (h, _) = b.scan(&[xs], &[h0], |h, x| {
            (vec![h[0].matmul(&w).add(&x[0]).tanh()], vec![])
        });
        vec![h[0].matmul(&v)]
    });
    let mesh = mesh_2x2();
    let exe = compile_and_check(&p, &mesh, &inputs(&p, 0), 1e-4);
    let local = &exe.spmd().program;
    let scans = flows(local);
    assert_eq!(scans.len(), 1, "{local}");
    let Flow::Scan { body, length, .. } = scans[0] else {
        panic!("not a scan: {local}")
    };
    assert_eq!(*length, steps);
    let (inside, outside) = (own(body, &mesh), own(local, &mesh));
    assert!(!inside.is_empty() && !outside.is_empty(), "{local}");
    let mut want = outside.clone();
    add(&mut want, &inside, steps);
    let stats = exe.spmd().collectives();
    assert_eq!(stats.by_kind, want, "{}", exe.report());
    assert_eq!(stats.per_while_iteration, 0);
    summaries_agree(&exe, &stats);
    // The static list keeps one line per collective, the body's marked with the count.
    let report = exe.spmd().report();
    let body_lines = (report.lines())
        .filter(|l| l.contains(" scan body: ") && l.contains(", x 5 iterations  // "))
        .count();
    assert_eq!(
        body_lines,
        inside.values().map(|e| e.0).sum::<usize>(),
        "{report}"
    );
    // The HTML table too: one row per collective, its runs in a column.
    let html = exe.html();
    let rows = html.matches(r#"<tr class="collective"#).count();
    let static_count: usize = (inside.values().chain(outside.values())).map(|e| e.0).sum();
    assert_eq!(rows, static_count);
    assert_eq!(html.matches("<td>x 5 iterations</td>").count(), body_lines);
}

/// Nested loops multiply: a 3-step loop inside a 2-step one runs its body's collectives
/// 6 times.
#[test]
fn nested_loops_multiply_their_trip_counts() {
    let p = nested_loops((&[8, 6], "(data, _)"), (&[6, 6], "(_, model)"));
    let mesh = mesh_2x2();
    let exe = compile_and_check(&p, &mesh, &inputs(&p, 0), 1e-4);
    let local = &exe.spmd().program;
    let mut want = own(local, &mesh);
    for outer in flows(local) {
        let Flow::Scan { body, length, .. } = outer else {
            panic!("{local}")
        };
        add(&mut want, &own(body, &mesh), *length);
        for inner in flows(body) {
            let Flow::Scan {
                body: inner,
                length: n,
                ..
            } = inner
            else {
                panic!("{local}")
            };
            assert!(!own(inner, &mesh).is_empty(), "{local}");
            add(&mut want, &own(inner, &mesh), length * n);
        }
    }
    let stats = exe.spmd().collectives();
    assert_eq!(stats.by_kind, want, "{}", exe.report());
    summaries_agree(&exe, &stats);
}

/// A `while` loop's trip count is a run-time value: its collectives count once, are
/// marked per iteration in the totals and on their lines, and the cost analysis agrees.
#[test]
fn a_while_body_counts_once_marked_per_iteration() {
    let p = while_loop((&[8, 12], "(data, model)"), (&[12, 12], "(model, _)"));
    let mesh = mesh_2x2();
    let exe = compile_and_check(&p, &mesh, &inputs(&p, 3), 1e-4);
    let local = &exe.spmd().program;
    let mut want = own(local, &mesh);
    let mut in_loop = 0;
    for flow in flows(local) {
        for region in flow.regions() {
            let counts = own(region, &mesh);
            in_loop += counts.values().map(|e| e.0).sum::<usize>();
            add(&mut want, &counts, 1);
        }
    }
    assert!(in_loop > 0, "{local}");
    let stats = exe.spmd().collectives();
    assert_eq!(stats.by_kind, want);
    assert_eq!(stats.per_while_iteration, in_loop);
    summaries_agree(&exe, &stats);
    let report = exe.spmd().report();
    assert!(
        report.contains(&format!(
            "({in_loop} of them inside while loops, counted for one iteration"
        )),
        "{report}"
    );
    let marked = (report.lines())
        .filter(|l| l.contains(" while body: ") && l.contains(", per while iteration  // "))
        .count();
    assert_eq!(marked, in_loop, "{report}");
    assert!(
        exe.html()
            .contains(&format!("; {in_loop} of them in while loops"))
    );
}

/// Both branches of a `cond` count (either may run: an upper bound), in `collectives()`
/// and the cost analysis alike.
#[test]
fn both_cond_branches_count() {
    let p = build("cond", |b| {
        let x = sharded(b, "x", &[8, 6], "(data, _)");
        let w = sharded(b, "w", &[6, 6], "(_, model)");
        let v = sharded(b, "v", &[6, 6], "(model, _)");
        let k = b.parameter("k", [], DType::I32);
        let pred = k.gt(&b.constant(Literal::full(&[], DType::I32, 2.0)));
        b.cond(
            &pred,
            // Each branch scales `x` by one of its own constants: its ops are inside it.
            |t| vec![x.mul(&t.scalar(1.0)).matmul(&w).tanh().matmul(&v)],
            |f| vec![x.mul(&f.scalar(2.0)).matmul(&w).tanh()],
        )
    });
    let mesh = mesh_2x2();
    let exe = compile_and_check(&p, &mesh, &inputs(&p, 3), 1e-4);
    compile_and_check(&p, &mesh, &inputs(&p, 1), 1e-4);
    let local = &exe.spmd().program;
    let mut want = own(local, &mesh);
    let mut branches = 0;
    for flow in flows(local) {
        for region in flow.regions() {
            branches += usize::from(!own(region, &mesh).is_empty());
            add(&mut want, &own(region, &mesh), 1);
        }
    }
    assert_eq!(branches, 2, "{local}");
    let stats = exe.spmd().collectives();
    assert_eq!(stats.by_kind, want);
    summaries_agree(&exe, &stats);
}

/// How often a region runs, as the report writes it.
#[test]
fn runs_print_their_trip_counts() {
    let runs = |times, per_while_iteration| {
        Runs {
            times,
            per_while_iteration,
        }
        .to_string()
    };
    assert_eq!(runs(1, false), "");
    assert_eq!(runs(5, false), "x 5 iterations");
    assert_eq!(runs(1, true), "per while iteration");
    assert_eq!(runs(6, true), "x 6 iterations per while iteration");
}
