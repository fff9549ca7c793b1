//! Gather and scatter (XLA's `gather_scatter_handler` strategies, chosen by cost).
//!
//! Every dim of the three tensors (operand, indices, data: a gather's result, a
//! scatter's updates) is one of: a *batch* dim (indices and data, and the operand's
//! batching dim paired with it), a *pass-through* window dim (operand and data, the
//! window covering the dim whole), an *indexed* dim (an operand dim of the index map
//! with a one-element window), or a dim that must be whole (the index vector dim,
//! partial windows, dropped dims the indices do not start).
//!
//! - Index-parallel: batch dims split alike on indices and data (and operand batching
//!   dims) need no communication; a scatter-add whose updates are split there (and not
//!   its result) adds them into a pending sum over those axes.
//! - Operand pass-through: window dims split alike on operand and data: none either.
//! - Vocabulary-parallel (Megatron's embedding): an indexed dim split over axes `A` in
//!   blocks of `c` rows. Each device offsets the starts by `-axis_index(A) * c`. A
//!   gather first clamps the global start as the op would (into `[0, n - 1]`), tests
//!   the local one against `[0, c)`, zeroes the rows it does not hold and leaves a
//!   pending sum over `A` (one all-reduce, or a reduce-scatter; for bools the
//!   collectives' sum is an `or`, so it holds for them too); uneven blocks are
//!   exact, a clamped start lies below `n`. A scatter writes only the updates that
//!   land in its block (its local bounds skip the others), and its result stays split
//!   over `A`; a start out of range lands outside every block or in the padding past
//!   the end of the last one.
//!
//! Strategies differ in which of the target's axes and the operands' current axes they
//! keep; the cheapest by bytes received (operand and result reshards) is emitted.

use super::super::emit::Emitter;
use super::super::mask::mask_padding;
use super::super::reshard::{plan_reshard, reshard};
use super::super::value::PValue;
use super::with_dims;
use crate::error::Result;
use crate::ir::index_arithmetic::{
    all_within, clamp_starts, i32_scalar, per_component, start_range, zero_where_not,
};
use crate::ir::{
    BinaryOp, GatherDims, Indexing, Op, ScatterDims, ScatterKind, TensorType, ValueId,
};
use crate::sharding::Sharding;

/// Axes per dim of the operand, the indices and the data, and the axes over which
/// the local result is a pending sum.
#[derive(Debug, Clone, PartialEq)]
struct Strategy {
    operand: Vec<Vec<String>>,
    indices: Vec<Vec<String>>,
    data: Vec<Vec<String>>,
    partial: Vec<String>,
}

/// How each dim of the three tensors takes part (see the module docs).
struct Layout {
    /// Per data batch dim: (indices dim, data dim, operand batching dim if paired).
    batch: Vec<(usize, usize, Option<usize>)>,
    /// Pass-through window dims: (operand dim, data dim).
    pass: Vec<(usize, usize)>,
    /// Indexed operand dims with a one-element window.
    indexed: Vec<usize>,
    ranks: [usize; 3],
}

impl Layout {
    fn new(ix: Indexing<'_>, operand: &[usize], indices_rank: usize, data: &[usize]) -> Self {
        let window = ix.window_sizes(operand.len(), data);
        let data_batch = ix.data_batch(data.len());
        let batch = (ix.indices_batch(indices_rank).into_iter().zip(data_batch))
            .map(|(i, d)| {
                let paired = (ix.indices_batching.iter().position(|&b| b == i))
                    .map(|j| ix.operand_batching[j]);
                (i, d, paired)
            })
            .collect();
        let pass = (ix.operand_window(operand.len()).into_iter().zip(ix.window))
            .filter(|&(o, _)| window[o] == operand[o])
            .map(|(o, &d)| (o, d))
            .collect();
        let indexed = (ix.index_map.iter().copied())
            .filter(|&d| window[d] == 1 && operand[d] > 1)
            .collect();
        Layout {
            batch,
            pass,
            indexed,
            ranks: [operand.len(), indices_rank, data.len()],
        }
    }

