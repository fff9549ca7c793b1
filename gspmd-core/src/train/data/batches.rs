//! [`Batches`]: the batches of a training run, each read as the process's devices need
//! it. Batch `k` is defined globally, the same on every process (`batch` examples of an
//! epoch's shuffled order, or what the user's function makes of rows of batch `k`);
//! with a [`DataLayout`], a process asks for the rows of
//! batch `k` its devices hold (each data input's leading dim is the batch, split as its
//! sharding says, [`Sharding::device_block`]), reads each distinct run of rows once
//! (devices that replicate the batch dim share it) and cuts each device's block of the
//! other dims from it.

use std::ops::Range;

use super::source::{Source, epoch_order};
use super::{Batch, DataLayout};
use crate::error::{Error, InputProblem, Result};
use crate::ir::{Literal, TensorType};
use crate::runtime::shard_literal;
use crate::sharding::{DimSharding, Sharding};

/// The function of [`Batches::from_fn`]: rows `rows` of global batch `k`, one array per
/// field.
type MakeRows<'a> = dyn Fn(u64, Range<usize>) -> Result<Vec<Literal>> + 'a;

/// The batches of a training run: each item is `(epoch, batch)`, the batch cut for the
/// [`DataLayout`] given ([`Batch::Blocks`]: the blocks of the layout's devices, read
/// and cut without a global batch) or global ([`Batch::Global`]) without one; an error
/// reading a batch is that item's.
pub struct Batches<'a> {
    reader: Reader<'a>,
    layout: Option<Layout>,
    /// The next batch's index.
    next: u64,
    /// How many batches there are.
    count: u64,
}

/// Reads rows of a batch.
struct Reader<'a> {
    rows: Rows<'a>,
    /// One example's type per field.
    fields: Vec<TensorType>,
    batch: usize,
}

/// Where the rows of a batch come from.
enum Rows<'a> {
    /// A source's examples in each epoch's order, `per_epoch` batches an epoch.
    Shuffled {
        source: &'a dyn Source,
        seed: u64,
        per_epoch: u64,
        /// The last epoch whose order was needed, and that order.
        order: (u64, Vec<usize>),
    },
    /// The user's function.
    Made(Box<MakeRows<'a>>),
}

/// A [`DataLayout`] as a batch is cut for it.
struct Layout {
    layout: DataLayout,
    /// The distinct runs of rows of a batch that the local devices hold, each with the
    /// fields that need it.
    runs: Vec<(Range<usize>, Vec<usize>)>,
    /// `[field][i]`: where the `i`-th local device's rows of the field are, as
    /// `(run, position of the field among the run's)`.
    blocks: Vec<Vec<(usize, usize)>>,
    /// Per field, its sharding with the batch dim not split: how a device's rows are
    /// cut.
    rest: Vec<Sharding>,
}

impl<'a> Batches<'a> {
    /// Batches of `batch` examples of `source` for `epochs` epochs, each epoch visiting
    /// the examples in [`Dataset::order`](super::Dataset::order) under `seed` (the last
    /// `len % batch` examples of an epoch's order are left out): batch `k` holds the
    /// examples at positions `(k % n) * batch..` of epoch `k / n`'s order, `n` being
    /// `len / batch`. With `layout`, the source is asked only for the examples of the
    /// layout's devices' rows, once each. Errors ([`Error::TrainerInput`]): `batch` is 0
    /// or exceeds the source's length; the layout does not fit the source's fields (see
    /// [`Batches::from_fn`]). An item is an error if the source fails to read or gives
    /// an array of another dtype or shape than its fields say.
    pub fn shuffled(
        source: &'a dyn Source,
        batch: usize,
        epochs: u64,
        seed: u64,
        layout: impl Into<Option<DataLayout>>,
    ) -> Result<Self> {
        let len = source.len();
        if batch == 0 || batch > len {
            return Err(data_error(format!(
                "a batch of {batch} from {len} examples"
            )));
        }
        let per_epoch = (len / batch) as u64;
        let rows = Rows::Shuffled {
            source,
            seed,
            per_epoch,
            order: (0, epoch_order(len, seed, 0)),
        };
        Batches::new(
            rows,
            source.fields(),
            batch,
            epochs * per_epoch,
            layout.into(),
        )
    }

