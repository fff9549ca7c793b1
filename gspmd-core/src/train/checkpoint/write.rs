//! Saving a sharded checkpoint, and its commit.
//!
//! A save at `dir` with id `id` (`step<N>-<16 hex digits>`, new for each save):
//!
//! 1. Every process sends the others its device range and an id; process 0's id is the
//!    save's. With the mesh and shardings, that is all a process needs to compute the
//!    whole layout ([`Index::new`]).
//! 2. Process 0 checks `dir` (new, empty or a checkpoint) and makes `dir/<id>/`.
//! 3. Every process writing a block writes its file `dir/<id>/process-<p>-of-<n>.safetensors`
//!    (its devices' blocks, block by block) and syncs it.
//! 4. Process 0 syncs `dir/<id>/` and `dir`, writes the index to `dir/index.json.tmp`,
//!    syncs it and renames it over `dir/index.json` — the commit — and syncs `dir`.
//!    Then it removes the directories of earlier saves.
//!
//! Each step runs on every process through [`Backend::together`], so a failure on
//! one process fails the save on all before the next step. Until the rename, the
//! previous index and the files it names are untouched: a save that fails or crashes
//! leaves the previous checkpoint loadable (and a directory that the next successful
//! save removes).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::Path;

use safetensors::tensor::{Metadata, TensorInfo};

use super::index::{BlockRecord, INDEX, Index, file_name};
use super::single_file::stored_dtype;
use super::{Carried, carried, together};
use crate::error::{CheckpointProblem, Error, Result};
use crate::runtime::Backend;
use crate::train::trainer::Trainer;

/// The metadata key of each shard file holding its save's id.
pub(super) const SAVE_ID: &str = "gspmd.checkpoint";

/// Where process 0 writes the index before renaming it over [`INDEX`].
const INDEX_TMP: &str = "index.json.tmp";

/// Saves `trainer` as a sharded checkpoint at `dir` (see the module docs).
pub(super) fn save(trainer: &Trainer, dir: &Path) -> Result<()> {
    let backend = trainer.backend();
    let tensors = carried(trainer)?;
    let (me, processes) = backend.process();
    let place = |what: &str| format!("{what} of checkpoint {}", dir.display());
    let fail = |reason: String| Error::Checkpoint {
        path: dir.display().to_string(),
        tensor: None,
        problem: CheckpointProblem::Blocks { reason },
    };
    let devices = backend.local_devices();
    let mine = format!(
        "{} {} {}",
        devices.start,
        devices.end,
        new_id(trainer.steps_done())
    );
    let all = backend.all_gather_bytes(&place("the start of the saving"), mine.into_bytes())?;
    let (ranges, id) = ranges_and_id(&all).map_err(fail)?;
    let layout: Vec<_> = (tensors.iter())
        .map(|t| {
            (
                t.name.clone(),
                t.resident.ty.clone(),
                t.resident.sharding.clone(),
            )
        })
        .collect();
    let optimizer = trainer.train_step().optimizer.name();
    let index = Index::new(
        id,
        trainer.steps_done(),
        &optimizer,
        backend.mesh(),
        &layout,
        &ranges,
    )
    .map_err(fail)?;
    together(backend, dir, &place("the preparing"), || match me {
        0 => prepare(dir, &index.id),
        _ => Ok(()),
    })?;
    together(backend, dir, &place("the writing of the shards"), || {
        write_shard(
            backend,
            &tensors,
            &index,
            dir,
            file_name(&index.id, me, processes),
        )
    })?;
    together(backend, dir, &place("the commit"), || match me {
        0 => commit(dir, &index),
        _ => Ok(()),
    })
}

/// A new save id: `step<step>-` and 16 hex digits of a hash of the time and process
/// (keyed by the standard library's per-process random keys).
fn new_id(step: u64) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    hasher.write_u128(now.map_or(0, |d| d.as_nanos()));
    hasher.write_u32(std::process::id());
    format!("step{step}-{:016x}", hasher.finish())
}

