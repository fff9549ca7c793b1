//! Values with no operands (parameter, constant, iota) and the ops that move data along
//! a dim (slice, pad, concatenate, reverse, reduce_window's windowed dims, and
//! rotations: `concatenate(a[k:], a[:k])`).
//!
//! A dim such an op changes keeps the target's axes when the operand is split along it
//! too and a halo exchange gives each device its window (slice, pad — with interior
//! padding the window is then spread locally and cut at a per-device offset —
//! reduce_window, each operand of a concatenate; see `partition::halo`), or, for a
//! reverse, each block is reversed and moved to the mirrored device (`halo::mirror`),
//! or, for a slice inside one shard of the operand's split, the owners' cut becomes a
//! pending sum ([`Owned`]); otherwise it is made whole and the op runs on it locally,
//! with a warning when that gathers a split dim. Dims the op leaves alone keep the
//! target's axes.
//!
//! A reduce_window's base dilation stays local: only undilated rows cross devices
//! (`halo::sliding_window`). Where that window has no plan (the dilation not dividing
//! the output block's stride), the operand is first spread with the reduction's
//! identity by a partitioned interior pad ([`dilate`]) and the window undilated.
//!
//! A reverse whose every reversed dim the target splits evenly (or not at all) moves
//! no data beyond resharding the operand to the target's tiling: each block is
//! reversed where it is, and the split dims' device order flips
//! ([`DimSharding::reversed`](crate::sharding::DimSharding::reversed), `partition::order`).

use std::ops::Range;

use super::super::emit::Emitter;
use super::super::fusion::Rotation;
use super::super::halo::{self, HaloPlan, Window};
use super::super::mask::positions_inside;
use super::super::order::in_order_of;
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::reduce::identity;
use super::{reduced, with_dims};
use crate::error::Result;
use crate::ir::{BinaryOp, CompareOp, DType, Node, Op, TensorType, ValueId, WindowDim};
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

/// The op with its attributes restricted to local blocks: the dims in `changed` (made
/// whole) keep the op's attributes; the others are taken whole, except that a slice
/// strides from 0 over a dim holding its halo window (a dim the op leaves alone has
/// stride 1) and a reduce_window slides the window `slides` gives for a dim holding its
/// halo window (see [`halo_window`]).
fn local_op(op: &Op, local: &[usize], changed: &[usize], slides: &[(usize, WindowDim)]) -> Op {
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
            stride: stride.clone(),
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
        // The other reversed dims are mirrored across devices (`halo::mirror`).
        Op::Reverse(dims) => Op::Reverse(dims.iter().copied().filter(|&d| keep(d)).collect()),
        // Every other dim is whole or left alone (a trivial window fits any block).
        Op::ReduceWindow { kind, window } => Op::ReduceWindow {
            kind: *kind,
            window: (window.iter().enumerate())
                .map(|(d, w)| match slides.iter().find(|s| s.0 == d) {
                    Some(&(_, slide)) => slide,
                    None => *w,
                })
                .collect(),
        },
        other => other.clone(),
    }
}

