//! The crate's one error type.
//!
//! Every error that user input can reach is a variant here; nothing on such a path
//! panics. Variants name the problem, the op or value concerned and, where the value was
//! traced from user code, the user's source location.

use crate::types::{Location, TensorType, ValueId};

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in gspmd-core.
///
/// Its `Debug` form is its message (the `Display` form, which includes the causes of
/// errors that wrap others), so that a `fn main() -> gspmd::Result<()>` that fails
/// prints what went wrong rather than the enum's fields; match on the variants for the
/// structure.
#[derive(Clone, PartialEq, thiserror::Error)]
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
    /// A random-number op was asked for something outside its domain: a probability
    /// outside `[0, 1]`, a dropout rate outside `[0, 1)`, an empty or infinite interval
    /// (see [`crate::ir::random`]).
    #[error("{location}: {op}: {message}")]
    Random {
        /// The function's name (`uniform`, `bernoulli`, `dropout`).
        op: &'static str,
        /// Where it was traced.
        location: Location,
        /// What is wrong, naming the value given.
        message: String,
    },
    /// A `shard_map` (manual region) or a collective in its body misused: a spec naming
    /// an axis that is not manual, a dim its axes do not divide, a body result that does
    /// not fit its out-spec, a collective over an axis that is not manual or outside a
    /// body.
    #[error("{location}: {op}: {message}")]
    Manual {
        /// `shard_map` or the collective's name (`psum`, `all_gather`, ...).
        op: &'static str,
        /// Where it was traced.
        location: Location,
        /// What is wrong.
        message: String,
    },
    /// Several errors found at once (the verifier and the tracer report all they find).
    #[error("{}", display_list(.0))]
    Many(Vec<Error>),
    /// Two parameters of one program have the same name (inputs, checkpoints and
    /// resident values are keyed by parameter name).
    #[error("{second}: parameter `{name}` is already declared at {first}")]
    DuplicateName {
        /// The repeated name.
        name: String,
        /// Where the first parameter of that name was declared.
        first: Location,
        /// Where the repeated one was declared.
        second: Location,
    },
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
    /// A mesh is malformed: an axis name that is not an identifier, an axis of size 0,
    /// an axis named twice, more devices than a `usize` counts.
    #[error("invalid mesh: {problem}")]
    InvalidMesh {
        /// What is wrong, naming the axis.
        problem: MeshProblem,
    },
    /// A mesh's device order is not a permutation of `0..num_devices`.
    #[error("mesh device order is not a permutation of 0..{num_devices}: {problem}")]
    DeviceOrder {
        /// Number of devices the mesh's axes describe.
        num_devices: usize,
        /// Which id is missing, repeated or out of range.
        problem: DeviceOrderProblem,
    },
    /// A group of devices over a list of mesh axes (a collective's group, an
    /// `axis_index`) cannot be formed: an axis the mesh does not have or listed twice,
    /// a device not in the mesh, or a member index beyond the group.
    #[error("group over [{}] of {mesh}: {problem}", .axes.join(", "))]
    AxisGroup {
        /// The axes as listed.
        axes: Vec<String>,
        /// The mesh, as displayed.
        mesh: String,
        /// What is wrong.
        problem: GroupProblem,
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
    /// A sharding puts a dim that is not split in reversed device order
    /// ([`DimSharding::reversed`](crate::sharding::DimSharding::reversed)).
    #[error(
        "{context}dim {dim} of sharding {sharding} is in reversed device order (`-`) but not \
         split over any mesh axis"
    )]
    ReversedUnsplitDim {
        /// The dim.
        dim: usize,
        /// The sharding as written.
        sharding: String,
        /// Which value and source location; may be empty.
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
    /// A sharding names a sub-axis `axis:(pre)size` that is not one: `size` below 2,
    /// `pre` of 0, `pre * size` not dividing the axis size, or a sub-axis among the
    /// unreduced axes (partial sums are kept over whole axes).
    #[error("{context}invalid sub-axis `{axis}` in sharding {sharding}: {problem}")]
    InvalidSubAxis {
        /// The sub-axis as written.
        axis: String,
        /// The sharding as written.
        sharding: String,
        /// What is wrong.
        problem: SubAxisProblem,
        /// Which value and source location; may be empty.
        context: String,
    },
    /// A sharding uses two parts of one mesh axis that share devices' coordinates: an
    /// axis and a sub-axis of it, or two sub-axes whose digits overlap
    /// ([`AxisPart::overlaps`](crate::sharding::AxisPart::overlaps)).
    #[error(
        "{context}`{axis}` and `{other}` overlap in sharding {sharding} (parts of one mesh axis must be disjoint digits)"
    )]
    OverlappingAxes {
        /// The first of the two, in the order written.
        axis: String,
        /// The second.
        other: String,
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
    #[error("cannot parse sharding `{text}` at offset {offset}: {problem}")]
    ParseSharding {
        /// The text given.
        text: String,
        /// The byte offset in `text` where the problem is.
        offset: usize,
        /// What is wrong there.
        problem: ParseProblem,
    },

    /// Per-device shards do not fit together into the global value.
    #[error("cannot assemble shards of sharding {sharding}: {problem}")]
    Assemble {
        /// The sharding as written.
        sharding: String,
        /// What does not fit: shard count, a device's shard shape or dtype, ...
        problem: AssembleProblem,
    },

    // ---- binding a model's inputs (the `#[gspmd::model]` DSL) ---------------------
    /// A shape symbol of a model was given two different sizes by its input shapes.
    #[error(
        "model `{model}`: shape symbol `{symbol}` is {first_size} in parameter `{first_param}` \
         but {second_size} in parameter `{second_param}`"
    )]
    SymbolConflict {
        /// The model.
        model: String,
        /// The symbol, e.g. `D`.
        symbol: String,
        /// The parameter that bound it first.
        first_param: String,
        /// The size it bound.
        first_size: usize,
        /// The parameter that disagrees.
        second_param: String,
        /// The size it gives.
        second_size: usize,
    },
    /// A parameter struct (`#[gspmd::params]`) and the model that takes it disagree about
    /// a shape symbol: the struct uses one the model's `#[params(..)]` does not list,
    /// the list names one the struct does not use, or a symbol the struct needs has no
    /// size yet.
    #[error("model `{model}`: parameter struct `{param}`, shape symbol `{symbol}`: {problem}")]
    ParamsSymbol {
        /// The model.
        model: String,
        /// The model's parameter that takes the struct.
        param: String,
        /// The symbol, e.g. `L`.
        symbol: String,
        /// What is wrong and what to write instead.
        problem: SymbolProblem,
    },
    /// A model was given a different number of input shapes than it has tensor parameters.
    #[error("model `{model}` has {expected} tensor parameters but {given} shapes were given")]
    ArgumentCount {
        /// The model.
        model: String,
        /// Number of tensor parameters.
        expected: usize,
        /// Number of shapes given.
        given: usize,
    },
    /// An input shape does not fit its parameter's declaration (rank or a fixed size).
    #[error(
        "model `{model}`: parameter `{param}` is declared {declared} but was given shape {given:?}"
    )]
    ArgumentShape {
        /// The model.
        model: String,
        /// The parameter.
        param: String,
        /// The declared dims, e.g. `[B, 16]`.
        declared: String,
        /// The shape given.
        given: Vec<usize>,
    },
    /// A model's body returned a value whose type differs from the declared result type.
    #[error(
        "{location}: model `{model}`: {result} is declared {declared} but the body returned {given}"
    )]
    ResultType {
        /// The model (static: models are declared in code).
        model: &'static str,
        /// `result` or `result.N` for a tuple element.
        result: &'static str,
        /// The declared type with symbols bound, e.g. `f32[B, D] = f32[8,16]`.
        declared: String,
        /// The type the body returned.
        given: TensorType,
        /// Where the result type is declared.
        location: Location,
    },

    // ---- partitioning --------------------------------------------------------------
    /// The partitioner cannot handle a value (an unsupported sharding of an op, or a
    /// program that was not propagated).
    #[error("{location}: {value}: cannot partition {op}: {message}")]
    Partition {
        /// The value being partitioned.
        value: ValueId,
        /// The op's name.
        op: &'static str,
        /// Where the op was traced.
        location: Location,
        /// What is not supported.
        message: String,
    },

    // ---- export ----------------------------------------------------------------------
    /// A value that StableHLO with Shardy's `sdy` dialect cannot express (see
    /// `gspmd_core::export`): a shard order the `sdy` mesh cannot name (a reversed dim),
    /// a per-device block padded because its axes do not divide the dim, a manual
    /// region inside a per-device program.
    #[error("{location}: {value}: cannot export {op} to StableHLO: {message}")]
    Export {
        /// The value being exported.
        value: ValueId,
        /// The op's name.
        op: &'static str,
        /// Where the op was traced.
        location: Location,
        /// What cannot be expressed.
        message: String,
    },

    /// A StableHLO module that `gspmd_core::import` cannot read: an op outside its
    /// subset, a malformed type, attribute or sharding, an undefined value.
    #[error("StableHLO line {line}: {message}")]
    Import {
        /// The 1-based line of the module text.
        line: usize,
        /// What cannot be read, quoting the text.
        message: String,
    },

    // ---- autodiff ------------------------------------------------------------------
    /// `grad` was asked for a loss or parameters that do not fit the program.
    #[error("grad of program `{program}`: {problem}")]
    GradRequest {
        /// The program's name.
        program: String,
        /// What does not fit: the output or parameter index, its name and type.
        problem: RequestProblem,
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

    // ---- training ------------------------------------------------------------------
    /// An optimizer (or its learning-rate schedule) does not fit: a hyper-parameter out
    /// of range, a weight-decay mask matching nothing, two state slots of one name.
    #[error("optimizer {optimizer}: {problem}")]
    Optimizer {
        /// The optimizer or schedule as given (its `Debug` text).
        optimizer: String,
        /// What is wrong.
        problem: OptimizerProblem,
    },
    /// `step_program` was asked for a step that does not fit the model.
    #[error("training step of program `{program}`: {problem}")]
    TrainRequest {
        /// The model program's name.
        program: String,
        /// What does not fit: the parameter index, its name and type.
        problem: RequestProblem,
    },
    /// A value given to a trainer (an initial parameter, a step's data, a checkpoint's
    /// tensor, a data set's example) does not fit the step program.
    #[error("trainer input `{name}`: {problem}")]
    TrainerInput {
        /// The input's name (parameter, state slot or data input).
        name: String,
        /// Expected vs. given.
        problem: InputProblem,
    },
    /// A training step or an evaluation was asked for an aux output it does not have.
    #[error("program `{program}` has no aux output `{name}` (it has [{}])", .available.join(", "))]
    UnknownOutput {
        /// The step's or the evaluated model's program name.
        program: String,
        /// The name asked for.
        name: String,
        /// The aux outputs it has.
        available: Vec<String>,
    },
    /// A checkpoint could not be written or read.
    #[error("checkpoint {path}: {}{problem}", tensor_prefix(.tensor))]
    Checkpoint {
        /// The file or directory: a safetensors file, a sharded checkpoint's index or
        /// one of its shard files.
        path: String,
        /// The tensor concerned, if the problem is one tensor's.
        tensor: Option<String>,
        /// What went wrong (I/O, format, an unsupported dtype, a repeated name, a
        /// tensor that does not fit the step, a file of another save).
        problem: CheckpointProblem,
    },

    // ---- running programs ----------------------------------------------------------
    /// A program was run with the wrong inputs (a wrong count, a value of another type,
    /// a resident value the backend does not hold, ...), found before anything runs.
    #[error("input {index} ({name}): {problem}")]
    Input {
        /// Parameter index.
        index: usize,
        /// Parameter name (`#i` for a parameter without one).
        name: String,
        /// Expected vs. given.
        problem: InputProblem,
    },
    /// A program was run on a mesh other than the one it was partitioned for.
    #[error("program partitioned for mesh {partitioned_for} cannot run on mesh {given}")]
    WrongMesh {
        /// The mesh the program was partitioned for.
        partitioned_for: String,
        /// The mesh it was run on.
        given: String,
    },
    /// A run was given a different number of output modes than the program has outputs.
    #[error("{given} output modes given for a program with {expected} outputs")]
    OutputCount {
        /// Number of outputs of the program.
        expected: usize,
        /// Number of output modes given.
        given: usize,
    },
    /// A device does not hold the resident value a run binds as an input.
    #[error("device {device} holds no resident value `{key}`")]
    MissingResident {
        /// The device.
        device: usize,
        /// The resident value's key.
        key: String,
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
    /// A value does not fit in the memory limit next to the values live when it is
    /// computed; found before it is allocated.
    #[error(
        "{location}: {value} = {op}: out of memory: needs {bytes} bytes and {scratch} bytes of \
         kernel scratch with {live} bytes live, over the limit of {limit} bytes"
    )]
    OutOfMemory {
        /// The value that does not fit.
        value: ValueId,
        /// The op's name.
        op: &'static str,
        /// Where the op was traced.
        location: Location,
        /// The value's size in bytes.
        bytes: usize,
        /// The scratch its kernel holds while it runs besides its operands and result
        /// (a convolution's padded input, say), as the memory analysis estimates it.
        scratch: usize,
        /// Bytes of the values live when it would be allocated.
        live: usize,
        /// The device's memory limit in bytes.
        limit: usize,
    },

    // ---- collectives and the thread mesh -------------------------------------------
    /// A collective could not run: unknown or repeated axes, a dim out of range or not
    /// divisible by the group size, bad permute pairs, operands that differ across the
    /// group, or devices that are not all at the same collective.
    #[error("device {device}: {collective}: {problem}")]
    Collective {
        /// The device that found the problem.
        device: usize,
        /// The collective as called, e.g. `all_reduce(sum) over [data]`.
        collective: String,
        /// What is wrong.
        problem: CollectiveProblem,
    },
    /// A collective kind given by name that is none
    /// ([`CollectiveKind`](crate::ir::CollectiveKind)'s `FromStr`).
    #[error(
        "unknown collective `{name}` (the collectives are all_gather, all_reduce, all_to_all, \
         collective_permute, collective_shift, reduce_scatter)"
    )]
    UnknownCollective {
        /// The name given.
        name: String,
    },
    /// A device was released from a collective because the communicator was aborted.
    #[error("device {device}: collective aborted: {cause}")]
    Aborted {
        /// The device released.
        device: usize,
        /// Why the communicator was aborted (the first failure).
        #[source]
        cause: Box<Error>,
    },
    /// A device's program returned an error during a run.
    #[error("device {device} failed: {cause}")]
    DeviceFailed {
        /// The failing device.
        device: usize,
        /// Its error.
        #[source]
        cause: Box<Error>,
    },
    /// A device's program panicked during a run.
    #[error("device {device} panicked{}: {message}", panic_place(.position))]
    DevicePanicked {
        /// The panicking device.
        device: usize,
        /// Where it was: the last node its program reached (its op and the user's
        /// source line) and the loop iteration, each if known.
        position: RunPosition,
        /// The panic's message (its payload, as text).
        message: String,
    },
    /// Devices did not reach a collective (or the end of their program) within the
    /// thread mesh's timeout while another device waited there; the run is aborted.
    #[error("device {device}: {collective}: devices {missing:?} did not arrive within {timeout:?}")]
    CollectiveTimeout {
        /// The device that waited and gave up.
        device: usize,
        /// Where it waited, e.g. `all_reduce(sum) over [data]`.
        collective: String,
        /// The devices that had not arrived.
        missing: Vec<usize>,
        /// The timeout.
        timeout: std::time::Duration,
    },
    /// `ThreadMesh::run` was called from one of the
    /// mesh's own device threads (the device would wait for itself).
    #[error("thread mesh: run called from device {device}'s own thread")]
    ReentrantRun {
        /// The device whose thread called `run`.
        device: usize,
    },
    /// The thread mesh could not start its threads, or lost track of one.
    #[error("thread mesh: {problem}")]
    ThreadMesh {
        /// What went wrong.
        problem: ThreadMeshProblem,
    },
    /// An MPI rank's program failed; the other ranks learn it at their next collective.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The failing rank (its device id when each rank holds one device).
        rank: usize,
        /// Its error, as text (errors do not cross processes).
        message: String,
    },
    /// The MPI mesh could not start (no MPI, or a world size other than the mesh's
    /// device count) or was given a program for another mesh.
    #[error("MPI mesh: {problem}")]
    MpiMesh {
        /// What went wrong.
        problem: MpiProblem,
    },
    /// A run passed its deadline (`with_deadline` on a mesh or the interpreter) and
    /// was cancelled: where each device was when it stopped.
    #[error(
        "the run passed its deadline of {deadline:?} and was cancelled: {}",
        positions_text(positions)
    )]
    DeadlineExceeded {
        /// The deadline the run was given.
        deadline: std::time::Duration,
        /// Where each device was, by device.
        positions: Vec<RunPosition>,
    },
    /// A zero timeout or deadline, which would fail every run at once.
    #[error("{setting}: a zero duration would fail every run; give a positive one")]
    ZeroDuration {
        /// The setting given zero, e.g. `ThreadMesh::with_timeout`.
        setting: &'static str,
    },
    /// A device thread of a thread mesh is gone (it panicked outside any program), so
    /// the mesh cannot run; a new mesh can.
    #[error("thread mesh: the thread of device {device} has exited; make a new mesh")]
    DeviceThreadExited {
        /// The device whose thread exited.
        device: usize,
    },
}

