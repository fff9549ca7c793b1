//! StableHLO import (`gspmd_core::import`): a module JAX 0.12 lowered
//! (`tests/data/jax_mlp.mlir`, `jax.jit(mlp).lower(..).as_text()` of an MLP with a
//! `with_sharding_constraint`, sharded over a 2x4 mesh) reads into a program that
//! propagates, partitions and runs on the thread mesh like the reference, and whose
//! shardings export again as JAX wrote them; what is outside the subset is an
//! `Error::Import` naming the line.
//!
//! Two more modules `tools/jax_models.py` lowered (`scan_ops`, `window_ops`, with their
//! inputs and JAX's one-device outputs beside them) cover control flow and windows: a
//! `lax.scan` (a `while`), a `lax.cond` (a `case`), private functions (calls), dynamic
//! slices and updates, `clamp`; strided, dilated, grouped, transposed and batch-grouped
//! convolutions, max and average pooling (`reduce_window`, `select_and_scatter`), an
//! embedding lookup and its gradient (`gather`, `scatter`), argmax (a two-operand
//! `reduce`) and cumsum.

use gspmd_core::compile;
use gspmd_core::error::Error;
use gspmd_core::import::from_stablehlo;
use gspmd_core::ir::{Literal, Op, Program, distinct_flows};
use gspmd_core::runtime::{ThreadMesh, interpret, sample_inputs};
use gspmd_core::train::load_checkpoint;

const JAX_MLP: &str = include_str!("data/jax_mlp.mlir");
const JAX_SCAN_OPS: &str = include_str!("data/jax_scan_ops.mlir");
const JAX_WINDOW_OPS: &str = include_str!("data/jax_window_ops.mlir");

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

/// The tensors of `tests/data/jax_{name}.{which}.safetensors`, in order.
fn tensors(name: &str, which: &str) -> Vec<Literal> {
    let path = format!(
        "{}/tests/data/jax_{name}.{which}.safetensors",
        env!("CARGO_MANIFEST_DIR")
    );
    let loaded = load_checkpoint(&path).unwrap();
    loaded.into_iter().map(|(_, v)| v).collect()
}

/// `got` equals `want` to 1e-5 of each output's largest magnitude.
fn assert_close(what: &str, want: &[Literal], got: &[Literal]) {
    assert_eq!(want.len(), got.len(), "{what}: output count");
    for (k, (w, g)) in want.iter().zip(got).enumerate() {
        let (w, g) = (w.as_f32().unwrap(), g.as_f32().unwrap());
        let scale = w.iter().fold(f32::MIN_POSITIVE, |m, x| m.max(x.abs()));
        let diff = (w.iter().zip(g)).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff <= 1e-5 * scale,
            "{what}, output {k}: {diff} of {scale}"
        );
    }
}

/// The op names of `program` and its regions.
fn op_names(program: &Program, names: &mut Vec<&'static str>) {
    names.extend(program.nodes.iter().map(|n| n.op.name()));
    for (_, flow) in distinct_flows(program) {
        names.push(flow.name());
        for region in flow.regions() {
            op_names(region, names);
        }
    }
}

/// Each fixture imports, partitions and runs on its mesh's threads with JAX's outputs,
/// as the reference interpreter does on the imported program.
#[test]
fn jax_control_flow_and_windows_import_and_match_jax() {
    let cases = [
        (
            "scan_ops",
            JAX_SCAN_OPS,
            &["while", "cond", "dynamic_slice", "dynamic_update_slice"][..],
        ),
        (
            "window_ops",
            JAX_WINDOW_OPS,
            &["convolution", "reduce_window", "gather", "scatter_add"][..],
        ),
    ];
    for (name, text, expected_ops) in cases {
        let imported = from_stablehlo(text).unwrap();
        let (program, mesh) = (&imported.program, &imported.mesh);
        let mut names = Vec::new();
        op_names(program, &mut names);
        for op in expected_ops {
            assert!(names.contains(op), "{name}: no {op} in {names:?}");
        }
        let (inputs, want) = (tensors(name, "inputs"), tensors(name, "outputs"));
        assert_close(name, &want, &interpret(program, &inputs).unwrap());
        let exe = compile(program, mesh).unwrap();
        let threads = ThreadMesh::new(mesh.clone()).unwrap();
        assert_close(name, &want, &exe.run(&threads, &inputs).unwrap());
    }
}

