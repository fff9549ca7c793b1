//! The loop itself: a group run on its leaves' values, chunk by chunk (the ops into
//! registers or straight into the results' buffers, a trailing reduction folding each
//! row as `reduce` does, its epilogue applied to the reduced values), under `pulp`'s
//! run-time dispatch.

use std::borrow::Cow;
use std::cell::RefCell;

use ndarray::ArrayD;
use smallvec::SmallVec;

use crate::ir::{BinaryOp, DType, Literal, ReduceKind, with_literal};
use crate::runtime::buffers;
use crate::runtime::kernels::{
    INLINE_OPERANDS, Lanes, Operand, Operands, body_len, compare_fn, f32_arith, f32_binary,
    f32_unary, fold_rows_into, max_nan, min_nan,
};

use super::code::{Instr, Lane, ONE, int_lane, select_lane};
use super::compiled;
use super::passes::{CompareInto, InPlace, MapInto, PairInto, SplatZip, ZipInto, ZipSplat};
use super::source::{Layout, Source, lanes, worked_out};
use super::{CHUNK, Finish, Group, MAX_RESULTS};

thread_local! {
    /// The registers of the fused loops run on this thread (a device's, or the
    /// interpreter's), kept between runs: a loop allocates no scratch.
    static REGISTERS: RefCell<Vec<[f32; CHUNK]>> = const { RefCell::new(Vec::new()) };
}

/// The rows a trailing reduction folds: `outer` rows of `row` elements.
#[derive(Clone, Copy)]
struct Rows {
    outer: usize,
    row: usize,
}

