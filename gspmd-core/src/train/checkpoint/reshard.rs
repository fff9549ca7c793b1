//! Loading a sharded checkpoint onto any backend and mesh: resharding on read.
//!
//! The loading trainer's sharding gives each of its devices a target block of each
//! tensor. The target meets some of the saved blocks (those of the saved sharding on the
//! saved mesh, [`Index`]); of each, the device reads the byte range from the first to
//! the last element of the overlap (one `pread` into a buffer no larger than the saved
//! block; straight into the target when the overlap is the whole target and contiguous
//! in the file) and copies the overlap's rows into place. So a process holds its
//! devices' blocks of one tensor and one buffer, never a whole tensor (unless one of its
//! devices holds it whole), and reads only what its devices need.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use safetensors::tensor::Metadata;

use super::index::{Block, INDEX, Index, TensorRecord};
use super::single_file::stored_dtype;
use super::write::SAVE_ID;
use super::{Carried, carried, together};
use crate::error::{CheckpointProblem, Error, Result};
use crate::ir::{Literal, TensorType};
use crate::train::trainer::Trainer;

/// The largest safetensors header read (as the safetensors crate's limit): a corrupt
/// header length is an error, not an allocation of that size.
const MAX_HEADER: u64 = 100_000_000;

/// Loads the sharded checkpoint at `dir` into `trainer` (see [`Trainer::load`]).
pub(super) fn load(trainer: &mut Trainer, dir: &Path) -> Result<()> {
    let backend = trainer.backend();
    let place = |what: &str| format!("{what} from checkpoint {}", dir.display());
    let plan = together(backend, dir, &place("the checks before loading"), || {
        Plan::new(trainer, dir)
    })?;
    for (i, tensor) in plan.tensors.iter().enumerate() {
        let what = format!("the loading of `{}`", tensor.carried.name);
        together(backend, dir, &place(&what), || {
            let blocks = (backend.local_devices())
                .map(|device| plan.read(tensor, device))
                .collect::<Result<Vec<Literal>>>()
                .map_err(|e| partly_loaded(e, &plan.tensors[..i]))?;
            let resident = tensor.carried.resident.clone();
            backend.store_blocks(&tensor.carried.key, resident, blocks)
        })?;
    }
    trainer.set_steps_done(plan.step);
    Ok(())
}

/// `e` (an error reading a tensor's blocks) saying which of the trainer's tensors are
/// already replaced: `loaded`.
fn partly_loaded(e: Error, loaded: &[Loading]) -> Error {
    let names: Vec<&str> = loaded.iter().map(|t| t.carried.name.as_str()).collect();
    match e {
        Error::Checkpoint {
            path,
            tensor,
            problem,
        } if !names.is_empty() => Error::Checkpoint {
            path,
            tensor,
            problem: CheckpointProblem::PartlyLoaded {
                loaded: names.iter().map(ToString::to_string).collect(),
                problem: Box::new(problem),
            },
        },
        e => e,
    }
}

/// What a process reads: each tensor of the trainer with its saved record, and the
/// files its devices' blocks come from, their headers checked.
struct Plan {
    /// The checkpoint directory.
    dir: PathBuf,
    /// The step count saved.
    step: u64,
    tensors: Vec<Loading>,
    /// The files this process reads, by their index in [`Index::files`].
    files: HashMap<usize, ShardFile>,
    /// The backend's mesh: where the target blocks are.
    mesh: crate::sharding::Mesh,
}

/// One tensor to load.
struct Loading {
    carried: Carried,
    saved: TensorRecord,
    /// Where each saved block this process reads starts in its file, by the block's
    /// position in `saved.blocks`.
    starts: HashMap<usize, u64>,
}

