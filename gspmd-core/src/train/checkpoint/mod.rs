//! Checkpoints of a [`Trainer`] (its trained parameters, their optimizer state and the
//! step count), in two formats:
//!
//! - **Sharded** (a directory; [`Trainer::save`] to any path not ending in
//!   `.safetensors`): each process writes the blocks its devices hold, each distinct
//!   block once, to its own safetensors file, and process 0 commits the save with an
//!   index (`index.json`) of every tensor's global type and sharding, the mesh and where
//!   each block is. No process gathers a tensor: saving holds one block at a time
//!   beyond the devices' own, and [`Trainer::load`] onto any mesh and backend (another
//!   mesh shape, the [`Reference`](crate::runtime::Reference) interpreter, MPI ranks)
//!   reads, per device, only the byte ranges of the saved blocks that meet its block.
//!   The layout (`index`), the save and its commit (`write`) and the resharding load
//!   (`reshard`) have their own modules.
//! - **Single file** (`*.safetensors`): [`Trainer::checkpoint`]'s global tensors in one
//!   safetensors file ([`save_checkpoint`] / [`load_checkpoint`]), written by process 0
//!   after gathering every tensor whole: for small models, and for other frameworks'
//!   loaders.
//!
//! [`Trainer::load`] tells them apart by what is at the path: a directory is sharded,
//! a file is a single file. On a backend of several processes every process calls
//! `save` and `load` with the same path, which every process must see (a shared
//! filesystem, as orbax and PyTorch's distributed checkpoints assume): each process
//! writes and reads its own files, and an error on one process is an error on all.

mod index;
mod reshard;
mod single_file;
mod write;

use std::path::Path;

pub use single_file::{load_checkpoint, save_checkpoint};

use super::trainer::Trainer;
use crate::error::{CheckpointProblem, Error, InputProblem, Result};
use crate::runtime::{Backend, Resident};

impl Trainer {
    /// Saves the trainer's parameters, optimizer state and step count at `path`: as a
    /// sharded checkpoint directory, or, for a path ending in `.safetensors`, as
    /// [`Trainer::checkpoint`]'s tensors in one file ([`save_checkpoint`], written by
    /// process 0). On a backend of several processes every process calls it with the
    /// same `path` and returns once the save has committed on all of them (or with the
    /// error of any).
    ///
    /// A sharded save is atomic: the files go to a new directory inside `path`, and the
    /// save commits when process 0 renames the new index over `path/index.json`; then
    /// it removes the files of earlier saves. A save that fails or is interrupted
    /// before its commit leaves the previous checkpoint at `path` loadable. `path` must
    /// be a new or empty directory, or a checkpoint directory (holding only what saves
    /// write).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        if !is_single_file(path) {
            return write::save(self, path);
        }
        let tensors = self.checkpoint()?;
        let first = self.backend().process().0 == 0;
        let place = format!("the saving of {}", path.display());
        self.backend().together(&place, &mut || {
            if first {
                save_checkpoint(path, &tensors)
            } else {
                Ok(())
            }
        })
    }

    /// Loads the checkpoint at `path` (a sharded checkpoint directory or a safetensors
    /// file, see [`Trainer::save`]), saved on any backend and mesh by a trainer of the
    /// same parameters and optimizer; tensors saved in another float dtype are converted.
    /// On a backend of several processes every process calls it with the same `path`
    /// and reads it itself.
    ///
    /// A sharded checkpoint is checked before anything changes: its index, that it
    /// holds every parameter and state tensor of the step with its shape and a
    /// compatible dtype and the same optimizer, and the header of every file this
    /// process reads (that it belongs to this save and is whole). Each device then
    /// reads the byte ranges of its block, tensor by tensor; an I/O error there leaves
    /// the tensors before it loaded (the error says which). A single file is read whole
    /// and [`Trainer::restore`]d. Problems are [`Error::Checkpoint`]s naming the file and
    /// the tensor (or, for a single file, [`Trainer::restore`]'s errors).
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        if path.is_dir() {
            return reshard::load(self, path);
        }
        let place = format!("the reading of {}", path.display());
        let tensors = together(self.backend(), path, &place, || load_checkpoint(path))?;
        self.restore(&tensors)
    }
}

/// Whether [`Trainer::save`] writes `path` as one safetensors file: a path ending in
/// `.safetensors`.
fn is_single_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "safetensors")
}

/// A tensor a trainer carries from step to step: a trained parameter or one of its
/// optimizer state slots.
struct Carried {
    /// Its name: the parameter's (`layers.wq`) or the slot's (`m(layers.wq)`).
    name: String,
    /// Where it is resident on the backend.
    key: String,
    /// Its global type and its sharding in the compiled step.
    resident: Resident,
}

/// The tensors `trainer` carries, parameters each followed by their state slots, in
/// [`TrainStep::params`](super::TrainStep::params) order (the order of
/// [`Trainer::checkpoint`]).
fn carried(trainer: &Trainer) -> Result<Vec<Carried>> {
    let step = trainer.train_step();
    let program = &step.program;
    let inputs = &trainer.executable().spmd().inputs;
    let slots = step.params.iter().flat_map(|p| {
        std::iter::once((p.input, &p.name)).chain(p.state.iter().map(|s| (s.input, &s.name)))
    });
    slots
        .map(|(input, name)| {
            let key = trainer
                .carried_key(input)
                .ok_or_else(|| Error::TrainerInput {
                    name: name.clone(),
                    problem: InputProblem::Invalid {
                        reason: format!("step input {input} is not carried from step to step"),
                    },
                })?;
            Ok(Carried {
                name: name.clone(),
                key: key.to_string(),
                resident: Resident {
                    ty: program.ty(program.params[input]).clone(),
                    sharding: inputs[input].1.clone(),
                },
            })
        })
        .collect()
}

/// `work`'s result on this process, run by every process of `backend` at the same point
/// as [`Backend::together`] runs it (an error on one is an error on all), for the
/// checkpoint at `path`.
fn together<T>(
    backend: &dyn Backend,
    path: &Path,
    place: &str,
    mut work: impl FnMut() -> Result<T>,
) -> Result<T> {
    let mut value = None;
    backend.together(place, &mut || {
        value = Some(work()?);
        Ok(())
    })?;
    value.ok_or_else(|| Error::Checkpoint {
        path: path.display().to_string(),
        tensor: None,
        problem: CheckpointProblem::NotRun {
            place: place.to_string(),
        },
    })
}
