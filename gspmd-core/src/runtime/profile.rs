//! Where a run's time goes, node by node: on when the environment variable
//! `GSPMD_PROFILE` is set to anything but `0` when the first node runs, or after
//! [`set_enabled`]`(true)`.
//!
//! When on, the evaluation loop times each node it evaluates — a fusion
//! group's loop at its root, a product, a collective (its wait included), a region's
//! whole flow — and adds the time to a process-wide table keyed by the node's
//! description (op, result type, operand shapes; a group by its members' ops). Every
//! device thread and nested region adds to the same table, so a table after N steps
//! of a training loop on a 1x1 mesh is N steps of that device. [`reset`] clears it
//! (after the warm-up steps), [`report`] reads it. When off, the loop reads one atomic
//! flag a node and times nothing.
//!
//! A flow node's time includes its regions' nodes, which are in the table too: the
//! report marks flows and leaves them out of its total.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crate::ir::{Op, Program, TensorType, ValueId};

use super::plan::{Fusion, Plan};

/// Whether the loop times nodes: [`UNSET`] until the environment is read.
static STATE: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// Whether nodes are timed (see the module docs).
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        UNSET => {
            let on = std::env::var_os("GSPMD_PROFILE").is_some_and(|v| v != "0");
            // A concurrent `set_enabled` wins over the environment.
            let state = if on { ON } else { OFF };
            let _ = STATE.compare_exchange(UNSET, state, Ordering::Relaxed, Ordering::Relaxed);
            STATE.load(Ordering::Relaxed) == ON
        }
        state => state == ON,
    }
}

/// Turns the timing of nodes on or off, whatever `GSPMD_PROFILE` says.
pub fn set_enabled(on: bool) {
    STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
}

/// One kind of node in a [`Report`]: the nodes of one description, summed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Row {
    /// The node's op, result type and operand shapes (see the module docs).
    pub what: String,
    /// How many times such nodes ran.
    pub calls: u64,
    /// Their time together.
    pub total: Duration,
    /// Whether the node is a flow (`while_loop`, `scan`, ...): its time includes its
    /// regions' nodes.
    pub flow: bool,
}

/// The table since the last [`reset`], largest time first.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Report {
    /// The rows, by descending total time.
    pub rows: Vec<Row>,
}

impl Report {
    /// The time of every node but the flows (whose time their regions' nodes count).
    pub fn total(&self) -> Duration {
        self.rows.iter().filter(|r| !r.flow).map(|r| r.total).sum()
    }

    /// The `top` largest rows as a table, per `steps` (1 for totals): microseconds per
    /// step, calls per step, microseconds per call, share of [`Report::total`].
    pub fn table(&self, steps: usize, top: usize) -> String {
        let steps = steps.max(1) as f64;
        let total = self.total().as_secs_f64();
        let mut out = format!(
            "{:>10} {:>7} {:>9} {:>6}  node (per step; {:.0} us in all)\n",
            "us",
            "calls",
            "us/call",
            "share",
            total * 1e6 / steps
        );
        for row in self.rows.iter().take(top) {
            let t = row.total.as_secs_f64();
            let share = if row.flow || total == 0.0 {
                "flow".to_string()
            } else {
                format!("{:.1}%", 100.0 * t / total)
            };
            let _ = writeln!(
                out,
                "{:>10.1} {:>7.1} {:>9.2} {:>6}  {}",
                t * 1e6 / steps,
                row.calls as f64 / steps,
                t * 1e6 / row.calls.max(1) as f64,
                share,
                row.what
            );
        }
        out
    }
}

/// Describes node `i` of `program` as the profile names it.
fn describe(program: &Program, plan: &Plan, i: usize) -> String {
    let node = &program.nodes[i];
    let ty = |t: &TensorType| format!("{:?}{:?}", t.dtype, t.shape).to_lowercase();
    let shapes = |ids: &[ValueId]| {
        let shapes: Vec<String> = (ids.iter())
            .map(|o| format!("{:?}", program.nodes[o.index()].ty.shape))
            .collect();
        shapes.join(" ")
    };
    let step = &plan.steps[i];
    match step.fusion {
        Fusion::Root(k) => {
            let members = plan.groups.get(k).map_or(&[][..], |g| &g.members[..]);
            let ops: Vec<&str> = (members.iter())
                .map(|m| program.nodes[m.index()].op.name())
                .collect();
            format!(
                "fused {} {} <- {} [{}]",
                ops.len(),
                ty(&node.ty),
                shapes(&step.reads),
                ops.join(",")
            )
        }
        Fusion::Accumulate(_) => {
            format!("dot+add {} <- {}", ty(&node.ty), shapes(&step.reads))
        }
        _ => match &node.op {
            Op::DotGeneral(d) => format!(
                "dot_general {} <- {} batch {:?}/{:?} contracting {:?}/{:?}",
                ty(&node.ty),
                shapes(&node.operands),
                d.lhs_batch,
                d.rhs_batch,
                d.lhs_contracting,
                d.rhs_contracting
            ),
            op => format!(
                "{} {} <- {}",
                op.name(),
                ty(&node.ty),
                shapes(&node.operands)
            ),
        },
    }
}

/// A node by its address (in its program's node list): its description is worked out
/// the first time it runs.
type Key = usize;

/// One node's times.
struct Entry {
    what: String,
    flow: bool,
    calls: u64,
    total: Duration,
}

static TABLE: Mutex<Option<HashMap<Key, Entry>>> = Mutex::new(None);

/// Times one node's evaluation, from [`Timer::start`] to its drop.
pub(crate) struct Timer<'a> {
    program: &'a Program,
    plan: &'a Plan,
    i: usize,
    started: Instant,
}

impl<'a> Timer<'a> {
    /// A timer for node `i` of `program` if nodes are timed ([`enabled`]).
    #[inline]
    pub(crate) fn start(program: &'a Program, plan: &'a Plan, i: usize) -> Option<Self> {
        enabled().then(|| Timer {
            program,
            plan,
            i,
            started: Instant::now(),
        })
    }
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        let node = &self.program.nodes[self.i];
        let key: Key = std::ptr::from_ref(node) as usize;
        let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        let entry = (table.get_or_insert_with(HashMap::new).entry(key)).or_insert_with(|| Entry {
            what: describe(self.program, self.plan, self.i),
            flow: matches!(node.op, Op::Flow { .. }),
            calls: 0,
            total: Duration::ZERO,
        });
        entry.calls += 1;
        entry.total += elapsed;
    }
}

/// Clears the table (say after a training loop's warm-up steps).
pub fn reset() {
    *TABLE.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The table since the last [`reset`]: the nodes of one description summed, largest
/// time first (empty if nothing was timed).
pub fn report() -> Report {
    let table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let mut rows: HashMap<(&str, bool), Row> = HashMap::new();
    for e in table.iter().flat_map(HashMap::values) {
        let row = rows.entry((&e.what, e.flow)).or_insert_with(|| Row {
            what: e.what.clone(),
            calls: 0,
            total: Duration::ZERO,
            flow: e.flow,
        });
        row.calls += e.calls;
        row.total += e.total;
    }
    let mut rows: Vec<Row> = rows.into_values().collect();
    rows.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.what.cmp(&b.what)));
    Report { rows }
}
