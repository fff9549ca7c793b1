//! The per-executable choice between keeping a weight gathered in the forward pass for
//! the backward pass and gathering it again there (PyTorch FSDP's
//! `reshard_after_forward`), made from the memory analysis: [`CompileOptions`] in,
//! [`GatherPlan`] out.

use std::fmt;

use crate::analysis::MemoryAnalysis;
use crate::error::Result;
use crate::ir::{Program, ValueId};
use crate::partition::regather::{Candidate, candidates, regather};
use crate::partition::{bytes_received, combine_collectives};
use crate::runtime::PlannedProgram;
use crate::sharding::Mesh;
use crate::types::Location;

use super::CompileTimes;

/// Whether a weight all-gathered for the forward pass is kept for the backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GatherReuse {
    /// Keep every gathered weight while the memory analysis's peak fits
    /// [`CompileOptions::memory_limit`]; above it, regather weights one at a time, the
    /// one lowering the peak most first (as the last analysis's timeline says: its bytes
    /// no longer held between its two clusters of users; ties: the earliest gather),
    /// analysing the program again after each, until the peak fits. If it never fits,
    /// the prefix of that order with the lowest peak is taken (the best this can do;
    /// [`GatherPlan::fits`] says `false`).
    #[default]
    Auto,
    /// Keep every gathered weight from the forward to the backward pass (what
    /// [`compile`](crate::compile) does): fewest bytes received, most held.
    Keep,
    /// Gather every candidate weight again before its backward users (FSDP's
    /// `reshard_after_forward=True`): its bytes received twice per step, held only
    /// while each pass reads it.
    Regather,
}

/// What a backward scan does with the collectives of the forward body it recomputes
/// (the per-device program's rematerialisation policy for scans; JAX's `scan` VJP
/// saves residuals by default, `jax.checkpoint` recomputes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScanRemat {
    /// A collective of an activation in the recomputed forward that the forward scan
    /// computes too (a hidden state all-gathered for its product with a weight) is
    /// stacked by the forward scan as one more output and read by the backward body:
    /// the forward's collective serves both, the recomputation feeding it is dropped.
    /// Never more bytes received; each saved value held `length` times between the
    /// two scans. Collectives of weights alone (a stacked layer's weights gathered)
    /// are gathered again, as FSDP does, so weights stay as sharded as they are. Not
    /// the default: a saved gather is held less sharded than the activations it
    /// gathers, so memory per device no longer falls as 1/devices (the paper's dense
    /// Transformer, 256 scanned layers, `tests/paper_scale.rs`: memory x devices 1.39
    /// times as large on 2x4 and 4x4 as on 2x2).
    SaveCollectives,
    /// The backward body recomputes the forward body from the stacked carried values,
    /// collectives included (the default): the fewest bytes held, each such collective
    /// run twice per iteration.
    #[default]
    Recompute,
}

/// Options of [`compile_with`](crate::compile_with). The default compiles as
/// [`compile`](crate::compile) does.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompileOptions {
    /// Bytes one device may hold at the peak of a run (the memory analysis's
    /// [`peak_bytes`](MemoryAnalysis::peak_bytes)); `None`: unlimited.
    pub memory_limit: Option<usize>,
    /// How [`GatherReuse::Auto`] et al. treat gathered weights.
    pub gathers: GatherReuse,
    /// The inputs (parameter indices) a run consumes — *donated*, as JAX's
    /// `donate_argnums`: each device's block is the run's to write into at its last use
    /// and to free there, so a training step updating its weights and optimizer state
    /// holds one copy of them, not the old and the new. A donated resident input holds
    /// nothing after the run (unless an output is stored under its key), whether the run
    /// succeeded or failed. Indices beyond the program's parameters are an error.
    pub donated: Vec<usize>,
    /// Whether backward scans recompute the forward scans' collectives
    /// ([`ScanRemat::Recompute`], the default) or reuse them.
    pub scan_remat: ScanRemat,
}

/// What became of one all-gather that could be issued again for its later users: a
/// weight gathered before use, read by the forward and the backward pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatherChoice {
    /// The weight: the name of the parameter the gather's operand is computed from (or
    /// the gather's own name, if the parameter has none).
    pub name: String,
    /// The gathered value in the per-device program (the first, forward one).
    pub value: ValueId,
    /// Its bytes per device.
    pub bytes: usize,
    /// Where the gather was traced (the op that needed it).
    pub location: Location,
    /// The second all-gather in the per-device program, right before the first later
    /// user; `None` if the value is kept.
    pub regathered_at: Option<ValueId>,
    /// Bytes each device receives per run for the second gather (0 if kept).
    pub extra_bytes_received: usize,
}

