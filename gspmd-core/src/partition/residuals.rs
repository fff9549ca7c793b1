//! Residual collectives saved by the forward scan (JAX's default `scan` VJP, which
//! saves the forward's residuals, against `jax.checkpoint`, which recomputes them): a
//! backward scan recomputes its forward body from the carried values the forward scan
//! stacked, and in a per-device program that recomputation holds the forward's
//! collectives again (a hidden state all-gathered over the axis splitting it, for its
//! product with a weight). When the forward scan computes the very same collective of
//! the very same values each iteration, it stacks that result as one more output `y`
//! and the backward body reads its slice instead: the collective runs once per
//! iteration (in the forward), not twice, and the recomputation feeding it becomes dead
//! code. Memory for bytes: each saved collective is held `length` times (one slice
//! per iteration) from the forward scan to the backward one.
//!
//! Why here and not in autodiff: the backward scan is built before propagation and
//! knows no sharding, and which values a body gathers is the partitioner's choice; the
//! per-device program shows it. A value of the backward body *matches* a value of the
//! forward body when both compute it at the same iteration index: a stacked parameter
//! that slices a forward scan's output `y` matches that output's value; one slicing an
//! array the forward also slices matches the forward's slice; a capture the forward
//! also captures matches its capture; any other node matches a forward node with the
//! same computation ([`same_computation`]: op, attributes, type, sharding) of matched
//! operands. Both scans index their slices by iteration, whatever their directions, so
//! a matched value is the same array in both bodies. Only collectives are saved, so the
//! forward scan never communicates more than it did; and only those of activations
//! (depending on a forward output `y`): a collective of slices and captures alone, a
//! layer's weights gathered from a stacked operand, is gathered again, as FSDP
//! regathers weights for the backward pass, since stacking every layer's gathered
//! weights would hold the model less sharded than it is (the paper's memory per
//! device, O(1/devices), would not hold).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use crate::ir::{Flow, Node, Op, Program, TensorType, ValueId};
use crate::simplify::same_computation;

/// `program` (a per-device program) with every collective of a backward scan's body
/// that its forward scan's body computes too saved by the forward scan (see the module
/// docs), at the top level and in every region (a training step accumulating its
/// gradients over microbatches holds the model's scans in its own scan's bodies);
/// `None` when there is none. Dead code the rewrite leaves (the backward body's
/// recomputation) is for the caller's simplification to remove.
pub(crate) fn save_residual_collectives(program: &Program) -> Option<Program> {
    let mut out = in_regions(program);
    // Each rewrite turns the saved collectives into parameters, so a scan is rewritten
    // at most once and the loop ends.
    while let Some(next) = save_once(out.as_ref().unwrap_or(program)) {
        out = Some(next);
    }
    out
}

/// `program` with [`save_residual_collectives`] applied to the regions of its flow ops;
/// `None` when no region changes. The result nodes of one instance keep sharing one
/// `Arc<Flow>`.
fn in_regions(program: &Program) -> Option<Program> {
    let mut done: HashMap<*const Flow, Option<Arc<Flow>>> = HashMap::new();
    let mut out: Option<Program> = None;
    for (i, node) in program.nodes.iter().enumerate() {
        let Op::Flow { flow, result } = &node.op else {
            continue;
        };
        let rewritten = done.entry(Arc::as_ptr(flow)).or_insert_with(|| {
            let mut changed = false;
            let Ok(f) = flow.try_map_regions(|region| {
                let saved = save_residual_collectives(region);
                changed |= saved.is_some();
                Ok::<_, Infallible>(saved.unwrap_or_else(|| region.clone()))
            });
            changed.then(|| Arc::new(f))
        });
        if let Some(flow) = rewritten {
            let copy = out.get_or_insert_with(|| program.clone());
            copy.nodes[i].op = Op::Flow {
                flow: flow.clone(),
                result: *result,
            };
        }
    }
    out
}

/// One backward scan of `program` and its forward scan, its saved collectives.
struct Saving<'a> {
    /// The backward scan.
    backward: &'a Arc<Flow>,
    /// A result node of the forward scan that the backward scan reads.
    forward_node: ValueId,
    /// The forward scan.
    forward: &'a Arc<Flow>,
    /// Each saved collective of the backward body with its match in the forward body.
    saved: Vec<(ValueId, ValueId)>,
}

