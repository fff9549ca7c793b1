//! Checkpoints: named global tensors in the safetensors format (a JSON header of names,
//! dtypes, shapes and offsets, then little-endian row-major data), readable by other
//! frameworks' safetensors loaders. [`Trainer::save`] and [`Trainer::load`] write and
//! read a trainer's checkpoint on any engine, MPI ranks included.

use std::collections::HashMap;
use std::path::Path;

use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use super::trainer::Trainer;
use crate::error::{Error, Result};
use half::{bf16, f16};

use crate::ir::{Element, Literal, with_literal};

/// Header metadata key prefix recording the order tensors were given in: key
/// `gspmd.order.<i>` holds the name of tensor `i`.
const ORDER: &str = "gspmd.order.";

/// Writes `tensors` (f32, bf16, f16, i32 or bool; names distinct) to `path` as a safetensors file,
/// replacing it if it exists. Their order is kept in the header's metadata so that
/// [`load_checkpoint`] returns them in the same order.
pub fn save_checkpoint(path: impl AsRef<Path>, tensors: &[(String, Literal)]) -> Result<()> {
    let path = path.as_ref();
    let fail = |message: String| Error::Checkpoint {
        path: path.display().to_string(),
        message,
    };
    let mut order = HashMap::with_capacity(tensors.len());
    let mut bytes = Vec::with_capacity(tensors.len());
    for (i, (name, lit)) in tensors.iter().enumerate() {
        if tensors[..i].iter().any(|(n, _)| n == name) {
            return Err(fail(format!("tensor name `{name}` is given twice")));
        }
        order.insert(format!("{ORDER}{i}"), name.clone());
        let (dtype, data) = encode(lit);
        bytes.push((name.as_str(), dtype, lit.shape(), data));
    }
    let views = bytes
        .iter()
        .map(|(name, dtype, shape, data)| {
            TensorView::new(*dtype, shape.clone(), data)
                .map(|view| (*name, view))
                .map_err(|e| fail(format!("tensor `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, Some(order), path).map_err(|e| fail(e.to_string()))
}

/// Reads the tensors of the safetensors file at `path`: in the order they were saved
/// by [`save_checkpoint`], or in file order for a file written by another tool.
/// F32, BF16, F16, I32 and BOOL tensors are supported; any other dtype is an
/// [`Error::Checkpoint`].
pub fn load_checkpoint(path: impl AsRef<Path>) -> Result<Vec<(String, Literal)>> {
    let path = path.as_ref();
    decode_checkpoint(path, &read_checkpoint(path)?)
}

/// The bytes of the file at `path`.
fn read_checkpoint(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Checkpoint {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// The tensors of `buffer`, the bytes of the safetensors file at `path` (see
/// [`load_checkpoint`]).
fn decode_checkpoint(path: &Path, buffer: &[u8]) -> Result<Vec<(String, Literal)>> {
    let fail = |message: String| Error::Checkpoint {
        path: path.display().to_string(),
        message,
    };
    let (_, metadata) = SafeTensors::read_metadata(buffer).map_err(|e| fail(e.to_string()))?;
    let file = SafeTensors::deserialize(buffer).map_err(|e| fail(e.to_string()))?;
    let names = match metadata.metadata() {
        Some(m) if m.keys().any(|k| k.starts_with(ORDER)) => {
            saved_order(m, &metadata.offset_keys()).map_err(fail)?
        }
        _ => metadata.offset_keys(),
    };
    names
        .into_iter()
        .map(|name| {
            let view = file
                .tensor(&name)
                .map_err(|e| fail(format!("tensor `{name}`: {e}")))?;
            let lit =
                decode(&view).map_err(|message| fail(format!("tensor `{name}`: {message}")))?;
            Ok((name, lit))
        })
        .collect()
}

impl Trainer {
    /// Writes [`Trainer::checkpoint`] to `path` with [`save_checkpoint`]: one file for
    /// any backend. On a backend of several processes every process calls it: the
    /// blocks are gathered, process 0 writes the file, and every process returns once it
    /// is written (or with its error).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
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

    /// [`Trainer::restore`]s from the file at `path` (see [`load_checkpoint`]), saved
    /// on any backend of the same step program. On a backend of several processes
    /// every process calls it and only process 0 reads the file (the others' `path` is
    /// not used) and sends its bytes to the others; an error reading or decoding the
    /// file is an error on every process.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let backend = self.backend();
        let tensors = if backend.process().1 == 1 {
            load_checkpoint(path)?
        } else {
            let first = backend.process().0 == 0;
            let mut bytes = Vec::new();
            // Only process 0's path is used: the others' may differ.
            let place = "the reading of a checkpoint";
            backend.together(place, &mut || {
                if first {
                    bytes = read_checkpoint(path)?;
                    decode_checkpoint(path, &bytes)?;
                }
                Ok(())
            })?;
            let all = backend.all_gather_bytes(place, bytes)?;
            let mut tensors = Vec::new();
            backend.together(place, &mut || {
                tensors = decode_checkpoint(path, &all[0])?;
                Ok(())
            })?;
            tensors
        };
        self.restore(&tensors)
    }
}

/// The tensor order recorded in `metadata` by [`save_checkpoint`]: keys
/// `gspmd.order.0 ..` must name each of the file's `tensors` exactly once, with no gap
/// and no other `gspmd.order.` key, or the file was not written by us (or was edited)
/// and is rejected rather than read with a tensor dropped or doubled.
fn saved_order(
    metadata: &HashMap<String, String>,
    tensors: &[String],
) -> Result<Vec<String>, String> {
    let mut names = Vec::with_capacity(tensors.len());
    for i in 0..tensors.len() {
        let key = format!("{ORDER}{i}");
        let name = metadata
            .get(&key)
            .ok_or_else(|| format!("metadata `{key}` is missing ({} tensors)", tensors.len()))?;
        if !tensors.contains(name) {
            return Err(format!(
                "metadata `{key}` names `{name}`, which the file does not hold"
            ));
        }
        if names.contains(name) {
            return Err(format!("metadata `{key}` names `{name}` a second time"));
        }
        names.push(name.clone());
    }
    let recorded = metadata.keys().filter(|k| k.starts_with(ORDER)).count();
    if recorded != tensors.len() {
        return Err(format!(
            "metadata records the order of {recorded} tensors but the file holds {}",
            tensors.len()
        ));
    }
    Ok(names)
}

/// An element type as safetensors stores it: its dtype and little-endian bytes.
trait Stored: Element {
    const STORED: Dtype;
    /// Bytes per element.
    const SIZE: usize;
    fn write(self, out: &mut Vec<u8>);
    /// The element of `bytes` (`SIZE` of them).
    fn read(bytes: &[u8]) -> Result<Self, String>;
}

macro_rules! stored_le {
    ($t:ty, $dtype:ident, $size:literal) => {
        impl Stored for $t {
            const STORED: Dtype = Dtype::$dtype;
            const SIZE: usize = $size;
            fn write(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read(bytes: &[u8]) -> Result<Self, String> {
                let word = bytes.try_into().map_err(|_| "a truncated element")?;
                Ok(<$t>::from_le_bytes(word))
            }
        }
    };
}

stored_le!(f32, F32, 4);
stored_le!(bf16, BF16, 2);
stored_le!(f16, F16, 2);
stored_le!(i32, I32, 4);

impl Stored for bool {
    const STORED: Dtype = Dtype::BOOL;
    const SIZE: usize = 1;
    fn write(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn read(bytes: &[u8]) -> Result<Self, String> {
        match bytes {
            [0] => Ok(false),
            [1] => Ok(true),
            other => Err(format!("bool byte {other:?} is neither 0 nor 1")),
        }
    }
}

/// The safetensors dtype and little-endian bytes of `lit`, row-major.
fn encode(lit: &Literal) -> (Dtype, Vec<u8>) {
    fn bytes<T: Stored>(a: &ArrayD<T>) -> (Dtype, Vec<u8>) {
        let mut out = Vec::with_capacity(a.len() * T::SIZE);
        a.iter().for_each(|&x| x.write(&mut out));
        (T::STORED, out)
    }
    with_literal!(lit, a => bytes(a))
}

/// The literal a tensor view holds.
fn decode(view: &TensorView<'_>) -> Result<Literal, String> {
    fn elements<T: Stored>(view: &TensorView<'_>) -> Result<Literal, String> {
        let v = view
            .data()
            .chunks(T::SIZE)
            .map(T::read)
            .collect::<Result<Vec<T>, String>>()?;
        ArrayD::from_shape_vec(IxDyn(view.shape()), v)
            .map(T::literal)
            .map_err(|e| e.to_string())
    }
    match view.dtype() {
        Dtype::F32 => elements::<f32>(view),
        Dtype::BF16 => elements::<bf16>(view),
        Dtype::F16 => elements::<f16>(view),
        Dtype::I32 => elements::<i32>(view),
        Dtype::BOOL => elements::<bool>(view),
        other => Err(format!(
            "dtype {other:?} is not supported (f32, bf16, f16, i32, bool are)"
        )),
    }
}
