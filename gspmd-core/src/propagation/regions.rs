//! Regions: once the enclosing program's shardings are final, each flow op's regions
//! are propagated with their boundary fixed (GSPMD section 3.5: the loop state, the
//! body's parameters and its results share one sharding).
//!
//! The boundary is the operands' shardings: a region parameter gets its operand's
//! sharding as a closed annotation (a scan's slice: the stacked operand's without its
//! leading dim), and each carried output of a body gets a `sharding_constraint` to its
//! initial value's sharding, so the state keeps one sharding across iterations and the
//! back edge needs no reshard. A `cond`'s `on_false` outputs are constrained to what
//! propagation gave `on_true`'s. Shardings inside a region do not flow back out
//! (phase 1): the carried values take the sharding their initial values propagate to.

use std::collections::HashMap;
use std::sync::Arc;

use super::propagate;
use crate::error::Result;
use crate::ir::{Flow, Op, Program};
use crate::sharding::{Mesh, Sharding};

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
    for v in original.values() {
        let Op::Flow { flow, result } = &original.node(v).op else {
            continue;
        };
        let boundary: Vec<Sharding> = (propagated.node(v).operands.iter())
            .map(|&o| {
                let node = propagated.node(o);
                (node.sharding.clone()).unwrap_or_else(|| Sharding::replicated(node.ty.rank()))
            })
            .collect();
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

/// `flow` with its regions propagated for operands sharded as `boundary`.
fn propagate_flow(flow: &Flow, boundary: &[Sharding], mesh: &Mesh) -> Result<Flow> {
    Ok(match flow {
        Flow::While { cond, body } => {
            let n = body.outputs.len();
            Flow::While {
                cond: pinned(cond, boundary, &[], mesh)?,
                body: pinned(body, boundary, &boundary[..n], mesh)?,
            }
        }
        Flow::Scan {
            body,
            carried,
            stacked,
            length,
            reverse,
        } => {
            let (n, k) = (*carried, *stacked);
            let mut params = boundary.to_vec();
            for p in &mut params[n..n + k] {
                p.dims.remove(0);
            }
            Flow::Scan {
                body: pinned(body, &params, &boundary[..n], mesh)?,
                carried: n,
                stacked: k,
                length: *length,
                reverse: *reverse,
            }
        }
        Flow::Cond { on_true, on_false } => {
            let on_true = pinned(on_true, &boundary[1..], &[], mesh)?;
            let outputs: Vec<Sharding> = (on_true.outputs.iter())
                .map(|&o| on_true.node(o).sharding.clone().unwrap_or_default())
                .collect();
            let on_false = pinned(on_false, &boundary[1..], &outputs, mesh)?;
            Flow::Cond { on_true, on_false }
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
    let mut r = region.clone();
    for (&p, s) in region.params.iter().zip(params) {
        r.node_mut(p).annotation = Some(s.clone());
    }
    for (j, s) in outputs.iter().enumerate() {
        r.constrain_output(j, s.clone(), false);
    }
    propagate(&r, mesh)
}
