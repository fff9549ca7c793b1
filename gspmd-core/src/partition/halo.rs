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
//! non-constant halo), or, when that receives less, the exchange goes piece by piece
//! (see `exchange_pieces`). A halo wider than a block comes from as many neighbours as it
//! reaches, one shift per hop (XLA's multi-hop `ExchangeHalo`); a plan that would
//! receive more than gathering the dim does is refused (the caller gathers instead).
//!
//! [`rotate`] is the cyclic case: a rotation of an evenly split dim moves at most two
//! pieces of each block, each with one wrapping shift; of an unevenly split one, two
//! such rotations of the padded dim and a select by position
//! ([`rotate_uneven`]). [`mirror`] is the reversal: each
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
/// windowed op read along `dim` through `w`, which must not be base-dilated (the caller
/// slides the window unpadded over it: a convolution's spatial contraction):
/// [`sliding_window`]'s window. `Err` says why there is none.
pub(crate) fn sliding(w: &WindowDim, dim: usize, chunk: usize) -> Result<Window, &'static str> {
    if w.base_dilation != 1 {
        return Err("base dilation has no halo plan");
    }
    sliding_window(w, dim, chunk).map(|(window, _)| window)
}

/// The window of (undilated) operand positions that output blocks of `chunk` elements
/// of a windowed op read along `dim` through `w`, and the window the op then slides
/// over that block of positions to compute exactly its `chunk` outputs.
///
/// Output `j` reads the base-dilated position `j * stride - padding_low + k *
/// window_dilation` (`k < size`), which is operand position `q` when it equals
/// `q * base_dilation`. With `s = base_dilation` dividing `chunk * stride`, block `i`
/// reads the dilated span from `i * chunk * stride - padding_low`, `span = (chunk - 1) *
/// stride + (size - 1) * window_dilation + 1` positions long, i.e. the operand positions
/// from `i * chunk * stride / s + ceil(-padding_low / s)` through
/// `floor((span - 1 - padding_low) / s)` more (XLA's undilated halo of `lhs_dilate`:
/// only the source rows cross devices, the dilation is local). The local window keeps
/// the stride and both dilations, with low padding `padding_low mod s` and high padding
/// whatever makes `chunk` outputs (negative: a crop). Without base dilation that is
/// padding 0 on both sides. `Err` says why there is no window (`s` not dividing
/// `chunk * stride`, an empty output, a block reading only padding).
pub(crate) fn sliding_window(
    w: &WindowDim,
    dim: usize,
    chunk: usize,
) -> Result<(Window, WindowDim), &'static str> {
    if chunk == 0 {
        return Err("an empty output has no halo plan");
    }
    let s = w.base_dilation as i64;
    if (chunk * w.stride) as i64 % s != 0 {
        return Err("base dilation does not divide the output block's stride");
    }
    let span = ((chunk - 1) * w.stride + (w.size - 1) * w.window_dilation + 1) as i64;
    let offset = -w.padding_low.div_euclid(s);
    let last = (span - 1 - w.padding_low).div_euclid(s);
    if last < offset {
        return Err("an output block reads only padding");
    }
    let len = (last - offset + 1) as usize;
    let padding_low = w.padding_low.rem_euclid(s);
    let dilated_len = (len as i64 - 1) * s + 1;
    let local = WindowDim {
        padding_low,
        padding_high: span - dilated_len - padding_low,
        ..*w
    };
    let window = Window {
        dim,
        step: chunk * w.stride / w.base_dilation,
        offset,
        len,
    };
    Ok((window, local))
}

/// A halo exchange for a window of a value split in `shards` chunks of `chunk`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HaloPlan {
    window: Window,
    /// The dim's global size.
    size: usize,
    shards: usize,
    chunk: usize,
    /// Elements received from the left / right neighbours (more than `chunk`: from
    /// several of them).
    data_left: usize,
    data_right: usize,
    /// How far any window reaches left / right of its device's block.
    reach_left: usize,
    reach_right: usize,
    /// Per hop `h` (the block `h` devices to the right; 0: the device's own), the most
    /// elements of that block any window needs: the pieces of an `exchange_pieces`
    /// exchange. Empty when the contiguous exchange receives as little.
    pieces: Vec<(i64, usize)>,
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

    /// Elements along the dim each device receives.
    pub fn received(&self) -> usize {
        if self.pieces.is_empty() {
            self.data_left + self.data_right
        } else {
            pieces_received(&self.pieces)
        }
    }
}

/// Elements received in an exchange of `pieces` (all but the device's own).
fn pieces_received(pieces: &[(i64, usize)]) -> usize {
    pieces.iter().filter(|p| p.0 != 0).map(|p| p.1).sum()
}

