//! The MPI runtime against the thread mesh, run under `mpirun` with 2 or 4 ranks:
//!
//! ```text
//! cargo build --release --features mpi --example mpi_check
//! mpirun -np 4 target/release/examples/mpi_check
//! ```
//!
//! Everything runs twice: on meshes of one device per rank, then on meshes of 8 devices,
//! several per rank (4 threads per rank on 2 ranks, 2 on 4: the hierarchical mesh), after
//! a check that meshes the ranks cannot hold are errors on every rank. First
//! every collective (all-reduce of f32, bf16, i32 and bool, large and small,
//! reduce-scatter, all-gather, all-to-all, permutes with and without wrapping) over every
//! axis list and some sub-axes of a few meshes (one axis, two, three, and a permuted
//! device order), against a thread mesh of the same mesh: bitwise equal results on every
//! device, with operands whose sums depend on the order of their terms. Then every rank
//! compiles the library's models (the Transformer language model, the mixture of experts
//! with its all-to-alls, the spatially partitioned U-Net with its halo exchanges, and a
//! circular pipeline with its shifts) with their gradients for each mesh shape of that
//! many devices, runs them on the MPI ranks and on a thread mesh of the same shape, and
//! fails unless every output is bitwise equal. Then the fault cases: a rank whose
//! program differs, a device whose program fails or panics mid-step, a rank running out
//! of memory in a model's gradient, and (with several devices per rank) a device that
//! stops responding; every rank must get an error naming the culprit within a second
//! (two for the stalled device), and the mesh must run the next program correctly. A
//! never-ending loop whose devices meet in an all-reduce every iteration, run with a
//! deadline (`MpiMesh::with_deadline`): every rank must get `Error::DeadlineExceeded`
//! naming every device of the mesh, within 5 s of a 0.5 s deadline. Then
//! training: initial weights from an `Initializer` bitwise equal to the single-device
//! reference's and a thread mesh's; the language model's AdamW step on the ranks and on
//! threads, with bitwise equal losses, and checkpoints saved on either loaded on the
//! other (every rank reads the file: a missing one is an error on every rank); a
//! sharded checkpoint saved on the ranks loads on a thread mesh of another shape, on the
//! reference and on the ranks. Last, a rank leaves the mesh while the others run on:
//! they must get an error, not a hang.
//!
//! With `--checkpoints` (any even number of ranks, 8 in CI), only the sharded
//! checkpoints: saved on the ranks as a `2 x ranks/2` mesh, loaded on threads as
//! `ranks/2 x 2`, on the reference and on the ranks.
//!
//! With `--stall`, the last rank stops responding (sleeps) before a collective, the
//! others waiting with a one-second timeout: the job must end with a non-zero exit
//! status and a message naming where they waited and the rank that did not come
//! (`.ci/run` checks both). `--stall 8` does the same on a mesh of 8 devices, several per
//! rank.

use std::time::{Duration, Instant};

use gspmd::Error;
use gspmd::autodiff::grad;
use gspmd::compile;
use gspmd::ir::{Builder, DType, Literal, Location, Program, ReduceKind, ValueId};
use gspmd::models::moe::moe_language_model;
use gspmd::models::pipeline::{Pipeline, mlp_stack};
use gspmd::models::transformer::{self, language_model};
use gspmd::models::unet::denoise;
use gspmd::runtime::{Backend, Communicator, MpiMesh, Reference, ThreadMesh, sample_inputs};
use gspmd::sharding::Mesh;
use gspmd::train::{Init, Initializer, Optimizer, TrainStep, Trainer, step_program};

/// A failure of this check: a gspmd error, or a result that is not what it must be.
type Failure = Box<dyn std::error::Error>;

/// Results of this check's steps (gspmd's own in the programs run on the mesh).
type Result<T, E = Failure> = std::result::Result<T, E>;
use ndarray::{ArrayD, IxDyn};

/// A model's gradient program and the meshes of `devices` devices it runs on.
struct Case {
    name: &'static str,
    program: Program,
    meshes: Vec<Mesh>,
}

/// The small language model of the differential and training checks.
fn small_lm() -> gspmd::Result<Program> {
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
        0.0,
    )
}

