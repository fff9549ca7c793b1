//! The reverse sweep: copies the forward program, then walks it backwards from the loss,
//! asking the [registry](super::registry) for each operand's cotangent and summing the
//! cotangents of values used several times. It knows no op.

use std::collections::HashSet;
use std::sync::Arc;

use super::flow::{FlowCall, flow_cotangents};
use super::registry::{
    is_differentiable, not_differentiable, operand_cotangent, passes_gradient, pattern_cotangent,
};
use super::remat::read_saved;
use crate::error::{Error, RequestProblem, Result};
use crate::ir::Appender;
use crate::ir::{Literal, Op, Program, Remat, ValueId, flow_instances, verify};
use crate::simplify::eliminate_dead_code;

/// Reverse-mode gradient of `program`'s output number `loss` with respect to the
/// parameters numbered `wrt`, as a new program.
///
/// The loss must be an f32 scalar and each `wrt` parameter f32; otherwise, or for an
/// index out of range, [`Error::GradRequest`]. The program is verified first.
///
/// The result has the same parameters. Its nodes are the forward nodes (same order and
/// ops, so every `%i` keeps its id and value; a differentiated `scan`'s result nodes
/// hold the same scan with its residuals as extra outputs), then the backward nodes, each located at the
/// forward node it comes from. Its outputs are the original outputs, then one gradient
/// per `wrt` entry, shaped like its parameter and named `grad(<parameter name>)`:
/// - only values that depend on a `wrt` parameter and reach the loss get a cotangent,
///   so the backward part has no dead code; a `wrt` parameter that does not reach the
///   loss gets zeros;
/// - the gradient of a parameter that carries a sharding annotation is passed through a
///   `sharding_constraint` with that annotation, so a weight's gradient is sharded like
///   the weight; `sharding_constraint`s of the forward pass constrain the cotangents
///   alike (GSPMD section 3.6).
///
/// A program holding an op that is not [`is_differentiable`] (the SPMD-only ops
/// axis_index and the collectives, which only exist in partitioned programs; `while`,
/// whose trip count is a run-time value) gives [`Error::NotDifferentiable`] for the
/// first one (in a region: when the sweep reaches its flow op). See
/// [`super`] for the rules and their conventions at ties and kinks.
pub fn grad(program: &Program, loss: usize, wrt: &[usize]) -> Result<Program> {
    verify(program)?;
    check_differentiable(program, false)?;
    let request = |problem: RequestProblem| Error::GradRequest {
        program: program.name.clone(),
        problem,
    };
    let loss_value = *program.outputs.get(loss).ok_or_else(|| {
        request(RequestProblem::NoSuchOutput {
            index: loss,
            outputs: program.outputs.len(),
        })
    })?;
    let loss_ty = program.ty(loss_value);
    if !loss_ty.dtype.is_float() || loss_ty.rank() != 0 {
        return Err(request(RequestProblem::LossNotScalar {
            index: loss,
            value: loss_value,
            ty: loss_ty.clone(),
        }));
    }
    let params = wrt
        .iter()
        .map(|&index| {
            let p = *program.params.get(index).ok_or_else(|| {
                request(RequestProblem::NoSuchParameter {
                    index,
                    params: program.params.len(),
                })
            })?;
            let ty = program.ty(p);
            if !ty.dtype.is_float() {
                return Err(request(RequestProblem::NotFloat {
                    index,
                    name: param_name(program, p),
                    ty: ty.clone(),
                }));
            }
            Ok(p)
        })
        .collect::<Result<Vec<ValueId>>>()?;

    let active = active_values(program, &params);
    let mut out = program.clone();
    out.name = format!("grad_{}", program.name);
    let mut e = Appender::new(&mut out, "gradient");
    let mut seeds = Vec::new();
    if active[loss_value.index()] {
        e.location = program.node(loss_value).location;
        seeds.push((
            loss_value,
            e.push(Op::Constant(Literal::full(&[], loss_ty.dtype, 1.0)), &[])?,
        ));
    }
    let cotangent = backward(&mut e, program, &active, &seeds)?;
    let gradients = (params.iter())
        .map(|&p| gradient(&mut e, program, p, &cotangent))
        .collect::<Result<Vec<ValueId>>>()?;
    out.outputs.extend(gradients);
    Ok(out)
}