/// Where one device was when its run was cancelled: the node it was at (its op and
/// the user's source line) and the iteration of the innermost loop around it, each if
/// known (a device still inside a kernel when the run gave up on it is at neither).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPosition {
    /// The device.
    pub device: usize,
    /// The op of the node it was at.
    pub op: Option<&'static str>,
    /// Where that node was traced.
    pub location: Option<Location>,
    /// The iteration of the innermost loop it was in (0 for the first).
    pub iteration: Option<usize>,
}

impl RunPosition {
    /// `device`, at no known node or iteration (it is still running, or was not
    /// seen).
    pub fn unknown(device: usize) -> Self {
        RunPosition {
            device,
            op: None,
            location: None,
            iteration: None,
        }
    }
}

impl std::fmt::Display for RunPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {}", self.device)?;
        match (self.op, self.location) {
            (Some(op), Some(location)) => write!(f, " at {op} ({location})")?,
            (Some(op), None) => write!(f, " at {op}")?,
            _ => write!(f, " still running")?,
        }
        if let Some(i) = self.iteration {
            write!(f, " in loop iteration {i}")?;
        }
        Ok(())
    }
}

/// ` at dot_general (src/model.rs:12) in loop iteration 3`, or as much of it as
/// `position` knows (for [`Error::DevicePanicked`]'s text).
fn panic_place(position: &RunPosition) -> String {
    let mut text = match (position.op, position.location) {
        (Some(op), Some(location)) => format!(" at {op} ({location})"),
        (Some(op), None) => format!(" at {op}"),
        _ => String::new(),
    };
    if let Some(i) = position.iteration {
        text.push_str(&format!(" in loop iteration {i}"));
    }
    text
}

