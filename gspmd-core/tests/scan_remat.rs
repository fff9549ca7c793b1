//! A scan's remat policy ([`Remat`], JAX's `jax.checkpoint` policies): the forward scan
//! stacks what the policy saves, the backward scan reads it instead of recomputing it,
//! and the gradients are the same under every policy — bitwise on the reference
//! interpreter (the saved values are the very values the recomputation gives), and on
//! a 2x4 thread mesh within `1e-6 * max(1, max |want|)` of the reference. The memory
//! analysis counts the saved values: saving the products raises the predicted peak by
//! their stacked bytes.

mod differential;
// Shared with the loop suites; this one uses only some of it.
#[allow(dead_code)]
mod loop_programs;

use differential::compile_and_check;
use gspmd_core::autodiff::grad;
use gspmd_core::compile;
use gspmd_core::ir::{Flow, Literal, OpKind, Program, Remat, ScanOptions};
use gspmd_core::runtime::interpret;
use gspmd_core::sharding::Mesh;
use loop_programs::{build, flows, inputs, sharded};

const POLICIES: [Remat; 4] = [
    Remat::NothingSaveable,
    Remat::DotsSaveable,
    Remat::EverythingSaveable,
    Remat::SaveOnlyTheseNames(&["hidden"]),
];

/// Sizes of the scanned MLP: layers, batch, model dim, hidden dim.
const L: usize = 8;
const B: usize = 16;
const D: usize = 8;
const F: usize = 32;

/// The gradient of `sum(h^2)` after `L` residual MLP layers `h <- h + tanh(h @ w1)
/// @ w2` under one scan with `remat`, with respect to `h0`, `w1` and `w2`: the batch
/// split on `data`, the weights' hidden dim on `model`.
fn mlp_grad(remat: Remat) -> Program {
    let forward = build("mlp", |b| {
        let h0 = sharded(b, "h0", &[B, D], "(data, _)");
        let w1 = sharded(b, "w1", &[L, D, F], "(_, _, model)");
        let w2 = sharded(b, "w2", &[L, F, D], "(_, model, _)");
        let options = ScanOptions::new().remat(remat);
        let (h, _) = b.scan_with(&[w1, w2], &[h0], options, |h, w| {
            let hidden = h[0].matmul(&w[0]).tanh().named("hidden");
            (vec![h[0].add(&hidden.matmul(&w[1]))], vec![])
        });
        vec![h[0].mul(&h[0]).sum(&[0, 1])]
    });
    grad(&forward, 0, &[0, 1, 2]).unwrap()
}

fn mesh_2x4() -> Mesh {
    Mesh::new([("data", 2), ("model", 4)]).unwrap()
}

/// How many nodes of `kind` the body of `scan` has.
fn count(scan: &Flow, kind: OpKind) -> usize {
    let Flow::Scan { body, .. } = scan else {
        panic!("not a scan: {scan:?}")
    };
    (body.nodes.iter()).filter(|n| n.op.kind() == kind).count()
}

/// The stacked outputs of a scan: its outputs `y`.
fn stacked_outputs(scan: &Flow) -> usize {
    let Flow::Scan { body, carried, .. } = scan else {
        panic!("not a scan: {scan:?}")
    };
    body.outputs.len() - carried
}

#[test]
fn gradients_are_the_same_under_every_policy() {
    let reference = mlp_grad(Remat::NothingSaveable);
    // Small enough that the tanh does not saturate and the gradients stay O(1).
    let values: Vec<Literal> = (inputs(&reference, 0).iter())
        .map(|v| Literal::F32(v.as_f32().unwrap().mapv(|x| x * 0.25)))
        .collect();
    let want = interpret(&reference, &values).unwrap();
    let mesh = mesh_2x4();
    for remat in POLICIES {
        let program = mlp_grad(remat);
        let got = interpret(&program, &values).unwrap();
        assert_eq!(got, want, "{remat}: the gradients differ on the reference");
        compile_and_check(&program, &mesh, &values, 1e-6);
    }
}

/// What each policy stacks and recomputes: nothing saved recomputes `h @ w1` and its
/// `tanh` each backward iteration; saving the products reads `h @ w1` (the only
/// product the backward pass reads: `tanh(..) @ w2` feeds a sum) and recomputes the
/// `tanh`; saving everything reads the `tanh` (its derivative `1 - tanh^2` needs only
/// it, so `h @ w1` is not kept) and recomputes nothing.
#[test]
fn each_policy_stacks_what_it_saves_and_recomputes_the_rest() {
    // (policy, stacked outputs of the forward scan, products and tanhs of the
    // backward body)
    let want = [
        (Remat::NothingSaveable, 1, 5, 1),
        (Remat::DotsSaveable, 2, 4, 1),
        (Remat::EverythingSaveable, 2, 4, 0),
        // Only `hidden = tanh(h @ w1)`, named so: what the gradients read of the layer
        // besides its input, so neither the product nor the tanh is recomputed.
        (Remat::SaveOnlyTheseNames(&["hidden"]), 2, 4, 0),
        // A name no value has: nothing saved.
        (Remat::SaveOnlyTheseNames(&["nowhere"]), 1, 5, 1),
    ];
    for (remat, stacked, dots, tanhs) in want {
        let program = mlp_grad(remat);
        let scans = flows(&program);
        assert_eq!(scans.len(), 2, "{remat}: {program}");
        let (forward, backward) = (scans[0], scans[1]);
        assert_eq!(stacked_outputs(forward), stacked, "{remat}: {program}");
        assert_eq!(
            count(backward, OpKind::DotGeneral),
            dots,
            "{remat}: {program}"
        );
        assert_eq!(count(backward, OpKind::Tanh), tanhs, "{remat}: {program}");
    }
}

/// Saving the products holds `h @ w1` for every layer from the forward scan to the
/// backward one: the predicted peak per device grows by those stacked bytes (`L x
/// B/2 x F/4` f32 on 2x4), give or take one slice of it: the recomputation held one
/// slice, and the backward scan, which reads the stack in place, hands its body a
/// slice per iteration.
#[test]
fn saving_the_products_raises_the_peak_by_their_stacked_bytes() {
    let mesh = mesh_2x4();
    let peak = |remat| {
        let exe = compile(&mlp_grad(remat), &mesh).unwrap();
        exe.memory_analysis().peak_bytes
    };
    let (nothing, dots) = (peak(Remat::NothingSaveable), peak(Remat::DotsSaveable));
    let slice = B / 2 * F / 4 * 4;
    let stacked = L * slice;
    let grown = dots as isize - nothing as isize;
    println!(
        "peak: nothing saveable {nothing} bytes, dots saveable {dots} bytes (+{grown}), stacked products {stacked} bytes"
    );
    assert!(
        (stacked - slice) as isize <= grown && grown <= (stacked + slice) as isize,
        "peak grew by {grown} bytes, the stacked products are {stacked} bytes"
    );
}
