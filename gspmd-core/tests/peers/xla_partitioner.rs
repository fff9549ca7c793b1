//! Cases ported from `xla/service/spmd/spmd_partitioner_test.cc`.

use crate::harness::{Case, Verdict, build, compile_and_check, mesh, param, sh};

/// The ported cases, in the order of the peer's file.
pub const CASES: &[Case] = &[Case {
    source: "spmd_partitioner_test.cc: TiledElementwise",
    verdict: Verdict::Agrees,
    check: tiled_elementwise,
}];

/// A [3,3] operand split [2,1] meets a replicated one in a multiply and an add, all
/// results split [2,1]: XLA slices the replicated operand locally (a dynamic-slice of its
/// padded [4,3]) and computes each [2,3] tile with no collective. So does gspmd.
fn tiled_elementwise() {
    let p = build("tiled_elementwise", |b| {
        let a = param(b, "a", &[3, 3], Some("(x, _)"));
        let c = param(b, "c", &[3, 3], Some("(_, _)"));
        vec![(&(&a * &c) + &c).annotate(sh("(x, _)"))]
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2)]));
    assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
}
