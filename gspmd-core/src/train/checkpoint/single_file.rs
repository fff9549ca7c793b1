//! One safetensors file of named global tensors ([`save_checkpoint`],
//! [`load_checkpoint`]): the format of small models and of other frameworks' loaders,
//! and the element types safetensors files store ([`stored_dtype`], [`element_type`]),
//! which the sharded format's files share.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{CheckpointProblem, Error, Result};
use crate::ir::{DType, Literal};

/// Header metadata key prefix recording the order tensors were given in: key
/// `gspmd.order.<i>` holds the name of tensor `i`.
const ORDER: &str = "gspmd.order.";

/// Writes `tensors` (f32, bf16, f16, i32 or bool; names distinct, none `__metadata__`,
/// which the format reserves: an [`Error::Checkpoint`] before anything is written) to
/// `path` as a safetensors file, replacing it if it exists. Their order is kept in the header's metadata so that
/// [`load_checkpoint`] returns them in the same order.
pub fn save_checkpoint(path: impl AsRef<Path>, tensors: &[(String, Literal)]) -> Result<()> {
    let path = path.as_ref();
    let fail = |tensor: Option<&str>, problem: CheckpointProblem| Error::Checkpoint {
        path: path.display().to_string(),
        tensor: tensor.map(str::to_string),
        problem,
    };
    let format =
        |tensor: Option<&str>, reason: String| fail(tensor, CheckpointProblem::Format { reason });
    let mut order = HashMap::with_capacity(tensors.len());
    let mut bytes = Vec::with_capacity(tensors.len());
    for (i, (name, lit)) in tensors.iter().enumerate() {
        if tensors[..i].iter().any(|(n, _)| n == name) {
            return Err(fail(Some(name), CheckpointProblem::RepeatedName));
        }
        if name == "__metadata__" {
            return Err(fail(Some(name), CheckpointProblem::ReservedName));
        }
        order.insert(format!("{ORDER}{i}"), name.clone());
        bytes.push((
            name,
            stored_dtype(lit.dtype()),
            lit.shape(),
            lit.to_le_bytes(),
        ));
    }
    let views = bytes
        .iter()
        .map(|(name, dtype, shape, data)| {
            TensorView::new(*dtype, shape.clone(), data)
                .map(|view| (name.as_str(), view))
                .map_err(|e| format(Some(name), e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, Some(order), path).map_err(|e| {
        let reason = e.to_string();
        fail(None, CheckpointProblem::Io { reason })
    })
}

/// Reads the tensors of the safetensors file at `path`: in the order they were saved
/// by [`save_checkpoint`], or in file order for a file written by another tool.
/// F32, BF16, F16, I32 and BOOL tensors are supported; any other dtype is an
/// [`Error::Checkpoint`].
pub fn load_checkpoint(path: impl AsRef<Path>) -> Result<Vec<(String, Literal)>> {
    let path = path.as_ref();
    let fail = |tensor: Option<&str>, problem: CheckpointProblem| Error::Checkpoint {
        path: path.display().to_string(),
        tensor: tensor.map(str::to_string),
        problem,
    };
    let format =
        |tensor: Option<&str>, reason: String| fail(tensor, CheckpointProblem::Format { reason });
    let buffer = std::fs::read(path).map_err(|e| {
        let reason = e.to_string();
        fail(None, CheckpointProblem::Io { reason })
    })?;
    let (_, metadata) =
        SafeTensors::read_metadata(&buffer).map_err(|e| format(None, e.to_string()))?;
    let file = SafeTensors::deserialize(&buffer).map_err(|e| format(None, e.to_string()))?;
    let names = match metadata.metadata() {
        Some(m) if m.keys().any(|k| k.starts_with(ORDER)) => {
            saved_order(m, &metadata.offset_keys()).map_err(|reason| format(None, reason))?
        }
        _ => metadata.offset_keys(),
    };
    names
        .into_iter()
        .map(|name| {
            let view = file
                .tensor(&name)
                .map_err(|e| format(Some(&name), e.to_string()))?;
            let lit = element_type(view.dtype())
                .and_then(|dtype| Literal::from_le_bytes(dtype, view.shape(), view.data()))
                .map_err(|reason| format(Some(&name), reason))?;
            Ok((name, lit))
        })
        .collect()
}

/// The safetensors dtype that stores elements of `dtype`.
pub(super) fn stored_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::I32 => Dtype::I32,
        DType::Bool => Dtype::BOOL,
    }
}

/// The element type a safetensors dtype stores, if it is one of ours.
pub(super) fn element_type(dtype: Dtype) -> Result<DType, String> {
    DType::ALL
        .into_iter()
        .find(|&d| stored_dtype(d) == dtype)
        .ok_or_else(|| format!("dtype {dtype:?} is not supported (f32, bf16, f16, i32, bool are)"))
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
