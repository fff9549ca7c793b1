//! The tracer: a [`Builder`] records ops applied to [`Tensor`] handles into a
//! [`Program`]. High-level ops (matmul, einsum, softmax, ...) decompose into primitives
//! here.
//!
//! Ops on handles never fail on the spot: a bad op records a typed error (with the
//! user's source line, captured by `#[track_caller]`) and returns a *poisoned* handle;
//! ops on poisoned handles are skipped silently, so one mistake gives one error.
//! Composite ops check for poisoned operands before their own checks (axes, ranks,
//! broadcasting), since a poisoned handle's type is not a real value's type.
//! [`Builder::finish`] returns all recorded errors. This keeps model code free of `?`
//! on every line, as in JAX.

use std::cell::RefCell;
use std::rc::Rc;

use super::literal::Literal;
use super::op::{BinaryOp, CompareOp, DotDims, Op, PropagationDirection, ReduceKind, UnaryOp};
use super::program::Program;
use crate::error::{Error, Result};
use crate::sharding::Sharding;
use crate::types::Location;
use crate::types::{DType, Shape, TensorType, ValueId};

#[derive(Debug)]
struct State {
    program: Program,
    errors: Vec<Error>,
    /// A region's builder: the builder of the enclosing program, whose values (and its
    /// ancestors') may be used here and become *captures* (see `capture`).
    parent: Option<Shared>,
    /// Captured values: the value in the parent's program and the region parameter
    /// standing for it, in parameter order.
    captures: Vec<(ValueId, ValueId)>,
    /// A region's builder after its region was made: ops on its handles are errors.
    closed: bool,
    /// A `shard_map` body's builder: the mesh of its manual axes (see `ir::manual`).
    manual: Option<crate::sharding::Mesh>,
}

impl State {
    fn new(program: Program, parent: Option<Shared>) -> Self {
        State {
            program,
            errors: Vec::new(),
            parent,
            captures: Vec::new(),
            closed: false,
            manual: None,
        }
    }
}

type Shared = Rc<RefCell<State>>;

/// Records a program from ops applied to [`Tensor`] handles.
#[derive(Debug, Clone)]
pub struct Builder {
    state: Shared,
}

/// A traced value: a handle into a [`Builder`]'s program. Cloning is cheap.
#[derive(Debug, Clone)]
#[must_use = "a traced op only makes a new value: dropping it drops the op's result"]
pub struct Tensor {
    state: Shared,
    /// `None` when an earlier op failed (the error is recorded in the builder).
    id: Option<ValueId>,
    ty: TensorType,
}

impl Builder {
    /// A builder for a program called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Builder {
            state: Rc::new(RefCell::new(State::new(Program::new(name), None))),
        }
    }

    /// Adds the next parameter. Records [`Error::DuplicateName`] if a parameter of
    /// this name exists (inputs and checkpoints are keyed by name), and an
    /// [`Error::Shape`] for a type too large to hold (see [`TensorType`]).
    #[track_caller]
    pub fn parameter(&self, name: &str, shape: impl Into<Shape>, dtype: DType) -> Tensor {
        self.parameter_at(name, TensorType::new(shape, dtype), Location::caller())
    }

    /// [`Builder::parameter`] of type `ty` traced at `location`.
    pub(super) fn parameter_at(&self, name: &str, ty: TensorType, location: Location) -> Tensor {
        let (index, first) = {
            let st = self.state.borrow();
            let p = &st.program;
            let first = p
                .params
                .iter()
                .map(|&v| p.node(v))
                .find(|n| n.name.as_deref() == Some(name));
            (p.params.len(), first.map(|n| n.location))
        };
        if let Some(first) = first {
            self.record_error(Error::DuplicateName {
                name: name.to_string(),
                first,
                second: location,
            });
            return poisoned_in(&self.state, ty);
        }
        let t = push_in(&self.state, Op::Parameter { index, ty }, &[], location);
        if let Some(id) = t.id {
            let mut st = self.state.borrow_mut();
            st.program.params.push(id);
            st.program.node_mut(id).name = Some(name.to_string());
        }
        t
    }

    /// A constant.
    #[track_caller]
    pub fn constant(&self, value: Literal) -> Tensor {
        push_in(&self.state, Op::Constant(value), &[], Location::caller())
    }

    /// An f32 scalar constant.
    #[track_caller]
    pub fn scalar(&self, value: f32) -> Tensor {
        self.constant(Literal::scalar_f32(value))
    }

    /// A `shape` tensor of `dtype` filled with `value`: a scalar constant broadcast.
    #[track_caller]
    pub fn full(&self, shape: impl Into<Shape>, dtype: DType, value: f64) -> Tensor {
        let scalar = self.constant(Literal::full(&[], dtype, value));
        scalar.broadcast_in_dim(shape, &[])
    }

    /// `shape` tensor counting up along `dim`.
    #[track_caller]
    pub fn iota(&self, shape: impl Into<Shape>, dim: usize, dtype: DType) -> Tensor {
        let op = Op::Iota {
            shape: shape.into(),
            dim,
            dtype,
        };
        push_in(&self.state, op, &[], Location::caller())
    }

    /// Joins `tensors` along `dim`.
    #[track_caller]
    pub fn concatenate(&self, tensors: &[&Tensor], dim: usize) -> Tensor {
        push_in(
            &self.state,
            Op::Concatenate(dim),
            tensors,
            Location::caller(),
        )
    }

    /// Records an error found outside an op (e.g. by the DSL's argument binding).
    pub fn record_error(&self, error: Error) {
        self.state.borrow_mut().errors.push(error);
    }

    /// Errors recorded so far, without finishing.
    pub fn check(&self) -> Result<()> {
        Error::from_list(self.state.borrow().errors.clone())
    }

    /// Ends tracing with `outputs` as the program's results. Returns every recorded
    /// error if any op failed.
    #[track_caller]
    pub fn finish(self, outputs: &[&Tensor]) -> Result<Program> {
        let location = Location::caller();
        if self.state.borrow().parent.is_some() {
            // A region's builder is finished by the loop or branch that made it.
            return Err(Error::Shape {
                op: "trace",
                location,
                message: "finish was called on the builder of a loop body or branch".into(),
            });
        }
        for t in outputs {
            same_builder(&self.state, t, location);
        }
        let mut st = self.state.borrow_mut();
        if !st.errors.is_empty() {
            return Error::from_list(std::mem::take(&mut st.errors)).map(|()| Program::default());
        }
        // No errors recorded, so no output is poisoned.
        st.program.outputs = outputs.iter().filter_map(|t| t.id).collect();
        Ok(std::mem::take(&mut st.program))
    }
}

