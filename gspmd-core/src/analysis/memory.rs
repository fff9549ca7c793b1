//! Memory analysis of a per-device program: what one device holds while it runs, node
//! by node, before anything runs.
//!
//! The walk follows the runtime's execution plan ([`Plan`]: which values each node
//! drops, which operands it takes over, which broadcasts are views) and the runtime's
//! buffer reuse, so that it predicts what the evaluation loop allocates:
//!
//! - inputs (parameters) are held by the caller for the whole step (resident weights
//!   and optimizer state, data), except donated ones
//!   ([`CompileOptions::donated`](crate::CompileOptions::donated)), which the run owns
//!   from its start and frees (or writes over) at their last use; constants live in
//!   the program; neither is allocated by the run;
//! - a deferred broadcast is a view of its operand: no buffer (its operand lives while
//!   it is read);
//! - an elementwise op (unary, binary, select, convert to the same dtype, a sharding
//!   constraint) that takes over an operand of its result's type writes its result
//!   into that operand's buffer: no new buffer;
//! - a fusion group's loop computes all its results at its root: each result (in
//!   node order) writes into the buffer of the next leaf it takes over that it may
//!   write in place, else into a new buffer;
//! - every other node allocates its result while its operands are held, and a
//!   collective whose operand is not taken over copies it first, and a reduction
//!   (all-reduce, reduce-scatter) holds the accumulators of its reduction order's
//!   levels while it runs;
//! - a convolution also holds its scratch while it runs: a padded copy of its input
//!   when windows reach padding, the kernel packed in panels, offset tables, and the
//!   product before it is placed in the result's layout when that differs;
//! - an f32 matrix product also holds, while it runs, a copy of each operand whose
//!   contracting dims do not merge and its kernel's packing buffers (up to
//!   `256 x (64 + 1024)` f32 elements per product, matrixmultiply's blocks; none for
//!   tiny products);
//! - a control-flow instance copies its operands (but a scan's stacked operands, which
//!   it reads in place), runs its regions (each region's own peak, recursively), and
//!   holds all its results until their nodes take them (a scan writes each iteration's
//!   outputs `y` into its results as it goes); each iteration of a scan hands its body
//!   a second copy of the carried values and captures and a slice of each stacked
//!   operand, held while the body runs.
//!
//! Other scratch space inside kernels is not counted. Against the allocator
//! (`tests/memory.rs`, which counts every buffer against the device thread that
//! allocated it) the peak is within 10% on the examples' models and the paper's dense
//! Transformer on 1x1, 2x1 and 2x4 meshes; before the scan's per-iteration arguments
//! and the products' packing buffers were counted, the dense Transformer's backward
//! scan was 15-32% above the prediction.
//!
//! The device's buffer pool (free buffers a run keeps for reuse, see
//! `runtime::buffers`) holds no live value and is not counted in the timeline, but it
//! is memory: the evaluation loop keeps its live values and the pooled buffers together
//! within [`MemoryAnalysis::peak_bytes`] plus the pool's headroom
//! ([`MemoryAnalysis::pool_headroom_bytes`]: an eighth of the peak or 1 MiB if more,
//! never past the device's memory limit), leaving free the scratch each node's kernel may need
//! besides. So a device holds at most the peak plus the headroom (plus unmodelled
//! kernel scratch) whether its buffers are pooled or freed, and between runs its pool
//! holds at most that less the inputs (`runtime::pooled_bytes` reports it).

use std::collections::BTreeMap;
use std::fmt;

use crate::ir::{Location, Op, Program, ValueId};
use crate::runtime::{Plan, Walk, lent_input_bytes};

/// What one device holds while it runs a per-device program (see the module docs for
/// the model): the peak, what it is made of, and the bytes live at each node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryAnalysis {
    /// The most bytes held at once: every input, plus the values computed and live
    /// while the peak node runs (its operands and its result both held).
    pub peak_bytes: usize,
    /// `peak_bytes` by kind.
    pub breakdown: MemoryBreakdown,
    /// The node at which the peak is reached.
    pub peak_node: Option<ValueId>,
    /// The largest computed value live at the peak, and where it was traced (`None`
    /// for a value a pass built). `None` if no computed value is live there.
    pub peak_value: Option<(ValueId, Option<Location>)>,
    /// One entry per node of the program, in execution (node) order: the bytes held
    /// while the node runs (inputs included).
    pub timeline: Vec<usize>,
    /// How much more than `peak_bytes` a device can hold when the devices do not run in
    /// step: a thread mesh's collectives share their operands rather than copying them,
    /// so a device's operand stays allocated after the device has left the collective
    /// until the slowest member of its group has read it. At most one such operand per
    /// group the device meets in, so this is the sum over those groups (of more than one
    /// device) of the largest operand posted there. `peak_bytes` assumes devices in
    /// step; the truth lies between it and `peak_bytes + in_flight_bytes`.
    pub in_flight_bytes: usize,
}

/// The bytes held at the peak, by kind; they add up to [`MemoryAnalysis::peak_bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryBreakdown {
    /// Inputs that are not optimizer state: weights, data, scalars.
    pub parameters: usize,
    /// Inputs that are optimizer state (see
    /// [`Executable::memory_analysis`](crate::Executable::memory_analysis)).
    pub optimizer_state: usize,
    /// Computed values held across the peak node for later nodes: in a training step,
    /// the forward pass's activations kept for the backward pass.
    pub activations_kept: usize,
    /// The peak node's own working set: its result, its computed operands and the
    /// copies it makes (a collective's operand, a control-flow instance's operands and
    /// regions).
    pub temporaries: usize,
}

