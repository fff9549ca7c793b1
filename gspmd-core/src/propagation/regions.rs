//! Regions (GSPMD section 3.5: a loop's state, its body's parameters and its body's
//! results share one sharding; Shardy's data-flow edges).
//!
//! - Across the boundary ([`result_hints`]): each loop body (a `cond`'s `on_true`) is
//!   propagated with its carried parameters open (seeded with the initial values'
//!   shardings); where the region refines a result (a carried value's parameter or
//!   body result, a scan's stacked output, a branch result gets more axes, e.g. from a
//!   `#[shard]` inside), the refinement becomes an open annotation of the result and the
//!   enclosing program is propagated again, until no region refines anything. The
//!   result's sharding then flows to the initial value and to the users like any
//!   annotation. A result the user annotated keeps the user's sharding (the region
//!   reshards to it).
//! - With the boundary fixed ([`propagate_regions`]): a carried value's boundary is
//!   its loop result's sharding (its initial value's when the result is unused); a
//!   region parameter gets its operand's sharding as a closed annotation (a scan's
//!   slice: the stacked operand's without its leading dim) and each carried output of a
//!   body a `sharding_constraint` to the boundary, so the state keeps one sharding
//!   across iterations and the back edge needs no reshard. A `cond`'s `on_false`
//!   outputs are constrained to what propagation gave `on_true`'s.
//! - A manual region (`shard_map`): its boundary is annotated around it (manual axes
//!   fixed, automatic ones free); its body, a per-device program, is propagated with
//!   its parameters and outputs pinned to the automatic axes of its operands and
//!   results, so no body value gets a manual axis and nothing flows back out.

use std::collections::HashMap;
use std::sync::Arc;

use super::propagate;
use crate::error::Result;
use crate::ir::{Flow, Op, Program, ValueId, flow_instances};
use crate::sharding::{DimSharding, Mesh, Sharding};

/// Replaces the regions of every flow op of `propagated` (the propagated copy of
/// `original`, node for node) by their propagated form. Result nodes of one instance
/// keep sharing one `Arc<Flow>`.
pub(super) fn propagate_regions(
    propagated: &mut Program,
    original: &Program,
    mesh: &Mesh,
) -> Result<()> {
    // Keyed by the original's regions, which outlive the loop, so no address is reused.
    let mut done: HashMap<(*const Flow, Vec<Sharding>), Arc<Flow>> = HashMap::new();
    let instances = flow_instances(propagated);
    for v in original.values() {
        let Op::Flow { flow, result } = &original.node(v).op else {
            continue;
        };
        let operands = &propagated.node(v).operands;
        let mut boundary = operand_shardings(propagated, operands);
        let instance = &instances[&(Arc::as_ptr(flow), operands.clone())];
        if let Flow::Manual { body, .. } = &**flow {
            // A manual region's boundary: its operands' shardings, then its results'.
            boundary.extend((0..body.outputs.len()).map(|j| {
                let node = instance.get(j).and_then(|nodes| nodes.first());
                let rank = body.ty(body.outputs[j]).rank();
                (node.and_then(|&r| propagated.node(r).sharding.clone()))
                    .unwrap_or_else(|| Sharding::replicated(rank))
            }));
        }
        for (j, s) in boundary.iter_mut().enumerate().take(carried_count(flow)) {
            let result = instance.get(j).and_then(|nodes| nodes.first());
            if let Some(sharding) = result.and_then(|&r| propagated.node(r).sharding.as_ref()) {
                s.clone_from(sharding);
            }
        }
        let key = (Arc::as_ptr(flow), boundary);
        let flow = match done.get(&key) {
            Some(f) => f.clone(),
            None => {
                let f = Arc::new(propagate_flow(flow, &key.1, mesh)?);
                done.insert(key, f.clone());
                f
            }
        };
        propagated.node_mut(v).op = Op::Flow {
            flow,
            result: *result,
        };
    }
    Ok(())
}