/// Appends `op` applied to `operands`, typing it with [`infer_type`]. Records an error
/// and returns a poisoned handle if the types do not fit.
pub(super) fn push(t: &Tensor, op: Op, others: &[&Tensor], location: Location) -> Tensor {
    let mut operands = Vec::with_capacity(others.len() + 1);
    operands.push(t);
    operands.extend_from_slice(others);
    push_in(&t.state, op, &operands, location)
}

/// A poisoned handle of type `ty` in the builder `state`.
fn poisoned_in(state: &Shared, ty: TensorType) -> Tensor {
    Tensor {
        state: state.clone(),
        id: None,
        ty,
    }
}

/// True if any of `tensors` is poisoned: composite ops return early then, recording
/// nothing (the failed op's error is already recorded).
pub(super) fn any_poisoned(tensors: &[&Tensor]) -> bool {
    tensors.iter().any(|t| t.id.is_none())
}

fn push_in(state: &Shared, op: Op, operands: &[&Tensor], location: Location) -> Tensor {
    let state = &innermost(state, operands);
    let poisoned = |ty| poisoned_in(state, ty);
    if any_poisoned(operands) {
        // The failed op's error is recorded already (also for a value of a closed
        // region, whose first use recorded it).
        return poisoned(TensorType::new(vec![], DType::F32));
    }
    if state.borrow().closed {
        record(state, closed_error(location));
        return poisoned(TensorType::new(vec![], DType::F32));
    }
    let mut ids = Vec::with_capacity(operands.len());
    for t in operands {
        match t.id.and_then(|_| resolve(state, t, location)) {
            Some(id) => ids.push(id),
            None => return poisoned(TensorType::new(vec![], DType::F32)),
        }
    }
    let mut st = state.borrow_mut();
    match st.program.push_op(op, &ids, location) {
        Ok(id) => Tensor {
            state: state.clone(),
            id: Some(id),
            ty: st.program.ty(id).clone(),
        },
        Err(error) => {
            st.errors.push(error);
            drop(st);
            poisoned(TensorType::new(vec![], DType::F32))
        }
    }
}

/// Records `error` in the builder `state`, or, if that region's builder is closed, in
/// its nearest open ancestor (so it reaches `finish`).
fn record(state: &Shared, error: Error) {
    let mut at = state.clone();
    loop {
        let parent = {
            let st = at.borrow();
            if !st.closed {
                break;
            }
            st.parent.clone()
        };
        match parent {
            Some(p) => at = p,
            None => break,
        }
    }
    at.borrow_mut().errors.push(error);
}

fn closed_error(location: Location) -> Error {
    Error::Shape {
        op: "trace",
        location,
        message: "a tensor traced inside a region (a loop body or branch) was used outside it"
            .into(),
    }
}

/// The id in the builder `state` of the (not poisoned) value `t`: its own id if `t` is
/// of this builder; if `t` is of an enclosing builder, the region parameter capturing
/// it (made on first use, through every region level in between). A tensor of any
/// other builder is an error recorded at `location`.
fn resolve(state: &Shared, t: &Tensor, location: Location) -> Option<ValueId> {
    if Rc::ptr_eq(state, &t.state) {
        return t.id;
    }
    let parent = state.borrow().parent.clone();
    match parent {
        Some(parent) if encloses(&t.state, &parent) => {
            let outer = resolve(&parent, t, location)?;
            Some(capture(state, outer, &t.ty, location))
        }
        _ => {
            let inner = t.state.borrow().parent.is_some() && t.state.borrow().closed;
            record(
                state,
                if inner {
                    closed_error(location)
                } else {
                    Error::Shape {
                        op: "trace",
                        location,
                        message: "a tensor from another builder was used".into(),
                    }
                },
            );
            None
        }
    }
}

/// The builder an op of `state`'s on `operands` goes to: the innermost of `state` and
/// the operands' builders, when each encloses the next (an op inside a loop body on a
/// value of the body and one of the enclosing program is the body's); `state` when
/// some are unrelated (resolving the operands then reports it).
fn innermost(state: &Shared, operands: &[&Tensor]) -> Shared {
    let mut inner = state.clone();
    for t in operands {
        if encloses(&inner, &t.state) {
            inner = t.state.clone();
        } else if !encloses(&t.state, &inner) {
            return state.clone();
        }
    }
    inner
}

