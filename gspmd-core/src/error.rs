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
    #[error("group over [{}] of {mesh}: {message}", .axes.join(", "))]
    AxisGroup {
        /// The axes as listed.
        axes: Vec<String>,
        /// The mesh, as displayed.
        mesh: String,
        /// What is wrong.
        message: String,
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
    #[error("{context}invalid sub-axis `{axis}` in sharding {sharding}: {message}")]
    InvalidSubAxis {
        /// The sub-axis as written.
        axis: String,
        /// The sharding as written.
        sharding: String,
        /// What is wrong.
        message: String,
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
        problem: String,
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
    #[error("training step of program `{program}`: {message}")]
    TrainRequest {
        /// The model program's name.
        program: String,
        /// What does not fit: the parameter index, its name and type.
        message: String,
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
    #[error("checkpoint {path}: {}{message}", tensor_prefix(.tensor))]
    Checkpoint {
        /// The file or directory: a safetensors file, a sharded checkpoint's index or
        /// one of its shard files.
        path: String,
        /// The tensor concerned, if the problem is one tensor's.
        tensor: Option<String>,
        /// What went wrong (I/O, format, an unsupported dtype, a repeated name, a
        /// tensor that does not fit the step, a file of another save).
        message: String,
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
        /// (a convolution's patch matrix, say), as the memory analysis estimates it.
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
    #[error("device {device}: {collective}: {message}")]
    Collective {
        /// The device that found the problem.
        device: usize,
        /// The collective as called, e.g. `all_reduce(sum) over [data]`.
        collective: String,
        /// What is wrong.
        message: String,
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
    #[error("device {device} panicked: {message}")]
    DevicePanicked {
        /// The panicking device.
        device: usize,
        /// The panic message.
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
    /// The thread mesh could not start its threads or lost one.
    #[error("thread mesh: {0}")]
    ThreadMesh(String),
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
    #[error("MPI mesh: {0}")]
    MpiMesh(String),
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
