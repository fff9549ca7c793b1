//! The index of a sharded checkpoint (`index.json`) and the layout it records.
//!
//! The layout of a tensor follows from its global shape, its sharding and the mesh
//! alone ([`Sharding::device_block`]): every device's block; of devices holding the same
//! block (replicas), the lowest id writes it ([`written_blocks`]), so the files hold
//! each distinct block once; and each block goes to the file of the process holding
//! that device. Every process computes the same layout, so only the processes' device
//! ranges and the save's id travel between them. The index records it all explicitly,
//! for tools that know nothing of shardings, and a reader checks the recorded blocks
//! against the ones the sharding gives ([`Index::read`]), so a damaged index cannot
//! leave a hole in a tensor.

use std::collections::HashSet;
use std::ops::Range;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{CheckpointProblem, Error, Result};
use crate::ir::{DType, TensorType};
use crate::sharding::{Mesh, Sharding};

/// The index's file name in a checkpoint directory.
pub(super) const INDEX: &str = "index.json";

/// What the index's `format` field holds.
const FORMAT: &str = "gspmd sharded checkpoint";

/// The index's `version`: a reader refuses any other.
const VERSION: u32 = 1;

/// A block of a tensor: a box of its global array, `offsets[d] .. offsets[d] + sizes[d]`
/// along each dim `d`, its elements stored row-major.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(super) struct Block {
    /// Where the box starts along each dim.
    pub offsets: Vec<usize>,
    /// Its length along each dim.
    pub sizes: Vec<usize>,
}

impl Block {
    /// The block that `device` holds of a tensor of `shape` sharded as `sharding` on
    /// `mesh`.
    pub fn of_device(mesh: &Mesh, sharding: &Sharding, shape: &[usize], device: usize) -> Block {
        let (offsets, sizes) = sharding
            .device_block(mesh, shape, device)
            .into_iter()
            .unzip();
        Block { offsets, sizes }
    }

    /// Number of elements (1 for a scalar's block).
    pub fn len(&self) -> usize {
        self.sizes.iter().product()
    }

    /// The box where `self` and `other` (of the same rank) meet, if it holds an element.
    pub fn overlap(&self, other: &Block) -> Option<Block> {
        let (offsets, sizes) = (self.offsets.iter().zip(&self.sizes))
            .zip(other.offsets.iter().zip(&other.sizes))
            .map(|((&a, &m), (&b, &n))| {
                let start = a.max(b);
                (start, (a + m).min(b + n).saturating_sub(start))
            })
            .unzip();
        let overlap = Block { offsets, sizes };
        (overlap.len() > 0).then_some(overlap)
    }

    /// The row-major position within this block of the element at global `coords`
    /// (inside the block).
    pub fn position(&self, coords: &[usize]) -> usize {
        (coords.iter().zip(&self.offsets).zip(&self.sizes))
            .fold(0, |position, ((&c, &o), &n)| position * n + (c - o))
    }

    /// The global coordinates of this block's last element (of a non-empty block).
    pub fn last(&self) -> Vec<usize> {
        (self.offsets.iter().zip(&self.sizes))
            .map(|(&o, &n)| o + n - 1)
            .collect()
    }

    /// The block's name in its safetensors file: the tensor's name and the box as
    /// half-open ranges, `layers.wq[0:8,16:32]` (`step[]` for a scalar).
    pub fn name(&self, tensor: &str) -> String {
        let ranges: Vec<String> = (self.offsets.iter().zip(&self.sizes))
            .map(|(o, n)| format!("{o}:{}", o + n))
            .collect();
        format!("{tensor}[{}]", ranges.join(","))
    }
}

/// The distinct non-empty blocks of a tensor of `shape` sharded as `sharding` on
/// `mesh`, each with the device that writes it: of the devices holding it, the lowest
/// id. In order of those devices.
pub(super) fn written_blocks(
    mesh: &Mesh,
    sharding: &Sharding,
    shape: &[usize],
) -> Vec<(usize, Block)> {
    let mut seen = HashSet::new();
    (0..mesh.num_devices())
        .filter_map(|device| {
            let block = Block::of_device(mesh, sharding, shape, device);
            (block.len() > 0 && seen.insert(block.clone())).then_some((device, block))
        })
        .collect()
}