/// True if `outer` is `state` or one of its ancestors.
fn encloses(outer: &Shared, state: &Shared) -> bool {
    let mut at = Some(state.clone());
    while let Some(s) = at {
        if Rc::ptr_eq(&s, outer) {
            return true;
        }
        at = s.borrow().parent.clone();
    }
    false
}

/// The region parameter of the builder `state` standing for the parent's value
/// `outer` of type `ty`, appended (named `capture.N`) on first use.
fn capture(state: &Shared, outer: ValueId, ty: &TensorType, location: Location) -> ValueId {
    let mut st = state.borrow_mut();
    if let Some(&(_, inner)) = st.captures.iter().find(|(o, _)| *o == outer) {
        return inner;
    }
    let k = st.captures.len();
    let inner = capture_parameter(&mut st.program, k, ty, location);
    st.captures.push((outer, inner));
    inner
}

/// Appends parameter `capture.k` of type `ty` to the region `program`: the region's
/// parameter for its `k`-th captured value.
pub(super) fn capture_parameter(
    program: &mut Program,
    k: usize,
    ty: &TensorType,
    location: Location,
) -> ValueId {
    let index = program.params.len();
    let id = program.push(crate::ir::Node {
        op: Op::Parameter {
            index,
            ty: ty.clone(),
        },
        operands: Vec::new(),
        ty: ty.clone(),
        annotation: None,
        sharding: None,
        origin: None,
        name: Some(format!("capture.{k}")),
        location,
        why: Vec::new(),
    });
    program.params.push(id);
    id
}

/// A builder for a region of the program of `parent`: its parameters are made by the
/// caller, then `seed`'s parent values are captured first, in order (a sibling
/// region's captures, so that sibling regions take their captures in one order).
pub(super) fn region_builder(parent: &Builder, name: &str) -> Builder {
    let state = State::new(Program::new(name), Some(parent.state.clone()));
    Builder {
        state: Rc::new(RefCell::new(state)),
    }
}

/// Marks the region builder `region` as a `shard_map` body over the manual axes of
/// `manual` (see `ir::manual`).
pub(super) fn mark_manual(region: &Builder, manual: crate::sharding::Mesh) {
    region.state.borrow_mut().manual = Some(manual);
}

/// The manual axes an op traced in `b` may name in a collective: `Ok` with the mesh of
/// the manual axes of the `shard_map` body `b` traces; `Err(true)` if a body encloses
/// `b` only through other regions (control flow inside the body), `Err(false)` if no
/// body encloses it.
pub(super) fn manual_scope(b: &Builder) -> std::result::Result<crate::sharding::Mesh, bool> {
    if let Some(mesh) = &b.state.borrow().manual {
        return Ok(mesh.clone());
    }
    let mut at = b.state.borrow().parent.clone();
    while let Some(s) = at {
        if s.borrow().manual.is_some() {
            return Err(true);
        }
        at = s.borrow().parent.clone();
    }
    Err(false)
}

/// Captures `outer` (a value of the parent's program of type `ty`) in the region
/// builder `region`, at `location`.
pub(super) fn seed_capture(region: &Builder, outer: ValueId, ty: &TensorType, location: Location) {
    capture(&region.state, outer, ty, location);
}

/// Closes the region builder `region` with `outputs` as its results: moves its errors
/// to the parent and returns its program and the parent values it captured (in
/// parameter order), or `None` if an op failed or an output is poisoned. Later ops on
/// its handles are errors.
///
/// With `quiet` (an operand of the flow op is already poisoned, so the region was
/// traced only to count its results) its errors are dropped: one mistake, one error.
pub(super) fn close_region(
    region: &Builder,
    outputs: &[Tensor],
    location: Location,
    quiet: bool,
) -> Option<(Program, Vec<(ValueId, TensorType)>)> {
    let ids: Vec<Option<ValueId>> = (outputs.iter())
        .map(|t| t.id.and_then(|_| resolve(&region.state, t, location)))
        .collect();
    let mut st = region.state.borrow_mut();
    st.closed = true;
    let errors = std::mem::take(&mut st.errors);
    let parent = st.parent.clone();
    if let Some(parent) = parent.as_ref().filter(|_| !quiet) {
        for e in errors.iter().cloned() {
            record(parent, e);
        }
    }
    let ids: Option<Vec<ValueId>> = ids.into_iter().collect();
    match ids {
        Some(ids) if errors.is_empty() => {
            let mut program = st.program.clone();
            program.outputs = ids;
            let captures = (st.captures.iter())
                .map(|&(outer, inner)| (outer, program.ty(inner).clone()))
                .collect();
            Some((program, captures))
        }
        _ => None,
    }
}

impl Builder {
    /// The builder where an op of this builder on `operands` is traced: the innermost
    /// of this one and theirs (see `innermost`).
    pub(super) fn innermost(&self, operands: &[&Tensor]) -> Builder {
        Builder {
            state: innermost(&self.state, operands),
        }
    }

    /// A handle to value `id` of this builder's program (a result just appended).
    pub(super) fn handle(&self, id: ValueId) -> Tensor {
        let ty = self.state.borrow().program.ty(id).clone();
        Tensor {
            state: self.state.clone(),
            id: Some(id),
            ty,
        }
    }