fn cases(devices: usize) -> Result<Vec<Case>> {
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
    // The gradient with respect to the float parameters from `first_trained` on (the
    // language model's key `rng` is an i32).
    let gradient = |forward: &Program, first_trained: usize| {
        let trained: Vec<usize> = (first_trained..forward.params.len())
            .filter(|&i| forward.ty(forward.params[i]).dtype == DType::F32)
            .collect();
        grad(forward, 0, &trained)
    };
    // Two-axis shapes of `devices` devices: all on one axis, all on the other, and split.
    let mut shapes = vec![[1, devices], [devices, 1]];
    match devices {
        4 => shapes.push([2, 2]),
        8 => shapes.extend([[2, 4], [4, 2]]),
        _ => {}
    }
    let meshes = |make: &dyn Fn([usize; 2]) -> gspmd::Result<Mesh>| {
        shapes
            .iter()
            .map(|&s| make(s))
            .collect::<gspmd::Result<Vec<_>>>()
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
            meshes: vec![mlp_stack::mesh([2, devices / 2])?],
        },
    ])
}

/// An error unless `a` and `b` are bitwise equal: `what` names them.
fn same_bits(what: &str, a: &Literal, b: &Literal) -> Result<()> {
    if a.shape() == b.shape() && a.bit_patterns() == b.bit_patterns() {
        return Ok(());
    }
    Err(format!("{what} differs between MPI and threads").into())
}

/// Whether this is rank 0 (which prints).
fn first(mpi: &MpiMesh) -> bool {
    mpi.process().0 == 0
}

/// The operand of `device` for the collectives check (of a two-dim `shape`): f32 values
/// over eight decades with mixed signs (so that sums depend on the order of their
/// terms), as `dtype`.
fn operand(device: usize, shape: &[usize], dtype: DType) -> Literal {
    let x = ArrayD::from_shape_fn(IxDyn(shape), |ix| {
        let k = ((device * 131 + ix[0]) * 1237 + ix[1]) * 17;
        let sign = if k.is_multiple_of(3) { -1.0 } else { 1.0 };
        sign * (1.0 + (k % 97) as f32 * 1e-2) * 10f32.powi((k % 8) as i32 - 4)
    });
    match dtype {
        DType::F32 => x.into(),
        DType::I32 => x.mapv(|v| (v * 1e3) as i32).into(),
        DType::Bool => x.mapv(|v| v > 0.0).into(),
        other => Literal::F32(x).convert(other),
    }
}

/// Every kind of collective over `axes`, as a device runs them: the results in order.
fn collectives_over(comm: &dyn Communicator, axes: &[String]) -> gspmd::Result<Vec<Literal>> {
    let n = comm.mesh().axes_size(axes);
    let d = comm.device();
    let shift: Vec<(usize, usize)> = (0..n).map(|i| (i, (i + 1) % n)).collect();
    let mirror: Vec<(usize, usize)> = (1..n).map(|i| (i, n - i)).collect();
    let x = |dtype| operand(d, &[8, 6], dtype);
    Ok(vec![
        comm.all_reduce(axes, ReduceKind::Sum, x(DType::F32))?,
        comm.all_reduce(axes, ReduceKind::Sum, operand(d, &[8, 1100], DType::F32))?,
        comm.all_reduce(axes, ReduceKind::Max, x(DType::F32))?,
        comm.all_reduce(axes, ReduceKind::Sum, x(DType::BF16))?,
        comm.all_reduce(axes, ReduceKind::Sum, x(DType::I32))?,
        comm.all_reduce(axes, ReduceKind::Min, x(DType::Bool))?,
        comm.reduce_scatter(axes, ReduceKind::Sum, 0, x(DType::F32))?,
        comm.reduce_scatter(axes, ReduceKind::Max, 0, x(DType::BF16))?,
        comm.all_gather(axes, 1, x(DType::F32))?,
        comm.all_gather(axes, 0, x(DType::Bool))?,
        comm.all_to_all(axes, 0, 1, x(DType::F32))?,
        comm.collective_permute(axes, &shift, x(DType::F32))?,
        comm.collective_permute(axes, &mirror, x(DType::I32))?,
    ])
}

