//! The per-device runtime: runs one device's copy of a partitioned program. Local ops go
//! to the [`kernels`](super::kernels); `axis_index` reads the device's mesh
//! coordinates; collectives go to the [`Communicator`].

use super::communicator::Communicator;
use std::borrow::Cow;

use super::interpreter::{eval_kernel, execute, lend};
use super::kernels::Operands;
use super::plan::Plan;
use crate::error::Result;
use crate::ir::{AxisGroup, DType, Literal, Node, Op, Program};
use crate::sharding::Mesh;

/// Runs `program` (a per-device program) on the device of `comm` with its local
/// `inputs`, its live values limited to `memory_limit` bytes (an
/// [`Error::OutOfMemory`](crate::Error::OutOfMemory) beyond it); returns its local
/// outputs.
pub fn run_on_device(
    program: &Program,
    comm: &dyn Communicator,
    inputs: &[Literal],
    memory_limit: usize,
) -> Result<Vec<Literal>> {
    run_planned(
        program,
        &Plan::new(program),
        comm,
        lend(inputs),
        memory_limit,
    )
}

/// [`run_on_device`] with the program's plan made beforehand ([`Plan::donating`] of
/// `program`) and its inputs owned where the plan donates them (see [`execute`]).
pub(crate) fn run_planned(
    program: &Program,
    plan: &Plan,
    comm: &dyn Communicator,
    inputs: Vec<Cow<'_, Literal>>,
    memory_limit: usize,
) -> Result<Vec<Literal>> {
    execute(
        program,
        plan,
        inputs,
        memory_limit,
        |node, operands, typed| eval_on_device(comm, node, operands, typed),
    )
}

/// One node on this device: a collective's operand is moved to the communicator when
/// the loop hands it over (else copied); local ops go to [`eval_kernel`].
fn eval_on_device(
    comm: &dyn Communicator,
    node: &Node,
    operands: &mut Operands<'_>,
    typed: bool,
) -> Result<Literal, String> {
    let x = |operands: &mut Operands<'_>| -> Result<Literal, String> {
        let first = operands.drain(..).next();
        let first = first.ok_or_else(|| format!("{} takes an operand", node.op.name()))?;
        Ok(first.into_value()?.into_owned())
    };
    let collective = match &node.op {
        Op::AxisIndex(group) => {
            let index = comm
                .mesh()
                .group_index(comm.device(), &group.axes)
                .map_err(|e| e.to_string())?;
            return Ok(Literal::full(&[], DType::I32, index as f64));
        }
        Op::AllReduce { group, kind } => comm.all_reduce(&group.axes, *kind, x(operands)?),
        Op::AllGather { group, dim } => comm.all_gather(&group.axes, *dim, x(operands)?),
        Op::ReduceScatter { group, kind, dim } => {
            comm.reduce_scatter(&group.axes, *kind, *dim, x(operands)?)
        }
        Op::AllToAll {
            group,
            split_dim,
            concat_dim,
        } => comm.all_to_all(&group.axes, *split_dim, *concat_dim, x(operands)?),
        Op::CollectivePermute { group, from } => {
            let pairs = permute_pairs(comm.mesh(), comm.device(), group, from)?;
            comm.collective_permute(&group.axes, &pairs, x(operands)?)
        }
        Op::CollectiveShift {
            group,
            offset,
            wrap,
            mirror,
        } => {
            let pairs = group.shift_pairs(*offset, *wrap, *mirror);
            comm.collective_permute(&group.axes, &pairs, x(operands)?)
        }
        _ => return eval_kernel(node, operands, typed),
    };
    collective.map_err(|e| e.to_string())
}

/// The `(source, target)` group indices of a collective permute: the receiver at group
/// index `j` (over `group.axes`) gets the operand of the member whose index over `from`
/// (the same axes in another order) is `j`.
fn permute_pairs(
    mesh: &Mesh,
    device: usize,
    group: &AxisGroup,
    from: &[String],
) -> Result<Vec<(usize, usize)>, String> {
    let same_axes = from.len() == group.axes.len() && group.axes.iter().all(|a| from.contains(a));
    if !same_axes {
        return Err(format!(
            "permute from axes {from:?} that are not the group's {:?} reordered",
            group.axes
        ));
    }
    (0..group.size)
        .map(|j| {
            let sender = mesh.group_member(device, from, j)?;
            Ok((mesh.group_index(sender, &group.axes)?, j))
        })
        .collect::<Result<_>>()
        .map_err(|e| e.to_string())
}