    /// Appends `op` on the values `operands` of this builder's program (a flow op on
    /// its operands and captures); errors as [`Tensor`] ops.
    pub(super) fn push_ids(
        &self,
        op: Op,
        operands: &[ValueId],
        location: Location,
    ) -> Option<ValueId> {
        let mut st = self.state.borrow_mut();
        match st.program.push_op(op, operands, location) {
            Ok(id) => Some(id),
            Err(e) => {
                st.errors.push(e);
                None
            }
        }
    }

    /// The id of `t` in this builder's program (capturing it if it belongs to an
    /// enclosing builder); `None`, with an error recorded, for a poisoned handle or one
    /// of an unrelated builder.
    pub(super) fn resolve(&self, t: &Tensor, location: Location) -> Option<ValueId> {
        t.id.and_then(|_| resolve(&self.state, t, location))
    }

    /// A poisoned handle of type `ty` in this builder.
    pub(super) fn poisoned(&self, ty: TensorType) -> Tensor {
        poisoned_in(&self.state, ty)
    }
}

/// True if `t` belongs to the builder `state`; records an error at `location`
/// otherwise: a value traced inside one of this builder's loop bodies or branches is
/// [`closed_error`] (or nothing, if it is a poisoned handle: its error is recorded
/// already); a value of an unrelated builder is "another builder".
fn same_builder(state: &Shared, t: &Tensor, location: Location) -> bool {
    if Rc::ptr_eq(state, &t.state) {
        return true;
    }
    let err = if !encloses(state, &t.state) {
        Error::Shape {
            op: "trace",
            location,
            message: "a tensor from another builder was used".into(),
        }
    } else if t.id.is_none() {
        return false;
    } else {
        closed_error(location)
    };
    state.borrow_mut().errors.push(err);
    false
}

/// Normalises a possibly negative axis; records an error when out of range. `None`
/// without an error for a poisoned `t`.
/// `t[start..limit]` along dim `a`, all of the other dims.
fn slice_along(t: &Tensor, a: usize, start: usize, limit: usize, location: Location) -> Tensor {
    let mut lo = vec![0; t.rank()];
    let mut hi = t.shape().to_vec();
    lo[a] = start;
    hi[a] = limit;
    let op = Op::Slice {
        start: lo,
        limit: hi,
        stride: vec![1; t.rank()],
    };
    push_at(t, op, location)
}

pub(super) fn axis(t: &Tensor, axis: isize, op: &'static str, location: Location) -> Option<usize> {
    if any_poisoned(&[t]) {
        return None;
    }
    let rank = t.rank() as isize;
    let a = if axis < 0 { axis + rank } else { axis };
    if (0..rank).contains(&a) {
        Some(a as usize)
    } else {
        t.error(
            op,
            location,
            format!("axis {axis} out of range for {}", t.ty),
        );
        None
    }
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(&self) -> Tensor {
            push_in(&self.state, Op::Unary(UnaryOp::$op), &[self], Location::caller())
        }
    )*};
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        /// Operands broadcast against each other as in NumPy.
        #[track_caller]
        pub fn $name(&self, other: &Tensor) -> Tensor {
            self.binary(BinaryOp::$op, other, Location::caller())
        }
    )*};
}

macro_rules! compare_methods {
    ($($name:ident => $op:ident;)*) => {$(
        #[doc = concat!("Elementwise `", stringify!($name), "` comparison (NumPy broadcasting); bool result.")]
        #[track_caller]
        pub fn $name(&self, other: &Tensor) -> Tensor {
            let location = Location::caller();
            let (a, b) = self.broadcast_pair(other, location);
            push_in(&self.state, Op::Compare(CompareOp::$op), &[&a, &b], location)
        }
    )*};
}

impl Tensor {
    /// The value id, or `None` if an earlier op failed.
    pub fn id(&self) -> Option<ValueId> {
        self.id
    }

    /// Type of the value (an empty f32 shape if poisoned).
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// Dims.
    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.ty.rank()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The builder this handle belongs to.
    pub fn builder(&self) -> Builder {
        Builder {
            state: self.state.clone(),
        }
    }

    fn error(&self, op: &'static str, location: Location, message: String) {
        self.state.borrow_mut().errors.push(Error::Shape {
            op,
            location,
            message,
        });
    }

    /// Records an error of `op` at `location` and returns a poisoned handle.
    pub(super) fn fail(&self, op: &'static str, location: Location, message: String) -> Tensor {
        self.error(op, location, message);
        self.poisoned()
    }

    /// A poisoned handle of this handle's type.
    pub(super) fn poisoned(&self) -> Tensor {
        poisoned_in(&self.state, self.ty.clone())
    }

    // ---- annotations -----------------------------------------------------------------

    /// Sets this value's own sharding annotation (for a parameter, its input sharding).
    /// Errors if the sharding's rank differs from the value's.
    #[track_caller]
    pub fn annotate(&self, sharding: Sharding) -> Tensor {
        let location = Location::caller();
        let Some(id) = self.id else {
            return self.clone();
        };
        if sharding.dims.len() != self.rank() {
            let err = Error::ShardingRank {
                sharding: sharding.to_string(),
                spec_rank: sharding.dims.len(),
                rank: self.rank(),
                context: format!("{location}: {id}: "),
            };
            self.state.borrow_mut().errors.push(err);
            return self.poisoned();
        }
        self.state.borrow_mut().program.node_mut(id).annotation = Some(sharding);
        self.clone()
    }

