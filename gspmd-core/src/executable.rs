//! [`compile`]: the whole pipeline for one mesh — verify, propagate, partition — and the
//! [`Executable`] it returns.

use crate::error::Result;
use crate::ir::{Literal, Program, verify};
use crate::partition::{SpmdProgram, partition};
use crate::propagation::propagate;
use crate::runtime::ThreadMesh;
use crate::sharding::Mesh;

/// A program compiled for a mesh: the global program with a sharding on every value,
/// and the one per-device program that runs it.
#[derive(Debug, Clone)]
pub struct Executable {
    /// The global program after propagation (every node has a `sharding`).
    pub propagated: Program,
    /// The per-device program.
    pub spmd: SpmdProgram,
}

/// Verifies `program`, completes its shardings for `mesh`, and partitions it.
pub fn compile(program: &Program, mesh: &Mesh) -> Result<Executable> {
    verify(program)?;
    let propagated = propagate(program, mesh)?;
    let spmd = partition(&propagated, mesh)?;
    Ok(Executable { propagated, spmd })
}

impl Executable {
    /// Runs on `mesh` with global inputs; returns global outputs. See [`SpmdProgram::run`].
    pub fn run(&self, mesh: &ThreadMesh, inputs: &[Literal]) -> Result<Vec<Literal>> {
        self.spmd.run(mesh, inputs)
    }

    /// The propagated global program, then the partitioned program with its collectives.
    pub fn report(&self) -> String {
        format!(
            "// after propagation\n{}\n\n{}",
            self.propagated,
            self.spmd.report()
        )
    }
}