/// The shardings of `operands` (replicated where propagation has not set one).
fn operand_shardings(program: &Program, operands: &[ValueId]) -> Vec<Sharding> {
    (operands.iter())
        .map(|&o| {
            let node = program.node(o);
            (node.sharding.clone()).unwrap_or_else(|| Sharding::replicated(node.ty.rank()))
        })
        .collect()
}

/// How many of `flow`'s results are carried values (which equal some operand's type).
fn carried_count(flow: &Flow) -> usize {
    match flow {
        Flow::While { body, .. } => body.outputs.len(),
        Flow::Scan { carried, .. } => *carried,
        Flow::Cond { .. } | Flow::Manual { .. } => 0,
    }
}

/// Open annotations for flow results that their regions refine. For each flow
/// instance of `program` (propagated without looking into regions) its first region
/// (a loop's body, a `cond`'s `on_true`) is propagated with its carried parameters
/// open, seeded with the initial values' shardings, the other parameters closed at
/// their operands' (captures and slices are what they are). A result's candidates: for
/// a carried value the body's result, then its parameter; for a scan's stacked output
/// the body's output with the stacked dim whole; for a `cond` result `on_true`'s. The
/// first candidate with all of the result's axes and more is returned as an open
/// annotation of the result; for a carried value that no node reads, of its initial
/// value (the operand).
pub(super) fn result_hints(program: &Program, mesh: &Mesh) -> Result<Vec<(ValueId, Sharding)>> {
    let instances = flow_instances(program);
    let mut views: HashMap<(*const Flow, Vec<ValueId>), Program> = HashMap::new();
    let mut hints = Vec::new();
    for v in program.values() {
        let node = program.node(v);
        let Op::Flow { flow, result } = &node.op else {
            continue;
        };
        // A manual region's boundary is annotated around it (`shard_map`'s constraints):
        // nothing flows back out of its body.
        if matches!(**flow, Flow::Manual { .. }) {
            continue;
        }
        let n = carried_count(flow);
        let key = (Arc::as_ptr(flow), node.operands.clone());
        // What to hint: this result node; at an instance's first node also the initial
        // value of each carried value no node reads (the loop state still takes the
        // body's sharding, which the boundary then gets from the initial value).
        let mut targets = vec![(v, *result)];
        if !views.contains_key(&key) {
            let slots = &instances[&key];
            let unread = (0..n).filter(|&j| slots.get(j).is_none_or(Vec::is_empty));
            targets.extend(unread.map(|j| (node.operands[j], j)));
        }
        let region = match views.get(&key) {
            Some(region) => region,
            None => {
                let boundary = operand_shardings(program, &node.operands);
                let (region, params) = match &**flow {
                    Flow::While { body, .. } | Flow::Scan { body, .. } => {
                        (body, slice_params(flow, &boundary))
                    }
                    Flow::Cond { on_true, .. } => (on_true, boundary[1..].to_vec()),
                    Flow::Manual { .. } => continue,
                };
                let mut seeded = region.clone();
                for (i, (&p, s)) in region.params.iter().zip(params).enumerate() {
                    let s = if i < n { opened(&s) } else { s };
                    seeded.node_mut(p).annotation = Some(s);
                }
                views.entry(key).or_insert(propagate(&seeded, mesh)?)
            }
        };
        let of = |v: ValueId| region.node(v).sharding.clone().unwrap_or_default();
        for (target, result) in targets {
            let output = of(region.outputs[result]);
            let candidates = match **flow {
                _ if result < n => vec![output, of(region.params[result])],
                Flow::Scan { .. } => {
                    let mut dims = vec![DimSharding::closed(Vec::<String>::new())];
                    dims.extend(output.dims);
                    vec![Sharding::new(dims)]
                }
                Flow::While { .. } | Flow::Cond { .. } | Flow::Manual { .. } => vec![output],
            };
            let current = program.node(target).sharding.clone().unwrap_or_default();
            if let Some(richer) = candidates.iter().find(|c| refines(c, &current)) {
                hints.push((target, opened(richer)));
            }
        }
    }
    Ok(hints)
}

