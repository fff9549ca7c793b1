//! [`CollectiveKind`]: the kinds of collective op, as a type — what reports count
//! collectives by ([`CollectiveStats::count`](crate::partition::CollectiveStats::count)),
//! so that a misspelt kind is a compile error (or, parsed from text, an
//! [`Error::UnknownCollective`]) rather than a count of 0.

use super::Op;
use crate::error::Error;

/// A kind of collective op (the variants of [`Op`] that move data between devices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum CollectiveKind {
    /// [`Op::AllGather`].
    AllGather,
    /// [`Op::AllReduce`].
    AllReduce,
    /// [`Op::AllToAll`].
    AllToAll,
    /// [`Op::CollectivePermute`].
    CollectivePermute,
    /// [`Op::CollectiveShift`].
    CollectiveShift,
    /// [`Op::ReduceScatter`].
    ReduceScatter,
}

impl CollectiveKind {
    /// Every kind, in the order reports list them (alphabetical by name).
    pub const ALL: [CollectiveKind; 6] = [
        CollectiveKind::AllGather,
        CollectiveKind::AllReduce,
        CollectiveKind::AllToAll,
        CollectiveKind::CollectivePermute,
        CollectiveKind::CollectiveShift,
        CollectiveKind::ReduceScatter,
    ];

    /// The op's name as printed in the IR and in reports (`all_gather`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::AllToAll => "all_to_all",
            CollectiveKind::CollectivePermute => "collective_permute",
            CollectiveKind::CollectiveShift => "collective_shift",
            CollectiveKind::ReduceScatter => "reduce_scatter",
        }
    }
}

impl std::fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

impl std::str::FromStr for CollectiveKind {
    type Err = Error;

    /// The kind named `name` as printed ([`CollectiveKind::name`]); any other text is
    /// an [`Error::UnknownCollective`] listing the names.
    fn from_str(name: &str) -> Result<Self, Error> {
        (CollectiveKind::ALL.into_iter())
            .find(|k| k.name() == name)
            .ok_or_else(|| Error::UnknownCollective {
                name: name.to_string(),
            })
    }
}

impl Op {
    /// The kind of a collective op; `None` for other ops.
    pub fn collective_kind(&self) -> Option<CollectiveKind> {
        Some(match self {
            Op::AllGather { .. } => CollectiveKind::AllGather,
            Op::AllReduce { .. } => CollectiveKind::AllReduce,
            Op::AllToAll { .. } => CollectiveKind::AllToAll,
            Op::CollectivePermute { .. } => CollectiveKind::CollectivePermute,
            Op::CollectiveShift { .. } => CollectiveKind::CollectiveShift,
            Op::ReduceScatter { .. } => CollectiveKind::ReduceScatter,
            _ => return None,
        })
    }
}
