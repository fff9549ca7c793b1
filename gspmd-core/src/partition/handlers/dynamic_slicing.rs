//! `dynamic_slice` and `dynamic_update_slice` at run-time offsets, with the operand
//! split along the dims they slice.
//!
//! Dims the op keeps whole (slice size equal to the dim) pass through with the target's
//! axes. Along a sliced dim split over axes `A` in chunks of `c`, device `i` holds global
//! positions `i * c ..`; the window starts at the start index clamped to `0..=n - k`
//! (XLA's clamping, done once globally so that every device agrees), at local offset
//! `start - i * c`:
//! - `dynamic_slice`: each device cuts the window from its block padded with `k` zeros on
//!   both sides (at local offset `start - i * c + k`, which the local op's clamping turns
//!   into all zeros for a window outside the block), so it holds the part of the window
//!   inside its block and zeros elsewhere: a pending sum over `A`, which the driver
//!   reduces (one all-reduce of the window, or a reduce-scatter, or kept for a user that
//!   asks for it). No device gathers the dim.
//! - `dynamic_update_slice`: the update is made whole along the updated dims (it is
//!   the small operand), each device cuts the part overlapping its block from the update
//!   padded with `c` on both sides and selects it where its positions lie in the window.
//!   No communication beyond the update's reshard.

use super::super::emit::Emitter;
use super::super::mask::global_positions;
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::{reduced, with_dims};
use crate::error::Result;
use crate::ir::{BinaryOp, CompareOp, DType, Node, Op, ReduceKind, ValueId};
use crate::sharding::Sharding;

/// The start indices, replicated: one i32 scalar per dim.
fn replicated_starts(em: &mut Emitter, starts: &[PValue]) -> Result<Vec<ValueId>> {
    (starts.iter())
        .map(|s| Ok(reshard(em, s, &Sharding::replicated(0))?.id))
        .collect()
}

/// `start` clamped to `0..=n - k` (XLA's clamping of a dynamic start index).
fn clamped(em: &mut Emitter, start: ValueId, n: usize, k: usize) -> Result<ValueId> {
    let zero = em.scalar(DType::I32, 0.0)?;
    let last = em.scalar(DType::I32, (n - k) as f64)?;
    let low = em.emit(Op::Binary(BinaryOp::Max), &[start, zero])?;
    em.emit(Op::Binary(BinaryOp::Min), &[low, last])
}

/// `start - axis_index(axes) * chunk + shift`: where the window starts in this device's
/// block (padded by `shift` at its start).
fn local_start(
    em: &mut Emitter,
    start: ValueId,
    (axes, chunk): (&[String], usize),
    shift: usize,
) -> Result<ValueId> {
    let offset = em.block_offset(axes, chunk)?;
    let local = em.emit(Op::Binary(BinaryOp::Sub), &[start, offset])?;
    if shift == 0 {
        return Ok(local);
    }
    let shift = em.scalar(DType::I32, shift as f64)?;
    em.emit(Op::Binary(BinaryOp::Add), &[local, shift])
}

/// `x` padded with `pad[d]` zeros (false) on both sides of each dim.
fn pad_both(em: &mut Emitter, x: ValueId, pad: &[usize]) -> Result<ValueId> {
    if pad.iter().all(|&p| p == 0) {
        return Ok(x);
    }
    let ty = em.ty(x).clone();
    let zero = em.scalar(ty.dtype, 0.0)?;
    let edges: Vec<i64> = pad.iter().map(|&p| p as i64).collect();
    let op = Op::Pad {
        low: edges.clone(),
        high: edges,
        interior: vec![0; ty.rank()],
    };
    em.emit(op, &[x, zero])
}

/// `dynamic_slice(x, starts..)` to `sizes` (see the module doc).
pub(super) fn dynamic_slice(
    em: &mut Emitter,
    node: &Node,
    sizes: &[usize],
    operands: &[PValue],
    target: &Sharding,
) -> Result<PValue> {
    let x = &operands[0];
    let shape = x.global.shape.clone();
    let sliced = |d: usize| sizes[d] != shape[d];
    // Sliced dims keep the operand's axes (they become the pending sum); whole dims take
    // the longest prefix of the target's axes that the sliced dims do not use.
    let on_sliced: Vec<String> = (0..shape.len())
        .filter(|&d| sliced(d))
        .flat_map(|d| x.sharding.dims[d].axes.clone())
        .collect();
    let want: Vec<Vec<String>> = (0..shape.len())
        .map(|d| match sliced(d) {
            true => x.sharding.dims[d].axes.clone(),
            false => (target.dims[d].axes.iter())
                .take_while(|a| !on_sliced.contains(a))
                .cloned()
                .collect(),
        })
        .collect();
    let x = reshard(em, x, &with_dims(want.clone(), Vec::new()))?;
    let starts = replicated_starts(em, &operands[1..])?;
    let local = em.shape(x.id);
    let split = |d: usize| sliced(d) && em.mesh.axes_size(&want[d]) > 1;
    let pending: Vec<String> = (0..shape.len())
        .filter(|&d| split(d))
        .flat_map(|d| want[d].clone())
        .collect();
    // Bools are summed as 0/1.
    let dtype = x.global.dtype;
    let mut id = x.id;
    if dtype == DType::Bool && !pending.is_empty() {
        id = em.emit(Op::Convert(DType::I32), &[id])?;
    }
    let pad: Vec<usize> = (0..shape.len())
        .map(|d| if split(d) { sizes[d] } else { 0 })
        .collect();
    id = pad_both(em, id, &pad)?;
    let mut local_starts = Vec::with_capacity(shape.len());
    let mut local_sizes = Vec::with_capacity(shape.len());
    for d in 0..shape.len() {
        local_sizes.push(if sliced(d) { sizes[d] } else { local[d] });
        local_starts.push(if split(d) {
            let start = clamped(em, starts[d], shape[d], sizes[d])?;
            Some(local_start(em, start, (&want[d], local[d]), sizes[d])?)
        } else if sliced(d) {
            Some(starts[d])
        } else {
            None
        });
    }
    id = em.dynamic_slice(id, &local_starts, &local_sizes)?;
    let result_dims: Vec<Vec<String>> = (0..shape.len())
        .map(|d| {
            if sliced(d) {
                Vec::new()
            } else {
                want[d].clone()
            }
        })
        .collect();
    let mut sharding = with_dims(result_dims, pending.clone());
    if dtype == DType::Bool && !pending.is_empty() {
        // Pending sums of bools do not exist: add the 0/1 parts now.
        let group = em.group(&pending);
        let kind = ReduceKind::Sum;
        id = em.emit(Op::AllReduce { group, kind }, &[id])?;
        id = em.emit(Op::Convert(DType::Bool), &[id])?;
        sharding.unreduced.clear();
    }
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding,
    })
}

