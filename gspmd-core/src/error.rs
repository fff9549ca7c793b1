//! The crate's one error type.
//!
//! Every error that user input can reach is a variant here; nothing on such a path
//! panics. Variants name the problem, the op or value concerned and, where the value was
//! traced from user code, the user's source location.

use crate::ir::{Location, ValueId};

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in gspmd-core.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- building and verifying programs -------------------------------------------
    /// An op was given operands whose shapes, dtypes or attributes do not fit it.
    #[error("{location}: {op}: {message}")]
    Shape {
        /// The op's name as printed in the IR (`dot_general`, `add`, ...).
        op: &'static str,
        /// Where the op was traced.
        location: Location,
        /// What is wrong, naming the operands' shapes.
        message: String,
    },
    /// Several errors found at once (the verifier and the tracer report all they find).
    #[error("{}", display_list(.0))]
    Many(Vec<Error>),
    /// The verifier found a malformed program.
    #[error("{location}: {value}: {message}")]
    Verify {
        /// The offending value.
        value: ValueId,
        /// Where it was traced.
        location: Location,
        /// What is wrong.
        message: String,
    },

    // ---- meshes and shardings ------------------------------------------------------
    /// A mesh is malformed (empty axis name, zero size, repeated axis name, ...).
    #[error("invalid mesh: {0}")]
    InvalidMesh(String),
    /// A mesh's device order is not a permutation of `0..num_devices`.
    #[error("mesh device order is not a permutation of 0..{num_devices}: {detail}")]
    DeviceOrder {
        /// Number of devices the mesh's axes describe.
        num_devices: usize,
        /// Which id is missing, repeated or out of range.
        detail: String,
    },
    /// A sharding names an axis the mesh does not have.
    #[error("{context}unknown mesh axis `{axis}` in sharding {sharding} (mesh axes: {available})")]
    UnknownAxis {
        /// The unknown axis.
        axis: String,
        /// The sharding as written.
        sharding: String,
        /// The mesh's axes, comma separated.
        available: String,
        /// Which value and source location, e.g. `src/model.rs:12: %3: `; may be empty.
        context: String,
    },
    /// A sharding uses the same mesh axis twice.
    #[error("{context}mesh axis `{axis}` used twice in sharding {sharding}")]
    DuplicateAxis {
        /// The repeated axis.
        axis: String,
        /// The sharding as written.
        sharding: String,
        /// Which value and source location; may be empty.
        context: String,
    },
    /// A sharding has a different number of dims than the tensor it annotates.
    #[error("{context}sharding {sharding} has {spec_rank} dims but the tensor has rank {rank}")]
    ShardingRank {
        /// The sharding as written.
        sharding: String,
        /// Number of dims in the sharding.
        spec_rank: usize,
        /// Rank of the tensor.
        rank: usize,
        /// Which value and source location; may be empty.
        context: String,
    },
    /// A sharding's text could not be parsed.
    #[error("cannot parse sharding `{text}`: {message}")]
    ParseSharding {
        /// The text given.
        text: String,
        /// What is wrong.
        message: String,
    },

    /// Per-device shards do not fit together into the global value.
    #[error("cannot assemble shards of sharding {sharding}: {message}")]
    Assemble {
        /// The sharding as written.
        sharding: String,
        /// What does not fit: shard count, a device's shard shape or dtype, ...
        message: String,
    },

    // ---- autodiff ------------------------------------------------------------------
    /// `grad` was asked for a loss or parameters that do not fit the program.
    #[error("grad of program `{program}`: {message}")]
    GradRequest {
        /// The program's name.
        program: String,
        /// What does not fit: the output or parameter index, its name and type.
        message: String,
    },
    /// A value on a path from a differentiated parameter to the loss has an op with no
    /// gradient rule.
    #[error("{location}: {value} = {op}: not differentiable: {message}")]
    NotDifferentiable {
        /// The value whose op has no rule.
        value: ValueId,
        /// The op's name.
        op: &'static str,
        /// Where the op was traced.
        location: Location,
        /// Why.
        message: String,
    },

    // ---- running programs ----------------------------------------------------------
    /// A program was run with the wrong inputs.
    #[error("input {index} ({name}): {message}")]
    Input {
        /// Parameter index.
        index: usize,
        /// Parameter name.
        name: String,
        /// Expected vs. given.
        message: String,
    },
    /// An op failed while running.
    #[error("{location}: {value} = {op}: {message}")]
    Runtime {
        /// The value being computed.
        value: ValueId,
        /// The op's name.
        op: &'static str,
        /// Where the op was traced.
        location: Location,
        /// What went wrong.
        message: String,
    },
}

fn display_list(errors: &[Error]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    format!("{} errors:\n  {}", errors.len(), lines.join("\n  "))
}

impl Error {
    /// Collapses a list of errors: none → `Ok`, one → that error, several → [`Error::Many`].
    pub fn from_list(mut errors: Vec<Error>) -> Result<()> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Many(errors)),
        }
    }
}
