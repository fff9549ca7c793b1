//! Values with no operands (parameter, constant, iota) and the ops that move data along
//! a dim (slice, pad, concatenate, reverse, and reduce_window's windowed dims). A dim
//! such an op changes is made whole first and the op runs on it locally; dims it leaves alone keep the target's axes. (Halo
//! exchange for sharded windowed dims is a later refinement; results are exact now.)

use super::super::emit::Emitter;
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::with_dims;
use crate::error::Result;
use crate::ir::{BinaryOp, DType, Node, Op, TensorType};
use crate::sharding::Sharding;

/// Parameters arrive as local blocks; constants are built whole and sliced; iota counts
/// from each block's offset.
pub(super) fn source(em: &mut Emitter, node: &Node, target: &Sharding) -> Result<PValue> {
    let local = target.local_shape(em.mesh, &node.ty.shape);
    let pv = |id, sharding| PValue {
        id,
        global: node.ty.clone(),
        sharding,
    };
    match &node.op {
        Op::Parameter { index, .. } => {
            let ty = TensorType::new(local, node.ty.dtype);
            let id = em.emit(Op::Parameter { index: *index, ty }, &[])?;
            Ok(pv(id, target.clone()))
        }
        Op::Constant(_) => {
            let id = em.emit(node.op.clone(), &[])?;
            reshard(em, &pv(id, Sharding::replicated(node.ty.rank())), target)
        }
        Op::Iota { dim, dtype, .. } => {
            let mut id = em.emit(
                Op::Iota {
                    shape: local.clone(),
                    dim: *dim,
                    dtype: *dtype,
                },
                &[],
            )?;
            let axes = &target.dims[*dim].axes;
            if !axes.is_empty() {
                let offset = em.block_offset(axes, local[*dim])?;
                let offset = if *dtype == DType::I32 {
                    offset
                } else {
                    em.emit(Op::Convert(*dtype), &[offset])?
                };
                let offset = em.splat(offset, &local)?;
                id = em.emit(Op::Binary(BinaryOp::Add), &[id, offset])?;
            }
            Ok(pv(id, target.clone()))
        }
        _ => Err(em.error("not a source op")),
    }
}

/// The dims `op` changes (all others pass through unchanged).
fn changed_dims(op: &Op, shape: &[usize]) -> Vec<usize> {
    match op {
        Op::Slice {
            start,
            limit,
            stride,
        } => (0..shape.len())
            .filter(|&d| start[d] != 0 || limit[d] != shape[d] || stride[d] != 1)
            .collect(),
        Op::Pad {
            low,
            high,
            interior,
        } => (0..shape.len())
            .filter(|&d| low[d] != 0 || high[d] != 0 || interior[d] != 0)
            .collect(),
        Op::Concatenate(dim) => vec![*dim],
        Op::Reverse(dims) => dims.clone(),
        // A dim the window leaves alone (size 1, stride 1, no padding or dilation) is
        // elementwise; `local_op` keeps the global window, which fits any block there.
        Op::ReduceWindow { window, .. } => (0..window.len())
            .filter(|&d| !window[d].is_trivial())
            .collect(),
        _ => Vec::new(),
    }
}

/// The op with its attributes restricted to local blocks: unchanged dims are taken whole.
fn local_op(op: &Op, local: &[usize], changed: &[usize]) -> Op {
    let keep = |d: usize| changed.contains(&d);
    match op {
        Op::Slice {
            start,
            limit,
            stride,
        } => Op::Slice {
            start: (0..local.len())
                .map(|d| if keep(d) { start[d] } else { 0 })
                .collect(),
            limit: (0..local.len())
                .map(|d| if keep(d) { limit[d] } else { local[d] })
                .collect(),
            stride: (0..local.len())
                .map(|d| if keep(d) { stride[d] } else { 1 })
                .collect(),
        },
        Op::Pad {
            low,
            high,
            interior,
        } => Op::Pad {
            low: (0..local.len())
                .map(|d| if keep(d) { low[d] } else { 0 })
                .collect(),
            high: (0..local.len())
                .map(|d| if keep(d) { high[d] } else { 0 })
                .collect(),
            interior: (0..local.len())
                .map(|d| if keep(d) { interior[d] } else { 0 })
                .collect(),
        },
        other => other.clone(),
    }
}

/// Slice, pad, concatenate, reverse and reduce_window: the changed (windowed) dims
/// are made whole first, so no block padding ever falls under a window (max and min
/// never see it).
pub(super) fn windowed(
    em: &mut Emitter,
    node: &Node,
    operands: &[PValue],
    target: &Sharding,
) -> Result<PValue> {
    let shape = &operands[0].global.shape;
    let changed = changed_dims(&node.op, shape);
    let dims: Vec<Vec<String>> = target
        .dims
        .iter()
        .enumerate()
        .map(|(d, s)| {
            if changed.contains(&d) {
                Vec::new()
            } else {
                s.axes.clone()
            }
        })
        .collect();
    let want = with_dims(dims, Vec::new());
    let split: Vec<usize> = (changed.iter().copied())
        .filter(|&d| {
            !target.dims[d].axes.is_empty()
                || operands
                    .iter()
                    .any(|o| o.global.rank() > d && !o.sharding.dims[d].axes.is_empty())
        })
        .collect();
    if !split.is_empty() {
        em.warn(format!(
            "{} along split dims {split:?} gathers them whole (no halo exchange yet)",
            node.op.name()
        ));
    }
    let mut ids = Vec::with_capacity(operands.len());
    for o in operands {
        // Pad's padding value is a scalar: replicated.
        let w = if o.global.rank() == 0 {
            Sharding::replicated(0)
        } else {
            want.clone()
        };
        ids.push(reshard(em, o, &w)?.id);
    }
    let local = em.shape(ids[0]);
    let id = em.emit(local_op(&node.op, &local, &changed), &ids)?;
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding: want,
    })
}
