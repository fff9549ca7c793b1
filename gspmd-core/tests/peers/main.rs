//! Cases ported from the test suites of the systems gspmd reimplements: XLA's
//! `xla/service/spmd/spmd_partitioner_test.cc` ([`xla_partitioner`]), XLA's
//! `xla/service/sharding_propagation_test.cc` ([`xla_propagation`]) and Shardy's
//! `shardy/dialect/sdy/transforms/propagation/test/*.mlir` ([`shardy_propagation`]).
//!
//! Each case names its source file and test, rebuilds the peer's program with gspmd's
//! builder, runs it partitioned on the thread mesh against the reference interpreter,
//! and asserts the peer's expectation (propagated shardings; collectives, per-device
//! shapes, bytes) — or, where gspmd chooses differently, that it moves no more bytes
//! per device, with one line of why ([`Verdict`]). `peer_cases` runs every case and
//! prints the summary: how many agree, do better, or move equal bytes another way.

mod harness;

use harness::{Case, Verdict};

mod shardy_propagation;
mod xla_partitioner;
mod xla_propagation;

fn suites() -> [(&'static str, &'static [Case]); 3] {
    [
        (
            "xla/service/spmd/spmd_partitioner_test.cc",
            xla_partitioner::CASES,
        ),
        (
            "xla/service/sharding_propagation_test.cc",
            xla_propagation::CASES,
        ),
        (
            "shardy/dialect/sdy/transforms/propagation/test",
            shardy_propagation::CASES,
        ),
    ]
}

/// Runs every ported case (each in isolation: a failing case does not hide the others),
/// prints one line per case and the summary per suite, and fails if any case failed.
#[test]
fn peer_cases() {
    let mut failed = Vec::new();
    let mut summary = String::new();
    for (suite, cases) in suites() {
        let (mut agrees, mut better, mut equal) = (0, 0, 0);
        for case in cases {
            match std::panic::catch_unwind(case.check) {
                Ok(()) => println!("ok      {} :: {}", case.source, case.verdict),
                Err(e) => {
                    let message = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    println!("FAILED  {}: {message}", case.source);
                    failed.push(case.source);
                    continue;
                }
            }
            match case.verdict {
                Verdict::Agrees => agrees += 1,
                Verdict::Better(_) => better += 1,
                Verdict::EqualBytes(_) => equal += 1,
            }
        }
        summary += &format!(
            "{suite}: {} cases: {agrees} agree, {better} better, {equal} equal in bytes\n",
            cases.len()
        );
    }
    println!("\n{summary}");
    assert!(failed.is_empty(), "failed cases: {failed:#?}");
}

/// Every case names a distinct source test (`file: TestName` or `file: @function`).
#[test]
fn case_sources_are_distinct() {
    let mut seen = std::collections::BTreeSet::new();
    for (_, cases) in suites() {
        for case in cases {
            assert!(seen.insert(case.source), "{} ported twice", case.source);
        }
    }
}
