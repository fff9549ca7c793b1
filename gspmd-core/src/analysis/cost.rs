//! Cost analysis of a per-device program: the floating-point operations each device
//! does, by op kind, the bytes it receives in each kind of collective, and the step
//! time these give on a [`DeviceModel`].
//!
//! Counting rules (per device, on the per-device program's local shapes):
//! - `dot_general`: 2 x (result elements) x (contracted elements per result element),
//!   i.e. `2*M*N*K` for an `[M, K] x [K, N]` product;
//! - `convolution`: 2 x (result elements) x (kernel elements per output feature);
//! - elementwise ops (unary, binary, compare, select): 1 per result element;
//! - ops on `i32` and `bool` values only (index arithmetic, masks): 0; f32, bf16 and
//!   f16 count alike (a TPU's bf16 matmul is its peak rate);
//! - `reduce`, `cumulative`: 1 per operand element; `reduce_window`: 1 per result
//!   element per window element; `argsort`: `n log2 n` comparisons per sorted row of
//!   `n`; `scatter_add`: 1 per update element;
//! - data movement (reshape, transpose, slice, gather, scatter, broadcast, ...),
//!   conversions, random bits and axis indices: 0;
//! - collectives: 0 FLOPs (their combining arithmetic is part of their communication
//!   time); their counts and bytes are those the partitioner's report
//!   gives ([`CollectiveStats`](crate::partition::CollectiveStats): [`bytes_received`](crate::partition::bytes_received),
//!   the bytes one device receives, ring algorithms; each counted as often as it runs,
//!   [`Runs`](crate::partition::Runs)), leaving out those that move no data;
//! - control flow: a `scan` body counts `length` times, a `while` body and condition
//!   once (the trip count is a run-time value), a `cond` its costlier branch in FLOPs
//!   and both branches in collectives (as [`Runs`](crate::partition::Runs) counts them: an upper bound).
//!
//! Times: the compute runs at the device's sustained FLOP rate, each collective takes
//! its latency plus its transfer time on the device's interconnect
//! ([`DeviceModel::collective_seconds`]); a step is the two in sequence
//! ([`Overlap::None`]), the program scheduled on a compute and a communication stream
//! ([`Overlap::Scheduled`]: collectives hidden behind the compute that does not depend
//! on them, as XLA's asynchronous collectives and latency-hiding scheduler do; see
//! `analysis/schedule.rs` for what is modelled and what not), or the larger of the two
//! ([`Overlap::Full`]: a lower bound).

use std::collections::BTreeMap;
use std::fmt;

use super::DeviceModel;
use super::schedule::span;
use crate::ir::{
    CollectiveKind, Flow, Node, Op, Program, ScatterKind, distinct_flows, num_elements,
};
use crate::partition::{bytes_received, visit_collectives};
use crate::sharding::Mesh;

/// What one device does in one run of a per-device program (see the module docs), and
/// the time that takes on a [`DeviceModel`].
#[derive(Debug, Clone, PartialEq)]
pub struct CostAnalysis {
    /// Floating-point operations by op name (`dot_general`, `add`, ...).
    pub flops: BTreeMap<&'static str, u64>,
    /// Collectives by kind: how many run (a scan body's once per iteration, [`Runs`](crate::partition::Runs))
    /// and the bytes one device receives in them; collectives that move no data are left
    /// out.
    pub collectives: BTreeMap<CollectiveKind, (usize, usize)>,
    /// The device the times are for.
    pub device: DeviceModel,
    /// `total_flops` over the device's sustained rate
    /// ([`DeviceModel::sustained_flops_per_second`]).
    pub compute_seconds: f64,
    /// Each collective's latency plus its transfer time on the device's interconnect
    /// ([`DeviceModel::collective_seconds`]), summed over every run.
    pub communication_seconds: f64,
    /// `communication_seconds` by collective kind (the keys of `collectives`).
    pub communication_by_kind: BTreeMap<CollectiveKind, f64>,
    /// The step under [`Overlap::Scheduled`].
    pub scheduled_seconds: f64,
}

