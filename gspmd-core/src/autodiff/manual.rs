//! Reverse mode of manual regions (`shard_map`): the VJP of a region is a region of the
//! body's VJP, and the collectives in a body have transposes.
//!
//! Conventions (JAX's `shard_map` transpose without replication checking): the body
//! does not know which of its values are equal on every device of a manual axis, so
//! - a result's cotangent enters the backward body divided by the number of devices of
//!   the manual axes its out-spec does not name (each of them holds a copy of the
//!   result, and each copy's cotangent is counted once per copy below);
//! - `psum` transposes to `psum` (each device's cotangent of its operand is the sum of
//!   every copy's cotangent);
//! - an operand's gradient is summed (`psum`) over the manual axes its in-spec does not
//!   name (each device received the whole operand there and contributed a part).
//!
//! With these, a replicated result read whole outside and a replicated operand used
//! differently per device both get exact gradients. The other transposes: `all_gather`
//! is `psum_scatter` (and back), `all_to_all` the reverse `all_to_all`, a `ppermute`
//! shift the opposite shift (a mirrored shift is its own), a permute of axis orders the
//! inverse permute. Max and min reductions have no transpose here.
//!
//! The backward body recomputes the forward body (as `scan`'s does): nothing of the
//! forward region is kept but its operands.

use std::sync::Arc;

use super::flow::FlowCall;
use super::sweep::vjp;
use crate::error::{Error, Result};
use crate::ir::{Appender, AxisGroup, Flow, ManualSpec, Node, Op, Program, ReduceKind, ValueId};

/// The cotangent of the operand of the collective `node` (which defines `y`) when `y`'s
/// cotangent is `ct`.
pub(super) fn collective_cotangent(
    e: &mut Appender<'_>,
    node: &Node,
    y: ValueId,
    ct: ValueId,
) -> Result<Option<ValueId>> {
    let op = match &node.op {
        Op::AxisIndex(_) => return Ok(None),
        Op::AllReduce {
            group,
            kind: ReduceKind::Sum,
        } => Op::AllReduce {
            group: group.clone(),
            kind: ReduceKind::Sum,
        },
        Op::AllGather { group, dim } => Op::ReduceScatter {
            group: group.clone(),
            kind: ReduceKind::Sum,
            dim: *dim,
        },
        Op::ReduceScatter {
            group,
            kind: ReduceKind::Sum,
            dim,
        } => Op::AllGather {
            group: group.clone(),
            dim: *dim,
        },
        Op::AllToAll {
            group,
            split_dim,
            concat_dim,
        } => Op::AllToAll {
            group: group.clone(),
            split_dim: *concat_dim,
            concat_dim: *split_dim,
        },
        Op::CollectivePermute { group, from } => Op::CollectivePermute {
            group: AxisGroup {
                axes: from.clone(),
                size: group.size,
            },
            from: group.axes.clone(),
        },
        Op::CollectiveShift {
            group,
            offset,
            wrap,
            mirror,
        } => Op::CollectiveShift {
            group: group.clone(),
            offset: if *mirror { *offset } else { -offset },
            wrap: *wrap,
            mirror: *mirror,
        },
        _ => {
            return Err(Error::NotDifferentiable {
                value: y,
                op: node.op.name(),
                location: node.location,
                message: "only sum reductions among collectives have a transpose".into(),
            });
        }
    };
    Ok(Some(e.push(op, &[ct])?))
}

/// The VJP of a manual region (see the module docs): a manual region over the forward
/// operands and the (scaled) cotangents of the results that have one, whose body is
/// the forward body's VJP and whose results are the active float operands' gradients.
pub(super) fn manual(
    e: &mut Appender<'_>,
    call: &FlowCall<'_>,
    cts: &[Option<ValueId>],
    body: &Program,
    spec: &ManualSpec,
) -> Result<Vec<Option<ValueId>>> {
    let operands = call.operands;
    let zs: Vec<usize> = (0..operands.len())
        .filter(|&i| e.ty(operands[i]).dtype.is_float() && call.operands_active[i])
        .collect();
    let seeded: Vec<(usize, ValueId)> = (cts.iter().enumerate())
        .filter_map(|(j, c)| c.map(|c| (j, c)))
        .collect();
    let ys: Vec<usize> = seeded.iter().map(|&(j, _)| j).collect();
    let mut out = vec![None; operands.len()];
    if zs.is_empty() {
        return Ok(out);
    }
    let mut backward = vjp(body, &zs, &ys)?;
    for (k, &i) in zs.iter().enumerate() {
        let axes = spec.unnamed_axes(&spec.in_specs[i]);
        if !axes.is_empty() {
            let g = backward.outputs[k];
            let location = backward.node(g).location;
            let group = AxisGroup {
                size: spec.mesh.axes_size(&axes),
                axes,
            };
            let op = Op::AllReduce {
                group,
                kind: ReduceKind::Sum,
            };
            backward.outputs[k] = backward.push_op(op, &[g], location)?;
        }
    }
    let mut backward_operands = operands.to_vec();
    for &(j, ct) in &seeded {
        let axes = spec.unnamed_axes(&spec.out_specs[j]);
        let copies = spec.mesh.axes_size(&axes);
        backward_operands.push(match copies {
            1 => ct,
            n => e.scale(ct, 1.0 / n as f32)?,
        });
    }
    let backward = Arc::new(Flow::Manual {
        body: backward,
        spec: ManualSpec {
            mesh: spec.mesh.clone(),
            in_specs: (spec.in_specs.iter().cloned())
                .chain(ys.iter().map(|&j| spec.out_specs[j].clone()))
                .collect(),
            out_specs: zs.iter().map(|&i| spec.in_specs[i].clone()).collect(),
        },
    });
    for (result, &i) in zs.iter().enumerate() {
        let op = Op::Flow {
            flow: backward.clone(),
            result,
        };
        out[i] = Some(e.push(op, &backward_operands)?);
    }
    Ok(out)
}
