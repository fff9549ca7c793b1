//! [`Sharding`]: per tensor dim, the mesh axes it is split over.

use super::mesh::{Mesh, split_sub_axis};
use super::sub_axis::{AxisPart, cut_at};
use crate::error::{Error, Result, SubAxisProblem};

/// How one tensor dim is split: over `axes`, major to minor (the dim is cut in
/// `product(axis sizes)` pieces; the first axis varies slowest). An axis may be a
/// sub-axis `model:(2)2` ([`Mesh::sub_axis`]): a dim split over `model:(1)2` is cut in
/// two by `model`'s major digit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DimSharding {
    /// Mesh axes or sub-axes, major to minor. Empty: the dim is not split.
    pub axes: Vec<String>,
    /// A closed dim is fixed; propagation may append axes to an open one (`?`).
    pub closed: bool,
    /// User priority of this dim's annotation: 0 is the highest; `None` is the lowest.
    pub priority: Option<u32>,
    /// The dim's device order (XLA's permuted tile assignment, as `reverse` produces
    /// it): `false` (mesh order, almost every value) puts shard `i` on the device at
    /// index `i` of the group over `axes` ([`Mesh::group_index`]); `true` puts it on the
    /// device at index `n - 1 - i` of the `n`. Written `-` before the dim: `(-data, _)`.
    /// Only a split dim is reversed.
    pub reversed: bool,
}

/// A sharding of a tensor over a mesh: one [`DimSharding`] per dim, plus axes that are
/// explicitly replicated and axes along which the value is an unreduced partial sum.
/// Axes named nowhere are implicitly replicated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Sharding {
    /// One entry per tensor dim.
    pub dims: Vec<DimSharding>,
    /// Axes the value is explicitly replicated over (propagation may not shard on them).
    pub replicated: Vec<String>,
    /// Axes along which devices hold partial sums still to be reduced.
    pub unreduced: Vec<String>,
}

impl DimSharding {
    /// A closed dim split over `axes` (major to minor); no axes: `_`.
    pub fn closed<S: Into<String>>(axes: impl IntoIterator<Item = S>) -> Self {
        DimSharding {
            axes: axes.into_iter().map(Into::into).collect(),
            closed: true,
            priority: None,
            reversed: false,
        }
    }

    /// An open dim split over `axes` (propagation may append more); no axes: `?`.
    pub fn open<S: Into<String>>(axes: impl IntoIterator<Item = S>) -> Self {
        DimSharding {
            closed: false,
            ..DimSharding::closed(axes)
        }
    }

    /// The same dim with user priority `priority` (0 is the highest).
    pub fn with_priority(self, priority: u32) -> Self {
        DimSharding {
            priority: Some(priority),
            ..self
        }
    }

    /// The same dim with its shards in reversed device order (see
    /// [`DimSharding::reversed`]).
    pub fn with_reversed_order(self) -> Self {
        DimSharding {
            reversed: true,
            ..self
        }
    }
}

impl std::fmt::Display for DimSharding {
    /// `_` (closed, unsplit), `?` (open, unsplit), `data`, `(data, model)`; a `?` after
    /// axes marks an open dim, `@N` a user priority: `data?@1`; a leading `-` a
    /// reversed device order: `-(data, model)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.reversed {
            f.write_str("-")?;
        }
        match (self.axes.as_slice(), self.closed) {
            ([], true) => f.write_str("_")?,
            ([], false) => f.write_str("?")?,
            ([a], closed) => write!(f, "{a}{}", if closed { "" } else { "?" })?,
            (axes, closed) => write!(f, "({}){}", axes.join(", "), if closed { "" } else { "?" })?,
        }
        match self.priority {
            Some(p) => write!(f, "@{p}"),
            None => Ok(()),
        }
    }
}