/// How a step's collectives share time with its compute (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Overlap {
    /// None: every collective runs after the compute before it, the compute waits:
    /// compute plus communication.
    None,
    /// The program scheduled on one compute and one communication stream, each op
    /// waiting only for its operands and its stream.
    Scheduled,
    /// All of the communication hidden: the larger of compute and communication.
    Full,
}

impl CostAnalysis {
    /// The cost of `program`, partitioned for `mesh`, on `device`.
    pub fn of(program: &Program, mesh: &Mesh, device: &DeviceModel) -> Self {
        let count = Count::of(program);
        let total: u64 = count.flops.values().sum();
        let mut collectives: BTreeMap<CollectiveKind, (usize, usize)> = BTreeMap::new();
        let mut communication_by_kind: BTreeMap<CollectiveKind, f64> = BTreeMap::new();
        visit_collectives(program, "", &mut |_, runs, program, v| {
            let node = program.node(v);
            let bytes = bytes_received(program, node, mesh);
            let Some(kind) = node.op.collective_kind().filter(|_| bytes > 0) else {
                return;
            };
            let entry = collectives.entry(kind).or_default();
            entry.0 += runs.times;
            entry.1 += runs.times * bytes;
            let seconds = runs.times as f64 * device.collective_run_seconds(&node.op, mesh, bytes);
            *communication_by_kind.entry(kind).or_default() += seconds;
        });
        let communication_seconds = communication_by_kind.values().fold(0.0, |a, b| a + b);
        CostAnalysis {
            scheduled_seconds: span(program, mesh, device),
            compute_seconds: total as f64 / device.sustained_flops_per_second(),
            communication_seconds,
            communication_by_kind,
            flops: count.flops,
            collectives,
            device: device.clone(),
        }
    }

    /// All floating-point operations of one device.
    pub fn total_flops(&self) -> u64 {
        self.flops.values().sum()
    }

    /// All bytes one device receives.
    pub fn bytes_received(&self) -> usize {
        self.collectives.values().map(|c| c.1).sum()
    }

    /// The estimated time of one run under `overlap`.
    pub fn step_seconds(&self, overlap: Overlap) -> f64 {
        match overlap {
            Overlap::None => self.compute_seconds + self.communication_seconds,
            Overlap::Scheduled => self.scheduled_seconds,
            Overlap::Full => self.compute_seconds.max(self.communication_seconds),
        }
    }
}

/// FLOPs of a program and its regions.
#[derive(Debug, Clone, Default)]
struct Count {
    flops: BTreeMap<&'static str, u64>,
}

impl Count {
    fn of(program: &Program) -> Count {
        let mut count = Count::default();
        for node in &program.nodes {
            let flops = node_flops(program, node);
            if flops > 0 {
                let slot = count.flops.entry(node.op.name()).or_default();
                *slot = slot.saturating_add(flops);
            }
        }
        for (_, flow) in distinct_flows(program) {
            count.add(&flow_count(flow), 1);
        }
        count
    }

    /// Adds `other` `times` times.
    fn add(&mut self, other: &Count, times: usize) {
        for (&kind, &flops) in &other.flops {
            let slot = self.flops.entry(kind).or_default();
            *slot = slot.saturating_add(flops.saturating_mul(times as u64));
        }
    }

    fn total_flops(&self) -> u64 {
        self.flops.values().sum()
    }
}

/// One run of a control-flow instance (see the module docs).
fn flow_count(flow: &Flow) -> Count {
    let mut count = Count::default();
    match flow {
        Flow::Scan { body, length, .. } => count.add(&Count::of(body), *length),
        Flow::Manual { body, .. } => count.add(&Count::of(body), 1),
        Flow::While { cond, body } => {
            count.add(&Count::of(cond), 1);
            count.add(&Count::of(body), 1);
        }
        Flow::Cond { on_true, on_false } => {
            let (t, f) = (Count::of(on_true), Count::of(on_false));
            count.add(
                if t.total_flops() >= f.total_flops() {
                    &t
                } else {
                    &f
                },
                1,
            );
        }
    }
    count
}

