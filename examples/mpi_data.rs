//! Training data per process on MPI ranks, run under `mpirun` with 2 or 4 ranks:
//!
//! ```text
//! cargo build --release --features mpi --example mpi_data
//! mpirun -np 4 target/release/examples/mpi_data
//! ```
//!
//! A small language model trains on the ranks (the `data` axis of size 2: each rank's
//! device holds half of each batch) from two per-process sources: a safetensors file of
//! sequences (written by rank 0), from which each rank reads only its devices' rows of
//! each shuffled batch, and a function that makes exactly the rows a rank asks for of
//! batch `k`. Every rank also trains on a thread mesh of the same shape fed the global
//! batches of the same source, and fails unless the losses are bitwise equal, or if it
//! asked the file for more than its half of the examples.

use std::cell::Cell;
use std::ops::Range;

use gspmd::ir::{DType, Literal, TensorType};
use gspmd::models::transformer::language_model;
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::runtime::{Backend, MpiMesh};
use gspmd::train::{
    Batch, Batches, Init, Initializer, Optimizer, SafetensorsFile, Source, Trainer,
    save_checkpoint, step_program,
};

/// A failure of this check: a gspmd error, or a result that is not what it must be.
type Failure = Box<dyn std::error::Error>;

/// Results of this check's steps (gspmd's own in the programs run on the mesh).
type Result<T, E = Failure> = std::result::Result<T, E>;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

/// The model's batch, sequence length and vocabulary.
const BATCH: usize = 4;
const SEQ: usize = 6;
const VOCAB: usize = 8;
/// Sequences in the file.
const SEQUENCES: usize = 24;
/// Steps per source.
const STEPS: u64 = 4;

/// Tokens, next-token targets and loss weights of sequences `rows` of those seeded from
/// `first` on (row `r` drawn from seed `first + r`): the same rows wherever they are
/// made.
fn sequences(first: u64, rows: Range<usize>) -> Vec<Literal> {
    let n = rows.len();
    let (mut tokens, mut targets) = (Vec::with_capacity(n * SEQ), Vec::with_capacity(n * SEQ));
    for r in rows {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(first + r as u64);
        let sequence: Vec<i32> = (0..=SEQ)
            .map(|_| rng.random_range(0..VOCAB as i32))
            .collect();
        tokens.extend(&sequence[..SEQ]);
        targets.extend(&sequence[1..]);
    }
    let shape = IxDyn(&[n, SEQ]);
    vec![
        Literal::I32(ArrayD::from_shape_vec(shape.clone(), tokens).expect("n x SEQ tokens")),
        Literal::I32(ArrayD::from_shape_vec(shape, targets).expect("n x SEQ targets")),
        Literal::full(&[n, SEQ], DType::F32, 1.0),
    ]
}

/// A source that counts the examples it is asked for.
struct Counted<'a> {
    source: &'a dyn Source,
    asked: Cell<usize>,
}

impl Source for Counted<'_> {
    fn len(&self) -> usize {
        self.source.len()
    }
    fn fields(&self) -> Vec<TensorType> {
        self.source.fields()
    }
    fn read(&self, field: usize, examples: &[usize]) -> gspmd::Result<Literal> {
        self.asked.set(self.asked.get() + examples.len());
        self.source.read(field, examples)
    }
}

/// Trains a trainer on the ranks on `batches` (cut for `on_ranks`'s layout) and one on
/// a thread mesh on the global `whole` batches; an error unless every loss is bitwise
/// equal.
fn train_alike(
    what: &str,
    mut on_ranks: Trainer,
    mut on_threads: Trainer,
    batches: Batches,
    whole: Batches,
) -> Result<()> {
    for (i, (cut, global)) in batches.zip(whole).enumerate() {
        let ((_, cut), (_, global)) = (cut?, global?);
        let Batch::Global(global) = global else {
            return Err("batches without a layout are global".into());
        };
        let (got, want) = (on_ranks.step_batch(&cut)?, on_threads.step(&global)?);
        if got.to_bits() != want.to_bits() {
            return Err(format!(
                "{what}, step {}: loss {got} on the ranks, {want} on threads",
                i + 1
            )
            .into());
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let mpi = MpiMesh::init()?;
    let ranks = mpi.mesh().num_devices();
    if ranks != 2 && ranks != 4 {
        return Err(format!("run with mpirun -np 2 or -np 4, not {ranks} ranks").into());
    }
    let me = mpi.device();
    let dims = language_model::Dims {
        B: BATCH,
        S: SEQ,
        V: VOCAB,
        D: 16,
        L: 1,
        H: 2,
        K: 8,
        F: 32,
    };
    let model = language_model::trace(dims, DType::F32, 0.0)?;
    let trained = ["embed", "position", "layers.*", "unembed"];
    let step = step_program(&model, 0, &trained, &Optimizer::adamw(1e-2))?;
    let mesh = language_model::mesh([2, ranks / 2])?;
    let init = Initializer::new(3).rule("*", Init::Normal { std: 0.1 });
    let trainers = || -> Result<(Trainer, Trainer)> {
        let on_ranks = Trainer::new(step.clone(), MpiMesh::new(mesh.clone())?, init.clone())?;
        Ok((
            on_ranks,
            Trainer::on_mesh(step.clone(), mesh.clone(), init.clone())?,
        ))
    };

    // The file: written by rank 0 while the others wait, then read by every rank.
    let path = std::env::temp_dir().join(format!("gspmd_mpi_data_{ranks}.safetensors"));
    let names = ["tokens", "targets", "weights"];
    mpi.together("the writing of the data file", &mut || {
        if me != 0 {
            return Ok(());
        }
        let fields = sequences(0, 0..SEQUENCES);
        save_checkpoint(
            &path,
            &names
                .map(String::from)
                .into_iter()
                .zip(fields)
                .collect::<Vec<_>>(),
        )
    })?;
    let file = SafetensorsFile::open(&path, &names)?;
    let counted = Counted {
        source: &file,
        asked: Cell::new(0),
    };
    let (on_ranks, on_threads) = trainers()?;
    let batches = Batches::shuffled(&counted, BATCH, 1, 7, on_ranks.data_layout())?;
    let whole = Batches::shuffled(&file, BATCH, 1, 7, None)?;
    train_alike("the file", on_ranks, on_threads, batches, whole)?;
    // Each rank's device holds half of each batch: per field, half the batch's examples.
    let half = (SEQUENCES / BATCH) * (BATCH / 2) * names.len();
    if counted.asked.get() != half {
        return Err(format!(
            "rank {me} asked the file for {} examples, not its {half}",
            counted.asked.get()
        )
        .into());
    }

    // The function: row `r` of batch `k` is the sequence of seed `1000 + k * BATCH + r`.
    let make = |k: u64, rows: Range<usize>| Ok(sequences(1000 + k * BATCH as u64, rows));
    let fields = file.fields();
    let (on_ranks, on_threads) = trainers()?;
    let batches = Batches::from_fn(fields.clone(), BATCH, STEPS, on_ranks.data_layout(), make)?;
    let whole = Batches::from_fn(fields, BATCH, STEPS, None, make)?;
    train_alike("the function", on_ranks, on_threads, batches, whole)?;
    if me == 0 {
        println!(
            "mpi_data: {ranks} ranks on {mesh}: each read its half of every batch, from a file \
             and from a function; losses bitwise equal to the thread mesh fed the global batch"
        );
    }
    Ok(())
}
