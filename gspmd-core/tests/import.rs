//! StableHLO import (`gspmd_core::import`): a module JAX 0.12 lowered
//! (`tests/data/jax_mlp.mlir`, `jax.jit(mlp).lower(..).as_text()` of an MLP with a
//! `with_sharding_constraint`, sharded over a 2x4 mesh) reads into a program that
//! propagates, partitions and runs on the thread mesh like the reference, and whose
//! shardings export again as JAX wrote them; what is outside the subset is an
//! `Error::Import` naming the line.

use gspmd_core::compile;
use gspmd_core::error::Error;
use gspmd_core::import::from_stablehlo;
use gspmd_core::ir::{Op, Program};
use gspmd_core::runtime::{ThreadMesh, interpret, sample_inputs};

const JAX_MLP: &str = include_str!("data/jax_mlp.mlir");

fn annotation(program: &Program, param: usize) -> String {
    let node = program.node(program.params[param]);
    node.annotation
        .as_ref()
        .map_or("-".into(), ToString::to_string)
}

#[test]
fn a_jax_module_imports_partitions_and_runs_like_the_reference() {
    let imported = from_stablehlo(JAX_MLP).unwrap();
    let (program, mesh) = (&imported.program, &imported.mesh);
    assert_eq!(mesh.to_string(), "mesh[data=2, model=4]");
    assert_eq!(program.params.len(), 4);
    assert_eq!(annotation(program, 0), "(data, _)");
    assert_eq!(annotation(program, 1), "(_, model)");
    assert_eq!(annotation(program, 3), "(model)");
    let constraints = (program.nodes.iter())
        .filter(|n| matches!(n.op, Op::ShardingConstraint))
        .count();
    assert_eq!(constraints, 1, "{program}");
    // The constraint's location is its line in the module.
    let constraint = (program.nodes.iter())
        .find(|n| matches!(n.op, Op::ShardingConstraint))
        .unwrap();
    assert_eq!(constraint.location.file, "<stablehlo>");
    assert_eq!(constraint.location.line, 11);

    let exe = compile(program, mesh).unwrap();
    let inputs = sample_inputs(program, 3);
    let want = interpret(program, &inputs).unwrap();
    let threads = ThreadMesh::new(mesh.clone()).unwrap();
    let got = exe.run(&threads, &inputs).unwrap();
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        let (w, g) = (w.as_f32().unwrap(), g.as_f32().unwrap());
        let scale = w.iter().fold(1.0f32, |m, x| m.max(x.abs()));
        let diff = (w.iter().zip(g)).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff <= 1e-5 * scale, "output {k}: {diff}");
    }
    // The second matmul contracts over `model`: its partial sums are all-reduced.
    let report = exe.report();
    assert!(report.contains("all_reduce"), "{report}");
}

/// The imported annotations and mesh export again as JAX wrote them.
#[test]
fn imported_shardings_export_again() {
    let imported = from_stablehlo(JAX_MLP).unwrap();
    let text = imported.program.to_stablehlo(&imported.mesh).unwrap();
    assert!(
        text.contains("sdy.mesh @mesh = <[\"data\"=2, \"model\"=4]>"),
        "{text}"
    );
    assert!(
        text.contains("{sdy.sharding = #sdy.sharding<@mesh, [{\"data\"}, {}]>}"),
        "{text}"
    );
}

#[test]
fn ops_outside_the_subset_are_typed_errors() {
    let text = JAX_MLP.replace("stablehlo.tanh %6", "stablehlo.cbrt %6");
    match from_stablehlo(&text) {
        Err(Error::Import { line, message }) => {
            assert_eq!(line, 12);
            assert!(message.contains("stablehlo.cbrt"), "{message}");
        }
        other => panic!("expected an import error, got {other:?}"),
    }
    let text = JAX_MLP.replace("[{\"data\"}, {\"model\"}]>", "[{\"rows\"}, {}]>");
    match from_stablehlo(&text) {
        Err(Error::Import { message, .. }) => assert!(message.contains("rows"), "{message}"),
        other => panic!("expected an import error, got {other:?}"),
    }
}
