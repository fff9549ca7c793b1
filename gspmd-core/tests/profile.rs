//! The per-node profile (`runtime::profile`): what it names and counts. Its own test
//! binary, since turning it on is process-wide.

use gspmd_core::compile;
use gspmd_core::ir::{Builder, DType, Literal};
use gspmd_core::runtime::{ThreadMesh, interpret, profile, sample_inputs};
use gspmd_core::sharding::{Mesh, Sharding};

#[test]
fn nodes_are_timed_by_description_and_reset_clears_them() {
    let b = Builder::new("profiled");
    let x = b.parameter("x", [4, 8], DType::F32);
    let w = b.parameter("w", [8, 3], DType::F32);
    let y = x.matmul(&w).gelu().sum(&[1]);
    let program = b.finish(&[&y]).expect("traces");
    let inputs: Vec<Literal> = sample_inputs(&program, 7);

    profile::set_enabled(false);
    interpret(&program, &inputs).expect("runs");
    assert!(profile::report().rows.is_empty(), "timed while off");

    profile::set_enabled(true);
    assert!(profile::enabled());
    for _ in 0..3 {
        interpret(&program, &inputs).expect("runs");
    }
    let report = profile::report();
    let product = (report.rows.iter())
        .find(|r| r.what.starts_with("dot_general f32[4, 3] <- [4, 8] [8, 3]"))
        .unwrap_or_else(|| panic!("no product row: {report:?}"));
    assert_eq!(product.calls, 3);
    assert!(!product.flow);
    let group = (report.rows.iter())
        .find(|r| r.what.starts_with("fused") && r.what.contains("tanh"))
        .unwrap_or_else(|| panic!("no GELU group row: {report:?}"));
    assert_eq!(group.calls, 3);
    assert!(report.total() >= product.total + group.total);
    let table = report.table(3, 10);
    assert!(table.contains("dot_general f32[4, 3]"), "{table}");
    assert_eq!(
        table.lines().count(),
        report.rows.len().min(10) + 1,
        "{table}"
    );

    // A 2-device mesh adds each device's nodes: a collective appears.
    profile::reset();
    assert!(profile::report().rows.is_empty(), "reset keeps rows");
    let b = Builder::new("sharded");
    let sharding: Sharding = "(data, _)".parse().expect("a sharding");
    let x = b.parameter("x", [4, 8], DType::F32).annotate(sharding);
    let total = x.sum(&[0, 1]);
    let program = b.finish(&[&total]).expect("traces");
    let mesh = Mesh::new([("data", 2)]).expect("a mesh");
    let exe = compile(&program, &mesh).expect("compiles");
    let inputs = sample_inputs(&program, 3);
    exe.run(&ThreadMesh::new(mesh).expect("a thread mesh"), &inputs)
        .expect("runs");
    let report = profile::report();
    let reduce = (report.rows.iter())
        .find(|r| r.what.starts_with("all_reduce"))
        .unwrap_or_else(|| panic!("no all_reduce row: {report:?}"));
    assert_eq!(reduce.calls, 2, "one per device");
    profile::set_enabled(false);
}
