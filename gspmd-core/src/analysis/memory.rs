//! Memory analysis of a per-device program: what one device holds while it runs, node
//! by node, before anything runs.
//!
//! The walk follows the runtime's execution plan ([`Plan`]: which values each node
//! drops, which operands it takes over, which broadcasts are views) and the runtime's
//! buffer reuse, so that it predicts what the evaluation loop allocates:
//!
//! - inputs (parameters) are held by the caller for the whole step (resident weights
//!   and optimizer state, data); constants live in the program; neither is allocated
//!   by the run;
//! - a deferred broadcast is a view of its operand: no buffer (its operand lives while
//!   it is read);
//! - an elementwise op (unary, binary, select, convert to the same dtype, a sharding
//!   constraint) that takes over an operand of its result's type writes its result
//!   into that operand's buffer: no new buffer;
//! - a fusion group's loop computes all its results at its root: each result (in
//!   node order) writes into the buffer of the next leaf it takes over that it may
//!   write in place, else into a new buffer;
//! - every other node allocates its result while its operands are held, and a
//!   collective whose operand is not taken over copies it first;
//! - a convolution also holds its im2col scratch while it runs: its operands in a
//!   canonical layout and the patch matrix, often several times its result;
//! - a control-flow instance copies its operands, runs its regions (each region's own
//!   peak, recursively), and holds all its results until their nodes take them.
//!
//! Other scratch space inside kernels is not counted.
//!
//! The device's buffer pool (free buffers a run keeps for reuse, see
//! `runtime::buffers`) holds no live value and is not counted in the timeline, but it
//! is memory: the evaluation loop keeps its live values and the pooled buffers together
//! within [`MemoryAnalysis::peak_bytes`], leaving free the scratch each node's kernel
//! may need besides. So a device holds at most the peak (plus unmodelled kernel
//! scratch) whether its buffers are pooled or freed, and between runs its pool holds
//! at most the peak less the inputs (`runtime::pooled_bytes` reports it).

use std::collections::BTreeMap;
use std::fmt;