/// The line of the first occurrence of `needle` in `text` (1-based).
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap() + 1
}

#[test]
fn unsupported_ops_in_regions_and_callees_name_their_line() {
    // In a `case` branch inside the `while` body, and in a private function.
    for (op, text) in [
        ("stablehlo.sine", JAX_SCAN_OPS),
        ("stablehlo.remainder", JAX_SCAN_OPS),
        ("stablehlo.tanh", JAX_WINDOW_OPS),
    ] {
        let bad = text.replacen(op, "stablehlo.cbrt", 1);
        match from_stablehlo(&bad) {
            Err(Error::Import { line, message }) => {
                assert_eq!(line, line_of(&bad, "stablehlo.cbrt"), "{message}");
                assert!(message.contains("stablehlo.cbrt"), "{message}");
            }
            other => panic!("expected an import error for {op}, got {other:?}"),
        }
    }
    // Overlapping windows are outside the select_and_scatter the importer writes.
    let at = line_of(JAX_WINDOW_OPS, "select_and_scatter");
    let bad: Vec<String> = (JAX_WINDOW_OPS.lines().enumerate())
        .map(|(i, l)| match i + 1 == at {
            true => l.replace(
                "window_strides = array<i64: 1, 2, 2, 1>",
                "window_strides = array<i64: 1, 1, 1, 1>",
            ),
            false => l.to_string(),
        })
        .collect();
    match from_stablehlo(&bad.join("\n")) {
        Err(Error::Import { line, message }) => {
            assert_eq!(line, at, "{message}");
            assert!(message.contains("select_and_scatter"), "{message}");
        }
        other => panic!("expected an import error, got {other:?}"),
    }
}

/// Regions that read values of the enclosing function (captures), as StableHLO allows
/// though JAX passes everything as operands: a `while` body reading `%arg1` (the cond
/// not) and a `case` branch reading `%arg1` (the other `%arg0`).
#[test]
fn regions_capture_enclosing_values() {
    let text = r#"module @m {
  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0:2 = stablehlo.while(%iterArg = %c, %iterArg_0 = %arg0) : tensor<i32>, tensor<4xf32>
    cond {
      %c_1 = stablehlo.constant dense<3> : tensor<i32>
      %1 = stablehlo.compare  LT, %iterArg, %c_1,  SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %1 : tensor<i1>
    } do {
      %c_1 = stablehlo.constant dense<1> : tensor<i32>
      %1 = stablehlo.add %iterArg, %c_1 : tensor<i32>
      %2 = stablehlo.multiply %iterArg_0, %arg1 : tensor<4xf32>
      stablehlo.return %1, %2 : tensor<i32>, tensor<4xf32>
    }
    %p = stablehlo.constant dense<1> : tensor<i32>
    %3 = "stablehlo.case"(%p) ({
      stablehlo.return %arg0 : tensor<4xf32>
    }, {
      %4 = stablehlo.negate %arg1 : tensor<4xf32>
      stablehlo.return %4 : tensor<4xf32>
    }) : (tensor<i32>) -> tensor<4xf32>
    return %0#1, %3 : tensor<4xf32>, tensor<4xf32>
  }
}"#;
    let imported = from_stablehlo(text).unwrap();
    let x = Literal::F32(ndarray::arr1(&[1.0f32, 2.0, 3.0, 4.0]).into_dyn());
    let y = Literal::F32(ndarray::arr1(&[2.0f32, 1.0, -1.0, 0.5]).into_dyn());
    let out = interpret(&imported.program, &[x, y]).unwrap();
    let (looped, branch) = (out[0].as_f32().unwrap(), out[1].as_f32().unwrap());
    assert_eq!(
        looped.iter().copied().collect::<Vec<f32>>(),
        [8.0, 2.0, -3.0, 0.5]
    );
    assert_eq!(
        branch.iter().copied().collect::<Vec<f32>>(),
        [-2.0, -1.0, 1.0, -0.5]
    );
}