/// The halo exchange giving every device `window` of a dim of `size` elements split in
/// `shards` shards; `None` when it would receive more elements than gathering the dim
/// (`(shards - 1) * chunk`): windows longer than a good part of the array.
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
    // Windows moving unlike the blocks: per hop, the largest part of a block a window
    // needs may be much less than the contiguous halo.
    let mut pieces = Vec::new();
    if window.step as i64 != c && window.len > 0 {
        for h in 1 - n..n {
            let need = (0..n)
                .filter(|i| (0..n).contains(&(i + h)))
                .map(|i| {
                    let start = i * window.step as i64 + window.offset;
                    let end = start + window.len as i64;
                    let block_end = ((i + h + 1) * c).min(size_i);
                    (end.min(block_end) - start.max((i + h) * c)).max(0) as usize
                })
                .max()
                .unwrap_or(0);
            if need > 0 {
                pieces.push((h, need));
            }
        }
        if pieces_received(&pieces) as i64 >= data_left + data_right {
            pieces.clear();
        }
    }
    let received = match pieces.is_empty() {
        true => data_left + data_right,
        false => pieces_received(&pieces) as i64,
    };
    if received > (n - 1) * c {
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
        pieces,
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
    if len == 0 {
        return em.slice_dim(v.id, dim, 0, 0);
    }
    let window = if plan.pieces.is_empty() {
        contiguous(em, v, plan)?
    } else {
        exchange_pieces(em, v, plan)?
    };
    let Some(fill) = fill else { return Ok(window) };
    if offset >= 0 && plan.window.last_end(plan.shards) <= plan.size as i64 {
        return Ok(window);
    }
    let shape = em.shape(window);
    let inside = positions_inside(em, &shape, dim, (&axes, step, offset), plan.size)?;
    let fill = em.splat(fill, &shape)?;
    em.emit(Op::Select, &[inside, window, fill])
}

