//! [`Why`]: the reason a collective of a partitioned program exists — the global op
//! whose partitioning emitted it, the sharding the moved value had, the sharding that
//! op needed, and the user annotations each of the two came from.

use std::fmt;

use super::Program;
use crate::sharding::Sharding;
use crate::types::{Location, ValueId};

/// A user annotation that supplied the axes of one dim of a sharding: the annotated
/// value of the global program (a `sharding_constraint`, `#[shard]` or annotated
/// parameter), its name and the user's source line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The dim whose axes it supplied.
    pub dim: usize,
    /// Those axes.
    pub axes: Vec<String>,
    /// The annotated value.
    pub value: ValueId,
    /// Its name, if it has one.
    pub name: Option<String>,
    /// Where the user annotated it.
    pub location: Location,
}

impl Source {
    /// The annotations the propagated sharding of `v` (a value of a propagated
    /// `program`) came from: one per dim with axes and a recorded origin. Empty before
    /// propagation.
    pub fn of(program: &Program, v: ValueId) -> Vec<Source> {
        let node = program.node(v);
        let (Some(sharding), Some(origin)) = (&node.sharding, &node.origin) else {
            return Vec::new();
        };
        (sharding.dims.iter().zip(&origin.dims).enumerate())
            .filter_map(|(dim, (d, o))| {
                let value = (*o)?;
                let annotated = program.node(value);
                (!d.axes.is_empty()).then(|| Source {
                    dim,
                    axes: d.axes.clone(),
                    value,
                    name: annotated.name.clone(),
                    location: annotated.location,
                })
            })
            .collect()
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dim {} {} <- {}",
            self.dim,
            self.axes.join(","),
            self.value
        )?;
        if let Some(name) = &self.name {
            write!(f, " \"{name}\"")?;
        }
        write!(f, " at {}", self.location)
    }
}

/// What a collective does for the op that needed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Purpose {
    /// Moves an operand of the op from the sharding it has to the one the op needs.
    Operand,
    /// Moves the op's result from the sharding its partitioned form produces to the
    /// value's propagated sharding (pending sums reduced, dims re-split).
    Result,
    /// Part of the op's own partitioned algorithm (a halo exchange, a rotation, a
    /// sort's merge): no sharding is changed.
    Algorithm,
}

/// Why one collective of a per-device program is there. Value ids are those of the
/// global program that was partitioned ([`crate::Executable::propagated`], or the
/// region holding the collective).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Why {
    /// What the collective does for `user`.
    pub purpose: Purpose,
    /// The global value whose partitioning emitted the collective.
    pub user: ValueId,
    /// Its op's name.
    pub op: &'static str,
    /// Its user source line.
    pub location: Location,
    /// The global value moved: an operand of `user` ([`Purpose::Operand`]; `None` for
    /// an intermediate of the op's partitioning), `user` itself ([`Purpose::Result`]).
    pub value: Option<ValueId>,
    /// The sharding the moved value had (none for [`Purpose::Algorithm`]).
    pub from: Option<Sharding>,
    /// The sharding required (none for [`Purpose::Algorithm`]).
    pub to: Option<Sharding>,
    /// The annotations the moved operand's propagated sharding came from (empty for
    /// an intermediate, a result, or an operand whose sharding no annotation set).
    pub from_sources: Vec<Source>,
    /// The propagated sharding of `user`, from which the op derived `to`.
    pub user_sharding: Option<Sharding>,
    /// The annotations `user_sharding` came from.
    pub to_sources: Vec<Source>,
}

impl Why {
    /// True if the collective moves or serves global value `v`.
    pub fn touches(&self, v: ValueId) -> bool {
        self.user == v || self.value == Some(v)
    }
}

/// `[dim 0 data <- %1 "x" at model.rs:9]`: where a sharding came from.
fn sources(f: &mut fmt::Formatter<'_>, sources: &[Source]) -> fmt::Result {
    if sources.is_empty() {
        return write!(f, " [no annotation]");
    }
    let sources: Vec<String> = sources.iter().map(ToString::to_string).collect();
    write!(f, " [{}]", sources.join("; "))
}

impl fmt::Display for Why {
    /// `operand %3 of %12 = gather at model.rs:149: has (model, _) [sources], needs
    /// (_, _) for %12 sharded (data, _) [sources]`, or `result of ...: computed as S,
    /// propagated T [sources]`, or `part of partitioning %5 = sort at model.rs:3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let user = format!("{} = {} at {}", self.user, self.op, self.location);
        let (Some(from), Some(to)) = (&self.from, &self.to) else {
            return write!(f, "part of partitioning {user}");
        };
        match (self.purpose, self.value) {
            (Purpose::Result, _) => {
                write!(f, "result of {user}: computed as {from}, propagated {to}")?;
                return sources(f, &self.to_sources);
            }
            (_, Some(v)) => write!(f, "operand {v} of {user}: has {from}")?,
            (_, None) => write!(f, "intermediate of {user}: has {from}")?,
        }
        if self.value.is_some() {
            sources(f, &self.from_sources)?;
        }
        write!(f, ", needs {to}")?;
        if let Some(sharding) = &self.user_sharding {
            write!(f, " for {} sharded {sharding}", self.user)?;
            sources(f, &self.to_sources)?;
        }
        Ok(())
    }
}
