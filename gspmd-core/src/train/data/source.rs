//! [`Source`]: examples addressable by index, read a few rows at a time (grain's
//! random-access data source, PyTorch's map-style dataset); [`Dataset`]: one held in
//! memory.

use ndarray::Axis;

use super::super::init::mix;
use super::{Batches, DataLayout};
use crate::error::{Error, InputProblem, Result};
use crate::ir::{Literal, TensorType};

/// Examples addressable by index: `len()` of them, each made of one array per *field*
/// (tokens, targets, ...), every example's array of a field having the same type.
///
/// [`Batches::shuffled`] asks a source for the rows a
/// process's devices hold of each batch, and for nothing else.
pub trait Source {
    /// The number of examples.
    fn len(&self) -> usize;

    /// Whether it holds no example.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The type of one example's array of each field (its dtype and per-example
    /// shape), in field order.
    fn fields(&self) -> Vec<TensorType>;

    /// Field `field` of the examples `examples` (each `< len()`, in any order, possibly
    /// repeated), stacked in that order: an array of the field's dtype and shape
    /// `[examples.len(), per-example shape..]`. Reads those examples only. A bad index
    /// or field, or an example that cannot be read, is an error naming it.
    fn read(&self, field: usize, examples: &[usize]) -> Result<Literal>;
}

/// Examples held in memory: one array per field (tokens, targets, ...), each with the
/// example index as its leading dim.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    fields: Vec<Literal>,
    len: usize,
}

impl Dataset {
    /// A dataset of `fields`, which must all have the same leading dim (the number of
    /// examples), else an [`Error::TrainerInput`].
    pub fn new(fields: Vec<Literal>) -> Result<Self> {
        let fail = |reason: String| Error::TrainerInput {
            name: "dataset".into(),
            problem: InputProblem::Invalid { reason },
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
    /// epoch on every machine; [`Batches::shuffled`] visits
    /// any source of this length in this order.
    pub fn order(&self, seed: u64, epoch: u64) -> Vec<usize> {
        epoch_order(self.len, seed, epoch)
    }

    /// The examples `examples` of every field, stacked: one global array per field; an
    /// example index past the end is an [`Error::TrainerInput`] naming it.
    pub fn gather(&self, examples: &[usize]) -> Result<Vec<Literal>> {
        (0..self.fields.len())
            .map(|f| self.read(f, examples))
            .collect()
    }

    /// Shuffled batches of `batch` examples for `epochs` epochs under `seed`, cut for
    /// `layout` if given: [`Batches::shuffled`] of this dataset.
    pub fn batches(
        &self,
        batch: usize,
        epochs: u64,
        seed: u64,
        layout: impl Into<Option<DataLayout>>,
    ) -> Result<Batches<'_>> {
        Batches::shuffled(self, batch, epochs, seed, layout)
    }
}

impl Source for Dataset {
    fn len(&self) -> usize {
        self.len
    }

    fn fields(&self) -> Vec<TensorType> {
        (self.fields.iter())
            .map(|f| TensorType::new(&f.shape()[1..], f.dtype()))
            .collect()
    }

    fn read(&self, field: usize, examples: &[usize]) -> Result<Literal> {
        let fail = |what, index, len| Error::TrainerInput {
            name: "dataset".into(),
            problem: InputProblem::OutOfRange { what, index, len },
        };
        let values =
            (self.fields.get(field)).ok_or_else(|| fail("field", field, self.fields.len()))?;
        if let Some(&e) = examples.iter().find(|&&e| e >= self.len) {
            return Err(fail("example", e, self.len));
        }
        Ok(take_rows(values, examples))
    }
}

/// The order in which epoch `epoch` visits `len` examples under `seed`, whatever the
/// source: see [`Dataset::order`].
pub(super) fn epoch_order(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    let key = mix(seed ^ mix(epoch));
    for i in (1..len).rev() {
        let r = mix(key ^ mix(i as u64));
        order.swap(i, (r % (i as u64 + 1)) as usize);
    }
    order
}

/// Rows `rows` of `lit` along its leading dim, stacked in that order.
fn take_rows(lit: &Literal, rows: &[usize]) -> Literal {
    crate::ir::map_literal!(lit, a => a.select(Axis(0), rows))
}
