//! Collective groups: the devices a collective over a list of mesh axes spans, in
//! group order, and a device's index among them.

use crate::error::{CollectiveProblem, Error, Result};
use crate::sharding::Mesh;

/// The devices of one collective group, in group order, and this device's index in it.
///
/// The group of a device over `axes` is the devices that share its coordinates on every
/// other mesh axis; they are ordered by [`Mesh::group_index`] over `axes` (first listed
/// axis major), the order shard indices use. An empty list makes a group of one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Group {
    pub(super) members: Vec<usize>,
    pub(super) index: usize,
}

impl Group {
    /// The group of `device` over `axes`; an [`Error::AxisGroup`](crate::Error::AxisGroup)
    /// if an axis is unknown or listed twice, or the device is not in `mesh`.
    pub(super) fn of(mesh: &Mesh, device: usize, axes: &[String]) -> Result<Group> {
        let index = mesh.group_index(device, axes)?;
        let members = (0..mesh.axes_size(axes))
            .map(|i| mesh.group_member(device, axes, i))
            .collect::<Result<_>>()?;
        Ok(Group { members, index })
    }

    pub(super) fn size(&self) -> usize {
        self.members.len()
    }
}

/// The problem of a collective whose group could not be joined: `error` from
/// [`Group::of`] (an [`Error::AxisGroup`]) as [`CollectiveProblem::Group`].
pub(super) fn group_problem(error: Error) -> CollectiveProblem {
    match error {
        Error::AxisGroup { problem, .. } => CollectiveProblem::Group { problem },
        other => CollectiveProblem::Transfer {
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes(names: &[&str]) -> Vec<String> {
        names.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn groups_follow_listed_axis_order() -> Result<()> {
        let mesh = Mesh::new([("data", 2), ("model", 4)])?;
        // Device 6 sits at (1, 2).
        let by_data = Group::of(&mesh, 6, &axes(&["data"]))?;
        assert_eq!(
            by_data,
            Group {
                members: vec![2, 6],
                index: 1
            }
        );
        let model_data = Group::of(&mesh, 6, &axes(&["model", "data"]))?;
        assert_eq!(
            model_data,
            Group {
                members: vec![0, 4, 1, 5, 2, 6, 3, 7],
                index: 5
            }
        );
        let none = Group::of(&mesh, 6, &[])?;
        assert_eq!(
            none,
            Group {
                members: vec![6],
                index: 0
            }
        );
        Ok(())
    }

    #[test]
    fn bad_axis_lists_are_rejected() -> Result<()> {
        let mesh = Mesh::new([("data", 2)])?;
        for bad in [axes(&["model"]), axes(&["data", "data"])] {
            let error = Group::of(&mesh, 0, &bad);
            assert!(matches!(error, Err(Error::AxisGroup { .. })), "{error:?}");
        }
        assert!(Group::of(&mesh, 2, &axes(&["data"])).is_err());
        Ok(())
    }
}