/// The positions as one line, `; `-separated (for [`Error::DeadlineExceeded`]'s text).
fn positions_text(positions: &[RunPosition]) -> String {
    let items: Vec<String> = positions.iter().map(ToString::to_string).collect();
    items.join("; ")
}

/// What is wrong with a mesh's axes ([`Error::InvalidMesh`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MeshProblem {
    /// An axis name that is not an identifier (empty, or not letters, digits and `_`).
    #[error("axis name `{axis}` is not an identifier")]
    NotAnIdentifier {
        /// The name as given.
        axis: String,
    },
    /// An axis of size 0.
    #[error("axis `{axis}` has size 0")]
    ZeroSize {
        /// The axis.
        axis: String,
    },
    /// Two axes of one name.
    #[error("axis `{axis}` appears twice")]
    RepeatedAxis {
        /// The repeated name.
        axis: String,
    },
    /// The product of the axis sizes overflows a `usize`.
    #[error("the number of devices overflows")]
    TooManyDevices,
}

/// A value's type and sharding (as displayed: `error` sits below `sharding`), in an
/// [`InputProblem::Resident`].
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// The global type.
    pub ty: TensorType,
    /// The sharding, e.g. `(data, _)`.
    pub sharding: String,
}

/// What is wrong with an optimizer ([`Error::Optimizer`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OptimizerProblem {
    /// A hyper-parameter outside its range (or not finite).
    #[error("{name} = {value} must be {requirement}")]
    HyperParameter {
        /// Its name (`lr`, `beta1`, `total`, ...).
        name: String,
        /// The value given.
        value: f32,
        /// What it must be, e.g. `finite and > 0`.
        requirement: String,
    },
    /// A weight-decay [`Mask`](crate::train::Mask) pattern that matches no trained
    /// parameter (a misspelt name would otherwise decay nothing silently).
    #[error("mask pattern `{pattern}` matches no trained parameter")]
    UnusedMask {
        /// The pattern.
        pattern: String,
    },
    /// Two state slots of one name (a chain of two transforms keeping the same state).
    #[error("two state slots are named `{slot}`")]
    RepeatedSlot {
        /// The name.
        slot: String,
    },
    /// The step's own inputs do not fit the optimizer (a bug of the step builder).
    #[error("internal: {reason}")]
    Internal {
        /// What does not fit.
        reason: String,
    },
}

