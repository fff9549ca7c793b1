//! Sharded checkpoints: saved on one mesh, loaded onto others (another mesh shape, the
//! reference interpreter, fewer devices), with the loaded parameters and optimizer state
//! bitwise those saved and the next step bitwise that of a trainer of the same mesh
//! restored from the saved global tensors; the files' format (each a safetensors file
//! holding each distinct block once); saves over an earlier checkpoint, and a save that
//! fails before its commit leaving the earlier one loadable.
//!
//! Bad checkpoints (truncated, damaged, mismatched) are in the root's
//! `tests/bad_input.rs`; the largest allocation while saving and loading in
//! `tests/checkpoint_memory.rs`; MPI ranks in `examples/mpi_check.rs`.

use std::path::{Path, PathBuf};

use gspmd_core::Error;
use gspmd_core::error::CheckpointProblem;
use gspmd_core::ir::{Builder, DType, Literal, Program};
use gspmd_core::runtime::uniform_f32;
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::train::{
    Adafactor, Optimizer, STEP_COUNT, TrainStep, Trainer, load_checkpoint, save_checkpoint,
    step_program,
};
use ndarray::{AxisDescription, Slice};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

/// A directory for a test's checkpoint (removed first if a run left it).
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gspmd_checkpoint_{}_{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// An MLP whose trained tensors split unevenly on 2x4 and 4x2 meshes (14 columns over 4
/// devices: 4, 4, 4, 2; 10 rows over 4: 3, 3, 3, 1; 6 over 4: 2, 2, 2 and an empty
/// block), with a weight split over both axes, a bias, and a replicated scalar.
fn uneven_mlp() -> Program {
    let b = Builder::new("uneven_mlp");
    let x = b
        .parameter("x", [8, 10], DType::F32)
        .annotate(s("(data, _)"));
    let w1 = b
        .parameter("layer.w1", [10, 14], DType::F32)
        .annotate(s("(data, model)"));
    let bias = b
        .parameter("layer.b", [14], DType::F32)
        .annotate(s("(model)"));
    let w2 = b
        .parameter("layer.w2", [14, 6], DType::F32)
        .annotate(s("(_, model)"));
    let scale = b.parameter("scale", [], DType::F32);
    let target = b
        .parameter("target", [8, 6], DType::F32)
        .annotate(s("(data, _)"));
    let h = (&x.matmul(&w1) + &bias.broadcast_in_dim([8, 14], &[1])).relu();
    let y = &h.matmul(&w2) * &scale.broadcast_to([8, 6]);
    b.finish(&[&y.mse(&target)]).unwrap()
}

/// The MLP's step with `optimizer`, initial weights (from `seed`) and three batches.
fn problem(optimizer: &Optimizer, seed: u64) -> (TrainStep, Vec<Literal>, Vec<Vec<Literal>>) {
    let model = uneven_mlp();
    let step = step_program(&model, 0, &[1, 2, 3, 4], optimizer).unwrap();
    let rng = &mut Xoshiro256PlusPlus::seed_from_u64(seed);
    let initial = vec![
        uniform_f32(rng, &[10, 14], -0.5, 0.5),
        uniform_f32(rng, &[14], -0.1, 0.1),
        uniform_f32(rng, &[14, 6], -0.5, 0.5),
        Literal::scalar_f32(1.5),
    ];
    let data = (0..3)
        .map(|_| {
            vec![
                uniform_f32(rng, &[8, 10], -1.0, 1.0),
                uniform_f32(rng, &[8, 6], -1.0, 1.0),
            ]
        })
        .collect();
    (step, initial, data)
}

/// Where a trainer runs: a thread mesh of `(data, model)` sizes, or the reference.
#[derive(Debug, Clone, Copy)]
enum On {
    Mesh(usize, usize),
    Reference,
}

fn trainer(on: On, step: &TrainStep, initial: &[Literal]) -> Trainer {
    match on {
        On::Mesh(data, model) => {
            let mesh = Mesh::new([("data", data), ("model", model)]).unwrap();
            Trainer::on_mesh(step.clone(), mesh, initial.to_vec()).unwrap()
        }
        On::Reference => Trainer::reference(step.clone(), initial.to_vec()).unwrap(),
    }
}

/// A trainer of the MLP's AdamW step on `on` (initial values and batches from `seed`),
/// saved at `scratch(name)` after one step: the step, the initial values, the batches,
/// the trainer and the checkpoint's directory.
fn saved_after_a_step(
    on: On,
    seed: u64,
    name: &str,
) -> (TrainStep, Vec<Literal>, Vec<Vec<Literal>>, Trainer, PathBuf) {
    let (step, initial, data) = problem(&Optimizer::adamw(1e-2), seed);
    let mut saved = trainer(on, &step, &initial);
    saved.step(&data[0]).unwrap();
    let dir = scratch(name);
    saved.save(&dir).unwrap();
    (step, initial, data, saved, dir)
}

/// Asserts two checkpoints hold the same names and bitwise the same values.
#[track_caller]
fn assert_bitwise(got: &[(String, Literal)], want: &[(String, Literal)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: tensor count");
    for ((n, a), (m, b)) in got.iter().zip(want) {
        assert_eq!(n, m, "{what}");
        assert_eq!(a.dtype(), b.dtype(), "{what}: `{n}`");
        assert_eq!(a.shape(), b.shape(), "{what}: `{n}`");
        assert_eq!(a.bit_patterns(), b.bit_patterns(), "{what}: `{n}` differs");
    }
}

/// The save directories (`step<N>-<hash>`) in checkpoint `dir`.
fn saves(dir: &Path) -> Vec<PathBuf> {
    let mut saves: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() && p.file_name().unwrap().to_string_lossy().starts_with("step"))
        .collect();
    saves.sort();
    saves
}

/// Saves on 2x4 after two steps; loads on 4x2, the reference, 1x2 and 2x4: the loaded
/// tensors are bitwise those saved, and the next step bitwise that of a trainer of the
/// same mesh restored from the saved global tensors (on 2x4, that of the saving trainer).
fn round_trip(optimizer: Optimizer, name: &str) {
    let (step, initial, data) = problem(&optimizer, 1);
    let mut saved = trainer(On::Mesh(2, 4), &step, &initial);
    for batch in &data[..2] {
        saved.step(batch).unwrap();
    }
    let dir = scratch(name);
    saved.save(&dir).unwrap();
    let want = saved.checkpoint().unwrap();
    let (_, other, _) = problem(&optimizer, 2);
    for on in [
        On::Mesh(4, 2),
        On::Reference,
        On::Mesh(1, 2),
        On::Mesh(2, 4),
    ] {
        let what = format!("{name} loaded on {on:?}");
        let mut loaded = trainer(on, &step, &other);
        loaded.load(&dir).unwrap();
        assert_eq!(loaded.steps_done(), 2, "{what}");
        assert_bitwise(&loaded.checkpoint().unwrap(), &want, &what);
        let mut restored = trainer(on, &step, &other);
        restored.restore(&want).unwrap();
        let (a, b) = (
            loaded.step(&data[2]).unwrap(),
            restored.step(&data[2]).unwrap(),
        );
        assert_eq!(a.to_bits(), b.to_bits(), "{what}: next loss {a} vs {b}");
        let after = loaded.checkpoint().unwrap();
        assert_bitwise(&after, &restored.checkpoint().unwrap(), &what);
        if let On::Mesh(2, 4) = on {
            assert_eq!(
                a.to_bits(),
                saved.step(&data[2]).unwrap().to_bits(),
                "{what}"
            );
            assert_bitwise(&after, &saved.checkpoint().unwrap(), &what);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn adamw_state_reshards_onto_other_meshes_and_the_reference() {
    round_trip(Optimizer::adamw(1e-2), "adamw");
}

#[test]
fn adafactor_state_reshards_onto_other_meshes_and_the_reference() {
    // Factored moments: `v_row`/`v_col` are sharded like the weight's dims they keep.
    round_trip(
        Adafactor {
            min_dim_size_to_factor: 0,
            ..Adafactor::new(1e-2)
        }
        .into(),
        "adafactor",
    );
}

/// A checkpoint saved on the reference (one device, every tensor whole) loads onto a
/// mesh that splits it.
#[test]
fn a_reference_checkpoint_loads_onto_a_mesh() {
    let (step, initial, _, saved, dir) = saved_after_a_step(On::Reference, 3, "from_reference");
    let mut loaded = trainer(On::Mesh(2, 4), &step, &initial);
    loaded.load(&dir).unwrap();
    assert_bitwise(
        &loaded.checkpoint().unwrap(),
        &saved.checkpoint().unwrap(),
        "2x4",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each file is a safetensors file (readable by any safetensors reader) of blocks named
/// `tensor[start:end,..]`; together they hold each distinct block of every tensor once
/// (replicas written by one device), with the values of the global tensors there.
#[test]
fn the_files_hold_each_distinct_block_once() {
    let (_, _, _, saved, dir) = saved_after_a_step(On::Mesh(2, 4), 4, "files");
    let want = saved.checkpoint().unwrap();
    let [save] = &saves(&dir)[..] else {
        panic!("one save directory expected in {}", dir.display())
    };
    let mut elements = 0;
    let mut files = 0;
    for entry in std::fs::read_dir(save).unwrap() {
        files += 1;
        for (name, block) in load_checkpoint(entry.unwrap().path()).unwrap() {
            let (tensor, ranges) = name.split_once('[').unwrap();
            let ranges: Vec<(usize, usize)> = (ranges.trim_end_matches(']').split(','))
                .filter(|r| !r.is_empty())
                .map(|r| {
                    let (a, b) = r.split_once(':').unwrap();
                    (a.parse().unwrap(), b.parse().unwrap())
                })
                .collect();
            let global = &want.iter().find(|(n, _)| n == tensor).unwrap().1;
            let slice = global
                .as_f32()
                .unwrap()
                .slice_each_axis(|ax: AxisDescription| {
                    let (a, b) = ranges[ax.axis.index()];
                    Slice::from(a..b)
                })
                .to_owned();
            assert_eq!(block, Literal::F32(slice), "{name}");
            elements += block.shape().iter().product::<usize>();
        }
    }
    // One process (the thread mesh) writes one file.
    assert_eq!(files, 1);
    let whole: usize = (want.iter())
        .filter(|(n, _)| n != STEP_COUNT)
        .map(|(_, t)| t.shape().iter().product::<usize>())
        .sum();
    assert_eq!(elements, whole, "each element saved once");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A save over a checkpoint replaces it and removes the earlier save's files; a save
/// that fails at its commit (its index cannot be written) leaves the earlier checkpoint
/// loadable, and the next save removes what the failed one wrote.
#[test]
fn saves_replace_a_checkpoint_and_a_failed_one_changes_nothing() {
    let (step, initial, data, mut saved, dir) = saved_after_a_step(On::Mesh(2, 4), 5, "replace");
    let first = saved.checkpoint().unwrap();
    saved.step(&data[1]).unwrap();
    saved.save(&dir).unwrap();
    assert_eq!(saves(&dir).len(), 1, "the first save's files are removed");
    let second = saved.checkpoint().unwrap();
    let mut loaded = trainer(On::Mesh(4, 2), &step, &initial);
    loaded.load(&dir).unwrap();
    assert_bitwise(&loaded.checkpoint().unwrap(), &second, "the second save");

    // The next save fails after writing its shards: its temporary index cannot be made.
    saved.step(&data[2]).unwrap();
    let blocker = dir.join("index.json.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let failed = saved.save(&dir);
    assert!(
        matches!(failed, Err(Error::Checkpoint { .. })),
        "{failed:?}"
    );
    assert_eq!(
        saves(&dir).len(),
        2,
        "the failed save's shards were written"
    );
    let mut loaded = trainer(On::Mesh(4, 2), &step, &initial);
    loaded.load(&dir).unwrap();
    assert_bitwise(
        &loaded.checkpoint().unwrap(),
        &second,
        "after a failed save",
    );
    assert_eq!(loaded.steps_done(), 2);
    std::fs::remove_dir(&blocker).unwrap();
    saved.save(&dir).unwrap();
    assert_eq!(saves(&dir).len(), 1, "the failed save's shards are removed");
    loaded.load(&dir).unwrap();
    assert_bitwise(
        &loaded.checkpoint().unwrap(),
        &saved.checkpoint().unwrap(),
        "third",
    );
    assert_ne!(first, second);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A save goes only where a checkpoint can be: not over a file, not into a directory
/// holding anything else.
#[test]
fn a_save_does_not_write_over_other_files() {
    let (step, initial, _) = problem(&Optimizer::adamw(1e-2), 6);
    let saved = trainer(On::Mesh(1, 2), &step, &initial);
    let dir = scratch("not_a_checkpoint");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let e = saved.save(&dir);
    assert!(
        matches!(&e, Err(Error::Checkpoint { problem: CheckpointProblem::NotCheckpointDir { entry }, .. }) if entry == "notes.txt"),
        "{e:?}"
    );
    let file = dir.join("notes.txt");
    assert!(matches!(saved.save(&file), Err(Error::Checkpoint { .. })));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A checkpoint of bf16 tensors loads into f32 parameters and state, converted (as
/// `Trainer::restore` converts floats): the checkpoint is rewritten in bf16, file by file
/// (the same blocks and save id) and in its index.
#[test]
fn float_tensors_of_another_dtype_are_converted() {
    use safetensors::tensor::{Dtype, SafeTensors, TensorView};
    let (step, initial, _, saved, dir) = saved_after_a_step(On::Mesh(2, 4), 7, "bf16");
    for save in saves(&dir) {
        for entry in std::fs::read_dir(save).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
            let narrow: Vec<(String, Vec<usize>, Vec<u8>)> = (load_checkpoint(&path).unwrap())
                .into_iter()
                .map(|(name, block)| {
                    (
                        name,
                        block.shape(),
                        block.convert(DType::BF16).to_le_bytes(),
                    )
                })
                .collect();
            let views = narrow.iter().map(|(name, shape, bytes)| {
                let view = TensorView::new(Dtype::BF16, shape.clone(), bytes).unwrap();
                (name.as_str(), view)
            });
            safetensors::serialize_to_file(views, header.metadata().clone(), &path).unwrap();
        }
    }
    let index = dir.join("index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(
        &index,
        text.replace("\"dtype\":\"f32\"", "\"dtype\":\"bf16\""),
    )
    .unwrap();
    let mut loaded = trainer(On::Mesh(4, 2), &step, &initial);
    loaded.load(&dir).unwrap();
    let want: Vec<(String, Literal)> = (saved.checkpoint().unwrap().into_iter())
        .map(|(name, value)| {
            let narrowed = value.convert(DType::BF16).convert(DType::F32);
            (
                name.clone(),
                if name == STEP_COUNT { value } else { narrowed },
            )
        })
        .collect();
    assert_bitwise(&loaded.checkpoint().unwrap(), &want, "bf16 loaded into f32");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// safetensors reserves `__metadata__` for the header: a tensor of that name is refused
/// with a typed error naming it before anything is written, so the file saved before
/// stays loadable.
#[test]
fn a_tensor_named_like_the_safetensors_header_is_refused_and_nothing_is_lost() {
    let dir = std::env::temp_dir().join(format!("gspmd_reserved_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("weights.safetensors");
    let w = ("w".to_string(), Literal::full(&[2, 3], DType::F32, 1.5));
    save_checkpoint(&path, std::slice::from_ref(&w)).unwrap();
    let reserved = (
        "__metadata__".to_string(),
        Literal::full(&[2], DType::F32, 0.0),
    );
    let err = save_checkpoint(&path, &[w.clone(), reserved]).unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint { tensor: Some(t), problem: CheckpointProblem::ReservedName, .. }
            if t == "__metadata__"),
        "{err}"
    );
    assert_eq!(load_checkpoint(&path).unwrap(), vec![w]);
    std::fs::remove_dir_all(dir).unwrap();
}
