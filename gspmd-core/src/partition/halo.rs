//! Halo exchange (GSPMD section 4.3; XLA's `ExchangeHalo` / `ReshardAsWindowedInput`):
//! a value split along a dim gives each device a *window* of the global array that
//! reaches a little past its own block, by exchanging only the boundary elements with
//! its neighbours along the mesh axes of that dim.
//!
//! A [`Window`] says, for the device at shard index `i` along the dim, which global
//! positions it needs: `i * step + offset ..` for `len` elements. Ops whose output
//! blocks read a fixed-size neighbourhood of their input blocks (slice, pad,
//! convolution, reduce_window) are windows: `step` is the output chunk times the
//! stride, `offset` the start (or minus the low padding), `len` what one output block
//! reads.
//!
//! The plan ([`plan`]) computes, over all devices, the largest reach left and right of
//! a device's block: the *data* halos (positions inside the array, received from the
//! neighbours with one [`Op::CollectiveShift`] each way) and the *geometric* ones
//! (also positions outside the array, padded locally). When windows move by a different
//! amount than the blocks do (`step != chunk`: a slice or pad that changes the dim's
//! chunk), the halos are the largest over the devices and each device cuts its window
//! with a `dynamic_slice` at an offset computed from `axis_index` (the paper's
//! non-constant halo). A window that needs more than one neighbour's block on either
//! side has no plan (the caller gathers the dim instead).
//!
//! [`rotate`] is the cyclic case: a rotation of an evenly split dim moves at most two
//! pieces of each block, each with one wrapping shift. [`mirror`] is the reversal: each
//! block reversed locally, then moved to the mirrored device with at most two mirrored
//! shifts (one when the split is even).

use super::emit::Emitter;
use super::mask::positions_inside;
use super::value::PValue;
use crate::error::Result;
use crate::ir::{BinaryOp, DType, Op, ValueId, WindowDim};

/// Which global positions along `dim` each device needs: the device at shard index `i`
/// needs `i * step + offset .. i * step + offset + len` (positions outside the array
/// allowed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// The dim the window moves along.
    pub dim: usize,
    /// How far the window moves from one shard to the next.
    pub step: usize,
    /// Where shard 0's window starts (negative: before the array).
    pub offset: i64,
    /// The window's length.
    pub len: usize,
}

impl Window {
    /// One past the last position the window of the last of `shards` shards reads.
    fn last_end(&self, shards: usize) -> i64 {
        (shards as i64 - 1) * self.step as i64 + self.offset + self.len as i64
    }
}

/// The window of operand positions that output blocks of `chunk` elements of a
/// windowed op (reduce_window, convolution) read along `dim` through `w`: output `j`
/// reads `j * stride - padding_low + k * window_dilation` for `k < size`, so block `i`
/// reads `len = (chunk - 1) * stride + (size - 1) * window_dilation + 1` positions from
/// `i * chunk * stride - padding_low`. `Err` says why there is none (base dilation, an
/// empty output).
pub(crate) fn sliding(w: &WindowDim, dim: usize, chunk: usize) -> Result<Window, &'static str> {
    if w.base_dilation != 1 {
        return Err("base dilation has no halo plan");
    }
    if chunk == 0 {
        return Err("an empty output has no halo plan");
    }
    Ok(Window {
        dim,
        step: chunk * w.stride,
        offset: -w.padding_low,
        len: (chunk - 1) * w.stride + (w.size - 1) * w.window_dilation + 1,
    })
}

/// A halo exchange for a window of a value split in `shards` chunks of `chunk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HaloPlan {
    window: Window,
    /// The dim's global size.
    size: usize,
    shards: usize,
    chunk: usize,
    /// Elements received from the left / right neighbour (at most `chunk`).
    data_left: usize,
    data_right: usize,
    /// How far any window reaches left / right of its device's block.
    reach_left: usize,
    reach_right: usize,
}

impl HaloPlan {
    /// The dim the window moves along.
    pub fn dim(&self) -> usize {
        self.window.dim
    }

    /// The number of shards the dim is split in.
    pub fn shards(&self) -> usize {
        self.shards
    }
}