    /// `count` batches of `batch` examples made by `make`: `make(k, rows)` gives rows
    /// `rows` of global batch `k` (`k < count`), one array per field, each of the
    /// field's dtype and shape `[rows.len(), fields[f].shape..]`: the rows a global batch
    /// made at once would hold, whichever process asks. With `layout`, it is called
    /// for the layout's devices' rows only, once per distinct run of rows. The epoch of
    /// every item is 0.
    ///
    /// Errors ([`Error::TrainerInput`]): `batch` is 0; `layout` has another number of
    /// data inputs than `fields`, a sharding that does not fit a batch of a field (its
    /// rank, its axes), or devices the mesh does not have. An item is an error if `make`
    /// fails or gives another number of arrays, or an array of another dtype or shape.
    pub fn from_fn(
        fields: Vec<TensorType>,
        batch: usize,
        count: u64,
        layout: impl Into<Option<DataLayout>>,
        make: impl Fn(u64, Range<usize>) -> Result<Vec<Literal>> + 'a,
    ) -> Result<Self> {
        if batch == 0 {
            return Err(data_error("a batch of 0 examples".into()));
        }
        Batches::new(
            Rows::Made(Box::new(make)),
            fields,
            batch,
            count,
            layout.into(),
        )
    }

    fn new(
        rows: Rows<'a>,
        fields: Vec<TensorType>,
        batch: usize,
        count: u64,
        layout: Option<DataLayout>,
    ) -> Result<Self> {
        let layout = layout
            .map(|layout| Layout::new(layout, &fields, batch))
            .transpose()?;
        Ok(Batches {
            reader: Reader {
                rows,
                fields,
                batch,
            },
            layout,
            next: 0,
            count,
        })
    }

    /// Batch `k`: global, or the blocks of the layout's devices (`[field][i]`), each
    /// distinct run of rows read once with the fields that need it.
    fn make(&mut self, k: u64) -> Result<Batch> {
        let Some(layout) = &self.layout else {
            let all: Vec<usize> = (0..self.reader.fields.len()).collect();
            return (self.reader)
                .read(k, 0..self.reader.batch, &all)
                .map(Batch::Global);
        };
        let read = (layout.runs.iter())
            .map(|(rows, fields)| self.reader.read(k, rows.clone(), fields))
            .collect::<Result<Vec<_>>>()?;
        let DataLayout { mesh, devices, .. } = &layout.layout;
        let blocks = (layout.blocks.iter().zip(&layout.rest))
            .map(|(places, rest)| {
                (places.iter().zip(devices.clone()))
                    .map(|(&(run, at), d)| shard_literal(&read[run][at], rest, mesh, d))
                    .collect()
            })
            .collect();
        Ok(Batch::Blocks(blocks))
    }
}

