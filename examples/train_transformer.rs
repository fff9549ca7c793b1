//! Trains a small decoder-only Transformer language model on a 2x4 thread mesh with
//! GSPMD's 2-D sharding (batch over `data`; heads and FFN hidden over `model`; weights
//! split over both axes and gathered just in time, their gradients reduce-scattered).
//!
//! The task is sequence reversal: each sequence is `BOS a1..a7 SEP a7..a1`, and the loss
//! is the next-token cross-entropy over the reversed half (the first half is random and
//! cannot be predicted). A model that has learned to reverse drives it towards 0; one
//! that guesses uniformly sits at ln(14) = 2.64.
//!
//! The parameters are chosen and initialised by name (each device draws only its
//! blocks), the learning rate warms up then follows a cosine (an input of the step: no
//! recompile) and the gradients are clipped to a global norm of 1. The first steps also
//! run on the reference interpreter (one device, no partitioning) and their losses are
//! compared; every `--eval-every N` steps (default 50, 0: never) the loss on held-out
//! sequences is computed by the forward program compiled once, on the resident weights;
//! the loss curves are written to `--plot PATH` (default
//! `target/train_transformer_loss.svg`) and a CSV beside it. At the end the sharded
//! parameters are saved as a safetensors checkpoint, loaded into a fresh trainer, and one
//! more step from each must give the same loss.
//!
//! ```text
//! cargo run --release --example train_transformer            # 300 steps
//! cargo run --release --example train_transformer -- 50 --eval-every 10
//! ```
//!
//! `--html PATH` also writes the compiled step's report as one HTML page
//! (`Executable::write_html`: memory, collectives and why, shardings on the mesh).
//!
//! With `--bench`, the step is timed instead (the comparison with JAX in
//! `benches/README.md` uses it): plain AdamW at a constant learning rate, no clipping,
//! no reference run and no checkpoint; after `--warmup`
//! steps it prints the losses of the first steps and the median ms/step over the
//! rest. `--mesh DxM` picks the `data`x`model` mesh (default 2x4), `--dims 128|256|512|1024`
//! a model of that d_model (heads of 64, FFN 4 x d_model, 128 tokens per sequence) in
//! place of the default `small` one, and `--dump PATH` writes the initial parameters (by the last
//! part of their names: `wq`, `w1`, ..), the first batches and their losses as
//! safetensors for `benches/jax/lm_step.py` to replay.
//!
//! ```text
//! cargo run --release --example train_transformer -- 30 --bench --mesh 1x2 --dims 512
//! ```
//!
//! With `--mpi` (build with `--features mpi`), the same training runs on the ranks of an
//! MPI job: `mpirun -np R` for the mesh's 8 devices gives each rank 8 / R of them (as
//! threads: 2 ranks x 4 threads like hosts of 4 accelerators, or 8 ranks of one device).
//! Every rank checks that the initial weights its devices drew (fetched) are bitwise
//! those of the single-device reference; rank 0 also runs the first steps on a thread
//! mesh of the same shape and fails unless its initial weights and losses are bitwise
//! equal; at the end a sharded checkpoint is saved (each rank writes its devices' blocks).
//!
//! ```text
//! cargo build --release --features mpi --example train_transformer
//! mpirun -np 2 target/release/examples/train_transformer 50 --mpi   # 2 ranks x 4 threads
//! mpirun -np 8 target/release/examples/train_transformer 50 --mpi   # 8 ranks
//! ```
//!
//! `--bf16` trains in mixed precision (`language_model`'s `compute` dtype): bf16
//! activations, f32 master weights converted to bf16 where they are used. Its losses
//! are compared with the reference interpreter's to 1e-2 (a contraction split across
//! devices rounds its partial products to bf16 once more than the reference does).

#[path = "common/bench.rs"]
mod bench;
mod common;

use std::path::PathBuf;
use std::time::Instant;

use gspmd::models::transformer::{LanguageModel, language_model};
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::train::{
    Initializer, Schedule, Trainer, chain, clip_by_global_norm, load_checkpoint, save_checkpoint,
    step_program,
};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

const BOS: i32 = 0;
const SEP: i32 = 1;
/// Content tokens are `2..VOCAB`.
const VOCAB: usize = 16;
const BATCH: usize = 16;
/// Steps compared with the reference interpreter.
const CHECKED_STEPS: usize = 3;

