//! Issue 25 item 3, data per process: sources of examples (in memory, a safetensors file
//! read row by row, a function of the batch index and rows) batched for a trainer's
//! data layout. A process asks only for its devices' rows of each batch, once; the
//! blocks train exactly like the global batch; the file source reads only those rows'
//! bytes; bad data is a typed error naming the problem.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::rc::Rc;

use gspmd_core::Error;
use gspmd_core::error::InputProblem;
use gspmd_core::ir::{Builder, DType, Literal, Program, TensorType};
use gspmd_core::runtime::{shard_literal, uniform_f32};
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::train::{
    Batch, Batches, DataLayout, Dataset, Init, Initializer, Optimizer, SafetensorsFile, Source,
    Trainer, save_checkpoint, step_program,
};
use ndarray::{ArrayD, IxDyn};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

// ---- helpers -------------------------------------------------------------------------

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

/// Examples of `x: f32[16]` and `target: f32[8]`.
const X: usize = 16;
const Y: usize = 8;
/// Examples in the sources.
const EXAMPLES: usize = 40;

/// `loss = mse(x w + bias, target)` on batches of `batch`: `x` split over `data`, `target`
/// over `data` and `model` (its other dim is cut per device too).
fn dense(batch: usize) -> Program {
    let b = Builder::new("dense");
    let x = b
        .parameter("x", [batch, X], DType::F32)
        .annotate(s("(data, _)"));
    let target = b
        .parameter("target", [batch, Y], DType::F32)
        .annotate(s("(data, model)"));
    let w = b
        .parameter("dense.w", [X, Y], DType::F32)
        .annotate(s("(data, model)"));
    let bias = b
        .parameter("dense.bias", [Y], DType::F32)
        .annotate(s("(model)"));
    let y = &x.matmul(&w) + &bias.broadcast_in_dim([batch, Y], &[1]);
    b.finish(&[&y.mse(&target)]).unwrap()
}

/// A trainer of [`dense`] with AdamW on `mesh`, the same for the same arguments.
fn trainer(batch: usize, mesh: &Mesh) -> Trainer {
    let step = step_program(&dense(batch), 0, &["dense.*"], &Optimizer::adamw(0.05)).unwrap();
    let init = Initializer::new(1)
        .rule("*.w", Init::fan_in(&[0]))
        .rule("*.bias", Init::Normal { std: 0.1 });
    Trainer::on_mesh(step, mesh.clone(), init).unwrap()
}

fn mesh(data: usize, model: usize) -> Mesh {
    Mesh::new([("data", data), ("model", model)]).unwrap()
}

/// The two fields of [`dense`]'s data, `EXAMPLES` examples each.
fn examples() -> Vec<Literal> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(25);
    vec![
        uniform_f32(&mut rng, &[EXAMPLES, X], -1.0, 1.0),
        uniform_f32(&mut rng, &[EXAMPLES, Y], -1.0, 1.0),
    ]
}

/// A safetensors file in the temp dir holding `fields` as `x` and `target`, after a
/// tensor no batch reads (`other`, 4 KiB).
fn data_file(name: &str, fields: &[Literal]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("gspmd_data_{}_{name}", std::process::id()));
    let tensors = vec![
        ("other".to_string(), Literal::full(&[1024], DType::F32, 3.0)),
        ("x".to_string(), fields[0].clone()),
        ("target".to_string(), fields[1].clone()),
    ];
    save_checkpoint(&path, &tensors).unwrap();
    path
}

/// Rows `rows` of batch `k` of a made-up dataset: every element a function of its
/// global position, so any rows are computed alone.
fn made_rows(k: u64, rows: Range<usize>) -> gspmd_core::Result<Vec<Literal>> {
    let field = |width: usize, salt: usize| {
        let at = |ix: IxDyn| {
            let n = (k as usize * 131 + (rows.start + ix[0]) * 17 + ix[1] * 5 + salt) % 23;
            n as f32 / 11.0 - 1.0
        };
        Literal::F32(ArrayD::from_shape_fn(IxDyn(&[rows.len(), width]), at))
    };
    Ok(vec![field(X, 0), field(Y, 7)])
}

