//! [`compile`]: the whole pipeline for one mesh — verify, propagate, partition — and the
//! [`Executable`] it returns.

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use crate::analysis::{CostAnalysis, DeviceModel, MemoryAnalysis};
use crate::error::{Error, InputProblem, Result};
use crate::ir::{Literal, Program, ValueId, verify};
use crate::partition::{SpmdProgram, collective_line, partition, save_residual_collectives};
use crate::propagation::{explain, propagate};
use crate::runtime::{Backend, Input, Loaded, Output, Value, interpret};
use crate::sharding::Mesh;
use crate::simplify::{Stage, simplify_verified};

mod gathers;
mod times;

pub use gathers::{CompileOptions, GatherChoice, GatherPlan, GatherReuse, ScanRemat};
pub use times::CompileTimes;

/// A program compiled for a mesh: the global program with a sharding on every value,
/// and the one per-device program that runs it.
///
/// It runs on any [`Backend`] whose mesh it was compiled for ([`compile_for`] compiles
/// for a backend). The per-device program's execution plan is made at its first run
/// (or by [`compile_with`]) and reused by every later [`run`](Executable::run) and
/// [`execute`](Executable::execute) (training steps).
#[derive(Debug, Clone)]
pub struct Executable {
    propagated: Program,
    spmd: SpmdProgram,
    /// Which gathered weights are kept for the backward pass.
    gathers: GatherPlan,
    /// `spmd` with its plan, made at the first run.
    loaded: OnceLock<Arc<Loaded>>,
    /// How long each phase of the compilation took.
    times: CompileTimes,
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
///
/// Every weight gathered for the forward pass is kept for the backward pass
/// ([`GatherReuse::Keep`]); [`compile_with`] can choose otherwise.
pub fn compile(program: &Program, mesh: &Mesh) -> Result<Executable> {
    compile_with(program, mesh, &CompileOptions::default())
}

/// [`compile`] with `options`: between simplifying and combining the per-device
/// program, all-gathers read by an earlier and a later cluster of users (a weight read
/// by the forward and the backward pass) are kept for the later users or issued again
/// before them, as [`CompileOptions::gathers`] says, for the memory limit
/// [`CompileOptions::memory_limit`]; the second gathers are not combined. The choice is
/// [`Executable::gathers`]. Deterministic: the same program and options give the same
/// per-device program. The default options (no limit, [`GatherReuse::Auto`]) keep
/// every gather, as [`compile`] does. Before that, with [`ScanRemat::SaveCollectives`]
/// ([`CompileOptions::scan_remat`]), each backward scan's recomputed collectives of
/// activations that its forward scan runs too are read from the forward scan instead.
pub fn compile_with(
    program: &Program,
    mesh: &Mesh,
    options: &CompileOptions,
) -> Result<Executable> {
    COMPILATIONS.with(|c| c.set(c.get() + 1));
    let mut times = CompileTimes::default();
    times.time("verify", || verify(program))?;
    check_donated(program, &options.donated)?;
    let program = times.time("simplify", || {
        simplify_verified(program, Stage::BeforePropagation)
    });
    let propagated = times.time("propagate", || propagate(&program, mesh))?;
    let mut spmd = times.time("partition", || partition(&propagated, mesh))?;
    let mut simplified = times.time("simplify sharded", || {
        simplify_verified(&spmd.program, Stage::Sharded)
    });
    if options.scan_remat == ScanRemat::SaveCollectives {
        let saved = times.time("save scan residuals", || {
            save_residual_collectives(&simplified)
        });
        if let Some(saved) = saved {
            simplified = times.time("simplify sharded", || {
                simplify_verified(&saved, Stage::Sharded)
            });
        }
    }
    let (chosen, gathers, planned) = gathers::choose(&simplified, mesh, options, &mut times)?;
    spmd.program = chosen;
    let loaded = match planned {
        Some(p) => OnceLock::from(Arc::new(Loaded::with_plan(spmd.clone(), p.plan))),
        None => OnceLock::new(),
    };
    Ok(Executable {
        propagated,
        spmd,
        gathers,
        loaded,
        times,
    })
}

/// `program` compiled for `backend`: for its mesh with `options` ([`compile_with`]),
/// or, for a backend that runs global programs as written (the
/// [`Reference`](crate::runtime::Reference) interpreter), verified and taken whole
/// ([`SpmdProgram::whole`]).
pub fn compile_for<B: Backend + ?Sized>(
    program: &Program,
    backend: &B,
    options: &CompileOptions,
) -> Result<Executable> {
    if backend.partitions() {
        return compile_with(program, backend.mesh(), options);
    }
    verify(program)?;
    check_donated(program, &options.donated)?;
    Ok(Executable {
        propagated: program.clone(),
        spmd: SpmdProgram::whole(program, backend.mesh()),
        gathers: GatherPlan {
            options: options.clone(),
            ..GatherPlan::default()
        },
        loaded: OnceLock::new(),
        times: CompileTimes::default(),
    })
}

/// An [`Error::Input`] for a donated input index that is no parameter of `program`.
fn check_donated(program: &Program, donated: &[usize]) -> Result<()> {
    match donated.iter().find(|&&i| i >= program.params.len()) {
        Some(&index) => Err(Error::Input {
            index,
            name: "(no such parameter)".into(),
            problem: InputProblem::NoSuchInput {
                index,
                inputs: program.params.len(),
            },
        }),
        None => Ok(()),
    }
}

impl Executable {
    /// The global program, simplified, after propagation (every node has a `sharding`).
    pub fn propagated(&self) -> &Program {
        &self.propagated
    }

