//! What a partitioned program communicates: each collective with its axes and the bytes
//! each device receives, and totals by kind.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::SpmdProgram;
use crate::ir::{CollectiveKind, Flow, Node, Op, Program, ValueId, distinct_flows};
use crate::sharding::Mesh;

/// True if a [`Op::CollectivePermute`] over `receivers` from `senders` (the same axes
/// reordered) moves data between devices on `mesh`: unless the two orders agree once
/// the axes of size 1 are dropped, some device's source is another device.
pub(crate) fn permute_moves_data(mesh: &Mesh, receivers: &[String], senders: &[String]) -> bool {
    let spanning = |axes: &[String]| -> Vec<String> {
        (axes.iter())
            .filter(|a| mesh.axes_size(std::slice::from_ref(*a)) > 1)
            .cloned()
            .collect()
    };
    spanning(receivers) != spanning(senders)
}

/// Bytes one device of `mesh` receives in collective `node` of `program` (ring
/// algorithms for all-reduce; zero for a non-collective), counting only bytes that
/// cross devices. For a collective permute or shift: the bytes of a device that
/// receives from another one; zero when none does (a permute whose senders' order is
/// the receivers', see `permute_moves_data`; a shift where every pair of
/// [`AxisGroup::shift_pairs`](crate::ir::AxisGroup::shift_pairs) keeps its operand: a
/// shift by a multiple of the group size with wrap, by the group size or more without, a
/// mirror of a group of one).
///
/// This is the bytes model every report prints (`bytes/device` on each collective's
/// line, the totals of [`CollectiveStats`], the HTML page, the cost analysis):
///
/// ```
/// use gspmd_core::compile;
/// use gspmd_core::ir::{Builder, DType};
/// use gspmd_core::partition::bytes_received;
/// use gspmd_core::sharding::Mesh;
///
/// let b = Builder::new("product");
/// let x = b.parameter("x", [8, 16], DType::F32).annotate("(_, model)".parse()?);
/// let w = b.parameter("w", [16, 4], DType::F32).annotate("(model, _)".parse()?);
/// let program = b.finish(&[&x.matmul(&w)])?;
/// let mesh = Mesh::new([("model", 4)])?;
/// let exe = compile(&program, &mesh)?;
/// let spmd = exe.spmd();
/// // One all-reduce of the f32[8, 4] partial sums: a ring moves 2 (k-1)/k of them.
/// let bytes: Vec<usize> = (spmd.program.nodes.iter())
///     .filter(|n| n.op.is_collective())
///     .map(|n| bytes_received(&spmd.program, n, &mesh))
///     .collect();
/// assert_eq!(bytes, [2 * 8 * 4 * 4 * 3 / 4]);
/// assert_eq!(spmd.collectives().bytes(), bytes[0]);
/// # Ok::<(), gspmd_core::Error>(())
/// ```
pub fn bytes_received(program: &Program, node: &Node, mesh: &Mesh) -> usize {
    let input = node
        .operands
        .first()
        .map_or(0, |&o| program.ty(o).size_in_bytes());
    let output = node.ty.size_in_bytes();
    let fraction = |k: usize| input * (k.saturating_sub(1)) / k.max(1);
    match &node.op {
        Op::AllGather { .. } => output - input,
        Op::AllReduce { group, .. } => 2 * fraction(group.size),
        Op::ReduceScatter { group, .. } | Op::AllToAll { group, .. } => fraction(group.size),
        Op::CollectivePermute { group, from } if permute_moves_data(mesh, &group.axes, from) => {
            input
        }
        Op::CollectiveShift {
            group,
            offset,
            wrap,
            mirror,
        } => {
            let pairs = group.shift_pairs(*offset, *wrap, *mirror);
            if pairs.iter().any(|(s, t)| s != t) {
                input
            } else {
                0
            }
        }
        _ => 0,
    }
}

