//! Sums carried around a loop kept as pending sums (XLA's gradient accumulation in a
//! loop's carry): a scan whose body adds an all-reduced value to a carried sum each
//! iteration (the backward scan's gradient of a loop-captured weight, `sum(grad(w))`,
//! reduced over the batch axes) all-reduces it once after the loop instead. The carry
//! holds each device's partial sum (the value's `unreduced` axes), the body adds the
//! unreduced contribution, and the driver's reshard of the scan's result reduces it.
//!
//! Why here and not in autodiff: the backward scan is built before propagation and
//! knows no sharding, and whether a contribution is a pending sum (and over which axes)
//! is the contraction's strategy, chosen by the partitioner. The partitioned body shows
//! it: a sum all-reduce whose only way out is into the carried sum, through ops linear
//! in it (transpose, reshape, negation), each with that one user.

use crate::ir::{BinaryOp, Op, Program, ReduceKind, UnaryOp, ValueId};

/// The carried values of a partitioned scan `body` (the first `carried` parameters and
/// outputs) that it accumulates from an all-reduced sum, each with the all-reduce's
/// axes; `body` is rewritten to accumulate the partial sums (the all-reduce becomes
/// the identity and the values from it to the carried output are marked pending over
/// those axes). The caller gives the carry and the result those pending axes: a carried
/// value of a scan of `length > 1` then moves fewer bytes (one reduction, not one per
/// iteration).
pub(crate) fn pending_accumulators(
    body: &mut Program,
    carried: usize,
) -> Vec<(usize, Vec<String>)> {
    let users = body.users();
    let mut found = Vec::new();
    for j in 0..carried {
        let Some((chain, reduce, axes)) = accumulation(body, &users, j) else {
            continue;
        };
        let operand = body.node(reduce).operands[0];
        let shape = body.ty(operand).shape.clone();
        let identity = body.node_mut(reduce);
        identity.op = Op::Reshape(shape);
        identity.why.clear();
        let marked = [body.params[j], body.outputs[j], reduce];
        for v in marked.into_iter().chain(chain) {
            if let Some(s) = &mut body.node_mut(v).sharding {
                s.unreduced.extend(axes.iter().cloned());
            }
        }
        found.push((j, axes));
    }
    found
}

/// For carried value `j` of `body`: when its output is `param_j + x` (either order),
/// the parameter and the output read by nothing else, and `x` comes from one sum
/// all-reduce over axes the carry does not use, through single-user linear ops: those
/// ops' values, the all-reduce and its axes.
fn accumulation(
    body: &Program,
    users: &[Vec<ValueId>],
    j: usize,
) -> Option<(Vec<ValueId>, ValueId, Vec<String>)> {
    let (param, out) = (body.params[j], body.outputs[j]);
    let sum = body.node(out);
    let once = |v: ValueId| body.outputs.iter().filter(|&&o| o == v).count() == 1;
    if sum.op != Op::Binary(BinaryOp::Add) || !once(out) || !users[out.index()].is_empty() {
        return None;
    }
    if users[param.index()] != [out] || !sum.ty.dtype.is_float() {
        return None;
    }
    let mut x = match sum.operands[..] {
        [a, b] if a == param && b != param => b,
        [a, b] if b == param && a != param => a,
        _ => return None,
    };
    let mut chain = Vec::new();
    loop {
        if users[x.index()].len() != 1 || body.outputs.contains(&x) {
            return None;
        }
        match &body.node(x).op {
            Op::Transpose(_) | Op::Reshape(_) | Op::Unary(UnaryOp::Neg) => {
                chain.push(x);
                x = body.node(x).operands[0];
            }
            Op::AllReduce {
                group,
                kind: ReduceKind::Sum,
            } => {
                // The carry may hold pending sums only over axes it neither splits on
                // nor already holds pending.
                let held = body.node(param).sharding.as_ref()?;
                let mut taken = held.axes().chain(held.unreduced.iter().map(String::as_str));
                if taken.any(|a| group.axes.iter().any(|g| g == a)) {
                    return None;
                }
                return Some((chain, x, group.axes.clone()));
            }
            _ => return None,
        }
    }
}