/// The executable's choice for its gathered weights ([`Executable::gathers`]).
///
/// [`Executable::gathers`]: crate::Executable::gathers
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatherPlan {
    /// The options it was made with.
    pub options: CompileOptions,
    /// One per candidate gather, in program order.
    pub choices: Vec<GatherChoice>,
    /// The memory analysis's peak per device with every candidate kept, if the choice
    /// analysed it (with a limit, or for [`GatherReuse::Regather`]).
    pub peak_all_kept: Option<usize>,
    /// The peak per device of the chosen program, if analysed.
    pub peak: Option<usize>,
}

impl GatherPlan {
    /// The choices that keep the forward gather for the backward pass.
    pub fn kept(&self) -> impl Iterator<Item = &GatherChoice> {
        self.choices.iter().filter(|c| c.regathered_at.is_none())
    }

    /// The choices that gather again.
    pub fn regathered(&self) -> impl Iterator<Item = &GatherChoice> {
        self.choices.iter().filter(|c| c.regathered_at.is_some())
    }

    /// Whether the chosen peak fits the memory limit: `None` without a limit or
    /// without an analysis.
    pub fn fits(&self) -> Option<bool> {
        Some(self.peak? <= self.options.memory_limit?)
    }
}

impl fmt::Display for GatherPlan {
    /// `gathered weights: 13 kept (99328 B per device held from forward to backward),
    /// 0 regathered`, the peaks and the limit if analysed, then one line per choice.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held: usize = self.kept().map(|c| c.bytes).sum();
        let extra: usize = self.regathered().map(|c| c.extra_bytes_received).sum();
        write!(
            f,
            "gathered weights: {} kept ({held} B per device held from forward to backward), \
             {} regathered (+{extra} B received per step)",
            self.kept().count(),
            self.regathered().count()
        )?;
        if let (Some(peak), Some(all_kept)) = (self.peak, self.peak_all_kept) {
            write!(f, "; peak {peak} B per device (all kept: {all_kept} B)")?;
        }
        if let Some(limit) = self.options.memory_limit {
            let verdict = match self.fits() {
                Some(true) => "fits",
                Some(false) => "does not fit, the lowest peak found",
                None => "not analysed",
            };
            write!(f, "; limit {limit} B: {verdict}")?;
        }
        for c in &self.choices {
            write!(f, "\n  {}: {} B, ", c.name, c.bytes)?;
            match c.regathered_at {
                None => write!(f, "kept as {}", c.value)?,
                Some(copy) => write!(
                    f,
                    "regathered at {copy} (+{} B received)",
                    c.extra_bytes_received
                )?,
            }
            write!(f, "  // {}", c.location)?;
        }
        Ok(())
    }
}

/// The per-device program `base` (simplified, not yet combined) with the gathers
/// `options` chooses regathered and its collectives combined (the second gathers
/// apart), the choice, and the plan of the program if the choice made one. Each pass's
/// time is added to `times`.
pub(super) fn choose(
    base: &Program,
    mesh: &Mesh,
    options: &CompileOptions,
    times: &mut CompileTimes,
) -> Result<(Program, GatherPlan, Option<PlannedProgram>)> {
    let candidates = times.time("regather candidates", || candidates(base));
    let analysed = |(kept, trial): (usize, Trial)| {
        let peaks = (kept, trial.memory.peak_bytes, trial.planned);
        (trial.set, trial.built, Some(peaks))
    };
    let (set, built, peaks) = match (options.gathers, options.memory_limit) {
        (GatherReuse::Keep, _) | (GatherReuse::Auto, None) => {
            (Vec::new(), build(base, &candidates, &[], times)?, None)
        }
        (GatherReuse::Regather, _) => {
            let donated = &options.donated;
            let kept = Trial::of(base, &candidates, Vec::new(), donated, times)?
                .memory
                .peak_bytes;
            let all = (0..candidates.len()).collect();
            let all = Trial::of(base, &candidates, all, donated, times)?;
            analysed((kept, all))
        }
        (GatherReuse::Auto, Some(limit)) => {
            analysed(greedy(base, &candidates, limit, &options.donated, times)?)
        }
    };
    let (peak_all_kept, peak, planned) = match peaks {
        Some((kept, peak, planned)) => (Some(kept), Some(peak), Some(planned)),
        None => (None, None, None),
    };
    let (program, copies, ids) = built;
    let choices = (candidates.iter().enumerate())
        .map(|(c, candidate)| {
            let node = base.node(candidate.gather);
            let name = (base.node(candidate.root).name.clone())
                .or_else(|| node.name.clone())
                .unwrap_or_else(|| candidate.root.to_string());
            let copy = set.iter().position(|&s| s == c).map(|k| copies[k]);
            GatherChoice {
                name,
                value: ids[candidate.gather.index()],
                bytes: node.ty.size_in_bytes(),
                location: node.location,
                regathered_at: copy,
                extra_bytes_received: copy
                    .map_or(0, |copy| bytes_received(&program, program.node(copy), mesh)),
            }
        })
        .collect();
    let plan = GatherPlan {
        options: options.clone(),
        choices,
        peak_all_kept,
        peak,
    };
    Ok((program, plan, planned))
}

