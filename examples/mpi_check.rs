//! The MPI runtime against the thread mesh, run under `mpirun` with 2 or 4 ranks:
//!
//! ```text
//! cargo build --release --features mpi --example mpi_check
//! mpirun -np 4 target/release/examples/mpi_check
//! ```
//!
//! Every rank compiles the library's models (the Transformer language model, the
//! mixture of experts with its all-to-alls, the spatially partitioned U-Net with its halo
//! exchanges, and a circular pipeline with its shifts) with their gradients for each mesh
//! shape of that many devices, runs them on the MPI ranks and on a thread mesh of the
//! same shape, and fails unless every output is bitwise equal. Then the fault cases: a
//! rank whose program differs, a rank whose program fails or panics mid-step, a rank
//! running out of memory in a model's gradient; every rank must get an error naming the
//! culprit in under a second, and the mesh must run the next program correctly. Last, a
//! rank leaves the mesh while the others run on: they must get an error, not a hang.

use std::time::{Duration, Instant};

use gspmd::autodiff::grad;
use gspmd::compile;
use gspmd::ir::{DType, Literal, Program, ReduceKind};
use gspmd::models::moe::moe_language_model;
use gspmd::models::pipeline::{Pipeline, mlp_stack};
use gspmd::models::transformer::language_model;
use gspmd::models::unet::denoise;
use gspmd::runtime::{Communicator, MpiMesh, ThreadMesh, sample_inputs};
use gspmd::sharding::Mesh;
use gspmd::{Error, Result};

/// A model's gradient program and the meshes of `ranks` devices it runs on.
struct Case {
    name: &'static str,
    program: Program,
    meshes: Vec<Mesh>,
}

fn cases(ranks: usize) -> Result<Vec<Case>> {
    let lm = language_model::trace(
        language_model::Dims {
            B: 4,
            S: 6,
            V: 8,
            D: 16,
            L: 2,
            H: 4,
            K: 4,
            F: 32,
        },
        DType::F32,
    )?;
    let moe = moe_language_model::trace(
        moe_language_model::Dims {
            G: 8,
            S: 6,
            V: 8,
            M: 8,
            N: 2,
            K: 4,
            E: 4,
            H: 8,
        },
        2,
    )?;
    let unet = denoise::trace(denoise::Dims { B: 2, H: 16, W: 8 })?;
    let pipeline = Pipeline::circular(2, 2, 3);
    let stack = mlp_stack::trace(
        mlp_stack::Dims {
            M: pipeline.microbatches,
            B: 4,
            D: 8,
            S: pipeline.stages,
            R: pipeline.repeats,
            F: 16,
        },
        pipeline,
        true,
    )?;
    let gradient = |forward: &Program, first_trained: usize| {
        grad(
            forward,
            0,
            &(first_trained..forward.params.len()).collect::<Vec<_>>(),
        )
    };
    // Two-axis shapes of `ranks` devices: all on one axis, all on the other, and split.
    let mut shapes = vec![[1, ranks], [ranks, 1]];
    if ranks == 4 {
        shapes.push([2, 2]);
    }
    let meshes = |make: &dyn Fn([usize; 2]) -> Result<Mesh>| {
        shapes.iter().map(|&s| make(s)).collect::<Result<Vec<_>>>()
    };
    Ok(vec![
        Case {
            name: "language model gradient",
            program: gradient(&lm, 3)?,
            meshes: meshes(&|s| language_model::mesh(s))?,
        },
        Case {
            name: "mixture of experts gradient",
            program: gradient(&moe, 3)?,
            meshes: meshes(&|s| moe_language_model::mesh(s))?,
        },
        Case {
            name: "U-Net gradient",
            program: gradient(&unet, 2)?,
            meshes: meshes(&|s| denoise::mesh(s))?,
        },
        Case {
            name: "circular pipeline",
            program: stack,
            meshes: vec![mlp_stack::mesh([2, ranks / 2])?],
        },
    ])
}

fn bits(l: &Literal) -> Vec<u32> {
    match l {
        Literal::F32(a) => a.iter().map(|x| x.to_bits()).collect(),
        Literal::I32(a) => a.iter().map(|&x| x as u32).collect(),
        Literal::Bool(a) => a.iter().map(|&x| u32::from(x)).collect(),
    }
}

/// Runs every case on the MPI ranks and on threads; an error unless bitwise equal.
fn differential(mut mpi: MpiMesh, ranks: usize) -> Result<MpiMesh> {
    for case in cases(ranks)? {
        let inputs = sample_inputs(&case.program, 7);
        for mesh in case.meshes {
            let exe = compile(&case.program, &mesh)?;
            mpi = mpi.reshape(mesh.clone())?;
            let on_ranks = exe.run_mpi(&mpi, &inputs)?;
            let on_threads = exe.run(&ThreadMesh::new(mesh.clone())?, &inputs)?;
            for (k, (a, b)) in on_ranks.iter().zip(&on_threads).enumerate() {
                if a.shape() != b.shape() || bits(a) != bits(b) {
                    return Err(Error::MpiMesh(format!(
                        "{} on {mesh}: output {k} differs between MPI and threads",
                        case.name
                    )));
                }
            }
            if mpi.device() == 0 {
                println!(
                    "{} on {mesh}: {} outputs bitwise equal to the thread mesh",
                    case.name,
                    on_ranks.len()
                );
            }
        }
    }
    Ok(mpi)
}