/// How often a collective inside control-flow regions runs in one run of the program.
///
/// Counting rules: a `scan` body runs its trip count (`length`) times, nested scans
/// multiply; a `while` loop's trip count is a run-time value, so its cond and body count
/// once and are marked per iteration; both branches of a `cond` count (either may run:
/// an upper bound); a `shard_map` body runs once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runs {
    /// Times per run of the program, or per iteration of the innermost `while` loop
    /// around it when [`per_while_iteration`](Self::per_while_iteration).
    pub times: usize,
    /// Inside a `while` loop: `times` is per iteration of it.
    pub per_while_iteration: bool,
}

impl Runs {
    /// Outside every loop.
    pub const ONCE: Runs = Runs {
        times: 1,
        per_while_iteration: false,
    };

    /// How often a region of `flow` runs when `flow` runs `self` times.
    fn within(self, flow: &Flow) -> Runs {
        match flow {
            Flow::Scan { length, .. } => Runs {
                times: self.times * length,
                ..self
            },
            Flow::While { .. } => Runs {
                per_while_iteration: true,
                ..self
            },
            Flow::Cond { .. } | Flow::Manual { .. } => self,
        }
    }
}

impl std::fmt::Display for Runs {
    /// `x 5 iterations`, `per while iteration`, `x 5 iterations per while iteration`;
    /// nothing for [`Runs::ONCE`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.times != 1 {
            write!(f, "x {} iterations", self.times)?;
        }
        match (self.per_while_iteration, self.times != 1) {
            (true, true) => write!(f, " per while iteration"),
            (true, false) => write!(f, "per while iteration"),
            (false, _) => Ok(()),
        }
    }
}

/// Collectives by kind: how many run in one run of the program, and the bytes each
/// device receives in them — each collective of a region counted as often as the region
/// runs ([`Runs`]: a scan body's trip count times, a while loop's body once, both
/// branches of a cond).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectiveStats {
    /// Kind → (count, bytes received per device).
    pub by_kind: BTreeMap<CollectiveKind, (usize, usize)>,
    /// How many of the counted collectives are inside a `while` loop, counted for one
    /// iteration of it (its trip count is known only at run time).
    pub per_while_iteration: usize,
}

impl CollectiveStats {
    /// Counts the collectives of `program`, partitioned for `mesh`, each as often as it
    /// runs ([`Runs`]).
    pub fn of(program: &Program, mesh: &Mesh) -> Self {
        let mut stats = CollectiveStats::default();
        visit_collectives(program, "", &mut |_, runs, program, v| {
            let node = program.node(v);
            let bytes = bytes_received(program, node, mesh);
            let Some(kind) = node.op.collective_kind() else {
                return;
            };
            let e: &mut (usize, usize) = stats.by_kind.entry(kind).or_default();
            e.0 += runs.times;
            e.1 += runs.times * bytes;
            if runs.per_while_iteration {
                stats.per_while_iteration += runs.times;
            }
        });
        stats
    }

    /// Number of collectives of kind `kind`.
    pub fn count(&self, kind: CollectiveKind) -> usize {
        self.by_kind.get(&kind).map_or(0, |e| e.0)
    }

    /// Bytes each device receives in the collectives of kind `kind`.
    pub fn bytes_of(&self, kind: CollectiveKind) -> usize {
        self.by_kind.get(&kind).map_or(0, |e| e.1)
    }

    /// Total collectives.
    pub fn total(&self) -> usize {
        self.by_kind.values().map(|e| e.0).sum()
    }

    /// Total bytes received per device.
    pub fn bytes(&self) -> usize {
        self.by_kind.values().map(|e| e.1).sum()
    }
}

impl std::fmt::Display for CollectiveStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.by_kind.is_empty() {
            return write!(f, "no collectives");
        }
        for (kind, (n, bytes)) in &self.by_kind {
            writeln!(
                f,
                "{kind:>18}: {n:>4} x, {bytes:>12} bytes received per device"
            )?;
        }
        write!(
            f,
            "{:>18}: {:>4} x, {:>12} bytes received per device",
            "total",
            self.total(),
            self.bytes()
        )?;
        if self.per_while_iteration > 0 {
            write!(
                f,
                "\n{:>18}  ({} of them inside while loops, counted for one iteration: the trip count is known only at run time)",
                "", self.per_while_iteration
            )?;
        }
        Ok(())
    }
}