    /// The strategy that gives the data's dims the axes `data_axes(dim)` (in order,
    /// skipping used ones), batch dims before window dims, and the indexed dims
    /// `indexed_axes(dim)` — before the data's dims when `indexed_first` — with the
    /// pending sum over `partial(indexed axes, batch axes)` (the batch axes of dims not
    /// paired with an operand batching dim).
    fn strategy(
        &self,
        data_axes: impl Fn(usize) -> Vec<String>,
        indexed_axes: impl Fn(usize) -> Vec<String>,
        indexed_first: bool,
        partial: impl Fn(&[String], &[String]) -> Vec<String>,
    ) -> Strategy {
        let [r, q, n] = self.ranks;
        let mut s = Strategy {
            operand: vec![Vec::new(); r],
            indices: vec![Vec::new(); q],
            data: vec![Vec::new(); n],
            partial: Vec::new(),
        };
        let mut used: Vec<String> = Vec::new();
        let take = |axes: Vec<String>, used: &mut Vec<String>| -> Vec<String> {
            let kept: Vec<String> = axes.into_iter().take_while(|a| !used.contains(a)).collect();
            used.extend(kept.iter().cloned());
            kept
        };
        let mut on_indexed = Vec::new();
        let mut indexed = |s: &mut Strategy, used: &mut Vec<String>| {
            for &d in &self.indexed {
                s.operand[d] = take(indexed_axes(d), used);
                on_indexed.extend(s.operand[d].iter().cloned());
            }
        };
        if indexed_first {
            indexed(&mut s, &mut used);
        }
        let mut on_batch = Vec::new();
        for &(i, d, o) in &self.batch {
            let axes = take(data_axes(d), &mut used);
            if o.is_none() {
                on_batch.extend(axes.iter().cloned());
            }
            s.indices[i] = axes.clone();
            if let Some(o) = o {
                s.operand[o] = axes.clone();
            }
            s.data[d] = axes;
        }
        for &(o, d) in &self.pass {
            let axes = take(data_axes(d), &mut used);
            s.operand[o] = axes.clone();
            s.data[d] = axes;
        }
        if !indexed_first {
            indexed(&mut s, &mut used);
        }
        s.partial = partial(&on_indexed, &on_batch);
        s
    }
}

/// The cheapest of `strategies` by elements received, times their size, to reshard
/// `inputs` (operand, indices, data) to the strategy's and the result (of type `global`,
/// tiled as `result(strategy)`) to `target`.
fn cheapest(
    em: &Emitter,
    strategies: Vec<Strategy>,
    inputs: &[&PValue],
    global: &TensorType,
    result: impl Fn(&Strategy) -> Sharding,
    target: &Sharding,
) -> Result<Strategy> {
    let cost = |s: &Strategy| -> f64 {
        let wanted = [&s.operand, &s.indices, &s.data];
        let moved: f64 = (inputs.iter().zip(wanted))
            .map(|(v, axes)| {
                let to = with_dims(axes.clone(), Vec::new());
                plan_reshard(em.mesh, &v.global.shape, &v.sharding, &to).cost
                    * v.global.dtype.size_in_bytes() as f64
            })
            .sum();
        let back = plan_reshard(em.mesh, &global.shape, &result(s), target).cost;
        moved + back * global.dtype.size_in_bytes() as f64
    };
    strategies
        .into_iter()
        .map(|s| (cost(&s), s))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, s)| s)
        .ok_or_else(|| em.error("no gather/scatter strategy"))
}

/// The axes of dim `d` of `sharding`.
fn axes_of(sharding: &Sharding, d: usize) -> Vec<String> {
    sharding
        .dims
        .get(d)
        .map_or_else(Vec::new, |s| s.axes.clone())
}

/// The local starts for an operand split along its indexed dims: `starts` minus the
/// first row of this device's block along each split indexed dim of `operand` (the
/// resharded operand). `None` when no indexed dim is split: the local op's own
/// clamping and bounds are then the global ones.
fn local_starts(
    em: &mut Emitter,
    ix: Indexing<'_>,
    layout: &Layout,
    operand: &PValue,
    starts: ValueId,
) -> Result<Option<ValueId>> {
    let axes = |d: usize| &operand.sharding.dims[d].axes;
    let split = |d: usize| layout.indexed.contains(&d) && !axes(d).is_empty();
    if !ix.index_map.iter().any(|&d| split(d)) {
        return Ok(None);
    }
    let local_operand = em.shape(operand.id);
    let firsts = (ix.index_map.iter())
        .map(|&d| match split(d) {
            true => em.block_offset(&axes(d).clone(), local_operand[d]),
            false => i32_scalar(em, 0),
        })
        .collect::<Result<Vec<_>>>()?;
    let first = per_component(em, starts, ix.index_vector_dim, &firsts)?;
    em.emit(Op::Binary(BinaryOp::Sub), &[starts, first])
        .map(Some)
}

/// Per batch position, whether every component of the local `starts` lies in this
/// device's block: `0 ..= local operand size - local window` along its operand dim.
fn in_block(
    em: &mut Emitter,
    ix: Indexing<'_>,
    starts: ValueId,
    local_operand: &[usize],
    local_window: &[usize],
) -> Result<ValueId> {
    let (lo, hi) = start_range(em, starts, ix, local_operand, local_window)?;
    all_within(em, starts, ix.index_vector_dim, lo, hi)
}