    /// Which weights gathered for the forward pass are kept for the backward pass and
    /// which are gathered again (see [`compile_with`]).
    pub fn gathers(&self) -> &GatherPlan {
        &self.gathers
    }

    /// How long each phase of the compilation took (empty for a program taken whole
    /// by [`compile_for`]).
    pub fn compile_times(&self) -> &CompileTimes {
        &self.times
    }

    /// The per-device program. An executable does not change once compiled, so what
    /// it derives from this program (the plan, the fingerprint) is made once.
    pub fn spmd(&self) -> &SpmdProgram {
        &self.spmd
    }

    /// Runs on `backend` with global inputs (the same on every process of `backend`);
    /// returns global outputs. See [`Backend::execute`].
    pub fn run<B: Backend + ?Sized>(
        &self,
        backend: &B,
        inputs: &[Literal],
    ) -> Result<Vec<Literal>> {
        self.loaded().run(backend, inputs)
    }

    /// Runs on `backend` with `inputs` and returns the outputs as `outputs` asks (see
    /// [`Backend::execute`]).
    pub fn execute<B: Backend + ?Sized>(
        &self,
        backend: &B,
        inputs: &[Input],
        outputs: &[Output],
    ) -> Result<Vec<Value>> {
        backend.execute(self.loaded(), inputs, outputs)
    }

    /// The per-device program with its plan (made at the first run): what a backend
    /// runs.
    pub fn loaded(&self) -> &Arc<Loaded> {
        (self.loaded).get_or_init(|| {
            let donated = &self.gathers.options.donated;
            Arc::new(Loaded::donating(self.spmd.clone(), donated))
        })
    }

    /// What each device holds while it runs the per-device program (see
    /// [`MemoryAnalysis`]), with the inputs named `<slot>(<name>)`, where `<name>` is
    /// another input's name, counted as optimizer state: the names
    /// [`step_program`](crate::train::step_program) gives every optimizer's slots
    /// (`m(w)`, `v(w)`, `momentum(w)`, Adafactor's `v_row(w)` and `v_col(w)`).
    pub fn memory_analysis(&self) -> MemoryAnalysis {
        let program = &self.spmd.program;
        let name = |p: &ValueId| program.node(*p).name.as_deref();
        let names: HashSet<&str> = program.params.iter().filter_map(name).collect();
        let is_state = |i: usize| {
            let slot_of = (program.params.get(i).and_then(name))
                .and_then(|n| n.split_once('('))
                .and_then(|(_, rest)| rest.strip_suffix(')'));
            slot_of.is_some_and(|weight| names.contains(weight))
        };
        self.memory_analysis_with(&is_state)
    }