/// A built program: the program, the second gathers in it (in the set's order), and
/// each value of the base program's id in it.
type Built = (Program, Vec<ValueId>, Vec<ValueId>);

/// `base` with `set` (indices into `candidates`, ascending) regathered and combined.
fn build(
    base: &Program,
    candidates: &[Candidate],
    set: &[usize],
    times: &mut CompileTimes,
) -> Result<Built> {
    let chosen: Vec<&Candidate> = set.iter().map(|&c| &candidates[c]).collect();
    let (program, copies, ids) = times.time("regather", || regather(base, &chosen));
    let (program, combined) = times.time("combine", || combine_collectives(&program, &copies))?;
    let copies = copies.iter().map(|c| combined[c.index()]).collect();
    let ids = ids.iter().map(|v| combined[v.index()]).collect();
    Ok((program, copies, ids))
}

/// The memory analysis of `program`, and its plan.
fn memory_of(program: &Program, donated: &[usize]) -> (MemoryAnalysis, PlannedProgram) {
    let planned = PlannedProgram::donating(program.clone(), donated);
    let memory = MemoryAnalysis::of(&planned.program, &planned.plan, &|_| false);
    (memory, planned)
}

/// A set of candidates regathered (ascending), built and analysed.
struct Trial {
    set: Vec<usize>,
    built: Built,
    memory: MemoryAnalysis,
    planned: PlannedProgram,
}

impl Trial {
    fn of(
        base: &Program,
        candidates: &[Candidate],
        set: Vec<usize>,
        donated: &[usize],
        times: &mut CompileTimes,
    ) -> Result<Trial> {
        let built = build(base, candidates, &set, times)?;
        let (memory, planned) = times.time("memory analysis", || memory_of(&built.0, donated));
        Ok(Trial {
            set,
            built,
            memory,
            planned,
        })
    }

    /// The peak this trial's timeline would have if `candidate` (not in the set) were
    /// regathered too: its bytes no longer held at the nodes strictly between its last
    /// earlier and its first later user. An estimate (the copy's own transient bytes are
    /// not in it) to rank candidates by; the choice is then analysed for real.
    fn estimate(&self, base: &Program, candidate: &Candidate) -> usize {
        let ids = &self.built.2;
        let from = ids[candidate.last_earlier.index()].index();
        let to = ids[candidate.later[0].index()].index();
        let bytes = base.ty(candidate.gather).size_in_bytes();
        let timeline = self.memory.timeline.iter().enumerate();
        (timeline.map(|(i, &held)| {
            if from < i && i < to {
                held - bytes.min(held)
            } else {
                held
            }
        }))
        .max()
        .unwrap_or(0)
    }
}

/// [`GatherReuse::Auto`] under `limit`: the peak with every candidate kept, and the
/// trial chosen. Each step regathers the candidate whose [`Trial::estimate`] is lowest
/// (ties: the earliest gather) and analyses the result: one analysis per step, not one
/// per candidate and step.
fn greedy(
    base: &Program,
    candidates: &[Candidate],
    limit: usize,
    donated: &[usize],
    times: &mut CompileTimes,
) -> Result<(usize, Trial)> {
    let mut current = Trial::of(base, candidates, Vec::new(), donated, times)?;
    let kept_peak = current.memory.peak_bytes;
    let mut best = (Vec::new(), kept_peak);
    while current.memory.peak_bytes > limit {
        let remaining = (0..candidates.len()).filter(|c| !current.set.contains(c));
        let Some(c) = remaining.min_by_key(|&c| (current.estimate(base, &candidates[c]), c)) else {
            break;
        };
        let mut set = current.set.clone();
        set.push(c);
        set.sort_unstable();
        current = Trial::of(base, candidates, set, donated, times)?;
        if current.memory.peak_bytes < best.1 {
            best = (current.set.clone(), current.memory.peak_bytes);
        }
    }
    if current.set != best.0 {
        current = Trial::of(base, candidates, best.0, donated, times)?;
    }
    Ok((kept_peak, current))
}
