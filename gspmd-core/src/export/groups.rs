//! The device lists of exported collectives, computed from the mesh: replica groups
//! (XLA's lists of partition ids, one list per group, members in group order) and
//! `collective_permute` source-target pairs. A device of the mesh is the XLA partition
//! of the same id (the exported `sdy.mesh` lists the mesh's device order).

use crate::error::Result;
use crate::ir::AxisGroup;
use crate::sharding::Mesh;

/// The groups of `group` over `mesh`: one list per set of devices sharing their
/// coordinates off `group.axes`, each listing its members by group index (the order in
/// which an all-gather concatenates and a reduce-scatter hands out blocks). Groups come
/// in the order of their first member's id.
pub(super) fn replica_groups(mesh: &Mesh, group: &AxisGroup) -> Result<Vec<Vec<usize>>> {
    let mut groups = Vec::new();
    for device in 0..mesh.num_devices() {
        if mesh.group_index(device, &group.axes)? == 0 {
            let members = (0..group.size)
                .map(|i| mesh.group_member(device, &group.axes, i))
                .collect::<Result<Vec<usize>>>()?;
            groups.push(members);
        }
    }
    Ok(groups)
}

/// The `(source, target)` pairs of [`crate::ir::Op::CollectivePermute`]: every device
/// receives from the member of its group whose index over `from` is the receiver's
/// index over the group's axes.
pub(super) fn permute_pairs(
    mesh: &Mesh,
    group: &AxisGroup,
    from: &[String],
) -> Result<Vec<(usize, usize)>> {
    let mut pairs = Vec::new();
    for members in replica_groups(mesh, group)? {
        for (index, &target) in members.iter().enumerate() {
            for &source in &members {
                if mesh.group_index(source, from)? == index {
                    pairs.push((source, target));
                }
            }
        }
    }
    pairs.sort_unstable();
    Ok(pairs)
}

/// The `(source, target)` pairs of [`crate::ir::Op::CollectiveShift`]: its
/// [`AxisGroup::shift_pairs`] in every group.
pub(super) fn shift_pairs(
    mesh: &Mesh,
    group: &AxisGroup,
    offset: i64,
    wrap: bool,
    mirror: bool,
) -> Result<Vec<(usize, usize)>> {
    let within = group.shift_pairs(offset, wrap, mirror);
    let mut pairs = Vec::new();
    for members in replica_groups(mesh, group)? {
        pairs.extend(within.iter().map(|&(s, t)| (members[s], members[t])));
    }
    pairs.sort_unstable();
    Ok(pairs)
}

/// Each device's index in its group over `group.axes`, by device id: the table an
/// exported `axis_index` looks its partition id up in.
pub(super) fn index_table(mesh: &Mesh, group: &AxisGroup) -> Result<Vec<usize>> {
    (0..mesh.num_devices())
        .map(|device| mesh.group_index(device, &group.axes))
        .collect()
}

/// `dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>`: rows of equal length as an i64 matrix
/// attribute (replica groups, source-target pairs), `width` columns.
pub(super) fn i64_matrix(rows: &[Vec<usize>], width: usize) -> String {
    if rows.is_empty() {
        return format!("dense<> : tensor<0x{width}xi64>");
    }
    let text: Vec<String> = (rows.iter())
        .map(|r| {
            let items: Vec<String> = r.iter().map(ToString::to_string).collect();
            format!("[{}]", items.join(", "))
        })
        .collect();
    format!(
        "dense<[{}]> : tensor<{}x{width}xi64>",
        text.join(", "),
        rows.len()
    )
}