/// The window of input positions output block `i` of `op` reads along `dim`, when
/// output blocks are `chunk` long on each of `shards` shards, and for a reduce_window
/// the window it then slides over those positions ([`halo::sliding_window`]: with base
/// dilation only the undilated positions cross devices, the dilation stays local);
/// `Err` says why there is none.
fn halo_window(
    op: &Op,
    dim: usize,
    chunk: usize,
    shards: usize,
) -> Result<(Window, Option<WindowDim>), &'static str> {
    if let Op::ReduceWindow { window, .. } = op {
        let (halo, slide) = halo::sliding_window(&window[dim], dim, chunk)?;
        return Ok((halo, Some(slide)));
    }
    let window = |offset: i64| Window {
        dim,
        step: chunk,
        offset,
        len: chunk,
    };
    let halo = match op {
        Op::Slice { start, stride, .. } if stride[dim] == 1 => Ok(window(start[dim] as i64)),
        // Output `j` of block `i` reads `start + (i * chunk + j) * stride`, `j < chunk`;
        // `local_op` strides over the window from 0.
        Op::Slice { .. } if chunk == 0 => Err("an empty output has no halo plan"),
        Op::Slice { start, stride, .. } => Ok(Window {
            dim,
            step: chunk * stride[dim],
            offset: start[dim] as i64,
            len: (chunk - 1) * stride[dim] + 1,
        }),
        Op::Pad { low, interior, .. } if interior[dim] == 0 => Ok(window(-low[dim])),
        // Interior padding: see `spread`.
        Op::Pad { .. } if chunk == 0 => Err("an empty output has no halo plan"),
        Op::Pad { low, interior, .. } => {
            let s = interior[dim] as i64 + 1;
            let (c, k) = (chunk as i64, shards as i64);
            let phase = (-low[dim]).rem_euclid(s);
            Ok(Window {
                dim,
                step: chunk / s as usize,
                offset: (-low[dim]).div_euclid(s),
                len: (((k - 1) * (c % s) + phase + c) as usize).div_ceil(s as usize),
            })
        }
        _ => Err("not a windowed op"),
    };
    halo.map(|w| (w, None))
}

/// Output block `i` (of `chunk` elements along `dim`, which `axes` split) of a pad with
/// `low` and `interior` padding, from `window`: the input positions
/// `i * b + e .. i * b + e + len` with stride `s = interior + 1`, `chunk = b * s + r`
/// (`r < s`), `e = floor(-low / s)`, `phase = (-low) mod s` and
/// `len = ceil(((shards - 1) * r + phase + chunk) / s)` (`halo_window`), those
/// outside the array already holding the pad value `value`.
///
/// Output position `p` holds input `q` when `p = low + q * s`, else `value`. The window
/// padded locally with `interior` between and after its elements (`len * s` long) holds
/// at index `j * s` input `i * b + e + j`, i.e. output position
/// `low + (i * b + e + j) * s = i * b * s - phase + j * s`, and `value` elsewhere: it
/// starts at output position `i * chunk - (i * r + phase)`. So the block is its `chunk`
/// elements from `i * r + phase` (linear in `i`: one `dynamic_slice`, a static slice
/// when `s` divides `chunk`), which fit since `(shards - 1) * r + phase + chunk <=
/// len * s`. An out-of-array input lands only on the low or high padding, which holds
/// `value` anyway.
fn spread(
    em: &mut Emitter,
    window: ValueId,
    (axes, dim): (&[String], usize),
    (low, interior): (i64, usize),
    value: ValueId,
    chunk: usize,
) -> Result<ValueId> {
    let rank = em.ty(window).rank();
    let (lows, mut highs, mut interiors) = (vec![0; rank], vec![0; rank], vec![0; rank]);
    highs[dim] = interior as i64;
    interiors[dim] = interior;
    let padded = em.emit(
        Op::Pad {
            low: lows,
            high: highs,
            interior: interiors,
        },
        &[window, value],
    )?;
    let s = interior as i64 + 1;
    let (r, phase) = (chunk as i64 % s, (-low).rem_euclid(s));
    halo::cut(em, padded, axes, dim, (r, phase), chunk)
}

/// Reverse of `dims` of `a`: `a` resharded to the target's tiling (keeping its order
/// where it is split alike), then each block reversed in place and the split dims'
/// device order flipped, when the target splits each of `dims` evenly (or not at all;
/// see the module doc); otherwise as [`windowed`] does it.
pub(super) fn reverse(
    em: &mut Emitter,
    node: &Node,
    dims: &[usize],
    a: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let mesh = em.mesh;
    let even = |d: usize| a.global.shape[d].is_multiple_of(mesh.axes_size(&target.dims[d].axes));
    if !dims.iter().all(|&d| even(d)) {
        return windowed(em, node, std::slice::from_ref(a), target);
    }
    let want = in_order_of(mesh, target.clone(), &a.sharding);
    let x = reshard(em, a, &want)?;
    let id = em.emit(node.op.clone(), &[x.id])?;
    let mut sharding = x.sharding;
    for &d in dims {
        let dim = &mut sharding.dims[d];
        dim.reversed = !dim.reversed && mesh.axes_size(&dim.axes) > 1;
    }
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding,
    })
}