/// The vector-Jacobian product of `region` as a program (the rules of control flow
/// build their backward regions from it): its parameters are `region`'s, then one
/// cotangent per entry of `seeds` (an output index; shaped like that output, named
/// `ct(<output name>)`, or `ct(<output name>, output <index>)` when that name is taken:
/// a value seeded as two outputs, two values of one name); its outputs are the
/// gradients with respect to the parameters numbered `wrt` (each f32), as [`grad`]
/// makes them. The forward nodes the gradients
/// do not need are dropped. A region holding an op that is not [`is_differentiable`]
/// is [`Error::NotDifferentiable`].
pub(super) fn vjp(region: &Program, wrt: &[usize], seeds: &[usize]) -> Result<Program> {
    vjp_reading(region, wrt, seeds, Remat::NothingSaveable).map(|(program, _)| program)
}

/// [`vjp`] reading the values of `region` that `remat` saves instead of recomputing
/// them: each one the gradients need becomes a parameter, after the seeds' (see
/// [`read_saved`]). Returns the program and those values of `region`, in parameter
/// order.
pub(super) fn vjp_reading(
    region: &Program,
    wrt: &[usize],
    seeds: &[usize],
    remat: Remat,
) -> Result<(Program, Vec<ValueId>)> {
    check_differentiable(region, true)?;
    let params: Vec<ValueId> = wrt.iter().map(|&i| region.params[i]).collect();
    let active = active_values(region, &params);
    let mut out = region.clone();
    out.name = format!("vjp_{}", region.name);
    let mut e = Appender::new(&mut out, "gradient");
    // One value can be several outputs (a scan body's `return h, h`), two values can
    // share a name: each seed gets its own parameter (the sweep adds up the seeds of
    // one value), named after its output number when its value's name is taken.
    let mut taken: HashSet<String> = (region.params.iter())
        .map(|&p| param_name(region, p))
        .collect();
    let seeds = (seeds.iter())
        .map(|&s| {
            let o = region.outputs[s];
            e.location = region.node(o).location;
            let mut name = format!("ct({})", param_name(region, o));
            if taken.contains(&name) {
                name = format!("ct({}, output {s})", param_name(region, o));
            }
            taken.insert(name.clone());
            (o, e.parameter(name, region.ty(o).clone(), None).1)
        })
        .collect::<Vec<_>>();
    let cotangent = backward(&mut e, region, &active, &seeds)?;
    let gradients = (params.iter())
        .map(|&p| gradient(&mut e, region, p, &cotangent))
        .collect::<Result<Vec<ValueId>>>()?;
    out.outputs = gradients;
    let saved = read_saved(&mut out, region, remat);
    Ok((eliminate_dead_code(&out), saved))
}

/// [`Error::NotDifferentiable`] for the first op of `program` (not of its regions)
/// that is not [`is_differentiable`]; in a `region`, SPMD-only ops are (they occur in
/// `shard_map` bodies, whose collectives have transposes).
fn check_differentiable(program: &Program, region: bool) -> Result<()> {
    let allowed = |k: crate::ir::OpKind| is_differentiable(k) || (region && k.is_spmd_only());
    match (program.values()).find(|&v| !allowed(program.node(v).op.kind())) {
        Some(v) => Err(not_differentiable(program.node(v), v)),
        None => Ok(()),
    }
}

