//! [`SafetensorsFile`]: a [`Source`] in a safetensors file (a little-endian u64 header
//! length, a JSON header of each tensor's dtype, shape and byte range, then the tensors'
//! bytes, little-endian and row-major) whose tensors hold the examples along their
//! leading dim, one tensor per field. An example's array of a field is one contiguous
//! run of bytes, so the file is read with positioned reads (`pread`) of the rows asked
//! for and nothing else: each process of a job reads its devices' rows of the shared
//! file.

use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::Path;

use safetensors::tensor::{Dtype, Metadata};

use super::source::Source;
use crate::error::{Error, InputProblem, Result};
use crate::ir::{DType, Literal, TensorType};

/// The largest header read (safetensors' own limit): a larger length says the file is
/// no safetensors file.
const MAX_HEADER: u64 = 100_000_000;

/// A [`Source`] whose fields are tensors of a safetensors file, each with the example
/// index as its leading dim (as [`save_checkpoint`](crate::train::save_checkpoint) or
/// Python's `safetensors.numpy.save_file` write them). Opening reads the header and
/// checks that the file holds every byte it describes; [`Source::read`] then reads the
/// byte ranges of the examples asked for (one positioned read per run of consecutive
/// examples), never more.
pub struct SafetensorsFile<F = File> {
    file: F,
    /// The file's name in error messages.
    name: String,
    fields: Vec<Field>,
    len: usize,
}

/// Where one field's examples are in the file.
struct Field {
    tensor: String,
    /// One example's type.
    ty: TensorType,
    /// The file offset of example 0.
    start: u64,
    /// The bytes of one example.
    bytes: usize,
}

impl SafetensorsFile {
    /// The source of the tensors named `tensors` (its fields, in that order) of the
    /// safetensors file at `path`; see [`SafetensorsFile::new`].
    pub fn open(path: impl AsRef<Path>, tensors: &[&str]) -> Result<Self> {
        let name = path.as_ref().display().to_string();
        let file = File::open(path).map_err(|e| file_error(&name, e.to_string()))?;
        SafetensorsFile::new(file, name, tensors)
    }
}

impl<F: FileExt> SafetensorsFile<F> {
    /// The source of the tensors named `tensors` (its fields, in that order) of the
    /// safetensors file read through `file` (a [`File`], or any reader at positions:
    /// one that counts or caches the bytes it reads), called `name` in error messages.
    /// Reads the header and the last byte it describes. Errors, as
    /// [`Error::TrainerInput`] naming the file: the header is malformed; the file is
    /// shorter than its header says (truncated); a tensor is missing, a scalar, of a
    /// dtype other than f32, bf16, f16, i32 and bool, or holds another number of
    /// examples than the first.
    pub fn new(file: F, name: impl Into<String>, tensors: &[&str]) -> Result<Self> {
        let name = name.into();
        let fail = |message: String| file_error(&name, message);
        let read = |buf: &mut [u8], offset| read_bytes(&file, &name, buf, offset);
        let mut word = [0; 8];
        read(&mut word, 0)?;
        let header_len = u64::from_le_bytes(word);
        if header_len > MAX_HEADER {
            return Err(fail(format!(
                "a header of {header_len} bytes: not a safetensors file"
            )));
        }
        let mut header = vec![0; header_len as usize];
        read(&mut header, 8)?;
        let metadata: Metadata =
            serde_json::from_slice(&header).map_err(|e| fail(format!("header: {e}")))?;
        let data = 8 + header_len;
        let end = data + metadata.data_len() as u64;
        if end > data {
            // The last byte the header describes: a truncated file fails here, not in
            // the middle of training.
            read(&mut [0], end - 1)?;
        }
        if tensors.is_empty() {
            return Err(fail("no tensor named as a field".into()));
        }
        let mut fields: Vec<Field> = Vec::with_capacity(tensors.len());
        let mut len = 0;
        for &tensor in tensors {
            let info = metadata.info(tensor).ok_or_else(|| {
                fail(format!(
                    "no tensor `{tensor}` (it holds {})",
                    metadata.offset_keys().join(", ")
                ))
            })?;
            let dtype = dtype(info.dtype).ok_or_else(|| {
                fail(format!(
                    "tensor `{tensor}` is {:?}: f32, bf16, f16, i32 and bool are supported",
                    info.dtype
                ))
            })?;
            let Some((&examples, example)) = info.shape.split_first() else {
                return Err(fail(format!(
                    "tensor `{tensor}` is a scalar: fields need a leading example dim"
                )));
            };
            if let Some(first) = fields.first()
                && examples != len
            {
                return Err(fail(format!(
                    "tensor `{tensor}` holds {examples} examples but `{}` holds {len}",
                    first.tensor
                )));
            }
            len = examples;
            fields.push(Field {
                tensor: tensor.to_string(),
                ty: TensorType::new(example, dtype),
                start: data + info.data_offsets.0 as u64,
                bytes: example.iter().product::<usize>() * dtype.size_in_bytes(),
            });
        }
        Ok(SafetensorsFile {
            file,
            name,
            fields,
            len,
        })
    }
}

impl<F: FileExt> Source for SafetensorsFile<F> {
    fn len(&self) -> usize {
        self.len
    }

    fn fields(&self) -> Vec<TensorType> {
        self.fields.iter().map(|f| f.ty.clone()).collect()
    }

    fn read(&self, field: usize, examples: &[usize]) -> Result<Literal> {
        let fail = |message: String| file_error(&self.name, message);
        let f = (self.fields.get(field))
            .ok_or_else(|| fail(format!("no field {field} of {}", self.fields.len())))?;
        if let Some(e) = examples.iter().find(|&&e| e >= self.len) {
            return Err(fail(format!("no example {e} of {}", self.len)));
        }
        let mut bytes = vec![0; examples.len() * f.bytes];
        let mut at = 0;
        for run in examples.chunk_by(|&a, &b| b == a + 1) {
            let len = run.len() * f.bytes;
            let offset = f.start + (run[0] * f.bytes) as u64;
            read_bytes(&self.file, &self.name, &mut bytes[at..at + len], offset)?;
            at += len;
        }
        let mut shape = vec![examples.len()];
        shape.extend(&f.ty.shape);
        Literal::from_le_bytes(f.ty.dtype, &shape, &bytes)
            .map_err(|message| fail(format!("tensor `{}`: {message}", f.tensor)))
    }
}

/// Fills `buf` from the bytes of `file` (called `name`) at `offset`; a short file is an
/// error saying it is truncated.
fn read_bytes(file: &impl FileExt, name: &str, buf: &mut [u8], offset: u64) -> Result<()> {
    file.read_exact_at(buf, offset).map_err(|e| {
        let end = offset + buf.len() as u64;
        let message = match e.kind() {
            ErrorKind::UnexpectedEof => format!("truncated: it ends before byte {end}"),
            _ => format!("reading bytes {offset}..{end}: {e}"),
        };
        file_error(name, message)
    })
}

/// The element type of safetensors dtype `stored`, if the IR has it.
fn dtype(stored: Dtype) -> Option<DType> {
    match stored {
        Dtype::F32 => Some(DType::F32),
        Dtype::BF16 => Some(DType::BF16),
        Dtype::F16 => Some(DType::F16),
        Dtype::I32 => Some(DType::I32),
        Dtype::BOOL => Some(DType::Bool),
        _ => None,
    }
}

/// An [`Error::TrainerInput`] about the data file `name`.
fn file_error(name: &str, message: String) -> Error {
    Error::TrainerInput {
        name: format!("data file {name}"),
        problem: InputProblem::Invalid { reason: message },
    }
}