/// Why a mesh's device ids are not a permutation ([`Error::DeviceOrder`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceOrderProblem {
    /// Another number of ids than the mesh has devices.
    #[error("{given} device ids given")]
    Count {
        /// Number of ids given.
        given: usize,
    },
    /// An id not below the number of devices.
    #[error("id {id} out of range")]
    OutOfRange {
        /// The id.
        id: usize,
    },
    /// An id listed twice.
    #[error("id {id} repeated")]
    Repeated {
        /// The id.
        id: usize,
    },
}

/// What is wrong with a value fed to a program or a trainer ([`Error::Input`],
/// [`Error::TrainerInput`]): every input is checked against the program's typed
/// description of it before anything runs — a count, a type, a missing, unknown or
/// repeated name is this error, never a fallback value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InputProblem {
    /// Another number of values than the program (or the step's data, or the trained
    /// parameters) takes.
    #[error("expects {expected} inputs but {given} were given")]
    Count {
        /// How many it takes.
        expected: usize,
        /// How many were given.
        given: usize,
    },
    /// A value of another shape or dtype.
    #[error("expected {expected}, given {given}")]
    Type {
        /// The type the program declares.
        expected: TensorType,
        /// The value's type.
        given: TensorType,
    },
    /// A device's block of another shape or dtype than its block of the sharded value.
    #[error("device {device}'s block is {given}, expected {expected}")]
    Block {
        /// The device.
        device: usize,
        /// The block's type under the input's sharding.
        expected: TensorType,
        /// The block given.
        given: TensorType,
    },
    /// Another number of blocks than this process has devices.
    #[error("{given} shards given for the {expected} devices of this process")]
    ShardCount {
        /// Devices of this process.
        expected: usize,
        /// Blocks given.
        given: usize,
    },
    /// A partial-sum (unreduced) parameter given as a global value.
    #[error("the parameter is unreduced over {axes:?}: give each device's partial sum as shards")]
    Unreduced {
        /// The axes it is unreduced over.
        axes: Vec<String>,
    },
    /// A resident value the backend does not hold.
    #[error("no resident value `{key}` on the mesh")]
    NoResident {
        /// Its key.
        key: String,
    },
    /// A resident value of another type or sharding than the parameter.
    #[error(
        "resident `{key}` is {} sharded {}, but the parameter is {} sharded {}",
        .given.ty, .given.sharding, .expected.ty, .expected.sharding
    )]
    Resident {
        /// Its key.
        key: String,
        /// The parameter's type and sharding.
        expected: Box<Placement>,
        /// The resident value's.
        given: Box<Placement>,
    },
    /// An input index past the program's parameters (e.g. a donated one).
    #[error("the program takes {inputs} inputs, there is no input {index}")]
    NoSuchInput {
        /// The index given.
        index: usize,
        /// Number of inputs of the program.
        inputs: usize,
    },
    /// An input the program takes was not given (by name).
    #[error("missing")]
    Missing,
    /// A value given under a name the program has no input of.
    #[error("no such input (the inputs are [{}])", .available.join(", "))]
    Unknown {
        /// The inputs it has.
        available: Vec<String>,
    },
    /// A name given twice.
    #[error("given twice")]
    Repeated,
    /// No initializer rule matches the parameter's name.
    #[error("no initializer rule matches this parameter")]
    NoInitRule,
    /// An index past the end of a data set's examples or fields.
    #[error("no {what} {index} of {len}")]
    OutOfRange {
        /// `example` or `field`.
        what: &'static str,
        /// The index asked for.
        index: usize,
        /// How many there are.
        len: usize,
    },
    /// A value that does not fit otherwise (a data file's format, a step count that is
    /// not a non-negative i32 scalar, ...).
    #[error("{reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
    },
}