impl std::fmt::Display for Sharding {
    /// Like a JAX `PartitionSpec`: `(data, _, (x, y))`, then ` replicated={..}` and
    /// ` unreduced={..}` when not empty.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dims: Vec<String> = self.dims.iter().map(ToString::to_string).collect();
        write!(f, "({})", dims.join(", "))?;
        if !self.replicated.is_empty() {
            write!(f, " replicated={{{}}}", self.replicated.join(", "))?;
        }
        if !self.unreduced.is_empty() {
            write!(f, " unreduced={{{}}}", self.unreduced.join(", "))?;
        }
        Ok(())
    }
}

impl Sharding {
    /// A sharding with these dims and no explicitly replicated or unreduced axes.
    pub fn new(dims: impl IntoIterator<Item = DimSharding>) -> Self {
        Sharding {
            dims: dims.into_iter().collect(),
            ..Sharding::default()
        }
    }

    /// Fully replicated: `rank` closed, unsplit dims (`(_, _)`).
    pub fn replicated(rank: usize) -> Self {
        Sharding::new(vec![DimSharding::closed(Vec::<String>::new()); rank])
    }

    /// Nothing decided: `rank` open, unsplit dims (`(?, ?)`), for propagation to fill.
    pub fn open(rank: usize) -> Self {
        Sharding::new(vec![DimSharding::open(Vec::<String>::new()); rank])
    }

    /// True if no dim is split and nothing is unreduced: every device holds the whole
    /// value. Open dims and explicitly replicated axes do not matter.
    pub fn is_replicated(&self) -> bool {
        self.dims.iter().all(|d| d.axes.is_empty()) && self.unreduced.is_empty()
    }

    /// True if every dim's shards are in mesh order (no dim is
    /// [`reversed`](DimSharding::reversed)): the case of almost every value.
    pub fn is_in_mesh_order(&self) -> bool {
        self.dims.iter().all(|d| !d.reversed)
    }

    /// The same tiling with every dim's shards in mesh order.
    pub fn in_mesh_order(&self) -> Sharding {
        Sharding {
            dims: (self.dims.iter())
                .map(|d| DimSharding {
                    reversed: false,
                    ..d.clone()
                })
                .collect(),
            ..self.clone()
        }
    }

    /// Every mesh axis the dims are split over, dim by dim, major to minor.
    pub fn axes(&self) -> impl Iterator<Item = &str> {
        self.dims
            .iter()
            .flat_map(|d| d.axes.iter().map(String::as_str))
    }

