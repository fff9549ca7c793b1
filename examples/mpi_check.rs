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
//! culprit in under a second, and the mesh must run the next program correctly. Then
//! training: the language model's AdamW step on the ranks and on threads, with bitwise
//! equal losses, and checkpoints saved on either loaded on the other (every rank reads
//! the file: a missing one is an error on every rank); a sharded checkpoint saved on the
//! ranks loads on a thread mesh of another shape, on the reference and on the ranks.
//! Last, a rank leaves the mesh while the others run on: they must get an error, not a
//! hang.
//!
//! With `--checkpoints` (any even number of ranks, 8 in CI), only the sharded
//! checkpoints: saved on the ranks as a `2 x ranks/2` mesh, loaded on threads as
//! `ranks/2 x 2`, on the reference and on the ranks.
//!
//! With `--stall`, the last rank stops responding (sleeps) before a collective, the
//! others waiting with a one-second timeout: the job must end with a non-zero exit
//! status and a message naming where they waited and the rank that did not come
//! (`.ci/run` checks both).

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
use gspmd::train::{Optimizer, Trainer, step_program};
use gspmd::{Error, Result};

/// A model's gradient program and the meshes of `ranks` devices it runs on.
struct Case {
    name: &'static str,
    program: Program,
    meshes: Vec<Mesh>,
}

/// The small language model of the differential and training checks.
fn small_lm() -> Result<Program> {
    language_model::trace(
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
    )
}

