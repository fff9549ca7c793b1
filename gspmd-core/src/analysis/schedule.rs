//! The overlap model: a per-device program scheduled on one compute stream and one
//! communication stream, each op starting once its operands are ready and its stream
//! is free, the span of the whole the step time under [`Overlap::Scheduled`].
//!
//! What it models of XLA on TPU (its `async_collective_creator` turns all-gather,
//! reduce-scatter, all-reduce, collective-permute and all-to-all into asynchronous
//! start/done pairs, and its latency-hiding scheduler moves independent compute between
//! a start and its done, by default with at most one collective of a kind in flight):
//! - every collective is asynchronous: it starts when its operands are ready and the
//!   communication stream is free, and takes its latency plus its transfer time
//!   ([`DeviceModel::collective_seconds`]); one collective is in flight at a time (the
//!   links are shared, so two would not move bytes faster);
//! - compute ops run one at a time, each at the sustained FLOP rate, and an op waits
//!   only for its operands: independent compute runs while a collective is in flight
//!   (greedy list scheduling: whenever a stream is free, the op that can start earliest,
//!   ties broken by program order, which is what moving compute between start and done
//!   achieves);
//! - ops without FLOPs (data movement, conversions, inputs) take no time;
//! - a control-flow instance runs alone: it starts when its operands are ready and both
//!   streams are free, and takes its regions' own schedules: a scan's body `length`
//!   times (each iteration after the last: nothing overlaps across iterations), a
//!   `while`'s condition and body once (the trip count is a run-time value, as the
//!   FLOP count takes it), a `cond`'s longer branch, a `shard_map` body once.
//!
//! Not modelled: XLA's collective pipeliner (a scan's weight all-gather issued one
//! iteration ahead, its reduce-scatter finished one behind, so that they overlap the
//! neighbouring iterations' compute), the scheduler's memory limit (which can keep a
//! collective from starting early), several collectives of different kinds in flight at
//! once, and the memory-bound time of ops without FLOPs.

use std::collections::HashMap;

use super::DeviceModel;
use super::cost::node_flops;
use crate::ir::{Flow, Op, Program};
use crate::partition::bytes_received;
use crate::sharding::Mesh;

/// The stream an op runs on, and for how long.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// No time: done when its operands are.
    Free,
    Compute(f64),
    Communication(f64),
    /// A control-flow instance: both streams.
    Both(f64),
}

/// Seconds from the start of `program` (its inputs ready) until its last op is done,
/// scheduled on `device` (see the module docs).
pub(crate) fn span(program: &Program, mesh: &Mesh, device: &DeviceModel) -> f64 {
    let n = program.nodes.len();
    let rate = device.sustained_flops_per_second();
    // The first node of each control-flow instance runs it; its other result nodes
    // wait for that one.
    let mut instance: HashMap<*const Flow, usize> = HashMap::new();
    let mut deps: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut work: Vec<Work> = Vec::with_capacity(n);
    for (i, node) in program.nodes.iter().enumerate() {
        let mut d: Vec<usize> = node.operands.iter().map(|o| o.index()).collect();
        let w = match &node.op {
            Op::Flow { flow, .. } => match instance.get(&std::sync::Arc::as_ptr(flow)) {
                Some(&first) => {
                    d.push(first);
                    Work::Free
                }
                None => {
                    instance.insert(std::sync::Arc::as_ptr(flow), i);
                    Work::Both(flow_seconds(flow, mesh, device))
                }
            },
            op if op.is_collective() => {
                let bytes = bytes_received(program, node, mesh);
                if bytes == 0 {
                    Work::Free
                } else {
                    Work::Communication(device.collective_run_seconds(op, mesh, bytes))
                }
            }
            _ => match node_flops(program, node) {
                0 => Work::Free,
                flops => Work::Compute(flops as f64 / rate),
            },
        };
        deps.push(d);
        work.push(w);
    }
    list_schedule(&deps, &work)
}

/// One run of a control-flow instance, its regions scheduled on their own.
fn flow_seconds(flow: &Flow, mesh: &Mesh, device: &DeviceModel) -> f64 {
    let region = |p: &Program| span(p, mesh, device);
    match flow {
        Flow::Scan { body, length, .. } => *length as f64 * region(body),
        Flow::Manual { body, .. } => region(body),
        Flow::While { cond, body } => region(cond) + region(body),
        Flow::Cond { on_true, on_false } => region(on_true).max(region(on_false)),
    }
}