    /// The same value behind a `propagation_barrier` (Shardy's): sharding propagation
    /// crosses it only in the `allowed` direction (`Forward`: from `self` to the result;
    /// `Backward`: from the result's users back to `self`; `None`: not at all), so a
    /// layout chosen on one side does not leak to the other. Where the two sides end up
    /// sharded differently the partitioner reshards at the barrier. `Both` is an error
    /// (the barrier would block nothing).
    #[track_caller]
    pub fn propagation_barrier(&self, allowed: PropagationDirection) -> Tensor {
        push_at(self, Op::PropagationBarrier(allowed), Location::caller())
    }

    /// A `sharding_constraint`: the same value, pinned to `sharding` at this point.
    #[track_caller]
    pub fn shard(&self, sharding: Sharding) -> Tensor {
        let location = Location::caller();
        let t = push_in(&self.state, Op::ShardingConstraint, &[self], location);
        t.annotate_at(sharding, location)
    }

    // `#[track_caller]` so that `annotate`'s rank error names the user's line too.
    #[track_caller]
    fn annotate_at(&self, sharding: Sharding, location: Location) -> Tensor {
        let Some(id) = self.id else {
            return self.clone();
        };
        self.state.borrow_mut().program.node_mut(id).location = location;
        self.annotate(sharding)
    }

    /// Names this value in printed programs and reports.
    pub fn named(&self, name: &str) -> Tensor {
        if let Some(id) = self.id {
            self.state.borrow_mut().program.node_mut(id).name = Some(name.to_string());
        }
        self.clone()
    }

    // ---- elementwise -----------------------------------------------------------------

    unary_methods! {
        /// `-x`.
        neg => Neg;
        /// `|x|`.
        abs => Abs;
        /// `e^x`.
        exp => Exp;
        /// Natural logarithm.
        log => Log;
        /// Square root.
        sqrt => Sqrt;
        /// `1/sqrt(x)`.
        rsqrt => Rsqrt;
        /// Hyperbolic tangent.
        tanh => Tanh;
        /// Sigmoid `1/(1+e^-x)`.
        logistic => Logistic;
        /// Logical not.
        not => Not;
        /// Sine.
        sin => Sin;
        /// Cosine.
        cos => Cos;
        /// The error function (exact GELU: [`Tensor::gelu_exact`]).
        erf => Erf;
        /// Largest integer not above `x` (f32).
        floor => Floor;
        /// Smallest integer not below `x` (f32).
        ceil => Ceil;
        /// Nearest integer, ties to even, as `jnp.round` and `torch.round`: `0.5 -> 0`,
        /// `1.5 -> 2`, `-2.5 -> -2` (f32).
        round => Round;
        /// `-1`, `0` or `1` by the sign of `x` (f32, i32); NaN stays NaN.
        sign => Sign;
        /// True where `x` is neither infinite nor NaN: an f32 operand, a bool result.
        is_finite => IsFinite;
    }

    binary_methods! {
        /// `a + b`.
        add => Add;
        /// `a - b`.
        sub => Sub;
        /// `a * b`.
        mul => Mul;
        /// `a / b`; i32 division truncates toward zero, and `a / 0 = -1` (XLA's).
        div => Div;
        /// Elementwise maximum.
        max => Max;
        /// Elementwise minimum.
        min => Min;
        /// `a ^ b`.
        pow => Pow;
        /// Logical and.
        and => And;
        /// Logical or.
        or => Or;
        /// Truncated remainder `a - b trunc(a/b)`, the sign of `a` (C's `fmod`, XLA's
        /// `remainder`; i32: `a % 0 = a`). Python's floor modulo is
        /// [`Tensor::remainder`].
        rem => Rem;
    }

    compare_methods! {
        eq => Eq;
        ne => Ne;
        lt => Lt;
        le => Le;
        gt => Gt;
        ge => Ge;
    }

    fn binary(&self, op: BinaryOp, other: &Tensor, location: Location) -> Tensor {
        let (a, b) = self.broadcast_pair(other, location);
        push_in(&self.state, Op::Binary(op), &[&a, &b], location)
    }