/// Meshes of `devices` devices for the collectives check, with axis lists to check on
/// each: every ordered list of distinct axes, and some of sub-axes.
fn collective_cases(devices: usize) -> Result<Vec<(Mesh, Vec<Vec<String>>)>> {
    let list = |names: &[&str]| names.iter().map(ToString::to_string).collect::<Vec<_>>();
    let orderings = |mesh: &Mesh| -> Vec<Vec<String>> {
        let names: Vec<String> = mesh.axis_names().map(String::from).collect();
        let (mut lists, mut longest) = (vec![Vec::new()], vec![Vec::new()]);
        for _ in 0..names.len() {
            longest = (longest.iter())
                .flat_map(|l: &Vec<String>| {
                    let unused = names.iter().filter(|n| !l.contains(n));
                    unused.map(|n| [l.clone(), vec![n.clone()]].concat())
                })
                .collect();
            lists.extend(longest.iter().cloned());
        }
        lists
    };
    let with = |mesh: Mesh, extra: &[&[&str]]| {
        let mut lists = orderings(&mesh);
        lists.extend(extra.iter().map(|e| list(e)));
        (mesh, lists)
    };
    Ok(match devices {
        2 => vec![with(Mesh::new([("x", 2)])?, &[])],
        4 => vec![
            with(
                Mesh::new([("x", 4)])?,
                &[&["x:(2)2"], &["x:(2)2", "x:(1)2"]],
            ),
            with(Mesh::new([("a", 2), ("b", 2)])?, &[]),
        ],
        _ => vec![
            with(
                Mesh::new([("data", 2), ("model", 4)])?,
                &[
                    &["model:(2)2"],
                    &["model:(1)2", "data"],
                    &["model:(2)2", "data"],
                ],
            ),
            with(
                Mesh::new([("data", 4), ("model", 2)])?,
                &[&["data:(1)2"], &["model", "data:(2)2"]],
            ),
            with(
                Mesh::new([("x", 8)])?,
                &[&["x:(2)4"], &["x:(4)2", "x:(1)4"]],
            ),
            with(Mesh::new([("a", 2), ("b", 2), ("c", 2)])?, &[]),
            // Each rank's devices (4 or 2 consecutive ids) still share their
            // coordinates on the major digits.
            with(
                Mesh::with_device_order([("data", 2), ("model", 4)], vec![5, 4, 7, 6, 1, 0, 3, 2])?,
                &[&["model:(1)2"]],
            ),
        ],
    })
}

/// Every collective over every axis list of [`collective_cases`] on the ranks and on a
/// thread mesh: an error unless bitwise equal on every device of this rank.
fn collectives(mut mpi: MpiMesh, devices: usize) -> Result<MpiMesh> {
    for (mesh, lists) in collective_cases(devices)? {
        mpi = mpi.reshape(mesh.clone())?;
        let threads = ThreadMesh::new(mesh.clone())?;
        for axes in lists {
            let (on_ranks, on_threads) = (axes.clone(), axes.clone());
            let place = format!("collectives over {axes:?} on {mesh}");
            let got = mpi.run(&place, move |comm| collectives_over(comm, &on_ranks))?;
            let want = threads.run(move |ctx| collectives_over(ctx.communicator(), &on_threads))?;
            for (device, got) in mpi.local_devices().zip(&got) {
                for (k, (a, b)) in got.iter().zip(&want[device]).enumerate() {
                    same_bits(&format!("{place}: device {device}, collective {k}"), a, b)?;
                }
            }
        }
        if first(&mpi) {
            println!("every collective on {mesh}: bitwise equal to the thread mesh");
        }
    }
    Ok(mpi)
}

