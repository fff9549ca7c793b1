//! The single-device meaning of a manual region ([`Flow::Manual`], `shard_map`): the
//! reference interpreter cuts each operand into the blocks of every device of the
//! manual axes, runs the body on all of them in lockstep (node by node, each device's
//! local ops through the kernels, each collective computed from every member's operand
//! here), and assembles the output blocks by the out-specs (of devices holding the
//! same block, the lowest's). Collectives follow the IR's definitions of the SPMD ops
//! (`ir::Op`), with the manual axes' mesh giving each device's groups; the thread mesh
//! runs them through its communicator, so the two are independent implementations.
//!
//! Control flow inside a body runs per device through the interpreter and so must hold
//! no collective (the builder rejects one there).

use std::collections::HashMap;
use std::sync::Arc;

use super::blocks::{assemble, shard_literal};
use super::flow::{RunRegion, run_flow};
use super::kernels;
use crate::error::{Error, Result};
use crate::ir::{AxisGroup, BinaryOp, Flow, Literal, ManualSpec, Op, Program, ReduceKind};
use crate::sharding::Mesh;

/// The results of the manual region (`body`, `spec`) on the global `operands`.
pub(super) fn run_manual(
    body: &Program,
    spec: &ManualSpec,
    operands: &[&Literal],
    memory_limit: usize,
    run: &mut RunRegion<'_>,
    fail: &dyn Fn(String) -> Error,
) -> Result<Vec<Literal>> {
    let mesh = &spec.mesh;
    let devices = mesh.num_devices();
    // values[v][d]: device d's value of body node v.
    let mut values: Vec<Vec<Literal>> = Vec::with_capacity(body.nodes.len());
    let mut flows: HashMap<(*const Flow, Vec<usize>), Vec<Vec<Literal>>> = HashMap::new();
    for node in &body.nodes {
        let args = |d: usize| -> Vec<&Literal> {
            node.operands
                .iter()
                .map(|o| &values[o.index()][d])
                .collect()
        };
        let at_node = |message: String| {
            fail(format!(
                "in the shard_map body, {}: {message}",
                node.op.name()
            ))
        };
        let per_device: Vec<Literal> = match &node.op {
            Op::Parameter { index, .. } => (0..devices)
                .map(|d| shard_literal(operands[*index], &spec.in_specs[*index], mesh, d))
                .collect(),
            Op::Flow { flow, result } => {
                let key = (
                    Arc::as_ptr(flow),
                    node.operands.iter().map(|o| o.index()).collect(),
                );
                if !flows.contains_key(&key) {
                    let mut all = Vec::with_capacity(devices);
                    for d in 0..devices {
                        all.push(run_flow(flow, &args(d), memory_limit, run, fail)?);
                    }
                    flows.insert(key.clone(), all);
                }
                flows[&key].iter().map(|r| r[*result].clone()).collect()
            }
            op if op.is_spmd_only() => {
                collective(op, mesh, &|d| args(d), &node.ty).map_err(at_node)?
            }
            op => (0..devices)
                .map(|d| kernels::eval(op, &args(d), &node.ty))
                .collect::<std::result::Result<_, _>>()
                .map_err(at_node)?,
        };
        values.push(per_device);
    }
    (body.outputs.iter().zip(&spec.out_specs))
        .map(|(o, s)| {
            let block = body.ty(*o);
            let global = spec.global(s, block).map_err(fail)?;
            assemble(&values[o.index()], s, mesh, &global.shape)
        })
        .collect()
}

/// Every device's result of the SPMD op `op` (a collective or `axis_index`) whose
/// operands on device `d` are `args(d)`, each of type `ty`.
fn collective<'a>(
    op: &Op,
    mesh: &Mesh,
    args: &dyn Fn(usize) -> Vec<&'a Literal>,
    ty: &crate::ir::TensorType,
) -> std::result::Result<Vec<Literal>, String> {
    let e = |e: Error| e.to_string();
    let index = |d: usize, g: &AxisGroup| mesh.group_index(d, &g.axes).map_err(e);
    let members = |d: usize, axes: &[String]| -> std::result::Result<Vec<usize>, String> {
        let size = mesh.axes_size(axes);
        (0..size)
            .map(|j| mesh.group_member(d, axes, j).map_err(e))
            .collect()
    };
    let operand = |d: usize| args(d)[0];
    // The group's operands combined with `kind`, in group order.
    let reduce = |d: usize, g: &AxisGroup, kind: ReduceKind| {
        let combine = Op::Binary(match kind {
            ReduceKind::Sum => BinaryOp::Add,
            ReduceKind::Max => BinaryOp::Max,
            ReduceKind::Min => BinaryOp::Min,
        });
        let ms = members(d, &g.axes)?;
        let first = operand(ms[0]);
        let t = kernels::type_of(first);
        ms[1..].iter().try_fold(first.clone(), |acc, &m| {
            kernels::eval(&combine, &[&acc, operand(m)], &t)
        })
    };
    // Block `i` of `size` along `dim` of `x`.
    let block = |x: &Literal, dim: usize, i: usize, size: usize| {
        let shape = x.shape();
        let n = shape[dim] / size;
        let mut start = vec![0; shape.len()];
        let mut limit = shape.clone();
        start[dim] = i * n;
        limit[dim] = (i + 1) * n;
        let stride = vec![1; shape.len()];
        let mut t = kernels::type_of(x);
        t.shape[dim] = n;
        kernels::eval(
            &Op::Slice {
                start,
                limit,
                stride,
            },
            &[x],
            &t,
        )
    };
    (0..mesh.num_devices())
        .map(|d| match op {
            Op::AxisIndex(g) => Ok(Literal::full(
                &[],
                crate::ir::DType::I32,
                index(d, g)? as f64,
            )),
            Op::AllReduce { group, kind } => reduce(d, group, *kind),
            Op::AllGather { group, dim } => {
                let ms = members(d, &group.axes)?;
                let parts: Vec<&Literal> = ms.iter().map(|&m| operand(m)).collect();
                kernels::eval(&Op::Concatenate(*dim), &parts, ty)
            }
            Op::ReduceScatter { group, kind, dim } => block(
                &reduce(d, group, *kind)?,
                *dim,
                index(d, group)?,
                group.size,
            ),
            Op::AllToAll {
                group,
                split_dim,
                concat_dim,
            } => {
                let i = index(d, group)?;
                let parts = (members(d, &group.axes)?.iter())
                    .map(|&m| block(operand(m), *split_dim, i, group.size))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let refs: Vec<&Literal> = parts.iter().collect();
                kernels::eval(&Op::Concatenate(*concat_dim), &refs, ty)
            }
            Op::CollectivePermute { group, from } => {
                let source = mesh.group_member(d, from, index(d, group)?).map_err(e)?;
                Ok(operand(source).clone())
            }
            Op::CollectiveShift {
                group,
                offset,
                wrap,
                mirror,
            } => {
                let i = index(d, group)?;
                let pairs = group.shift_pairs(*offset, *wrap, *mirror);
                match pairs.iter().find(|&&(_, t)| t == i) {
                    Some(&(s, _)) => {
                        Ok(operand(mesh.group_member(d, &group.axes, s).map_err(e)?).clone())
                    }
                    None => Ok(Literal::full(&ty.shape, ty.dtype, 0.0)),
                }
            }
            other => Err(format!("{} is not an SPMD op", other.name())),
        })
        .collect()
}