/// The windows of [`exchange`] from one buffer `[left halo | own block | right halo]`,
/// the halos as wide as any window needs; positions outside the array arbitrary.
fn contiguous(em: &mut Emitter, v: &PValue, plan: &HaloPlan) -> Result<ValueId> {
    let (dim, c) = (plan.window.dim, plan.chunk);
    let axes = v.sharding.dims[dim].axes.clone();
    // [left halo | own block | right halo]; hop `h` brings the block of the neighbour
    // `h` away whole, the farthest hop only the part next to the nearer ones.
    let hops = |data: usize| data.div_ceil(c.max(1));
    let part = |data: usize, h: usize| (data - (h - 1) * c).min(c);
    let mut parts = Vec::with_capacity(3);
    for h in (1..=hops(plan.data_left)).rev() {
        let tail = em.slice_dim(v.id, dim, c - part(plan.data_left, h), c)?;
        parts.push(em.shift(tail, &axes, h as i64, false)?);
    }
    parts.push(v.id);
    for h in 1..=hops(plan.data_right) {
        let head = em.slice_dim(v.id, dim, 0, part(plan.data_right, h))?;
        parts.push(em.shift(head, &axes, -(h as i64), false)?);
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
    let drift = plan.window.step as i64 - c as i64;
    let first = plan.reach_left as i64 + plan.window.offset;
    cut(em, buffer, &axes, dim, (drift, first), plan.window.len)
}

/// The windows of [`exchange`] piece by piece, for windows moving unlike the blocks
/// (`step != chunk`), where each device's window needs less of a block than the widest
/// halo: per hop `h` of the plan's pieces (`size` elements), every device `j` sends
/// the `size` elements of its block from `clamp(w(j - h) - j * c, 0, c - size)` (`w(i)
/// = i * step + offset`, where device `i`'s window starts) with one shift — the part
/// of its block the window `h` devices to its left needs, widened to `size` inside the
/// block — and the receiver writes it at its global position, relative to its window,
/// into a buffer with `margin` (the largest piece) of spare room each side. Every
/// element written is the array's element at that position, so overlaps agree; a
/// piece not meeting the window has its position clamped into a margin. Positions
/// outside the array (and pieces from beyond the group, zeros) are arbitrary.
fn exchange_pieces(em: &mut Emitter, v: &PValue, plan: &HaloPlan) -> Result<ValueId> {
    let (dim, len, offset) = (plan.window.dim, plan.window.len, plan.window.offset);
    let axes = v.sharding.dims[dim].axes.clone();
    let (c, step) = (plan.chunk as i64, plan.window.step as i64);
    let margin = plan.pieces.iter().map(|p| p.1).max().unwrap_or(0);
    let mut shape = em.shape(v.id);
    shape[dim] = len + 2 * margin;
    let zero = em.scalar(v.global.dtype, 0.0)?;
    let mut buffer = em.splat(zero, &shape)?;
    let index = em.emit(Op::AxisIndex(em.group(&axes)), &[])?;
    let zero_start = em.scalar(DType::I32, 0.0)?;
    for &(h, size) in &plan.pieces {
        // Sender j cuts at clamp(j * (step - c) + offset - h * step, 0, c - size).
        let limit = c - size as i64;
        let start = affine(em, index, step - c, offset - h * step)?;
        let start = clamp(em, start, 0, limit)?;
        let mut starts = vec![None; shape.len()];
        starts[dim] = Some(start);
        let mut sizes = em.shape(v.id);
        sizes[dim] = size;
        let mut piece = em.dynamic_slice(v.id, &starts, &sizes)?;
        if h != 0 {
            piece = em.shift(piece, &axes, -h, false)?;
        }
        // Receiver i's piece starts at (i + h) * c + its sender's cut, i.e. at
        // buffer index that minus w(i), plus the margin.
        let sender_cut = affine(em, index, step - c, offset - h * c)?;
        let sender_cut = clamp(em, sender_cut, 0, limit)?;
        let at = affine(em, index, c - step, h * c - offset + margin as i64)?;
        let at = em.emit(Op::Binary(BinaryOp::Add), &[at, sender_cut])?;
        let at = clamp(em, at, (margin - size) as i64, (margin + len) as i64)?;
        let mut places = vec![zero_start; shape.len()];
        places[dim] = at;
        buffer = em.emit(
            Op::DynamicUpdateSlice,
            &[&[buffer, piece], &places[..]].concat(),
        )?;
    }
    em.slice_dim(buffer, dim, margin, margin + len)
}

/// The i32 scalar `index * a + b`.
fn affine(em: &mut Emitter, index: ValueId, a: i64, b: i64) -> Result<ValueId> {
    let a = em.scalar(DType::I32, a as f64)?;
    let scaled = em.emit(Op::Binary(BinaryOp::Mul), &[index, a])?;
    let b = em.scalar(DType::I32, b as f64)?;
    em.emit(Op::Binary(BinaryOp::Add), &[scaled, b])
}

/// The i32 scalar `x` clamped to `lo ..= hi`.
fn clamp(em: &mut Emitter, x: ValueId, lo: i64, hi: i64) -> Result<ValueId> {
    let lo = em.scalar(DType::I32, lo as f64)?;
    let hi = em.scalar(DType::I32, hi as f64)?;
    let x = em.emit(Op::Binary(BinaryOp::Max), &[x, lo])?;
    em.emit(Op::Binary(BinaryOp::Min), &[x, hi])
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
    let start = affine(em, index, drift, first)?;
    let mut starts = vec![None; em.ty(x).rank()];
    starts[dim] = Some(start);
    let mut sizes = em.shape(x);
    sizes[dim] = len;
    em.dynamic_slice(x, &starts, &sizes)
}

/// The elements one device receives rotating a dim split in `n` blocks of `c` by `k`
/// with [`rotate`] (`k < n * c`).
pub(crate) fn rotation_received(n: usize, c: usize, k: usize) -> usize {
    let (q, m) = (k / c.max(1), k % c.max(1));
    let moved = |from: usize, len: usize| if from.is_multiple_of(n) { 0 } else { len };
    moved(q, c - m) + moved(q + 1, m)
}

/// `v` rotated along `dim`, which `v` splits in `n` blocks of `chunk`: element `p` of
/// the result is element `(p + k) mod (n * chunk)` of `v`'s blocks laid end to end
/// (`concatenate(v[k:], v[:k])`, jnp.roll by `-k`, when the split is even). Block `i`
/// of the result is `block(i + q)[m:]` followed by `block(i + q + 1)[:m]` (`k = q *
/// chunk + m`): at most two pieces move, each with one wrapping shift, and a piece
/// from the device's own block none.
pub(crate) fn rotate(em: &mut Emitter, v: &PValue, dim: usize, k: usize) -> Result<ValueId> {
    let axes = v.sharding.dims[dim].axes.clone();
    let n = em.mesh.axes_size(&axes);
    let c = v.global.shape[dim].div_ceil(n);
    let k = k % (n * c).max(1);
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

/// `v` rotated by `k` along `dim` of `size`, which `v` splits unevenly in `n` blocks of
/// `c` (`pad = n * c - size` positions of padding at the end): element `p < size` of
/// the result is element `p + k` of the padded blocks when `p + k < size`, else element
/// `p + k - size = (p + k + pad) mod (n * c)`. So the result is the [`rotate`] of the
/// blocks by `k` where `p + k` is inside the array and their rotate by `k + pad`
/// elsewhere (a select by position); receives [`rotation_received`] of both.
pub(crate) fn rotate_uneven(em: &mut Emitter, v: &PValue, dim: usize, k: usize) -> Result<ValueId> {
    let axes = v.sharding.dims[dim].axes.clone();
    let n = em.mesh.axes_size(&axes);
    let size = v.global.shape[dim];
    let c = size.div_ceil(n);
    let inner = rotate(em, v, dim, k)?;
    let wrapped = rotate(em, v, dim, k + n * c - size)?;
    let shape = em.shape(inner);
    let inside = positions_inside(em, &shape, dim, (&axes, c, k as i64), size)?;
    em.emit(Op::Select, &[inside, inner, wrapped])
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