/// A sharded checkpoint's index: what was saved (each tensor's global type and
/// sharding, the mesh), where each block is, and what it was saved from (the step
/// count, the optimizer). Written as JSON by process 0 when a save commits.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Index {
    /// [`FORMAT`].
    format: String,
    /// [`VERSION`].
    version: u32,
    /// The save's id: the directory (beside the index) holding its files, and the
    /// `gspmd.checkpoint` metadata of each file.
    pub id: String,
    /// The trainer's step count.
    pub step: u64,
    /// The name of the optimizer whose state was saved ([`Optimizer::name`](crate::train::Optimizer::name): `sgd`, `adamw`, `lion`, `adafactor`, `chain(..)`).
    pub optimizer: String,
    /// The mesh the tensors were sharded over.
    #[serde(with = "mesh_layout")]
    pub mesh: Mesh,
    /// The files, relative to the checkpoint directory: `<id>/process-<p>-of-<n>.safetensors`
    /// for each process `p` (of `n`) that wrote a block.
    pub files: Vec<String>,
    /// The trained parameters and their optimizer state, in the trainer's order.
    pub tensors: Vec<TensorRecord>,
}

/// One tensor of an [`Index`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TensorRecord {
    /// Its name (`layers.wq`, `m(layers.wq)`).
    pub name: String,
    /// Its element type (`f32`, `bf16`, `f16`, `i32`, `pred`).
    #[serde(with = "dtype_name")]
    pub dtype: DType,
    /// Its global shape.
    pub shape: Vec<usize>,
    /// Its sharding over the index's mesh, as text (`(data, model)`).
    #[serde(with = "sharding_text")]
    pub sharding: Sharding,
    /// Its distinct non-empty blocks ([`written_blocks`]), in that order.
    pub blocks: Vec<BlockRecord>,
}

/// Where one block of a tensor is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct BlockRecord {
    /// The device that wrote it.
    pub device: usize,
    /// The file holding it: an index into [`Index::files`]. Within the file, it is the
    /// safetensors tensor named [`Block::name`].
    pub file: usize,
    /// The box of the global array.
    #[serde(flatten)]
    pub block: Block,
}

/// The name (relative to the checkpoint directory) of the file that process `process`
/// of `processes` writes in save `id`.
pub(super) fn file_name(id: &str, process: usize, processes: usize) -> String {
    format!("{id}/process-{process:05}-of-{processes:05}.safetensors")
}

