//! Control flow (`while`, `scan`, `cond`): each region is partitioned once into a
//! per-device region, so its collectives run once per iteration at run time and the
//! per-device program does not grow with the trip count.
//!
//! Propagation fixed each region's boundary (`propagation::regions`): parameters
//! sharded like their operands, carried outputs constrained to the same sharding. The
//! handler reshards the operands to that boundary (a scan's stacked operand with its
//! leading dim whole; the predicate replicated), so the carried state keeps its
//! sharding across iterations with no reshard at the back edge. Every device runs the
//! same number of iterations and takes the same branch: the condition and predicate
//! are replicated scalars, computed from replicated values or by collectives whose
//! result is the same on every device.
//!
//! A manual region (`shard_map`) has as boundary its specs' manual axes followed, per
//! dim, by the automatic axes its body's parameters and outputs got from propagation;
//! its body is partitioned over those like any region, then emitted in place
//! ([`crate::partition::manual`]).

use std::convert::Infallible;
use std::sync::Arc;

use crate::error::Result;
use crate::ir::{Flow, ManualSpec, Node, Op, Program};
use crate::partition::accumulate::pending_accumulators;
use crate::partition::emit::Emitter;
use crate::partition::hoist;
use crate::partition::reshard::reshard;
use crate::partition::value::PValue;
use crate::sharding::{DimSharding, Sharding};

/// Partitions result `result` of the flow op `node`; the driver reshards the result
/// to the value's target.
pub(super) fn flow(
    em: &mut Emitter,
    node: &Node,
    flow: &Arc<Flow>,
    result: usize,
    operands: &[PValue],
) -> Result<PValue> {
    // The regions with one boundary; their parameters and outputs say how the
    // operands and results are sharded.
    let pinned = with_boundary(flow, em.mesh);
    let local = match em.flows.get(&Arc::as_ptr(flow)) {
        Some(local) => local.clone(),
        None => {
            let local = Arc::new(LocalFlow::partition(em, &pinned)?);
            em.flows.insert(Arc::as_ptr(flow), local.clone());
            local
        }
    };
    let mut boundary = boundary(&pinned);
    for (j, axes) in &local.pending {
        boundary[*j].unreduced.extend(axes.iter().cloned());
    }
    let mut locals = Vec::with_capacity(operands.len());
    for (x, s) in operands.iter().zip(&boundary) {
        locals.push(reshard(em, x, s)?.id);
    }
    if let Some(prelude) = &local.prelude {
        let hoisted = hoist::emit(em, prelude, &locals)?;
        locals.extend(hoisted);
    }
    let id = match &*local.flow {
        // Emitted in place; each result node emits it again, and the simplification
        // after partitioning merges the copies (equal nodes).
        Flow::Manual { body, .. } => em.inline(body, &locals)?[body.outputs[result].index()],
        _ => em.emit(
            Op::Flow {
                flow: local.flow.clone(),
                result,
            },
            &locals,
        )?,
    };
    let mut sharding = result_sharding(&pinned, result);
    if let Some((_, axes)) = local.pending.iter().find(|(j, _)| *j == result) {
        sharding.unreduced.extend(axes.iter().cloned());
    }
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding,
    })
}

/// The per-device form of a flow op, shared by its instance's result nodes.
pub(crate) struct LocalFlow {
    /// The per-device op: its regions partitioned, loop-invariant collectives hoisted
    /// out of a loop body (taken as trailing captures) and sums accumulated pending.
    flow: Arc<Flow>,
    /// The carried values a scan accumulates as pending sums
    /// ([`pending_accumulators`]), each with its pending axes: the operand's and the
    /// result's sharding get them.
    pending: Vec<(usize, Vec<String>)>,
    /// What runs before the loop to compute the hoisted captures ([`hoist::hoist`]).
    prelude: Option<Program>,
}

impl LocalFlow {
    /// Partitions each region of `pinned` (regions with one boundary) once, then
    /// rewrites a loop body: sums accumulated pending (a scan of more than one
    /// iteration: one reduction after the loop instead of one per iteration), then
    /// invariant collectives hoisted.
    fn partition(em: &mut Emitter, pinned: &Flow) -> Result<LocalFlow> {
        let mut warnings = Vec::new();
        let mut local = pinned.try_map_regions(|region| {
            let spmd = crate::partition::partition_region(region, em.mesh)?;
            warnings.extend(spmd.warnings);
            Ok::<_, crate::error::Error>(spmd.program)
        })?;
        em.warnings.extend(warnings);
        let (mut pending, mut prelude) = (Vec::new(), None);
        match &mut local {
            Flow::Scan {
                body,
                carried,
                stacked,
                length,
                ..
            } => {
                if *length > 1 {
                    pending = pending_accumulators(body, *carried);
                }
                prelude = hoist::hoist(body, *carried + *stacked);
            }
            Flow::While { cond, body } => {
                prelude = hoist::hoist(body, body.outputs.len());
                for &p in &body.params[cond.params.len()..] {
                    let mut param = body.node(p).clone();
                    if let Op::Parameter { index, .. } = &mut param.op {
                        *index = cond.params.len();
                    }
                    let id = cond.push(param);
                    cond.params.push(id);
                }
            }
            Flow::Cond { .. } | Flow::Manual { .. } => {}
        }
        Ok(LocalFlow {
            flow: Arc::new(local),
            pending,
            prelude,
        })
    }
}