impl Plan {
    /// Reads and checks the index at `dir` against `trainer`, and opens and checks the
    /// files this process's devices read.
    fn new(trainer: &Trainer, dir: &Path) -> Result<Plan> {
        let index_path = dir.join(INDEX);
        let index = Index::read(&index_path)?;
        let fail = |tensor: Option<&str>, problem: CheckpointProblem| Error::Checkpoint {
            path: index_path.display().to_string(),
            tensor: tensor.map(str::to_string),
            problem,
        };
        let optimizer = trainer.train_step().optimizer.name();
        if index.optimizer != optimizer {
            let problem = CheckpointProblem::Optimizer {
                saved: index.optimizer.clone(),
                given: optimizer,
            };
            return Err(fail(None, problem));
        }
        let backend = trainer.backend();
        let mesh = backend.mesh().clone();
        let mut files: HashMap<usize, ShardFile> = HashMap::new();
        let mut tensors = Vec::new();
        for carried in carried(trainer)? {
            let name = carried.name.as_str();
            let saved = (index.tensor(name).cloned())
                .ok_or_else(|| fail(Some(name), CheckpointProblem::Missing))?;
            let want = &carried.resident.ty;
            let convertible =
                saved.dtype == want.dtype || (saved.dtype.is_float() && want.dtype.is_float());
            if saved.shape != want.shape || !convertible {
                let problem = CheckpointProblem::Type {
                    saved: TensorType::new(saved.shape.clone(), saved.dtype),
                    expected: want.clone(),
                };
                return Err(fail(Some(name), problem));
            }
            let mut starts = HashMap::new();
            for device in backend.local_devices() {
                let target =
                    Block::of_device(&mesh, &carried.resident.sharding, &want.shape, device);
                for (i, b) in saved.blocks.iter().enumerate() {
                    if starts.contains_key(&i) || target.overlap(&b.block).is_none() {
                        continue;
                    }
                    if let Entry::Vacant(e) = files.entry(b.file) {
                        let path = dir.join(&index.files[b.file]);
                        e.insert(ShardFile::open(path, &index.id, name)?);
                    }
                    let file = &files[&b.file];
                    starts.insert(i, file.start(&b.block.name(name), &saved, &b.block)?);
                }
            }
            tensors.push(Loading {
                carried,
                saved,
                starts,
            });
        }
        Ok(Plan {
            dir: dir.to_path_buf(),
            step: index.step,
            tensors,
            files,
            mesh,
        })
    }

    /// `device`'s block of `tensor`, from the saved blocks that meet it, converted to
    /// the step's dtype.
    fn read(&self, tensor: &Loading, device: usize) -> Result<Literal> {
        let want = &tensor.carried.resident.ty;
        let target = Block::of_device(
            &self.mesh,
            &tensor.carried.resident.sharding,
            &want.shape,
            device,
        );
        let saved = &tensor.saved;
        let size = saved.dtype.size_in_bytes();
        let mut out = vec![0u8; target.len() * size];
        let mut buffer = Vec::new();
        for (i, b) in saved.blocks.iter().enumerate() {
            let Some(overlap) = target.overlap(&b.block) else {
                continue;
            };
            let fail = |path: &Path, problem: CheckpointProblem| Error::Checkpoint {
                path: path.display().to_string(),
                tensor: Some(tensor.carried.name.clone()),
                problem,
            };
            let (Some(&start), Some(file)) = (tensor.starts.get(&i), self.files.get(&b.file))
            else {
                let reason = format!("block {:?} was not planned", b.block);
                return Err(fail(&self.dir, CheckpointProblem::Blocks { reason }));
            };
            let fail = |reason| fail(&file.path, CheckpointProblem::Io { reason });
            // The saved block's elements from the overlap's first to its last.
            let first = b.block.position(&overlap.offsets);
            let count = b.block.position(&overlap.last()) + 1 - first;
            let at = start + (first * size) as u64;
            if overlap == target && count == target.len() {
                file.read_at(&mut out, at).map_err(fail)?;
            } else {
                buffer.resize(count * size, 0);
                file.read_at(&mut buffer, at).map_err(fail)?;
                let from = (&b.block, first, buffer.as_slice());
                copy_overlap(&overlap, from, (&target, &mut out), size);
            }
        }
        let block =
            Literal::from_le_bytes(saved.dtype, &target.sizes, &out).map_err(|message| {
                Error::Checkpoint {
                    path: self.dir.display().to_string(),
                    tensor: Some(tensor.carried.name.clone()),
                    problem: CheckpointProblem::Format {
                        reason: format!("{message} (a damaged block)"),
                    },
                }
            })?;
        Ok(if want.dtype == saved.dtype {
            block
        } else {
            block.convert(want.dtype)
        })
    }
}

/// Copies the elements of `overlap` from `from` — (a block, the row-major position in it
/// of the first element given, its elements from there on) — into `to` (a block and all
/// its elements), `size` bytes each, one run along the last dim at a time. `overlap`
/// lies inside both blocks.
fn copy_overlap(
    overlap: &Block,
    from: (&Block, usize, &[u8]),
    to: (&Block, &mut [u8]),
    size: usize,
) {
    let ((source, first, src), (target, dst)) = (from, to);
    let rank = overlap.sizes.len();
    let outer = rank.saturating_sub(1);
    let run = overlap.sizes.last().map_or(1, |&n| n) * size;
    let rows: usize = overlap.sizes[..outer].iter().product();
    let mut coords = overlap.offsets.clone();
    for _ in 0..rows {
        let s = (source.position(&coords) - first) * size;
        let d = target.position(&coords) * size;
        dst[d..d + run].copy_from_slice(&src[s..s + run]);
        // The next row: an odometer over the outer dims, the last fastest.
        for k in (0..outer).rev() {
            coords[k] += 1;
            if coords[k] < overlap.offsets[k] + overlap.sizes[k] {
                break;
            }
            coords[k] = overlap.offsets[k];
        }
    }
}