/// Meshes the ranks cannot hold: a device count they do not divide, a device order that
/// does not give each rank a block, and (on 2 ranks) a reduction over an axis of 6 of
/// which each rank holds 3 (its prime digits are 2 then 3, smallest first: a rank would
/// cut them). Each must be an error on every rank, naming the problem.
fn layouts(mpi: MpiMesh, ranks: usize) -> Result<MpiMesh> {
    let expect = |what: &str, result: gspmd::Result<MpiMesh>, culprit: &str| -> Result<()> {
        match result {
            Ok(_) => Err(format!("{what}: accepted").into()),
            Err(e) if e.to_string().contains(culprit) => Ok(()),
            Err(e) => Err(format!("{what}: {e}").into()),
        }
    };
    let odd = Mesh::new([("x", ranks + 1)])?;
    expect("an odd mesh", MpiMesh::new(odd), "launch with mpirun -np")?;
    let strided = Mesh::with_device_order([("x", 8)], vec![0, 2, 4, 6, 1, 3, 5, 7])?;
    expect(
        "a strided device order",
        MpiMesh::new(strided),
        "not a block",
    )?;
    if ranks == 2 {
        let mpi = mpi.reshape(Mesh::new([("x", 6)])?)?;
        let started = Instant::now();
        let result = mpi.run("a reduction a rank cuts", |comm| {
            comm.all_reduce(
                &["x".to_string()],
                ReduceKind::Sum,
                Literal::scalar_f32(1.0),
            )
        });
        expect_error(
            "a reduction a rank cuts",
            started,
            result,
            "which ranks of 3 devices cut",
        )?;
        return Ok(mpi);
    }
    Ok(mpi)
}

