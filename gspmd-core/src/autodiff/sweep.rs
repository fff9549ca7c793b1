//! The reverse sweep: copies the forward program, then walks it backwards from the loss,
//! asking the [registry](super::registry) for each operand's cotangent and summing the
//! cotangents of values used several times. It knows no op.

use super::registry::{is_differentiable, not_differentiable, operand_cotangent, passes_gradient};
use crate::error::{Error, Result};
use crate::ir::Appender;
use crate::ir::{DType, Literal, Op, Program, ValueId, verify};

/// Reverse-mode gradient of `program`'s output number `loss` with respect to the
/// parameters numbered `wrt`, as a new program.
///
/// The loss must be an f32 scalar and each `wrt` parameter f32; otherwise, or for an
/// index out of range, [`Error::GradRequest`]. The program is verified first.
///
/// The result has the same parameters. Its nodes are the forward nodes unchanged (same
/// order, so every `%i` keeps its id), then the backward nodes, each located at the
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
/// axis_index and the collectives, which only exist in partitioned
/// programs; the control-flow ops `while`, `scan` and `cond`, until they get rules) gives [`Error::NotDifferentiable`] for the first one. See
/// [`super`] for the rules and their conventions at ties and kinks.
pub fn grad(program: &Program, loss: usize, wrt: &[usize]) -> Result<Program> {
    verify(program)?;
    if let Some(v) = (program.values()).find(|&v| !is_differentiable(program.node(v).op.kind())) {
        return Err(not_differentiable(program.node(v), v));
    }
    let request = |message: String| Error::GradRequest {
        program: program.name.clone(),
        message,
    };
    let loss_value = *program.outputs.get(loss).ok_or_else(|| {
        request(format!(
            "loss output {loss} is out of range: the program has {} outputs",
            program.outputs.len()
        ))
    })?;
    let loss_ty = program.ty(loss_value);
    if loss_ty.dtype != DType::F32 || loss_ty.rank() != 0 {
        return Err(request(format!(
            "loss output {loss} ({loss_value}) is {loss_ty}, not an f32 scalar"
        )));
    }
    let params = wrt
        .iter()
        .map(|&index| {
            let p = *program.params.get(index).ok_or_else(|| {
                request(format!(
                    "parameter {index} is out of range: the program has {} parameters",
                    program.params.len()
                ))
            })?;
            let ty = program.ty(p);
            if ty.dtype != DType::F32 {
                return Err(request(format!(
                    "parameter {index} ({}) is {ty}: only f32 parameters have gradients",
                    param_name(program, p)
                )));
            }
            Ok(p)
        })
        .collect::<Result<Vec<ValueId>>>()?;

    let active = active_values(program, &params);
    let mut out = program.clone();
    out.name = format!("grad_{}", program.name);
    let mut e = Appender::new(&mut out, "gradient");
    let mut cotangent: Vec<Option<ValueId>> = vec![None; program.nodes.len()];
    if active[loss_value.index()] {
        e.location = program.node(loss_value).location;
        cotangent[loss_value.index()] = Some(e.push(Op::Constant(Literal::scalar_f32(1.0)), &[])?);
    }
    for (index, node) in program.nodes.iter().enumerate().rev() {
        let Some(ct) = cotangent[index] else {
            continue;
        };
        let v = ValueId(index as u32);
        e.location = node.location;
        for (i, &o) in node.operands.iter().enumerate() {
            if !active[o.index()] {
                continue;
            }
            if let Some(c) = operand_cotangent(&mut e, node, v, ct, i)? {
                let sum = match cotangent[o.index()] {
                    Some(prev) => e.add(prev, c)?,
                    None => c,
                };
                cotangent[o.index()] = Some(sum);
            }
        }
    }

    let mut gradients = Vec::with_capacity(params.len());
    for &p in &params {
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
        gradients.push(g);
    }
    out.outputs.extend(gradients);
    Ok(out)
}

/// The values that depend on one of `params` through f32 values and ops that
/// [`passes_gradient`]: the only ones a cotangent can flow into.
fn active_values(program: &Program, params: &[ValueId]) -> Vec<bool> {
    let mut active = vec![false; program.nodes.len()];
    for v in program.values() {
        let node = program.node(v);
        let depends = passes_gradient(&node.op) && node.operands.iter().any(|o| active[o.index()]);
        active[v.index()] = node.ty.dtype == DType::F32 && (params.contains(&v) || depends);
    }
    active
}

fn param_name(program: &Program, p: ValueId) -> String {
    program
        .node(p)
        .name
        .clone()
        .unwrap_or_else(|| p.to_string())
}
