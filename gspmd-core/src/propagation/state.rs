//! The working state of propagation: each value's sharding as mesh-axis indices, with
//! what is needed to refine it safely (which dims are closed, which axes the user
//! annotated and at what priority, where each dim's axes came from).

use crate::ir::{Origin, Program, ValueId, num_elements};
use crate::sharding::{AxisPart, DimSharding, Mesh, Sharding, merge_adjacent};

/// A mesh axis or a sub-axis of one ([`AxisPart`]; its `axis` indexes
/// [`Mesh::axes`]).
pub(super) type Axis = AxisPart;

/// One dim of a value during propagation.
#[derive(Debug, Clone)]
pub(super) struct DimState {
    /// Mesh (sub-)axes, major to minor, in canonical form (adjacent parts of one axis
    /// merged). Only ever refined: axes appended, or split in parts and appended to.
    pub axes: Vec<Axis>,
    /// A closed dim is never changed (a closed annotation dim).
    pub closed: bool,
    /// How many leading axes come from the user's annotation.
    pub annotated: usize,
    /// The user-priority round from which the annotated axes act as a source.
    pub round: usize,
    /// The annotated value whose annotation supplied the dim's major axis.
    pub origin: Option<ValueId>,
}

impl DimState {
    /// The axes this dim offers to its neighbours in user-priority round `round`: all of
    /// them, or none while its annotation's priority is not yet active.
    pub fn source_axes(&self, round: usize) -> &[Axis] {
        if self.annotated > 0 && self.round > round {
            &[]
        } else {
            &self.axes
        }
    }
}

/// One value during propagation.
#[derive(Debug, Clone)]
pub(super) struct ValueState {
    /// Global shape.
    pub shape: Vec<usize>,
    /// One entry per dim.
    pub dims: Vec<DimState>,
    /// Axes the value may not be split over: its annotation's explicitly replicated and
    /// unreduced axes.
    pub reserved: Vec<Axis>,
}

impl ValueState {
    /// True if `axis` overlaps an axis some dim uses or one reserved.
    pub fn uses(&self, axis: Axis) -> bool {
        (self.reserved.iter())
            .chain(self.dims.iter().flat_map(|d| &d.axes))
            .any(|a| a.overlaps(&axis))
    }

    /// Number of elements (of the global shape).
    pub fn elements(&self) -> usize {
        num_elements(&self.shape)
    }
}

/// User-priority rounds: round `r` activates annotation dims of the `r`-th smallest
/// priority; the last round activates dims without a priority.
#[derive(Debug, Clone)]
pub(super) struct Rounds {
    priorities: Vec<u32>,
}

impl Rounds {
    /// The rounds needed for the priorities used in `program`'s annotations.
    pub fn of(program: &Program) -> Rounds {
        let mut priorities: Vec<u32> = (program.nodes.iter())
            .filter_map(|n| n.annotation.as_ref())
            .flat_map(|a| a.dims.iter().filter_map(|d| d.priority))
            .collect();
        priorities.sort_unstable();
        priorities.dedup();
        Rounds { priorities }
    }

    /// Number of rounds.
    pub fn len(&self) -> usize {
        self.priorities.len() + 1
    }

    /// The round in which a dim with `priority` becomes a source.
    pub fn round_of(&self, priority: Option<u32>) -> usize {
        match priority {
            Some(p) => self.priorities.partition_point(|&q| q < p),
            None => self.priorities.len(),
        }
    }
}

/// The initial state of every value: its annotation (with axes resolved against
/// `mesh`; annotations must be validated), or fully open and empty.
pub(super) fn initial_states(program: &Program, mesh: &Mesh, rounds: &Rounds) -> Vec<ValueState> {
    let parts = |names: &[String]| -> Vec<Axis> {
        merge_adjacent(
            &names
                .iter()
                .filter_map(|n| mesh.axis_part(n))
                .collect::<Vec<_>>(),
        )
    };
    (program.values())
        .map(|v| {
            let node = program.node(v);
            let shape = node.ty.shape.clone();
            let Some(annotation) = &node.annotation else {
                let open = DimState {
                    axes: Vec::new(),
                    closed: false,
                    annotated: 0,
                    round: 0,
                    origin: None,
                };
                return ValueState {
                    dims: vec![open; shape.len()],
                    shape,
                    reserved: Vec::new(),
                };
            };
            let dims = (annotation.dims.iter())
                .map(|d| {
                    let axes = parts(&d.axes);
                    DimState {
                        annotated: axes.len(),
                        origin: (!axes.is_empty()).then_some(v),
                        axes,
                        closed: d.closed,
                        round: rounds.round_of(d.priority),
                    }
                })
                .collect();
            let reserved = [parts(&annotation.replicated), parts(&annotation.unreduced)].concat();
            ValueState {
                shape,
                dims,
                reserved,
            }
        })
        .collect()
}

/// The final sharding of a value: every dim closed, no priorities; the annotation's
/// replicated and unreduced axes kept.
pub(super) fn final_sharding(
    state: &ValueState,
    annotation: Option<&Sharding>,
    mesh: &Mesh,
) -> Sharding {
    let name = |&a: &Axis| mesh.part_name(a);
    // A device order the user wrote holds while the dim keeps the annotated axes.
    let reversed = |i: usize, axes: &[String]| {
        (annotation.and_then(|a| a.dims.get(i)))
            .is_some_and(|d| d.reversed && mesh.canonical_axes(&d.axes) == axes)
    };
    Sharding {
        dims: (state.dims.iter().enumerate())
            .map(|(i, d)| {
                let axes = mesh.canonical_axes(&d.axes.iter().map(name).collect::<Vec<_>>());
                DimSharding {
                    reversed: reversed(i, &axes),
                    ..DimSharding::closed(d.axes.iter().map(name))
                }
            })
            .collect(),
        replicated: annotation.map(|a| a.replicated.clone()).unwrap_or_default(),
        unreduced: annotation.map(|a| a.unreduced.clone()).unwrap_or_default(),
    }
}

/// Where each dim's axes came from.
pub(super) fn origin(state: &ValueState) -> Origin {
    Origin {
        dims: state.dims.iter().map(|d| d.origin).collect(),
    }
}
