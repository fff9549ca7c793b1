//! The differential check the mesh suites share: a program compiled for a mesh and run
//! on its threads, against the reference interpreter.

use gspmd_core::ir::{Literal, Program};
use gspmd_core::runtime::{ThreadMesh, interpret};
use gspmd_core::sharding::Mesh;
use gspmd_core::{Executable, compile};

/// Compiles `program` for `mesh`, runs it on threads with `inputs` and asserts that each
/// f32 output is within `tolerance * max(1, max |want|)` of the interpreter's and each
/// other output equal to it. Returns the executable (for its collectives).
pub fn compile_and_check(
    program: &Program,
    mesh: &Mesh,
    inputs: &[Literal],
    tolerance: f32,
) -> Executable {
    let name = &program.name;
    let want = interpret(program, inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    let exe = compile(program, mesh).unwrap_or_else(|e| panic!("{name} on {mesh}: {e}"));
    let threads = ThreadMesh::new(mesh.clone()).unwrap();
    let got = (exe.run(&threads, inputs)).unwrap_or_else(|e| panic!("{name} on {mesh}: {e}"));
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        match (w.as_f32(), g.as_f32()) {
            (Some(a), Some(b)) => {
                let scale = a.iter().fold(1.0f32, |m, x| m.max(x.abs()));
                let diff = (a.iter().zip(b)).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    diff <= tolerance * scale,
                    "{name} on {mesh}, output {k}: max diff {diff}\n{}",
                    exe.report()
                );
            }
            _ => assert_eq!(w, g, "{name} on {mesh}, output {k}\n{}", exe.report()),
        }
    }
    exe
}