impl MemoryBreakdown {
    /// The sum of the four kinds.
    pub fn total(&self) -> usize {
        self.parameters + self.optimizer_state + self.activations_kept + self.temporaries
    }
}

impl MemoryAnalysis {
    /// The most bytes beyond [`MemoryAnalysis::peak_bytes`] the device's buffer pool may
    /// hold (free buffers kept for reuse, no live value): an eighth of the peak or 1 MiB
    /// if that is more, or what the device's memory limit leaves above the peak if that
    /// is less (see the module docs). A device holds at most the peak plus this (and
    /// plus `in_flight_bytes`).
    pub fn pool_headroom_bytes(&self) -> usize {
        crate::runtime::pool_headroom(self.peak_bytes, usize::MAX)
    }

    /// The analysis of `program` run by the evaluation loop with `plan` ([`Plan::new`]
    /// of `program`); `is_state(i)` tells whether input `i` is optimizer state.
    pub(crate) fn of(program: &Program, plan: &Plan, is_state: &dyn Fn(usize) -> bool) -> Self {
        // Adds input `i`'s bytes to the parameters or the optimizer state.
        let classify = |breakdown: &mut MemoryBreakdown, i: usize, bytes: usize| {
            if is_state(i) {
                breakdown.optimizer_state += bytes;
            } else {
                breakdown.parameters += bytes;
            }
        };
        let mut breakdown = MemoryBreakdown::default();
        for (i, &p) in program.params.iter().enumerate() {
            if !plan.donated.get(i).copied().unwrap_or(false) {
                classify(&mut breakdown, i, program.ty(p).size_in_bytes());
            }
        }
        let inputs = lent_input_bytes(program, plan);
        let walk = Walk::of(program, plan);
        let peak = walk.peak;
        let mut peak_value = None;
        if let Some(p) = peak {
            let node = &program.nodes[p.index()];
            let working = |v: ValueId| v == p || node.operands.contains(&v);
            breakdown.temporaries = walk.transient;
            for &(v, bytes) in &walk.live {
                if let Op::Parameter { index, .. } = program.node(v).op {
                    // A donated input still held.
                    classify(&mut breakdown, index, bytes);
                } else if working(v) {
                    breakdown.temporaries += bytes;
                } else {
                    breakdown.activations_kept += bytes;
                }
            }
            peak_value = (walk.live.iter())
                .filter(|&&(v, _)| !matches!(program.node(v).op, Op::Parameter { .. }))
                .max_by_key(|&&(v, bytes)| (bytes, std::cmp::Reverse(v.index())))
                .map(|&(v, _)| {
                    let location = program.node(v).location;
                    (v, (location != Location::synthetic()).then_some(location))
                });
        }
        MemoryAnalysis {
            peak_bytes: breakdown.total(),
            breakdown,
            peak_node: peak,
            peak_value,
            timeline: walk.held.iter().map(|&h| inputs + h).collect(),
            in_flight_bytes: in_flight(program),
        }
    }
}

/// [`MemoryAnalysis::in_flight_bytes`] of `program`, its control flow's regions
/// included.
fn in_flight(program: &Program) -> usize {
    let mut largest = BTreeMap::new();
    largest_operands(program, &mut largest);
    largest.values().sum()
}

/// Raises `largest[axes]` to the bytes of every operand `program` posts to a collective
/// over `axes` (of more than one device), recursively through regions.
fn largest_operands<'p>(program: &'p Program, largest: &mut BTreeMap<&'p [String], usize>) {
    for node in &program.nodes {
        if let Op::Flow { flow, result: 0 } = &node.op {
            for region in flow.regions() {
                largest_operands(region, largest);
            }
        }
        let Some(group) = node.op.collective_group().filter(|g| g.size > 1) else {
            continue;
        };
        let operands = node.operands.iter();
        let bytes = operands.map(|&o| program.ty(o).size_in_bytes()).sum();
        let entry = largest.entry(&group.axes[..]).or_default();
        *entry = (*entry).max(bytes);
    }
}

impl fmt::Display for MemoryAnalysis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.breakdown;
        writeln!(f, "peak memory per device: {}", bytes(self.peak_bytes))?;
        writeln!(f, "  parameters       {}", bytes(b.parameters))?;
        writeln!(f, "  optimizer state  {}", bytes(b.optimizer_state))?;
        writeln!(f, "  activations kept {}", bytes(b.activations_kept))?;
        write!(f, "  temporaries      {}", bytes(b.temporaries))?;
        if self.in_flight_bytes > 0 {
            let held = bytes(self.in_flight_bytes);
            write!(
                f,
                "\n  (+ up to {held} of collective operands a slower peer still reads)"
            )?;
        }
        if let Some(p) = self.peak_node {
            write!(f, "\nreached at {p}")?;
        }
        if let Some((v, location)) = self.peak_value {
            write!(f, "; largest value live there: {v}")?;
            if let Some(location) = location {
                write!(f, " ({location})")?;
            }
        }
        Ok(())
    }
}

/// `n` bytes in the largest binary unit that keeps it at least 1.
pub(crate) fn bytes(n: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}
