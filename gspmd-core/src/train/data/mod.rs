//! Training data fed per process: each process reads, of every batch, only the rows its
//! devices hold, so the global batch never exists on one process (as JAX's
//! `make_array_from_callback` or a PyTorch `DistributedSampler` feeding a `DTensor`).
//!
//! - `source`: [`Source`], examples addressable by index (what a batch reads rows of),
//!   and [`Dataset`], examples held in memory.
//! - `file`: [`SafetensorsFile`], a source that reads the rows it is asked for from a
//!   safetensors file, and nothing else.
//! - `batches`: [`Batches`], the batches of a [`Source`] (shuffled per epoch, the same on
//!   every process) or of a function of the batch index and rows; each cut for the
//!   [`DataLayout`] of a trainer ([`Batch::Blocks`], fed as per-device inputs).

mod batches;
mod file;
mod source;

use std::ops::Range;

pub use batches::Batches;
pub use file::SafetensorsFile;
pub use source::{Dataset, Source};

use crate::ir::Literal;
use crate::sharding::{Mesh, Sharding};

/// One batch of a training step's data inputs.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Batch {
    /// One global array per data input.
    Global(Vec<Literal>),
    /// Per data input, the block of each of this process's devices (`[input][i]` for
    /// the `i`-th of [`DataLayout::devices`]; unpadded, as [`Sharding::device_block`]
    /// cuts the global batch).
    Blocks(Vec<Vec<Literal>>),
}

/// Where a step's data inputs go: the mesh, each data input's sharding and the devices
/// of this process (what [`Trainer::data_layout`](super::Trainer::data_layout) gives).
#[derive(Debug, Clone, PartialEq)]
pub struct DataLayout {
    /// The mesh.
    pub mesh: Mesh,
    /// One sharding per data input, in [`TrainStep::data`](super::TrainStep::data)
    /// order.
    pub shardings: Vec<Sharding>,
    /// The devices of this process, whose blocks it feeds.
    pub devices: Range<usize>,
}
