//! The reference interpreter: runs a [`Program`] on one device, node by node, with the
//! local [`kernels`](super::kernels). Its results are the oracle for every test.

use std::borrow::Cow;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ir::{FlowInstance, Literal, Node, Op, Program, TensorType, ValueId, flow_instances};

use super::flow::run_flow;
use super::kernels;
use super::memory::available_memory;

/// Runs `program` on `inputs` (one per parameter, in parameter order) and returns its
/// outputs in order.
///
/// Inputs are checked first: a wrong count, dtype or shape is an [`Error::Input`] naming
/// the parameter's index and name, expected vs. given. A kernel failure is an
/// [`Error::Runtime`] naming the value, op and source location. Each intermediate value
/// is dropped right after its last use, so peak memory is that of the live values.
/// Does not panic on any program that passes [`crate::ir::verify`].
///
/// The live values may take at most [`available_memory`] bytes (see
/// [`interpret_with_memory_limit`]).
pub fn interpret(program: &Program, inputs: &[Literal]) -> Result<Vec<Literal>> {
    interpret_with_memory_limit(program, inputs, available_memory())
}

/// [`interpret`] with the values live at any point limited to `memory_limit` bytes: a
/// value that would exceed it is an [`Error::OutOfMemory`] naming the value, op and
/// source location, raised before the value is allocated.
pub fn interpret_with_memory_limit(
    program: &Program,
    inputs: &[Literal],
    memory_limit: usize,
) -> Result<Vec<Literal>> {
    execute(program, inputs, memory_limit, |node, operands| {
        kernels::eval(&node.op, operands, &node.ty)
    })
}

/// The evaluation loop shared by the reference interpreter and the per-device runtime:
/// checks `inputs`, binds parameters and constants, computes every other node with
/// `eval` (an `Err` becomes an [`Error::Runtime`] naming the node), frees each value
/// after its last use, and returns the outputs.
///
/// Memory: every live value counts (parameters and constants too), by its type's size.
/// Before a node's value is bound or computed, the live bytes plus its bytes are checked
/// against `memory_limit`; over it is an [`Error::OutOfMemory`] for that node, so no
/// allocation beyond the limit is attempted. Scratch space inside a kernel is not
/// counted.
///
/// Control flow ([`Op::Flow`]) runs its regions through this same loop with the same
/// `eval` (so collectives inside a loop body run once per iteration), each region run
/// limited to the bytes left by the live values. The op runs once per instance (its
/// regions and operands): the first of its result nodes computes all results, the
/// others take theirs; results waiting for their node count as live (a scan's
/// residuals kept for the backward pass are), and the instance is dropped once every
/// result was taken.
pub(crate) fn execute(
    program: &Program,
    inputs: &[Literal],
    memory_limit: usize,
    mut eval: impl FnMut(&Node, &[&Literal]) -> Result<Literal, String>,
) -> Result<Vec<Literal>> {
    execute_dyn(program, inputs, memory_limit, &mut eval)
}

/// The results of flow instances computed for one result node and waiting for the
/// others, each with how many of the instance's result nodes still read it.
type Pending = HashMap<FlowInstance, Vec<(Option<Literal>, usize)>>;

/// Computes one node from its operands (an `Err` message on failure).
type Eval<'a> = dyn FnMut(&Node, &[&Literal]) -> Result<Literal, String> + 'a;

