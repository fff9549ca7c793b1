//! The per-device runtime: runs one device's copy of a partitioned program. Local ops go
//! to the [`kernels`](super::kernels); `axis_index` reads the device's mesh
//! coordinates; collectives go to the [`Communicator`].

use super::communicator::Communicator;
use super::interpreter::execute;
use super::kernels;
use crate::error::Result;
use crate::ir::{AxisGroup, DType, Literal, Node, Op, Program};
use crate::sharding::Mesh;

/// Runs `program` (a per-device program) on the device of `comm` with its local
/// `inputs`; returns its local outputs.
pub fn run_on_device(
    program: &Program,
    comm: &dyn Communicator,
    inputs: &[Literal],
) -> Result<Vec<Literal>> {
    execute(program, inputs, |node, operands| {
        eval_on_device(comm, node, operands)
    })
}

fn eval_on_device(
    comm: &dyn Communicator,
    node: &Node,
    operands: &[&Literal],
) -> Result<Literal, String> {
    let x = || operands[0].clone();
    let collective = match &node.op {
        Op::AxisIndex(group) => {
            let index = group_index(comm.mesh(), comm.device(), &group.axes)?;
            return Ok(Literal::full(&[], DType::I32, index as f64));
        }
        Op::AllReduce { group, kind } => comm.all_reduce(&group.axes, *kind, x()),
        Op::AllGather { group, dim } => comm.all_gather(&group.axes, *dim, x()),
        Op::ReduceScatter { group, kind, dim } => {
            comm.reduce_scatter(&group.axes, *kind, *dim, x())
        }
        Op::AllToAll {
            group,
            split_dim,
            concat_dim,
        } => comm.all_to_all(&group.axes, *split_dim, *concat_dim, x()),
        Op::CollectivePermute { group, from } => {
            let pairs = permute_pairs(comm.mesh(), group, from)?;
            comm.collective_permute(&group.axes, &pairs, x())
        }
        op => return kernels::eval(op, operands, &node.ty),
    };
    collective.map_err(|e| e.to_string())
}

/// Sizes of `axes` in `mesh`.
fn sizes(mesh: &Mesh, axes: &[String]) -> Result<Vec<usize>, String> {
    axes.iter()
        .map(|a| {
            mesh.axis_size(a)
                .ok_or_else(|| format!("no mesh axis `{a}` in {mesh}"))
        })
        .collect()
}

/// The mixed-radix index of `device`'s coordinates along `axes` (first axis major).
fn group_index(mesh: &Mesh, device: usize, axes: &[String]) -> Result<usize, String> {
    let coords = mesh
        .device_coords(device)
        .ok_or_else(|| format!("no device {device} in {mesh}"))?;
    let mut index = 0;
    for (a, size) in axes.iter().zip(sizes(mesh, axes)?) {
        let i = mesh
            .axis_index(a)
            .ok_or_else(|| format!("no mesh axis `{a}`"))?;
        index = index * size + coords[i];
    }
    Ok(index)
}

/// The `(source, target)` group indices of a collective permute: the receiver at group
/// index `j` (over `group.axes`) gets the operand of the member whose index over `from`
/// is `j`.
fn permute_pairs(
    mesh: &Mesh,
    group: &AxisGroup,
    from: &[String],
) -> Result<Vec<(usize, usize)>, String> {
    let to_sizes = sizes(mesh, &group.axes)?;
    let from_sizes = sizes(mesh, from)?;
    let digits = |mut j: usize, radix: &[usize]| -> Vec<usize> {
        let mut d = vec![0; radix.len()];
        for (k, r) in radix.iter().enumerate().rev() {
            d[k] = j % r;
            j /= r;
        }
        d
    };
    (0..group.size)
        .map(|j| {
            // The sender's coordinates along `from`, then its index over the group's axes.
            let sender = digits(j, &from_sizes);
            let mut source = 0;
            for (a, size) in group.axes.iter().zip(&to_sizes) {
                let k = from
                    .iter()
                    .position(|b| b == a)
                    .ok_or_else(|| format!("axis `{a}` missing from {from:?}"))?;
                source = source * size + sender[k];
            }
            Ok((source, j))
        })
        .collect()
}