    /// Broadcasts `self` and `other` to their common NumPy shape; scalars of another
    /// dtype are converted to the tensor's dtype.
    fn broadcast_pair(&self, other: &Tensor, location: Location) -> (Tensor, Tensor) {
        let (a, b) = (self, other);
        if any_poisoned(&[a, b]) {
            return (a.poisoned(), b.poisoned());
        }
        let (ra, rb) = (a.rank(), b.rank());
        let r = ra.max(rb);
        let mut shape = vec![0; r];
        for (i, out) in shape.iter_mut().enumerate() {
            let da = if i + ra >= r {
                a.shape()[i + ra - r]
            } else {
                1
            };
            let db = if i + rb >= r {
                b.shape()[i + rb - r]
            } else {
                1
            };
            *out = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => {
                    a.error(
                        "broadcast",
                        location,
                        format!("shapes {} and {} do not broadcast", a.ty, b.ty),
                    );
                    return (a.poisoned(), b.poisoned());
                }
            };
        }
        let expand = |t: &Tensor| -> Tensor {
            if t.shape() == shape.as_slice() {
                t.clone()
            } else {
                let offset = r - t.rank();
                let dims: Vec<usize> = (offset..r).collect();
                push_at(
                    t,
                    Op::Broadcast {
                        shape: shape.clone(),
                        dims,
                    },
                    location,
                )
            }
        };
        (expand(a), expand(b))
    }

    /// `select(self, on_true, on_false)` with `self` a bool predicate (NumPy broadcast
    /// of the branches to the predicate's shape).
    #[track_caller]
    pub fn select(&self, on_true: &Tensor, on_false: &Tensor) -> Tensor {
        let location = Location::caller();
        let (t, f) = on_true.broadcast_pair(on_false, location);
        let (p, t) = self.broadcast_pair(&t, location);
        let (p, f) = p.broadcast_pair(&f, location);
        push_in(&self.state, Op::Select, &[&p, &t, &f], location)
    }

    /// Converts elements to `dtype`.
    #[track_caller]
    pub fn convert(&self, dtype: DType) -> Tensor {
        push_at(self, Op::Convert(dtype), Location::caller())
    }

    /// A scalar constant of this tensor's dtype, in the same builder.
    #[track_caller]
    pub fn scalar_like(&self, value: f64) -> Tensor {
        let location = Location::caller();
        let op = Op::Constant(Literal::full(&[], self.dtype(), value));
        push_in(&self.state, op, &[], location)
    }

    // ---- shape ops -------------------------------------------------------------------

    /// XLA `broadcast_in_dim`: operand dim `i` becomes result dim `dims[i]`.
    #[track_caller]
    pub fn broadcast_in_dim(&self, shape: impl Into<Shape>, dims: &[usize]) -> Tensor {
        let op = Op::Broadcast {
            shape: shape.into(),
            dims: dims.to_vec(),
        };
        push_at(self, op, Location::caller())
    }

    /// NumPy-style broadcast to `shape` (trailing dims aligned).
    #[track_caller]
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Tensor {
        let shape = shape.into();
        let offset = shape.len().saturating_sub(self.rank());
        let dims: Vec<usize> = (offset..offset + self.rank()).collect();
        let op = Op::Broadcast { shape, dims };
        push_at(self, op, Location::caller())
    }

    /// Row-major reshape.
    #[track_caller]
    pub fn reshape(&self, shape: impl Into<Shape>) -> Tensor {
        push_at(self, Op::Reshape(shape.into()), Location::caller())
    }

    /// Result dim `i` is operand dim `perm[i]`.
    #[track_caller]
    pub fn transpose(&self, perm: &[usize]) -> Tensor {
        push_at(self, Op::Transpose(perm.to_vec()), Location::caller())
    }

    /// Strided slice.
    #[track_caller]
    pub fn slice(&self, start: &[usize], limit: &[usize], stride: &[usize]) -> Tensor {
        let op = Op::Slice {
            start: start.to_vec(),
            limit: limit.to_vec(),
            stride: stride.to_vec(),
        };
        push_at(self, op, Location::caller())
    }

    /// `self[start..limit]` along `axis` (other dims whole).
    #[track_caller]
    pub fn slice_axis(&self, axis_: isize, start: usize, limit: usize) -> Tensor {
        let location = Location::caller();
        let Some(a) = axis(self, axis_, "slice", location) else {
            return self.poisoned();
        };
        slice_along(self, a, start, limit, location)
    }

    /// `jnp.roll(self, shift, axis)`: element `i` along `axis` (negative counts from the
    /// end) moves to `(i + shift) mod n`. A composite, `concatenate(self[k:], self[:k])`
    /// with `k = -shift mod n`, which the partitioner recognises as a rotation (on an
    /// evenly split dim: at most two collective shifts, one when `|shift|` is at most a
    /// shard).
    #[track_caller]
    pub fn roll(&self, shift: i64, axis_: isize) -> Tensor {
        let location = Location::caller();
        let Some(a) = axis(self, axis_, "roll", location) else {
            return self.poisoned();
        };
        let n = self.shape()[a];
        let k = match n {
            0 => 0,
            _ => (n - shift.rem_euclid(n as i64) as usize) % n,
        };
        if k == 0 {
            return self.clone();
        }
        let head = slice_along(self, a, k, n, location);
        let tail = slice_along(self, a, 0, k, location);
        push_in(&self.state, Op::Concatenate(a), &[&head, &tail], location)
    }

    /// Pads with `value` (a scalar tensor of the same dtype).
    #[track_caller]
    pub fn pad(&self, value: &Tensor, low: &[i64], high: &[i64], interior: &[usize]) -> Tensor {
        let op = Op::Pad {
            low: low.to_vec(),
            high: high.to_vec(),
            interior: interior.to_vec(),
        };
        push_in(&self.state, op, &[self, value], Location::caller())
    }

    /// Reverses the element order along `dims` (sorted, distinct).
    #[track_caller]
    pub fn reverse(&self, dims: &[usize]) -> Tensor {
        push_at(self, Op::Reverse(dims.to_vec()), Location::caller())
    }

    // ---- reductions --------------------------------------------------------------------

    /// Reduces `dims` with `kind`; `keep_dims` keeps them as size-1 dims.
    #[track_caller]
    pub fn reduce(&self, kind: ReduceKind, dims: &[isize], keep_dims: bool) -> Tensor {
        push_reduce(self, kind, dims, keep_dims, Location::caller())
    }

    /// Sum over `dims` (negative counts from the end).
    #[track_caller]
    pub fn sum(&self, dims: &[isize]) -> Tensor {
        self.reduce(ReduceKind::Sum, dims, false)
    }

    /// Maximum over `dims`.
    #[track_caller]
    pub fn max_over(&self, dims: &[isize]) -> Tensor {
        self.reduce(ReduceKind::Max, dims, false)
    }

    /// Minimum over `dims`.
    #[track_caller]
    pub fn min_over(&self, dims: &[isize]) -> Tensor {
        self.reduce(ReduceKind::Min, dims, false)
    }

    /// Mean over `dims`.
    #[track_caller]
    pub fn mean(&self, dims: &[isize]) -> Tensor {
        self.mean_impl(dims, false, Location::caller())
    }

    fn mean_impl(&self, dims: &[isize], keep_dims: bool, location: Location) -> Tensor {
        let Some(dims) = reduce_dims(self, dims, "mean", location) else {
            return self.poisoned();
        };
        let s = reduce_sorted(self, ReduceKind::Sum, &dims, keep_dims, location);
        if any_poisoned(&[&s]) {
            return s;
        }
        // The reduce accepted `dims` as distinct, so this is a product of some of the
        // operand's dims: no overflow (the size invariant of `TensorType`).
        let count: usize = dims.iter().map(|&d| self.shape()[d]).product();
        let n = push_in(
            &self.state,
            Op::Constant(Literal::full(&[], self.dtype(), count as f64)),
            &[],
            location,
        );
        s.binary(BinaryOp::Div, &n, location)
    }

    // ---- contractions ------------------------------------------------------------------

    /// XLA `dot_general`.
    #[track_caller]
    pub fn dot_general(&self, rhs: &Tensor, dims: DotDims) -> Tensor {
        push_in(
            &self.state,
            Op::DotGeneral(dims),
            &[self, rhs],
            Location::caller(),
        )
    }

    /// Matrix product: contracts the last dim of `self` with the first dim of a rank-2
    /// `rhs` (`[..., K] x [K, N] -> [..., N]`), or, for equal ranks above 2, a batched
    /// product over the leading dims (`[b.., M, K] x [b.., K, N] -> [b.., M, N]`).
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Tensor {
        let location = Location::caller();
        if any_poisoned(&[self, rhs]) {
            return self.poisoned();
        }
        let (ra, rb) = (self.rank(), rhs.rank());
        let dims = if ra >= 1 && rb == 2 {
            DotDims {
                lhs_contracting: vec![ra - 1],
                rhs_contracting: vec![0],
                ..DotDims::default()
            }
        } else if ra == rb && ra > 2 {
            let batch: Vec<usize> = (0..ra - 2).collect();
            DotDims {
                lhs_batch: batch.clone(),
                rhs_batch: batch,
                lhs_contracting: vec![ra - 1],
                rhs_contracting: vec![rb - 2],
            }
        } else {
            self.error(
                "matmul",
                location,
                format!("unsupported ranks: {} x {}", self.ty, rhs.ty),
            );
            return self.poisoned();
        };
        let (k_lhs, k_rhs) = (
            self.shape()[dims.lhs_contracting[0]],
            rhs.shape()[dims.rhs_contracting[0]],
        );
        if k_lhs != k_rhs {
            self.error(
                "matmul",
                location,
                format!(
                    "{} x {}, inner dims {k_lhs} and {k_rhs} differ",
                    self.ty, rhs.ty
                ),
            );
            return self.poisoned();
        }
        push_in(&self.state, Op::DotGeneral(dims), &[self, rhs], location)
    }

    // ---- neural-network helpers ----------------------------------------------------------

    /// `max(x, 0)`.
    #[track_caller]
    pub fn relu(&self) -> Tensor {
        let location = Location::caller();
        let zero = push_in(
            &self.state,
            Op::Constant(Literal::full(&[], self.dtype(), 0.0)),
            &[],
            location,
        );
        self.binary(BinaryOp::Max, &zero, location)
    }

    /// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    #[track_caller]
    pub fn gelu(&self) -> Tensor {
        let location = Location::caller();
        let c = |v: f64| {
            push_in(
                &self.state,
                Op::Constant(Literal::full(&[], self.dtype(), v)),
                &[],
                location,
            )
        };
        let x3 = self
            .binary(BinaryOp::Mul, self, location)
            .binary(BinaryOp::Mul, self, location);
        let inner = self
            .binary(
                BinaryOp::Add,
                &x3.binary(BinaryOp::Mul, &c(0.044715), location),
                location,
            )
            .binary(
                BinaryOp::Mul,
                &c((2.0 / std::f64::consts::PI).sqrt()),
                location,
            );
        let t = push_at(&inner, Op::Unary(UnaryOp::Tanh), location);
        let one_plus = t.binary(BinaryOp::Add, &c(1.0), location);
        self.binary(BinaryOp::Mul, &c(0.5), location)
            .binary(BinaryOp::Mul, &one_plus, location)
    }

    /// Softmax along `axis`, stabilised by subtracting the maximum.
    #[track_caller]
    pub fn softmax(&self, axis_: isize) -> Tensor {
        let location = Location::caller();
        let m = push_reduce(self, ReduceKind::Max, &[axis_], true, location);
        let e = push_at(
            &self.binary(BinaryOp::Sub, &m, location),
            Op::Unary(UnaryOp::Exp),
            location,
        );
        let s = push_reduce(&e, ReduceKind::Sum, &[axis_], true, location);
        e.binary(BinaryOp::Div, &s, location)
    }

    /// `log(softmax(x))` along `axis`, computed stably.
    #[track_caller]
    pub fn log_softmax(&self, axis_: isize) -> Tensor {
        let location = Location::caller();
        let m = push_reduce(self, ReduceKind::Max, &[axis_], true, location);
        let shifted = self.binary(BinaryOp::Sub, &m, location);
        let e = push_at(&shifted, Op::Unary(UnaryOp::Exp), location);
        let s = push_reduce(&e, ReduceKind::Sum, &[axis_], true, location);
        let log_s = push_at(&s, Op::Unary(UnaryOp::Log), location);
        shifted.binary(BinaryOp::Sub, &log_s, location)
    }

    /// Normalises along `axis` to zero mean and unit variance: `(x - mean) / sqrt(var + eps)`
    /// (no learned scale or bias: multiply and add them yourself).
    #[track_caller]
    pub fn layer_norm(&self, axis_: isize, eps: f32) -> Tensor {
        let location = Location::caller();
        let mean = self.mean_impl(&[axis_], true, location);
        let centered = self.binary(BinaryOp::Sub, &mean, location);
        let sq = centered.binary(BinaryOp::Mul, &centered, location);
        let var = sq.mean_impl(&[axis_], true, location);
        let eps = push_in(
            &self.state,
            Op::Constant(Literal::full(&[], self.dtype(), f64::from(eps))),
            &[],
            location,
        );
        let inv = push_at(
            &var.binary(BinaryOp::Add, &eps, location),
            Op::Unary(UnaryOp::Rsqrt),
            location,
        );
        centered.binary(BinaryOp::Mul, &inv, location)
    }

    /// Mean squared error `mean((self - target)^2)` over all elements: a scalar.
    /// `target` must have this tensor's shape.
    #[track_caller]
    pub fn mse(&self, target: &Tensor) -> Tensor {
        let location = Location::caller();
        if any_poisoned(&[self, target]) {
            return self.poisoned();
        }
        if self.shape() != target.shape() {
            let message = format!("prediction {} and target {} differ", self.ty, target.ty);
            return self.fail("mse", location, message);
        }
        let diff = self.binary(BinaryOp::Sub, target, location);
        let sq = diff.binary(BinaryOp::Mul, &diff, location);
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        sq.mean_impl(&all, false, location)
    }

    /// Mean cross-entropy of logits `[.., V]` (f32) against class labels `[..]` (i32):
    /// `-log_softmax(self)[.., label]` averaged over all leading positions, a scalar.
    /// The label's entry is picked by a one-hot mask (`iota == label`, converted to f32),
    /// so no gather is needed; a label outside `0..V` picks nothing (contributes 0).
    #[track_caller]
    pub fn cross_entropy_with_logits(&self, labels: &Tensor) -> Tensor {
        let location = Location::caller();
        if any_poisoned(&[self, labels]) {
            return self.poisoned();
        }
        let r = self.rank();
        if r == 0 || labels.dtype() != DType::I32 || labels.shape() != &self.shape()[..r - 1] {
            let message = format!(
                "logits {} need i32 labels shaped like the logits without their last dim, got {}",
                self.ty, labels.ty
            );
            return self.fail("cross_entropy_with_logits", location, message);
        }
        let classes = push_in(
            &self.state,
            Op::Iota {
                shape: self.shape().to_vec(),
                dim: r - 1,
                dtype: DType::I32,
            },
            &[],
            location,
        );
        let leading: Vec<usize> = (0..r - 1).collect();
        let labels = push_at(
            labels,
            Op::Broadcast {
                shape: self.shape().to_vec(),
                dims: leading,
            },
            location,
        );
        let hit = push_in(
            &self.state,
            Op::Compare(CompareOp::Eq),
            &[&classes, &labels],
            location,
        );
        let one_hot = push_at(&hit, Op::Convert(self.dtype()), location);
        let picked = self
            .log_softmax(-1)
            .binary(BinaryOp::Mul, &one_hot, location);
        let picked = push_reduce(&picked, ReduceKind::Sum, &[-1], false, location);
        let positions: Vec<isize> = (0..r as isize - 1).collect();
        let mean = picked.mean_impl(&positions, false, location);
        push_at(&mean, Op::Unary(UnaryOp::Neg), location)
    }
}