/// One batch of sequences `seq` tokens long (`BOS`, the content, `SEP`, the content
/// reversed): tokens, next-token targets, and loss weights (1 on the reversed half).
fn batch(rng: &mut Xoshiro256PlusPlus, seq: usize) -> Vec<Literal> {
    let half = (seq - 2) / 2;
    let mut tokens = Vec::with_capacity(BATCH * seq);
    let mut targets = Vec::with_capacity(BATCH * seq);
    let mut weights = Vec::with_capacity(BATCH * seq);
    for _ in 0..BATCH {
        let content: Vec<i32> = (0..half)
            .map(|_| rng.random_range(2..VOCAB as i32))
            .collect();
        let mut sequence = vec![BOS];
        sequence.extend(&content);
        sequence.push(SEP);
        sequence.extend(content.iter().rev());
        for i in 0..seq {
            tokens.push(sequence[i]);
            targets.push(sequence.get(i + 1).copied().unwrap_or(BOS));
            // Position i predicts sequence[i + 1]: the reversed half starts after SEP.
            weights.push(if (half + 1..seq - 1).contains(&i) {
                1.0
            } else {
                0.0
            });
        }
    }
    let shape = IxDyn(&[BATCH, seq]);
    vec![
        Literal::I32(ArrayD::from_shape_vec(shape.clone(), tokens).expect("shape fits")),
        Literal::I32(ArrayD::from_shape_vec(shape.clone(), targets).expect("shape fits")),
        Literal::F32(ArrayD::from_shape_vec(shape, weights).expect("shape fits")),
    ]
}

/// The parameters that learn: all but the data (`tokens`, `targets`, `weights`).
const TRAINED: [&str; 4] = ["embed", "position", "layers.*", "unembed"];

/// Initial values by name, from the `#[init]`s of [`LanguageModel`]'s fields: uniform in
/// ±1/sqrt(fan-in) (the first dim after the stacked layer dim; the heads and head dim
/// for `wo`; 1 for the embeddings).
fn initializer(seed: u64) -> Initializer {
    LanguageModel::initializer(seed)
}

/// Held-out batches for the validation loss.
const HELD_OUT: usize = 4;

/// The command line: see the module docs.
struct Options {
    steps: usize,
    mesh: [usize; 2],
    dims: language_model::Dims,
    /// `--bench`: time the steps instead of training.
    bench: Option<bench::Bench>,
    html: Option<PathBuf>,
    mpi: bool,
    eval_every: usize,
    plot: PathBuf,
    /// `--bf16`: mixed precision (bf16 activations, f32 master weights).
    compute: DType,
}

impl Options {
    fn parse() -> Result<Self, String> {
        let (mut dims, mut html, mut mpi, mut eval_every) = (dims("small")?, None, false, 50);
        let (mut plot, mut compute) = (
            common::output_path("train_transformer_loss.svg"),
            DType::F32,
        );
        let args = bench::Args::parse(300, |arg, rest| {
            let mut value = || rest.next().ok_or(format!("{arg} needs a value"));
            match arg {
                "--mpi" => mpi = true,
                "--bf16" => compute = DType::BF16,
                "--dims" => dims = self::dims(&value()?)?,
                "--html" => html = Some(value()?.into()),
                "--eval-every" => eval_every = bench::number(&value()?)?,
                "--plot" => plot = value()?.into(),
                _ => return Err(format!("unknown option {arg}")),
            }
            Ok(())
        })?;
        Ok(Options {
            steps: args.steps.unwrap_or(300),
            mesh: args.mesh.unwrap_or([2, 4]),
            dims,
            bench: args.bench,
            html,
            mpi,
            eval_every,
            plot,
            compute,
        })
    }
}