/// `flow` with one boundary for all its regions: the secondary region's parameters
/// (a `while`'s condition, a `cond`'s `on_false`) sharded like the first's, and
/// outputs resharded where the boundary needs it: a body's carried outputs to their
/// parameters' shardings (so the back edge needs nothing), a condition to a replicated
/// scalar, `on_false`'s outputs to `on_true`'s, a manual body's parameters and outputs
/// to even splits of their blocks. Propagation leaves regions so already;
/// a program sharded otherwise (by hand, or at random in tests) gets the
/// `sharding_constraint`s here.
fn with_boundary(flow: &Flow, mesh: &crate::sharding::Mesh) -> Flow {
    let pin = |region: &Program, params: Option<&Program>, outputs: &[Sharding]| {
        let mut r = region.clone();
        if let Some(first) = params {
            for (&p, &q) in r.params.clone().iter().zip(&first.params) {
                r.node_mut(p).sharding = Some(sharding_of(first, q));
            }
        }
        for (j, s) in outputs.iter().enumerate() {
            if sharding_of(&r, r.outputs[j]) != *s {
                r.constrain_output(j, s.clone(), true);
            }
        }
        r
    };
    let params_of = |r: &Program, n: usize| -> Vec<Sharding> {
        r.params[..n].iter().map(|&p| sharding_of(r, p)).collect()
    };
    match flow {
        Flow::While { cond, body } => Flow::While {
            cond: pin(cond, Some(body), &[Sharding::replicated(0)]),
            body: pin(body, None, &params_of(body, body.outputs.len())),
        },
        Flow::Scan { carried, .. } => {
            let pin_body =
                |body: &Program| Ok::<_, Infallible>(pin(body, None, &params_of(body, *carried)));
            let Ok(pinned) = flow.try_map_regions(pin_body);
            pinned
        }
        Flow::Cond { on_true, on_false } => {
            let outputs: Vec<Sharding> = (on_true.outputs.iter())
                .map(|&o| sharding_of(on_true, o))
                .collect();
            Flow::Cond {
                on_true: on_true.clone(),
                on_false: pin(on_false, Some(on_true), &outputs),
            }
        }
        // Parameters and outputs split evenly over automatic axes (the boundary follows
        // from them: `boundary`, `result_sharding`); propagation leaves them so.
        Flow::Manual { body, spec } => {
            let even = |v| spec.inside(&sharding_of(body, v), &body.ty(v).shape, mesh);
            let mut r = body.clone();
            for &p in &body.params {
                r.node_mut(p).sharding = Some(even(p));
            }
            let outputs: Vec<Sharding> = body.outputs.iter().map(|&o| even(o)).collect();
            Flow::Manual {
                body: pin(&r, None, &outputs),
                spec: spec.clone(),
            }
        }
    }
}

/// The sharding of a region parameter or output (set by propagation).
fn sharding_of(region: &Program, v: crate::ir::ValueId) -> Sharding {
    let node = region.node(v);
    (node.sharding.clone()).unwrap_or_else(|| Sharding::replicated(node.ty.rank()))
}

/// `s` with a whole leading dim added: a stacked operand or result.
fn stacked(s: Sharding) -> Sharding {
    let mut dims = vec![DimSharding::closed(Vec::<String>::new())];
    dims.extend(s.dims);
    Sharding { dims, ..s }
}

/// The sharding each operand of `flow` must have: its region parameter's.
fn boundary(flow: &Flow) -> Vec<Sharding> {
    match flow {
        Flow::While { body, .. } => body.params.iter().map(|&p| sharding_of(body, p)).collect(),
        Flow::Scan {
            body,
            carried,
            stacked: k,
            ..
        } => (body.params.iter().enumerate())
            .map(|(i, &p)| {
                let s = sharding_of(body, p);
                if (*carried..carried + k).contains(&i) {
                    stacked(s)
                } else {
                    s
                }
            })
            .collect(),
        Flow::Cond { on_true, .. } => std::iter::once(Sharding::replicated(0))
            .chain(on_true.params.iter().map(|&p| sharding_of(on_true, p)))
            .collect(),
        Flow::Manual { body, spec } => (spec.in_specs.iter().zip(&body.params))
            .map(|(s, &p)| ManualSpec::around(s, &sharding_of(body, p)))
            .collect(),
    }
}

/// The sharding of result `result` as the per-device op leaves it.
fn result_sharding(flow: &Flow, result: usize) -> Sharding {
    match flow {
        Flow::While { body, .. } => sharding_of(body, body.outputs[result]),
        Flow::Scan { body, carried, .. } => {
            let s = sharding_of(body, body.outputs[result]);
            if result < *carried { s } else { stacked(s) }
        }
        Flow::Cond { on_true, .. } => sharding_of(on_true, on_true.outputs[result]),
        Flow::Manual { body, spec } => ManualSpec::around(
            &spec.out_specs[result],
            &sharding_of(body, body.outputs[result]),
        ),
    }
}