pub(super) fn push_at(t: &Tensor, op: Op, location: Location) -> Tensor {
    push_in(&t.state, op, &[t], location)
}

/// Reduces `dims` (negative counts from the end) of `t` with `kind`; `keep` keeps them
/// as size-1 dims.
pub(super) fn push_reduce(
    t: &Tensor,
    kind: ReduceKind,
    dims: &[isize],
    keep: bool,
    location: Location,
) -> Tensor {
    match reduce_dims(t, dims, "reduce", location) {
        Some(ds) => reduce_sorted(t, kind, &ds, keep, location),
        None => t.poisoned(),
    }
}

/// `dims` normalised and sorted; records an error of `op` for one out of range. `None`
/// without an error for a poisoned `t`.
fn reduce_dims(
    t: &Tensor,
    dims: &[isize],
    op: &'static str,
    location: Location,
) -> Option<Vec<usize>> {
    let mut ds = dims
        .iter()
        .map(|&d| axis(t, d, op, location))
        .collect::<Option<Vec<usize>>>()?;
    ds.sort_unstable();
    Some(ds)
}

/// [`push_reduce`] over normalised, sorted `dims`.
fn reduce_sorted(
    t: &Tensor,
    kind: ReduceKind,
    dims: &[usize],
    keep: bool,
    location: Location,
) -> Tensor {
    let r = push_at(
        t,
        Op::Reduce {
            kind,
            dims: dims.to_vec(),
        },
        location,
    );
    if !keep {
        return r;
    }
    let shape: Vec<usize> = (0..t.rank())
        .map(|d| if dims.contains(&d) { 1 } else { t.shape()[d] })
        .collect();
    push_at(&r, Op::Reshape(shape), location)
}
