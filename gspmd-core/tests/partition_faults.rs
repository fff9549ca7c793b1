//! Failure behaviour of partitioned programs on the thread mesh: one failing device
//! releases every other one with an error; wrong inputs are typed errors before any
//! thread starts; the mesh stays usable.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gspmd_core::Error;
use gspmd_core::error::InputProblem;
use gspmd_core::ir::{Builder, CollectiveKind, DType, Literal, Program};
use gspmd_core::partition::{SpmdProgram, partition};
use gspmd_core::runtime::{Loaded, ThreadMesh, run_on_device};
use gspmd_core::sharding::{Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};

fn ones(shape: &[usize]) -> Literal {
    Literal::F32(ArrayD::from_elem(IxDyn(shape), 1.0))
}

/// `sum(x @ w)` with the contraction split over all 8 devices: every device waits in an
/// all-reduce.
fn contracted() -> (Program, SpmdProgram) {
    let b = Builder::new("contracted");
    let x = b.parameter("x", [4, 16], DType::F32);
    let w = b.parameter("w", [16, 4], DType::F32);
    let y = x.matmul(&w);
    let mut p = b.finish(&[&y]).unwrap();
    let s = ["(_, (data, model))", "((data, model), _)", "(_, _)"];
    for (node, s) in p.nodes.iter_mut().zip(s) {
        node.sharding = Some(s.parse::<Sharding>().unwrap());
    }
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let spmd = partition(&p, &mesh).unwrap();
    assert_eq!(
        spmd.collectives().count(CollectiveKind::AllReduce),
        1,
        "{}",
        spmd.report()
    );
    (p, spmd)
}

#[test]
fn a_failing_device_releases_the_others_quickly() {
    let (_, spmd) = contracted();
    let threads = ThreadMesh::new(spmd.mesh.clone()).unwrap();
    let program = Arc::new(spmd.program.clone());
    let start = Instant::now();
    let result = threads.run(move |ctx| {
        // Device 5 gets a wrong-shaped block: its dot fails while the others wait in the
        // all-reduce.
        let x = if ctx.device() == 5 {
            ones(&[4, 3])
        } else {
            ones(&[4, 2])
        };
        run_on_device(
            &program,
            ctx.communicator(),
            &[x, ones(&[2, 4])],
            ctx.memory_limit(),
        )
    });
    assert!(result.is_err(), "a failing device must fail the run");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    // The mesh runs the next program correctly.
    let got = Arc::new(Loaded::new(spmd.clone()))
        .run(&threads, &[ones(&[4, 16]), ones(&[16, 4])])
        .unwrap();
    assert!(got[0].as_f32().unwrap().iter().all(|&v| v == 16.0));
}

#[test]
fn wrong_inputs_are_typed_errors_before_any_thread_starts() {
    let (_, spmd) = contracted();
    let threads = ThreadMesh::new(spmd.mesh.clone()).unwrap();
    let count = Arc::new(Loaded::new(spmd.clone())).run(&threads, &[ones(&[4, 16])]);
    assert!(
        matches!(count, Err(Error::Input { index: 1, .. })),
        "{count:?}"
    );
    let shape =
        Arc::new(Loaded::new(spmd.clone())).run(&threads, &[ones(&[4, 15]), ones(&[16, 4])]);
    match shape {
        Err(Error::Input {
            index: 0,
            name,
            problem: InputProblem::Type { expected, given },
        }) => {
            assert_eq!(name, "x");
            assert_eq!((expected.shape, given.shape), (vec![4, 16], vec![4, 15]));
        }
        other => panic!("{other:?}"),
    }
    let dtype = Arc::new(Loaded::new(spmd.clone())).run(
        &threads,
        &[Literal::I32(ArrayD::zeros(IxDyn(&[4, 16]))), ones(&[16, 4])],
    );
    assert!(
        matches!(dtype, Err(Error::Input { index: 0, .. })),
        "{dtype:?}"
    );
    let other_mesh = ThreadMesh::new(Mesh::new([("data", 8)]).unwrap()).unwrap();
    assert!(
        Arc::new(Loaded::new(spmd.clone()))
            .run(&other_mesh, &[ones(&[4, 16]), ones(&[16, 4])])
            .is_err()
    );
}
