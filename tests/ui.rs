//! Compile-time behaviour of `#[gspmd::model]` and `#[gspmd::params]`: every misuse in
//! `tests/ui/fail/` (one per file) must fail with the `.stderr` next to it; every file
//! in `tests/ui/pass/` must compile and run.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