/// [`execute`] with the evaluator as a trait object, so that regions recurse.
fn execute_dyn(
    program: &Program,
    inputs: &[Literal],
    memory_limit: usize,
    eval: &mut Eval<'_>,
) -> Result<Vec<Literal>> {
    check_inputs(program, inputs)?;
    let instances = flow_instances(program);
    let mut pending: Pending = HashMap::new();
    let last_use = last_uses(program);
    let mut values: Vec<Option<Cow<'_, Literal>>> = vec![None; program.nodes.len()];
    let mut live: usize = 0;
    for (i, node) in program.nodes.iter().enumerate() {
        let v = ValueId(i as u32);
        let fail = |message: String| Error::Runtime {
            value: v,
            op: node.op.name(),
            location: node.location,
            message,
        };
        let bytes = node.ty.size_in_bytes();
        if live.saturating_add(bytes) > memory_limit {
            return Err(Error::OutOfMemory {
                value: v,
                op: node.op.name(),
                location: node.location,
                bytes,
                live,
                limit: memory_limit,
            });
        }
        live += bytes;
        let value = match &node.op {
            Op::Parameter { index, .. } => Cow::Borrowed(
                inputs
                    .get(*index)
                    .ok_or_else(|| fail(format!("no input for parameter {index}")))?,
            ),
            Op::Constant(lit) => Cow::Borrowed(lit),
            _ => {
                let operands = node
                    .operands
                    .iter()
                    .map(|o| match values.get(o.index()) {
                        Some(Some(lit)) => Ok(lit.as_ref()),
                        _ => Err(fail(format!("operand {o} is not available"))),
                    })
                    .collect::<Result<Vec<&Literal>>>()?;
                match &node.op {
                    Op::Flow { flow, result } => {
                        let key = (Arc::as_ptr(flow), node.operands.clone());
                        let nodes = instances.get(&key).map_or(&[][..], Vec::as_slice);
                        let size_of = |j: usize| {
                            nodes
                                .get(j)
                                .and_then(|n| n.first())
                                .map_or(0, |&r| program.nodes[r.index()].ty.size_in_bytes())
                        };
                        let results = match pending.entry(key.clone()) {
                            Entry::Occupied(slot) => slot.into_mut(),
                            Entry::Vacant(slot) => {
                                let left = memory_limit - live;
                                let mut run = |region: &Program, args: &[Literal], limit| {
                                    execute_dyn(region, args, limit, eval)
                                };
                                let all = run_flow(flow, &operands, left, &mut run, &fail)?;
                                let reads_of = |j| nodes.get(j).map_or(0, Vec::len);
                                // Results waiting for their nodes are live; a result no
                                // node reads is dropped now.
                                let held: usize = (0..all.len())
                                    .filter(|&j| reads_of(j) > 0)
                                    .map(size_of)
                                    .sum();
                                if live.saturating_add(held) > memory_limit {
                                    return Err(Error::OutOfMemory {
                                        value: v,
                                        op: node.op.name(),
                                        location: node.location,
                                        bytes: held,
                                        live,
                                        limit: memory_limit,
                                    });
                                }
                                live += held;
                                let all = all.into_iter().enumerate();
                                slot.insert(
                                    all.map(|(j, r)| ((reads_of(j) > 0).then_some(r), reads_of(j)))
                                        .collect(),
                                )
                            }
                        };
                        // The last node reading a result takes it (the waiting copy
                        // stops counting); earlier ones copy it.
                        let value = results.get_mut(*result).and_then(|(r, left)| {
                            *left = left.saturating_sub(1);
                            if *left == 0 {
                                live -= size_of(*result);
                                r.take()
                            } else {
                                r.clone()
                            }
                        });
                        if results.iter().all(|(r, _)| r.is_none()) {
                            pending.remove(&key);
                        }
                        Cow::Owned(value.ok_or_else(|| fail(format!("no result {result}")))?)
                    }
                    _ => Cow::Owned(eval(node, &operands).map_err(fail)?),
                }
            }
        };
        values[i] = Some(value);
        for o in node.operands.iter().chain(std::iter::once(&v)) {
            if last_use[o.index()] == Some(i)
                && let Some(slot) = values.get_mut(o.index())
                && slot.take().is_some()
            {
                live -= program.nodes[o.index()].ty.size_in_bytes();
            }
        }
    }
    let mut outputs = Vec::with_capacity(program.outputs.len());
    for (k, &o) in program.outputs.iter().enumerate() {
        let slot = values.get_mut(o.index());
        let again = program.outputs[k + 1..].contains(&o);
        let lit = match slot {
            Some(slot) if again => slot.clone(),
            Some(slot) => slot.take(),
            None => None,
        };
        let lit = lit.ok_or_else(|| Error::Runtime {
            value: o,
            op: "output",
            location: crate::ir::Location::synthetic(),
            message: format!("output {k} is not a computed value"),
        })?;
        outputs.push(lit.into_owned());
    }
    Ok(outputs)
}

/// Checks the number, dtypes and shapes of `inputs` against the program's parameters.
fn check_inputs(program: &Program, inputs: &[Literal]) -> Result<()> {
    let name = |index: usize| -> String {
        program
            .params
            .get(index)
            .and_then(|&p| program.nodes.get(p.index()))
            .and_then(|n| n.name.clone())
            .unwrap_or_else(|| format!("#{index}"))
    };
    let (expected, given) = (program.params.len(), inputs.len());
    if expected != given {
        let index = expected.min(given);
        return Err(Error::Input {
            index,
            name: if index < expected {
                name(index)
            } else {
                "(no such parameter)".into()
            },
            message: format!("the program takes {expected} inputs but {given} were given"),
        });
    }
    for (index, (&p, input)) in program.params.iter().zip(inputs).enumerate() {
        let ty = program.nodes.get(p.index()).map(|n| &n.ty);
        let given = TensorType::new(input.shape(), input.dtype());
        if ty != Some(&given) {
            let expected = ty.map_or_else(|| "a parameter".into(), ToString::to_string);
            return Err(Error::Input {
                index,
                name: name(index),
                message: format!("expected {expected}, given {given}"),
            });
        }
    }
    Ok(())
}

/// For each value, the index of the last node that uses it: the node itself if nothing
/// does, `None` (never freed) for outputs.
fn last_uses(program: &Program) -> Vec<Option<usize>> {
    let mut last: Vec<Option<usize>> = (0..program.nodes.len()).map(Some).collect();
    for (i, node) in program.nodes.iter().enumerate() {
        for o in &node.operands {
            if let Some(slot) = last.get_mut(o.index()) {
                *slot = Some(i);
            }
        }
    }
    for o in &program.outputs {
        if let Some(slot) = last.get_mut(o.index()) {
            *slot = None;
        }
    }
    last
}