impl Reader<'_> {
    /// Rows `rows` of batch `k` of the fields `wanted`, checked against their types.
    fn read(&mut self, k: u64, rows: Range<usize>, wanted: &[usize]) -> Result<Vec<Literal>> {
        let shape = |f: usize| {
            let mut shape = vec![rows.len()];
            shape.extend(&self.fields[f].shape);
            shape
        };
        if rows.is_empty() {
            let empty = |&f: &usize| Literal::full(&shape(f), self.fields[f].dtype, 0.0);
            return Ok(wanted.iter().map(empty).collect());
        }
        let values = match &mut self.rows {
            Rows::Shuffled {
                source,
                seed,
                per_epoch,
                order,
            } => {
                let epoch = k / *per_epoch;
                if order.0 != epoch {
                    *order = (epoch, epoch_order(source.len(), *seed, epoch));
                }
                let first = (k % *per_epoch) as usize * self.batch;
                let examples = &order.1[first + rows.start..first + rows.end];
                (wanted.iter())
                    .map(|&f| source.read(f, examples))
                    .collect::<Result<Vec<_>>>()?
            }
            Rows::Made(make) => {
                let mut all = make(k, rows.clone())?;
                if all.len() != self.fields.len() {
                    return Err(data_error(format!(
                        "rows {rows:?} of batch {k}: {} arrays for {} fields",
                        all.len(),
                        self.fields.len()
                    )));
                }
                (wanted.iter())
                    .map(|&f| std::mem::replace(&mut all[f], Literal::scalar_f32(0.0)))
                    .collect()
            }
        };
        for (&f, value) in wanted.iter().zip(&values) {
            let want = TensorType::new(shape(f), self.fields[f].dtype);
            if value.dtype() != want.dtype || value.shape() != want.shape {
                return Err(data_error(format!(
                    "rows {rows:?} of batch {k}, field {f}: expected {want}, got {}",
                    TensorType::new(value.shape(), value.dtype())
                )));
            }
        }
        Ok(values)
    }
}

impl Layout {
    /// `layout` checked against `fields` for batches of `batch`, with the runs of rows
    /// its devices hold.
    fn new(layout: DataLayout, fields: &[TensorType], batch: usize) -> Result<Self> {
        if layout.shardings.len() != fields.len() {
            return Err(data_error(format!(
                "{} fields for {} data inputs",
                fields.len(),
                layout.shardings.len()
            )));
        }
        let devices = layout.mesh.num_devices();
        if layout.devices.end > devices {
            return Err(data_error(format!(
                "devices {:?} of a mesh of {devices}",
                layout.devices
            )));
        }
        let mut runs: Vec<(Range<usize>, Vec<usize>)> = Vec::new();
        let mut blocks = Vec::with_capacity(fields.len());
        let mut rest = Vec::with_capacity(fields.len());
        for (f, (ty, sharding)) in fields.iter().zip(&layout.shardings).enumerate() {
            let mut shape = vec![batch];
            shape.extend(&ty.shape);
            let context = format!("data input {f} (a batch of {ty}): ");
            (sharding.validate(&layout.mesh, shape.len(), &context))
                .map_err(|e| data_error(e.to_string()))?;
            let mut places = Vec::with_capacity(layout.devices.len());
            for d in layout.devices.clone() {
                let (start, count) = sharding.device_block(&layout.mesh, &shape, d)[0];
                let rows = start..start + count;
                let run = (runs.iter().position(|(r, _)| *r == rows)).unwrap_or_else(|| {
                    runs.push((rows, Vec::new()));
                    runs.len() - 1
                });
                let readers = &mut runs[run].1;
                let at = (readers.iter().position(|&g| g == f)).unwrap_or_else(|| {
                    readers.push(f);
                    readers.len() - 1
                });
                places.push((run, at));
            }
            blocks.push(places);
            let mut unsplit = sharding.clone();
            unsplit.dims[0] = DimSharding::closed(Vec::<String>::new());
            rest.push(unsplit);
        }
        Ok(Layout {
            layout,
            runs,
            blocks,
            rest,
        })
    }
}

impl Iterator for Batches<'_> {
    type Item = Result<(u64, Batch)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.count {
            return None;
        }
        let k = self.next;
        self.next += 1;
        let epoch = match &self.reader.rows {
            Rows::Shuffled { per_epoch, .. } => k / per_epoch,
            Rows::Made(_) => 0,
        };
        Some(self.make(k).map(|batch| (epoch, batch)))
    }
}

/// An [`Error::TrainerInput`] about the data.
fn data_error(message: String) -> Error {
    Error::TrainerInput {
        name: "data".into(),
        problem: InputProblem::Invalid { reason: message },
    }
}