fn made_fields() -> Vec<TensorType> {
    vec![
        TensorType::new([X], DType::F32),
        TensorType::new([Y], DType::F32),
    ]
}

/// A source that records every `(field, examples)` it is asked for.
struct Recorded<'a> {
    inner: &'a dyn Source,
    asked: RefCell<Vec<(usize, Vec<usize>)>>,
}

impl Source for Recorded<'_> {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn fields(&self) -> Vec<TensorType> {
        self.inner.fields()
    }
    fn read(&self, field: usize, examples: &[usize]) -> gspmd_core::Result<Literal> {
        self.asked.borrow_mut().push((field, examples.to_vec()));
        self.inner.read(field, examples)
    }
}

/// A file that counts the reads and bytes read from it.
struct Counted {
    file: File,
    tally: Rc<Tally>,
}

#[derive(Default)]
struct Tally {
    reads: Cell<u64>,
    bytes: Cell<u64>,
}

impl FileExt for Counted {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.file.read_at(buf, offset)?;
        self.tally.reads.set(self.tally.reads.get() + 1);
        self.tally.bytes.set(self.tally.bytes.get() + n as u64);
        Ok(n)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.file.write_at(buf, offset)
    }
}

/// The message of a [`Error::TrainerInput`], else a panic.
fn trainer_input<T>(result: gspmd_core::Result<T>) -> String {
    match result {
        Err(Error::TrainerInput { problem, .. }) => problem.to_string(),
        Err(other) => panic!("expected a TrainerInput error, got {other}"),
        Ok(_) => panic!("expected a TrainerInput error, got Ok"),
    }
}

// ---- a process reads its rows only -----------------------------------------------------

/// On a 2x4 mesh with the batch split over `data`, a process holding devices 4..8 asks
/// the source for rows 4..8 of each batch, once per field (its four devices replicate
/// them), and its blocks are the global batch's; a process holding all eight devices
/// asks for each half once.
#[test]
fn a_process_asks_only_for_its_devices_rows() {
    let mesh = mesh(2, 4);
    let layout = trainer(8, &mesh).data_layout();
    let dataset = Dataset::new(examples()).unwrap();
    let global: Vec<Batch> = (Batches::shuffled(&dataset, 8, 2, 3, None).unwrap())
        .map(|b| b.unwrap().1)
        .collect();
    assert_eq!(global.len(), 2 * (EXAMPLES / 8));
    for (devices, halves) in [(4..8, vec![(4, 8)]), (0..8, vec![(0, 4), (4, 8)])] {
        let recorded = Recorded {
            inner: &dataset,
            asked: RefCell::new(Vec::new()),
        };
        let layout = DataLayout {
            devices: devices.clone(),
            ..layout.clone()
        };
        let batches = Batches::shuffled(&recorded, 8, 2, 3, layout.clone()).unwrap();
        let mut count = 0;
        for (k, item) in batches.enumerate() {
            let (epoch, Batch::Blocks(blocks)) = item.unwrap() else {
                panic!("a layout gives blocks")
            };
            let (per_epoch, at) = (EXAMPLES / 8, (k % (EXAMPLES / 8)) * 8);
            assert_eq!(epoch as usize, k / per_epoch);
            let order = dataset.order(3, epoch);
            let mut want: Vec<(usize, Vec<usize>)> = (halves.iter())
                .flat_map(|&(start, end)| (0..2).map(move |f| (f, start, end)))
                .map(|(f, start, end)| (f, order[at + start..at + end].to_vec()))
                .collect();
            let mut asked = recorded.asked.take();
            asked.sort();
            want.sort();
            assert_eq!(asked, want, "batch {k} on devices {devices:?}");
            let Batch::Global(whole) = &global[k] else {
                panic!("no layout gives global arrays")
            };
            for ((blocks, sharding), whole) in blocks.iter().zip(&layout.shardings).zip(whole) {
                assert_eq!(blocks.len(), devices.len());
                for (block, d) in blocks.iter().zip(devices.clone()) {
                    assert_eq!(
                        block,
                        &shard_literal(whole, sharding, &mesh, d),
                        "device {d}"
                    );
                }
            }
            count += 1;
        }
        assert_eq!(count, global.len());
    }
}