/// The span of ops `work` with dependencies `deps` (earlier ops only), greedily
/// scheduled: repeatedly, of the ops whose dependencies are done, the one that can
/// start earliest on its stream (ties: the earliest in order) is started.
fn list_schedule(deps: &[Vec<usize>], work: &[Work]) -> f64 {
    let n = work.len();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut waiting: Vec<usize> = vec![0; n];
    for (i, d) in deps.iter().enumerate() {
        waiting[i] = d.len();
        for &j in d {
            users[j].push(i);
        }
    }
    let mut done = vec![0.0f64; n];
    // Ops whose dependencies are all done, with the time they are ready.
    let mut ready: Vec<(usize, f64)> = (0..n)
        .filter(|&i| waiting[i] == 0)
        .map(|i| (i, 0.0))
        .collect();
    let (mut compute, mut communication) = (0.0f64, 0.0f64);
    let mut end = 0.0f64;
    while !ready.is_empty() {
        let start_of = |&(i, at): &(usize, f64)| match work[i] {
            Work::Free => at,
            Work::Compute(_) => at.max(compute),
            Work::Communication(_) => at.max(communication),
            Work::Both(_) => at.max(compute).max(communication),
        };
        let (k, start) = (ready.iter().enumerate())
            .map(|(k, r)| (k, start_of(r), r.0))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)))
            .map(|(k, start, _)| (k, start))
            .expect("not empty");
        let (i, _) = ready.swap_remove(k);
        let finish = match work[i] {
            Work::Free => start,
            Work::Compute(t) => {
                compute = start + t;
                compute
            }
            Work::Communication(t) => {
                communication = start + t;
                communication
            }
            Work::Both(t) => {
                compute = start + t;
                communication = compute;
                compute
            }
        };
        done[i] = finish;
        end = end.max(finish);
        for &u in &users[i] {
            waiting[u] -= 1;
            if waiting[u] == 0 {
                let at = deps[u].iter().map(|&d| done[d]).fold(0.0, f64::max);
                ready.push((u, at));
            }
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain (compute, its all-reduce, compute on the result): nothing to overlap,
    /// the span is the sum.
    #[test]
    fn a_chain_does_not_overlap() {
        let work = [
            Work::Compute(2.0),
            Work::Communication(3.0),
            Work::Compute(1.0),
        ];
        let deps = [vec![], vec![0], vec![1]];
        assert_eq!(list_schedule(&deps, &work), 6.0);
    }

    /// A matmul independent of an all-reduce runs while it is in flight: the span is
    /// the longer of the two, whichever comes first in the program.
    #[test]
    fn an_independent_product_hides_an_all_reduce() {
        let deps = [vec![], vec![], vec![0]];
        let work = [Work::Free, Work::Compute(5.0), Work::Communication(3.0)];
        assert_eq!(list_schedule(&deps, &work), 5.0);
        let work = [Work::Free, Work::Compute(2.0), Work::Communication(3.0)];
        assert_eq!(list_schedule(&deps, &work), 3.0);
        // Its user waits for it: compute 2 + its all-reduce 3 beside the other
        // product's 4, then 1 on the reduced value.
        let deps = [vec![], vec![0], vec![], vec![1], vec![]];
        let work = [
            Work::Compute(2.0),
            Work::Communication(3.0),
            Work::Compute(4.0),
            Work::Compute(1.0),
            Work::Free,
        ];
        assert_eq!(list_schedule(&deps, &work), 7.0);
    }

    /// One collective at a time, and a control-flow instance waits for both streams.
    #[test]
    fn collectives_queue_and_loops_run_alone() {
        let deps = [vec![], vec![], vec![]];
        let work = [
            Work::Communication(2.0),
            Work::Communication(2.0),
            Work::Compute(1.0),
        ];
        assert_eq!(list_schedule(&deps, &work), 4.0);
        let deps = [vec![], vec![], vec![1]];
        let work = [
            Work::Communication(2.0),
            Work::Compute(1.0),
            Work::Both(3.0),
        ];
        assert_eq!(list_schedule(&deps, &work), 5.0);
    }
}