/// [`save_residual_collectives`] for the first backward scan that has collectives to
/// save.
fn save_once(program: &Program) -> Option<Program> {
    let saving = program.values().find_map(|v| saving(program, v))?;
    Some(rewrite(program, &saving))
}

/// The scan instance whose result node is `v` as a backward scan, if its body has
/// collectives that a forward scan it reads computes too.
fn saving(program: &Program, v: ValueId) -> Option<Saving<'_>> {
    let node = program.node(v);
    let Op::Flow { flow: backward, .. } = &node.op else {
        return None;
    };
    let Flow::Scan {
        body,
        carried,
        stacked,
        length,
        ..
    } = backward.as_ref()
    else {
        return None;
    };
    let operands = &node.operands;
    // The forward scan: the first scan of the same length whose output `y` is sliced.
    let forward_node = operands[*carried..carried + stacked]
        .iter()
        .copied()
        .find(|&o| reads_output_y(program, o, *length).is_some())?;
    let Op::Flow { flow: forward, .. } = &program.node(forward_node).op else {
        return None;
    };
    let Flow::Scan {
        body: forward_body,
        carried: forward_carried,
        stacked: forward_stacked,
        ..
    } = forward.as_ref()
    else {
        return None;
    };
    let forward_operands = &program.node(forward_node).operands;
    let forward_param = |o: ValueId, from: usize, to: usize| {
        (from..to)
            .find(|&k| forward_operands[k] == o)
            .map(|k| forward_body.params[k])
    };
    let captures = forward_carried + forward_stacked;
    let mut index: HashMap<&[ValueId], Vec<ValueId>> = HashMap::new();
    for u in forward_body.values() {
        let n = forward_body.node(u);
        if !matches!(n.op, Op::Parameter { .. } | Op::Flow { .. }) {
            index.entry(&n.operands[..]).or_default().push(u);
        }
    }
    let mut matched: Vec<Option<ValueId>> = vec![None; body.nodes.len()];
    // Whether a value depends on the forward's outputs `y` (activations), not only on
    // slices and captures (weights).
    let mut activation = vec![false; body.nodes.len()];
    for (i, &p) in body.params.iter().enumerate() {
        let o = operands[i];
        matched[p.index()] = if i < *carried {
            None
        } else if i < carried + stacked {
            match reads_output_y(program, o, *length) {
                Some((flow, r)) if Arc::ptr_eq(flow, forward) => {
                    activation[p.index()] = true;
                    Some(forward_body.outputs[r])
                }
                _ => forward_param(o, *forward_carried, captures),
            }
        } else {
            forward_param(o, captures, forward_operands.len())
        };
    }
    let mut saved = Vec::new();
    for u in body.values() {
        let n = body.node(u);
        if matches!(n.op, Op::Parameter { .. } | Op::Flow { .. }) {
            continue;
        }
        let Some(mapped) = (n.operands.iter())
            .map(|o| matched[o.index()])
            .collect::<Option<Vec<ValueId>>>()
        else {
            continue;
        };
        let same = index.get(&mapped[..]).and_then(|candidates| {
            (candidates.iter().copied()).find(|&f| same_computation(forward_body.node(f), n))
        });
        matched[u.index()] = same;
        activation[u.index()] = n.operands.iter().any(|o| activation[o.index()]);
        if let (Some(f), true) = (same, n.op.is_collective() && activation[u.index()]) {
            saved.push((u, f));
        }
    }
    (!saved.is_empty()).then_some(Saving {
        backward,
        forward_node,
        forward,
        saved,
    })
}

/// The scan and output index `r` when `o` is the stacked output `y` (not a carried
/// value) of a scan of `length` iterations.
fn reads_output_y(program: &Program, o: ValueId, length: usize) -> Option<(&Arc<Flow>, usize)> {
    let Op::Flow { flow, result } = &program.node(o).op else {
        return None;
    };
    match flow.as_ref() {
        Flow::Scan {
            carried, length: l, ..
        } if *l == length && result >= carried => Some((flow, *result)),
        _ => None,
    }
}