/// The halo exchange giving every device `window` of a dim of `size` elements split in
/// `shards` shards; `None` when some window needs more than one neighbour's block.
pub(crate) fn plan(size: usize, shards: usize, window: Window) -> Option<HaloPlan> {
    let chunk = size.div_ceil(shards);
    let (c, n, size_i) = (chunk as i64, shards as i64, size as i64);
    let (mut reach_left, mut reach_right, mut data_left, mut data_right) = (0, 0, 0, 0);
    if window.len > 0 {
        for i in 0..n {
            let start = i * window.step as i64 + window.offset;
            let end = start + window.len as i64;
            let (block_start, block_end) = (i * c, (i + 1) * c);
            reach_left = reach_left.max(block_start - start);
            reach_right = reach_right.max(end - block_end);
            let (data_start, data_end) = (start.max(0), end.min(size_i));
            if data_start < data_end {
                data_left = data_left.max(block_start - data_start);
                data_right = data_right.max(data_end - block_end);
            }
        }
    }
    if data_left > c || data_right > c {
        return None;
    }
    Some(HaloPlan {
        window,
        size,
        shards,
        chunk,
        data_left: data_left as usize,
        data_right: data_right as usize,
        reach_left: reach_left as usize,
        reach_right: reach_right as usize,
    })
}

/// `v`'s window along `plan`'s dim, which `v` is split along: the local block with
/// that dim replaced by the window's `len` elements. Positions outside the global array
/// hold `fill` (a scalar) when given; without it they hold arbitrary values (the
/// caller's result padding or a select by position must be all that reads them).
pub(crate) fn exchange(
    em: &mut Emitter,
    v: &PValue,
    plan: &HaloPlan,
    fill: Option<ValueId>,
) -> Result<ValueId> {
    let Window {
        dim,
        step,
        offset,
        len,
    } = plan.window;
    let axes = v.sharding.dims[dim].axes.clone();
    let c = plan.chunk;
    if len == 0 {
        return em.slice_dim(v.id, dim, 0, 0);
    }
    // [left halo | own block | right halo], each halo from one neighbour.
    let mut parts = Vec::with_capacity(3);
    if plan.data_left > 0 {
        let tail = em.slice_dim(v.id, dim, c - plan.data_left, c)?;
        parts.push(em.shift(tail, &axes, 1, false)?);
    }
    parts.push(v.id);
    if plan.data_right > 0 {
        let head = em.slice_dim(v.id, dim, 0, plan.data_right)?;
        parts.push(em.shift(head, &axes, -1, false)?);
    }
    let buffer = match parts.as_slice() {
        [only] => *only,
        _ => em.emit(Op::Concatenate(dim), &parts)?,
    };
    // Reach past the data halos covers only positions outside the array or read by no
    // window on this device: any value.
    let buffer = widen(
        em,
        buffer,
        dim,
        plan.reach_left - plan.data_left,
        plan.reach_right - plan.data_right,
    )?;
    // The window of device i starts at buffer index reach_left + offset + i*(step - c).
    let drift = step as i64 - c as i64;
    let first = plan.reach_left as i64 + offset;
    let window = cut(em, buffer, &axes, dim, (drift, first), len)?;
    let Some(fill) = fill else { return Ok(window) };
    if offset >= 0 && plan.window.last_end(plan.shards) <= plan.size as i64 {
        return Ok(window);
    }
    let shape = em.shape(window);
    let inside = positions_inside(em, &shape, dim, (&axes, step, offset), plan.size)?;
    let fill = em.splat(fill, &shape)?;
    em.emit(Op::Select, &[inside, window, fill])
}

/// The window of `x`, which every device holds whole along `window.dim` (`size`
/// elements), over the group of `axes`: a local `dynamic_slice`, no communication.
/// Positions outside the array hold arbitrary values.
pub(crate) fn window_of_whole(
    em: &mut Emitter,
    x: ValueId,
    axes: &[String],
    window: Window,
    size: usize,
) -> Result<ValueId> {
    let Window {
        dim,
        step,
        offset,
        len,
    } = window;
    let last_end = window.last_end(em.mesh.axes_size(axes));
    let (left, right) = ((-offset).max(0), (last_end - size as i64).max(0));
    let x = widen(em, x, dim, left as usize, right as usize)?;
    cut(em, x, axes, dim, (step as i64, left + offset), len)
}

/// `x` with `low` and `high` elements of any value added along `dim`.
fn widen(em: &mut Emitter, x: ValueId, dim: usize, low: usize, high: usize) -> Result<ValueId> {
    if low + high == 0 {
        return Ok(x);
    }
    let ty = em.ty(x).clone();
    let zero = em.scalar(ty.dtype, 0.0)?;
    let (mut lows, mut highs) = (vec![0; ty.rank()], vec![0; ty.rank()]);
    lows[dim] = low as i64;
    highs[dim] = high as i64;
    let interior = vec![0; ty.rank()];
    em.emit(
        Op::Pad {
            low: lows,
            high: highs,
            interior,
        },
        &[x, zero],
    )
}

