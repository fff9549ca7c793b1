//! The vocabulary and checks shared by the ported peer cases (see `main.rs`).

use gspmd_core::ir::{Builder, DType, Literal, Program, Tensor};
use gspmd_core::runtime::ThreadMesh;
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::{Executable, compile};
use ndarray::{ArrayD, IxDyn};

/// One ported case.
pub struct Case {
    /// Where it comes from: the peer's file (short form) and test name, e.g.
    /// `"spmd_partitioner_test.cc: DotPartialContracting"` or
    /// `"basic_propagation.mlir: @split_axes_different_factors"`.
    pub source: &'static str,
    /// How gspmd's decision compares with the peer's expectation.
    pub verdict: Verdict,
    /// Builds the program, compiles it, runs it against the reference and asserts the
    /// expectation; panics with a message naming what differs.
    pub check: fn(),
}

/// How gspmd compares with the peer on one case.
pub enum Verdict {
    /// The same propagated shardings, or the same collectives (kinds, per-device shapes).
    Agrees,
    /// gspmd moves fewer bytes per device (or holds less per device); why.
    Better(&'static str),
    /// Other collectives than the peer's, the same bytes per device; why.
    EqualBytes(&'static str),
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Agrees => f.write_str("agrees"),
            Verdict::Better(why) => write!(f, "better: {why}"),
            Verdict::EqualBytes(why) => write!(f, "equal bytes: {why}"),
        }
    }
}

/// A sharding from its text form, e.g. `"(data, _)"`, `"(x?, (y, z))"`.
#[track_caller]
pub fn sh(text: &str) -> Sharding {
    text.parse()
        .unwrap_or_else(|e| panic!("sharding {text:?}: {e}"))
}

/// A mesh of named axes in major-to-minor order, e.g. `mesh(&[("x", 2), ("y", 4)])`.
#[track_caller]
pub fn mesh(axes: &[(&str, usize)]) -> Mesh {
    Mesh::new(axes.iter().map(|&(a, n)| (a, n))).expect("valid mesh")
}

/// An f32 parameter, annotated when `sharding` is given.
pub fn param(b: &Builder, name: &str, shape: &[usize], sharding: Option<&str>) -> Tensor {
    let t = b.parameter(name, shape.to_vec(), DType::F32);
    match sharding {
        Some(s) => t.annotate(sh(s)),
        None => t,
    }
}

/// The program `f` traces, finished with the tensors it returns.
#[track_caller]
pub fn build(name: &str, f: impl FnOnce(&Builder) -> Vec<Tensor>) -> Program {
    let b = Builder::new(name);
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    b.finish(&refs)
        .unwrap_or_else(|e| panic!("{name} traces: {e}"))
}

/// Deterministic inputs for `program`'s parameters (f32 in [-0.75, 0.75]; integer
/// parameters get small non-negative values; bool parameters alternate).
pub fn inputs(program: &Program) -> Vec<Literal> {
    program
        .params
        .iter()
        .enumerate()
        .map(|(k, &p)| {
            let ty = program.ty(p);
            let n: usize = ty.shape.iter().product();
            let shape = IxDyn(&ty.shape);
            match ty.dtype {
                DType::I32 => Literal::I32(
                    ArrayD::from_shape_vec(shape, (0..n).map(|i| ((i + k) % 3) as i32).collect())
                        .unwrap(),
                ),
                DType::Bool => Literal::Bool(
                    ArrayD::from_shape_vec(shape, (0..n).map(|i| (i + k) % 2 == 0).collect())
                        .unwrap(),
                ),
                _ => Literal::F32(
                    ArrayD::from_shape_vec(
                        shape,
                        (0..n)
                            .map(|i| (((i * 7 + k * 13) % 29) as f32 / 9.0 - 1.5) * 0.5)
                            .collect(),
                    )
                    .unwrap(),
                )
                .convert(ty.dtype),
            }
        })
        .collect()
}

/// Compiles `program` for `mesh`, runs it on the thread mesh and checks every output
/// against the reference interpreter (within 1e-4 relative); returns the executable for
/// the case's own assertions (shardings, collectives, bytes).
#[track_caller]
pub fn compile_and_check(program: &Program, mesh: &Mesh) -> Executable {
    let exe = compile(program, mesh)
        .unwrap_or_else(|e| panic!("{} compiles on {mesh}: {e}", program.name));
    let threads = ThreadMesh::new(mesh.clone()).expect("thread mesh");
    let comparisons = exe
        .compare_with_reference(&threads, &inputs(program))
        .unwrap_or_else(|e| panic!("{} runs on {mesh}: {e}", program.name));
    for (k, c) in comparisons.iter().enumerate() {
        assert!(
            c.within(1e-4),
            "{} on {mesh}, output {k}: {c}\n{}",
            program.name,
            exe.report()
        );
    }
    exe
}