/// Slice, pad, concatenate, reverse and reduce_window (see the module doc).
pub(super) fn windowed(
    em: &mut Emitter,
    node: &Node,
    operands: &[PValue],
    target: &Sharding,
) -> Result<PValue> {
    if let Op::Concatenate(dim) = node.op {
        let split = |o: &PValue| em.mesh.axes_size(&o.sharding.dims[dim].axes) > 1;
        if em.mesh.axes_size(&target.dims[dim].axes) > 1 && operands.iter().any(split) {
            return concatenate(em, node, dim, operands, target);
        }
    }
    if let Some((node, spread)) = undilated_reduce_window(em, node, &operands[0], target)? {
        return windowed(em, &node, &[spread], target);
    }
    let shape = &operands[0].global.shape;
    let changed = changed_dims(&node.op, shape);
    let mut halos: Vec<HaloPlan> = Vec::new();
    let mut slides: Vec<(usize, WindowDim)> = Vec::new();
    let mut mirrored: Vec<usize> = Vec::new();
    let mut whole: Vec<usize> = Vec::new();
    let mut gathered: Vec<String> = Vec::new();
    let mut owned: Vec<Owned> = Vec::new();
    for &d in &changed {
        let shards = em.mesh.axes_size(&target.dims[d].axes);
        let split =
            |o: &PValue| o.global.rank() > d && em.mesh.axes_size(&o.sharding.dims[d].axes) > 1;
        if shards == 1 || !operands.iter().any(split) {
            match owned_slice(em, &node.op, &operands[0], d, target) {
                Some(o) => owned.push(o),
                None => whole.push(d),
            }
            continue;
        }
        if let Op::Reverse(_) = node.op {
            mirrored.push(d);
            continue;
        }
        let window = halo_window(&node.op, d, node.ty.shape[d].div_ceil(shards), shards);
        let plan = window.and_then(|(w, slide)| {
            let plan = halo::plan(shape[d], shards, w)
                .ok_or("a halo exchange would receive more than gathering")?;
            Ok((plan, slide))
        });
        match (plan, owned_slice(em, &node.op, &operands[0], d, target)) {
            (Ok((plan, slide)), _) => {
                halos.push(plan);
                slides.extend(slide.map(|s| (d, s)));
            }
            // Summed over the dim's axes, then scattered to the target's split.
            (Err(_), Some(o)) => owned.push(o),
            (Err(reason), None) => {
                whole.push(d);
                gathered.push(format!("dim {d}: {reason}"));
            }
        }
    }
    if !gathered.is_empty() {
        em.warn(format!(
            "{} gathers split dims whole ({})",
            node.op.name(),
            gathered.join("; ")
        ));
    }
    let mut dims: Vec<Vec<String>> = (target.dims.iter().enumerate())
        .map(|(d, s)| {
            if whole.contains(&d) {
                Vec::new()
            } else {
                s.axes.clone()
            }
        })
        .collect();
    for o in &owned {
        dims[o.dim].clone_from(&o.axes);
    }
    let want = with_dims(dims, Vec::new());
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
    // Positions outside the array read as the padding value (pad) or the reduction's
    // identity (reduce_window).
    let fill = match &node.op {
        Op::Pad { .. } => Some(ids[1]),
        Op::ReduceWindow { kind, .. } => Some(em.scalar(node.ty.dtype, identity(*kind))?),
        _ => None,
    };
    let mut x = PValue {
        id: ids[0],
        global: operands[0].global.clone(),
        sharding: want.clone(),
    };
    for o in &owned {
        x.id = em.slice_dim(x.id, o.dim, o.local.start, o.local.end)?;
    }
    for plan in &halos {
        let d = plan.dim();
        x.id = halo::exchange(em, &x, plan, fill)?;
        if let (Op::Pad { low, interior, .. }, Some(fill)) = (&node.op, fill)
            && interior[d] != 0
        {
            let chunk = node.ty.shape[d].div_ceil(plan.shards());
            let axes = &x.sharding.dims[d].axes;
            x.id = spread(em, x.id, (axes, d), (low[d], interior[d]), fill, chunk)?;
        }
        x.global.shape[d] = node.ty.shape[d];
    }
    for &d in &mirrored {
        x.id = halo::mirror(em, &x, d)?;
    }
    ids[0] = x.id;
    // Stride-1 slices and pads are done once every windowed dim has its window; a
    // strided slice still strides over its windows, a reduction reduces them.
    let done = match &node.op {
        Op::Slice { stride, .. } => stride.iter().all(|&s| s == 1),
        Op::ReduceWindow { .. } => false,
        _ => true,
    };
    let id = if whole.is_empty() && done {
        x.id
    } else {
        let local = em.shape(x.id);
        em.emit(local_op(&node.op, &local, &whole, &slides), &ids)?
    };
    if owned.is_empty() {
        return Ok(PValue {
            id,
            global: node.ty.clone(),
            sharding: want,
        });
    }
    owners_only(em, node, id, &owned, want)
}