/// `len` elements of `x` along `dim` from index `axis_index(axes) * drift + first`: a
/// static slice when `drift` is 0, else a `dynamic_slice`. The caller keeps every
/// shard's cut inside `x`.
pub(crate) fn cut(
    em: &mut Emitter,
    x: ValueId,
    axes: &[String],
    dim: usize,
    (drift, first): (i64, i64),
    len: usize,
) -> Result<ValueId> {
    if drift == 0 {
        return em.slice_dim(x, dim, first as usize, first as usize + len);
    }
    let index = em.emit(Op::AxisIndex(em.group(axes)), &[])?;
    let drift = em.scalar(DType::I32, drift as f64)?;
    let drift = em.emit(Op::Binary(BinaryOp::Mul), &[index, drift])?;
    let first = em.scalar(DType::I32, first as f64)?;
    let start = em.emit(Op::Binary(BinaryOp::Add), &[drift, first])?;
    let mut starts = vec![None; em.ty(x).rank()];
    starts[dim] = Some(start);
    let mut sizes = em.shape(x);
    sizes[dim] = len;
    em.dynamic_slice(x, &starts, &sizes)
}

/// `v` rotated along `dim`, which `v` splits evenly: element `p` of the result is
/// element `(p + k) mod size` of `v` (`concatenate(v[k:], v[:k])`, jnp.roll by `-k`).
/// Block `i` of the result is `block(i + q)[m:]` followed by `block(i + q + 1)[:m]`
/// (`k = q * chunk + m`): at most two pieces move, each with one wrapping shift, and a
/// piece from the device's own block none.
pub(crate) fn rotate(em: &mut Emitter, v: &PValue, dim: usize, k: usize) -> Result<ValueId> {
    let axes = v.sharding.dims[dim].axes.clone();
    let n = em.mesh.axes_size(&axes);
    let size = v.global.shape[dim];
    let c = size / n;
    let k = k % size.max(1);
    let (q, m) = (k / c.max(1), k % c.max(1));
    let piece = |em: &mut Emitter, start: usize, end: usize, from: usize| {
        let x = em.slice_dim(v.id, dim, start, end)?;
        if from.is_multiple_of(n) {
            return Ok(x);
        }
        em.shift(x, &axes, -(from as i64), true)
    };
    let first = piece(em, m, c, q)?;
    if m == 0 {
        return Ok(first);
    }
    let second = piece(em, 0, m, q + 1)?;
    em.emit(Op::Concatenate(dim), &[first, second])
}

/// `v` reversed along `dim`, which `v` is split along (evenly or not): element `p` of the
/// result is element `size - 1 - p` of `v`. With `k` shards of `c` and `pad = k*c - size
/// = q*c + m`, output block `i` reverses input positions `(k-1-i-q)*c - m ..` (`c` of
/// them): the reversal of `block(k-1-i-q)[..c-m]` followed by that of
/// `block(k-2-i-q)[c-m..]`. Each device reverses its block locally; the two pieces move
/// with one mirrored shift each (offsets `-q` and `-q-1`, no wrap), the second only when
/// `m > 0`. A piece a device receives from outside the group lands on the result's
/// padding (arbitrary values).
pub(crate) fn mirror(em: &mut Emitter, v: &PValue, dim: usize) -> Result<ValueId> {
    let axes = v.sharding.dims[dim].axes.clone();
    let k = em.mesh.axes_size(&axes);
    let size = v.global.shape[dim];
    let c = size.div_ceil(k);
    let pad = k * c - size;
    let (q, m) = (pad / c.max(1), pad % c.max(1));
    let reversed = em.emit(Op::Reverse(vec![dim]), &[v.id])?;
    let head = if m == 0 {
        reversed
    } else {
        em.slice_dim(reversed, dim, m, c)?
    };
    let head = em.mirror(head, &axes, -(q as i64))?;
    if m == 0 {
        return Ok(head);
    }
    let tail = em.slice_dim(reversed, dim, 0, m)?;
    let tail = em.mirror(tail, &axes, -(q as i64) - 1)?;
    em.emit(Op::Concatenate(dim), &[head, tail])
}