/// `tensor `name`: ` for an [`Error::Checkpoint`] about one tensor, else nothing.
fn tensor_prefix(tensor: &Option<String>) -> String {
    tensor
        .as_ref()
        .map(|name| format!("tensor `{name}`: "))
        .unwrap_or_default()
}

fn display_list(errors: &[Error]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    format!("{} errors:\n  {}", errors.len(), lines.join("\n  "))
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
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

/// Why a group of devices over mesh axes cannot be formed ([`Error::AxisGroup`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupProblem {
    /// An axis the mesh does not have.
    #[error("unknown mesh axis `{axis}` (mesh axes: {})", .available.join(", "))]
    UnknownAxis {
        /// The axis as listed.
        axis: String,
        /// The mesh's axes.
        available: Vec<String>,
    },
    /// An axis listed twice (or two parts of one axis that overlap).
    #[error("mesh axis `{axis}` listed twice")]
    RepeatedAxis {
        /// The axis listed again.
        axis: String,
    },
    /// A device id not in the mesh.
    #[error("device {device} is not in the mesh")]
    NoSuchDevice {
        /// The id.
        device: usize,
    },
    /// A member index not below the group's size.
    #[error("index {index} is not below the group size {size}")]
    NoSuchMember {
        /// The index asked for.
        index: usize,
        /// The group's size.
        size: usize,
    },
}

/// Why a sub-axis `axis:(pre)size` of a sharding is not one ([`Error::InvalidSubAxis`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubAxisProblem {
    /// The name is not of the form `axis:(pre)size`.
    #[error("not of the form `axis:(pre)size`")]
    NotSubAxis,
    /// `pre` is 0.
    #[error("`pre` must be at least 1")]
    ZeroPre,
    /// `size` is below 2.
    #[error("size {size} is below 2")]
    SizeBelowTwo {
        /// The size written.
        size: usize,
    },
    /// `pre * size` does not divide the axis's size.
    #[error("pre * size = {pre} * {size} does not divide the axis size {axis_size}")]
    NotDividing {
        /// The `pre` written.
        pre: usize,
        /// The `size` written.
        size: usize,
        /// The whole axis's size.
        axis_size: usize,
    },
    /// A sub-axis among the unreduced axes.
    #[error("partial sums are kept over whole mesh axes, not sub-axes")]
    Unreduced,
}

