//! Trains the μ-Transformer (`gspmd::models::mu_transformer`, after lucaslingle's
//! `mu_transformer`) on a 2x2x2 thread mesh of `rows` x `columns` x `planes`: the batch
//! over `rows`, `d_model` over `columns`, heads and FFN hidden over `planes`; μP's
//! initialisation (zero query and unembedding weights) and μP's AdamW (per-weight
//! learning rates `lr / fan_in`), the layers as one rematerialised `scan`.
//!
//! The task: each sequence is an arithmetic progression modulo the vocabulary,
//! `a, a + d, a + 2d, ..` with random `a` and `d` (1 to 3); the loss is the next-token
//! cross-entropy from the second position on (the first token alone does not tell
//! `d`). At initialisation the logits are zero (the unembedding is), so the first loss
//! is ln(16) = 2.77; a model that has learned the rule drives it towards 0.
//!
//! It prints the compiled step's collectives, checks the first losses against the
//! single-device reference interpreter (relative difference at most 1e-5) and that the
//! loss falls (the mean of the last 10 steps below half the first loss), and exits
//! non-zero if either check fails.
//!
//! ```text
//! cargo run --release --example train_mu_transformer          # 100 steps
//! cargo run --release --example train_mu_transformer -- 40
//! cargo run --release --example train_mu_transformer -- 40 --dump /tmp/mu.safetensors
//! ```
//!
//! `--lr X` sets the learning rate before μP's scaling (default 1); `--plot PATH`
//! where the loss curve goes (default `target/train_mu_transformer_loss.svg`, and a
//! CSV beside it); `--mesh RxCxP` another mesh. `--dump PATH` writes the initial
//! parameters (by name), the first batches (`tokens.<i>`, `targets.<i>`,
//! `weights.<i>`), their losses (`losses`) and the learning rate (`lr`) as
//! safetensors, for `benches/jax/mu_transformer.py` (the same model in JAX and optax)
//! to replay.

// Shared by the training examples; this one has μP's own optimizer (no `adamw`).
#[allow(dead_code)]
mod common;

use std::path::PathBuf;

use gspmd::models::mu_transformer::{MuTransformer, mu_adamw, mu_transformer};
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::train::{Trainer, save_checkpoint, step_program};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

const VOCAB: usize = 16;
/// Strides of the progressions are `1..=MAX_STRIDE`.
const MAX_STRIDE: usize = 3;
const BATCH: usize = 8;
const SEQ: usize = 16;
/// Adam's `beta1`, `beta2`, `eps` (the original's).
const ADAM: [f32; 3] = [0.9, 0.98, 1e-9];
/// Steps compared with the reference interpreter (and written by `--dump`).
const CHECKED_STEPS: usize = 5;
/// The largest relative difference from the reference allowed.
const TOLERANCE: f32 = 1e-5;
/// Steps whose mean loss must be below half the first.
const WINDOW: usize = 10;

fn dims() -> mu_transformer::Dims {
    mu_transformer::Dims {
        B: BATCH,
        S: SEQ,
        V: VOCAB,
        D: 64,
        L: 2,
        H: 4,
        K: 16,
        F: 256,
    }
}

/// One batch of arithmetic progressions modulo [`VOCAB`]: tokens, next-token targets
/// and loss weights (0 at the first position).
fn batch(rng: &mut Xoshiro256PlusPlus) -> Vec<Literal> {
    let (mut tokens, mut targets, mut weights) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..BATCH {
        let start = rng.random_range(0..VOCAB);
        let stride = rng.random_range(1..=MAX_STRIDE);
        let token = |i: usize| ((start + i * stride) % VOCAB) as i32;
        for i in 0..SEQ {
            tokens.push(token(i));
            targets.push(token(i + 1));
            weights.push(if i == 0 { 0.0 } else { 1.0 });
        }
    }
    let shape = IxDyn(&[BATCH, SEQ]);
    vec![
        Literal::I32(ArrayD::from_shape_vec(shape.clone(), tokens).expect("shape fits")),
        Literal::I32(ArrayD::from_shape_vec(shape.clone(), targets).expect("shape fits")),
        Literal::F32(ArrayD::from_shape_vec(shape, weights).expect("shape fits")),
    ]
}

/// The command line: see the module docs.
struct Options {
    steps: usize,
    mesh: [usize; 3],
    /// The learning rate before μP's per-weight scaling.
    lr: f32,
    dump: Option<PathBuf>,
    plot: PathBuf,
}