pub(super) fn gather(
    em: &mut Emitter,
    dims: &GatherDims,
    global: &TensorType,
    operand: &PValue,
    indices: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let ix = dims.indexing();
    let layout = Layout::new(
        ix,
        &operand.global.shape,
        indices.global.rank(),
        &global.shape,
    );
    let from_target = |d: usize| axes_of(target, d);
    let kept = |d: usize| axes_of(&operand.sharding, d);
    let pending = |on_indexed: &[String], _: &[String]| on_indexed.to_vec();
    let strategies = vec![
        layout.strategy(from_target, kept, true, pending),
        layout.strategy(from_target, kept, false, pending),
        layout.strategy(from_target, |_| Vec::new(), false, pending),
    ];
    let result = |s: &Strategy| with_dims(s.data.clone(), s.partial.clone());
    let best = cheapest(em, strategies, &[operand, indices], global, result, target)?;
    let x = reshard(em, operand, &with_dims(best.operand.clone(), Vec::new()))?;
    let i = reshard(em, indices, &with_dims(best.indices.clone(), Vec::new()))?;
    let local_operand = em.shape(x.id);
    let mut local_dims = dims.clone();
    for &(o, _) in &layout.pass {
        local_dims.slice_sizes[o] = local_operand[o];
    }
    let starts = clamp_starts(em, i.id, dims, &operand.global.shape)?;
    let local = local_starts(em, ix, &layout, &x, starts)?;
    let at = local.unwrap_or(i.id);
    let mut id = em.emit(Op::Gather(local_dims.clone()), &[x.id, at])?;
    if let Some(local) = local {
        let mine = in_block(em, ix, local, &local_operand, &local_dims.slice_sizes)?;
        let batch = ix.data_batch(global.rank());
        id = zero_where_not(em, id, mine, &batch, global.dtype)?;
    }
    Ok(PValue {
        id,
        global: global.clone(),
        sharding: result(&best),
    })
}

pub(super) fn scatter(
    em: &mut Emitter,
    dims: &ScatterDims,
    kind: ScatterKind,
    [operand, indices, updates]: [&PValue; 3],
    target: &Sharding,
) -> Result<PValue> {
    let ix = dims.indexing();
    let shape = &operand.global.shape;
    let layout = Layout::new(ix, shape, indices.global.rank(), &updates.global.shape);
    // The data's window dims take the target's axes of their operand dim; its batch
    // dims keep the updates' axes (adding into a pending sum) or are made whole.
    let data_batch = ix.data_batch(updates.global.rank());
    let (layout_ref, data_batch_ref) = (&layout, &data_batch);
    let data_axes = |keep_batch: bool| {
        move |d: usize| {
            let (layout, data_batch) = (layout_ref, data_batch_ref);
            let pass = layout.pass.iter().find(|&&(_, w)| w == d).map(|p| p.0);
            let paired = layout.batch.iter().find(|b| b.1 == d).and_then(|b| b.2);
            match pass.or(paired) {
                Some(o) => axes_of(target, o),
                None if keep_batch && data_batch.contains(&d) => axes_of(&updates.sharding, d),
                None => Vec::new(),
            }
        }
    };
    let from_target = |d: usize| axes_of(target, d);
    let pending = |_: &[String], on_batch: &[String]| on_batch.to_vec();
    let mut strategies = vec![layout.strategy(data_axes(false), from_target, true, pending)];
    if kind == ScatterKind::Add {
        strategies.push(layout.strategy(data_axes(true), from_target, true, pending));
        strategies.push(layout.strategy(data_axes(true), from_target, false, pending));
    }
    let result = |s: &Strategy| with_dims(s.operand.clone(), s.partial.clone());
    let inputs = [operand, indices, updates];
    let best = cheapest(em, strategies, &inputs, &operand.global, result, target)?;
    // Every device but one adds into zeros: the partial results sum to the scatter.
    let x = reshard(em, operand, &result(&best))?;
    let i = reshard(em, indices, &with_dims(best.indices.clone(), Vec::new()))?;
    let mut u = reshard(em, updates, &with_dims(best.data.clone(), Vec::new()))?;
    if !best.partial.is_empty() {
        // Padding rows of unevenly split batch dims must add nothing.
        u.id = mask_padding(em, &u, &data_batch, 0.0)?;
    }
    // A start out of range lands outside every block or in the padding of the last
    // one (positions past the end), which holds arbitrary values: no global test.
    let at = local_starts(em, ix, &layout, &x, i.id)?.unwrap_or(i.id);
    let id = em.emit(
        Op::Scatter {
            dims: dims.clone(),
            kind,
        },
        &[x.id, at, u.id],
    )?;
    Ok(PValue {
        id,
        global: operand.global.clone(),
        sharding: result(&best),
    })
}
