//! Cost analysis of a per-device program: the floating-point operations each device
//! does, by op kind, the bytes it receives in each kind of collective, and the step
//! time these give on a [`DeviceModel`].
//!
//! Counting rules (per device, on the per-device program's local shapes):
//! - `dot_general`: 2 x (result elements) x (contracted elements per result element),
//!   i.e. `2*M*N*K` for an `[M, K] x [K, N]` product;
//! - `convolution`: 2 x (result elements) x (kernel elements per output feature);
//! - elementwise ops (unary, binary, compare, select): 1 per result element;
//! - ops on `i32` and `bool` values only (index arithmetic, masks): 0;
//! - `reduce`, `cumulative`: 1 per operand element; `reduce_window`: 1 per result
//!   element per window element;
//! - data movement (reshape, transpose, slice, gather, broadcast, ...) and conversions:
//!   0;
//! - collectives: 0 FLOPs; their counts and bytes are those the partitioner's report
//!   gives ([`CollectiveStats`]: [`bytes_received`](crate::partition::bytes_received),
//!   the bytes one device receives, ring algorithms; each counted as often as it runs,
//!   [`Runs`](crate::partition::Runs)), leaving out those that move no data;
//! - control flow: a `scan` body counts `length` times, a `while` body and condition
//!   once (the trip count is a run-time value), a `cond` its costlier branch in FLOPs
//!   and both branches in collectives (as [`Runs`](crate::partition::Runs) counts them: an upper bound).

use std::collections::BTreeMap;
use std::fmt;

use crate::ir::{CollectiveKind, DType, Flow, Node, Op, Program, distinct_flows, num_elements};
use crate::partition::CollectiveStats;
use crate::sharding::Mesh;

/// What one device can do: the figures a step time is estimated from.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceModel {
    /// A name for reports.
    pub name: String,
    /// Peak floating-point operations per second of one device.
    pub flops_per_second: f64,
    /// Bytes per second one device receives over its links in a collective.
    pub link_bytes_per_second: f64,
    /// Fixed cost of one collective, in seconds (synchronisation, start-up).
    pub collective_latency: f64,
}

impl DeviceModel {
    /// One thread-mesh device on this project's build machines, as measured (see
    /// `shared/FACTS.md`, 2026-11-29): single-thread f32 matmul at 70–77 GFLOP/s (75
    /// taken), collectives moving data through memory at memcpy speed, 11–13 GB/s (12
    /// taken), and a rendezvous of 8 threads costing 50–65 µs (55 taken).
    pub fn this_machine() -> Self {
        DeviceModel {
            name: "this machine (one thread per device)".into(),
            flops_per_second: 75e9,
            link_bytes_per_second: 12e9,
            collective_latency: 55e-6,
        }
    }

    /// One TPUv3 core (the paper's device). Google Cloud's TPU v3 documentation
    /// (cloud.google.com/tpu/docs/v3): 123 teraflops (bf16) peak per chip of two
    /// TensorCores, so 61.5 TFLOP/s per core; 340 TB/s all-reduce bandwidth per pod of
    /// 1024 chips, so 166 GB/s per core (the ICI of Norrie et al. 2021, "The Design
    /// Process for Google's Training Chips: TPUv2 and TPUv3", IEEE Micro). The latency
    /// per collective, 10 µs, is an assumption: no public figure.
    pub fn tpu_v3_core() -> Self {
        DeviceModel {
            name: "TPUv3 core".into(),
            flops_per_second: 123e12 / 2.0,
            link_bytes_per_second: 340e12 / 2048.0,
            collective_latency: 10e-6,
        }
    }
}

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
    /// `total_flops / flops_per_second`.
    pub compute_seconds: f64,
    /// Each collective's latency plus its bytes over the link bandwidth, summed.
    pub communication_seconds: f64,
}

impl CostAnalysis {
    /// The cost of `program`, partitioned for `mesh`, on `device`.
    pub fn of(program: &Program, mesh: &Mesh, device: &DeviceModel) -> Self {
        let count = Count::of(program);
        let total: u64 = count.flops.values().sum();
        let collectives = CollectiveStats::moving_data(program, mesh).by_kind;
        let (runs, bytes): (usize, usize) =
            (collectives.values()).fold((0, 0), |(n, b), &(m, c)| (n + m, b + c));
        CostAnalysis {
            compute_seconds: total as f64 / device.flops_per_second,
            communication_seconds: runs as f64 * device.collective_latency
                + bytes as f64 / device.link_bytes_per_second,
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

    /// The estimated time of one run: compute then communication one after the other
    /// (`overlap == false`), or overlapped perfectly (the larger of the two).
    pub fn step_seconds(&self, overlap: bool) -> f64 {
        if overlap {
            self.compute_seconds.max(self.communication_seconds)
        } else {
            self.compute_seconds + self.communication_seconds
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

/// The floating-point operations of one node (see the module docs).
fn node_flops(program: &Program, node: &Node) -> u64 {
    let out = num_elements(&node.ty.shape) as u64;
    let operand = |k: usize| {
        node.operands
            .get(k)
            .map_or(&[][..], |&o| &program.ty(o).shape[..])
    };
    // Index arithmetic (i32) and masks (bool) do no floating-point operation.
    let floating = node.ty.dtype == DType::F32
        || (node.operands.iter()).any(|&o| program.ty(o).dtype == DType::F32);
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
        _ if !floating => 0,
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select => out,
        Op::Reduce { .. } | Op::Cumulative { .. } => num_elements(operand(0)) as u64,
        Op::ReduceWindow { window, .. } => {
            out * window.iter().map(|w| w.size as u64).product::<u64>()
        }
        _ => 0,
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
            "  step {:.3} ms without overlap, {:.3} ms with",
            1e3 * self.step_seconds(false),
            1e3 * self.step_seconds(true)
        )
    }
}