    /// Checks the sharding against `mesh` and a tensor of rank `rank`: every axis (of
    /// dims, replicated and unreduced) is a mesh axis or a valid sub-axis of one
    /// (`model:(2)2`: see [`Mesh::sub_axis`]), unreduced axes are whole, no axis is used
    /// twice, no two parts of one axis overlap (an axis and a sub-axis of it, or two
    /// sub-axes sharing digits), no unsplit dim is in reversed device order, and there
    /// is one dim sharding per tensor dim.
    /// `context` (e.g. `"src/model.rs:12: %3: "`) prefixes the error message.
    ///
    /// ```
    /// # use gspmd_core::sharding::{Mesh, Sharding};
    /// let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    /// let s: Sharding = "(data, model)".parse().unwrap();
    /// assert!(s.validate(&mesh, 2, "").is_ok());
    /// assert!(s.validate(&mesh, 3, "").is_err());
    /// let split: Sharding = "(model:(1)2, (data, model:(2)2))".parse().unwrap();
    /// assert!(split.validate(&mesh, 2, "").is_ok());
    /// let overlapping: Sharding = "(model:(1)2, model)".parse().unwrap();
    /// assert!(overlapping.validate(&mesh, 2, "").is_err());
    /// ```
    pub fn validate(&self, mesh: &Mesh, rank: usize, context: &str) -> Result<()> {
        let all_axes: Vec<&str> = self
            .axes()
            .chain(self.replicated.iter().map(String::as_str))
            .chain(self.unreduced.iter().map(String::as_str))
            .collect();
        let mut parts = Vec::with_capacity(all_axes.len());
        for &axis in &all_axes {
            let invalid = |problem: SubAxisProblem| Error::InvalidSubAxis {
                axis: axis.to_string(),
                sharding: self.to_string(),
                problem,
                context: context.to_string(),
            };
            let parent = split_sub_axis(axis).map_or(axis, |(parent, _, _)| parent);
            let Some(position) = mesh.axis_index(parent) else {
                return Err(Error::UnknownAxis {
                    axis: axis.to_string(),
                    sharding: self.to_string(),
                    available: mesh.axis_list(),
                    context: context.to_string(),
                });
            };
            let Some(part) = mesh.axis_part(axis) else {
                let whole = mesh.axes()[position].1;
                return Err(invalid(sub_axis_problem(axis, whole)));
            };
            parts.push((axis, part));
        }
        if let Some(axis) = self.repeated_axis() {
            return Err(Error::DuplicateAxis {
                axis: axis.to_string(),
                sharding: self.to_string(),
                context: context.to_string(),
            });
        }
        for (i, (axis, part)) in parts.iter().enumerate() {
            if let Some((other, _)) = parts[..i].iter().find(|(_, p)| p.overlaps(part)) {
                return Err(Error::OverlappingAxes {
                    axis: other.to_string(),
                    other: axis.to_string(),
                    sharding: self.to_string(),
                    context: context.to_string(),
                });
            }
        }
        let whole = |a: &&String| mesh.axis_index(a).is_some();
        if let Some(axis) = self.unreduced.iter().find(|a| !whole(a)) {
            return Err(Error::InvalidSubAxis {
                axis: axis.clone(),
                sharding: self.to_string(),
                problem: SubAxisProblem::Unreduced,
                context: context.to_string(),
            });
        }
        if let Some(dim) = self
            .dims
            .iter()
            .position(|d| d.reversed && d.axes.is_empty())
        {
            return Err(Error::ReversedUnsplitDim {
                dim,
                sharding: self.to_string(),
                context: context.to_string(),
            });
        }
        if self.dims.len() != rank {
            return Err(Error::ShardingRank {
                sharding: self.to_string(),
                spec_rank: self.dims.len(),
                rank,
                context: context.to_string(),
            });
        }
        Ok(())
    }

    /// The same sharding with each dim's axes in canonical form
    /// ([`Mesh::canonical_axes`]: `(model:(1)2, model:(2)2)` on `model=4` is `model`),
    /// and the replicated axes too; two shardings that tile a tensor the same way
    /// compare equal once canonical. Call [`Sharding::validate`] first.
    ///
    /// ```
    /// # use gspmd_core::sharding::{Mesh, Sharding};
    /// let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    /// let s: Sharding = "((model:(1)2, model:(2)2), data)".parse().unwrap();
    /// assert_eq!(s.canonical(&mesh).to_string(), "(model, data)");
    /// ```
    pub fn canonical(&self, mesh: &Mesh) -> Sharding {
        Sharding {
            dims: (self.dims.iter())
                .map(|d| DimSharding {
                    axes: mesh.canonical_axes(&d.axes),
                    ..d.clone()
                })
                .collect(),
            replicated: mesh.canonical_axes(&self.replicated),
            unreduced: self.unreduced.clone(),
        }
    }

    /// The parts of mesh axes the dims and replicated axes use (names `mesh` does not
    /// know are left out).
    pub fn parts(&self, mesh: &Mesh) -> Vec<AxisPart> {
        (self
            .axes()
            .chain(self.replicated.iter().map(String::as_str)))
        .filter_map(|a| mesh.axis_part(a))
        .collect()
    }

    /// The same sharding (the same tiling) with each (sub-)axis of its dims and
    /// replicated axes cut at the digit boundaries that `parts` have inside it: `(x, _)`
    /// cut at `x:(2)2` is `((x:(1)2, x:(2)2), _)`. Shardings cut at each other's parts
    /// name every shared digit alike, so comparing their axes by name compares digits.
    /// Unreduced axes stay whole.
    pub fn cut_at(&self, mesh: &Mesh, parts: &[AxisPart]) -> Sharding {
        let cut = |axes: &[String]| -> Vec<String> {
            (axes.iter())
                .flat_map(|a| match mesh.axis_part(a) {
                    Some(p) => (cut_at(&[p], parts).into_iter())
                        .map(|q| mesh.part_name(q))
                        .collect(),
                    None => vec![a.clone()],
                })
                .collect()
        };
        Sharding {
            dims: (self.dims.iter())
                .map(|d| DimSharding {
                    axes: cut(&d.axes),
                    ..d.clone()
                })
                .collect(),
            replicated: cut(&self.replicated),
            unreduced: self.unreduced.clone(),
        }
    }