/// Whether `name` is a save's directory, as [`new_id`] names them.
fn is_save_id(name: &str) -> bool {
    let Some((step, hash)) = name.strip_prefix("step").and_then(|s| s.split_once('-')) else {
        return false;
    };
    !step.is_empty()
        && step.bytes().all(|b| b.is_ascii_digit())
        && hash.len() == 16
        && hash.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Every process's device range and process 0's id from the `start end id` texts the
/// processes sent at the start of a save.
fn ranges_and_id(all: &[Vec<u8>]) -> Result<(Vec<Range<usize>>, String), String> {
    let mut ranges = Vec::with_capacity(all.len());
    let mut ids = Vec::with_capacity(all.len());
    for (p, bytes) in all.iter().enumerate() {
        let text = String::from_utf8_lossy(bytes);
        let fields: Vec<&str> = text.split(' ').collect();
        let [start, end, id] = fields[..] else {
            return Err(format!(
                "process {p} sent `{text}` at the start of the save"
            ));
        };
        let number = |s: &str| s.parse::<usize>().map_err(|e| format!("process {p}: {e}"));
        ranges.push(number(start)?..number(end)?);
        ids.push(id.to_string());
    }
    let id = ids.into_iter().next().ok_or("no process took part")?;
    Ok((ranges, id))
}

/// An [`Error::Checkpoint`] for the file or directory at `path`.
fn io_error(path: &Path, tensor: Option<&str>, e: impl std::fmt::Display) -> Error {
    Error::Checkpoint {
        path: path.display().to_string(),
        tensor: tensor.map(str::to_string),
        problem: CheckpointProblem::Io {
            reason: e.to_string(),
        },
    }
}

/// Makes `dir` (if new) and `dir/<id>/`; `dir` must be a directory holding only what
/// saves write (an index, a temporary index, save directories).
fn prepare(dir: &Path, id: &str) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| io_error(dir, None, e))?;
    for entry in fs::read_dir(dir).map_err(|e| io_error(dir, None, e))? {
        let name = entry.map_err(|e| io_error(dir, None, e))?.file_name();
        let name = name.to_string_lossy();
        if name != INDEX && name != INDEX_TMP && !is_save_id(&name) {
            return Err(Error::Checkpoint {
                path: dir.display().to_string(),
                tensor: None,
                problem: CheckpointProblem::NotCheckpointDir {
                    entry: name.into_owned(),
                },
            });
        }
    }
    let save = dir.join(id);
    fs::create_dir(&save).map_err(|e| io_error(&save, None, e))
}