impl SpmdProgram {
    /// Collective statistics of the per-device program.
    pub fn collectives(&self) -> CollectiveStats {
        CollectiveStats::of(&self.program, &self.mesh)
    }

    /// The per-device program, then one line per collective (axes, bytes per device,
    /// the user's source line; a collective in a region named by the flow op and the
    /// region, with how often it runs, [`Runs`]) followed by a `why (global %N):` line
    /// per reason ([`Node::why`]; its `%N` are the global program's values, the
    /// collective's own `%N` the per-device program's), the totals and the
    /// partitioner's warnings.
    pub fn report(&self) -> String {
        let mut out = format!(
            "// partitioned for {}\n{}\n\ncollectives:\n",
            self.mesh, self.program
        );
        collective_lines(&mut out, &self.program, &self.mesh, "");
        let _ = write!(out, "{}", self.collectives());
        for w in &self.warnings {
            let _ = write!(out, "\nwarning: {w}");
        }
        out
    }
}

/// Appends one line per collective of `program` and of its regions (and its reasons;
/// see [`visit_collectives`]).
fn collective_lines(out: &mut String, program: &Program, mesh: &Mesh, within: &str) {
    visit_collectives(program, within, &mut |within, runs, program, v| {
        let line = collective_line(program, v, mesh);
        let _ = match (runs == Runs::ONCE, line.split_once("  // ")) {
            (false, Some((head, tail))) => write!(out, "  {within}{head}, {runs}  // {tail}"),
            _ => write!(out, "  {within}{line}"),
        };
    });
}

/// Calls `f(within, runs, region, v)` for each collective `v` of `program` and of the
/// regions of its control-flow ops, in program order, each region once, just before its
/// flow op's first result; `within` is the path of flow ops and regions to it, prefixed
/// by `within` (`%7 while body: `), and `runs` how often it runs per run of `program`.
pub(crate) fn visit_collectives<'p>(
    program: &'p Program,
    within: &str,
    f: &mut dyn FnMut(&str, Runs, &'p Program, ValueId),
) {
    visit_runs(program, within, Runs::ONCE, f);
}

/// [`visit_collectives`] for `program` running `runs` times.
fn visit_runs<'p>(
    program: &'p Program,
    within: &str,
    runs: Runs,
    f: &mut dyn FnMut(&str, Runs, &'p Program, ValueId),
) {
    let mut flows = distinct_flows(program).into_iter().peekable();
    for v in program.values() {
        if let Some((_, flow)) = flows.next_if(|&(first, _)| first == v) {
            for (name, region) in flow.region_names().iter().zip(flow.regions()) {
                let path = format!("{within}{v} {} {name}: ", flow.name());
                visit_runs(region, &path, runs.within(flow), f);
            }
        }
        if program.node(v).op.is_collective() {
            f(within, runs, program, v);
        }
    }
}

/// How a report labels a collective's reasons: the collective's own `%N` is a value of
/// the per-device program, the reason's values are the global program's (as printed
/// after propagation, [`crate::Executable::propagated`]), and the label says so.
pub(crate) const WHY_LABEL: &str = "why (global %N):";

/// Collective `v` of `program` partitioned for `mesh`: `%7 all_gather over ["model"]:
/// f32[4,8] -> f32[4,32], 384 bytes/device  // model.rs:12` (`%7` of the per-device
/// program), then a line per reason labelled [`WHY_LABEL`] (its values the global
/// program's).
pub(crate) fn collective_line(program: &Program, v: ValueId, mesh: &Mesh) -> String {
    let node = program.node(v);
    let mut line = format!(
        "{v} {} over {:?}: {} -> {}, {} bytes/device  // {}\n",
        node.op.name(),
        node.op.collective_group().map_or(&[][..], |g| &g.axes[..]),
        program.ty(node.operands[0]),
        node.ty,
        bytes_received(program, node, mesh),
        node.location
    );
    for why in &node.why {
        let _ = writeln!(line, "      {WHY_LABEL} {why}");
    }
    line
}