/// `x` spread along each dim `d` with `interior[d]` copies of `value` between its
/// elements — base dilation made explicit for `node`, a windowed op whose undilated
/// halo has no plan — as an interior `pad` traced at `node`'s line and partitioned by
/// [`windowed`] (halo exchanges along split dims), keeping `x`'s tiling.
pub(super) fn dilate(
    em: &mut Emitter,
    node: &Node,
    x: &PValue,
    interior: Vec<usize>,
    value: f64,
) -> Result<PValue> {
    let rank = x.global.rank();
    let mut dilated = x.global.clone();
    for (d, n) in dilated.shape.iter_mut().enumerate() {
        *n = (*n).saturating_sub(1) * (interior[d] + 1) + usize::from(*n > 0);
    }
    let pad = Op::Pad {
        low: vec![0; rank],
        high: vec![0; rank],
        interior,
    };
    let value = PValue {
        id: em.scalar(dilated.dtype, value)?,
        global: TensorType::new(vec![], dilated.dtype),
        sharding: Sharding::replicated(0),
    };
    let pad_node = Node {
        op: pad,
        operands: Vec::new(),
        ty: dilated,
        annotation: None,
        sharding: None,
        origin: None,
        name: None,
        location: node.location,
        why: Vec::new(),
    };
    let mut want = x.sharding.clone();
    want.unreduced.clear();
    windowed(em, &pad_node, &[x.clone(), value], &want)
}

/// A reduce_window whose base dilation along a dim that `target` and the operand `x`
/// split has no undilated halo plan (`halo::sliding_window`: the dilation does not
/// divide the output block's stride), made explicit there: `x` [`dilate`]d with the
/// reduction's identity and the node with its window undilated there (XLA's definition
/// of base dilation). `None` when no dim needs it.
fn undilated_reduce_window(
    em: &mut Emitter,
    node: &Node,
    x: &PValue,
    target: &Sharding,
) -> Result<Option<(Node, PValue)>> {
    let Op::ReduceWindow { kind, window } = &node.op else {
        return Ok(None);
    };
    let mut interior = vec![0; window.len()];
    let mut local = window.clone();
    for (d, w) in window.iter().enumerate() {
        let shards = em.mesh.axes_size(&target.dims[d].axes);
        let chunk = node.ty.shape[d].div_ceil(shards);
        if w.base_dilation > 1
            && shards > 1
            && em.mesh.axes_size(&x.sharding.dims[d].axes) > 1
            && halo::sliding_window(w, d, chunk).is_err()
        {
            interior[d] = w.base_dilation - 1;
            local[d].base_dilation = 1;
        }
    }
    if interior.iter().all(|&n| n == 0) {
        return Ok(None);
    }
    let spread = dilate(em, node, x, interior, identity(*kind))?;
    let node = Node {
        op: Op::ReduceWindow {
            kind: *kind,
            window: local,
        },
        ..node.clone()
    };
    Ok(Some((node, spread)))
}

