//! [`compile`]: the whole pipeline for one mesh — verify, propagate, partition — and the
//! [`Executable`] it returns.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use crate::error::Result;
use crate::ir::{Literal, Program, verify};
use crate::partition::{SpmdProgram, combine_collectives, partition};
use crate::propagation::propagate;
use crate::runtime::{Input, Output, PlannedProgram, ThreadMesh, Value, interpret};
use crate::sharding::Mesh;
use crate::simplify::{Stage, simplify_verified};

/// A program compiled for a mesh: the global program with a sharding on every value,
/// and the one per-device program that runs it.
///
/// The per-device program's execution plan is made at its first run and reused by
/// every later [`run`](Executable::run) and [`execute`](Executable::execute) (training
/// steps), as long as [`SpmdProgram::program`] is left as it was.
#[derive(Debug, Clone)]
pub struct Executable {
    /// The global program, simplified, after propagation (every node has a `sharding`).
    pub propagated: Program,
    /// The per-device program.
    pub spmd: SpmdProgram,
    /// The plan of `spmd.program`, made at the first run.
    planned: OnceLock<Arc<PlannedProgram>>,
}

thread_local! {
    /// Calls of [`compile`] made on this thread.
    static COMPILATIONS: Cell<u64> = const { Cell::new(0) };
}

/// How many times [`compile`] has been called on the calling thread (for tests that
/// check that something does not recompile, e.g. a learning-rate schedule).
pub fn compilations_on_this_thread() -> u64 {
    COMPILATIONS.with(Cell::get)
}

/// Verifies `program`, simplifies it, completes its shardings for `mesh`, partitions it,
/// and simplifies the per-device program.
///
/// [`simplify`](crate::simplify::simplify) runs before propagation, so that propagation
/// and the partitioner see each distinct value once (values differing only by
/// annotation stay apart, and so do copies of values computable anywhere, see
/// [`Stage::BeforePropagation`]), and again after partitioning, where equal collectives of one
/// operand (several users resharding it alike) are merged into one. The value ids of
/// [`Executable::propagated`] are those of the simplified program; parameter and output
/// positions are unchanged. Last, independent all-reduces, all-gathers and
/// reduce-scatters over the same devices are combined, one per kind (XLA's combiners;
/// results bitwise equal).
pub fn compile(program: &Program, mesh: &Mesh) -> Result<Executable> {
    COMPILATIONS.with(|c| c.set(c.get() + 1));
    verify(program)?;
    let program = simplify_verified(program, Stage::BeforePropagation);
    let propagated = propagate(&program, mesh)?;
    let mut spmd = partition(&propagated, mesh)?;
    spmd.program = simplify_verified(&spmd.program, Stage::Sharded);
    spmd.program = combine_collectives(&spmd.program)?;
    Ok(Executable {
        propagated,
        spmd,
        planned: OnceLock::new(),
    })
}

impl Executable {
    /// Runs on `mesh` with global inputs; returns global outputs. See [`SpmdProgram::run`].
    pub fn run(&self, mesh: &ThreadMesh, inputs: &[Literal]) -> Result<Vec<Literal>> {
        self.spmd.run_planned(&self.planned(), mesh, inputs)
    }

    /// [`SpmdProgram::execute`] with the executable's plan (made at the first run).
    pub fn execute(
        &self,
        mesh: &ThreadMesh,
        inputs: &[Input],
        outputs: &[Output],
    ) -> Result<Vec<Value>> {
        self.spmd
            .execute_planned(&self.planned(), mesh, inputs, outputs)
    }

    /// The plan of `spmd.program`: the one made at the first run, or a new one if
    /// `spmd.program` was changed since.
    fn planned(&self) -> Arc<PlannedProgram> {
        let planned = self
            .planned
            .get_or_init(|| Arc::new(PlannedProgram::new(self.spmd.program.clone())));
        if planned.program == self.spmd.program {
            Arc::clone(planned)
        } else {
            Arc::new(PlannedProgram::new(self.spmd.program.clone()))
        }
    }

    /// Runs on the MPI mesh `mesh`, every rank with the same global inputs; every rank
    /// gets the global outputs. See [`SpmdProgram::run_mpi`].
    #[cfg(feature = "mpi")]
    pub fn run_mpi(
        &self,
        mesh: &crate::runtime::MpiMesh,
        inputs: &[Literal],
    ) -> Result<Vec<Literal>> {
        self.spmd.run_mpi(mesh, inputs)
    }

    /// Runs on `mesh` and on the single-device reference interpreter with the same
    /// global `inputs`, and compares the outputs: the check that the partitioned
    /// program computes what the model means.
    pub fn compare_with_reference(
        &self,
        mesh: &ThreadMesh,
        inputs: &[Literal],
    ) -> Result<Vec<Comparison>> {
        let got = self.run(mesh, inputs)?;
        let want = interpret(&self.propagated, inputs)?;
        Ok(want
            .iter()
            .zip(&got)
            .map(|(w, g)| Comparison::of(w, g))
            .collect())
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

/// How one output of a partitioned run compares with the reference interpreter's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    /// Largest `|reference|` (0 for non-f32 outputs).
    pub max_abs: f32,
    /// Largest `|mesh - reference|`; for i32 and bool outputs 0 if equal, else infinity.
    pub max_diff: f32,
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max |value| {:.3}, max |mesh - reference| {:.2e}",
            self.max_abs, self.max_diff
        )
    }
}

impl Comparison {
    fn of(want: &Literal, got: &Literal) -> Self {
        match (want, got) {
            (Literal::F32(w), Literal::F32(g)) if w.shape() == g.shape() => Comparison {
                max_abs: w.iter().fold(0.0, |m, a| m.max(a.abs())),
                max_diff: w
                    .iter()
                    .zip(g.iter())
                    .fold(0.0, |m, (a, b)| m.max((a - b).abs())),
            },
            _ => Comparison {
                max_abs: 0.0,
                max_diff: if want == got { 0.0 } else { f32::INFINITY },
            },
        }
    }

    /// `max_diff <= tolerance * max(1, max_abs)`.
    pub fn within(&self, tolerance: f32) -> bool {
        self.max_diff <= tolerance * self.max_abs.max(1.0)
    }
}