/// The model sizes: `small` (the default), or d_model `128`, `256`, `512` or `1024`
/// (heads of 64, FFN 4 x d_model, 128 tokens per sequence).
fn dims(name: &str) -> Result<language_model::Dims, String> {
    let (seq, d, h, k, f) = match name {
        "small" => (16, 64, 4, 16, 256),
        "128" | "256" | "512" | "1024" => {
            let d: usize = name.parse().expect("a number");
            (128, d, d / 64, 64, 4 * d)
        }
        _ => {
            return Err(format!(
                "--dims takes small, 128, 256, 512 or 1024, not `{name}`"
            ));
        }
    };
    Ok(language_model::Dims {
        B: BATCH,
        S: seq,
        V: VOCAB,
        D: d,
        L: 2,
        H: h,
        K: k,
        F: f,
    })
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::parse()?;
    let (steps, dims) = (options.steps, options.dims);
    let model = language_model::trace(dims, options.compute, 0.0)?;
    let mesh = language_model::mesh(options.mesh)?;
    let adamw = common::adamw(3e-3);
    if let Some(timing) = &options.bench {
        let step = step_program(&model, 0, &TRAINED, &adamw)?;
        let mut trainer = bench::trainer(step, mesh, initializer(7))?;
        let [d, m] = options.mesh;
        let label = format!("mesh {d}x{m}, d_model {}", dims.D);
        let mut data_rng = Xoshiro256PlusPlus::seed_from_u64(42);
        let names = ["tokens", "targets", "weights"];
        return bench::run(timing, &mut trainer, &label, &names, || {
            batch(&mut data_rng, dims.S)
        });
    }
    // AdamW on gradients clipped to a global norm of 1, warm-up then cosine decay.
    let clipped = chain([clip_by_global_norm(1.0), adamw]);
    let step = step_program(&model, 0, &TRAINED, &clipped)?;
    let schedule = Schedule::WarmupCosine {
        warmup: (steps / 10) as u64,
        total: steps.max(1) as u64,
        final_fraction: 0.1,
    };
    if options.mpi {
        return train_on_mpi(&options, step, mesh, schedule);
    }
    let seq = dims.S;
    println!(
        "model: {} layers, d_model {}, {} heads, vocabulary {VOCAB}, batch {BATCH} x {seq} tokens",
        dims.L, dims.D, dims.H
    );
    let started = Instant::now();
    let mut trainer =
        Trainer::on_mesh(step.clone(), mesh.clone(), initializer(7))?.with_schedule(schedule)?;
    let compiled = common::report_compiled(&trainer, started.elapsed());
    if let (Some(path), Some(exe)) = (&options.html, compiled) {
        exe.write_html(path)?;
        println!("report: {}", path.display());
    }

    // The first steps on one device, as the oracle.
    let mut reference =
        Trainer::reference(step.clone(), initializer(7))?.with_schedule(schedule)?;
    // The validation loss: the forward program compiled once, on held-out sequences.
    let evaluator = trainer.evaluator(&model, 0)?;
    let mut held_out_rng = Xoshiro256PlusPlus::seed_from_u64(4242);
    let held_out: Vec<Vec<Literal>> = (0..HELD_OUT)
        .map(|_| batch(&mut held_out_rng, seq))
        .collect();
    let mut validation_loss = |t: &Trainer| -> gspmd::Result<f32> {
        let mut total = 0.0;
        for data in &held_out {
            total += t.evaluate(&evaluator, data)?;
        }
        Ok(total / HELD_OUT as f32)
    };
    let validation = (options.eval_every > 0).then_some(common::Validation {
        every: options.eval_every,
        loss: &mut validation_loss,
    });
    let mut data_rng = Xoshiro256PlusPlus::seed_from_u64(42);
    let run = common::train(
        &mut trainer,
        &mut reference,
        steps,
        CHECKED_STEPS,
        20,
        BATCH * seq,
        "tokens",
        || batch(&mut data_rng, seq),
        validation,
    )?;
    let max_diff = run.max_diff;
    println!(
        "loss {:.4} at step 1 -> {:.4} (mean of the last {} steps); {:.1} ms/step, {:.0} tokens/s",
        run.first,
        run.mean_last,
        run.window,
        run.elapsed.as_secs_f64() * 1e3 / steps.max(1) as f64,
        (steps * BATCH * seq) as f64 / run.elapsed.as_secs_f64()
    );
    if let Some((step, loss)) = run.validation.last() {
        println!("validation loss {loss:.4} after step {step} ({HELD_OUT} held-out batches)");
    }
    println!(
        "first {CHECKED_STEPS} losses vs the single-device reference: max relative difference {max_diff:.2e}"
    );
    common::write_curves(&options.plot, "Transformer LM, sequence reversal", &run)?;

    // Checkpoint: save, load into a fresh trainer, and take one more step from both.
    let path = std::env::temp_dir().join("gspmd_train_transformer.safetensors");
    save_checkpoint(&path, &trainer.checkpoint()?)?;
    let mut resumed = Trainer::on_mesh(step, mesh, initializer(0))?.with_schedule(schedule)?;
    resumed.restore(&load_checkpoint(&path)?)?;
    let data = batch(&mut data_rng, seq);
    let (continued, reloaded) = (trainer.step(&data)?, resumed.step(&data)?);
    println!(
        "checkpoint {}: next loss {continued:.6} continuing, {reloaded:.6} after save+load",
        path.display()
    );
    let tolerance = if options.compute == DType::F32 {
        1e-4
    } else {
        1e-2
    };
    if continued != reloaded || max_diff > tolerance {
        return Err(format!(
            "mismatch: continued {continued} vs reloaded {reloaded}, reference difference {max_diff}"
        )
        .into());
    }
    Ok(())
}