fn cases(ranks: usize) -> Result<Vec<Case>> {
    let lm = small_lm()?;
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

/// An error unless `a` and `b` are bitwise equal: `what` names them.
fn same_bits(what: &str, a: &Literal, b: &Literal) -> Result<()> {
    if a.shape() == b.shape() && a.bit_patterns() == b.bit_patterns() {
        return Ok(());
    }
    Err(Error::MpiMesh(format!(
        "{what} differs between MPI and threads"
    )))
}

/// Runs every case on the MPI ranks and on threads; an error unless bitwise equal.
fn differential(mut mpi: MpiMesh, ranks: usize) -> Result<MpiMesh> {
    for case in cases(ranks)? {
        let inputs = sample_inputs(&case.program, 7);
        for mesh in case.meshes {
            let exe = compile(&case.program, &mesh)?;
            mpi = mpi.reshape(mesh.clone())?;
            let on_ranks = exe.run(&mpi, &inputs)?;
            let on_threads = exe.run(&ThreadMesh::new(mesh.clone())?, &inputs)?;
            for (k, (a, b)) in on_ranks.iter().zip(&on_threads).enumerate() {
                same_bits(&format!("{} on {mesh}: output {k}", case.name), a, b)?;
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
    let me = mpi.device();
    let last = ranks - 1;
    // Rank 0 runs another model's executable, on a mesh of other axes: every rank
    // learns it at the start, from the programs' hashes.
    let mut models = cases(ranks)?;
    let case = models.swap_remove(if me == 0 { 2 } else { 0 });
    let mesh = case.meshes[0].clone();
    let exe = compile(&case.program, &mesh)?;
    let mpi = mpi.reshape(mesh)?;
    let started = Instant::now();
    let result = exe.run(&mpi, &sample_inputs(&case.program, 7));
    expect_error("different programs", started, result, "ranks disagree")?;
    let mpi = mpi.reshape(Mesh::new([("rank", ranks)])?)?;
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
    let result = exe.run(&mpi, &inputs);
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

/// An error unless the losses `got` (MPI) and `want` (threads) are bitwise equal.
fn same_loss(what: &str, got: f32, want: f32) -> Result<()> {
    if got.to_bits() == want.to_bits() {
        return Ok(());
    }
    Err(Error::MpiMesh(format!(
        "{what}: loss {got} on MPI, {want} on threads"
    )))
}

/// The small language model's AdamW step on the ranks and on a thread mesh of the same
/// shape: three steps with bitwise equal losses and checkpoints; then a checkpoint saved
/// on the ranks is loaded on threads and one saved on threads on the ranks, and the
/// next step of each is bitwise equal to the original trainers'.
fn training(mpi: &MpiMesh, ranks: usize) -> Result<()> {
    let model = small_lm()?;
    // Parameters 0..3 are tokens, targets and loss weights; the rest are trained.
    let trained: Vec<usize> = (3..model.params.len()).collect();
    let step = step_program(&model, 0, &trained, &Optimizer::adamw(1e-2))?;
    let mesh = language_model::mesh([2, ranks / 2])?;
    let shape = mesh.to_string();
    let initial = |seed| sample_inputs(&model, seed).split_off(3);
    let data: Vec<Vec<Literal>> = (0..4)
        .map(|seed| sample_inputs(&model, 100 + seed)[..3].to_vec())
        .collect();
    let me = mpi.device();
    let mut on_ranks = Trainer::new(step.clone(), MpiMesh::new(mesh.clone())?, initial(1))?;
    let mut on_threads = Trainer::on_mesh(step.clone(), mesh.clone(), initial(1))?;
    for (i, batch) in data[..3].iter().enumerate() {
        let what = format!("training step {}", i + 1);
        same_loss(&what, on_ranks.step(batch)?, on_threads.step(batch)?)?;
    }
    let (ranks_state, threads_state) = (on_ranks.checkpoint()?, on_threads.checkpoint()?);
    for ((name, a), (_, b)) in ranks_state.iter().zip(&threads_state) {
        same_bits(&format!("checkpoint tensor `{name}`"), a, b)?;
    }
    // The thread trainers' file is written by rank 0 before the ranks' save, whose
    // meeting at the end tells every rank that both files exist.
    let dir = std::env::temp_dir();
    let from_ranks = dir.join(format!("gspmd_mpi_check_{ranks}_ranks.safetensors"));
    let from_threads = dir.join(format!("gspmd_mpi_check_{ranks}_threads.safetensors"));
    if me == 0 {
        on_threads.save(&from_threads)?;
    }
    on_ranks.save(&from_ranks)?;
    let mut threads_from_ranks = Trainer::on_mesh(step.clone(), mesh.clone(), initial(2))?;
    threads_from_ranks.load(&from_ranks)?;
    let last = &data[3];
    let want = on_threads.step(last)?;
    same_loss("the step after a checkpoint", on_ranks.step(last)?, want)?;
    same_loss(
        "the step after an MPI checkpoint loaded on threads",
        want,
        threads_from_ranks.step(last)?,
    )?;
    drop(on_ranks);
    let mut on_threads = Trainer::on_mesh(step.clone(), mesh.clone(), initial(1))?;
    let mut ranks_from_threads = Trainer::new(step, MpiMesh::new(mesh)?, initial(2))?;
    // Every rank reads the file itself (the path must be one all ranks see): a missing
    // file is an error on every rank.
    let missing = dir.join(format!("gspmd_mpi_check_{ranks}_missing.safetensors"));
    let started = Instant::now();
    let result = ranks_from_threads.load(&missing);
    expect_error(
        "a missing checkpoint",
        started,
        result,
        &missing.display().to_string(),
    )?;
    ranks_from_threads.load(&from_threads)?;
    on_threads.load(&from_threads)?;
    same_loss(
        "the step after a thread-mesh checkpoint loaded on MPI",
        ranks_from_threads.step(last)?,
        on_threads.step(last)?,
    )?;
    if me == 0 {
        println!(
            "training on {shape}: losses and checkpoints bitwise equal to the thread mesh, checkpoints load across runtimes"
        );
    }
    sharded_checkpoints(me, ranks)
}

/// Sharded checkpoints across runtimes and meshes: the language model trained on the
/// ranks as a `2 x ranks/2` mesh saves a sharded checkpoint (each rank writes its
/// block); it loads on a `ranks/2 x 2` thread mesh and on the reference (rank 0), and
/// on the ranks as either mesh, each with the loaded tensors bitwise those saved and the
/// next loss bitwise that of a trainer of the same backend restored from the saved
/// global tensors (on the saving mesh, that of the saving trainer). Then, with one
/// rank's file removed, a load fails on every rank naming the file, within a second.
fn sharded_checkpoints(me: usize, ranks: usize) -> Result<()> {
    let model = small_lm()?;
    let trained: Vec<usize> = (3..model.params.len()).collect();
    let step = step_program(&model, 0, &trained, &Optimizer::adamw(1e-2))?;
    let wide = language_model::mesh([2, ranks / 2])?;
    let tall = language_model::mesh([ranks / 2, 2])?;
    let initial = |seed| sample_inputs(&model, seed).split_off(3);
    let data: Vec<Vec<Literal>> = (0..3)
        .map(|seed| sample_inputs(&model, 200 + seed)[..3].to_vec())
        .collect();
    let mut saved = Trainer::new(step.clone(), MpiMesh::new(wide.clone())?, initial(1))?;
    for batch in &data[..2] {
        saved.step(batch)?;
    }
    let dir = std::env::temp_dir().join(format!("gspmd_mpi_check_{ranks}_sharded"));
    saved.save(&dir)?;
    let want = saved.checkpoint()?;
    let next = &data[2];
    // `loaded` loads the checkpoint, `restored` restores `want`: the same tensors, bit for
    // bit, and the same next loss.
    let check = |what: &str, mut loaded: Trainer, mut restored: Trainer| -> Result<f32> {
        loaded.load(&dir)?;
        for ((name, a), (_, b)) in loaded.checkpoint()?.iter().zip(&want) {
            same_bits(&format!("{what}: `{name}`"), a, b)?;
        }
        restored.restore(&want)?;
        let loss = loaded.step(next)?;
        let want = Literal::scalar_f32(restored.step(next)?);
        same_bits(
            &format!("{what}: the next loss"),
            &Literal::scalar_f32(loss),
            &want,
        )?;
        Ok(loss)
    };
    if me == 0 {
        let on_threads = || Trainer::on_mesh(step.clone(), tall.clone(), initial(2));
        check("loaded on threads", on_threads()?, on_threads()?)?;
        let reference = || Trainer::reference(step.clone(), initial(2));
        check("loaded on the reference", reference()?, reference()?)?;
    }
    // Back on the ranks, as either mesh (the same one on 4 ranks). (A backend of ranks x
    // threads, a process holding several devices, belongs in this list too.)
    let continued = Literal::scalar_f32(saved.step(next)?);
    for mesh in [&wide, &tall] {
        let on_ranks = || Trainer::new(step.clone(), MpiMesh::new(mesh.clone())?, initial(2));
        let loss = check(
            &format!("loaded on the ranks as {mesh}"),
            on_ranks()?,
            on_ranks()?,
        )?;
        if mesh == &wide {
            same_bits(
                "the step after a save",
                &Literal::scalar_f32(loss),
                &continued,
            )?;
        }
    }
    // Rank 0 removes the last rank's file before a load starts: the error of the rank
    // that reads it is every rank's.
    let io = |e: std::io::Error| Error::MpiMesh(format!("{}: {e}", dir.display()));
    let save = (std::fs::read_dir(&dir).map_err(io)?)
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| path.is_dir())
        .ok_or_else(|| Error::MpiMesh(format!("no save in {}", dir.display())))?;
    let missing = save.join(format!(
        "process-{:05}-of-{ranks:05}.safetensors",
        ranks - 1
    ));
    let mut loader = Trainer::new(step.clone(), MpiMesh::new(wide.clone())?, initial(2))?;
    if me == 0 {
        std::fs::remove_file(&missing).map_err(io)?;
    }
    let started = Instant::now();
    let result = loader.load(&dir);
    let culprit = missing.display().to_string();
    expect_error(
        "a sharded checkpoint missing a file",
        started,
        result,
        &culprit,
    )?;
    if me == 0 {
        println!(
            "sharded checkpoint of {wide} on {ranks} ranks: loads bitwise on threads as {tall}, on the reference, on the ranks as either mesh"
        );
    }
    Ok(())
}

/// `--stall`: the last rank sleeps before a collective that the others wait at for a
/// second; the job must end, non-zero, with a message (this returns only on failure).
fn stall(mpi: MpiMesh) -> Result<()> {
    let mpi = mpi.with_timeout(Duration::from_secs(1));
    let last = mpi.mesh().num_devices() - 1;
    let started = Instant::now();
    mpi.run("a step", |comm| {
        if comm.device() == last {
            std::thread::sleep(Duration::from_secs(60));
        }
        step(comm, usize::MAX, false)
    })?;
    Err(Error::MpiMesh(format!(
        "a rank stalled for {:?} and the job went on",
        started.elapsed()
    )))
}

fn main() -> Result<()> {
    let mpi = MpiMesh::init()?;
    if std::env::args().any(|a| a == "--stall") {
        return stall(mpi);
    }
    let ranks = mpi.mesh().num_devices();
    if std::env::args().any(|a| a == "--checkpoints") && ranks % 2 == 0 {
        return sharded_checkpoints(mpi.device(), ranks);
    }
    if ranks != 2 && ranks != 4 {
        return Err(Error::MpiMesh(format!(
            "run with mpirun -np 2 or -np 4, not {ranks} ranks"
        )));
    }
    let mpi = differential(mpi, ranks)?;
    let mpi = faults(mpi, ranks)?;
    training(&mpi, ranks)?;
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
