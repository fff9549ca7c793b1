//! [`Sharding`]: per tensor dim, the mesh axes it is split over.

use super::mesh::Mesh;
use crate::error::{Error, Result};

/// How one tensor dim is split: over `axes`, major to minor (the dim is cut in
/// `product(axis sizes)` pieces; the first axis varies slowest).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DimSharding {
    /// Mesh axes, major to minor. Empty: the dim is not split.
    pub axes: Vec<String>,
    /// A closed dim is fixed; propagation may append axes to an open one (`?`).
    pub closed: bool,
    /// User priority of this dim's annotation: 0 is the highest; `None` is the lowest.
    pub priority: Option<u32>,
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
}

impl std::fmt::Display for DimSharding {
    /// `_` (closed, unsplit), `?` (open, unsplit), `data`, `(data, model)`; a `?` after
    /// axes marks an open dim, `@N` a user priority: `data?@1`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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

    /// Every mesh axis the dims are split over, dim by dim, major to minor.
    pub fn axes(&self) -> impl Iterator<Item = &str> {
        self.dims
            .iter()
            .flat_map(|d| d.axes.iter().map(String::as_str))
    }

    /// Checks the sharding against `mesh` and a tensor of rank `rank`: every axis (of
    /// dims, replicated and unreduced) is a mesh axis, no axis is used twice, and there
    /// is one dim sharding per tensor dim. `context` (e.g. `"src/model.rs:12: %3: "`)
    /// prefixes the error message.
    ///
    /// ```
    /// # use gspmd_core::sharding::{Mesh, Sharding};
    /// let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    /// let s: Sharding = "(data, model)".parse().unwrap();
    /// assert!(s.validate(&mesh, 2, "").is_ok());
    /// assert!(s.validate(&mesh, 3, "").is_err());
    /// ```
    pub fn validate(&self, mesh: &Mesh, rank: usize, context: &str) -> Result<()> {
        let all_axes = self
            .axes()
            .chain(self.replicated.iter().map(String::as_str))
            .chain(self.unreduced.iter().map(String::as_str));
        for axis in all_axes {
            if mesh.axis_index(axis).is_none() {
                return Err(Error::UnknownAxis {
                    axis: axis.to_string(),
                    sharding: self.to_string(),
                    available: mesh.axis_list(),
                    context: context.to_string(),
                });
            }
        }
        if let Some(axis) = self.repeated_axis() {
            return Err(Error::DuplicateAxis {
                axis: axis.to_string(),
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