    /// [`Executable::memory_analysis`] with `is_state(i)` telling whether input `i` is
    /// optimizer state (e.g. from [`TrainStep::params`](crate::train::TrainStep)).
    pub fn memory_analysis_with(&self, is_state: &dyn Fn(usize) -> bool) -> MemoryAnalysis {
        let loaded = self.loaded();
        MemoryAnalysis::of(&loaded.spmd().program, &loaded.plan, is_state)
    }

    /// What each device computes and receives in one run of the per-device program,
    /// and the step time that gives on `device` (see [`CostAnalysis`]).
    pub fn cost_analysis(&self, device: &DeviceModel) -> CostAnalysis {
        CostAnalysis::of(&self.spmd.program, &self.spmd.mesh, device)
    }

    /// Runs on `backend` and on the single-device reference interpreter with the same
    /// global `inputs`, and compares the outputs: the check that the partitioned
    /// program computes what the model means.
    pub fn compare_with_reference<B: Backend + ?Sized>(
        &self,
        backend: &B,
        inputs: &[Literal],
    ) -> Result<Vec<Comparison>> {
        let got = self.run(backend, inputs)?;
        let want = interpret(&self.propagated, inputs)?;
        Ok(want
            .iter()
            .zip(&got)
            .map(|(w, g)| Comparison::of(w, g))
            .collect())
    }

    /// What is known about global value `value` of [`propagated`](Self::propagated):
    /// its sharding, per dim the user annotation it came from (name and source line,
    /// [`crate::propagation::explain`]), and the collectives of the per-device program
    /// that move it or serve the op defining it, each with its reason.
    ///
    /// ```text
    /// %5 = dot_general : f32[8,32] sharding=(data, model)
    ///   dim 0 (8): data, from the annotation of %0 "x" at src/main.rs:9
    ///   dim 1 (32): model, from the annotation of %1 "w1" at src/main.rs:10
    /// collectives:
    ///   %14 all_reduce over ["model"]: f32[4,8] -> f32[4,8], 128 bytes/device  // src/main.rs:12
    ///       why (global %N): result of %5 = dot_general at src/main.rs:12: ...
    /// ```
    pub fn explain(&self, value: ValueId) -> String {
        let mut text = explain(&self.propagated, value);
        let program = &self.spmd.program;
        let touching: Vec<String> = (program.values())
            .filter(|&c| program.node(c).why.iter().any(|w| w.touches(value)))
            .map(|c| format!("  {}", collective_line(program, c, &self.spmd.mesh)))
            .collect();
        if touching.is_empty() {
            text += "\nno collectives";
        } else {
            text += "\ncollectives:\n";
            text += touching.concat().trim_end();
        }
        text
    }

    /// Writes [`html`](Self::html) to `path`.
    pub fn write_html(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        std::fs::write(path, self.html())
    }

    /// The report as one self-contained HTML page (inline CSS, SVG and script; nothing
    /// fetched): summary figures, the partitioner's warnings, the memory per device
    /// ([`memory_analysis`](Self::memory_analysis): the peak, what it is made of, the
    /// bytes held at each node as a chart), the gathered weights kept or gathered again
    /// ([`gathers`](Self::gathers)), every collective with its
    /// bytes per device and reasons, and the propagated program in collapsible sections
    /// (one per named value, inside them one per source line), each value with its
    /// sharding drawn as the mesh (one square per device, coloured by the block it
    /// holds), its annotations and the collectives its op needed.
    pub fn html(&self) -> String {
        let gathers = self.gathers.to_string();
        crate::report_html::page(
            &self.propagated,
            &self.spmd,
            &self.memory_analysis(),
            &gathers,
        )
    }

    /// The propagated global program, then the partitioned program with its
    /// collectives, then which gathered weights are kept ([`Executable::gathers`]).
    pub fn report(&self) -> String {
        format!(
            "// after propagation\n{}\n\n{}\n\n{}",
            self.propagated,
            self.spmd.report(),
            self.gathers
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