    /// The first mesh axis named twice across dims, replicated and unreduced axes.
    pub fn repeated_axis(&self) -> Option<&str> {
        let all: Vec<&String> = self
            .dims
            .iter()
            .flat_map(|d| &d.axes)
            .chain(&self.replicated)
            .chain(&self.unreduced)
            .collect();
        all.iter()
            .enumerate()
            .find(|(i, a)| all[..*i].contains(a))
            .map(|(_, a)| a.as_str())
    }
}

/// Why `name`, a sub-axis of an axis of size `whole`, is not a valid one.
fn sub_axis_problem(name: &str, axis_size: usize) -> SubAxisProblem {
    match split_sub_axis(name) {
        None => SubAxisProblem::NotSubAxis,
        Some((_, 0, _)) => SubAxisProblem::ZeroPre,
        Some((_, _, size)) if size < 2 => SubAxisProblem::SizeBelowTwo { size },
        Some((_, pre, size)) => SubAxisProblem::NotDividing {
            pre,
            size,
            axis_size,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh() -> Mesh {
        Mesh::new([("data", 2), ("model", 4)]).unwrap()
    }

    fn check(text: &str, rank: usize) -> Result<()> {
        let s: Sharding = text.parse()?;
        s.validate(&mesh(), rank, "src/model.rs:12: %3: ")
    }

    #[test]
    fn accepts_valid_shardings() {
        for (text, rank) in [
            ("()", 0),
            ("(data, model)", 2),
            ("((model, data)?@1, _, ?)", 3),
            ("(_) replicated={data} unreduced={model}", 1),
            ("(model:(1)2, model:(2)2, _)", 3),
            ("((data, model:(2)2), model:(1)2)", 2),
            ("(model:(1)4)", 1),
            ("(model:(1)2) replicated={model:(2)2}", 1),
        ] {
            assert_eq!(check(text, rank), Ok(()), "{text}");
        }
    }

    #[test]
    fn unknown_axis_lists_the_mesh_axes() {
        for text in [
            "(data, batch)",
            "(data, _) replicated={batch}",
            "(_, _) unreduced={batch}",
        ] {
            let err = check(text, 2).unwrap_err();
            assert_eq!(
                err,
                Error::UnknownAxis {
                    axis: "batch".into(),
                    sharding: text.into(),
                    available: "data, model".into(),
                    context: "src/model.rs:12: %3: ".into(),
                }
            );
        }
        assert_eq!(
            check("(batch)", 1).unwrap_err().to_string(),
            "src/model.rs:12: %3: unknown mesh axis `batch` in sharding (batch) \
             (mesh axes: data, model)"
        );
    }

    #[test]
    fn duplicate_axis_across_dims_replicated_and_unreduced() {
        for text in [
            "(data, data)",
            "((model, data), data)",
            "(data, _) replicated={data}",
            "(data, _) unreduced={data}",
            "(_, _) replicated={data} unreduced={data}",
            "(_, _) replicated={data, data}",
        ] {
            assert_eq!(
                check(text, 2).unwrap_err(),
                Error::DuplicateAxis {
                    axis: "data".into(),
                    sharding: text.into(),
                    context: "src/model.rs:12: %3: ".into(),
                },
                "{text}"
            );
        }
    }

    #[test]
    fn invalid_sub_axes_say_why() {
        let not_dividing = |pre, size| SubAxisProblem::NotDividing {
            pre,
            size,
            axis_size: 4,
        };
        for (text, axis, problem, message) in [
            (
                "(model:(1)3)",
                "model:(1)3",
                not_dividing(1, 3),
                "pre * size = 1 * 3 does not divide the axis size 4",
            ),
            (
                "(model:(2)4)",
                "model:(2)4",
                not_dividing(2, 4),
                "pre * size = 2 * 4 does not divide the axis size 4",
            ),
            (
                "(model:(1)1)",
                "model:(1)1",
                SubAxisProblem::SizeBelowTwo { size: 1 },
                "size 1 is below 2",
            ),
            (
                "(model:(0)2)",
                "model:(0)2",
                SubAxisProblem::ZeroPre,
                "`pre` must be at least 1",
            ),
            (
                "(_) unreduced={model:(1)2}",
                "model:(1)2",
                SubAxisProblem::Unreduced,
                "partial sums are kept over whole mesh axes, not sub-axes",
            ),
        ] {
            assert_eq!(problem.to_string(), message);
            assert_eq!(
                check(text, 1).unwrap_err(),
                Error::InvalidSubAxis {
                    axis: axis.into(),
                    sharding: text.into(),
                    problem,
                    context: "src/model.rs:12: %3: ".into(),
                },
                "{text}"
            );
        }
        assert!(matches!(
            check("(batch:(1)2)", 1),
            Err(Error::UnknownAxis { axis, .. }) if axis == "batch:(1)2"
        ));
    }

    #[test]
    fn overlapping_parts_of_an_axis() {
        for (text, first, second) in [
            ("(model, model:(1)2)", "model", "model:(1)2"),
            (
                "((model:(1)2, data), model:(1)4)",
                "model:(1)2",
                "model:(1)4",
            ),
            ("(model:(2)2, _) replicated={model}", "model:(2)2", "model"),
        ] {
            assert_eq!(
                check(text, 2).unwrap_err(),
                Error::OverlappingAxes {
                    axis: first.into(),
                    other: second.into(),
                    sharding: text.into(),
                    context: "src/model.rs:12: %3: ".into(),
                },
                "{text}"
            );
        }
        assert_eq!(
            check("(model, model:(1)2)", 2).unwrap_err().to_string(),
            "src/model.rs:12: %3: `model` and `model:(1)2` overlap in sharding \
             (model, model:(1)2) (parts of one mesh axis must be disjoint digits)"
        );
    }

    #[test]
    fn canonical_merges_adjacent_parts() {
        let m = mesh();
        let canon = |text: &str| text.parse::<Sharding>().unwrap().canonical(&m).to_string();
        assert_eq!(canon("((model:(1)2, model:(2)2), _)"), "(model, _)");
        assert_eq!(
            canon("(model:(1)2, model:(2)2)"),
            "(model:(1)2, model:(2)2)"
        );
        assert_eq!(
            canon("((model:(2)2, model:(1)2))"),
            "((model:(2)2, model:(1)2))"
        );
        assert_eq!(canon("((model:(1)4, data)?@1)"), "((model, data)?@1)");
    }

    #[test]
    fn reversed_dims_must_be_split() {
        assert_eq!(check("(-(data, model), _)", 2), Ok(()));
        let mut s: Sharding = "(data, _)".parse().unwrap();
        s.dims[1].reversed = true;
        assert_eq!(
            s.validate(&mesh(), 2, "src/model.rs:12: %3: ")
                .unwrap_err()
                .to_string(),
            "src/model.rs:12: %3: dim 1 of sharding (data, -_) is in reversed device order \
             (`-`) but not split over any mesh axis"
        );
    }

    #[test]
    fn wrong_rank() {
        assert_eq!(
            check("(data, _)", 3).unwrap_err().to_string(),
            "src/model.rs:12: %3: sharding (data, _) has 2 dims but the tensor has rank 3"
        );
        assert!(matches!(
            Sharding::replicated(1).validate(&mesh(), 0, ""),
            Err(Error::ShardingRank {
                spec_rank: 1,
                rank: 0,
                ..
            })
        ));
    }
}