impl Finish {
    /// Applies the op to each of `values` in place, `sources` the run's leaves.
    fn apply(self, values: &mut [f32], sources: &[Source<'_>]) -> Result<(), String> {
        let done = match self {
            Finish::Unary(op) => f32_unary(op, InPlace(values, 0.0, true)),
            Finish::Binary { op, splat, left } => match sources.get(splat) {
                Some(&Source::Splat(q)) => f32_binary(op, InPlace(values, q, left)),
                _ => return Err("a reduction's epilogue without its scalar".to_string()),
            },
        };
        done.ok_or_else(|| "a reduction's epilogue of an op without an f32 function".to_string())
    }
}

impl Group {
    /// Runs the loop on the leaves' values (in [`Group::leaves`] order; a leaf without
    /// dims may be a deferred broadcast) and pushes the values of [`Group::results`],
    /// in order, onto `results` (empty). A leaf handed over with the loop's shape in
    /// standard layout becomes a result's buffer (see [`Group::writes_in_place`]): it
    /// is taken out of `operands`. `Err` if a leaf is not f32 or does not fit its shape.
    ///
    /// The operands and results are the caller's, filled and read in place: a call
    /// moves neither list (about 2 KB and 0.5 KB inline), which was a fixed cost of
    /// every call.
    pub(crate) fn run(
        &self,
        operands: &mut Operands<'_>,
        results: &mut SmallVec<[Literal; MAX_RESULTS]>,
    ) -> Result<(), String> {
        if operands.len() != self.leaves.len() {
            return Err(format!(
                "a fused loop of {} leaves given {} values",
                self.leaves.len(),
                operands.len()
            ));
        }
        let total: usize = self.shape.iter().product();
        // Each owned leaf that fits is the buffer of the next result (`slots`), moved
        // out of `operands` in place.
        let mut outs: SmallVec<[Vec<f32>; MAX_RESULTS]> = SmallVec::new();
        let mut slots: SmallVec<[Option<usize>; INLINE_OPERANDS]> = SmallVec::new();
        for (k, x) in operands.iter_mut().enumerate() {
            let fits = match x {
                Operand::Value(Cow::Owned(Literal::F32(a))) => {
                    outs.len() < self.results.len()
                        && self.writes_in_place(k)
                        && a.is_standard_layout()
                        && a.shape() == self.shape.as_slice()
                }
                _ => false,
            };
            match fits.then(|| x.take_owned()).flatten() {
                Some(Literal::F32(a)) => {
                    slots.push(Some(outs.len()));
                    outs.push(elements(a, total));
                }
                _ => slots.push(None),
            }
        }
        let operands: &Operands<'_> = operands;
        let cut = self.cut();
        // Each leaf's elements, and its layout if not the planned one (a deferred
        // broadcast, or a value of another shape): worked out for this run.
        let mut data: SmallVec<[Cow<'_, [f32]>; INLINE_OPERANDS]> = SmallVec::new();
        let mut worked: SmallVec<[Option<Layout>; INLINE_OPERANDS]> = SmallVec::new();
        for ((leaf, planned), (x, slot)) in
            (self.leaves.iter().zip(&self.layouts)).zip(operands.iter().zip(&slots))
        {
            let (elements, layout) = match (slot, x, planned) {
                (Some(_), ..) => (Cow::Borrowed(&[][..]), None),
                (None, Operand::Value(v), Some((value, _)))
                    if with_literal!(&**v, a => a.shape()) == value.as_slice() =>
                {
                    (lanes(v), None)
                }
                (None, ..) => {
                    let (elements, layout) = worked_out(x, leaf.dims.as_deref(), &self.shape, cut)?;
                    (elements, Some(layout))
                }
            };
            data.push(elements);
            worked.push(layout);
        }
        let mut sources: SmallVec<[Source<'_>; INLINE_OPERANDS]> = SmallVec::new();
        for ((elements, worked), (planned, slot)) in
            (data.into_iter().zip(&worked)).zip(self.layouts.iter().zip(&slots))
        {
            sources.push(match (slot, worked, planned) {
                (Some(slot), ..) => Source::Buffer(*slot),
                (None, Some(layout), _) | (None, None, Some((_, layout))) => {
                    Source::laid(elements, layout)
                }
                (None, None, None) => return Err("a fused loop's leaf without a layout".into()),
            });
        }
        REGISTERS.with_borrow_mut(|regs| {
            // Grown, never shrunk: a group of fewer registers run between two of more
            // does not make the next one zero its registers again.
            if regs.len() < self.registers {
                regs.resize(self.registers, [0.0; CHUNK]);
            }
            let regs = &mut regs[..self.registers];
            // No chunk is longer than the loop.
            let longest = CHUNK.min(total);
            for (source, reg) in sources.iter().zip(regs.iter_mut()) {
                source.fill(&mut reg[..longest]);
            }
            pulp::Arch::new().dispatch(Vectorised {
                group: self,
                sources: &sources,
                outs,
                regs,
                results,
            })
        })
    }

    /// The results of a run whose writer op writes them straight into their buffers
    /// (see [`Direct`]): each of the first `slots` results (those with a buffer), unless
    /// its buffer is a leaf's handed over ([`Source::Buffer`]) that an op from the
    /// writer on still reads (the writer may not overwrite elements it or a later op
    /// reads).
    fn direct(&self, sources: &[Source<'_>], slots: usize) -> Direct {
        (0..slots)
            .filter(|&s| {
                let leaf = sources
                    .iter()
                    .position(|x| matches!(x, Source::Buffer(t) if *t == s));
                (leaf.and_then(|k| self.last_reads[k])).is_none_or(|last| last < self.writers[s])
            })
            .map(|s| (self.stores[s], s))
            .collect()
    }

    /// [`Group::direct`] for a compiled chain, which computes each element whole (its
    /// inputs read before its stores are written): each of the first `slots` results
    /// unless its buffer is a leaf's handed over, which the chain reads apart from what
    /// it writes.
    fn direct_compiled(&self, sources: &[Source<'_>], slots: usize) -> Direct {
        (0..slots)
            .filter(|&s| {
                !sources
                    .iter()
                    .any(|x| matches!(x, Source::Buffer(t) if *t == s))
            })
            .map(|s| (self.stores[s], s))
            .collect()
    }

    /// [`Group::run`] with the leaves' `sources`, the buffers of the first results
    /// (`outs`: leaves handed over), and registers; the results pushed onto `results`.
    #[inline(always)]
    fn run_on(
        &self,
        sources: &[Source<'_>],
        mut outs: SmallVec<[Vec<f32>; MAX_RESULTS]>,
        regs: &mut [[f32; CHUNK]],
        results: &mut SmallVec<[Literal; MAX_RESULTS]>,
    ) -> Result<(), String> {
        let total: usize = self.shape.iter().product();
        // With a reduction, the buffers of the results besides the root (its last).
        let stored = self.results.len() - usize::from(self.reduce.is_some());
        // Every element of a result's buffer is written before it is read (chunk by
        // chunk, in order): a pooled buffer is taken as it is, not zeroed first.
        while outs.len() < stored {
            outs.push(buffers::take(total));
        }
        let direct = match self.compiled {
            Some(_) => self.direct_compiled(sources, outs.len()),
            None => self.direct(sources, outs.len()),
        };
        let reduced = match self.reduce {
            Some((kind, kept)) => {
                let (outer, row) = (
                    self.shape[..kept].iter().product(),
                    self.shape[kept..].iter().product(),
                );
                let (rows, outs) = (Rows { outer, row }, &mut outs[..]);
                let run = Run {
                    sources,
                    direct: &direct,
                };
                let data = match kind {
                    ReduceKind::Sum => self.fold_rows(run, outs, regs, rows, 0.0, |p, q| p + q),
                    ReduceKind::Max => {
                        self.fold_rows(run, outs, regs, rows, f32::NEG_INFINITY, max_nan)
                    }
                    ReduceKind::Min => {
                        self.fold_rows(run, outs, regs, rows, f32::INFINITY, min_nan)
                    }
                }?;
                let mut data = data;
                let shape = match &self.epilogue {
                    Some(epilogue) => {
                        epilogue.op.apply(&mut data, sources)?;
                        &epilogue.shape[..]
                    }
                    None => &self.shape[..kept],
                };
                Some(self.shaped(shape, data)?)
            }
            None => {
                let run = Run {
                    sources,
                    direct: &direct,
                };
                for start in (0..total).step_by(CHUNK) {
                    let len = CHUNK.min(total - start);
                    self.chunk(run, &mut outs, regs, start, len);
                    self.store(run, &mut outs, regs, start, len);
                }
                None
            }
        };
        for out in outs {
            results.push(self.shaped(&self.shape, out)?);
        }
        results.extend(reduced);
        Ok(())
    }

    /// Stores the chunk of `len` elements from flat index `start` of each result with a
    /// buffer in `outs` (the first results) from its register, unless its op wrote it
    /// there; every register of the chunk is computed, so the buffers may be written
    /// (a leaf's handed over too).
    #[inline(always)]
    fn store(
        &self,
        run: Run<'_, '_>,
        outs: &mut [Vec<f32>],
        regs: &[[f32; CHUNK]],
        start: usize,
        len: usize,
    ) {
        for (s, (out, &r)) in outs.iter_mut().zip(&self.stores).enumerate() {
            if !run.direct.iter().any(|&(_, slot)| slot == s) {
                out[start..start + len].copy_from_slice(&regs[r][..len]);
            }
        }
    }

    /// The reduction of each of the `rows` with `f` (identity `identity`), folded as
    /// [`Lanes`] fold; the results besides the root stored into `outs` chunk by chunk
    /// (in order: fresh buffers). Rows shorter than a chunk are computed several at a
    /// time (as many whole rows as a chunk holds) and folded one by one from the last
    /// register; longer rows chunk by chunk. Either way each row is fed to its own
    /// lanes in order, so the result does not depend on the cut.
    #[inline(always)]
    fn fold_rows(
        &self,
        run: Run<'_, '_>,
        outs: &mut [Vec<f32>],
        regs: &mut [[f32; CHUNK]],
        Rows { outer, row }: Rows,
        identity: f32,
        f: impl Fn(f32, f32) -> f32 + Copy,
    ) -> Result<Vec<f32>, String> {
        let body = body_len(row);
        if row == 0 {
            let mut out = buffers::with_capacity(outer);
            out.resize(outer, identity);
            return Ok(out);
        }
        // Every row's element is written (in order) before the buffer is read.
        let mut out = buffers::take(outer);
        // The register the reduction folds: the last op's (see `Group::new`).
        let last = self
            .stores
            .last()
            .copied()
            .ok_or("a reduction folds a register")?;
        if row <= CHUNK {
            let per_chunk = CHUNK / row;
            let mut r = 0;
            while r < outer {
                let rows = per_chunk.min(outer - r);
                let (start, len) = (r * row, rows * row);
                self.chunk(run, outs, regs, start, len);
                self.store(run, outs, regs, start, len);
                let values = run.values(outs, regs, last, start, len);
                fold_rows_into(values, row, identity, f, &mut out[r..r + rows]);
                r += rows;
            }
            return Ok(out);
        }
        for (r, o) in out.iter_mut().enumerate() {
            let mut lanes = Lanes::new(identity);
            let mut start = 0;
            while start < row {
                let len = CHUNK.min(row - start);
                self.chunk(run, outs, regs, r * row + start, len);
                self.store(run, outs, regs, r * row + start, len);
                let values = run.values(outs, regs, last, r * row + start, len);
                let in_body = body.saturating_sub(start).min(len);
                lanes.push(&values[..in_body], f);
                start += len;
                if start == row {
                    *o = lanes.finish(&values[in_body..], f);
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Computes the `len` elements from flat index `start` of the loop: reads the
    /// leaves (in place where they are contiguous, a [`Source::Buffer`] from its
    /// result's buffer in `outs`; a [`Source::Splat`] or [`Source::Repeat`] from its
    /// register, filled for the run; the others loaded into their registers), and runs
    /// the ops into their registers, or into their results' buffers (`run.direct`).
    #[inline(always)]
    fn chunk(
        &self,
        run: Run<'_, '_>,
        outs: &mut [Vec<f32>],
        regs: &mut [[f32; CHUNK]],
        start: usize,
        len: usize,
    ) {
        let Run { sources, direct } = run;
        let end = start + len;
        for (source, reg) in sources.iter().zip(regs.iter_mut()) {
            source.load(&mut reg[..len], start);
        }
        if let (Some(k), Some((_, inputs))) = (self.compiled, &self.chain) {
            self.compiled_chunk(k, inputs, run, outs, regs, start, len);
            return;
        }
        let round = rounding(self.dtype);
        for &(ref instr, dst) in &self.code {
            // The op's elements apart from the others (its operands'): its result's
            // buffer if it writes it directly, else its register.
            let (dst, regs, outs) = match slot_of(direct, dst) {
                Some(s) => {
                    let Some((out, outs)) = Split::lend(outs, s) else {
                        continue;
                    };
                    (&mut out[start..end], Split::whole(&*regs), outs)
                }
                None => {
                    let Some((reg, regs)) = Split::lend(regs, dst) else {
                        continue;
                    };
                    (&mut reg[..len], regs, Split::whole(&*outs))
                }
            };
            let arg = |r: usize| -> &[f32] {
                match sources.get(r) {
                    Some(Source::Buffer(s)) => &outs.get(*s)[start..end],
                    Some(Source::Strided {
                        data,
                        contiguous: true,
                        ..
                    }) => &data[start..end],
                    _ => match slot_of(direct, r) {
                        Some(s) => &outs.get(s)[start..end],
                        None => &regs.get(r)[..len],
                    },
                }
            };
            // A scalar broadcast is one value in a machine register, not a register
            // of the loop read element by element.
            let splat = |r: usize| match sources.get(r) {
                Some(&Source::Splat(v)) => Some(v),
                _ => None,
            };
            match *instr {
                Instr::Unary(op, a) => {
                    f32_unary(op, MapInto(arg(a), &mut *dst));
                    round.inspect(|&f| dst.iter_mut().for_each(|d| *d = f(*d)));
                }
                Instr::Binary(op, a, b) => {
                    match (splat(a), splat(b)) {
                        (None, Some(q)) => f32_binary(op, ZipSplat(arg(a), q, &mut *dst)),
                        (Some(p), None) => f32_binary(op, SplatZip(p, arg(b), &mut *dst)),
                        _ => f32_binary(op, ZipInto(arg(a), arg(b), &mut *dst)),
                    };
                    round.inspect(|&f| dst.iter_mut().for_each(|d| *d = f(*d)));
                }
                Instr::Compare(op, Lane::Int, a, b) => {
                    compare_fn(op, CompareInto(arg(a), arg(b), dst, int_lane));
                }
                Instr::Compare(op, _, a, b) => {
                    compare_fn(op, CompareInto(arg(a), arg(b), dst, |v: f32| v));
                }
                Instr::Convert(lane, a) => {
                    let lanes = dst.iter_mut().zip(arg(a));
                    match lane {
                        // The mask's bits and 1.0's: 1.0 for true, 0.0 for false.
                        Lane::Bool => {
                            lanes.for_each(|(d, &p)| *d = f32::from_bits(p.to_bits() & ONE))
                        }
                        Lane::Int => lanes.for_each(|(d, &v)| *d = int_lane(v) as f32),
                        Lane::Float => lanes.for_each(|(d, &v)| *d = v),
                    }
                    round.inspect(|&f| dst.iter_mut().for_each(|d| *d = f(*d)));
                }
                Instr::Logic(op, a, b) => {
                    let lanes = dst.iter_mut().zip(arg(a)).zip(arg(b));
                    if op == BinaryOp::And {
                        lanes.for_each(|((d, &p), &q)| {
                            *d = f32::from_bits(p.to_bits() & q.to_bits())
                        });
                    } else {
                        lanes.for_each(|((d, &p), &q)| {
                            *d = f32::from_bits(p.to_bits() | q.to_bits())
                        });
                    }
                }
                Instr::Test(test, a) => {
                    for (d, &v) in dst.iter_mut().zip(arg(a)) {
                        *d = test.apply(v);
                    }
                }
                Instr::Select(p, t, f) => {
                    let lanes = dst.iter_mut().zip(arg(p)).zip(arg(t)).zip(arg(f));
                    for (((d, &p), &t), &f) in lanes {
                        *d = select_lane(p, t, f);
                    }
                }
                Instr::Pair {
                    first,
                    a,
                    b,
                    second,
                    c,
                    t_left,
                } => {
                    let (a, b, c) = (arg(a), arg(b), arg(c));
                    f32_arith(first, PairInto(second, a, b, c, t_left, dst));
                }
            }
        }
    }
}

impl Group {
    /// [`Group::chunk`] by compiled chain `k` (see [`chains`](super::chains)), the
    /// leaves loaded: reads its `inputs` (leaf registers) where the interpreter's ops
    /// would read them, and writes each stored value into its result's buffer if
    /// `run.direct` says so (see [`Group::direct_compiled`]), else into its register.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn compiled_chunk(
        &self,
        k: usize,
        inputs: &[usize],
        run: Run<'_, '_>,
        outs: &mut [Vec<f32>],
        regs: &mut [[f32; CHUNK]],
        start: usize,
        len: usize,
    ) {
        let Run { sources, direct } = run;
        let end = start + len;
        // Each store's elements, by its place in `stores` (result slot `s` holds store
        // `s`); the result buffers the chain reads as leaves.
        let mut stored: [Option<&mut [f32]>; MAX_RESULTS] = Default::default();
        let mut read: [&[f32]; MAX_RESULTS] = [&[]; MAX_RESULTS];
        for ((s, out), (stored, read)) in outs
            .iter_mut()
            .enumerate()
            .zip(stored.iter_mut().zip(&mut read))
        {
            let out = &mut out[start..end];
            if direct.iter().any(|&(_, slot)| slot == s) {
                *stored = Some(out);
            } else {
                *read = out;
            }
        }
        let base = self.leaves.len();
        let (leaves, ops) = regs.split_at_mut(base.min(regs.len()));
        for (i, reg) in ops.iter_mut().enumerate() {
            let place = self.stores.iter().position(|&s| s == base + i);
            if let Some(slot) = place
                .and_then(|p| stored.get_mut(p))
                .filter(|x| x.is_none())
            {
                *slot = Some(&mut reg[..len]);
            }
        }
        let ins: SmallVec<[&[f32]; 16]> = (inputs.iter())
            .map(|&r| match sources.get(r) {
                Some(&Source::Buffer(s)) => read.get(s).copied().unwrap_or_default(),
                Some(Source::Strided {
                    data,
                    contiguous: true,
                    ..
                }) => &data[start..end],
                _ => &leaves[r][..len],
            })
            .collect();
        let mut stored: SmallVec<[&mut [f32]; MAX_RESULTS]> =
            stored.into_iter().flatten().collect();
        compiled::run(k, &ins, &mut stored, len);
    }
}

/// The results an op of a run writes straight into their buffers instead of its
/// register, as `(register, slot)`: the register's values are then read from result
/// `slot`'s buffer (see [`Group::direct`]).
type Direct = SmallVec<[(usize, usize); MAX_RESULTS]>;

/// The result buffer register `r` is written into, if it is written directly.
fn slot_of(direct: &[(usize, usize)], r: usize) -> Option<usize> {
    direct
        .iter()
        .find(|&&(reg, _)| reg == r)
        .map(|&(_, slot)| slot)
}

/// What every chunk of a run reads besides the buffers and registers: the leaves'
/// sources and the results written directly.
#[derive(Clone, Copy)]
struct Run<'r, 'a> {
    sources: &'r [Source<'a>],
    direct: &'r [(usize, usize)],
}

impl<'r> Run<'r, '_> {
    /// The values of register `r` for the chunk of `len` elements from `start`: a
    /// leaf's where the loop reads it (a buffer handed over, or in place), else in its
    /// result's buffer if written directly, else in the register.
    fn values<'x>(
        self,
        outs: &'x [Vec<f32>],
        regs: &'x [[f32; CHUNK]],
        r: usize,
        start: usize,
        len: usize,
    ) -> &'x [f32]
    where
        'r: 'x,
    {
        match self.sources.get(r) {
            Some(&Source::Buffer(s)) => return &outs[s][start..start + len],
            Some(Source::Strided {
                data,
                contiguous: true,
                ..
            }) => return &data[start..start + len],
            _ => {}
        }
        match slot_of(self.direct, r) {
            Some(s) => &outs[s][start..start + len],
            None => &regs[r][..len],
        }
    }
}

/// Slice `lo`, one element lent out mutably (`hole`; `usize::MAX`: none), then `hi`:
/// the registers or result buffers an op reads while it writes one of them.
struct Split<'x, T> {
    lo: &'x [T],
    hole: usize,
    hi: &'x [T],
}

impl<'x, T> Split<'x, T> {
    /// All of `all`, none lent out.
    fn whole(all: &'x [T]) -> Self {
        Split {
            lo: all,
            hole: usize::MAX,
            hi: &[],
        }
    }

    /// Element `i` of `all` lent out mutably beside the rest; `None` past the end.
    fn lend(all: &'x mut [T], i: usize) -> Option<(&'x mut T, Self)> {
        let (lo, rest) = all.split_at_mut(i);
        let (at, hi) = rest.split_first_mut()?;
        Some((at, Split { lo, hole: i, hi }))
    }

    /// Element `i` (not the hole).
    fn get(&self, i: usize) -> &'x T {
        if i < self.hole {
            &self.lo[i]
        } else {
            &self.hi[i - self.hole - 1]
        }
    }
}

/// `a`'s elements in standard order as a vector of `len` (an owned standard-layout
/// array of `len` elements: moved, not copied, unless it starts past its buffer's
/// first element).
fn elements(a: ArrayD<f32>, len: usize) -> Vec<f32> {
    let (mut data, offset) = a.into_raw_vec_and_offset();
    data.drain(..offset.unwrap_or(0).min(data.len()));
    data.truncate(len);
    data
}

impl Group {
    /// `data` as a literal of `shape` in the loop's dtype (converted from f32 lanes
    /// that hold it exactly).
    fn shaped(&self, shape: &[usize], data: Vec<f32>) -> Result<Literal, String> {
        let lanes = ArrayD::from_shape_vec(shape, data).map_err(|e| e.to_string())?;
        Ok(match self.dtype {
            DType::F32 => Literal::F32(lanes),
            narrow => Literal::F32(lanes).convert(narrow),
        })
    }
}

/// The function rounding an op's f32 lanes to `dtype` as `Literal::convert` rounds (to
/// nearest even), if `dtype` is narrow.
fn rounding(dtype: DType) -> Option<fn(f32) -> f32> {
    match dtype {
        DType::BF16 => Some(|v| half::bf16::from_f32(v).to_f32()),
        DType::F16 => Some(|v| half::f16::from_f32(v).to_f32()),
        _ => None,
    }
}

/// [`Group::run_on`] under `pulp`'s run-time dispatch: the loop, inlined here, is
/// compiled with the CPU's vector features (AVX2 and FMA, AVX-512), so each op's run
/// over a register takes 8 or 16 elements per instruction. The bits do not change:
/// every op is still its kernel's scalar function (the compiler neither contracts a
/// product and a sum into a fused multiply-add nor reorders a reduction's lanes).
struct Vectorised<'g, 's, 'a> {
    group: &'g Group,
    sources: &'s [Source<'a>],
    outs: SmallVec<[Vec<f32>; MAX_RESULTS]>,
    regs: &'s mut [[f32; CHUNK]],
    results: &'s mut SmallVec<[Literal; MAX_RESULTS]>,
}

impl pulp::WithSimd for Vectorised<'_, '_, '_> {
    type Output = Result<(), String>;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        (self.group).run_on(self.sources, self.outs, self.regs, self.results)
    }
}