/// Checks that `result` is an error on this rank mentioning `culprit`, within a second.
fn expect_error<T>(what: &str, started: Instant, result: Result<T>, culprit: &str) -> Result<()> {
    let elapsed = started.elapsed();
    match result {
        Ok(_) => Err(Error::MpiMesh(format!("{what}: the run succeeded"))),
        Err(e) if !e.to_string().contains(culprit) => Err(Error::MpiMesh(format!(
            "{what}: the error does not name {culprit}: {e}"
        ))),
        Err(_) if elapsed > Duration::from_secs(1) => Err(Error::MpiMesh(format!(
            "{what}: the error took {elapsed:?}"
        ))),
        Err(e) => {
            println!("{what}: error in {elapsed:?}: {e}");
            Ok(())
        }
    }
}

/// A step of three all-reduces over every rank; `device` fails after the first.
fn step(comm: &dyn Communicator, failing: usize, panic: bool) -> Result<Literal> {
    let axes = ["rank".to_string()];
    let mut x = Literal::F32(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[4]), 1.0));
    for round in 0..3 {
        x = comm.all_reduce(&axes, ReduceKind::Sum, x)?;
        if round == 0 && comm.device() == failing {
            if panic {
                panic!("injected panic on device {failing}");
            }
            return Err(Error::MpiMesh(format!(
                "injected failure on device {failing}"
            )));
        }
    }
    Ok(x)
}

fn faults(mpi: MpiMesh, ranks: usize) -> Result<MpiMesh> {
    let mpi = mpi.reshape(Mesh::new([("rank", ranks)])?)?;
    let me = mpi.device();
    let last = ranks - 1;
    // Rank 0 runs another program: every rank learns it at the start.
    let fingerprint = if me == 0 { "program A" } else { "program B" };
    let started = Instant::now();
    let result = mpi.run(fingerprint, |comm| step(comm, usize::MAX, false));
    expect_error("different programs", started, result, "program A")?;
    // A rank fails after the first collective; the others are in the second.
    let started = Instant::now();
    let result = mpi.run("a step", |comm| step(comm, 1, false));
    expect_error(
        "a failing rank",
        started,
        result,
        "injected failure on device 1",
    )?;
    // The last rank panics.
    let started = Instant::now();
    let result = mpi.run("a step", |comm| step(comm, last, true));
    expect_error("a panicking rank", started, result, "injected panic")?;
    // A model's gradient runs out of memory on rank 1 mid-program.
    let mesh = language_model::mesh([1, ranks])?;
    let case = cases(ranks)?.swap_remove(0);
    let exe = compile(&case.program, &mesh)?;
    let inputs = sample_inputs(&case.program, 7);
    let mpi = mpi.reshape(mesh)?;
    let limit = mpi.memory_limit();
    let mpi = mpi.with_memory_limit(if me == 1 { 16 << 10 } else { limit });
    let started = Instant::now();
    let result = exe.run_mpi(&mpi, &inputs);
    expect_error("out of memory on a rank", started, result, "out of memory")?;
    let mpi = mpi
        .with_memory_limit(limit)
        .reshape(Mesh::new([("rank", ranks)])?)?;
    // The mesh runs the next program normally.
    let sum = mpi.run("a step", |comm| step(comm, usize::MAX, false))?;
    let want = (ranks * ranks * ranks) as f32;
    if sum.as_f32().is_none_or(|a| a.iter().any(|&x| x != want)) {
        return Err(Error::MpiMesh(format!(
            "after the faults: {sum:?}, want {want}"
        )));
    }
    Ok(mpi)
}

fn main() -> Result<()> {
    let mpi = MpiMesh::init()?;
    let ranks = mpi.mesh().num_devices();
    if ranks != 2 && ranks != 4 {
        return Err(Error::MpiMesh(format!(
            "run with mpirun -np 2 or -np 4, not {ranks} ranks"
        )));
    }
    let mpi = differential(mpi, ranks)?;
    let mpi = faults(mpi, ranks)?;
    let me = mpi.device();
    // The last rank leaves (drops its mesh) while the others run on: they get an error
    // at their next collective, and nobody waits in MPI_Finalize for them.
    if me == ranks - 1 {
        drop(mpi);
    } else {
        let started = Instant::now();
        let result = mpi.run("a step", |comm| step(comm, usize::MAX, false));
        expect_error("a rank that left", started, result, "has left the mesh")?;
    }
    if me == 0 {
        println!("mpi_check: {ranks} ranks: all equal, all faults reported");
    }
    Ok(())
}