/// The reverse sweep over `program`, appending through `e` to its copy: starting from
/// the cotangents `seeds` (a value of `program` and the cotangent given to it; seeds of
/// inactive values are ignored, two seeds of one value add up), the cotangent of every
/// active value that reaches a seed, indexed by value (`None` for the others). Each
/// control-flow instance is differentiated as a whole, at its first result node, from
/// the cotangents of all its results.
fn backward(
    e: &mut Appender<'_>,
    program: &Program,
    active: &[bool],
    seeds: &[(ValueId, ValueId)],
) -> Result<Vec<Option<ValueId>>> {
    let mut cotangent: Vec<Option<ValueId>> = vec![None; program.nodes.len()];
    for &(v, ct) in seeds {
        if active[v.index()] {
            cotangent[v.index()] = Some(add_to(e, cotangent[v.index()], ct)?);
        }
    }
    let instances = flow_instances(program);
    for (index, node) in program.nodes.iter().enumerate().rev() {
        let v = ValueId(index as u32);
        e.location = node.location;
        let operand_cotangents = if let Op::Flow { flow, .. } = &node.op {
            let results = &instances[&(Arc::as_ptr(flow), node.operands.clone())];
            if results.iter().flatten().min() != Some(&v) {
                continue;
            }
            let cts = (results.iter())
                .map(|nodes| {
                    (nodes.iter().filter_map(|r| cotangent[r.index()]))
                        .try_fold(None, |sum, c| add_to(e, sum, c).map(Some))
                })
                .collect::<Result<Vec<Option<ValueId>>>>()?;
            if cts.iter().all(Option::is_none) {
                continue;
            }
            let operands_active: Vec<bool> =
                (node.operands.iter()).map(|o| active[o.index()]).collect();
            let flow = FlowCall {
                flow,
                operands: &node.operands,
                results,
                operands_active: &operands_active,
            };
            flow_cotangents(e, &flow, &cts)?
        } else {
            let Some(ct) = cotangent[index] else {
                continue;
            };
            if let Some((input, c)) = pattern_cotangent(e, program, node, ct)? {
                cotangent[input.index()] = Some(add_to(e, cotangent[input.index()], c)?);
                continue;
            }
            (0..node.operands.len())
                .map(|i| match active[node.operands[i].index()] {
                    true => operand_cotangent(e, node, v, ct, i),
                    false => Ok(None),
                })
                .collect::<Result<Vec<Option<ValueId>>>>()?
        };
        for (&o, c) in node.operands.iter().zip(operand_cotangents) {
            if let Some(c) = c.filter(|_| active[o.index()]) {
                cotangent[o.index()] = Some(add_to(e, cotangent[o.index()], c)?);
            }
        }
    }
    Ok(cotangent)
}

/// `sum + c`, or `c` when there is no sum yet: cotangents of a value used several
/// times add up.
fn add_to(e: &mut Appender<'_>, sum: Option<ValueId>, c: ValueId) -> Result<ValueId> {
    match sum {
        Some(prev) => e.add(prev, c),
        None => Ok(c),
    }
}

/// The gradient output for parameter `p` of `program`: its cotangent (zeros if none
/// reached it), pinned to the parameter's annotation if it has one, named
/// `grad(<parameter name>)` unless the value already has a name.
fn gradient(
    e: &mut Appender<'_>,
    program: &Program,
    p: ValueId,
    cotangent: &[Option<ValueId>],
) -> Result<ValueId> {
    let node = program.node(p);
    e.location = node.location;
    let g = match cotangent[p.index()] {
        Some(g) => g,
        None => e.zeros_like(p)?,
    };
    let g = match &node.annotation {
        Some(sharding) => e.constrain(g, Some(sharding.clone()))?,
        None => g,
    };
    // One cotangent can serve two gradients (`wrt` naming a parameter twice, or
    // `loss = a + b`); it keeps the first name.
    e.name_if_unnamed(g, format!("grad({})", param_name(program, p)));
    Ok(g)
}

/// The values that depend on one of `params` through float values and ops that
/// [`passes_gradient`]: the only ones a cotangent can flow into.
fn active_values(program: &Program, params: &[ValueId]) -> Vec<bool> {
    let mut active = vec![false; program.nodes.len()];
    for v in program.values() {
        let node = program.node(v);
        let depends = passes_gradient(&node.op) && node.operands.iter().any(|o| active[o.index()]);
        active[v.index()] = node.ty.dtype.is_float() && (params.contains(&v) || depends);
    }
    active
}

pub(super) fn param_name(program: &Program, p: ValueId) -> String {
    program
        .node(p)
        .name
        .clone()
        .unwrap_or_else(|| p.to_string())
}