/// `dynamic_update_slice(x, update, starts..)` (see the module doc).
pub(super) fn dynamic_update_slice(
    em: &mut Emitter,
    node: &Node,
    operands: &[PValue],
    target: &Sharding,
) -> Result<PValue> {
    let want = reduced(target);
    let x = reshard(em, &operands[0], &want)?;
    let (shape, sizes) = (x.global.shape.clone(), operands[1].global.shape.clone());
    let updated = |d: usize| sizes[d] != shape[d];
    // The update is whole along the dims it updates, tiled like the operand elsewhere.
    let update_dims: Vec<Vec<String>> = (0..shape.len())
        .map(|d| match updated(d) {
            true => Vec::new(),
            false => want.dims[d].axes.clone(),
        })
        .collect();
    let update = reshard(em, &operands[1], &with_dims(update_dims, Vec::new()))?;
    let starts = replicated_starts(em, &operands[2..])?;
    let axes = |d: usize| want.dims[d].axes.clone();
    let result = |id| PValue {
        id,
        global: node.ty.clone(),
        sharding: want.clone(),
    };
    let split_updated = (0..shape.len()).any(|d| updated(d) && em.mesh.axes_size(&axes(d)) > 1);
    if !split_updated {
        // Every block holds the whole of each updated dim: the local op does it.
        let id = em.emit(
            Op::DynamicUpdateSlice,
            &[&[x.id, update.id], &starts[..]].concat(),
        )?;
        return Ok(result(id));
    }
    let local = em.shape(x.id);
    let pad: Vec<usize> = (0..shape.len())
        .map(|d| if updated(d) { local[d] } else { 0 })
        .collect();
    let padded = pad_both(em, update.id, &pad)?;
    let mut cut_starts = Vec::with_capacity(shape.len());
    let mut inside: Option<ValueId> = None;
    for d in 0..shape.len() {
        if !updated(d) {
            cut_starts.push(None);
            continue;
        }
        let start = clamped(em, starts[d], shape[d], sizes[d])?;
        // The padded update's element `c - (start - i * c) + j` lands on local element
        // `j`; where none does, the cut is clamped and the selection below drops it.
        let at = local_start(em, start, (&axes(d), local[d]), 0)?;
        let c = em.scalar(DType::I32, local[d] as f64)?;
        cut_starts.push(Some(em.emit(Op::Binary(BinaryOp::Sub), &[c, at])?));
        let window = in_window(em, &local, d, (&axes(d), local[d]), (start, sizes[d]))?;
        inside = Some(match inside {
            Some(m) => em.emit(Op::Binary(BinaryOp::And), &[m, window])?,
            None => window,
        });
    }
    let placed = em.dynamic_slice(padded, &cut_starts, &local)?;
    let inside = inside.ok_or_else(|| em.error("internal: no updated dim"))?;
    let id = em.emit(Op::Select, &[inside, placed, x.id])?;
    Ok(result(id))
}

/// A bool array of `shape`: whether local element `j` along `dim` lies at a global
/// position `axis_index(axes) * chunk + j` in `start .. start + len`.
fn in_window(
    em: &mut Emitter,
    shape: &[usize],
    dim: usize,
    (axes, chunk): (&[String], usize),
    (start, len): (ValueId, usize),
) -> Result<ValueId> {
    let position = global_positions(em, shape, dim, (axes, chunk, 0))?;
    let len = em.scalar(DType::I32, len as f64)?;
    let end = em.emit(Op::Binary(BinaryOp::Add), &[start, len])?;
    let (start, end) = (em.splat(start, shape)?, em.splat(end, shape)?);
    let after_start = em.emit(Op::Compare(CompareOp::Ge), &[position, start])?;
    let before_end = em.emit(Op::Compare(CompareOp::Lt), &[position, end])?;
    em.emit(Op::Binary(BinaryOp::And), &[after_start, before_end])
}
