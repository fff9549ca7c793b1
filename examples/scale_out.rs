//! A language model larger than one process trains on the ranks of an MPI job, no
//! process ever holding more than its share: issue 25's scale-out check.
//!
//! The model is `gspmd::models::transformer::language_model` with a large vocabulary
//! (its embedding and unembedding are most of its weights), on the mesh `data=1,
//! model=<ranks>`: every weight is split over all the ranks (the embedding by rows,
//! vocabulary-parallel; the unembedding and the layers Megatron-style), AdamW's state
//! like its weight. Each rank draws only its blocks of the initial weights, the step
//! donates the weights and state (`CompileOptions::donated`: updated in place), and only
//! the batch goes in and the loss comes out. So a rank holds its share of the weights,
//! state and gradients, plus a fixed runtime baseline: `(peak RSS - baseline) x ranks`
//! stays about constant as ranks are added.
//!
//! ```text
//! cargo build --release --features mpi --example scale_out
//! target/release/examples/scale_out --threads 8 --losses target/scale_out.losses   # 1x8 thread mesh, uncapped
//! mpirun -np 8 target/release/examples/scale_out --cap-mib 580 --expect target/scale_out.losses
//! mpirun -np 2 target/release/examples/scale_out        # the same model on 2 ranks: the RSS figures
//! ```
//!
//! `--cap-mib C` caps each rank at C MiB: its devices' runtime memory limit
//! (`with_memory_limit`, an `OutOfMemory` error before any allocation beyond it) and a
//! process-level cap, a memory cgroup of its own (cgroup v1 `memory.limit_in_bytes`,
//! where the process may create one: the kernel kills a rank that exceeds it) or, where
//! it may not, `RLIMIT_DATA` (what `ulimit -d` sets: the heap; `RLIMIT_AS` would count
//! Open MPI's shared-memory maps and reserved stacks, ~700 MiB of address space here). It fails unless the weights and
//! AdamW state are at least 4x the cap. `--expect PATH` makes rank 0 fail unless the
//! losses are bitwise those of the thread mesh's run in PATH (written by `--losses`).
//! Every run prints the weights and state per rank and each rank's peak RSS.

use std::path::PathBuf;
use std::time::Instant;

use gspmd::models::transformer::language_model;
use gspmd::prelude::*;
use gspmd::runtime::MpiMesh;
use gspmd::train::{Init, Initializer, Optimizer, TrainStep, Trainer, step_program};
use gspmd::{CompileOptions, Error};
use ndarray::{ArrayD, IxDyn};

/// The model: 2^18 tokens of vocabulary, d_model 384, one layer: 202M parameters, so
/// 2.4 GB of weights and AdamW state.
const DIMS: language_model::Dims = language_model::Dims {
    B: 2,
    S: 8,
    V: 1 << 18,
    D: 384,
    L: 1,
    H: 6,
    K: 64,
    F: 1536,
};

/// The steps trained (and compared).
const STEPS: usize = 3;

/// The command line (see the module docs).
#[derive(Default)]
struct Options {
    threads: Option<usize>,
    cap_mib: Option<usize>,
    losses: Option<PathBuf>,
    expect: Option<PathBuf>,
}