// ---- the blocks train like the global batch ---------------------------------------------

/// Steps on `batches` (cut for `blocks`' layout) give bitwise the losses and parameters
/// of steps of a twin trainer on the global `whole` batches; returns the losses.
fn train_alike(
    mut by_blocks: Trainer,
    mut by_global: Trainer,
    batches: Batches,
    whole: Batches,
) -> Vec<f32> {
    let mut losses = Vec::new();
    for (cut, global) in batches.zip(whole) {
        let (Batch::Blocks(blocks), Batch::Global(global)) = (cut.unwrap().1, global.unwrap().1)
        else {
            panic!("blocks with a layout, global arrays without")
        };
        let loss = by_blocks.step_batch(&Batch::Blocks(blocks)).unwrap();
        assert_eq!(loss.to_bits(), by_global.step(&global).unwrap().to_bits());
        losses.push(loss);
    }
    assert_eq!(by_blocks.params().unwrap(), by_global.params().unwrap());
    losses
}

/// For each source — in memory, a safetensors file, a function — steps on the blocks
/// of a 2x4 thread mesh give bitwise the losses and parameters of steps on the global
/// batches; the dataset and the file holding the same examples train alike.
#[test]
fn blocks_train_like_the_global_batch_for_every_source() {
    let mesh = mesh(2, 4);
    let twins = || (trainer(8, &mesh), trainer(8, &mesh));
    let layout = trainer(8, &mesh).data_layout();
    let fields = examples();
    let dataset = Dataset::new(fields.clone()).unwrap();
    let path = data_file("alike", &fields);
    let file = SafetensorsFile::open(&path, &["x", "target"]).unwrap();
    assert_eq!(file.fields(), dataset.fields());
    let sources: [&dyn Source; 2] = [&dataset, &file];
    let mut per_source = Vec::new();
    for source in sources {
        let (a, b) = twins();
        let batches = Batches::shuffled(source, 8, 2, 9, layout.clone()).unwrap();
        let whole = Batches::shuffled(source, 8, 2, 9, None).unwrap();
        per_source.push(train_alike(a, b, batches, whole));
    }
    assert_eq!(per_source[0], per_source[1], "the dataset and its file");
    assert_eq!(per_source[0].len(), 2 * EXAMPLES / 8);
    let (a, b) = twins();
    let batches = Batches::from_fn(made_fields(), 8, 6, layout, made_rows).unwrap();
    let whole = Batches::from_fn(made_fields(), 8, 6, None, made_rows).unwrap();
    let losses = train_alike(a, b, batches, whole);
    assert_eq!(losses.len(), 6);
    std::fs::remove_file(path).unwrap();
}

/// A batch of 6 over a `data` axis of 4 gives devices 2, 2, 2 and 0 rows: the function
/// is called once per non-empty run of rows (never for the empty one), and the blocks,
/// empty ones included, train like the global batch.
#[test]
fn uneven_blocks_read_each_run_once_and_train_alike() {
    let mesh = mesh(4, 2);
    let layout = trainer(6, &mesh).data_layout();
    let calls = RefCell::new(Vec::new());
    let recorded = |k: u64, rows: Range<usize>| {
        calls.borrow_mut().push((k, rows.clone()));
        made_rows(k, rows)
    };
    let batches = Batches::from_fn(made_fields(), 6, 3, layout, recorded).unwrap();
    let whole = Batches::from_fn(made_fields(), 6, 3, None, made_rows).unwrap();
    train_alike(trainer(6, &mesh), trainer(6, &mesh), batches, whole);
    let mut calls = calls.take();
    calls.sort_by_key(|(k, r)| (*k, r.start));
    let want: Vec<(u64, Range<usize>)> = (0..3)
        .flat_map(|k| [(k, 0..2), (k, 2..4), (k, 4..6)])
        .collect();
    assert_eq!(calls, want);
}

// ---- the file source reads only what it is asked for ------------------------------------

