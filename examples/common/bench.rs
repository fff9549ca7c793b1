//! `--bench` for the training examples that `benches/jax` compares with JAX: time a
//! trainer's steps, print the first losses and the median ms/step, and with `--dump`
//! write the initial parameters, the first batches and their losses for the JAX twin to
//! replay. With `GSPMD_PROFILE=1` it also prints where a timed step's time goes, node
//! by node (`gspmd::runtime::profile`). Included by the examples that take `--bench`
//! (`#[path]`), so the others do not carry it.

use std::path::PathBuf;
use std::time::Instant;

use gspmd::CompileOptions;
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::runtime::profile;
use gspmd::train::{Initial, TrainStep, Trainer, save_checkpoint};

/// The largest rows of the per-node profile printed with `GSPMD_PROFILE=1`, unless
/// `GSPMD_PROFILE_ROWS` says how many.
const PROFILE_ROWS: usize = 40;

/// Steps whose losses are printed and whose batches `--dump` writes.
pub const LOGGED_STEPS: usize = 5;

/// The timing options of `--bench`.
pub struct Bench {
    /// Steps in all; more than `warmup`.
    pub steps: usize,
    /// Steps not timed (default 3).
    pub warmup: usize,
    /// `--dump PATH`: where to write the initial parameters, first batches and losses.
    pub dump: Option<PathBuf>,
}

/// The command line the benchmarked examples share:
/// `[STEPS] [--bench] [--mesh AxB] [--warmup N] [--dump PATH]`, plus their own options.
pub struct Args {
    /// The positional step count, if given.
    pub steps: Option<usize>,
    /// `--mesh AxB`, if given.
    pub mesh: Option<[usize; 2]>,
    /// `Some` with `--bench`: the steps (`default_steps` unless given), warm-up and dump.
    pub bench: Option<Bench>,
}

impl Args {
    /// Parses the process's arguments; `default_steps` is the step count of `--bench`
    /// without a positional count. Any other option goes to `other` with the arguments
    /// after it (to take its value from): it returns an error for an unknown one.
    pub fn parse(
        default_steps: usize,
        mut other: impl FnMut(&str, &mut dyn Iterator<Item = String>) -> Result<(), String>,
    ) -> Result<Self, String> {
        let (mut steps, mut mesh, mut bench) = (None, None, false);
        let (mut warmup, mut dump) = (3, None);
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or(format!("{arg} needs a value"));
            match arg.as_str() {
                "--bench" => bench = true,
                "--mesh" => mesh = Some(mesh_shape(&value()?)?),
                "--warmup" => warmup = number(&value()?)?,
                "--dump" => dump = Some(value()?.into()),
                _ if arg.starts_with("--") => other(&arg, &mut args)?,
                _ => steps = Some(number(&arg)?),
            }
        }
        if !bench && (dump.is_some() || warmup != 3) {
            return Err("--warmup and --dump need --bench".into());
        }
        let bench = bench.then(|| Bench {
            steps: steps.unwrap_or(default_steps),
            warmup,
            dump,
        });
        Ok(Args { steps, mesh, bench })
    }
}

/// A count given on the command line.
pub fn number(text: &str) -> Result<usize, String> {
    text.parse().map_err(|_| format!("`{text}` is not a count"))
}

/// `AxB`: the sizes of the mesh's two axes.
pub fn mesh_shape(text: &str) -> Result<[usize; 2], String> {
    match text.split_once('x').map(|(a, b)| (number(a), number(b))) {
        Some((Ok(a), Ok(b))) => Ok([a, b]),
        _ => Err(format!("--mesh takes two sizes such as 2x4, not `{text}`")),
    }
}

/// The trainer `--bench` times: `step` on a thread mesh of `mesh`, its parameters and
/// optimizer state donated (updated in place), as the JAX twins' `donate_argnums`
/// does.
pub fn trainer(
    step: TrainStep,
    mesh: Mesh,
    initial: impl Into<Initial>,
) -> Result<Trainer, gspmd::Error> {
    let options = CompileOptions {
        donated: step.carried(),
        ..CompileOptions::default()
    };
    Trainer::on_mesh_with(step, mesh, initial, &options)
}

/// Times `bench.steps` steps of `trainer` on `batch()`es (the median after
/// `bench.warmup`), prints the losses of the first [`LOGGED_STEPS`] steps and
/// `<label>: median X ms/step over N steps (min, max)`; with `bench.dump`, writes the
/// initial parameters (named by the last part of their names), the first batches (their
/// inputs named `data_names[j].<step>`) and their losses (`losses`) as safetensors.
pub fn run(
    bench: &Bench,
    trainer: &mut Trainer,
    label: &str,
    data_names: &[&str],
    mut batch: impl FnMut() -> Vec<Literal>,
) -> Result<(), Box<dyn std::error::Error>> {
    if bench.steps <= bench.warmup {
        return Err(format!(
            "--bench needs more steps than the {} warm-up ones",
            bench.warmup
        )
        .into());
    }
    let initial: Vec<(String, Literal)> = (trainer.params()?.into_iter())
        .map(|(name, value)| (name.rsplit('.').next().unwrap_or(&name).to_string(), value))
        .collect();
    let (mut losses, mut batches, mut times) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..bench.steps {
        let data = batch();
        if i == bench.warmup {
            profile::reset();
        }
        let started = Instant::now();
        let loss = trainer.step(&data)?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        if i >= bench.warmup {
            times.push(ms);
        }
        if i < LOGGED_STEPS {
            println!("step {} loss {loss:.8}", i + 1);
            losses.push(loss);
            batches.push(data);
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{label}: median {:.3} ms/step over {} steps (min {:.3}, max {:.3})",
        times[times.len() / 2],
        times.len(),
        times[0],
        times[times.len() - 1]
    );
    if profile::enabled() {
        let rows = std::env::var("GSPMD_PROFILE_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(PROFILE_ROWS);
        print!("{}", profile::report().table(times.len(), rows));
    }
    if let Some(path) = &bench.dump {
        let mut tensors = initial;
        for (i, data) in batches.into_iter().enumerate() {
            for (name, value) in data_names.iter().zip(data) {
                tensors.push((format!("{name}.{i}"), value));
            }
        }
        let n = losses.len();
        let losses = ArrayD::from_shape_vec(IxDyn(&[n]), losses).expect("shape fits");
        tensors.push(("losses".into(), Literal::F32(losses)));
        save_checkpoint(path, &tensors)?;
    }
    Ok(())
}