/// `program` with `saving` applied: the forward scan returns the saved values as new
/// outputs `y` (new result nodes right after `saving.forward_node`), and the backward
/// scan takes them as new stacked operands, after its others, in place of its
/// collectives.
fn rewrite(program: &Program, saving: &Saving<'_>) -> Program {
    let Flow::Scan {
        body: forward_body,
        carried,
        stacked,
        length,
        reverse,
        remat,
    } = saving.forward.as_ref()
    else {
        unreachable!("a saving's forward flow is a scan")
    };
    let mut body = forward_body.clone();
    let first_new = body.outputs.len() - carried;
    body.outputs.extend(saving.saved.iter().map(|&(_, f)| f));
    let forward = Arc::new(Flow::Scan {
        body,
        carried: *carried,
        stacked: *stacked,
        length: *length,
        reverse: *reverse,
        remat: *remat,
    });
    let (backward, position) = backward_taking_slices(saving);

    // The new result nodes, right after the forward node the backward scan reads.
    let at = saving.forward_node.index() + 1;
    let n = saving.saved.len();
    let shift = |v: ValueId| {
        if v.index() >= at {
            ValueId((v.index() + n) as u32)
        } else {
            v
        }
    };
    let template = program.node(saving.forward_node);
    let Flow::Scan { body: old_body, .. } = saving.backward.as_ref() else {
        unreachable!("a saving's backward flow is a scan")
    };
    let new_nodes = saving.saved.iter().enumerate().map(|(k, &(u, _))| {
        let collective = old_body.node(u);
        let mut shape = vec![*length];
        shape.extend_from_slice(&collective.ty.shape);
        Node {
            op: Op::Flow {
                flow: forward.clone(),
                result: carried + first_new + k,
            },
            operands: template.operands.clone(),
            ty: TensorType::new(shape, collective.ty.dtype),
            annotation: None,
            sharding: None,
            origin: None,
            name: None,
            location: collective.location,
            why: Vec::new(),
        }
    });
    let mut out = Program::new(program.name.clone());
    out.nodes.reserve(program.nodes.len() + n);
    let new_nodes: Vec<Node> = new_nodes.collect();
    let saved_ids: Vec<ValueId> = (0..n).map(|k| ValueId((at + k) as u32)).collect();
    for (i, node) in program.nodes.iter().enumerate() {
        if i == at {
            out.nodes.extend(new_nodes.iter().cloned());
        }
        let mut copy = node.clone();
        copy.operands = copy.operands.iter().map(|&o| shift(o)).collect();
        if let Op::Flow { flow, result } = &node.op {
            if Arc::ptr_eq(flow, saving.forward) {
                copy.op = Op::Flow {
                    flow: forward.clone(),
                    result: *result,
                };
            } else if Arc::ptr_eq(flow, saving.backward) {
                copy.op = Op::Flow {
                    flow: backward.clone(),
                    result: *result,
                };
                copy.operands
                    .splice(position..position, saved_ids.iter().copied());
            }
        }
        if let Some(origin) = &mut copy.origin {
            for d in origin.dims.iter_mut().flatten() {
                *d = shift(*d);
            }
        }
        out.nodes.push(copy);
    }
    out.params = program.params.iter().map(|&p| shift(p)).collect();
    out.outputs = program.outputs.iter().map(|&o| shift(o)).collect();
    out
}

/// The backward scan of `saving` with each saved collective of its body turned into a
/// new stacked parameter (after the other stacked ones; the captures' indices move up),
/// and the operand position where the new stacked operands go.
fn backward_taking_slices(saving: &Saving<'_>) -> (Arc<Flow>, usize) {
    let Flow::Scan {
        body,
        carried,
        stacked,
        length,
        reverse,
        remat,
    } = saving.backward.as_ref()
    else {
        unreachable!("a saving's backward flow is a scan")
    };
    let mut body = body.clone();
    let position = carried + stacked;
    let n = saving.saved.len();
    for k in position..body.params.len() {
        let p = body.params[k];
        if let Op::Parameter { index, .. } = &mut body.node_mut(p).op {
            *index += n;
        }
    }
    let mut new_params = Vec::with_capacity(n);
    for (k, &(u, _)) in saving.saved.iter().enumerate() {
        let node = body.node_mut(u);
        node.name = Some(format!("saved {}", node.op.name()));
        node.op = Op::Parameter {
            index: position + k,
            ty: node.ty.clone(),
        };
        node.operands.clear();
        node.why.clear();
        new_params.push(u);
    }
    body.params.splice(position..position, new_params);
    let flow = Flow::Scan {
        body,
        carried: *carried,
        stacked: stacked + n,
        length: *length,
        reverse: *reverse,
        remat: *remat,
    };
    (Arc::new(flow), position)
}