/// Opening reads the header and the data's last byte; each batch then reads exactly its
/// rows' bytes (4 rows of 96 bytes for devices 4..8 of the 2x4 mesh), one read per
/// example and field (shuffled examples are rarely consecutive), never the rest of the
/// file; the rows match the in-memory dataset's.
#[test]
fn the_file_source_reads_only_the_rows_asked_for() {
    let fields = examples();
    let path = data_file("counted", &fields);
    let tally = Rc::new(Tally::default());
    let counted = Counted {
        file: File::open(&path).unwrap(),
        tally: tally.clone(),
    };
    let file = SafetensorsFile::new(counted, path.display().to_string(), &["x", "target"]).unwrap();
    let mut word = [0; 8];
    File::open(&path)
        .unwrap()
        .read_exact_at(&mut word, 0)
        .unwrap();
    let header = 8 + u64::from_le_bytes(word);
    assert_eq!(
        tally.bytes.get(),
        header + 1,
        "the header and the data's last byte"
    );
    let layout = DataLayout {
        devices: 4..8,
        ..trainer(8, &mesh(2, 4)).data_layout()
    };
    let dataset = Dataset::new(fields).unwrap();
    let mut from_file = Batches::shuffled(&file, 8, 3, 4, layout.clone()).unwrap();
    let from_memory = Batches::shuffled(&dataset, 8, 3, 4, layout).unwrap();
    let mut batches = 0;
    for want in from_memory {
        let (bytes, reads) = (tally.bytes.get(), tally.reads.get());
        assert_eq!(from_file.next().unwrap().unwrap(), want.unwrap());
        let row = 4 * (X + Y) as u64;
        assert_eq!(tally.bytes.get() - bytes, 4 * row, "batch {batches}");
        assert!(tally.reads.get() - reads <= 2 * 4, "batch {batches}");
        batches += 1;
    }
    assert!(from_file.next().is_none());
    assert_eq!(batches, 3 * EXAMPLES / 8);
    // Consecutive examples are one read: all of `x` at once.
    let (bytes, reads) = (tally.bytes.get(), tally.reads.get());
    let all: Vec<usize> = (0..EXAMPLES).collect();
    assert_eq!(
        file.read(0, &all).unwrap(),
        dataset.gather(&all).unwrap()[0]
    );
    assert_eq!(tally.bytes.get() - bytes, (EXAMPLES * X * 4) as u64);
    assert_eq!(tally.reads.get() - reads, 1);
    std::fs::remove_file(path).unwrap();
}

// ---- bad data is a typed error naming the problem ---------------------------------------

/// A file shorter than its header says is an error at opening, as is a tensor the file
/// lacks, one holding another number of examples, or a scalar.
#[test]
fn a_bad_data_file_is_a_typed_error() {
    let fields = examples();
    let path = data_file("bad", &fields);
    let size = std::fs::metadata(&path).unwrap().len();
    let message = trainer_input(SafetensorsFile::open(&path, &["x", "nope"]));
    assert!(message.contains("no tensor `nope`"), "{message}");
    let message = trainer_input(SafetensorsFile::open(&path, &["x", "other"]));
    assert!(message.contains("`other` holds 1024 examples"), "{message}");
    let message = trainer_input(SafetensorsFile::open(&path, &[]));
    assert!(message.contains("no tensor"), "{message}");
    let opened = SafetensorsFile::open(&path, &["x", "target"]).unwrap();
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(size - 1)
        .unwrap();
    let message = trainer_input(SafetensorsFile::open(&path, &["x"]));
    assert!(message.contains("truncated"), "{message}");
    // Truncated after opening: reading the last example of the file's last tensor
    // fails.
    let last = [0, 1].map(|f| opened.read(f, &[EXAMPLES - 1]));
    let message = trainer_input(last.into_iter().find(Result::is_err).unwrap());
    assert!(message.contains("truncated"), "{message}");
    let message = trainer_input(opened.read(0, &[EXAMPLES]));
    assert!(
        message.contains(&format!("no example {EXAMPLES}")),
        "{message}"
    );
    std::fs::write(&path, b"not a safetensors file").unwrap();
    trainer_input(SafetensorsFile::open(&path, &["x"]));
    std::fs::remove_file(path).unwrap();
}

