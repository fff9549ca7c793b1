//! The reverse-mode rules of control flow: a [`Flow`] instance is differentiated as a
//! whole (all its results' cotangents at once) into another flow op whose regions are
//! the [vector-Jacobian products](super::sweep::vjp) of the forward regions.
//!
//! - `scan` (and `fori_loop`, a scan with a counter): the forward scan also stacks the
//!   carried values each iteration starts from (its residuals, extra `y` outputs of
//!   the same instance, so the loop still runs once); the backward pass is a scan the
//!   other way over them, carrying the carried values' cotangents and the sums of the
//!   captures' gradients, and stacking the stacked operands' gradients. Its body
//!   recomputes the forward body from the stacked carry, then runs the body's VJP: the
//!   memory of a loop is its carried values per iteration, not every intermediate
//!   (JAX's `scan` under `jax.checkpoint`). The scan's [`Remat`] policy can keep more:
//!   the forward scan then also stacks the values it saves (the products under
//!   `dots_saveable`, everything under `everything_saveable`) and the backward body
//!   reads them instead of recomputing them ([`super::remat`]).
//! - `cond`: a `cond` on the same predicate whose branches are the VJPs of the
//!   forward branches (each recomputes its forward part), taking the captures and the
//!   results' cotangents and returning the captures' gradients.
//! - `while`: not differentiable; its trip count is a run-time value (JAX rejects it
//!   too). `fori_loop` and `scan` have static trip counts.

use std::sync::Arc;

use super::sweep::{param_name, vjp, vjp_reading};
use crate::error::Result;
use crate::ir::{Appender, Flow, Op, Program, Remat, TensorType, ValueId};

/// One flow instance of the forward program, as the sweep sees it.
pub(super) struct FlowCall<'a> {
    /// The shared op.
    pub flow: &'a Arc<Flow>,
    /// Its operands.
    pub operands: &'a [ValueId],
    /// The nodes of each result (none for a result no node reads).
    pub results: &'a [Vec<ValueId>],
    /// Which operands are active (a gradient to them is wanted).
    pub operands_active: &'a [bool],
}

/// The cotangent of each operand of `call` (`None` where none flows) given the
/// cotangent of each of its results (`None`: zero), emitted through `e` at its
/// location. A `scan` instance's result nodes are switched to the same scan with its
/// residuals as extra outputs (the values they compute are unchanged).
pub(super) fn flow_cotangents(
    e: &mut Appender<'_>,
    call: &FlowCall<'_>,
    cts: &[Option<ValueId>],
) -> Result<Vec<Option<ValueId>>> {
    match call.flow.as_ref() {
        Flow::Scan {
            body,
            carried,
            stacked,
            length,
            reverse,
            remat,
        } => scan(
            e,
            call,
            cts,
            body,
            (*carried, *stacked, *length, *reverse),
            *remat,
        ),
        Flow::Cond { on_true, on_false } => cond(e, call, cts, on_true, on_false),
        Flow::Manual { body, spec } => super::manual::manual(e, call, cts, body, spec),
        // The sweep rejects programs holding a `while` before it starts.
        Flow::While { .. } => Ok(vec![None; call.operands.len()]),
    }
}

fn is_float(ty: &TensorType) -> bool {
    ty.dtype.is_float()
}