/// `--mpi`: trains on the ranks of an MPI job (`mesh`'s devices spread evenly over
/// them); the initial weights must be bitwise the single-device reference's (on every
/// rank) and the thread mesh's, and rank 0 also runs the first steps on a thread mesh of
/// the same shape and fails unless the losses are bitwise equal; the checkpoint is
/// saved at the end.
#[cfg(feature = "mpi")]
fn train_on_mpi(
    options: &Options,
    step: gspmd::train::TrainStep,
    mesh: Mesh,
    schedule: Schedule,
) -> Result<(), Box<dyn std::error::Error>> {
    use gspmd::runtime::Backend;
    let mpi = gspmd::runtime::MpiMesh::new(mesh.clone())?;
    let ((rank, ranks), per_rank) = (mpi.process(), mpi.local_devices().len());
    let mut trainer = Trainer::new(step.clone(), mpi, initializer(7))?.with_schedule(schedule)?;
    let mut threads = (rank == 0)
        .then(|| {
            Trainer::on_mesh(step.clone(), mesh.clone(), initializer(7))?.with_schedule(schedule)
        })
        .transpose()?;
    // Each device drew its blocks: assembled, they are the single device's draw.
    let initial = trainer.params()?;
    let mut others = vec![Trainer::reference(step, initializer(7))?.params()?];
    if let Some(threads) = &threads {
        others.push(threads.params()?);
    }
    for other in &others {
        for ((name, a), (_, b)) in initial.iter().zip(other) {
            if a.bit_patterns() != b.bit_patterns() {
                return Err(format!("initial `{name}` differs on MPI").into());
            }
        }
    }
    let mut data_rng = Xoshiro256PlusPlus::seed_from_u64(42);
    let started = Instant::now();
    for i in 0..options.steps {
        let data = batch(&mut data_rng, options.dims.S);
        let loss = trainer.step(&data)?;
        if let Some(threads) = threads.as_mut().filter(|_| i < CHECKED_STEPS) {
            let want = threads.step(&data)?;
            if loss.to_bits() != want.to_bits() {
                let step = i + 1;
                return Err(format!("step {step}: loss {loss} on MPI, {want} on threads").into());
            }
        }
        if rank == 0 && (i % 10 == 0 || i + 1 == options.steps) {
            println!("step {} loss {loss:.4}", i + 1);
        }
    }
    let elapsed = started.elapsed();
    let path = std::env::temp_dir().join("gspmd_train_transformer_mpi");
    trainer.save(&path)?;
    if rank == 0 {
        println!(
            "{} steps on {mesh} over MPI ({ranks} ranks x {per_rank} devices) in {elapsed:.1?}; initial weights bitwise equal to 1 device and the thread mesh, the first {CHECKED_STEPS} losses to the thread mesh; checkpoint {}",
            options.steps,
            path.display()
        );
    }
    Ok(())
}

/// `--mpi` without the `mpi` feature: an error saying how to build.
#[cfg(not(feature = "mpi"))]
fn train_on_mpi(
    _: &Options,
    _: gspmd::train::TrainStep,
    _: Mesh,
    _: Schedule,
) -> Result<(), Box<dyn std::error::Error>> {
    Err("--mpi needs the example built with --features mpi".into())
}
