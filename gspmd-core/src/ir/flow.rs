//! Structured control flow: [`Flow`], an op holding nested sub-programs (*regions*)
//! with their own parameters, and its signature rule (a manual region's is in
//! [`super::manual`]).
//!
//! A flow op has several results. The IR stays single-result SSA: each result is its
//! own node `Op::Flow { flow, result }`, all result nodes of one instance sharing the
//! same `Arc<Flow>` and the same operands (see ARCHITECTURE.md, "Regions"). A result no
//! one reads is dead code like any other value; the loop runs while one is read.

use std::collections::HashMap;
use std::sync::Arc;

use super::manual::ManualSpec;
use super::op::Op;
use super::program::Program;
use super::remat::Remat;
use crate::types::{TensorType, ValueId};

/// One instance of a flow op: its regions (by address) and its operands. Its result
/// nodes are the `Op::Flow` nodes with both.
pub type FlowInstance = (*const Flow, Vec<ValueId>);

/// For each flow instance of `program` (not of its regions), the nodes of each of its
/// results (none for a result no node reads).
pub fn flow_instances(program: &Program) -> HashMap<FlowInstance, Vec<Vec<ValueId>>> {
    let mut instances: HashMap<FlowInstance, Vec<Vec<ValueId>>> = HashMap::new();
    for v in program.values() {
        let node = program.node(v);
        if let Op::Flow { flow, result } = &node.op {
            let slots = (instances.entry((Arc::as_ptr(flow), node.operands.clone()))).or_default();
            if slots.len() <= *result {
                slots.resize(*result + 1, Vec::new());
            }
            slots[*result].push(v);
        }
    }
    instances
}

/// The distinct flow ops of `program` (not of its regions), each once with its first
/// result node, in program order: the result nodes of an instance share one `Arc<Flow>`,
/// so a walk over regions visits each region once.
pub fn distinct_flows(program: &Program) -> Vec<(ValueId, &Arc<Flow>)> {
    let mut seen: Vec<*const Flow> = Vec::new();
    let mut flows = Vec::new();
    for v in program.values() {
        if let Op::Flow { flow, .. } = &program.node(v).op
            && !seen.contains(&Arc::as_ptr(flow))
        {
            seen.push(Arc::as_ptr(flow));
            flows.push((v, flow));
        }
    }
    flows
}

/// A control-flow op and its regions. Operands and region parameters line up; the
/// trailing `captures` are values of the enclosing program that the regions read.
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub enum Flow {
    /// `while cond(state) { state = body(state) }`. Operands: the `n` carried values,
    /// then the captures. Both regions take all operands as parameters (in order);
    /// `cond` returns one bool scalar, `body` the `n` new carried values (types
    /// unchanged). Results: the final carried values.
    While {
        /// The loop condition.
        cond: Program,
        /// The loop body.
        body: Program,
    },
    /// `jax.lax.scan` over the leading dim of the stacked operands. Operands: `carried`
    /// initial values, `stacked` arrays of leading dim `length`, then the captures. The
    /// body takes the carried values, one slice of each stacked array (leading dim
    /// removed), and the captures; it returns the new carried values and per-iteration
    /// outputs `y`. Results: the final carried values, then each `y` stacked along a new
    /// leading dim of `length`. Iteration `i` reads and writes index `i` (with `reverse`,
    /// `length - 1 - i`).
    Scan {
        /// The loop body.
        body: Program,
        /// Number of carried values.
        carried: usize,
        /// Number of stacked (sliced) operands.
        stacked: usize,
        /// Number of iterations: the stacked operands' leading dim.
        length: usize,
        /// Iterate from the last index to the first.
        reverse: bool,
        /// What the backward pass of this scan reads from its forward pass rather than
        /// recomputes (only [`crate::autodiff::grad`] reads it).
        remat: Remat,
    },
    /// `if pred { on_true(captures) } else { on_false(captures) }`. Operands: a bool
    /// scalar predicate, then the captures (both branches' parameters). The branches
    /// return the same types: the results.
    Cond {
        /// The branch taken when the predicate is true.
        on_true: Program,
        /// The branch taken when it is false.
        on_false: Program,
    },
    /// A manual region (`shard_map`, see [`ManualSpec`]): `body` is a per-device program
    /// taking one block of each operand (cut by `spec.in_specs`) and returning blocks
    /// that `spec.out_specs` assemble into the results. Runs once.
    Manual {
        /// The per-device body; its collectives name manual axes.
        body: Program,
        /// The manual axes and the specs.
        spec: ManualSpec,
    },
}