/// The floating-point operations of one node (see the module docs): one rule per op
/// kind, no default, so that a new op needs its own.
pub(super) fn node_flops(program: &Program, node: &Node) -> u64 {
    let out = num_elements(&node.ty.shape) as u64;
    let operand = |k: usize| {
        node.operands
            .get(k)
            .map_or(&[][..], |&o| &program.ty(o).shape[..])
    };
    // Index arithmetic (i32) and masks (bool) do no floating-point operation; f32, bf16
    // and f16 values all count.
    let floating =
        node.ty.dtype.is_float() || (node.operands.iter()).any(|&o| program.ty(o).dtype.is_float());
    if !floating {
        return 0;
    }
    match &node.op {
        Op::DotGeneral(dims) => {
            let lhs = operand(0);
            let k: u64 = (dims.lhs_contracting.iter())
                .map(|&d| lhs.get(d).copied().unwrap_or(1) as u64)
                .product();
            2 * out * k
        }
        Op::Convolution(config) => {
            let kernel = operand(1);
            let outputs = kernel.get(config.dims.kernel_output_feature).copied();
            let per_output = num_elements(kernel) / outputs.unwrap_or(1).max(1);
            2 * out * per_output as u64
        }
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select => out,
        Op::Reduce { .. } | Op::Cumulative { .. } => num_elements(operand(0)) as u64,
        Op::ReduceWindow { window, .. } => {
            out * window.iter().map(|w| w.size as u64).product::<u64>()
        }
        // A comparison sort: `n log2 n` comparisons along the sorted dim.
        Op::Argsort { dim, .. } => {
            let n = operand(0).get(*dim).copied().unwrap_or(1).max(1) as u64;
            num_elements(operand(0)) as u64 * u64::from(n.next_power_of_two().trailing_zeros())
        }
        // One addition per update element; a replacing scatter only moves data.
        Op::Scatter { kind, .. } => match kind {
            ScatterKind::Add => num_elements(operand(2)) as u64,
            ScatterKind::Replace => 0,
        },
        // Data movement, conversions, identities and inputs: no arithmetic.
        Op::Parameter { .. }
        | Op::Constant(_)
        | Op::Iota { .. }
        | Op::Convert(_)
        | Op::Broadcast { .. }
        | Op::Reshape(_)
        | Op::Transpose(_)
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Concatenate(_)
        | Op::DynamicSlice(_)
        | Op::DynamicUpdateSlice
        | Op::Reverse(_)
        | Op::Gather(_)
        | Op::ShardingConstraint
        | Op::PropagationBarrier(_) => 0,
        // Random bits are integer hashing (threefry), and an axis index an integer.
        Op::RandomBits { .. } | Op::AxisIndex(_) => 0,
        // Collectives: their combining arithmetic is charged to their communication
        // time (see `DeviceModel::collective_seconds`).
        Op::AllReduce { .. }
        | Op::AllGather { .. }
        | Op::ReduceScatter { .. }
        | Op::AllToAll { .. }
        | Op::CollectivePermute { .. }
        | Op::CollectiveShift { .. } => 0,
        // A control-flow instance's regions count by `flow_count`, once per instance.
        Op::Flow { .. } => 0,
    }
}

impl fmt::Display for CostAnalysis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "per device, one run, on {}:", self.device.name)?;
        for (kind, flops) in &self.flops {
            writeln!(f, "  {kind:>18}: {flops:>16} FLOP")?;
        }
        writeln!(f, "  {:>18}: {:>16} FLOP", "total", self.total_flops())?;
        for (kind, (n, bytes)) in &self.collectives {
            writeln!(f, "  {kind:>18}: {n:>4} x, {bytes:>12} bytes received")?;
        }
        writeln!(
            f,
            "  compute {:.3} ms, communication {:.3} ms",
            1e3 * self.compute_seconds,
            1e3 * self.communication_seconds
        )?;
        write!(
            f,
            "  step {:.3} ms without overlap, {:.3} ms scheduled, {:.3} ms fully overlapped",
            1e3 * self.step_seconds(Overlap::None),
            1e3 * self.step_seconds(Overlap::Scheduled),
            1e3 * self.step_seconds(Overlap::Full)
        )
    }
}