fn options() -> Result<Options, String> {
    let mut options = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--threads" => options.threads = Some(value()?.parse().map_err(|e| format!("{e}"))?),
            "--cap-mib" => options.cap_mib = Some(value()?.parse().map_err(|e| format!("{e}"))?),
            "--losses" => options.losses = Some(value()?.into()),
            "--expect" => options.expect = Some(value()?.into()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(options)
}

/// Tokens, next tokens and loss weights of step `k`: the same on every process.
fn batch(k: usize) -> Vec<Literal> {
    let token = |b: usize, s: usize| ((b * 7919 + s * 104_729 + k * 15_485_863) % DIMS.V) as i32;
    let tokens = ArrayD::from_shape_fn(IxDyn(&[DIMS.B, DIMS.S]), |ix| token(ix[0], ix[1]));
    let targets = ArrayD::from_shape_fn(IxDyn(&[DIMS.B, DIMS.S]), |ix| token(ix[0], ix[1] + 1));
    vec![
        Literal::I32(tokens),
        Literal::I32(targets),
        Literal::full(&[DIMS.B, DIMS.S], DType::F32, 1.0),
    ]
}

fn initializer() -> Initializer {
    Initializer::new(25)
        .rule("layers.attn.wo", Init::fan_in(&[1, 2]))
        .rule("layers.*", Init::fan_in(&[1]))
        .rule("unembed", Init::fan_in(&[0]))
        .rule("*", Init::Normal { std: 0.02 })
}

/// The AdamW step training every weight, donating the weights and state.
fn step() -> Result<(TrainStep, CompileOptions), Error> {
    let model = language_model::trace(DIMS, DType::F32, 0.0)?;
    let step = step_program(
        &model,
        0,
        &["embed", "position", "layers.*", "unembed"],
        &Optimizer::adamw(1e-3),
    )?;
    let options = CompileOptions {
        donated: step.carried(),
        ..CompileOptions::default()
    };
    Ok((step, options))
}

/// The bytes of the weights and optimizer state of `step`.
fn carried_bytes(step: &TrainStep) -> usize {
    (step.carried().iter())
        .map(|&i| step.program.ty(step.program.params[i]).size_in_bytes())
        .sum()
}

/// A figure of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`: the peak).
fn status_bytes(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (status.lines())
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A cap on this process's memory, lifted when dropped (see [`Cap::apply`]).
struct Cap {
    /// The memory cgroup made for the process, if it could make one, and the one it
    /// was in.
    group: Option<(PathBuf, PathBuf)>,
}

/// The cgroup v1 memory hierarchy.
const MEMORY_CGROUPS: &str = "/sys/fs/cgroup/memory";

impl Cap {
    /// Caps this process at `bytes`: a memory cgroup of its own (cgroup v1) if it may
    /// make one, else `RLIMIT_DATA` (private writable memory: the heap).
    fn apply(bytes: usize) -> Result<Cap, String> {
        let pid = std::process::id();
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let own = (cgroups.lines()).find_map(|line| {
            line.split_once(":memory:")
                .map(|(_, path)| path.to_string())
        });
        let group = PathBuf::from(format!("{MEMORY_CGROUPS}/gspmd-scale-out-{pid}"));
        if let Some(own) = own
            && std::fs::create_dir(&group).is_ok()
        {
            let own = PathBuf::from(format!("{MEMORY_CGROUPS}{own}"));
            let cap = Cap {
                group: Some((group.clone(), own)),
            };
            std::fs::write(group.join("memory.limit_in_bytes"), bytes.to_string())
                .and_then(|()| std::fs::write(group.join("cgroup.procs"), pid.to_string()))
                .map_err(|e| format!("memory cgroup {}: {e}", group.display()))?;
            return Ok(cap);
        }
        let status = std::process::Command::new("prlimit")
            .args(["--pid", &pid.to_string(), &format!("--data={bytes}")])
            .status()
            .map_err(|e| format!("neither a memory cgroup nor prlimit: {e}"))?;
        if !status.success() {
            return Err(format!("prlimit failed: {status}"));
        }
        Ok(Cap { group: None })
    }

    fn describe(&self) -> String {
        match &self.group {
            Some((group, _)) => format!("memory cgroup {}", group.display()),
            None => "RLIMIT_DATA".into(),
        }
    }
}

impl Drop for Cap {
    /// Leaves the cgroup and removes it (a resource limit stays: the process ends).
    fn drop(&mut self) {
        if let Some((group, own)) = &self.group {
            let pid = std::process::id().to_string();
            let _ = std::fs::write(own.join("cgroup.procs"), pid);
            let _ = std::fs::remove_dir(group);
        }
    }
}

/// Trains `STEPS` steps and returns the losses.
fn train(mut trainer: Trainer) -> Result<Vec<f32>, Error> {
    (0..STEPS).map(|k| trainer.step(&batch(k))).collect()
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = options()?;
    let (step, compile_options) = step()?;
    let carried = carried_bytes(&step);
    if let Some(threads) = options.threads {
        // The uncapped reference: the same mesh shape on a thread mesh.
        let mesh = language_model::mesh([1, threads])?;
        let started = Instant::now();
        let trainer = Trainer::with_options(
            step,
            ThreadMesh::new(mesh)?,
            initializer(),
            &compile_options,
        )?;
        let losses = train(trainer)?;
        println!(
            "{threads} threads: losses {losses:?} in {:.1?}, weights and state {:.0} MiB",
            started.elapsed(),
            mib(carried)
        );
        if let Some(path) = &options.losses {
            let bits: Vec<String> = losses.iter().map(|l| l.to_bits().to_string()).collect();
            std::fs::write(path, bits.join("\n"))?;
        }
        return Ok(());
    }
    let mpi = MpiMesh::init()?;
    let (rank, ranks) = (mpi.device(), mpi.mesh().num_devices());
    let mesh = language_model::mesh([1, ranks])?;
    let mut ranks_mesh = MpiMesh::new(mesh)?;
    let cap = match options.cap_mib {
        Some(cap) => {
            let bytes = cap << 20;
            if carried < 4 * bytes {
                return Err(format!(
                    "the weights and state ({:.0} MiB) are not 4x the cap of {cap} MiB",
                    mib(carried)
                )
                .into());
            }
            ranks_mesh = ranks_mesh.with_memory_limit(bytes);
            Some(Cap::apply(bytes)?)
        }
        None => None,
    };
    let baseline = status_bytes("VmRSS");
    let started = Instant::now();
    let trainer = Trainer::with_options(step, ranks_mesh, initializer(), &compile_options)?;
    let initialised = started.elapsed();
    let losses = train(trainer)?;
    let elapsed = started.elapsed();
    let peak = status_bytes("VmHWM");
    // Every rank's baseline and peak, on rank 0 (through the init mesh).
    let figures = format!("{baseline} {peak}");
    let all = gspmd::runtime::Backend::all_gather_bytes(&mpi, "the RSS figures", figures.into())?;
    let cap_text = cap.as_ref().map(Cap::describe);
    drop(cap);
    if rank != 0 {
        return Ok(());
    }
    let figures: Vec<(usize, usize)> = (all.iter())
        .filter_map(|bytes| {
            let text = String::from_utf8_lossy(bytes);
            let mut parts = text.split(' ').map(|p| p.parse::<usize>().ok());
            Some((parts.next()??, parts.next()??))
        })
        .collect();
    let peak_max = figures.iter().map(|f| f.1).max().unwrap_or(0);
    let base_max = figures.iter().map(|f| f.0).max().unwrap_or(0);
    println!(
        "{ranks} ranks (mesh data=1, model={ranks}): losses {losses:?}; weights and state {:.0} MiB, \
         {:.0} MiB per rank; initialised in {initialised:.1?}, {STEPS} steps in {elapsed:.1?}",
        mib(carried),
        mib(carried / ranks)
    );
    if let (Some(cap_mib), Some(cap)) = (options.cap_mib, cap_text) {
        println!(
            "each rank capped at {cap_mib} MiB: rank 0 by a {cap}, every device by its memory limit"
        );
    }
    println!(
        "peak RSS per rank: max {:.0} MiB (baseline before the trainer: max {:.0} MiB); \
         (peak - baseline) x ranks = {:.0} MiB",
        mib(peak_max),
        mib(base_max),
        mib((peak_max - base_max) * ranks)
    );
    if let Some(path) = &options.expect {
        let want = std::fs::read_to_string(path)?;
        let got: Vec<String> = losses.iter().map(|l| l.to_bits().to_string()).collect();
        if got.join("\n") != want.trim() {
            return Err(format!(
                "losses {losses:?} differ from the thread mesh's ({want:?} as bits)"
            )
            .into());
        }
        println!("losses bitwise equal to the 1x{ranks} thread mesh's");
    }
    Ok(())
}