impl std::fmt::Debug for Flow {
    /// The kind, attributes and region sizes; [`std::fmt::Display`] of the op's node
    /// prints the regions in full.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sizes: Vec<usize> = self.regions().iter().map(|r| r.nodes.len()).collect();
        match self {
            Flow::Scan {
                carried,
                stacked,
                length,
                reverse,
                ..
            } => write!(
                f,
                "Scan {{ carried: {carried}, stacked: {stacked}, length: {length}, \
                 reverse: {reverse}, region_nodes: {sizes:?} }}"
            ),
            _ => write!(f, "{} {{ region_nodes: {sizes:?} }}", self.name()),
        }
    }
}

impl Flow {
    /// `while`, `scan` or `cond`.
    pub fn name(&self) -> &'static str {
        match self {
            Flow::While { .. } => "while",
            Flow::Scan { .. } => "scan",
            Flow::Cond { .. } => "cond",
            Flow::Manual { .. } => "shard_map",
        }
    }

    /// The regions, in printing order (`while`: cond, body; `cond`: on_true, on_false).
    pub fn regions(&self) -> Vec<&Program> {
        match self {
            Flow::While { cond, body } => vec![cond, body],
            Flow::Scan { body, .. } => vec![body],
            Flow::Cond { on_true, on_false } => vec![on_true, on_false],
            Flow::Manual { body, .. } => vec![body],
        }
    }

    /// The regions' names, in [`Flow::regions`] order.
    pub fn region_names(&self) -> &'static [&'static str] {
        match self {
            Flow::While { .. } => &["cond", "body"],
            Flow::Scan { .. } | Flow::Manual { .. } => &["body"],
            Flow::Cond { .. } => &["on_true", "on_false"],
        }
    }

    /// The same op with each region replaced by `f(region)` (attributes kept); the
    /// first error of `f` if any.
    pub fn try_map_regions<E>(
        &self,
        mut f: impl FnMut(&Program) -> Result<Program, E>,
    ) -> Result<Flow, E> {
        Ok(match self {
            Flow::While { cond, body } => Flow::While {
                cond: f(cond)?,
                body: f(body)?,
            },
            Flow::Scan {
                body,
                carried,
                stacked,
                length,
                reverse,
                remat,
            } => Flow::Scan {
                body: f(body)?,
                carried: *carried,
                stacked: *stacked,
                length: *length,
                reverse: *reverse,
                remat: *remat,
            },
            Flow::Cond { on_true, on_false } => Flow::Cond {
                on_true: f(on_true)?,
                on_false: f(on_false)?,
            },
            Flow::Manual { body, spec } => Flow::Manual {
                body: f(body)?,
                spec: spec.clone(),
            },
        })
    }

    /// The result types for operands of types `operands`, or a message naming the
    /// first region signature that does not fit (a region parameter, a region output,
    /// the predicate, a stacked operand's leading dim).
    pub fn result_types(&self, operands: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        match self {
            Flow::While { cond, body } => {
                let n = body.outputs.len();
                check_params("cond", cond, operands)?;
                check_params("body", body, operands)?;
                let bool_scalar = TensorType::new(vec![], crate::types::DType::Bool);
                match outputs(cond).as_slice() {
                    [t] if *t == bool_scalar => {}
                    found => {
                        return Err(format!(
                            "the condition must return one pred[] but returns {}",
                            list(found)
                        ));
                    }
                }
                if operands.len() < n {
                    return Err(format!(
                        "the body returns {n} carried values but the loop has {} operands",
                        operands.len()
                    ));
                }
                let carried = &operands[..n];
                check_outputs("body", body, carried, "the carried values", false)?;
                Ok(carried.iter().map(|&t| t.clone()).collect())
            }
            Flow::Scan {
                body,
                carried,
                stacked,
                length,
                ..
            } => {
                let (n, k) = (*carried, *stacked);
                if operands.len() < n + k {
                    return Err(format!(
                        "scan takes {n} carried and {k} stacked operands, got {}",
                        operands.len()
                    ));
                }
                let mut params: Vec<TensorType> = operands.iter().map(|&t| t.clone()).collect();
                for (i, p) in params[n..n + k].iter_mut().enumerate() {
                    if p.shape.first() != Some(length) {
                        return Err(format!(
                            "stacked operand {i} is {p}, whose leading dim is not the scan \
                             length {length}"
                        ));
                    }
                    p.shape.remove(0);
                }
                check_params("body", body, &params.iter().collect::<Vec<_>>())?;
                let outs = outputs(body);
                if outs.len() < n {
                    return Err(format!(
                        "the body returns {} values but carries {n}",
                        outs.len()
                    ));
                }
                check_outputs("body", body, &operands[..n], "the carried values", true)?;
                let mut results: Vec<TensorType> =
                    operands[..n].iter().map(|&t| t.clone()).collect();
                for y in &outs[n..] {
                    let mut shape = vec![*length];
                    shape.extend_from_slice(&y.shape);
                    let stacked = TensorType::new(shape, y.dtype);
                    stacked.check_size()?;
                    results.push(stacked);
                }
                Ok(results)
            }
            Flow::Cond { on_true, on_false } => {
                let bool_scalar = TensorType::new(vec![], crate::types::DType::Bool);
                match operands.first() {
                    Some(&p) if *p == bool_scalar => {}
                    p => {
                        return Err(format!(
                            "the predicate must be pred[], got {}",
                            p.map_or("nothing".into(), |t| t.to_string())
                        ));
                    }
                }
                check_params("on_true", on_true, &operands[1..])?;
                check_params("on_false", on_false, &operands[1..])?;
                let true_types = outputs(on_true);
                let refs: Vec<&TensorType> = true_types.iter().collect();
                check_outputs("on_false", on_false, &refs, "on_true's results", false)?;
                Ok(true_types)
            }
            Flow::Manual { body, spec } => spec.result_types(body, operands),
        }
    }
}