/// What the sharding parser found at a byte offset ([`Error::ParseSharding`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseProblem {
    /// Something other than what may come next (or the end of the text).
    #[error("expected {expected}, found {}", .found.map_or_else(|| "the end of the text".to_string(), |c| format!("`{c}`")))]
    Expected {
        /// What may come there, e.g. `` `,` or `)` ``.
        expected: String,
        /// The character found; none at the end of the text.
        found: Option<char>,
    },
    /// `replicated={..}` or `unreduced={..}` given twice.
    #[error("`{clause}` given twice")]
    GivenTwice {
        /// The clause's name.
        clause: String,
    },
    /// `-` (reversed device order) before a dim that is not split.
    #[error("`-` (reversed device order) before an unsplit dim")]
    ReversedUnsplit,
    /// A number too large for a `usize`.
    #[error("the number `{digits}` is too large")]
    Number {
        /// The digits.
        digits: String,
    },
}

/// Why per-device shards do not fit together ([`Error::Assemble`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AssembleProblem {
    /// The sharding has unreduced axes: partial sums must be reduced first.
    #[error("unreduced over {{{}}}: partial sums must be reduced first", .axes.join(", "))]
    Unreduced {
        /// The unreduced axes.
        axes: Vec<String>,
    },
    /// Not one shard per device.
    #[error("{given} shards given for {devices} devices")]
    ShardCount {
        /// Shards given.
        given: usize,
        /// Devices of the mesh.
        devices: usize,
    },
    /// A device's shard of another shape or dtype than its block.
    #[error("device {device}'s shard is {given}, expected {expected}")]
    Shard {
        /// The device.
        device: usize,
        /// The shard given.
        given: TensorType,
        /// Its block's type under the sharding.
        expected: TensorType,
    },
    /// A block could not be cut, summed or decoded (its bytes from another process).
    #[error("{reason}")]
    Block {
        /// What failed.
        reason: String,
    },
}

/// How a parameter struct and its model disagree about a shape symbol
/// ([`Error::ParamsSymbol`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SymbolProblem {
    /// The struct's fields use the symbol but the model's `#[params(..)]` does not
    /// list it.
    #[error(
        "the struct's fields use it but the model's `#[params(..)]` does not list it: write \
         `#[params({})]`", .used.join(", ")
    )]
    NotListed {
        /// The symbols the struct uses.
        used: Vec<String>,
    },
    /// The model's `#[params(..)]` lists a symbol the struct does not use.
    #[error(
        "listed in the model's `#[params(..)]` but no field of the struct uses it: write \
         `#[params({})]`", .used.join(", ")
    )]
    NotUsed {
        /// The symbols the struct uses.
        used: Vec<String>,
    },
    /// The struct needs the symbol's size, but it has none: it is not in the model's
    /// `#[params(..)]`.
    #[error("it has no size: list it in the model's `#[params(..)]`")]
    NoSize,
    /// The symbol sets a `Vec` length, so it must be sized before the struct's leaves
    /// are listed.
    #[error(
        "it sets a `Vec` length, so it must be sized before the struct's leaves are listed: \
         give it to `trace`, or bind it from a tensor parameter before the struct"
    )]
    LengthUnsized,
}

/// What a `grad` or a training-step request gets wrong ([`Error::GradRequest`],
/// [`Error::TrainRequest`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestProblem {
    /// The loss output's index is past the program's outputs.
    #[error("loss output {index} is out of range: the program has {outputs} outputs")]
    NoSuchOutput {
        /// The index given.
        index: usize,
        /// The program's outputs.
        outputs: usize,
    },
    /// The loss is not a float scalar.
    #[error("loss output {index} ({value}) is {ty}, not a float scalar")]
    LossNotScalar {
        /// The output's index.
        index: usize,
        /// Its value.
        value: ValueId,
        /// Its type.
        ty: TensorType,
    },
    /// A parameter index past the program's parameters.
    #[error("parameter {index} is out of range: the program has {params} parameters")]
    NoSuchParameter {
        /// The index given.
        index: usize,
        /// The program's parameters.
        params: usize,
    },
    /// A parameter that is not a float (it has no gradient).
    #[error("parameter {index} ({name}) is {ty}: only float parameters have gradients")]
    NotFloat {
        /// Its index.
        index: usize,
        /// Its name.
        name: String,
        /// Its type.
        ty: TensorType,
    },
    /// No parameter to train.
    #[error("no parameter to train")]
    NothingTrained,
    /// A parameter listed twice among the trained ones.
    #[error("parameter {index} is listed twice among the trained parameters (at {at})")]
    RepeatedParameter {
        /// The parameter.
        index: usize,
        /// Its second place in the list.
        at: usize,
    },
    /// A trainable-parameter pattern that matches no parameter (a typo would otherwise
    /// silently freeze a weight).
    #[error("pattern `{pattern}` matches no parameter (they are {})", .names.join(", "))]
    UnmatchedPattern {
        /// The pattern.
        pattern: String,
        /// The parameters' names.
        names: Vec<String>,
    },
    /// Two patterns select one parameter.
    #[error(
        "patterns `{first}` and `{second}` both select parameter `{name}` (each parameter may \
         be selected once)"
    )]
    OverlappingPatterns {
        /// The first pattern.
        first: String,
        /// The second.
        second: String,
        /// The parameter both select.
        name: String,
    },
    /// An aux-output pattern that matches no output besides the loss.
    #[error("aux pattern `{pattern}` matches no model output besides the loss (they are [{}])", .names.join(", "))]
    UnmatchedAux {
        /// The pattern.
        pattern: String,
        /// The outputs' names.
        names: Vec<String>,
    },
    /// Two selected aux outputs of one name.
    #[error(
        "model outputs {first} and {second} are both named `{name}`: name them apart to return \
         both as aux outputs"
    )]
    RepeatedAux {
        /// The first output's index.
        first: usize,
        /// The second's.
        second: usize,
        /// Their name.
        name: String,
    },
    /// Gradient accumulation over 0 microbatches.
    #[error("gradient accumulation over 0 microbatches")]
    ZeroMicrobatches,
    /// Something the step cannot combine with gradient accumulation.
    #[error("{what} with gradient accumulation: {why}")]
    NotWithAccumulation {
        /// What, e.g. `aux outputs`.
        what: &'static str,
        /// Why not.
        why: &'static str,
    },
    /// The parameter named as the step's random key is not an `i32[2]`.
    #[error("parameter {index} `{name}` is the step's random key, an i32[2], but it is {ty}")]
    RandomKey {
        /// Its index.
        index: usize,
        /// Its name.
        name: &'static str,
        /// Its type.
        ty: TensorType,
    },
    /// A model parameter has the name of an input the step adds.
    #[error(
        "the model's parameter `{name}` (declared at {location}) has the name of {added}, an \
         input the step adds: rename the parameter"
    )]
    ReservedName {
        /// The name.
        name: String,
        /// Where the parameter was declared.
        location: Location,
        /// The step's input of that name.
        added: String,
    },
    /// An evaluator asked for a model and loss other than the step's.
    #[error(
        "output {loss} of a model with {outputs} outputs and {params} parameters is not the \
         loss of this step's model"
    )]
    NotTheStepsModel {
        /// The loss output given.
        loss: usize,
        /// The model's outputs.
        outputs: usize,
        /// The model's parameters.
        params: usize,
    },
}