/// The VJP of a scan with `n` carried values, `k` stacked operands, `length`
/// iterations. Backward scan layout (`nc` float carried values, `nz` active float
/// captures, `nx` active float stacked operands, `ny` outputs `y` with a cotangent):
/// - carried: the carried values' cotangents (`nc`), then the captures' gradient
///   sums (`nz`, from zeros);
/// - stacked: the forward carries each iteration started from (all `n`), the forward
///   stacked operands (all `k`), the `y` cotangents (`ny`), the forward values `remat`
///   saves (`ns`, stacked by the forward scan after its carries);
/// - captures: the forward captures;
/// - results: the initial carried values' cotangents, the captures' gradients, the
///   stacked operands' gradients (stacked).
fn scan(
    e: &mut Appender<'_>,
    call: &FlowCall<'_>,
    cts: &[Option<ValueId>],
    body: &Program,
    (n, k, length, reverse): (usize, usize, usize, bool),
    remat: Remat,
) -> Result<Vec<Option<ValueId>>> {
    let operands = call.operands;
    let m = operands.len() - n - k;
    let p = body.outputs.len() - n;
    let param_ty = |j: usize| body.ty(body.params[j]);
    let wanted = |j: usize| is_float(param_ty(j)) && call.operands_active[j];
    // Every float carried value takes part: a cotangent flows around the loop even to a
    // value whose initial value is inactive.
    let carried: Vec<usize> = (0..n).filter(|&j| is_float(param_ty(j))).collect();
    let xs: Vec<usize> = (n..n + k).filter(|&j| wanted(j)).collect();
    let zs: Vec<usize> = (n + k..n + k + m).filter(|&j| wanted(j)).collect();
    let ys: Vec<usize> = (0..p).filter(|&j| cts[n + j].is_some()).collect();
    let (nc, nz, nx, ny) = (carried.len(), zs.len(), xs.len(), ys.len());
    let mut out = vec![None; operands.len()];
    if nc + nz + nx == 0 {
        return Ok(out);
    }

    // The backward body: the VJP (parameters: the body's, then the seeds' cotangents;
    // outputs: gradients in `wrt` order), then the gradient sums, reordered.
    let wrt: Vec<usize> = [&carried[..], &xs, &zs].concat();
    let seeds: Vec<usize> = carried
        .iter()
        .copied()
        .chain(ys.iter().map(|j| n + j))
        .collect();
    let (mut backward_body, saved) = vjp_reading(body, &wrt, &seeds, remat)?;
    let ns = saved.len();
    let grads = backward_body.outputs.clone();
    let (g_carried, g_xs, g_zs) = (&grads[..nc], &grads[nc..nc + nx], &grads[nc + nx..]);
    let mut sums = Vec::with_capacity(nz);
    {
        let mut b = Appender::new(&mut backward_body, "gradient");
        for (&j, &g) in zs.iter().zip(g_zs) {
            b.location = body.node(body.params[j]).location;
            let name = format!("sum(grad({}))", param_name(body, body.params[j]));
            let (_, sum) = b.parameter(name, param_ty(j).clone(), None);
            sums.push(b.add(sum, g)?);
        }
    }
    backward_body.outputs = [g_carried, &sums, g_xs].concat();
    let forward_params = n + k + m;
    let (ct_carried, ct_ys) = (forward_params..forward_params + nc, forward_params + nc..);
    let saved_params = forward_params + nc + ny..forward_params + nc + ny + ns;
    let sum_params = saved_params.end..;
    let order: Vec<usize> = (ct_carried.clone())
        .chain(sum_params.take(nz))
        .chain(0..n + k)
        .chain(ct_ys.take(ny))
        .chain(saved_params)
        .chain(n + k..forward_params)
        .collect();
    backward_body.permute_params(&order);
    let backward = Arc::new(Flow::Scan {
        body: backward_body,
        carried: nc + nz,
        stacked: n + k + ny + ns,
        length,
        reverse: !reverse,
        remat: Remat::default(),
    });

    // The forward scan with its residuals: the carried values each iteration starts
    // from, then the values `remat` saves.
    let mut residual_body = body.clone();
    residual_body.outputs.extend_from_slice(&body.params[..n]);
    residual_body.outputs.extend_from_slice(&saved);
    let forward = Arc::new(Flow::Scan {
        body: residual_body,
        carried: n,
        stacked: k,
        length,
        reverse,
        remat,
    });
    for (result, nodes) in call.results.iter().enumerate() {
        for &node in nodes {
            let op = Op::Flow {
                flow: forward.clone(),
                result,
            };
            e.replace_op(node, op);
        }
    }
    let residuals = (0..n + ns)
        .map(|j| {
            let op = Op::Flow {
                flow: forward.clone(),
                result: n + p + j,
            };
            e.push(op, operands)
        })
        .collect::<Result<Vec<ValueId>>>()?;

    let (residuals, saved) = residuals.split_at(n);
    let mut backward_operands = Vec::with_capacity(nc + nz + n + k + ny + ns + m);
    for &j in &carried {
        backward_operands.push(match cts[j] {
            Some(ct) => ct,
            None => e.zeros_like(operands[j])?,
        });
    }
    for &j in &zs {
        backward_operands.push(e.zeros_like(operands[j])?);
    }
    backward_operands.extend_from_slice(residuals);
    backward_operands.extend_from_slice(&operands[n..n + k]);
    backward_operands.extend(ys.iter().filter_map(|&j| cts[n + j]));
    backward_operands.extend_from_slice(saved);
    backward_operands.extend_from_slice(&operands[n + k..]);

    let targets = carried.iter().chain(&zs).chain(&xs);
    for (result, &j) in targets.enumerate() {
        let op = Op::Flow {
            flow: backward.clone(),
            result,
        };
        out[j] = Some(e.push(op, &backward_operands)?);
    }
    Ok(out)
}

/// The VJP of a `cond`: a `cond` on the same predicate over the captures and the
/// results' cotangents, each branch the VJP of the forward one, returning the active
/// float captures' gradients.
fn cond(
    e: &mut Appender<'_>,
    call: &FlowCall<'_>,
    cts: &[Option<ValueId>],
    on_true: &Program,
    on_false: &Program,
) -> Result<Vec<Option<ValueId>>> {
    let operands = call.operands;
    // Branch parameter `j` is operand `j + 1`.
    let zs: Vec<usize> = (0..operands.len() - 1)
        .filter(|&j| is_float(e.ty(operands[j + 1])) && call.operands_active[j + 1])
        .collect();
    let ys: Vec<usize> = (0..cts.len()).filter(|&j| cts[j].is_some()).collect();
    let mut out = vec![None; operands.len()];
    if zs.is_empty() {
        return Ok(out);
    }
    let backward = Arc::new(Flow::Cond {
        on_true: vjp(on_true, &zs, &ys)?,
        on_false: vjp(on_false, &zs, &ys)?,
    });
    let backward_operands: Vec<ValueId> = (operands.iter().copied())
        .chain(cts.iter().flatten().copied())
        .collect();
    for (result, &j) in zs.iter().enumerate() {
        let op = Op::Flow {
            flow: backward.clone(),
            result,
        };
        out[j + 1] = Some(e.push(op, &backward_operands)?);
    }
    Ok(out)
}