/// The types of a region's outputs.
pub(super) fn outputs(region: &Program) -> Vec<TensorType> {
    region
        .outputs
        .iter()
        .map(|&o| region.ty(o).clone())
        .collect()
}

/// Checks that `region`'s parameters have the types `expected`.
pub(super) fn check_params(
    what: &str,
    region: &Program,
    expected: &[&TensorType],
) -> Result<(), String> {
    let params: Vec<TensorType> = region
        .params
        .iter()
        .map(|&p| region.ty(p).clone())
        .collect();
    let fits = params.len() == expected.len() && params.iter().zip(expected).all(|(p, e)| p == *e);
    if fits {
        return Ok(());
    }
    let expected: Vec<TensorType> = expected.iter().map(|&t| t.clone()).collect();
    Err(format!(
        "the {what} region takes {} but the operands give {}",
        list(&params),
        list(&expected)
    ))
}

/// Checks that `region`'s outputs have the types `expected` (`whose`, for the message);
/// with `prefix`, only its first outputs (a scan body's `y`s follow).
fn check_outputs(
    what: &str,
    region: &Program,
    expected: &[&TensorType],
    whose: &str,
    prefix: bool,
) -> Result<(), String> {
    let outs = outputs(region);
    let count = if prefix {
        outs.len() >= expected.len()
    } else {
        outs.len() == expected.len()
    };
    if count && outs.iter().zip(expected).all(|(o, e)| o == *e) {
        return Ok(());
    }
    let expected: Vec<TensorType> = expected.iter().map(|&t| t.clone()).collect();
    Err(format!(
        "the {what} region returns {} but {whose} are {}",
        list(&outs),
        list(&expected)
    ))
}

fn list(types: &[TensorType]) -> String {
    let items: Vec<String> = types.iter().map(ToString::to_string).collect();
    format!("({})", items.join(", "))
}