/// A function giving rows of the wrong shape or dtype, or too few arrays, makes that
/// batch an error naming the rows and field; the rest of the batches are unaffected.
#[test]
fn a_function_giving_wrong_rows_is_a_typed_error() {
    let layout = trainer(8, &mesh(2, 4)).data_layout();
    let wrong = |k: u64, rows: Range<usize>| {
        let mut made = made_rows(k, rows.clone())?;
        match k {
            1 => made[0] = Literal::full(&[rows.len(), X - 1], DType::F32, 0.0),
            2 => made[1] = Literal::full(&[rows.len(), Y], DType::I32, 0.0),
            3 => {
                made.pop();
            }
            _ => {}
        }
        Ok(made)
    };
    let items: Vec<_> = Batches::from_fn(made_fields(), 8, 5, layout, wrong)
        .unwrap()
        .collect();
    assert!(items[0].is_ok() && items[4].is_ok());
    let messages: Vec<String> = items
        .into_iter()
        .skip(1)
        .take(3)
        .map(trainer_input)
        .collect();
    assert!(
        messages[0].contains("field 0: expected f32[4,16], got f32[4,15]"),
        "{}",
        messages[0]
    );
    assert!(
        messages[1].contains("field 1: expected f32[4,8], got i32[4,8]"),
        "{}",
        messages[1]
    );
    assert!(
        messages[2].contains("1 arrays for 2 fields"),
        "{}",
        messages[2]
    );
}

/// Fields that do not match the step's data inputs: another number is an error when
/// batching starts, a field of another rank too (naming the data input), and one of
/// another size an error of the step naming its input; an out-of-range batch or
/// layout is an error too.
#[test]
fn fields_mismatched_with_the_step_are_typed_errors() {
    let mesh = mesh(2, 4);
    let mut t = trainer(8, &mesh);
    let layout = t.data_layout();
    let mut fields = examples();
    let three = Dataset::new(vec![
        fields[0].clone(),
        fields[1].clone(),
        fields[1].clone(),
    ]);
    let message = trainer_input(Batches::shuffled(&three.unwrap(), 8, 1, 0, layout.clone()));
    assert!(message.contains("3 fields for 2 data inputs"), "{message}");
    let cube = Dataset::new(vec![
        Literal::full(&[EXAMPLES, 4, 4], DType::F32, 1.0),
        fields[1].clone(),
    ]);
    let message = trainer_input(Batches::shuffled(&cube.unwrap(), 8, 1, 0, layout.clone()));
    assert!(message.contains("data input 0"), "{message}");
    let message = trainer_input(Batches::from_fn(made_fields(), 0, 1, None, made_rows));
    assert!(message.contains("a batch of 0"), "{message}");
    let elsewhere = DataLayout {
        devices: 6..10,
        ..layout.clone()
    };
    let message = trainer_input(Batches::from_fn(made_fields(), 8, 1, elsewhere, made_rows));
    assert!(
        message.contains("devices 6..10 of a mesh of 8"),
        "{message}"
    );
    fields[0] = Literal::full(&[EXAMPLES, X - 1], DType::F32, 1.0);
    let narrow = Dataset::new(fields).unwrap();
    let message = trainer_input(Batches::shuffled(&narrow, EXAMPLES + 1, 1, 0, None));
    assert!(
        message.contains("a batch of 41 from 40 examples"),
        "{message}"
    );
    let (_, batch) = (narrow.batches(8, 1, 0, layout).unwrap().next())
        .unwrap()
        .unwrap();
    let error = t.step_batch(&batch);
    assert!(matches!(error, Err(Error::Input { .. })), "{error:?}");
}

/// An example index past the end of a dataset is a typed error naming it, not a panic.
#[test]
fn gathering_an_example_past_the_end_is_a_typed_error() {
    let dataset = Dataset::new(examples()).unwrap();
    let n = dataset.len();
    let err = dataset.gather(&[0, n + 980]).unwrap_err();
    assert!(
        matches!(&err, Error::TrainerInput { problem: InputProblem::OutOfRange { what: "example", index, len }, .. } if (*index, *len) == (n + 980, n)),
        "{err}"
    );
    assert_eq!(dataset.gather(&[n - 1]).unwrap().len(), examples().len());
}
