//! Running control flow ([`Flow`]): the regions of `while`, `scan` and `cond` run
//! through the same evaluation loop as the program holding them, so a region of a
//! per-device program calls the communicator like any other node (every device takes
//! the same trip count and branch: see ARCHITECTURE.md, "Regions"). A manual region
//! only occurs in global programs (the partitioner emits its body in place): its
//! reference meaning is `super::manual`'s.

use ndarray::Axis;

use super::deadline;
use crate::error::{Error, Result};
use crate::ir::{Flow, Literal, Program, TensorType, map_literal};

/// Runs one region on `inputs`, its live values limited to the given bytes: the
/// caller's evaluation loop, recursively.
pub(super) type RunRegion<'a> = dyn FnMut(&Program, &[Literal], usize) -> Result<Vec<Literal>> + 'a;

/// All results of `flow` on `operands` (see [`Flow`] for each op's semantics), with
/// `memory_limit` bytes for each region run. A region's error is returned as it is;
/// a fault of the op itself (a predicate that is not a bool scalar, which the verifier
/// rules out) is `fail(message)`. A loop records the iteration it is at for a run's
/// deadline (`super::deadline`), which names it when the run is cancelled.
pub(super) fn run_flow(
    flow: &Flow,
    operands: &[&Literal],
    memory_limit: usize,
    run: &mut RunRegion<'_>,
    fail: &dyn Fn(String) -> Error,
) -> Result<Vec<Literal>> {
    let owned = |xs: &[&Literal]| -> Vec<Literal> { xs.iter().map(|&x| x.clone()).collect() };
    Ok(match flow {
        Flow::While { cond, body } => {
            let n = body.outputs.len();
            let mut inputs = owned(operands);
            let outer = deadline::enter_iteration(0);
            for i in 0.. {
                deadline::enter_iteration(i);
                let p = run(cond, &inputs, memory_limit)?;
                if !truth(&p[0]).map_err(fail)? {
                    break;
                }
                let next = run(body, &inputs, memory_limit)?;
                for (slot, value) in inputs.iter_mut().zip(next) {
                    *slot = value;
                }
            }
            deadline::leave_loop(outer);
            inputs.truncate(n);
            inputs
        }
        Flow::Scan {
            body,
            carried,
            stacked,
            length,
            reverse,
            ..
        } => {
            let (n, k) = (*carried, *stacked);
            // The stacked operands are read in place, a slice per iteration: only the
            // carried values and the captures are copied.
            let xs = &operands[n..n + k];
            let mut inputs = owned(&operands[..n]);
            inputs.extend(owned(&operands[n + k..]));
            // Each output `y` is stacked into its result as the iterations make it
            // (the memory analysis holds the results from the loop's start).
            let y_types: Vec<&TensorType> = body.outputs[n..].iter().map(|&o| body.ty(o)).collect();
            let mut ys: Vec<Literal> = (y_types.iter())
                .map(|ty| {
                    let mut shape = vec![*length];
                    shape.extend_from_slice(&ty.shape);
                    Literal::full(&shape, ty.dtype, 0.0)
                })
                .collect();
            let outer = deadline::enter_iteration(0);
            for step in 0..*length {
                deadline::enter_iteration(step);
                let i = if *reverse { length - 1 - step } else { step };
                let mut args = inputs[..n].to_vec();
                args.extend(xs.iter().map(|&x| index_leading(x, i)));
                args.extend_from_slice(&inputs[n..]);
                let mut outs = run(body, &args, memory_limit)?;
                for (stacked, y) in ys.iter_mut().zip(outs.split_off(n)) {
                    write_leading(stacked, i, &y).map_err(fail)?;
                }
                for (slot, value) in inputs.iter_mut().zip(outs) {
                    *slot = value;
                }
            }
            deadline::leave_loop(outer);
            inputs.truncate(n);
            inputs.extend(ys);
            inputs
        }
        Flow::Cond { on_true, on_false } => {
            let branch = if truth(operands[0]).map_err(fail)? {
                on_true
            } else {
                on_false
            };
            run(branch, &owned(&operands[1..]), memory_limit)?
        }
        Flow::Manual { body, spec } => {
            super::manual::run_manual(body, spec, operands, memory_limit, run, fail)?
        }
    })
}

/// The value of a bool scalar.
fn truth(p: &Literal) -> std::result::Result<bool, String> {
    match p.as_bool().and_then(|a| a.iter().next().copied()) {
        Some(b) if p.shape().is_empty() => Ok(b),
        _ => Err(format!("a predicate must be pred[], got {}", p.dtype())),
    }
}

/// `x[i]`: the leading dim removed.
fn index_leading(x: &Literal, i: usize) -> Literal {
    map_literal!(x, a => a.index_axis(Axis(0), i).to_owned())
}

/// Writes `part` at index `i` of `stacked`'s leading dim; a part of another type than
/// the rest of `stacked` is an `Err`.
fn write_leading(
    stacked: &mut Literal,
    i: usize,
    part: &Literal,
) -> std::result::Result<(), String> {
    macro_rules! write {
        ($($variant:ident),*) => {
            match (stacked, part) {
                $((Literal::$variant(s), Literal::$variant(p)) if s.shape()[1..] == *p.shape() => {
                    s.index_axis_mut(Axis(0), i).assign(p);
                    Ok(())
                })*
                (s, p) => Err(format!(
                    "a scan output is {}{:?} where {}{:?} was declared",
                    p.dtype(),
                    p.shape(),
                    s.dtype(),
                    &s.shape()[1..]
                )),
            }
        };
    }
    write!(F32, BF16, F16, I32, Bool)
}