/// What went wrong with a checkpoint ([`Error::Checkpoint`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointProblem {
    /// Reading or writing a file failed (the operating system's error).
    #[error("{reason}")]
    Io {
        /// The error, as the OS gave it.
        reason: String,
    },
    /// A directory to save a sharded checkpoint in that holds something a save did not
    /// write.
    #[error("not a checkpoint directory: it holds `{entry}`")]
    NotCheckpointDir {
        /// The foreign entry's name.
        entry: String,
    },
    /// A sharded checkpoint has no index: no save of it has committed.
    #[error("no index (no save of this checkpoint has committed)")]
    NoIndex,
    /// A file that is not what it should be: not safetensors or not an index, truncated
    /// or damaged, its recorded order of tensors inconsistent.
    #[error("{reason}")]
    Format {
        /// What is wrong with it.
        reason: String,
    },
    /// An index of another format or version than this reader reads.
    #[error(
        "format `{format}` version {version}; this reader reads `{reads}` version {reads_version}"
    )]
    Version {
        /// The index's format.
        format: String,
        /// Its version.
        version: u32,
        /// The format this reader reads.
        reads: &'static str,
        /// The version it reads.
        reads_version: u32,
    },
    /// A tensor name given (or listed) twice.
    #[error("the name is given twice")]
    RepeatedName,
    /// The name `__metadata__`, which the safetensors format reserves for its header.
    #[error(
        "the name is reserved by the safetensors format for the header's metadata; rename the \
         tensor (or save to a checkpoint directory, which stores it by block)"
    )]
    ReservedName,
    /// A tensor the trainer needs is not in the checkpoint.
    #[error("missing from the checkpoint")]
    Missing,
    /// A saved tensor of another shape, or a dtype that does not convert.
    #[error("saved as {saved}, the step takes {expected}")]
    Type {
        /// The saved tensor's type.
        saved: TensorType,
        /// The step's.
        expected: TensorType,
    },
    /// The state of another optimizer than the trainer's.
    #[error("the state of an `{saved}` optimizer cannot load into a trainer of `{given}`")]
    Optimizer {
        /// The optimizer the checkpoint was saved with.
        saved: String,
        /// The trainer's.
        given: String,
    },
    /// A shard file of another save than its index.
    #[error("the file belongs to save {}, the index to save {index}", .file.as_deref().unwrap_or("(none)"))]
    OtherSave {
        /// The file's save id, if it has one.
        file: Option<String>,
        /// The index's.
        index: String,
    },
    /// The blocks an index records (or a process holds) do not fit the tensor.
    #[error("{reason}")]
    Blocks {
        /// What does not fit.
        reason: String,
    },
    /// A load failed after some of the trainer's tensors were replaced.
    #[error("{problem} (the trainer's {} were loaded already, the rest not)", .loaded.join(", "))]
    PartlyLoaded {
        /// The tensors replaced already.
        loaded: Vec<String>,
        /// What went wrong.
        problem: Box<CheckpointProblem>,
    },
    /// The backend returned without running the work of every process (a backend's bug).
    #[error("{place}: the backend returned without running it")]
    NotRun {
        /// The step of the save or load.
        place: String,
    },
}

/// What went wrong with a thread mesh itself ([`Error::ThreadMesh`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadMeshProblem {
    /// A device's thread could not be started.
    #[error("cannot start the thread of device {device}: {reason}")]
    Spawn {
        /// The device.
        device: usize,
        /// The operating system's error.
        reason: String,
    },
    /// The mesh holds no resident value under the key.
    #[error("no resident value `{key}` on the mesh")]
    NoResident {
        /// The key.
        key: String,
    },
    /// A device ended the run without sending a result.
    #[error("a device ended the run without a result")]
    NoResult,
    /// A device is still running an earlier run, which failed.
    #[error("device {device} is still running an earlier, failed run")]
    StaleRun {
        /// The device.
        device: usize,
    },
    /// A broken invariant of the mesh's own bookkeeping (a bug).
    #[error("internal: {reason}")]
    Internal {
        /// What broke.
        reason: String,
    },
}