/// Runs every case on the MPI ranks and on threads; an error unless bitwise equal.
fn differential(mut mpi: MpiMesh, devices: usize) -> Result<MpiMesh> {
    for case in cases(devices)? {
        let inputs = sample_inputs(&case.program, 7);
        for mesh in case.meshes {
            let exe = compile(&case.program, &mesh)?;
            mpi = mpi.reshape(mesh.clone())?;
            let on_ranks = exe.run(&mpi, &inputs)?;
            let on_threads = exe.run(&ThreadMesh::new(mesh.clone())?, &inputs)?;
            for (k, (a, b)) in on_ranks.iter().zip(&on_threads).enumerate() {
                same_bits(&format!("{} on {mesh}: output {k}", case.name), a, b)?;
            }
            if first(&mpi) {
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

/// Checks that `result` is an error on this rank mentioning `culprit`, within `limit`.
fn expect_error_within<T>(
    what: &str,
    limit: Duration,
    started: Instant,
    result: gspmd::Result<T>,
    culprit: &str,
) -> Result<()> {
    let elapsed = started.elapsed();
    match result {
        Ok(_) => Err(format!("{what}: the run succeeded").into()),
        Err(e) if !e.to_string().contains(culprit) => {
            Err(format!("{what}: the error does not name {culprit}: {e}").into())
        }
        Err(_) if elapsed > limit => Err(format!("{what}: the error took {elapsed:?}").into()),
        Err(e) => {
            println!("{what}: error in {elapsed:?}: {e}");
            Ok(())
        }
    }
}

/// Checks that `result` is an error on this rank mentioning `culprit`, within a second.
fn expect_error<T>(
    what: &str,
    started: Instant,
    result: gspmd::Result<T>,
    culprit: &str,
) -> Result<()> {
    expect_error_within(what, Duration::from_secs(1), started, result, culprit)
}

/// The one axis of the fault cases' meshes.
const ALL: &str = "all";

/// A step of three all-reduces over every device; `failing` fails after the first.
fn step(comm: &dyn Communicator, failing: usize, panic: bool) -> gspmd::Result<Literal> {
    let axes = [ALL.to_string()];
    let mut x = Literal::F32(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[4]), 1.0));
    for round in 0..3 {
        x = comm.all_reduce(&axes, ReduceKind::Sum, x)?;
        if round == 0 && comm.device() == failing {
            if panic {
                panic!("injected panic on device {failing}");
            }
            // An op of the step failing (a stand-in for any error of a device).
            return Err(Error::Runtime {
                value: ValueId(0),
                op: "step",
                location: Location::caller(),
                message: format!("injected failure on device {failing}"),
            });
        }
    }
    Ok(x)
}

/// `while sum(x) > -1 { x = x * 1 }` on `x` split over every device: it never ends, and
/// every iteration's condition all-reduces, so the devices keep meeting and no timeout
/// ends it. Run under a deadline, it must fail on every rank with
/// [`Error::DeadlineExceeded`] naming each device of the mesh, in time; the mesh (its
/// deadline taken off) is returned for the next cases.
fn never_ending(mpi: MpiMesh, devices: usize) -> Result<MpiMesh> {
    let b = Builder::new("never_ending");
    let x = b.parameter("x", [2 * devices], DType::F32);
    let x = x.shard(format!("({ALL})").parse()?);
    let out = b.while_loop(
        |s| {
            let minus_one = s[0].builder().scalar(-1.0);
            s[0].sum(&[0]).gt(&minus_one)
        },
        |s| {
            let one = s[0].builder().full([2 * devices], DType::F32, 1.0);
            vec![&s[0] * &one]
        },
        &[x],
    );
    let program = b.finish(&[&out[0]])?;
    let mesh = Mesh::new([(ALL, devices)])?;
    let exe = compile(&program, &mesh)?;
    let deadline = Duration::from_millis(500);
    let mpi = mpi.reshape(mesh)?.with_deadline(deadline)?;
    let started = Instant::now();
    let result = exe.run(&mpi, &[Literal::full(&[2 * devices], DType::F32, 1.0)]);
    let elapsed = started.elapsed();
    let what = "a never-ending loop under a deadline";
    match result {
        Err(Error::DeadlineExceeded {
            deadline: d,
            positions,
        }) if d == deadline => {
            let named: Vec<usize> = positions.iter().map(|p| p.device).collect();
            if named != (0..devices).collect::<Vec<_>>() {
                return Err(format!("{what}: devices {named:?} named, not all {devices}").into());
            }
            if !positions.iter().any(|p| p.op.is_some()) {
                return Err(format!("{what}: no device's node named: {positions:?}").into());
            }
            if elapsed < deadline || elapsed > Duration::from_secs(5) {
                return Err(format!("{what}: the run ended after {elapsed:?}").into());
            }
            if first(&mpi) {
                let error = Error::DeadlineExceeded {
                    deadline,
                    positions,
                };
                println!("{what} ({devices} devices), after {elapsed:.1?}: {error}");
            }
        }
        other => return Err(format!("{what}: {other:?}").into()),
    }
    Ok(mpi.with_deadline(None)?)
}

fn faults(mpi: MpiMesh, devices: usize) -> Result<MpiMesh> {
    let rank = mpi.process().0;
    let last = devices - 1;
    // Rank 0 runs another model's executable, on a mesh of other axes: every rank
    // learns it at the start, from the programs' hashes.
    let mut models = cases(devices)?;
    let case = models.swap_remove(if rank == 0 { 2 } else { 0 });
    let mesh = case.meshes[0].clone();
    let exe = compile(&case.program, &mesh)?;
    let mpi = mpi.reshape(mesh)?;
    let started = Instant::now();
    let result = exe.run(&mpi, &sample_inputs(&case.program, 7));
    expect_error(
        "different programs",
        started,
        result,
        "disagree on the collective",
    )?;
    let mpi = mpi.reshape(Mesh::new([(ALL, devices)])?)?;
    // A device fails after the first collective; the others are in the second.
    let started = Instant::now();
    let result = mpi.run("a step", |comm| step(comm, 1, false));
    expect_error(
        "a failing device",
        started,
        result,
        "injected failure on device 1",
    )?;
    // The last device panics.
    let started = Instant::now();
    let result = mpi.run("a step", move |comm| step(comm, last, true));
    expect_error("a panicking device", started, result, "injected panic")?;
    let mpi = never_ending(mpi, devices)?;
    // With several devices per rank, the last device stops responding for a while: its
    // rank's other devices give up on it after the timeout, and every rank gets the
    // error (ranks wait longer for each other than a rank's devices do).
    let mpi = if mpi.local_devices().len() > 1 {
        let timeout = mpi.timeout();
        let mpi = mpi.with_timeout(Duration::from_millis(500))?;
        let started = Instant::now();
        let result = mpi.run("a step", move |comm| {
            if comm.device() == last {
                std::thread::sleep(Duration::from_millis(1500));
            }
            step(comm, usize::MAX, false)
        });
        let what = "a device that stops responding";
        expect_error_within(
            what,
            Duration::from_secs(2),
            started,
            result,
            "did not arrive",
        )?;
        mpi.with_timeout(timeout)?
    } else {
        mpi
    };
    // A model's gradient runs out of memory on rank 1 mid-program.
    let mesh = language_model::mesh([1, devices])?;
    let case = cases(devices)?.swap_remove(0);
    let exe = compile(&case.program, &mesh)?;
    let inputs = sample_inputs(&case.program, 7);
    let mpi = mpi.reshape(mesh)?;
    let limit = mpi.memory_limit();
    let mpi = mpi.with_memory_limit(if rank == 1 { 16 << 10 } else { limit });
    let started = Instant::now();
    let result = exe.run(&mpi, &inputs);
    expect_error("out of memory on a rank", started, result, "out of memory")?;
    let mpi = mpi
        .with_memory_limit(limit)
        .reshape(Mesh::new([(ALL, devices)])?)?;
    // The mesh runs the next program normally.
    let sums = mpi.run("a step", |comm| step(comm, usize::MAX, false))?;
    let want = (devices * devices * devices) as f32;
    let wrong = |x: &Literal| x.as_f32().is_none_or(|a| a.iter().any(|&x| x != want));
    if sums.iter().any(wrong) {
        return Err(format!("after the faults: {sums:?}, want {want}").into());
    }
    Ok(mpi)
}

/// An error unless the losses `got` (MPI) and `want` (threads) are bitwise equal.
fn same_loss(what: &str, got: f32, want: f32) -> Result<()> {
    if got.to_bits() == want.to_bits() {
        return Ok(());
    }
    Err(format!("{what}: loss {got} on MPI, {want} on threads").into())
}

/// The initial weights an [`Initializer`] makes for the small language model's step on
/// the ranks (each device makes its blocks), fetched: an error unless bitwise equal to
/// those of the single-device reference and of a thread mesh.
fn initial_weights(mpi: &MpiMesh, devices: usize) -> Result<()> {
    let model = small_lm()?;
    let step = step_program(&model, 0, transformer::WEIGHTS, &Optimizer::adamw(1e-2))?;
    let mesh = language_model::mesh([2, devices / 2])?;
    let init = || Initializer::new(11).rule("*", Init::Normal { std: 0.5 });
    let on_ranks = Trainer::new(step.clone(), MpiMesh::new(mesh.clone())?, init())?.params()?;
    let reference = Trainer::new(step.clone(), Reference::new(), init())?.params()?;
    let on_threads = Trainer::on_mesh(step, mesh.clone(), init())?.params()?;
    for (((name, a), (_, b)), (_, c)) in on_ranks.iter().zip(&reference).zip(&on_threads) {
        same_bits(&format!("initial `{name}` (ranks vs 1 device)"), a, b)?;
        same_bits(&format!("initial `{name}` (ranks vs threads)"), a, c)?;
    }
    if first(mpi) {
        println!(
            "initial weights on {mesh} over MPI: bitwise equal to 1 device and to the thread mesh"
        );
    }
    Ok(())
}

/// Of a model's `inputs`, those `step` trains, in its order: its initial values.
fn trained_inputs(step: &TrainStep, inputs: Vec<Literal>) -> Vec<Literal> {
    (step.params.iter())
        .map(|p| inputs[p.input].clone())
        .collect()
}

/// The small language model's AdamW step on the ranks and on a thread mesh of the same
/// shape: three steps with bitwise equal losses and checkpoints; then a checkpoint saved
/// on the ranks is loaded on threads and one saved on threads on the ranks, and the
/// next step of each is bitwise equal to the original trainers'.
fn training(mpi: &MpiMesh, devices: usize) -> Result<()> {
    let model = small_lm()?;
    let step = step_program(&model, 0, transformer::WEIGHTS, &Optimizer::adamw(1e-2))?;
    let mesh = language_model::mesh([2, devices / 2])?;
    let shape = mesh.to_string();
    let initial = |seed| trained_inputs(&step, sample_inputs(&model, seed));
    let data: Vec<Vec<Literal>> = (0..4)
        .map(|seed| sample_inputs(&model, 100 + seed)[..3].to_vec())
        .collect();
    let rank = mpi.process().0;
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
    let name = |what: &str| format!("gspmd_mpi_check_{devices}_{what}.safetensors");
    let from_ranks = dir.join(name("ranks"));
    let from_threads = dir.join(name("threads"));
    if rank == 0 {
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
    let mut ranks_from_threads = Trainer::new(step.clone(), MpiMesh::new(mesh)?, initial(2))?;
    // Every rank reads the file itself (the path must be one all ranks see): a missing
    // file is an error on every rank.
    let missing = dir.join(name("missing"));
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
    if rank == 0 {
        println!(
            "training on {shape}: losses and checkpoints bitwise equal to the thread mesh, checkpoints load across runtimes"
        );
    }
    sharded_checkpoints(mpi, devices)
}

/// Sharded checkpoints across runtimes and meshes: the language model trained on the
/// ranks as a `2 x devices/2` mesh saves a sharded checkpoint (each rank writes its
/// devices' blocks); it loads on a `devices/2 x 2` thread mesh and on the reference
/// (rank 0), and
/// on the ranks as either mesh, each with the loaded tensors bitwise those saved and the
/// next loss bitwise that of a trainer of the same backend restored from the saved
/// global tensors (on the saving mesh, that of the saving trainer). Then, with one
/// rank's file removed, a load fails on every rank naming the file, within a second.
fn sharded_checkpoints(mpi: &MpiMesh, devices: usize) -> Result<()> {
    let (me, ranks) = mpi.process();
    let model = small_lm()?;
    let step = step_program(&model, 0, transformer::WEIGHTS, &Optimizer::adamw(1e-2))?;
    let wide = language_model::mesh([2, devices / 2])?;
    let tall = language_model::mesh([devices / 2, 2])?;
    let initial = |seed| trained_inputs(&step, sample_inputs(&model, seed));
    let data: Vec<Vec<Literal>> = (0..3)
        .map(|seed| sample_inputs(&model, 200 + seed)[..3].to_vec())
        .collect();
    let mut saved = Trainer::new(step.clone(), MpiMesh::new(wide.clone())?, initial(1))?;
    for batch in &data[..2] {
        saved.step(batch)?;
    }
    let dir = std::env::temp_dir().join(format!("gspmd_mpi_check_{devices}_on_{ranks}_sharded"));
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
    // Back on the ranks, as either mesh (the same one for 4 devices; with several
    // devices per rank, the ranks x threads backend).
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
    // A copy for `--load-checkpoint`, another job's check (`.ci/run`).
    saved.save(kept_checkpoint(devices, ranks))?;
    // Rank 0 removes the last rank's file before a load starts: the error of the rank
    // that reads it is every rank's.
    let io = |e: std::io::Error| Failure::from(format!("{}: {e}", dir.display()));
    let save = (std::fs::read_dir(&dir).map_err(io)?)
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| path.is_dir())
        .ok_or_else(|| Failure::from(format!("no save in {}", dir.display())))?;
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

/// Where [`sharded_checkpoints`] keeps the checkpoint it saved on `devices` devices of
/// `ranks` ranks (after its last step), for [`load_checkpoint`] in another job.
fn kept_checkpoint(devices: usize, ranks: usize) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("gspmd_mpi_check_{devices}_on_{ranks}_kept"))
}

/// `--load-checkpoint DIR`: another job's sharded checkpoint of the small language
/// model's AdamW step (as [`sharded_checkpoints`] keeps it, e.g. saved on 8 ranks as
/// 2x4) loads on this job's ranks as a 2x4 mesh (on 2 ranks: 4 devices each), on a 4x2
/// thread mesh and on the reference (rank 0): every tensor bitwise the same on all, and
/// the next step on the ranks bitwise that of a 2x4 thread mesh loaded alike.
fn load_checkpoint(mpi: &MpiMesh, dir: &str) -> Result<()> {
    let model = small_lm()?;
    let step = step_program(&model, 0, transformer::WEIGHTS, &Optimizer::adamw(1e-2))?;
    let initial = |seed| trained_inputs(&step, sample_inputs(&model, seed));
    let next = sample_inputs(&model, 202)[..3].to_vec();
    let (wide, tall) = (language_model::mesh([2, 4])?, language_model::mesh([4, 2])?);
    let mut on_ranks = Trainer::new(step.clone(), MpiMesh::new(wide.clone())?, initial(3))?;
    on_ranks.load(dir)?;
    let tensors = on_ranks.checkpoint()?;
    if mpi.process().0 != 0 {
        on_ranks.step(&next)?;
        return Ok(());
    }
    let loaded = |mesh: Option<&Mesh>| -> Result<Trainer> {
        let mut trainer = match mesh {
            Some(mesh) => Trainer::on_mesh(step.clone(), mesh.clone(), initial(4))?,
            None => Trainer::reference(step.clone(), initial(4))?,
        };
        trainer.load(dir)?;
        Ok(trainer)
    };
    let mut same_mesh = loaded(Some(&wide))?;
    let others = [
        ("2x4 threads", &same_mesh),
        ("4x2 threads", &loaded(Some(&tall))?),
        ("the reference", &loaded(None)?),
    ];
    for (what, other) in others {
        for ((name, a), (_, b)) in tensors.iter().zip(&other.checkpoint()?) {
            same_bits(&format!("`{name}` on the ranks and on {what}"), a, b)?;
        }
    }
    let want = same_mesh.step(&next)?;
    same_loss("the step after loading", on_ranks.step(&next)?, want)?;
    println!(
        "checkpoint {dir}: loads on {} ranks as {wide}, on 4x2 threads and the reference, \
         bitwise alike; the next step equals the 2x4 thread mesh's",
        mpi.process().1
    );
    Ok(())
}

/// `--stall [devices]`: on a mesh of `devices` (default: one per rank), the last rank
/// stops responding (sleeps) before a collective that the others wait at for a second;
/// the job must end, non-zero, with a message (this returns only on failure). With
/// several devices per rank the whole rank sleeps, before its run starts.
fn stall(mpi: MpiMesh, devices: usize) -> Result<()> {
    let mpi = mpi
        .reshape(Mesh::new([(ALL, devices)])?)?
        .with_timeout(Duration::from_secs(1))?;
    let (rank, ranks) = mpi.process();
    let last = devices - 1;
    let started = Instant::now();
    if mpi.local_devices().len() > 1 && rank == ranks - 1 {
        std::thread::sleep(Duration::from_secs(60));
    }
    mpi.run("a step", move |comm| {
        if comm.device() == last && comm.mesh().num_devices() == ranks {
            std::thread::sleep(Duration::from_secs(60));
        }
        step(comm, usize::MAX, false)
    })?;
    Err(format!(
        "a rank stalled for {:?} and the job went on",
        started.elapsed()
    )
    .into())
}

fn main() -> Result<()> {
    let mpi = MpiMesh::init()?;
    let ranks = mpi.mesh().num_devices();
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--checkpoints") && ranks % 2 == 0 {
        return sharded_checkpoints(&mpi, ranks);
    }
    if let Some(at) = args.iter().position(|a| a == "--load-checkpoint") {
        let dir = args
            .get(at + 1)
            .ok_or_else(|| Failure::from("--load-checkpoint needs a checkpoint directory"))?;
        return load_checkpoint(&mpi, dir);
    }
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--stall") {
        let devices = match args.get(at + 1) {
            Some(n) => n
                .parse()
                .map_err(|_| Failure::from(format!("--stall {n}: not a device count")))?,
            None => ranks,
        };
        return stall(mpi, devices);
    }
    if ranks != 2 && ranks != 4 {
        return Err(format!("run with mpirun -np 2 or -np 4, not {ranks} ranks").into());
    }
    // A device per rank, then 8 devices: several per rank.
    let mut mpi = layouts(mpi, ranks)?;
    for devices in [ranks, 8] {
        let started = Instant::now();
        mpi = collectives(mpi, devices)?;
        mpi = differential(mpi, devices)?;
        mpi = faults(mpi, devices)?;
        initial_weights(&mpi, devices)?;
        training(&mpi, devices)?;
        if first(&mpi) {
            println!(
                "{devices} devices on {ranks} ranks: checked in {:.1?}",
                started.elapsed()
            );
        }
    }
    let rank = mpi.process().0;
    // The last rank leaves (drops its mesh) while the others run on: they get an error
    // at their next collective, and nobody waits in MPI_Finalize for them.
    if rank == ranks - 1 {
        drop(mpi);
    } else {
        let started = Instant::now();
        let result = mpi.run("a step", |comm| step(comm, usize::MAX, false));
        expect_error("a rank that left", started, result, "has left the mesh")?;
    }
    if rank == 0 {
        println!("mpi_check: {ranks} ranks: all equal, all faults reported");
    }
    Ok(())
}
