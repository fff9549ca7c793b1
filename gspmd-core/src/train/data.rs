//! [`Dataset`]: examples held on the host, served in shuffled batches already cut for
//! the mesh: each device receives only its block of each batch ([`Batch::Blocks`], fed
//! as per-device inputs), gathered straight from the examples without a global batch.

use std::ops::Range;

use ndarray::Axis;

use super::init::mix;
use crate::error::{Error, Result};
use crate::ir::Literal;
use crate::runtime::shard_literal;
use crate::sharding::{DimSharding, Mesh, Sharding};

/// Examples: one array per field (tokens, targets, ...), each with the example index
/// as its leading dim.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    fields: Vec<Literal>,
    len: usize,
}

/// One batch of a training step's data inputs.
#[derive(Debug, Clone, PartialEq)]
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

impl Dataset {
    /// A dataset of `fields`, which must all have the same leading dim (the number of
    /// examples), else an [`Error::TrainerInput`].
    pub fn new(fields: Vec<Literal>) -> Result<Self> {
        let fail = |message: String| Error::TrainerInput {
            name: "dataset".into(),
            message,
        };
        let Some(first) = fields.first() else {
            return Err(fail("no field".into()));
        };
        let len =
            first.shape().first().copied().ok_or_else(|| {
                fail("a field is a scalar: fields need a leading example dim".into())
            })?;
        if let Some((i, f)) =
            (fields.iter().enumerate()).find(|(_, f)| f.shape().first() != Some(&len))
        {
            return Err(fail(format!(
                "field {i} is {:?} but field 0 holds {len} examples",
                f.shape()
            )));
        }
        Ok(Dataset { fields, len })
    }

    /// The number of examples.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no example.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The order in which epoch `epoch` visits the examples under `seed`: a
    /// permutation of `0..len` (Fisher-Yates, each swap drawn from a counter-based
    /// generator keyed by `(seed, epoch, position)`), the same for the same seed and
    /// epoch on every machine.
    pub fn order(&self, seed: u64, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        let key = mix(seed ^ mix(epoch));
        for i in (1..self.len).rev() {
            let r = mix(key ^ mix(i as u64));
            order.swap(i, (r % (i as u64 + 1)) as usize);
        }
        order
    }

    /// The examples `examples` of every field, stacked: one global array per field.
    pub fn gather(&self, examples: &[usize]) -> Vec<Literal> {
        self.fields.iter().map(|f| take_rows(f, examples)).collect()
    }

    /// Batches of `batch` examples for `epochs` epochs, each epoch shuffled by
    /// [`Dataset::order`] under `seed` (the last `len % batch` examples of an epoch's
    /// order are left out). With `layout`, each batch comes cut for the mesh
    /// ([`Batch::Blocks`]): every data input's leading dim is the batch, split as its
    /// sharding says, and each of the layout's devices gets its rows gathered from the
    /// examples directly; without (`None`), global batches.
    pub fn batches(
        &self,
        batch: usize,
        epochs: u64,
        seed: u64,
        layout: impl Into<Option<DataLayout>>,
    ) -> Result<Batches<'_>> {
        let layout = layout.into();
        if batch == 0 || batch > self.len {
            return Err(Error::TrainerInput {
                name: "dataset".into(),
                message: format!("a batch of {batch} from {} examples", self.len),
            });
        }
        if let Some(layout) = &layout
            && layout.shardings.len() != self.fields.len()
        {
            return Err(Error::TrainerInput {
                name: "dataset".into(),
                message: format!(
                    "{} fields for {} data inputs",
                    self.fields.len(),
                    layout.shardings.len()
                ),
            });
        }
        Ok(Batches {
            dataset: self,
            batch,
            epochs,
            seed,
            layout,
            epoch: 0,
            position: 0,
            order: self.order(seed, 0),
        })
    }

    /// Device `device`'s block of field `field` for the batch of `examples`, cut by
    /// `sharding` on `mesh` (its rows gathered first, then the other dims cut).
    fn block(
        &self,
        field: usize,
        examples: &[usize],
        sharding: &Sharding,
        mesh: &Mesh,
        device: usize,
    ) -> Literal {
        let mut shape = self.fields[field].shape().to_vec();
        shape[0] = examples.len();
        let (start, count) = sharding.device_block(mesh, &shape, device)[0];
        let mine = take_rows(&self.fields[field], &examples[start..start + count]);
        let mut rest = sharding.clone();
        if let Some(rows) = rest.dims.first_mut() {
            *rows = DimSharding::closed(Vec::<String>::new());
        }
        shard_literal(&mine, &rest, mesh, device)
    }
}

/// The iterator of [`Dataset::batches`]: each item is `(epoch, batch)`.
pub struct Batches<'a> {
    dataset: &'a Dataset,
    batch: usize,
    epochs: u64,
    seed: u64,
    layout: Option<DataLayout>,
    epoch: u64,
    position: usize,
    order: Vec<usize>,
}

impl Iterator for Batches<'_> {
    type Item = (u64, Batch);

    fn next(&mut self) -> Option<Self::Item> {
        if self.position + self.batch > self.order.len() {
            self.epoch += 1;
            self.position = 0;
            self.order = self.dataset.order(self.seed, self.epoch);
        }
        if self.epoch >= self.epochs {
            return None;
        }
        let examples = &self.order[self.position..self.position + self.batch];
        self.position += self.batch;
        let batch = match &self.layout {
            None => Batch::Global(self.dataset.gather(examples)),
            Some(layout) => Batch::Blocks(
                (layout.shardings.iter().enumerate())
                    .map(|(field, sharding)| {
                        (layout.devices.clone())
                            .map(|d| {
                                self.dataset
                                    .block(field, examples, sharding, &layout.mesh, d)
                            })
                            .collect()
                    })
                    .collect(),
            ),
        };
        Some((self.epoch, batch))
    }
}

/// Rows `rows` of `lit` along its leading dim, stacked in that order.
fn take_rows(lit: &Literal, rows: &[usize]) -> Literal {
    crate::ir::map_literal!(lit, a => a.select(Axis(0), rows))
}