/// A dim a slice cuts from one device's block (XLA slices a pipeline's last stage out
/// of a stage-split buffer this way): the operand stays split along `dim` over `axes`,
/// and the devices at shard index `owner` hold the whole slice at `local` positions
/// of their block (before any stride).
struct Owned {
    dim: usize,
    axes: Vec<String>,
    owner: usize,
    local: Range<usize>,
}

/// The [`Owned`] dim `dim` of a slice whose operand `x` is split along it while the
/// target leaves it whole (or splits it where no halo plan reaches), when the slice
/// lies inside one shard, its elements can be summed (not bool) and no other dim of the
/// target uses the axes. Moving the slice (`w` elements of the dim) as a masked sum is
/// never dearer than gathering the dim: an all-reduce receives
/// `2 (n - 1) / n * w <= 2 (n - 1) / n * size / n` elements per lane, a reduce-scatter
/// half that, a gather `(n - 1) / n * size`.
fn owned_slice(em: &Emitter, op: &Op, x: &PValue, dim: usize, target: &Sharding) -> Option<Owned> {
    let Op::Slice { start, limit, .. } = op else {
        return None;
    };
    let axes = &x.sharding.dims[dim].axes;
    let n = em.mesh.axes_size(axes);
    let others = (target.dims.iter().enumerate())
        .filter(|&(d, _)| d != dim)
        .flat_map(|(_, s)| &s.axes)
        .chain(&target.unreduced);
    let overlapping = others.into_iter().any(|a| axes.contains(a));
    if n == 1 || overlapping || x.global.dtype == DType::Bool || limit[dim] <= start[dim] {
        return None;
    }
    let chunk = x.global.shape[dim].div_ceil(n);
    let owner = start[dim] / chunk;
    (owner == (limit[dim] - 1) / chunk).then(|| Owned {
        dim,
        axes: axes.clone(),
        owner,
        local: start[dim] - owner * chunk..limit[dim] - owner * chunk,
    })
}

/// The slice `id` (of `want`'s tiling) kept where this device owns every [`Owned`]
/// dim and zeros elsewhere: a pending sum over the owned dims' axes, which the driver
/// reduces (one all-reduce of the slice, a reduce-scatter, or kept for a user asking
/// for it).
fn owners_only(
    em: &mut Emitter,
    node: &Node,
    id: ValueId,
    owned: &[Owned],
    want: Sharding,
) -> Result<PValue> {
    let mut mine: Option<ValueId> = None;
    let mut dims: Vec<Vec<String>> = want.dims.iter().map(|d| d.axes.clone()).collect();
    let mut pending = Vec::new();
    for o in owned {
        let index = em.emit(Op::AxisIndex(em.group(&o.axes)), &[])?;
        let owner = em.scalar(DType::I32, o.owner as f64)?;
        let here = em.emit(Op::Compare(CompareOp::Eq), &[index, owner])?;
        mine = Some(match mine {
            Some(m) => em.emit(Op::Binary(BinaryOp::And), &[m, here])?,
            None => here,
        });
        dims[o.dim].clear();
        pending.extend(o.axes.iter().cloned());
    }
    let mine = mine.ok_or_else(|| em.error("internal: no owned dim"))?;
    let shape = em.shape(id);
    let mine = em.splat(mine, &shape)?;
    let zero = em.scalar(node.ty.dtype, 0.0)?;
    let zeros = em.splat(zero, &shape)?;
    let id = em.emit(Op::Select, &[mine, id, zeros])?;
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding: with_dims(dims, pending),
    })
}