use crate::ir::{ConvConfig, Location, Node, Op, Program, ValueId, num_elements};
use crate::runtime::{Fusion, Plan};

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
    /// The analysis of `program` run by the evaluation loop with `plan` ([`Plan::new`]
    /// of `program`); `is_state(i)` tells whether input `i` is optimizer state.
    pub(crate) fn of(program: &Program, plan: &Plan, is_state: &dyn Fn(usize) -> bool) -> Self {
        let (mut parameters, mut optimizer_state) = (0, 0);
        for (i, &p) in program.params.iter().enumerate() {
            let bytes = program.ty(p).size_in_bytes();
            if is_state(i) {
                optimizer_state += bytes;
            } else {
                parameters += bytes;
            }
        }
        let inputs = parameters + optimizer_state;
        let walk = Walk::of(program, plan);
        let peak = walk.peak;
        let mut breakdown = MemoryBreakdown {
            parameters,
            optimizer_state,
            ..MemoryBreakdown::default()
        };
        let mut peak_value = None;
        if let Some(p) = peak {
            let node = &program.nodes[p.index()];
            let working = |v: ValueId| v == p || node.operands.contains(&v);
            breakdown.temporaries = walk.transient;
            for &(v, bytes) in &walk.live {
                if working(v) {
                    breakdown.temporaries += bytes;
                } else {
                    breakdown.activations_kept += bytes;
                }
            }
            peak_value = (walk.live.iter())
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

/// What the device's buffer pool knows of a run of `program` with `plan` (see
/// [`buffers`](crate::runtime::buffers)): its budget ([`Plan::budget`]: the analysis's
/// peak, its computed bytes plus the inputs) and, for each node, the bytes held as the
/// analysis models them, inputs included (each step's `held`): while
/// the node runs (its result included, its kernel's scratch not) and once it has
/// dropped what it drops.
pub(crate) fn pool_model(program: &Program, plan: &Plan) -> (usize, Vec<[usize; 2]>) {
    let inputs: usize = (program.params.iter())
        .map(|&p| program.ty(p).size_in_bytes())
        .sum();
    let walk = Walk::of(program, plan);
    let held = (walk.buffers.iter())
        .map(|&[during, after]| [inputs + during, inputs + after])
        .collect();
    (walk.max + inputs, held)
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

/// The liveness walk of one program: computed bytes only (inputs excluded).
struct Walk {
    /// For each node: the computed bytes held while it runs.
    held: Vec<usize>,
    /// For each node: the computed bytes in buffers (no copies) while it runs and once
    /// it has dropped what it drops.
    buffers: Vec<[usize; 2]>,
    /// The first node with the most bytes held.
    peak: Option<ValueId>,
    /// The most computed bytes held at once.
    max: usize,
    /// At the peak: the copies the node makes and the results of control flow waiting
    /// for their nodes.
    transient: usize,
    /// At the peak: the computed values holding a buffer, with their bytes (a value
    /// written in place of its operand holds the operand's buffer).
    live: Vec<(ValueId, usize)>,
}

impl Walk {
    fn of(program: &Program, plan: &Plan) -> Walk {
        let n = program.nodes.len();
        // The bytes of the buffer each value holds now (0: none, or lent).
        let mut buffer = vec![0usize; n];
        // Whether the loop owns the value (it computed it): only then can a node take
        // it over.
        let mut owned = vec![false; n];
        let mut live = 0usize;
        // Results of flow instances computed and not yet taken by their nodes.
        let mut pending: Vec<Option<Vec<usize>>> = vec![None; plan.flows.len()];
        let mut pending_bytes = 0usize;
        let mut walk = Walk {
            held: Vec::with_capacity(n),
            buffers: Vec::with_capacity(n),
            peak: None,
            max: 0,
            transient: 0,
            live: Vec::new(),
        };
        for (i, (node, step)) in program.nodes.iter().zip(&plan.steps).enumerate() {
            if matches!(step.fusion, Fusion::Inside | Fusion::Result | Fusion::Alias) {
                // Computed by its group's loop at the root, or read as its operand.
                walk.held.push(live + pending_bytes);
                walk.buffers.push([live + pending_bytes; 2]);
                continue;
            }
            let read_bytes = |k: usize| program.ty(step.reads[k]).size_in_bytes();
            let taken = |k: usize| step.hand_over[k] && owned[step.reads[k].index()];
            let mut copies = 0;
            // Whether the node computes a value into a buffer, and the read value whose
            // buffer it takes over.
            let (mut computed, mut reuse) = (false, None);
            match (&node.op, step.flow, step.fusion) {
                (Op::Parameter { .. } | Op::Constant(_), _, _) => {}
                _ if step.deferred => {}
                (_, _, Fusion::Root(k)) => {
                    // Each result in order takes the buffer of the next leaf handed
                    // over that the loop writes in place, else a new one (as
                    // `Group::run` does).
                    let group = &plan.groups[k];
                    let in_place: Vec<usize> = (0..step.reads.len())
                        .filter(|&j| taken(j) && group.writes_in_place(j))
                        .map(|j| step.reads[j].index())
                        .collect();
                    let mut leaves = in_place.into_iter();
                    for r in &group.results {
                        let r = r.index();
                        buffer[r] = match leaves.next() {
                            Some(leaf) => std::mem::take(&mut buffer[leaf]),
                            None => {
                                live += plan.steps[r].bytes;
                                plan.steps[r].bytes
                            }
                        };
                        owned[r] = true;
                    }
                }
                (Op::Flow { flow, result }, Some(instance), _) => {
                    let flow_plan = &plan.flows[instance];
                    if pending[instance].is_none() {
                        let results: Vec<usize> = (flow_plan.results.iter())
                            .map(|&(reads, bytes)| if reads > 0 { bytes } else { 0 })
                            .collect();
                        let regions = flow_plan.regions.iter().zip(flow.regions());
                        let inner = regions
                            .map(|(plan, region)| Walk::of(region, plan).max)
                            .max()
                            .unwrap_or(0);
                        copies = (0..step.reads.len()).map(read_bytes).sum::<usize>() + inner;
                        pending_bytes += results.iter().sum::<usize>();
                        pending[instance] = Some(results);
                    }
                    let slot = pending[instance].as_mut().and_then(|r| r.get_mut(*result));
                    let bytes = slot.map_or(0, std::mem::take);
                    pending_bytes -= bytes;
                    buffer[i] = bytes;
                    live += bytes;
                    owned[i] = true;
                }
                (op, _, _) => {
                    reuse = (step.typed)
                        .then(|| in_place_operand(op, node, &step.reads, program, &taken))
                        .flatten();
                    if op.is_collective() && !step.reads.is_empty() && !taken(0) {
                        copies = read_bytes(0);
                    }
                    if let Op::Convolution(config) = op {
                        copies = im2col_bytes(program, node, config);
                    }
                    computed = true;
                }
            }
            if computed {
                match reuse {
                    // The operand's buffer becomes the result's: nothing new.
                    Some(k) => buffer[i] = std::mem::take(&mut buffer[step.reads[k].index()]),
                    None => {
                        buffer[i] = step.bytes;
                        live += step.bytes;
                    }
                }
                owned[i] = true;
            }
            let held = live + copies + pending_bytes;
            if walk.peak.is_none() || held > walk.max {
                walk.peak = Some(ValueId(i as u32));
                walk.max = held;
                walk.transient = copies + pending_bytes;
                walk.live = (0..=i)
                    .filter(|&v| buffer[v] > 0)
                    .map(|v| (ValueId(v as u32), buffer[v]))
                    .collect();
            }
            walk.held.push(held);
            let during = live + pending_bytes;
            for o in &step.drops {
                live -= std::mem::take(&mut buffer[o.index()]);
            }
            walk.buffers.push([during, live + pending_bytes]);
        }
        walk
    }
}

/// An estimate of the scratch space `node`'s kernel may hold besides its operands and
/// result, which the buffer pool leaves free while the node runs (see
/// [`Plan::budget`]): a convolution's im2col buffers, a collective's copy of its
/// operand, the flat positions (an `Option<usize>` per element) of a gather's result or
/// a scatter's updates, a dot's operands regrouped and packed; none for elementwise
/// ops, broadcasts, iotas and control flow (its regions' loops reserve their own); a
/// copy of the operands and of the result for any other op (an operand copied to
/// standard layout, say).
pub(crate) fn kernel_scratch(program: &Program, node: &Node) -> usize {
    let operand = |k: usize| {
        node.operands
            .get(k)
            .map_or(0, |&o| program.ty(o).size_in_bytes())
    };
    let positions = |elements: usize| elements * size_of::<Option<usize>>();
    match &node.op {
        Op::Convolution(config) => im2col_bytes(program, node, config),
        // Its operands regrouped into matrices and packed for the gemm (each at most the
        // operands), its result regrouped back.
        Op::DotGeneral(_) => 2 * (operand(0) + operand(1)) + node.ty.size_in_bytes(),
        op if op.is_collective() => operand(0),
        Op::Gather(_) => positions(num_elements(&node.ty.shape)),
        Op::Scatter { .. } => {
            (node.operands.get(2)).map_or(0, |&u| positions(num_elements(&program.ty(u).shape)))
        }
        Op::Parameter { .. }
        | Op::Constant(_)
        | Op::Iota { .. }
        | Op::Broadcast { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert(_)
        | Op::ShardingConstraint
        | Op::Flow { .. } => 0,
        // A copy of its operands (regrouped, or in standard layout) and of its result.
        _ => (0..node.operands.len()).map(operand).sum::<usize>() + node.ty.size_in_bytes(),
    }
}

/// The scratch the convolution kernel holds besides its result: its operands copied to
/// a canonical layout and the patch matrix (one row per output position, one column
/// per kernel element of an output feature).
fn im2col_bytes(program: &Program, node: &Node, config: &ConvConfig) -> usize {
    let [input, kernel] = [0, 1].map(|k| node.operands.get(k).map(|&o| program.ty(o)));
    let (Some(input), Some(kernel)) = (input, kernel) else {
        return 0;
    };
    let outputs = (kernel.shape.get(config.dims.kernel_output_feature))
        .copied()
        .unwrap_or(1)
        .max(1);
    let rows = num_elements(&node.ty.shape) / outputs;
    let columns = num_elements(&kernel.shape) / outputs;
    input.size_in_bytes() + kernel.size_in_bytes() + rows * columns * node.ty.dtype.size_in_bytes()
}

/// The operand an elementwise kernel overwrites with its result (see the elementwise
/// kernels): the first one of `operands` (what the node reads) taken over (`taken(k)`)
/// whose type is the result's.
fn in_place_operand(
    op: &Op,
    node: &Node,
    operands: &[ValueId],
    program: &Program,
    taken: &dyn Fn(usize) -> bool,
) -> Option<usize> {
    let candidates: &[usize] = match op {
        Op::Unary(_) | Op::Binary(_) | Op::Convert(_) | Op::ShardingConstraint => &[0, 1],
        Op::Select => &[1, 2],
        _ => return None,
    };
    candidates
        .iter()
        .copied()
        .find(|&k| k < operands.len() && taken(k) && program.ty(operands[k]) == &node.ty)
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
