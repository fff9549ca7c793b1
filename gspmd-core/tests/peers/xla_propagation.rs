//! Cases ported from `xla/service/sharding_propagation_test.cc`.

use crate::harness::{Case, Verdict, build, compile_and_check, mesh, param, sharding_of};

/// The ported cases, in the order of the peer's file.
pub const CASES: &[Case] = &[Case {
    source: "sharding_propagation_test.cc: ElementwiseOperationForwardPass",
    verdict: Verdict::Agrees,
    check: elementwise_operation_forward_pass,
}];

/// An add of a [5,7,11,13] operand split `devices=[1,2,2,1]` and an unannotated one
/// takes the split: XLA expects the add sharded `[1,2,2,1]`.
fn elementwise_operation_forward_pass() {
    let mut sum = None;
    let p = build("elementwise_forward", |b| {
        let a = param(b, "a", &[5, 7, 11, 13], Some("(_, x, y, _)"));
        let c = param(b, "c", &[5, 7, 11, 13], None);
        let y = &a + &c;
        sum = Some(y.clone());
        vec![y]
    });
    let exe = compile_and_check(&p, &mesh(&[("x", 2), ("y", 2)]));
    assert_eq!(sharding_of(&exe, sum.as_ref().unwrap()), "(_, x, y, _)");
}