/// Where devices were when they did not agree on a collective: each place (a
/// collective as called, or the end of a program) and the devices at it, in order of
/// first appearance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Census {
    /// Each place and the devices at it (increasing ids).
    pub places: Vec<(String, Vec<usize>)>,
}

impl Census {
    /// The census of `(device, place)` pairs: devices at equal places grouped.
    pub fn of<P: PartialEq + std::fmt::Display>(
        devices: impl IntoIterator<Item = (usize, P)>,
    ) -> Census {
        let mut grouped: Vec<(P, Vec<usize>)> = Vec::new();
        for (device, place) in devices {
            match grouped.iter_mut().find(|(p, _)| *p == place) {
                Some((_, at)) => at.push(device),
                None => grouped.push((place, vec![device])),
            }
        }
        let places = grouped
            .into_iter()
            .map(|(place, devices)| (place.to_string(), devices))
            .collect();
        Census { places }
    }
}

impl std::fmt::Display for Census {
    /// `devices [0, 1, 2] are at all_reduce(sum) over [x]; device 3 is at the end of
    /// its program`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (place, devices)) in self.places.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            match devices.as_slice() {
                [device] => write!(f, "device {device} is at {place}")?,
                _ => write!(f, "devices {devices:?} are at {place}")?,
            }
        }
        Ok(())
    }
}

/// Why a collective could not run ([`Error::Collective`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveProblem {
    /// The devices of a group (or the MPI ranks) are not all at this collective.
    #[error("devices disagree on the collective: {census}")]
    Disagree {
        /// Where each device was.
        census: Census,
    },
    /// Every device waits at a collective that others are not at.
    #[error("every device waits at a collective that others are not at: {census}")]
    Deadlock {
        /// Where each device waits.
        census: Census,
    },
    /// The group's members have operands of different shapes or dtypes.
    #[error(
        "operands differ across the group: device {device} has {ty}, device {other} has {other_ty}"
    )]
    OperandsDiffer {
        /// A device.
        device: usize,
        /// Its operand's type.
        ty: TensorType,
        /// A device whose operand differs.
        other: usize,
        /// That operand's type.
        other_ty: TensorType,
    },
    /// The group over the collective's axes cannot be formed.
    #[error("{problem}")]
    Group {
        /// Why not.
        problem: GroupProblem,
    },
    /// A dim out of range or not divisible by the group size, or permute pairs that
    /// leave the group or are not one-to-one.
    #[error("{reason}")]
    Arguments {
        /// Which argument, and why.
        reason: String,
    },
    /// A device at a meeting of a group it is not in.
    #[error("device {device} is not in this group")]
    NotInGroup {
        /// The device.
        device: usize,
    },
    /// A device called a collective while already in one (concurrent calls).
    #[error("this device is already in a collective (called concurrently?)")]
    Concurrent,
    /// The group spans processes, but the run stays inside this one.
    #[error("the group spans processes, but this run stays inside the process")]
    Unlinked,
    /// Moving the data failed (MPI counts and sizes, blocks that do not fit).
    #[error("{reason}")]
    Transfer {
        /// What failed.
        reason: String,
    },
}

/// What went wrong with an MPI mesh ([`Error::MpiMesh`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MpiProblem {
    /// MPI was finalised (every `MpiMesh` of the process dropped) and cannot start again.
    #[error(
        "MPI was finalised when the last MpiMesh of this process was dropped: keep one alive \
         while others are made"
    )]
    Finalised,
    /// MPI was initialised outside gspmd.
    #[error("MPI is initialised already in this process, outside gspmd")]
    InitialisedOutside,
    /// The job's rank count does not divide the mesh's device count.
    #[error(
        "{ranks} MPI ranks for mesh {mesh} of {devices} devices: launch with mpirun -np {devices} \
         (a device per rank), or -np a divisor of {devices} (as many devices per rank, as threads)"
    )]
    RankCount {
        /// Ranks of the job.
        ranks: usize,
        /// The mesh, as displayed.
        mesh: String,
        /// Its devices.
        devices: usize,
    },
    /// Several devices per rank, but this MPI does not allow threads.
    #[error(
        "this MPI does not allow threads (MPI_THREAD_FUNNELED): launch with mpirun -np {devices} \
         for one device per rank"
    )]
    NoThreads {
        /// The mesh's devices.
        devices: usize,
    },
    /// A rank's devices would not be a block of the mesh (the devices sharing their
    /// coordinates on its major digits), or a mesh axis or reduction is cut unevenly
    /// between ranks.
    #[error("{reason} (launch with mpirun -np {devices} for one device per rank)")]
    NotABlock {
        /// What does not fit, naming the mesh.
        reason: String,
        /// The mesh's devices.
        devices: usize,
    },
    /// A rank dropped its mesh: it takes part in no more runs.
    #[error("rank {rank} has left the mesh (dropped its MpiMesh); device {device} is at {place}")]
    Left {
        /// The rank that left.
        rank: usize,
        /// This rank's (first) device.
        device: usize,
        /// Where this device was.
        place: String,
    },
    /// More elements than an MPI count (a C int) holds.
    #[error("{elements} elements exceed an MPI count")]
    Count {
        /// The elements.
        elements: usize,
    },
    /// A broken invariant of the rank's own bookkeeping (a bug).
    #[error("internal: {reason}")]
    Internal {
        /// What broke.
        reason: String,
    },
}