/// Concatenate along `dim`, which the target splits and some operand does: output
/// block `i` takes from operand `j` (starting at `o_j` in the result) the window of its
/// positions `i * chunk - o_j ..`, by halo exchange when the operand is split along
/// `dim` and that receives less than gathering it, else from the operand made whole
/// along `dim` (a gather of that operand alone, warned when it was split); a select by
/// position picks each element's operand.
fn concatenate(
    em: &mut Emitter,
    node: &Node,
    dim: usize,
    operands: &[PValue],
    target: &Sharding,
) -> Result<PValue> {
    let want = reduced(target);
    let axes = target.dims[dim].axes.clone();
    let shards = em.mesh.axes_size(&axes);
    let chunk = node.ty.shape[dim].div_ceil(shards);
    let mut whole_dims: Vec<Vec<String>> = want.dims.iter().map(|d| d.axes.clone()).collect();
    whole_dims[dim].clear();
    let whole = with_dims(whole_dims, Vec::new());
    let (mut result, mut start, mut gathered) = (None, 0, Vec::new());
    for (j, o) in operands.iter().enumerate() {
        let size = o.global.shape[dim];
        let window = Window {
            dim,
            step: chunk,
            offset: -(start as i64),
            len: chunk,
        };
        let split = em.mesh.axes_size(&o.sharding.dims[dim].axes) > 1;
        let part = match halo::plan(size, shards, window).filter(|_| split) {
            Some(plan) => {
                let x = reshard(em, o, &want)?;
                halo::exchange(em, &x, &plan, None)?
            }
            None => {
                if split {
                    gathered.push(j);
                }
                let x = reshard(em, o, &whole)?;
                halo::window_of_whole(em, x.id, &axes, window, size)?
            }
        };
        result = Some(match result {
            None => part,
            Some(acc) => {
                let shape = em.shape(part);
                let first = -(start as i64);
                let inside = positions_inside(em, &shape, dim, (&axes, chunk, first), size)?;
                em.emit(Op::Select, &[inside, part, acc])?
            }
        });
        start += size;
    }
    if !gathered.is_empty() {
        em.warn(format!(
            "concatenate gathers dim {dim} of operands {gathered:?} whole (a halo exchange would receive more)"
        ));
    }
    let id = result.ok_or_else(|| em.error("concatenate of no operands"))?;
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding: want,
    })
}

/// A [`Rotation`] of `a`: on a dim the target splits evenly, the pieces
/// of each block move with at most two wrapping collective shifts
/// ([`halo::rotate`]); unevenly, with at most four ([`halo::rotate_uneven`]) when that
/// receives less than gathering the dim; otherwise the dim is made whole and rotated
/// locally.
pub(crate) fn rotate(
    em: &mut Emitter,
    node: &Node,
    a: &PValue,
    rotation: Rotation,
    target: &Sharding,
) -> Result<PValue> {
    let Rotation { dim, k, .. } = rotation;
    let size = a.global.shape[dim];
    let shards = em.mesh.axes_size(&target.dims[dim].axes);
    let pv = |id, sharding| PValue {
        id,
        global: node.ty.clone(),
        sharding,
    };
    let c = size.div_ceil(shards.max(1));
    let uneven_received = || {
        let pad = shards * c - size;
        halo::rotation_received(shards, c, k) + halo::rotation_received(shards, c, k + pad)
    };
    if shards > 1 && (size.is_multiple_of(shards) || uneven_received() < (shards - 1) * c) {
        let want = reduced(target);
        let a = reshard(em, a, &want)?;
        let id = if size.is_multiple_of(shards) {
            halo::rotate(em, &a, dim, k)?
        } else {
            halo::rotate_uneven(em, &a, dim, k)?
        };
        return Ok(pv(id, want));
    }
    if shards > 1 {
        em.warn(format!(
            "rotation along dim {dim} of {size} over {shards} shards (uneven) gathers it whole (cheaper than rotating the blocks)"
        ));
    }
    let mut dims: Vec<Vec<String>> = target.dims.iter().map(|s| s.axes.clone()).collect();
    dims[dim].clear();
    let want = with_dims(dims, Vec::new());
    let a = reshard(em, a, &want)?;
    let high = em.slice_dim(a.id, dim, k, size)?;
    let low = em.slice_dim(a.id, dim, 0, k)?;
    let id = em.emit(Op::Concatenate(dim), &[high, low])?;
    Ok(pv(id, want))
}