/// A shard file open for reading, its header read and checked.
struct ShardFile {
    path: PathBuf,
    file: File,
    /// Where the data (after the header) starts.
    data: u64,
    metadata: Metadata,
}

impl ShardFile {
    /// Opens the shard file at `path` of save `id` for `tensor` (the first tensor read
    /// from it, named in errors): a safetensors file whose length is what its header
    /// says, and whose `gspmd.checkpoint` metadata is `id`.
    fn open(path: PathBuf, id: &str, tensor: &str) -> Result<ShardFile> {
        let fail = |problem: CheckpointProblem| Error::Checkpoint {
            path: path.display().to_string(),
            tensor: Some(tensor.to_string()),
            problem,
        };
        let io = |e: std::io::Error| {
            let reason = e.to_string();
            fail(CheckpointProblem::Io { reason })
        };
        let format = |reason: String| fail(CheckpointProblem::Format { reason });
        let file = File::open(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut word = [0u8; 8];
        file.read_exact_at(&mut word, 0)
            .map_err(|e| format(format!("no safetensors header ({len} bytes): {e}")))?;
        let n = u64::from_le_bytes(word);
        if n > MAX_HEADER || n > len - 8 {
            return Err(format(format!(
                "a header of {n} bytes, in a file of {len}: truncated or not safetensors"
            )));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact_at(&mut header, 8).map_err(io)?;
        let metadata: Metadata = serde_json::from_slice(&header)
            .map_err(|e| format(format!("not a safetensors header: {e}")))?;
        let end = 8 + n + metadata.data_len() as u64;
        if end != len {
            return Err(format(format!(
                "{len} bytes, but its header describes {end}: truncated or damaged"
            )));
        }
        let save = metadata.metadata().as_ref().and_then(|m| m.get(SAVE_ID));
        if save.map(String::as_str) != Some(id) {
            return Err(fail(CheckpointProblem::OtherSave {
                file: save.cloned(),
                index: id.to_string(),
            }));
        }
        Ok(ShardFile {
            path,
            file,
            data: 8 + n,
            metadata,
        })
    }

    /// Where `block` of `tensor`, stored as `name`, starts in the file, once its dtype
    /// and shape in the header are checked against the index's.
    fn start(&self, name: &str, tensor: &TensorRecord, block: &Block) -> Result<u64> {
        let fail = |reason: String| Error::Checkpoint {
            path: self.path.display().to_string(),
            tensor: Some(tensor.name.clone()),
            problem: CheckpointProblem::Format { reason },
        };
        let info = (self.metadata.info(name))
            .ok_or_else(|| fail(format!("the file holds no block `{name}`")))?;
        if info.dtype != stored_dtype(tensor.dtype) || info.shape != block.sizes {
            return Err(fail(format!(
                "block `{name}` is {:?}{:?} in the file, {}{:?} in the index",
                info.dtype, info.shape, tensor.dtype, block.sizes
            )));
        }
        Ok(self.data + info.data_offsets.0 as u64)
    }

    /// Fills `buffer` from the file at byte `at`.
    fn read_at(&self, buffer: &mut [u8], at: u64) -> Result<(), String> {
        self.file
            .read_exact_at(buffer, at)
            .map_err(|e| format!("reading {} bytes at {at}: {e}", buffer.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::index::tests::block;
    use super::*;

    /// The elements (one byte each: their global row-major index in a 6x8 array) of
    /// `b`, from its row-major position `first` on.
    fn elements(b: &Block, first: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for r in b.offsets[0]..b.offsets[0] + b.sizes[0] {
            for c in b.offsets[1]..b.offsets[1] + b.sizes[1] {
                out.push((r * 8 + c) as u8);
            }
        }
        out.split_off(first)
    }

    #[test]
    fn an_overlap_is_copied_into_place() {
        // A saved 4x4 block at (2, 4) of a 6x8 array; a target 3x6 block at (0, 2).
        let (saved, target) = (block(&[2, 4], &[4, 4]), block(&[0, 2], &[3, 6]));
        let overlap = saved.overlap(&target).unwrap();
        assert_eq!(overlap, block(&[2, 4], &[1, 4]));
        let first = saved.position(&overlap.offsets);
        let src = elements(&saved, first);
        let mut dst = vec![0u8; target.len()];
        copy_overlap(&overlap, (&saved, first, &src), (&target, &mut dst), 1);
        let want: Vec<u8> = (0..18)
            .map(|i| {
                let (r, c) = (i / 6, 2 + i % 6);
                if r == 2 && c >= 4 {
                    (r * 8 + c) as u8
                } else {
                    0
                }
            })
            .collect();
        assert_eq!(dst, want);
        // Two bytes per element, a scalar.
        let scalar = block(&[], &[]);
        let mut one = [0u8; 2];
        copy_overlap(&scalar, (&scalar, 0, &[7, 9]), (&scalar, &mut one), 2);
        assert_eq!(one, [7, 9]);
    }
}