impl Options {
    fn parse() -> Result<Self, String> {
        let mut options = Options {
            steps: 100,
            mesh: [2, 2, 2],
            lr: 1.0,
            dump: None,
            plot: common::output_path("train_mu_transformer_loss.svg"),
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or(format!("{arg} needs a value"));
            match arg.as_str() {
                "--dump" => options.dump = Some(value()?.into()),
                "--mesh" => options.mesh = mesh_shape(&value()?)?,
                "--lr" => {
                    let text = value()?;
                    options.lr = text
                        .parse()
                        .map_err(|_| format!("`{text}` is not a rate"))?;
                }
                "--plot" => options.plot = value()?.into(),
                _ => options.steps = number(&arg)?,
            }
        }
        if options.steps < WINDOW.max(CHECKED_STEPS) {
            return Err(format!("train at least {WINDOW} steps"));
        }
        Ok(options)
    }
}

fn number(text: &str) -> Result<usize, String> {
    text.parse().map_err(|_| format!("`{text}` is not a count"))
}

/// `RxCxP`: the sizes of the `rows`, `columns` and `planes` axes.
fn mesh_shape(text: &str) -> Result<[usize; 3], String> {
    let sizes: Result<Vec<usize>, String> = text.split('x').map(number).collect();
    match sizes?.as_slice() {
        &[r, c, p] => Ok([r, c, p]),
        _ => Err(format!(
            "--mesh takes ROWSxCOLUMNSxPLANES such as 2x2x2, not `{text}`"
        )),
    }
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::parse()?;
    let dims = dims();
    let model = mu_transformer::trace(dims)?;
    let optimizer = mu_adamw(options.lr, ADAM, dims.D, dims.F);
    let step = step_program(&model, 0, &["embed", "layers.*", "unembed"], &optimizer)?;
    let mesh = mu_transformer::mesh(options.mesh)?;
    println!(
        "μ-Transformer: {} layers, d_model {}, {} heads of {}, FFN {}, vocabulary {VOCAB}, batch {BATCH} x {SEQ} tokens, mesh {mesh}",
        dims.L, dims.D, dims.H, dims.K, dims.F
    );
    let started = std::time::Instant::now();
    let mut trainer = Trainer::on_mesh(step.clone(), mesh, MuTransformer::initializer(7))?;
    common::report_compiled(&trainer, started.elapsed());
    let initial = trainer.params()?;
    let mut reference = Trainer::reference(step, MuTransformer::initializer(7))?;

    let mut data_rng = Xoshiro256PlusPlus::seed_from_u64(42);
    let run = common::train(
        &mut trainer,
        &mut reference,
        options.steps,
        CHECKED_STEPS,
        WINDOW,
        BATCH * SEQ,
        "tokens",
        || batch(&mut data_rng),
        None,
    )?;
    println!(
        "loss {:.4} at step 1 -> {:.4} (mean of the last {} steps); {:.1} ms/step",
        run.first,
        run.mean_last,
        run.window,
        run.elapsed.as_secs_f64() * 1e3 / options.steps as f64
    );
    println!(
        "first losses: {:?}; vs the single-device reference: max relative difference {:.2e}",
        &run.losses[..CHECKED_STEPS],
        run.max_diff
    );
    common::write_curves(
        &options.plot,
        "μ-Transformer, arithmetic progressions",
        &run,
    )?;
    if let Some(path) = &options.dump {
        let mut tensors = initial;
        let mut data_rng = Xoshiro256PlusPlus::seed_from_u64(42);
        for i in 0..CHECKED_STEPS {
            let names = ["tokens", "targets", "weights"];
            for (name, value) in names.into_iter().zip(batch(&mut data_rng)) {
                tensors.push((format!("{name}.{i}"), value));
            }
        }
        let losses = run.losses[..CHECKED_STEPS].to_vec();
        let losses = ArrayD::from_shape_vec(IxDyn(&[CHECKED_STEPS]), losses)?;
        tensors.push(("losses".into(), Literal::F32(losses)));
        let lr = ArrayD::from_elem(IxDyn(&[]), options.lr);
        tensors.push(("lr".into(), Literal::F32(lr)));
        save_checkpoint(path, &tensors)?;
        println!(
            "wrote the initial weights, first batches and losses to {}",
            path.display()
        );
    }
    if run.max_diff > TOLERANCE {
        return Err(format!(
            "the first losses differ from the reference by {:.2e} > {TOLERANCE:.0e}",
            run.max_diff
        )
        .into());
    }
    if run.mean_last >= 0.5 * run.first {
        return Err(format!(
            "the loss did not fall: {:.4} at step 1, {:.4} at the end",
            run.first, run.mean_last
        )
        .into());
    }
    Ok(())
}