/// The propagated sharding of the value `t` names, as text (`"(x, _)"`).
pub fn sharding_of(exe: &Executable, t: &Tensor) -> String {
    let id = t.id().expect("traced without error");
    exe.propagated()
        .node(id)
        .sharding
        .as_ref()
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// [`build`] that also hands back values the case inspects: `f` returns the program's
/// outputs and the values to look at (in the order the case names them).
#[track_caller]
pub fn build_with<const N: usize>(
    name: &str,
    f: impl FnOnce(&Builder) -> (Vec<Tensor>, [Tensor; N]),
) -> (Program, [Tensor; N]) {
    let mut seen = None;
    let program = build(name, |b| {
        let (outs, values) = f(b);
        seen = Some(values);
        outs
    });
    (program, seen.expect("the closure ran"))
}

/// Asserts the propagated sharding of each value (`(&t, "(x, _)")`), naming every
/// mismatch at once. The program must reach propagation as traced (no dead or repeated
/// values for simplification to remove), so that traced ids are propagated ids; that is
/// checked first.
#[track_caller]
pub fn assert_shardings(program: &Program, exe: &Executable, expected: &[(&Tensor, &str)]) {
    assert_eq!(
        exe.propagated().nodes.len(),
        program.nodes.len(),
        "{}: simplification changed the program, so traced ids do not name propagated values",
        program.name
    );
    let wrong: Vec<String> = expected
        .iter()
        .filter_map(|&(t, want)| {
            let got = sharding_of(exe, t);
            (got != want).then(|| format!("{}: expected {want}, got {got}", t.ty()))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{}: {}\n{}",
        program.name,
        wrong.join("; "),
        exe.propagated()
    );
}

/// Where gspmd propagates otherwise than the peer: compiles `peer` (the same program
/// with the peer's shardings written as annotations), checks it against the reference
/// too, and asserts that gspmd's plan `ours` receives no more bytes per device than the
/// peer's and holds no more per device at its peak. Returns both byte counts
/// `(ours, peer's)`.
#[track_caller]
pub fn no_more_than_peer(ours: &Executable, peer: &Program, mesh: &Mesh) -> (usize, usize) {
    let theirs = compile_and_check(peer, mesh);
    let (a, b) = (
        ours.spmd().collectives().bytes(),
        theirs.spmd().collectives().bytes(),
    );
    assert!(
        a <= b,
        "{}: gspmd receives {a} bytes per device, the peer's plan {b}\n{}\npeer's plan:\n{}",
        peer.name,
        ours.report(),
        theirs.report()
    );
    let (m, n) = (
        ours.memory_analysis().peak_bytes,
        theirs.memory_analysis().peak_bytes,
    );
    assert!(
        m <= n,
        "{}: gspmd's peak is {m} bytes per device, the peer's plan {n}",
        peer.name
    );
    (a, b)
}

/// The propagated sharding of the value named `name` (see `Tensor::named`) in region
/// `region` (its index in [`gspmd_core::ir::Flow::regions`]) of the flow op that
/// returns `outer` (directly, or through the `sharding_constraint`s a `shard_map` pins
/// its results with), as text. Names survive simplification, which renumbers regions.
#[track_caller]
pub fn region_sharding_of(exe: &Executable, outer: &Tensor, region: usize, name: &str) -> String {
    let program = exe.propagated();
    let mut node = program.node(outer.id().expect("traced without error"));
    while let gspmd_core::ir::Op::ShardingConstraint = node.op {
        node = program.node(node.operands[0]);
    }
    let gspmd_core::ir::Op::Flow { flow, .. } = &node.op else {
        panic!("{} is not a flow op's result", node.op.name());
    };
    let body = flow.regions()[region];
    let inner = body
        .nodes
        .iter()
        .find(|n| n.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no value named {name:?} in region {region}:\n{body}"));
    inner
        .sharding
        .as_ref()
        .map(|s| s.to_string())
        .unwrap_or_default()
}