impl Index {
    /// The index of save `id` at step `step`: `tensors` (name, global type, sharding)
    /// laid out on `mesh`, whose devices `devices[p]` are process `p`'s. An error if a
    /// device belongs to no process.
    pub fn new(
        id: String,
        step: u64,
        optimizer: &str,
        mesh: &Mesh,
        tensors: &[(String, TensorType, Sharding)],
        devices: &[Range<usize>],
    ) -> Result<Index, String> {
        let process_of = |device: usize| {
            devices
                .iter()
                .position(|range| range.contains(&device))
                .ok_or_else(|| format!("device {device} belongs to no process ({devices:?})"))
        };
        let layouts: Vec<Vec<(usize, Block)>> = (tensors.iter())
            .map(|(_, ty, sharding)| written_blocks(mesh, sharding, &ty.shape))
            .collect();
        // The processes that write a block, each with one file, in process order.
        let mut writers = Vec::new();
        for &(device, _) in layouts.iter().flatten() {
            writers.push(process_of(device)?);
        }
        writers.sort_unstable();
        writers.dedup();
        let files = (writers.iter())
            .map(|&p| file_name(&id, p, devices.len()))
            .collect();
        let tensors = (tensors.iter().zip(layouts))
            .map(|((name, ty, sharding), layout)| {
                let blocks = (layout.into_iter())
                    .map(|(device, block)| {
                        let process = process_of(device)?;
                        let file = writers.iter().position(|&p| p == process).unwrap_or(0);
                        Ok(BlockRecord {
                            device,
                            file,
                            block,
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                Ok(TensorRecord {
                    name: name.clone(),
                    dtype: ty.dtype,
                    shape: ty.shape.clone(),
                    sharding: sharding.clone(),
                    blocks,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Index {
            format: FORMAT.into(),
            version: VERSION,
            id,
            step,
            optimizer: optimizer.into(),
            mesh: mesh.clone(),
            files,
            tensors,
        })
    }

    /// The index at `path`, checked: its format and version, distinct tensor names, each
    /// tensor's sharding valid on the mesh for its shape and its blocks those that
    /// [`written_blocks`] gives, in files the index lists. Any problem is an
    /// [`Error::Checkpoint`] naming `path` (and the tensor).
    pub fn read(path: &Path) -> Result<Index> {
        let fail = |tensor: Option<&str>, problem: CheckpointProblem| Error::Checkpoint {
            path: path.display().to_string(),
            tensor: tensor.map(str::to_string),
            problem,
        };
        let blocks = |reason: String| CheckpointProblem::Blocks { reason };
        let bytes = std::fs::read(path).map_err(|e| {
            let problem = match e.kind() {
                std::io::ErrorKind::NotFound => CheckpointProblem::NoIndex,
                _ => CheckpointProblem::Io {
                    reason: e.to_string(),
                },
            };
            fail(None, problem)
        })?;
        let index: Index = serde_json::from_slice(&bytes).map_err(|e| {
            let reason = format!("not a checkpoint index: {e}");
            fail(None, CheckpointProblem::Format { reason })
        })?;
        if index.format != FORMAT || index.version != VERSION {
            let problem = CheckpointProblem::Version {
                format: index.format,
                version: index.version,
                reads: FORMAT,
                reads_version: VERSION,
            };
            return Err(fail(None, problem));
        }
        for (i, tensor) in index.tensors.iter().enumerate() {
            let name = tensor.name.as_str();
            if index.tensors[..i].iter().any(|t| t.name == name) {
                return Err(fail(Some(name), CheckpointProblem::RepeatedName));
            }
            (tensor.sharding)
                .validate(&index.mesh, tensor.shape.len(), "")
                .map_err(|e| fail(Some(name), blocks(e.to_string())))?;
            let expected = written_blocks(&index.mesh, &tensor.sharding, &tensor.shape);
            let recorded = tensor.blocks.iter().map(|b| (b.device, b.block.clone()));
            if !recorded.eq(expected) {
                let reason = format!(
                    "its blocks are not those of sharding {} of shape {:?} on {}",
                    tensor.sharding, tensor.shape, index.mesh
                );
                return Err(fail(Some(name), blocks(reason)));
            }
            if let Some(b) = tensor.blocks.iter().find(|b| b.file >= index.files.len()) {
                let reason = format!(
                    "a block is in file {}, but the index lists {} files",
                    b.file,
                    index.files.len()
                );
                return Err(fail(Some(name), blocks(reason)));
            }
        }
        Ok(index)
    }

    /// The tensor named `name`, if saved.
    pub fn tensor(&self, name: &str) -> Option<&TensorRecord> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// A [`Mesh`] as `{"axes": [["data", 2], ["model", 4]], "devices": [0, 1, ..]}`: its axes,
/// major to minor, and the device at each row-major position.
mod mesh_layout {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::sharding::Mesh;

    #[derive(Serialize, Deserialize)]
    struct Layout {
        axes: Vec<(String, usize)>,
        devices: Vec<usize>,
    }

    pub fn serialize<S: Serializer>(mesh: &Mesh, serializer: S) -> Result<S::Ok, S::Error> {
        Layout {
            axes: mesh.axes().to_vec(),
            devices: mesh.device_ids().to_vec(),
        }
        .serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Mesh, D::Error> {
        let Layout { axes, devices } = Layout::deserialize(deserializer)?;
        Mesh::with_device_order(axes, devices).map_err(serde::de::Error::custom)
    }
}

/// A [`DType`] as its name (`f32`).
mod dtype_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::ir::DType;

    pub fn serialize<S: Serializer>(dtype: &DType, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(dtype.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<DType, D::Error> {
        let name = String::deserialize(deserializer)?;
        (DType::ALL.into_iter().find(|d| d.name() == name))
            .ok_or_else(|| serde::de::Error::custom(format!("unknown dtype `{name}`")))
    }
}

/// A [`Sharding`] as its text (`(data, model)`), which parses back.
mod sharding_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::sharding::Sharding;

    pub fn serialize<S: Serializer>(sharding: &Sharding, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(sharding)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Sharding, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The block at `offsets` of `sizes`.
    pub(in super::super) fn block(offsets: &[usize], sizes: &[usize]) -> Block {
        Block {
            offsets: offsets.to_vec(),
            sizes: sizes.to_vec(),
        }
    }

    #[test]
    fn blocks_meet_where_their_boxes_do() {
        let a = block(&[0, 4], &[4, 4]);
        assert_eq!(
            a.overlap(&block(&[2, 0], &[4, 6])),
            Some(block(&[2, 4], &[2, 2]))
        );
        assert_eq!(a.overlap(&block(&[4, 0], &[4, 8])), None);
        assert_eq!(
            block(&[], &[]).overlap(&block(&[], &[])),
            Some(block(&[], &[]))
        );
        // Row-major positions inside a block, from global coordinates.
        assert_eq!(a.position(&[0, 4]), 0);
        assert_eq!(a.position(&[1, 6]), 6);
        assert_eq!(a.position(&a.last()), 15);
        assert_eq!(a.name("w"), "w[0:4,4:8]");
        assert_eq!(block(&[], &[]).name("s"), "s[]");
    }

    #[test]
    fn replicas_are_written_once_by_the_lowest_device() {
        // Devices 2, 5, 0, 7 / 4, 1, 6, 3 at the positions of a 2x4 mesh; a tensor
        // split over `model` only: the two devices of each column hold one block.
        let mesh =
            Mesh::with_device_order([("data", 2), ("model", 4)], vec![2, 5, 0, 7, 4, 1, 6, 3])
                .unwrap();
        let sharding: Sharding = "(_, model)".parse().unwrap();
        let written = written_blocks(&mesh, &sharding, &[3, 7]);
        let devices: Vec<usize> = written.iter().map(|w| w.0).collect();
        assert_eq!(devices, [0, 1, 2, 3]);
        // Columns of 2: device 2 (column 0) holds 0..2; device 3 (column 3) the last 1.
        assert_eq!(written[2].1, block(&[0, 0], &[3, 2]));
        assert_eq!(written[3].1, block(&[0, 6], &[3, 1]));
        // Uneven: 2 rows on 4 shards leaves two devices' blocks empty, which no one writes.
        let rows: Sharding = "((data, model), _)".parse().unwrap();
        assert_eq!(written_blocks(&mesh, &rows, &[2, 3]).len(), 2);
    }

    #[test]
    fn an_index_survives_its_json() {
        let mesh = Mesh::new([("data", 2), ("model", 2)]).unwrap();
        let tensors = vec![
            (
                "w".to_string(),
                TensorType::new(vec![4, 6], DType::F32),
                "(data, model)".parse().unwrap(),
            ),
            (
                "b".to_string(),
                TensorType::new(vec![], DType::BF16),
                Sharding::replicated(0),
            ),
        ];
        // Two processes of two devices each.
        let index =
            Index::new("step3-0".into(), 3, "adamw", &mesh, &tensors, &[0..2, 2..4]).unwrap();
        assert_eq!(
            index.files,
            [
                "step3-0/process-00000-of-00002.safetensors",
                "step3-0/process-00001-of-00002.safetensors"
            ]
        );
        let files: Vec<usize> = index.tensors[0].blocks.iter().map(|b| b.file).collect();
        assert_eq!(files, [0, 0, 1, 1]);
        assert_eq!(index.tensors[1].blocks.len(), 1);
        let path = std::env::temp_dir().join(format!("gspmd_index_{}.json", std::process::id()));
        std::fs::write(&path, serde_json::to_vec(&index).unwrap()).unwrap();
        let read = Index::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read.mesh, mesh);
        assert_eq!(read.tensors[0].sharding, tensors[0].2);
        assert_eq!(read.tensors[1].dtype, DType::BF16);
        assert_eq!(read.tensors[0].blocks, index.tensors[0].blocks);
        // Devices 2 and 3 in no process.
        let first_two = std::slice::from_ref(&(0..2));
        assert!(Index::new("x".into(), 0, "sgd", &mesh, &tensors, first_two).is_err());
    }
}