/// The region parameters' shardings for operands sharded as `boundary`: a scan's
/// slices lose the stacked dim.
fn slice_params(flow: &Flow, boundary: &[Sharding]) -> Vec<Sharding> {
    let mut params = boundary.to_vec();
    if let Flow::Scan {
        carried, stacked, ..
    } = flow
    {
        for p in &mut params[*carried..carried + stacked] {
            p.dims.remove(0);
        }
    }
    params
}

/// `s` with every dim open (its axes kept, more may be appended) and nothing
/// unreduced or explicitly replicated.
fn opened(s: &Sharding) -> Sharding {
    Sharding::new(s.dims.iter().map(|d| DimSharding::open(d.axes.clone())))
}

/// True if `richer` has every dim of `s` as a prefix and more axes in all.
fn refines(richer: &Sharding, s: &Sharding) -> bool {
    let count = |x: &Sharding| x.dims.iter().map(|d| d.axes.len()).sum::<usize>();
    richer.dims.len() == s.dims.len()
        && (richer.dims.iter().zip(&s.dims)).all(|(r, d)| r.axes.starts_with(&d.axes))
        && count(richer) > count(s)
}

/// `flow` with its regions propagated for operands sharded as `boundary` (a manual
/// region's: then its results'; its body over the automatic axes of both, the manual
/// ones removed).
fn propagate_flow(flow: &Flow, boundary: &[Sharding], mesh: &Mesh) -> Result<Flow> {
    Ok(match flow {
        Flow::While { cond, body } => {
            let n = body.outputs.len();
            Flow::While {
                cond: pinned(cond, boundary, &[], mesh)?,
                body: pinned(body, boundary, &boundary[..n], mesh)?,
            }
        }
        Flow::Scan { carried, .. } => {
            let params = slice_params(flow, boundary);
            flow.try_map_regions(|body| pinned(body, &params, &boundary[..*carried], mesh))?
        }
        Flow::Cond { on_true, on_false } => {
            let on_true = pinned(on_true, &boundary[1..], &[], mesh)?;
            let outputs: Vec<Sharding> = (on_true.outputs.iter())
                .map(|&o| on_true.node(o).sharding.clone().unwrap_or_default())
                .collect();
            let on_false = pinned(on_false, &boundary[1..], &outputs, mesh)?;
            Flow::Cond { on_true, on_false }
        }
        Flow::Manual { body, spec } => {
            let (operands, results) = boundary.split_at(body.params.len());
            let inside = |s: &[Sharding], values: &[ValueId]| -> Vec<Sharding> {
                (s.iter().zip(values))
                    .map(|(s, &v)| spec.inside(s, &body.ty(v).shape, mesh))
                    .collect()
            };
            let params = inside(operands, &body.params);
            let r = annotated(body, &params, &inside(results, &body.outputs));
            Flow::Manual {
                body: super::propagate::propagate_manual_body(&r, mesh)?,
                spec: spec.clone(),
            }
        }
    })
}

/// `region` propagated with its parameters annotated `params` (closed) and its first
/// outputs constrained to `outputs`.
fn pinned(
    region: &Program,
    params: &[Sharding],
    outputs: &[Sharding],
    mesh: &Mesh,
) -> Result<Program> {
    propagate(&annotated(region, params, outputs), mesh)
}

/// `region` with its parameters annotated `params` (closed) and its first outputs
/// constrained to `outputs`.
fn annotated(region: &Program, params: &[Sharding], outputs: &[Sharding]) -> Program {
    let mut r = region.clone();
    for (&p, s) in region.params.iter().zip(params) {
        r.node_mut(p).annotation = Some(s.clone());
    }
    for (j, s) in outputs.iter().enumerate() {
        r.constrain_output(j, s.clone(), false);
    }
    r
}