/// Writes this process's file `name` (relative to `dir`) of save `index`: the blocks the
/// layout gives its devices, in the order of the file's header (tensors of wider
/// elements first, so that each block is aligned to its element size), each tensor's
/// blocks read from the backend once. Nothing if its devices write no block.
fn write_shard(
    backend: &dyn Backend,
    tensors: &[Carried],
    index: &Index,
    dir: &Path,
    name: String,
) -> Result<()> {
    let Some(file) = index.files.iter().position(|f| *f == name) else {
        return Ok(());
    };
    let path = dir.join(&name);
    let fail = |tensor: Option<&str>, e: String| io_error(&path, tensor, e);
    let mut entries: Vec<(usize, &BlockRecord)> = (index.tensors.iter().enumerate())
        .flat_map(|(t, tensor)| tensor.blocks.iter().map(move |b| (t, b)))
        .filter(|(_, b)| b.file == file)
        .collect();
    entries.sort_by_key(|&(t, _)| std::cmp::Reverse(index.tensors[t].dtype.size_in_bytes()));
    let mut infos = Vec::with_capacity(entries.len());
    let mut offset = 0;
    for &(t, b) in &entries {
        let tensor = &index.tensors[t];
        let bytes = b.block.len() * tensor.dtype.size_in_bytes();
        let info = TensorInfo {
            dtype: stored_dtype(tensor.dtype),
            shape: b.block.sizes.clone(),
            data_offsets: (offset, offset + bytes),
        };
        infos.push((b.block.name(&tensor.name), info));
        offset += bytes;
    }
    let save = HashMap::from([(SAVE_ID.to_string(), index.id.clone())]);
    let metadata = Metadata::new(Some(save), infos).map_err(|e| fail(None, e.to_string()))?;
    let mut header = serde_json::to_vec(&metadata).map_err(|e| fail(None, e.to_string()))?;
    header.resize(header.len().next_multiple_of(8), b' ');

    let handle = File::create(&path).map_err(|e| fail(None, e.to_string()))?;
    let mut out = BufWriter::new(&handle);
    let write = |out: &mut BufWriter<&File>, bytes: &[u8], tensor: Option<&str>| {
        out.write_all(bytes)
            .map_err(|e| fail(tensor, e.to_string()))
    };
    write(&mut out, &(header.len() as u64).to_le_bytes(), None)?;
    write(&mut out, &header, None)?;
    let local = backend.local_devices();
    for run in entries.chunk_by(|a, b| a.0 == b.0) {
        let tensor = &tensors[run[0].0];
        let blocks = backend.local_blocks(&tensor.key)?;
        for (_, b) in run {
            let block = (b.device.checked_sub(local.start))
                .and_then(|i| blocks.get(i))
                .filter(|l| l.shape() == b.block.sizes && l.dtype() == tensor.resident.ty.dtype)
                .ok_or_else(|| {
                    let reason = format!(
                        "device {} of this process ({local:?}) holds no {} block {:?}",
                        b.device, tensor.resident.ty.dtype, b.block
                    );
                    Error::Checkpoint {
                        path: path.display().to_string(),
                        tensor: Some(tensor.name.clone()),
                        problem: CheckpointProblem::Blocks { reason },
                    }
                })?;
            write(&mut out, &block.to_le_bytes(), Some(&tensor.name))?;
        }
    }
    out.flush().map_err(|e| fail(None, e.to_string()))?;
    drop(out);
    handle.sync_all().map_err(|e| fail(None, e.to_string()))
}

/// Commits save `index` at `dir`: syncs its directory, then writes the index beside the
/// current one and renames it over it (see the module docs); then removes the
/// directories of other saves. Failing to remove one is no error: the checkpoint has
/// committed, and the next save removes it.
fn commit(dir: &Path, index: &Index) -> Result<()> {
    let sync = |path: &Path| {
        File::open(path)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error(path, None, e))
    };
    sync(&dir.join(&index.id))?;
    sync(dir)?;
    let tmp = dir.join(INDEX_TMP);
    let bytes = serde_json::to_vec(index).map_err(|e| io_error(&tmp, None, e))?;
    let mut file = File::create(&tmp).map_err(|e| io_error(&tmp, None, e))?;
    (file.write_all(&bytes))
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error(&tmp, None, e))?;
    let path = dir.join(INDEX);
    fs::rename(&tmp, &path).map_err(|e| io_error(&path, None, e))?;
    sync(dir)?;
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if is_save_id(&name) && name != index.id {
            // Best effort (see above).
            let _ = fs::remove_dir_all(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_ids_name_their_directories() {
        let id = new_id(42);
        assert!(id.starts_with("step42-") && is_save_id(&id), "{id}");
        assert_ne!(new_id(42), id);
        for other in [
            "index.json",
            "step-0123456789abcdef",
            "step1-0123",
            "stepx-0123456789abcdef",
        ] {
            assert!(!is_save_id(other), "{other}");
        }
        let all = vec![b"0 4 step1-a".to_vec(), b"4 8 step1-b".to_vec()];
        assert_eq!(
            ranges_and_id(&all),
            Ok((vec![0..4, 4..8], "step1-a".into()))
        );
        assert!(ranges_and_id(&[b"0 4".to_vec()]).is_err());
    }
}
