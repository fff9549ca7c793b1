//! Fusion: a chain of float elementwise ops, with the broadcasts it reads and an optional
//! trailing reduction over the minor dims, run as one loop over contiguous memory
//! instead of an array per op (softmax's `exp(x - max)` and sum, layer norm, GELU,
//! the AdamW update of a weight and its two moments, the ReLU gradient's compares and
//! selects).
//!
//! Comparisons (of floats or of i32), `and`, `or`, `not`, `is_finite`, selects and
//! converts fuse through lanes ([`Lane`]): every register holds f32 lanes, a bool as a
//! mask ([`bool_lane`]), an i32 as its bits. A comparison writes masks, a select blends
//! with them, `and`/`or`/`not` are bitwise on them, a convert to the group's float
//! masks them with 1.0's bits (bool), rounds the bits' i32 to f32, or keeps (and rounds
//! to a narrow group's dtype) a float; a bool or i32 value read from outside the group
//! (a select's predicate, a one-hot's labels) is loaded as such lanes. An op giving
//! bools is only an inner member (its value is never stored).
//!
//! A group computes in one float dtype ([`Group::dtype`]): f32, or bf16 or f16 in f32
//! lanes (narrow leaves widened exactly as they are read, each op's lanes rounded to
//! the narrow type, the results converted), as `kernels::narrow` computes each op.
//!
//! A [`Group`] is a plan-level decision: the program (the IR the partitioner sees) is
//! unchanged; the execution plan marks the group's nodes and the evaluation loop runs
//! the group's loop where its root (its last node) would run. The loop walks the
//! root's operand shape in chunks of [`CHUNK`] elements: each leaf (a value read from
//! outside the group, directly or through a broadcast, as a strided view) is read in
//! place where it is contiguous, held in its register for the whole run where it is a
//! scalar or a contiguous block repeated along the outer dims (a bias row over the
//! rows, [`Source::Repeat`]), else loaded into its scratch register chunk by chunk;
//! each op writes a register from earlier ones (the ops share registers, assigned once
//! at plan time by [`allocate`], so a chunk's working set stays small), and each
//! result's op writes straight into that result's buffer (or, when that buffer is a
//! leaf's that a later op of the chunk still reads, into its register, stored after
//! the chunk; see [`Group::direct`]); with a reduction, the last op's values are folded
//! into the row's reduction. Two arithmetic ops of which the
//! first's value only the second reads run as one pass ([`Instr::Pair`], formed at
//! plan time by [`pair`]): the value between them stays in a machine register, one
//! register of the loop fewer is written and read back (AdamW's 14 ops are 9 passes).
//!
//! A group has one result or several ([`Group::results`]): the members whose values
//! are read outside the group or are outputs, the root last. A result may be written
//! into a leaf's buffer handed over: by its op directly when no later op reads the
//! leaf, else stored from its register once every register of the chunk is computed
//! (the same elements of the chunk were read already); each result has its own buffer. The evaluation loop binds every result's value at the root.
//!
//! Results are bitwise those of the unfused kernels: every op applies the kernels'
//! scalar function ([`f32_unary`], [`f32_binary`], [`compare_fn`]), and a reduction
//! folds each row as `reduce` does ([`Lanes`]), however the row is cut into chunks.
//! The loop runs under `pulp`'s run-time dispatch ([`Vectorised`]): the same scalar
//! functions, vectorised by the compiler for AVX2 and FMA or AVX-512.
//!
//! The rule (see [`plan_groups`]): from the last node back, a group grows from a float
//! elementwise op (a select or a convert included) or a reduction of trailing dims (its
//! root, or the reduction an epilogue root finishes) by every earlier elementwise op
//! of its float dtype, op giving bools and broadcast (see [`Role`]) of the loop's
//! shape, not yet in a group, such that
//! - all its readers are in the group (no broadcast among them) and it is no output
//!   (an inner member), or
//! - the member is a float elementwise op read by at least one member (no broadcast),
//!   every reader outside the group comes after the root (the value exists from the
//!   root on), and the group has fewer than [`MAX_RESULTS`] results: an extra result
//!   (outputs included). A reduction's group stores them too (softmax's `exp(x - max)`
//!   beside its sum, layer norm's `x - mean` beside the variance).
//!
//! A reduction may be finished by one op on its reduced values ([`Epilogue`]: `mean`'s
//! division by the count, the log of a sum of exponentials), read through a reshape:
//! that op is then the group's root (see [`epilogue_of`]), and the group grows back
//! from the reduction as above (a reduction of a leaf alone, with no op in its loop,
//! included).
//!
//! A group is kept if it has at least two ops besides broadcasts. Its leaves come
//! before the members that read them, so before the root, where they are read; a leaf
//! that is a result of an earlier group is bound at that group's root, which comes
//! before this one's.

use std::borrow::Cow;
use std::cell::RefCell;

use ndarray::ArrayD;
use smallvec::SmallVec;

use super::buffers;
use super::kernels::{
    Dims, Lanes, Operand, Operands, WithBinary, WithCompare, WithUnary, body_len, compare_fn,
    f32_arith, f32_binary, f32_unary, map_strides, max_nan, min_nan, row_major,
};
use crate::ir::{
    BinaryOp, CompareOp, DType, Literal, Node, Op, Program, ReduceKind, UnaryOp, ValueId,
    with_literal,
};

/// The elements a fused loop computes at a time: each register holds one chunk.
/// A multiple of the reduction's lane count, so that chunks cut a row's body whole.
pub(crate) const CHUNK: usize = 512;

/// The most results a group stores (its root included): each is one more register
/// read back per chunk and one more buffer.
pub(crate) const MAX_RESULTS: usize = 4;

thread_local! {
    /// The registers of the fused loops run on this thread (a device's, or the
    /// interpreter's), kept between runs: a loop allocates no scratch.
    static REGISTERS: RefCell<Vec<[f32; CHUNK]>> = const { RefCell::new(Vec::new()) };
}

/// One fusion group, planned once per program: its nodes and its loop.
#[derive(Debug)]
pub(crate) struct Group {
    /// The group's nodes in node order; the last is the root, where the loop runs.
    pub(crate) members: Vec<ValueId>,
    /// The members whose values the loop stores (read outside the group, or outputs),
    /// in node order: the root last, and before it the extra results (of the loop's
    /// shape; with a reduction, stored as the chunks are folded).
    pub(crate) results: Vec<ValueId>,
    /// The values the loop reads from outside the group, in register order.
    pub(crate) leaves: Vec<Leaf>,
    /// The shape the loop walks (the elementwise ops' shape).
    shape: Vec<usize>,
    /// The ops in order, each with the register it writes (see [`allocate`]).
    code: Vec<(Instr, usize)>,
    /// The register of each of `results` (with a reduction: the root's operand's).
    stores: Vec<usize>,
    /// The op (index into `code`) writing each of `stores`.
    writers: Vec<usize>,
    /// The last op reading each leaf's register (`None`: none reads it).
    last_reads: Vec<Option<usize>>,
    /// The registers the loop uses: one per leaf, then those the ops share.
    registers: usize,
    /// Each leaf's planned shape (its value's type) and how the loop walks a value of
    /// that shape ([`Layout`]), worked out once at plan time; `None` if the shapes do
    /// not map (the run then reports it). A leaf given at run time as a value of that
    /// shape is read through it; any other (a deferred broadcast) is worked out per run.
    layouts: Vec<Option<(Dims, Layout)>>,
    /// A trailing reduction: its kind and the number of dims it keeps (the minor
    /// dims after them are folded).
    reduce: Option<(ReduceKind, usize)>,
    /// An op applied to each value the reduction gives, whose result is the root's
    /// (see [`Epilogue`]).
    epilogue: Option<Epilogue>,
    /// The members' float dtype. A narrow one (bf16, f16) is computed in f32 lanes,
    /// each op's lanes rounded to it as the unfused kernels round each op's result
    /// (see `kernels::narrow`); the results are converted to it.
    dtype: DType,
}

/// The rows a trailing reduction folds: `outer` rows of `row` elements.
#[derive(Clone, Copy)]
struct Rows {
    outer: usize,
    row: usize,
}

/// The one op after a group's trailing reduction, on each reduced value: `mean`'s
/// division of the sum by the count, the log of a sum of exponentials. The root is the
/// op, reading the reduction through at most one reshape (the same elements in the same
/// order) and, for a binary op, a scalar broadcast as its other operand; the reduction
/// and the reshape are members read by nothing else (see [`epilogue_of`]). Applied to
/// the folded values with the op's kernel function, so bitwise the unfused op's. f32
/// groups only (a narrow group would round the reduction before the op).
#[derive(Debug, Clone)]
struct Epilogue {
    op: Finish,
    /// The root's shape: the reduced values' in another arrangement of unit dims.
    shape: Vec<usize>,
}

/// What an [`Epilogue`] computes from a reduced value `v`.
#[derive(Debug, Clone, Copy)]
enum Finish {
    /// `op(v)`.
    Unary(UnaryOp),
    /// `op(v, s)` (`left`) or `op(s, v)`, `s` the scalar of the splat leaf `splat`.
    Binary {
        op: BinaryOp,
        splat: usize,
        left: bool,
    },
}

impl Finish {
    /// Applies the op to each of `values` in place, `sources` the run's leaves.
    fn apply(self, values: &mut [f32], sources: &[Source<'_>]) -> Result<(), String> {
        let done = match self {
            Finish::Unary(op) => f32_unary(op, InPlace(values, 0.0, true)),
            Finish::Binary { op, splat, left } => match sources.get(splat) {
                Some(&Source::Splat(q)) => f32_binary(op, InPlace(values, q, left)),
                _ => return Err("a reduction's epilogue without its scalar".to_string()),
            },
        };
        done.ok_or_else(|| "a reduction's epilogue of an op without an f32 function".to_string())
    }
}

/// A reduction's finishing op applied in place (see [`Finish::apply`]): to each value
/// `v`, `f(v)`, or `f(v, q)` (`left`) or `f(q, v)`.
struct InPlace<'a>(&'a mut [f32], f32, bool);

impl WithUnary for InPlace<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32) -> f32 + Copy) {
        self.0.iter_mut().for_each(|v| *v = f(*v));
    }
}

impl WithBinary for InPlace<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) {
        let InPlace(values, q, left) = self;
        if left {
            values.iter_mut().for_each(|v| *v = f(*v, q));
        } else {
            values.iter_mut().for_each(|v| *v = f(q, *v));
        }
    }
}

/// A value the fused loop reads.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Leaf {
    /// The value.
    pub(crate) value: ValueId,
    /// `None`: the value has the loop's shape; else the value broadcast to it, operand
    /// dim `i` becoming loop dim `dims[i]` (a broadcast in the group).
    dims: Option<Vec<usize>>,
    /// The value's dtype, which sets its lanes ([`Lane`]): a float (a narrow one
    /// widened), bool (a select's predicate, read as [bool lanes](bool_lane)) or i32
    /// (a comparison's operand or a convert's, read as its bits).
    dtype: DType,
}

/// One op of a fused loop, on register indices.
#[derive(Debug, Clone)]
enum Instr {
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    /// A comparison of two registers of float or i32 lanes into bool lanes.
    Compare(CompareOp, Lane, usize, usize),
    /// `select(pred, on_true, on_false)`, the predicate bool lanes.
    Select(usize, usize, usize),
    /// A register of the given lanes converted to the loop's float: bools to 1 and 0,
    /// i32 rounded to f32, floats as they are (then rounded to a narrow loop's dtype).
    Convert(Lane, usize),
    /// `and` or `or` of two registers of bool lanes: bitwise on the masks.
    Logic(BinaryOp, usize, usize),
    /// A test of one register into bool lanes.
    Test(Test, usize),
    /// Two arithmetic ops (`add`, `sub`, `mul`, `div`) in one pass: `t = a first b`,
    /// then `t second c` (`t_left`) or `c second t`; `t` is read by nothing else, so
    /// it never goes through a register (see [`pair`]).
    Pair {
        first: BinaryOp,
        a: usize,
        b: usize,
        second: BinaryOp,
        c: usize,
        t_left: bool,
    },
}

/// A one-operand op giving bool lanes.
#[derive(Debug, Clone, Copy)]
enum Test {
    /// `not` of bool lanes.
    Not,
    /// `is_finite` of float lanes.
    IsFinite,
    /// A float converted to bool: `v != 0` (NaN is true).
    NonZero,
}

impl Test {
    /// The test's bool lane of `v`.
    #[inline(always)]
    fn apply(self, v: f32) -> f32 {
        match self {
            Test::Not => f32::from_bits(!v.to_bits()),
            Test::IsFinite => bool_lane(v.is_finite()),
            Test::NonZero => bool_lane(v != 0.0),
        }
    }
}

impl Instr {
    /// The registers the op reads.
    fn reads(&self) -> SmallVec<[usize; 3]> {
        match *self {
            Instr::Unary(_, a) | Instr::Convert(_, a) | Instr::Test(_, a) => {
                smallvec::smallvec![a]
            }
            Instr::Binary(_, a, b) | Instr::Compare(_, _, a, b) | Instr::Logic(_, a, b) => {
                smallvec::smallvec![a, b]
            }
            Instr::Select(p, t, f) => smallvec::smallvec![p, t, f],
            Instr::Pair { a, b, c, .. } => smallvec::smallvec![a, b, c],
        }
    }

    /// The op reading `rename(r)` for each register `r` it reads.
    fn renamed(self, rename: impl Fn(usize) -> usize) -> Instr {
        match self {
            Instr::Unary(op, a) => Instr::Unary(op, rename(a)),
            Instr::Binary(op, a, b) => Instr::Binary(op, rename(a), rename(b)),
            Instr::Compare(op, lane, a, b) => Instr::Compare(op, lane, rename(a), rename(b)),
            Instr::Select(p, t, f) => Instr::Select(rename(p), rename(t), rename(f)),
            Instr::Convert(lane, a) => Instr::Convert(lane, rename(a)),
            Instr::Logic(op, a, b) => Instr::Logic(op, rename(a), rename(b)),
            Instr::Test(test, a) => Instr::Test(test, rename(a)),
            Instr::Pair {
                first,
                a,
                b,
                second,
                c,
                t_left,
            } => Instr::Pair {
                first,
                a: rename(a),
                b: rename(b),
                second,
                c: rename(c),
                t_left,
            },
        }
    }
}

/// Whether `op` may be one of a [`Instr::Pair`]'s ops.
fn arithmetic(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
    )
}

/// `code` (op `k` writing register `base + k`, reading lower ones: the leaves' below
/// `base`) with pairs of arithmetic ops merged into [`Instr::Pair`]s: an op whose value
/// is read once, by a later arithmetic op, not stored (`stores`) and not the last op
/// (a reduction folds it), is computed inside its reader, which then merges no other
/// and is merged into none. The bits do not change: the pair applies the two ops'
/// scalar functions in the same order to the same values, in f32 (only f32 loops
/// pair: a narrow loop rounds each op's lanes). Returns the code and `stores` in the
/// same numbering (op `k` of the result writing `base + k`).
fn pair(base: usize, code: Vec<Instr>, stores: Vec<usize>) -> (Vec<Instr>, Vec<usize>) {
    let n = code.len();
    let mut reads = vec![0usize; n];
    for instr in &code {
        for r in instr.reads() {
            if let Some(op) = r.checked_sub(base) {
                reads[op] += 1;
            }
        }
    }
    let kept = |op: usize| op + 1 == n || stores.contains(&(base + op));
    // The op each op merged (`merged[j] = Some(k)`: `k` computed inside `j`).
    let mut merged: Vec<Option<usize>> = vec![None; n];
    let mut inside = vec![false; n];
    for j in 0..n {
        let Instr::Binary(second, x, y) = code[j] else {
            continue;
        };
        if !arithmetic(second) {
            continue;
        }
        let mergeable = |r: usize| {
            r.checked_sub(base).filter(|&k| {
                matches!(code[k], Instr::Binary(first, ..) if arithmetic(first))
                    && reads[k] == 1
                    && !kept(k)
                    && merged[k].is_none()
            })
        };
        if let Some(k) = mergeable(x).or_else(|| mergeable(y)) {
            merged[j] = Some(k);
            inside[k] = true;
        }
    }
    // Each surviving op's new index.
    let mut index = vec![usize::MAX; n];
    let mut next = 0;
    for k in 0..n {
        if !inside[k] {
            index[k] = next;
            next += 1;
        }
    }
    let rename = |r: usize| r.checked_sub(base).map_or(r, |op| base + index[op]);
    let mut out = Vec::with_capacity(next);
    for j in 0..n {
        if inside[j] {
            continue;
        }
        out.push(match (merged[j], &code[j]) {
            (Some(k), &Instr::Binary(second, x, y)) => {
                let Instr::Binary(first, a, b) = code[k] else {
                    unreachable!("only binary ops are merged")
                };
                let t_left = x == base + k;
                Instr::Pair {
                    first,
                    a: rename(a),
                    b: rename(b),
                    second,
                    c: rename(if t_left { y } else { x }),
                    t_left,
                }
            }
            (_, instr) => instr.clone().renamed(rename),
        });
    }
    let stores = stores.into_iter().map(rename).collect();
    (out, stores)
}

/// A bool held in an f32 register as a mask: every bit set for true (a NaN), none
/// for false. A comparison writes these (the vector compare instructions' own result),
/// a select blends with them bit by bit ([`select_lane`]).
#[inline(always)]
fn bool_lane(b: bool) -> f32 {
    f32::from_bits(0u32.wrapping_sub(u32::from(b)))
}

/// The bits of 1.0: a true [`bool_lane`] masked with them is 1.0, a false one 0.0.
const ONE: u32 = 0x3f80_0000;

/// An i32 held in an f32 lane: its bits.
#[inline(always)]
fn int_lane(v: f32) -> i32 {
    v.to_bits().cast_signed()
}

/// `if p { t } else { f }` for a [`bool_lane`] `p`, as a bitwise blend: the compiler
/// vectorises it where a branch on each lane would become a gather of the picked
/// elements.
#[inline(always)]
fn select_lane(p: f32, t: f32, f: f32) -> f32 {
    let m = p.to_bits();
    f32::from_bits((t.to_bits() & m) | (f.to_bits() & !m))
}

/// What a node may be in a group.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Role {
    /// A float op of the group's dtype: unary, binary, select, or a convert to it (from
    /// a float, a bool, or an i32 into f32).
    Elementwise,
    /// A broadcast of any dtype the loop reads as lanes ([`Lane`]).
    Broadcast,
    /// An op giving bools (a comparison of floats or of i32, `and`, `or`, `not`,
    /// `is_finite`, a convert of a float to bool), only read inside the group.
    Predicate,
    /// A reduction of the operand's minor dims.
    TrailingReduce,
    Other,
}

/// The role of node `i` of `program` reading `operands`: none unless its types were
/// checked (`typed`), it computes floats or bools from values the loop reads as lanes
/// ([`Lane`]) and its operands come before it.
fn role(program: &Program, node: &Node, operands: &[ValueId], i: usize, typed: bool) -> Role {
    let ordered = operands.iter().all(|o| o.index() < i);
    if !typed || !ordered {
        return Role::Other;
    }
    let mut dtypes = operands.iter().map(|o| program.nodes[o.index()].ty.dtype);
    let from = dtypes.next();
    let same = dtypes.all(|d| Some(d) == from);
    let float_from = from.is_some_and(is_float);
    match (&node.op, node.ty.dtype) {
        (Op::Compare(_), _) if same && (float_from || from == Some(DType::I32)) => Role::Predicate,
        (Op::Unary(UnaryOp::Not), DType::Bool)
        | (Op::Binary(BinaryOp::And | BinaryOp::Or), DType::Bool) => Role::Predicate,
        (Op::Unary(UnaryOp::IsFinite) | Op::Convert(DType::Bool), _) if float_from => {
            Role::Predicate
        }
        // An i32 rounds once to f32, as the kernel rounds it, but twice to a narrow
        // float through f32 lanes.
        (Op::Convert(to), _) if is_float(*to) => match from {
            Some(DType::Bool) => Role::Elementwise,
            Some(DType::I32) if *to == DType::F32 => Role::Elementwise,
            Some(d) if is_float(d) => Role::Elementwise,
            _ => Role::Other,
        },
        (Op::Broadcast { .. }, _) => Role::Broadcast,
        (_, dtype) if !is_float(dtype) => Role::Other,
        (Op::Unary(u), _) if !matches!(u, UnaryOp::Not | UnaryOp::IsFinite) => Role::Elementwise,
        (Op::Binary(b), _) if !matches!(b, BinaryOp::And | BinaryOp::Or) => Role::Elementwise,
        (Op::Select, _) => Role::Elementwise,
        (Op::Reduce { dims, .. }, _) => {
            let kept = node.ty.shape.len();
            let trailing = dims.iter().enumerate().all(|(k, &d)| d == kept + k);
            if trailing && !dims.is_empty() {
                Role::TrailingReduce
            } else {
                Role::Other
            }
        }
        _ => Role::Other,
    }
}

/// Whether the loop computes values of `dtype`: f32, or a narrow float in f32 lanes.
fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
}

/// What a register's lanes hold: floats (f32, or a narrow float widened exactly), bools
/// ([`bool_lane`] masks), or i32 (their bits).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lane {
    Float,
    Bool,
    Int,
}

impl Lane {
    /// The lanes a value of `dtype` is held in.
    fn of(dtype: DType) -> Lane {
        match dtype {
            DType::Bool => Lane::Bool,
            DType::I32 => Lane::Int,
            _ => Lane::Float,
        }
    }
}

/// The fusion groups of `program` (see the module documentation for the rule), no
/// node in two, with node `i` reading `operands[i]` (its operands, or as the plan
/// resolves them) and `outputs` the program's outputs (likewise). `typed[i]`: node
/// `i`'s types were checked (only checked nodes fuse).
pub(crate) fn plan_groups(
    program: &Program,
    operands: &[Vec<ValueId>],
    outputs: &[ValueId],
    typed: &[bool],
) -> Vec<Group> {
    let nodes = &program.nodes;
    let n = nodes.len();
    let roles: Vec<Role> = (nodes.iter().zip(operands).zip(typed).enumerate())
        .map(|(i, ((x, o), &t))| role(program, x, o, i, t))
        .collect();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, values) in operands.iter().enumerate() {
        for o in values {
            if let Some(r) = readers.get_mut(o.index()) {
                r.push(i);
            }
        }
    }
    let mut output = vec![false; n];
    for o in outputs {
        if let Some(slot) = output.get_mut(o.index()) {
            *slot = true;
        }
    }
    let lowest_operand = |i: usize| operands[i].iter().map(|o| o.index()).min();
    let mut claimed = vec![false; n];
    let mut in_group = vec![false; n];
    let mut groups = Vec::new();
    for root in (0..n).rev() {
        if claimed[root] {
            continue;
        }
        let finishing = epilogue_of(program, operands, &readers, &output, &roles, typed, root);
        // The node the loop ends with: the reduction the root finishes, else the root.
        let end = finishing.as_ref().map_or(root, |&(reduce, _)| reduce);
        let shape = match roles[end] {
            Role::Elementwise => &nodes[end].ty.shape,
            Role::TrailingReduce => match operands[end].first() {
                Some(o) => &nodes[o.index()].ty.shape,
                None => continue,
            },
            _ => continue,
        };
        let dtype = nodes[root].ty.dtype;
        let mut members = vec![root];
        let mut results = vec![root];
        in_group[root] = true;
        if let Some((reduce, between)) = &finishing {
            for &m in between.iter().chain([reduce]) {
                in_group[m] = true;
                members.push(m);
            }
        }
        let mut low = lowest_operand(end).unwrap_or(end);
        let mut j = end;
        while j > low {
            j -= 1;
            // Ops of another float dtype stay outside (read as leaves); bools and
            // broadcasts of any dtype are read in their own lanes.
            let candidate = !claimed[j]
                && !in_group[j]
                && match roles[j] {
                    Role::Elementwise => nodes[j].ty.dtype == dtype,
                    Role::Broadcast | Role::Predicate => true,
                    Role::TrailingReduce | Role::Other => false,
                }
                && nodes[j].ty.shape == *shape;
            if !candidate {
                continue;
            }
            let member_reader = |r: usize| in_group[r] && roles[r] != Role::Broadcast;
            let inner = !output[j]
                && !readers[j].is_empty()
                && readers[j].iter().all(|&r| member_reader(r));
            let result = !inner
                && roles[j] == Role::Elementwise
                && results.len() < MAX_RESULTS
                && readers[j].iter().any(|&r| member_reader(r))
                && readers[j]
                    .iter()
                    .all(|&r| member_reader(r) || (!in_group[r] && r > root));
            if inner || result {
                in_group[j] = true;
                members.push(j);
                if result {
                    results.push(j);
                }
                if matches!(roles[j], Role::Elementwise | Role::Predicate) {
                    low = low.min(lowest_operand(j).unwrap_or(j));
                }
            }
        }
        for &m in &members {
            in_group[m] = false;
        }
        members.sort_unstable();
        results.sort_unstable();
        let ops = members
            .iter()
            .filter(|&&m| matches!(roles[m], Role::Elementwise | Role::Predicate))
            .count();
        let reduces = usize::from(roles[end] == Role::TrailingReduce);
        if ops == 0 || ops + reduces < 2 {
            continue;
        }
        for &m in &members {
            claimed[m] = true;
        }
        groups.push(Group::new(
            program,
            operands,
            &members,
            &results,
            shape.clone(),
            dtype,
            finishing.is_some(),
        ));
    }
    groups
}

/// Whether `v` is a broadcast of a scalar.
fn splat(program: &Program, v: ValueId) -> bool {
    matches!(&program.nodes[v.index()].op, Op::Broadcast { dims, .. } if dims.is_empty())
}

/// If node `root` may finish a trailing reduction as an [`Epilogue`], the reduction and
/// the other members between them: the reshape it is read through, if any, and the
/// scalar broadcast of a binary op if only the root reads it. The root is an f32 unary
/// op, or a binary op of the reduced value and a broadcast scalar; the reduction (f32)
/// and the reshape are read by nothing else and are no outputs. `readers`, `output`,
/// `roles` and `typed` as [`plan_groups`] has them.
fn epilogue_of(
    program: &Program,
    operands: &[Vec<ValueId>],
    readers: &[Vec<usize>],
    output: &[bool],
    roles: &[Role],
    typed: &[bool],
    root: usize,
) -> Option<(usize, Vec<usize>)> {
    let nodes = &program.nodes;
    if roles[root] != Role::Elementwise || nodes[root].ty.dtype != DType::F32 {
        return None;
    }
    let only_read_by = |v: usize, reader: usize| {
        !output[v] && !readers[v].is_empty() && readers[v].iter().all(|&r| r == reader)
    };
    let scalar = |v: &ValueId| roles[v.index()] == Role::Broadcast && splat(program, *v);
    let (value, splat) = match (&nodes[root].op, operands[root].as_slice()) {
        (Op::Unary(_), [v]) => (v.index(), None),
        (Op::Binary(_), [a, b]) => match (scalar(a), scalar(b)) {
            (false, true) => (a.index(), Some(b.index())),
            (true, false) => (b.index(), Some(a.index())),
            _ => return None,
        },
        _ => return None,
    };
    let mut between = Vec::new();
    let reduce = match nodes[value].op {
        Op::Reshape(_) if typed[value] && only_read_by(value, root) => {
            between.push(value);
            operands[value].first()?.index()
        }
        _ => value,
    };
    let reader = between.first().copied().unwrap_or(root);
    let finishes = roles[reduce] == Role::TrailingReduce
        && nodes[reduce].ty.dtype == DType::F32
        && only_read_by(reduce, reader);
    if !finishes {
        return None;
    }
    between.extend(splat.filter(|&b| only_read_by(b, root)));
    Some((reduce, between))
}

impl Group {
    /// The loop of the group of `members` storing `results` (both in node order; see
    /// [`plan_groups`], also for `operands`) over `shape`.
    fn new(
        program: &Program,
        operands: &[Vec<ValueId>],
        members: &[usize],
        results: &[usize],
        shape: Vec<usize>,
        dtype: DType,
        finishes: bool,
    ) -> Group {
        /// Where a member's elements are: a leaf's register or an op's.
        #[derive(Clone, Copy)]
        enum Ref {
            Leaf(usize),
            Op(usize),
        }
        /// The register of leaf `l`, added if new.
        fn leaf(leaves: &mut Vec<Leaf>, l: Leaf) -> Ref {
            match leaves.iter().position(|x| *x == l) {
                Some(k) => Ref::Leaf(k),
                None => {
                    leaves.push(l);
                    Ref::Leaf(leaves.len() - 1)
                }
            }
        }
        let mut leaves: Vec<Leaf> = Vec::new();
        // Each member's register by node index.
        let mut refs: Vec<(usize, Ref)> = Vec::new();
        // The register of value `o` read by a member: a member's, else a leaf's.
        let arg = |refs: &[(usize, Ref)], leaves: &mut Vec<Leaf>, o: &ValueId| match refs
            .iter()
            .find(|(v, _)| *v == o.index())
        {
            Some(&(_, r)) => r,
            None => leaf(
                leaves,
                Leaf {
                    value: *o,
                    dims: None,
                    dtype: program.nodes[o.index()].ty.dtype,
                },
            ),
        };
        let mut ops: Vec<(Op, Lane, Vec<Ref>)> = Vec::new();
        let mut reduce = None;
        // The register a reduction folds, and the op finishing it (see `Epilogue`).
        let (mut folded, mut finish) = (None, None);
        let root = members.last().copied();
        for &m in members {
            let node = &program.nodes[m];
            let r = match &node.op {
                Op::Broadcast { dims, .. } => leaf(
                    &mut leaves,
                    Leaf {
                        value: operands[m][0],
                        dims: Some(dims.clone()),
                        dtype: node.ty.dtype,
                    },
                ),
                Op::Reduce { kind, .. } => {
                    reduce = Some((*kind, node.ty.shape.len()));
                    folded = (operands[m].first()).map(|o| arg(&refs, &mut leaves, o));
                    continue;
                }
                // An epilogue's reshape: the reduced values as they are.
                Op::Reshape(_) if finishes => continue,
                op if finishes && Some(m) == root => {
                    finish = Some(match (op, operands[m].as_slice()) {
                        (Op::Unary(u), _) => Finish::Unary(*u),
                        (&Op::Binary(op), [a, b]) => {
                            // The scalar's operand: a splat leaf (see `epilogue_of`).
                            let left = splat(program, *b);
                            let s = if left { b } else { a };
                            let splat = match operands[s.index()].first() {
                                Some(&value) => leaf(
                                    &mut leaves,
                                    Leaf {
                                        value,
                                        dims: Some(Vec::new()),
                                        dtype: DType::F32,
                                    },
                                ),
                                None => continue,
                            };
                            let Ref::Leaf(splat) = splat else { continue };
                            Finish::Binary { op, splat, left }
                        }
                        _ => continue,
                    });
                    continue;
                }
                op => {
                    let mut args = Vec::with_capacity(operands[m].len());
                    for o in &operands[m] {
                        args.push(arg(&refs, &mut leaves, o));
                    }
                    // The lanes of the (first) operand.
                    let lane = operands[m]
                        .first()
                        .map_or(Lane::Float, |o| Lane::of(program.nodes[o.index()].ty.dtype));
                    ops.push((op.clone(), lane, args));
                    Ref::Op(ops.len() - 1)
                }
            };
            refs.push((m, r));
        }
        let base = leaves.len();
        let register = |r: &Ref| match *r {
            Ref::Leaf(k) => k,
            Ref::Op(k) => base + k,
        };
        let ref_of = |m: &usize| refs.iter().find(|(v, _)| v == m).map(|(_, r)| register(r));
        // A reduction stores the register it folds: its operand's (the last op's).
        let last = (base + ops.len()).saturating_sub(1);
        let fold = folded.as_ref().map_or(last, register);
        let stores = (results.iter())
            .map(|m| ref_of(m).unwrap_or(fold))
            .collect();
        let code: Vec<Instr> = ops
            .iter()
            .filter_map(|(op, lane, args)| match (op, args.as_slice()) {
                (Op::Unary(UnaryOp::Not), [a]) => Some(Instr::Test(Test::Not, register(a))),
                (Op::Unary(UnaryOp::IsFinite), [a]) => {
                    Some(Instr::Test(Test::IsFinite, register(a)))
                }
                (Op::Unary(u), [a]) => Some(Instr::Unary(*u, register(a))),
                (Op::Binary(b @ (BinaryOp::And | BinaryOp::Or)), [a, c]) => {
                    Some(Instr::Logic(*b, register(a), register(c)))
                }
                (Op::Binary(b), [a, c]) => Some(Instr::Binary(*b, register(a), register(c))),
                (Op::Compare(c), [a, b]) => {
                    Some(Instr::Compare(*c, *lane, register(a), register(b)))
                }
                (Op::Select, [p, t, f]) => {
                    Some(Instr::Select(register(p), register(t), register(f)))
                }
                (Op::Convert(DType::Bool), [a]) => Some(Instr::Test(Test::NonZero, register(a))),
                (Op::Convert(_), [a]) => Some(Instr::Convert(*lane, register(a))),
                _ => None,
            })
            .collect();
        let (code, stores) = if dtype == DType::F32 {
            pair(base, code, stores)
        } else {
            (code, stores)
        };
        let (code, stores, registers) = allocate(base, code, stores);
        let writers = (stores.iter())
            .map(|&r| code.iter().rposition(|&(_, dst)| dst == r).unwrap_or(0))
            .collect();
        let last_reads = (0..base)
            .map(|k| {
                code.iter()
                    .rposition(|(instr, _)| instr.reads().contains(&k))
            })
            .collect();
        let ids = |nodes: &[usize]| nodes.iter().map(|&m| ValueId(m as u32)).collect();
        let mut group = Group {
            members: ids(members),
            results: ids(results),
            leaves,
            shape,
            code,
            stores,
            writers,
            last_reads,
            registers,
            layouts: Vec::new(),
            reduce,
            epilogue: finish.map(|op| Epilogue {
                op,
                shape: root.map_or_else(Vec::new, |r| program.nodes[r].ty.shape.to_vec()),
            }),
            dtype,
        };
        let cut = group.cut();
        group.layouts = (group.leaves.iter())
            .map(|leaf| {
                let value = Dims::from_slice(&program.nodes[leaf.value.index()].ty.shape);
                let layout = Layout::new(
                    &value,
                    &row_major(&value),
                    value.iter().product(),
                    leaf.dims.as_deref(),
                    &group.shape,
                    cut,
                );
                layout.ok().map(|layout| (value, layout))
            })
            .collect();
        group
    }

    /// Whether the loop may write a result into leaf `k`'s buffer when it is handed
    /// over (an f32 array of the loop's shape in standard layout): no trailing
    /// reduction, the loop and the leaf are f32 and the leaf is not broadcast. Such leaves, in leaf order,
    /// become the buffers of the results in [`Group::results`] order, one each.
    pub(crate) fn writes_in_place(&self, k: usize) -> bool {
        self.reduce.is_none()
            && self.dtype == DType::F32
            && (self.leaves.get(k))
                .is_some_and(|leaf| leaf.dims.is_none() && leaf.dtype == DType::F32)
    }

    /// Runs the loop on the leaves' values (in [`Group::leaves`] order; a leaf without
    /// dims may be a deferred broadcast) and returns the values of
    /// [`Group::results`], in order. A leaf handed over with the loop's shape in
    /// standard layout becomes a result's buffer (see [`Group::writes_in_place`]).
    /// `Err` if a leaf is not f32 or does not fit its shape.
    pub(crate) fn run(
        &self,
        operands: Operands<'_>,
    ) -> Result<SmallVec<[Literal; MAX_RESULTS]>, String> {
        if operands.len() != self.leaves.len() {
            return Err(format!(
                "a fused loop of {} leaves given {} values",
                self.leaves.len(),
                operands.len()
            ));
        }
        let total: usize = self.shape.iter().product();
        // Each owned leaf that fits is the buffer of the next result (`slots`), moved
        // out of `operands` in place.
        let mut operands = operands;
        let mut outs: SmallVec<[Vec<f32>; MAX_RESULTS]> = SmallVec::new();
        let mut slots: SmallVec<[Option<usize>; 8]> = SmallVec::new();
        for (k, x) in operands.iter_mut().enumerate() {
            let fits = match x {
                Operand::Value(Cow::Owned(Literal::F32(a))) => {
                    outs.len() < self.results.len()
                        && self.writes_in_place(k)
                        && a.is_standard_layout()
                        && a.shape() == self.shape.as_slice()
                }
                _ => false,
            };
            match fits.then(|| x.take_owned()).flatten() {
                Some(Literal::F32(a)) => {
                    slots.push(Some(outs.len()));
                    outs.push(elements(a, total));
                }
                _ => slots.push(None),
            }
        }
        let cut = self.cut();
        // Each leaf's elements, and its layout if not the planned one (a deferred
        // broadcast, or a value of another shape): worked out for this run.
        let mut data: SmallVec<[Cow<'_, [f32]>; 8]> = SmallVec::new();
        let mut worked: SmallVec<[Option<Layout>; 8]> = SmallVec::new();
        for ((leaf, planned), (x, slot)) in
            (self.leaves.iter().zip(&self.layouts)).zip(operands.iter().zip(&slots))
        {
            let (elements, layout) = match (slot, x, planned) {
                (Some(_), ..) => (Cow::Borrowed(&[][..]), None),
                (None, Operand::Value(v), Some((value, _)))
                    if with_literal!(&**v, a => a.shape()) == value.as_slice() =>
                {
                    (lanes(v), None)
                }
                (None, ..) => {
                    let (elements, layout) = worked_out(x, leaf.dims.as_deref(), &self.shape, cut)?;
                    (elements, Some(layout))
                }
            };
            data.push(elements);
            worked.push(layout);
        }
        let sources = (data.into_iter().zip(&worked))
            .zip(self.layouts.iter().zip(&slots))
            .map(
                |((elements, worked), (planned, slot))| match (slot, worked, planned) {
                    (Some(slot), ..) => Ok(Source::Buffer(*slot)),
                    (None, Some(layout), _) | (None, None, Some((_, layout))) => {
                        Ok(Source::laid(elements, layout))
                    }
                    (None, None, None) => Err("a fused loop's leaf without a layout".to_string()),
                },
            )
            .collect::<Result<SmallVec<[_; 8]>, String>>()?;
        REGISTERS.with_borrow_mut(|regs| {
            // Grown, never shrunk: a group of fewer registers run between two of more
            // does not make the next one zero its registers again.
            if regs.len() < self.registers {
                regs.resize(self.registers, [0.0; CHUNK]);
            }
            let regs = &mut regs[..self.registers];
            // No chunk is longer than the loop.
            let longest = CHUNK.min(total);
            for (source, reg) in sources.iter().zip(regs.iter_mut()) {
                source.fill(&mut reg[..longest]);
            }
            pulp::Arch::new().dispatch(Vectorised {
                group: self,
                sources: &sources,
                outs,
                regs,
            })
        })
    }

    /// A number every chunk's first flat index is a multiple of: the chunk length; with
    /// a reduction, the row (rows no longer than a chunk are computed whole, several to
    /// a chunk) or its greatest common divisor with the chunk length (longer rows,
    /// chunk by chunk).
    fn cut(&self) -> usize {
        match self.reduce {
            None => CHUNK,
            Some((_, kept)) => {
                let row: usize = self.shape[kept..].iter().product();
                if row <= CHUNK { row } else { gcd(row, CHUNK) }
            }
        }
    }

    /// The results of a run whose writer op writes them straight into their buffers
    /// (see [`Direct`]): each of the first `slots` results (those with a buffer), unless
    /// its buffer is a leaf's handed over ([`Source::Buffer`]) that an op from the
    /// writer on still reads (the writer may not overwrite elements it or a later op
    /// reads).
    fn direct(&self, sources: &[Source<'_>], slots: usize) -> Direct {
        (0..slots)
            .filter(|&s| {
                let leaf = sources
                    .iter()
                    .position(|x| matches!(x, Source::Buffer(t) if *t == s));
                (leaf.and_then(|k| self.last_reads[k])).is_none_or(|last| last < self.writers[s])
            })
            .map(|s| (self.stores[s], s))
            .collect()
    }

    /// [`Group::run`] with the leaves' `sources`, the buffers of the first results
    /// (`outs`: leaves handed over), and registers.
    #[inline(always)]
    fn run_on(
        &self,
        sources: &[Source<'_>],
        mut outs: SmallVec<[Vec<f32>; MAX_RESULTS]>,
        regs: &mut [[f32; CHUNK]],
    ) -> Result<SmallVec<[Literal; MAX_RESULTS]>, String> {
        let total: usize = self.shape.iter().product();
        // With a reduction, the buffers of the results besides the root (its last).
        let stored = self.results.len() - usize::from(self.reduce.is_some());
        // Every element of a result's buffer is written before it is read (chunk by
        // chunk, in order): a pooled buffer is taken as it is, not zeroed first.
        while outs.len() < stored {
            outs.push(buffers::take(total));
        }
        let direct = self.direct(sources, outs.len());
        let reduced = match self.reduce {
            Some((kind, kept)) => {
                let (outer, row) = (
                    self.shape[..kept].iter().product(),
                    self.shape[kept..].iter().product(),
                );
                let (rows, outs) = (Rows { outer, row }, &mut outs[..]);
                let run = Run {
                    sources,
                    direct: &direct,
                };
                let data = match kind {
                    ReduceKind::Sum => self.fold_rows(run, outs, regs, rows, 0.0, |p, q| p + q),
                    ReduceKind::Max => {
                        self.fold_rows(run, outs, regs, rows, f32::NEG_INFINITY, max_nan)
                    }
                    ReduceKind::Min => {
                        self.fold_rows(run, outs, regs, rows, f32::INFINITY, min_nan)
                    }
                }?;
                let mut data = data;
                let shape = match &self.epilogue {
                    Some(epilogue) => {
                        epilogue.op.apply(&mut data, sources)?;
                        &epilogue.shape[..]
                    }
                    None => &self.shape[..kept],
                };
                Some(self.shaped(shape, data)?)
            }
            None => {
                let run = Run {
                    sources,
                    direct: &direct,
                };
                for start in (0..total).step_by(CHUNK) {
                    let len = CHUNK.min(total - start);
                    self.chunk(run, &mut outs, regs, start, len);
                    self.store(run, &mut outs, regs, start, len);
                }
                None
            }
        };
        (outs.into_iter())
            .map(|out| self.shaped(&self.shape, out))
            .chain(reduced.map(Ok))
            .collect()
    }

    /// Stores the chunk of `len` elements from flat index `start` of each result with a
    /// buffer in `outs` (the first results) from its register, unless its op wrote it
    /// there; every register of the chunk is computed, so the buffers may be written
    /// (a leaf's handed over too).
    #[inline(always)]
    fn store(
        &self,
        run: Run<'_, '_>,
        outs: &mut [Vec<f32>],
        regs: &[[f32; CHUNK]],
        start: usize,
        len: usize,
    ) {
        for (s, (out, &r)) in outs.iter_mut().zip(&self.stores).enumerate() {
            if !run.direct.iter().any(|&(_, slot)| slot == s) {
                out[start..start + len].copy_from_slice(&regs[r][..len]);
            }
        }
    }

    /// The reduction of each of the `rows` with `f` (identity `identity`), folded as
    /// [`Lanes`] fold; the results besides the root stored into `outs` chunk by chunk
    /// (in order: fresh buffers). Rows shorter than a chunk are computed several at a
    /// time (as many whole rows as a chunk holds) and folded one by one from the last
    /// register; longer rows chunk by chunk. Either way each row is fed to its own
    /// lanes in order, so the result does not depend on the cut.
    #[inline(always)]
    fn fold_rows(
        &self,
        run: Run<'_, '_>,
        outs: &mut [Vec<f32>],
        regs: &mut [[f32; CHUNK]],
        Rows { outer, row }: Rows,
        identity: f32,
        f: impl Fn(f32, f32) -> f32 + Copy,
    ) -> Result<Vec<f32>, String> {
        let body = body_len(row);
        let mut out = buffers::with_capacity(outer);
        if row == 0 {
            out.resize(outer, identity);
            return Ok(out);
        }
        // The register the reduction folds: the last op's (see `Group::new`).
        let last = self
            .stores
            .last()
            .copied()
            .ok_or("a reduction folds a register")?;
        let fold = |values: &[f32]| {
            let mut lanes = Lanes::new(identity);
            lanes.push(&values[..body], f);
            lanes.finish(&values[body..], f)
        };
        if row <= CHUNK {
            let per_chunk = CHUNK / row;
            let mut r = 0;
            while r < outer {
                let rows = per_chunk.min(outer - r);
                let (start, len) = (r * row, rows * row);
                self.chunk(run, outs, regs, start, len);
                self.store(run, outs, regs, start, len);
                let values = run.values(outs, regs, last, start, len);
                out.extend(values.chunks_exact(row).map(fold));
                r += rows;
            }
            return Ok(out);
        }
        for r in 0..outer {
            let mut lanes = Lanes::new(identity);
            let mut start = 0;
            while start < row {
                let len = CHUNK.min(row - start);
                self.chunk(run, outs, regs, r * row + start, len);
                self.store(run, outs, regs, r * row + start, len);
                let values = run.values(outs, regs, last, r * row + start, len);
                let in_body = body.saturating_sub(start).min(len);
                lanes.push(&values[..in_body], f);
                start += len;
                if start == row {
                    out.push(lanes.finish(&values[in_body..], f));
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Computes the `len` elements from flat index `start` of the loop: reads the
    /// leaves (in place where they are contiguous, a [`Source::Buffer`] from its
    /// result's buffer in `outs`; a [`Source::Splat`] or [`Source::Repeat`] from its
    /// register, filled for the run; the others loaded into their registers), and runs
    /// the ops into their registers, or into their results' buffers (`run.direct`).
    #[inline(always)]
    fn chunk(
        &self,
        run: Run<'_, '_>,
        outs: &mut [Vec<f32>],
        regs: &mut [[f32; CHUNK]],
        start: usize,
        len: usize,
    ) {
        let Run { sources, direct } = run;
        let end = start + len;
        for (source, reg) in sources.iter().zip(regs.iter_mut()) {
            source.load(&mut reg[..len], start);
        }
        let round = rounding(self.dtype);
        for &(ref instr, dst) in &self.code {
            // The op's elements apart from the others (its operands'): its result's
            // buffer if it writes it directly, else its register.
            let (dst, regs, outs) = match slot_of(direct, dst) {
                Some(s) => {
                    let Some((out, outs)) = Split::lend(outs, s) else {
                        continue;
                    };
                    (&mut out[start..end], Split::whole(&*regs), outs)
                }
                None => {
                    let Some((reg, regs)) = Split::lend(regs, dst) else {
                        continue;
                    };
                    (&mut reg[..len], regs, Split::whole(&*outs))
                }
            };
            let arg = |r: usize| -> &[f32] {
                match sources.get(r) {
                    Some(Source::Buffer(s)) => &outs.get(*s)[start..end],
                    Some(Source::Strided {
                        data,
                        contiguous: true,
                        ..
                    }) => &data[start..end],
                    _ => match slot_of(direct, r) {
                        Some(s) => &outs.get(s)[start..end],
                        None => &regs.get(r)[..len],
                    },
                }
            };
            // A scalar broadcast is one value in a machine register, not a register
            // of the loop read element by element.
            let splat = |r: usize| match sources.get(r) {
                Some(&Source::Splat(v)) => Some(v),
                _ => None,
            };
            match *instr {
                Instr::Unary(op, a) => {
                    f32_unary(op, MapInto(arg(a), &mut *dst));
                    round.inspect(|&f| dst.iter_mut().for_each(|d| *d = f(*d)));
                }
                Instr::Binary(op, a, b) => {
                    match (splat(a), splat(b)) {
                        (None, Some(q)) => f32_binary(op, ZipSplat(arg(a), q, &mut *dst)),
                        (Some(p), None) => f32_binary(op, SplatZip(p, arg(b), &mut *dst)),
                        _ => f32_binary(op, ZipInto(arg(a), arg(b), &mut *dst)),
                    };
                    round.inspect(|&f| dst.iter_mut().for_each(|d| *d = f(*d)));
                }
                Instr::Compare(op, Lane::Int, a, b) => {
                    compare_fn(op, CompareInto(arg(a), arg(b), dst, int_lane));
                }
                Instr::Compare(op, _, a, b) => {
                    compare_fn(op, CompareInto(arg(a), arg(b), dst, |v: f32| v));
                }
                Instr::Convert(lane, a) => {
                    let lanes = dst.iter_mut().zip(arg(a));
                    match lane {
                        // The mask's bits and 1.0's: 1.0 for true, 0.0 for false.
                        Lane::Bool => {
                            lanes.for_each(|(d, &p)| *d = f32::from_bits(p.to_bits() & ONE))
                        }
                        Lane::Int => lanes.for_each(|(d, &v)| *d = int_lane(v) as f32),
                        Lane::Float => lanes.for_each(|(d, &v)| *d = v),
                    }
                    round.inspect(|&f| dst.iter_mut().for_each(|d| *d = f(*d)));
                }
                Instr::Logic(op, a, b) => {
                    let lanes = dst.iter_mut().zip(arg(a)).zip(arg(b));
                    if op == BinaryOp::And {
                        lanes.for_each(|((d, &p), &q)| {
                            *d = f32::from_bits(p.to_bits() & q.to_bits())
                        });
                    } else {
                        lanes.for_each(|((d, &p), &q)| {
                            *d = f32::from_bits(p.to_bits() | q.to_bits())
                        });
                    }
                }
                Instr::Test(test, a) => {
                    for (d, &v) in dst.iter_mut().zip(arg(a)) {
                        *d = test.apply(v);
                    }
                }
                Instr::Select(p, t, f) => {
                    let lanes = dst.iter_mut().zip(arg(p)).zip(arg(t)).zip(arg(f));
                    for (((d, &p), &t), &f) in lanes {
                        *d = select_lane(p, t, f);
                    }
                }
                Instr::Pair {
                    first,
                    a,
                    b,
                    second,
                    c,
                    t_left,
                } => {
                    let (a, b, c) = (arg(a), arg(b), arg(c));
                    f32_arith(first, PairInto(second, a, b, c, t_left, dst));
                }
            }
        }
    }
}

/// Registers for `code` (op `k` writing register `base + k`, reading lower ones: the
/// leaves' below `base`), so that the ops share few: each op writes a register no live
/// value holds (never one of its operands'), and a register is free again after its
/// value's last reader, unless the value is stored (`stores`) or is the last op's (a
/// reduction folds it); a stored value's register is used for nothing else. Returns the code with each op's register, `stores` renamed,
/// and the number of registers.
fn allocate(
    base: usize,
    code: Vec<Instr>,
    stores: Vec<usize>,
) -> (Vec<(Instr, usize)>, Vec<usize>, usize) {
    // The last op reading each op's value; `usize::MAX`: kept to the chunk's end.
    let mut last = vec![0; code.len()];
    for (k, instr) in code.iter().enumerate() {
        for r in instr.reads() {
            if let Some(op) = r.checked_sub(base) {
                last[op] = k;
            }
        }
    }
    for &r in stores.iter().chain(&[base + code.len().saturating_sub(1)]) {
        if let Some(slot) = r.checked_sub(base).and_then(|op| last.get_mut(op)) {
            *slot = usize::MAX;
        }
    }
    // Each op's register, as assigned so far.
    let mut register: Vec<usize> = Vec::with_capacity(code.len());
    let (mut free, mut registers) = (Vec::new(), base);
    let mut out = Vec::with_capacity(code.len());
    for (k, instr) in code.into_iter().enumerate() {
        // A stored value's register is its own (no other op writes it), so that a run
        // may keep the value in its result's buffer instead (see `Group::direct`).
        let reused = if stores.contains(&(base + k)) {
            None
        } else {
            free.pop()
        };
        let dst = reused.unwrap_or_else(|| {
            registers += 1;
            registers - 1
        });
        let operands = instr.reads();
        let renamed = instr.renamed(|r| r.checked_sub(base).map_or(r, |op| register[op]));
        // The operands read for the last time here free their registers (once each).
        for op in operands.iter().filter_map(|r| r.checked_sub(base)) {
            if last[op] == k && !free.contains(&register[op]) {
                free.push(register[op]);
            }
        }
        register.push(dst);
        out.push((renamed, dst));
    }
    let stores = (stores.iter())
        .map(|&r| r.checked_sub(base).map_or(r, |op| register[op]))
        .collect();
    (out, stores, registers)
}

/// The results an op of a run writes straight into their buffers instead of its
/// register, as `(register, slot)`: the register's values are then read from result
/// `slot`'s buffer (see [`Group::direct`]).
type Direct = SmallVec<[(usize, usize); MAX_RESULTS]>;

/// The result buffer register `r` is written into, if it is written directly.
fn slot_of(direct: &[(usize, usize)], r: usize) -> Option<usize> {
    direct
        .iter()
        .find(|&&(reg, _)| reg == r)
        .map(|&(_, slot)| slot)
}

/// What every chunk of a run reads besides the buffers and registers: the leaves'
/// sources and the results written directly.
#[derive(Clone, Copy)]
struct Run<'r, 'a> {
    sources: &'r [Source<'a>],
    direct: &'r [(usize, usize)],
}

impl<'r> Run<'r, '_> {
    /// The values of register `r` for the chunk of `len` elements from `start`: a
    /// leaf's where the loop reads it (a buffer handed over, or in place), else in its
    /// result's buffer if written directly, else in the register.
    fn values<'x>(
        self,
        outs: &'x [Vec<f32>],
        regs: &'x [[f32; CHUNK]],
        r: usize,
        start: usize,
        len: usize,
    ) -> &'x [f32]
    where
        'r: 'x,
    {
        match self.sources.get(r) {
            Some(&Source::Buffer(s)) => return &outs[s][start..start + len],
            Some(Source::Strided {
                data,
                contiguous: true,
                ..
            }) => return &data[start..start + len],
            _ => {}
        }
        match slot_of(self.direct, r) {
            Some(s) => &outs[s][start..start + len],
            None => &regs[r][..len],
        }
    }
}

/// Slice `lo`, one element lent out mutably (`hole`; `usize::MAX`: none), then `hi`:
/// the registers or result buffers an op reads while it writes one of them.
struct Split<'x, T> {
    lo: &'x [T],
    hole: usize,
    hi: &'x [T],
}

impl<'x, T> Split<'x, T> {
    /// All of `all`, none lent out.
    fn whole(all: &'x [T]) -> Self {
        Split {
            lo: all,
            hole: usize::MAX,
            hi: &[],
        }
    }

    /// Element `i` of `all` lent out mutably beside the rest; `None` past the end.
    fn lend(all: &'x mut [T], i: usize) -> Option<(&'x mut T, Self)> {
        let (lo, rest) = all.split_at_mut(i);
        let (at, hi) = rest.split_first_mut()?;
        Some((at, Split { lo, hole: i, hi }))
    }

    /// Element `i` (not the hole).
    fn get(&self, i: usize) -> &'x T {
        if i < self.hole {
            &self.lo[i]
        } else {
            &self.hi[i - self.hole - 1]
        }
    }
}

/// `a`'s elements in standard order as a vector of `len` (an owned standard-layout
/// array of `len` elements: moved, not copied, unless it starts past its buffer's
/// first element).
fn elements(a: ArrayD<f32>, len: usize) -> Vec<f32> {
    let (mut data, offset) = a.into_raw_vec_and_offset();
    data.drain(..offset.unwrap_or(0).min(data.len()));
    data.truncate(len);
    data
}

/// The greatest common divisor of `a` and `b`.
fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Group {
    /// `data` as a literal of `shape` in the loop's dtype (converted from f32 lanes
    /// that hold it exactly).
    fn shaped(&self, shape: &[usize], data: Vec<f32>) -> Result<Literal, String> {
        let lanes = ArrayD::from_shape_vec(shape, data).map_err(|e| e.to_string())?;
        Ok(match self.dtype {
            DType::F32 => Literal::F32(lanes),
            narrow => Literal::F32(lanes).convert(narrow),
        })
    }
}

/// The function rounding an op's f32 lanes to `dtype` as `Literal::convert` rounds (to
/// nearest even), if `dtype` is narrow.
fn rounding(dtype: DType) -> Option<fn(f32) -> f32> {
    match dtype {
        DType::BF16 => Some(|v| half::bf16::from_f32(v).to_f32()),
        DType::F16 => Some(|v| half::f16::from_f32(v).to_f32()),
        _ => None,
    }
}

/// A unary op's function from one register into another.
struct MapInto<'a>(&'a [f32], &'a mut [f32]);

impl WithUnary for MapInto<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32) -> f32 + Copy) {
        for (d, &a) in self.1.iter_mut().zip(self.0) {
            *d = f(a);
        }
    }
}

/// A binary op's function from two registers into a third.
struct ZipInto<'a>(&'a [f32], &'a [f32], &'a mut [f32]);

impl WithBinary for ZipInto<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) {
        for ((d, &a), &b) in self.2.iter_mut().zip(self.0).zip(self.1) {
            *d = f(a, b);
        }
    }
}

/// An [`Instr::Pair`] from three registers into a fourth, given its second op: the
/// first op's function is applied here, the second's in [`PairWith`].
struct PairInto<'a>(
    BinaryOp,
    &'a [f32],
    &'a [f32],
    &'a [f32],
    bool,
    &'a mut [f32],
);

impl WithBinary for PairInto<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, first: impl Fn(f32, f32) -> f32 + Copy) {
        let PairInto(second, a, b, c, t_left, dst) = self;
        f32_arith(second, PairWith(first, a, b, c, t_left, dst));
    }
}

/// An [`Instr::Pair`] with its first op's function: runs the pass.
struct PairWith<'a, F>(F, &'a [f32], &'a [f32], &'a [f32], bool, &'a mut [f32]);

impl<F: Fn(f32, f32) -> f32 + Copy> WithBinary for PairWith<'_, F> {
    type Out = ();
    #[inline(always)]
    fn with(self, second: impl Fn(f32, f32) -> f32 + Copy) {
        let PairWith(first, a, b, c, t_left, dst) = self;
        let lanes = dst.iter_mut().zip(a).zip(b).zip(c);
        if t_left {
            for (((d, &a), &b), &c) in lanes {
                *d = second(first(a, b), c);
            }
        } else {
            for (((d, &a), &b), &c) in lanes {
                *d = second(c, first(a, b));
            }
        }
    }
}

/// A comparison's function from two registers, their lanes read with the fourth field
/// (as f32, or as i32 by [`int_lane`]), into bool lanes in the third.
struct CompareInto<'a, R>(&'a [f32], &'a [f32], &'a mut [f32], R);

impl<T, R: Fn(f32) -> T + Copy> WithCompare<T> for CompareInto<'_, R> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(T, T) -> bool + Copy) {
        let read = self.3;
        for ((d, &a), &b) in self.2.iter_mut().zip(self.0).zip(self.1) {
            *d = bool_lane(f(read(a), read(b)));
        }
    }
}

/// A binary op's function from a register and a scalar (a splat leaf, the right
/// operand) into a third register.
struct ZipSplat<'a>(&'a [f32], f32, &'a mut [f32]);

impl WithBinary for ZipSplat<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) {
        let q = self.1;
        for (d, &a) in self.2.iter_mut().zip(self.0) {
            *d = f(a, q);
        }
    }
}

/// [`ZipSplat`] with the scalar the left operand.
struct SplatZip<'a>(f32, &'a [f32], &'a mut [f32]);

impl WithBinary for SplatZip<'_> {
    type Out = ();
    #[inline(always)]
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) {
        let p = self.0;
        for (d, &b) in self.2.iter_mut().zip(self.1) {
            *d = f(p, b);
        }
    }
}

/// [`Group::run_on`] under `pulp`'s run-time dispatch: the loop, inlined here, is
/// compiled with the CPU's vector features (AVX2 and FMA, AVX-512), so each op's run
/// over a register takes 8 or 16 elements per instruction. The bits do not change:
/// every op is still its kernel's scalar function (the compiler neither contracts a
/// product and a sum into a fused multiply-add nor reorders a reduction's lanes).
struct Vectorised<'g, 's, 'a> {
    group: &'g Group,
    sources: &'s [Source<'a>],
    outs: SmallVec<[Vec<f32>; MAX_RESULTS]>,
    regs: &'s mut [[f32; CHUNK]],
}

impl pulp::WithSimd for Vectorised<'_, '_, '_> {
    type Output = Result<SmallVec<[Literal; MAX_RESULTS]>, String>;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        self.group.run_on(self.sources, self.outs, self.regs)
    }
}

/// Where a leaf's elements are, as the loop reads them.
enum Source<'a> {
    /// In the buffer of result `.0` (the leaf was handed over), at the loop's flat
    /// index.
    Buffer(usize),
    /// One element everywhere (a scalar broadcast: every stride 0), in a register
    /// filled once per run.
    Splat(f32),
    /// A contiguous block repeated along the outer dims (a bias row over the rows:
    /// the strides row-major over the minor dims, 0 over the others), every chunk
    /// starting at a repeat: in a register filled once per run with the block
    /// repeated, element `ix` of the loop at `flat(ix) % block.len()`.
    Repeat(Cow<'a, [f32]>),
    /// In `data` (row-major), element `ix` of the loop at `sum(ix[d] * strides[d])`
    /// (see [`Walk`]); `contiguous`: the strides are the loop shape's row-major ones.
    Strided {
        data: Cow<'a, [f32]>,
        walk: &'a Walk,
        contiguous: bool,
    },
}

/// How a leaf's elements are read over the loop, worked out from the shapes alone (the
/// value's, the broadcast's dims, the loop's): what [`Source`] it is with the data.
#[derive(Debug, Clone)]
enum Layout {
    /// Every stride 0: [`Source::Splat`].
    Splat,
    /// A block of this many elements repeated: [`Source::Repeat`].
    Repeat(usize),
    /// [`Source::Strided`].
    Strided { walk: Walk, contiguous: bool },
}

/// A strided walk over the loop: `shape` is the loop's and `strides` are over it, with
/// dims merged where they walk as one (see [`coalesce`]), so the runs a chunk is loaded
/// in are as long as they can be.
#[derive(Debug, Clone)]
struct Walk {
    shape: Dims,
    strides: Dims,
}

impl Layout {
    /// The layout of a value of `len` elements walked with `value_strides` over
    /// `value_shape`, read through `dims` (see [`Leaf`]) over the loop's `shape`, every
    /// chunk starting at a multiple of `cut` (see [`Group::cut`]).
    fn new(
        value_shape: &[usize],
        value_strides: &[usize],
        len: usize,
        dims: Option<&[usize]>,
        shape: &[usize],
        cut: usize,
    ) -> Result<Layout, String> {
        let identity: Dims;
        let dims = match dims {
            Some(dims) => dims,
            None => {
                identity = (0..value_shape.len()).collect();
                &identity
            }
        };
        let strides = map_strides(value_shape, value_strides, shape, dims)?;
        if strides.iter().all(|&s| s == 0) && len > 0 {
            return Ok(Layout::Splat);
        }
        let contiguous = strides == row_major(shape);
        if !contiguous
            && let Some(period) = repeat_period(&strides, shape)
            && period <= CHUNK
            && cut.is_multiple_of(period)
            && period <= len
        {
            return Ok(Layout::Repeat(period));
        }
        let (shape, strides) = coalesce(shape, &strides);
        Ok(Layout::Strided {
            walk: Walk { shape, strides },
            contiguous,
        })
    }
}

/// The elements of `lit` in row-major order as lanes (see [`Lane`]): f32 in place, the
/// others converted (bool as [`bool_lane`]s, i32 as their bits, narrow floats widened).
fn lanes(lit: &Literal) -> Cow<'_, [f32]> {
    match lit {
        Literal::F32(a) => match a.as_slice() {
            Some(s) => Cow::Borrowed(s),
            None => Cow::Owned(converted(a, |v| v)),
        },
        Literal::Bool(a) => Cow::Owned(converted(a, bool_lane)),
        Literal::BF16(a) => Cow::Owned(converted(a, |v| v.to_f32())),
        Literal::F16(a) => Cow::Owned(converted(a, |v| v.to_f32())),
        Literal::I32(a) => Cow::Owned(converted(a, |v| f32::from_bits(v.cast_unsigned()))),
    }
}

/// The elements of `a` in row-major order converted by `f` to lanes: a contiguous
/// array through its slice (a loop the compiler vectorises), any other element by
/// element.
fn converted<T: Copy>(a: &ArrayD<T>, f: impl Fn(T) -> f32) -> Vec<f32> {
    match a.as_slice() {
        Some(s) => s.iter().map(|&v| f(v)).collect(),
        None => a.iter().map(|&v| f(v)).collect(),
    }
}

/// The elements of leaf value `x` as lanes and their layout read through `dims` (see
/// [`Leaf`]) over `shape`, every chunk starting at a multiple of `cut` (see
/// [`Group::cut`]), worked out from the value as given (a deferred broadcast included).
fn worked_out<'x>(
    x: &'x Operand<'_>,
    dims: Option<&[usize]>,
    shape: &[usize],
    cut: usize,
) -> Result<(Cow<'x, [f32]>, Layout), String> {
    let shape_of = |lit: &Literal| with_literal!(lit, a => Dims::from_slice(a.shape()));
    // The value's elements, shape and strides over that shape.
    let (data, value_shape, value_strides) = match x {
        Operand::Value(v) => {
            let shape = shape_of(v);
            let strides = row_major(&shape);
            (lanes(v), shape, strides)
        }
        Operand::Broadcast {
            source,
            shape: to,
            dims,
        } => {
            let from = shape_of(source);
            let strides = map_strides(&from, &row_major(&from), to, dims)?;
            (lanes(source), Dims::from_slice(to), strides)
        }
    };
    let layout = Layout::new(&value_shape, &value_strides, data.len(), dims, shape, cut)?;
    Ok((data, layout))
}

impl<'a> Source<'a> {
    /// The source of the elements `data` (of at least one element if `layout` is a
    /// splat, of at least the block if it repeats one) read as `layout` says; a walk is
    /// borrowed from the layout (the group's, or one worked out for the run: a source
    /// stays a few words, the sources of a run are collected by value).
    fn laid(data: Cow<'a, [f32]>, layout: &'a Layout) -> Self {
        match layout {
            Layout::Splat => Source::Splat(data[0]),
            &Layout::Repeat(period) => Source::Repeat(match data {
                Cow::Borrowed(all) => Cow::Borrowed(&all[..period]),
                Cow::Owned(mut all) => {
                    all.truncate(period);
                    Cow::Owned(all)
                }
            }),
            Layout::Strided { walk, contiguous } => Source::Strided {
                data,
                walk,
                contiguous: *contiguous,
            },
        }
    }

    /// Fills `reg` (a register up to the longest chunk) if the source is held in its
    /// register for the run: a splat, or a repeated block (each chunk starts at a
    /// repeat, so the register's element `i` is the block's `i % period`).
    fn fill(&self, reg: &mut [f32]) {
        match self {
            Source::Splat(v) => reg.fill(*v),
            Source::Repeat(block) => {
                for run in reg.chunks_mut(block.len()) {
                    run.copy_from_slice(&block[..run.len()]);
                }
            }
            Source::Buffer(_) | Source::Strided { .. } => {}
        }
    }

    /// Writes the elements at flat indices `start..start + out.len()` of the loop
    /// into `out` if the source is loaded chunk by chunk (strided, not contiguous);
    /// else (read in place, or held in its register for the run) nothing.
    #[inline(always)]
    fn load(&self, out: &mut [f32], start: usize) {
        let Source::Strided {
            data,
            walk,
            contiguous: false,
        } = self
        else {
            return;
        };
        let (shape, strides) = (&walk.shape, &walk.strides);
        // Not read in place, so not contiguous and of rank >= 1: runs along the minor dim.
        let Some((&minor, outer_dims)) = shape.split_last() else {
            return;
        };
        let (outer_strides, step) = strides.split_at(outer_dims.len());
        let step = step[0];
        // The loop index of `start` (its outer dims, and its place in the minor dim)
        // and the offset of its run; then stepped run by run, carrying like an odometer.
        let mut within = start % minor;
        let mut rest = start / minor;
        let mut index: Dims = Dims::from_elem(0, outer_dims.len());
        let mut base = 0;
        for ((i, &n), &s) in index.iter_mut().zip(outer_dims).zip(outer_strides).rev() {
            *i = rest % n;
            base += *i * s;
            rest /= n;
        }
        let mut filled = 0;
        while filled < out.len() {
            let run = (minor - within).min(out.len() - filled);
            let dst = &mut out[filled..filled + run];
            match step {
                0 => dst.fill(data[base]),
                1 => dst.copy_from_slice(&data[base + within..base + within + run]),
                s => {
                    for (k, d) in dst.iter_mut().enumerate() {
                        *d = data[base + (within + k) * s];
                    }
                }
            }
            filled += run;
            within = 0;
            for ((i, &n), &s) in index.iter_mut().zip(outer_dims).zip(outer_strides).rev() {
                *i += 1;
                base += s;
                if *i < n {
                    break;
                }
                base -= n * s;
                *i = 0;
            }
        }
    }
}

/// `shape` and `strides` with each dim merged into the next where walking the two in
/// row-major order walks one dim (`strides[d] == strides[d + 1] * shape[d + 1]`: a
/// broadcast scalar repeated along several minor dims, contiguous rows) and dims of one
/// element dropped (at least one dim kept): the same elements in the same flat order.
fn coalesce(shape: &[usize], strides: &[usize]) -> (Dims, Dims) {
    let (mut dims, mut steps) = (Dims::new(), Dims::new());
    for (&n, &step) in shape.iter().zip(strides) {
        let k = dims.len();
        if n == 1 {
            continue;
        } else if k > 0 && steps[k - 1] == step * n {
            dims[k - 1] *= n;
            steps[k - 1] = step;
        } else {
            dims.push(n);
            steps.push(step);
        }
    }
    if dims.is_empty() {
        dims.push(1);
        steps.push(0);
    }
    (dims, steps)
}

/// The period of a leaf read through `strides` over `shape` if it repeats a contiguous
/// block along its outer dims: the dims from some `k` on are row-major (the block,
/// `period` elements), those before `k` stride 0 (or of one element), and `0 < k`.
fn repeat_period(strides: &[usize], shape: &[usize]) -> Option<usize> {
    let (mut k, mut period) = (shape.len(), 1);
    while k > 0 && (strides[k - 1] == period || shape[k - 1] == 1) {
        period *= shape[k - 1];
        k -= 1;
    }
    let outer = (strides[..k].iter().zip(shape)).all(|(&s, &n)| s == 0 || n == 1);
    (k > 0 && outer && period > 0).then_some(period)
}

/// The fusion groups of `program`'s plan, each as its nodes in node order (the root
/// last): for tests (see `gspmd-core/tests/fusion.rs`).
pub fn fusion_groups(program: &Program) -> Vec<Vec<ValueId>> {
    let plan = super::plan::Plan::new(program);
    plan.groups.iter().map(|g| g.members.clone()).collect()
}

/// The passes each fusion group of `program`'s plan makes over a chunk (its ops, an
/// `Instr::Pair` one pass for two), in the order of [`fusion_groups`]: for tests.
pub fn fusion_passes(program: &Program) -> Vec<usize> {
    let plan = super::plan::Plan::new(program);
    plan.groups.iter().map(|g| g.code.len()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A strided source reads broadcast rows, columns and transposes as the views do.
    #[test]
    fn strided_loads_follow_the_broadcast() {
        let data: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let a = Literal::F32(ArrayD::from_shape_vec(&[2, 3][..], data).unwrap());
        let x = Operand::Value(Cow::Borrowed(&a));
        // [2, 3] onto [4, 2, 3] along dims 1, 2, and onto [3, 2] transposed.
        let shape = [4, 2, 3];
        let (data, layout) = worked_out(&x, Some(&[1, 2]), &shape, 1).unwrap();
        let s = Source::laid(data, &layout);
        let mut out = vec![0.0; 10];
        s.load(&mut out, 4);
        assert_eq!(out, [4.0, 5.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 1.0]);
        let shape = [3, 2];
        let (data, layout) = worked_out(&x, Some(&[1, 0]), &shape, 1).unwrap();
        let s = Source::laid(data, &layout);
        let mut out = vec![0.0; 6];
        s.load(&mut out, 0);
        assert_eq!(out, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert!(worked_out(&x, Some(&[0, 1]), &[3, 2], 1).is_err());
        // [2, 3] transposed onto [3, 4, 2] along dims 2, 0: every start and length
        // (runs cut anywhere, carries across both outer dims) reads element
        // `[ix[2], ix[0]]` of the value at loop index `ix`.
        let shape = [3, 4, 2];
        let (data, layout) = worked_out(&x, Some(&[2, 0]), &shape, 1).unwrap();
        let s = Source::laid(data, &layout);
        let want: Vec<f32> = (0..24).map(|k| ((k % 2) * 3 + k / 8) as f32).collect();
        for start in 0..24 {
            for len in 1..=24 - start {
                let mut out = vec![0.0; len];
                s.load(&mut out, start);
                assert_eq!(out, want[start..start + len], "from {start}, {len}");
            }
        }
        // [2, 3] onto [4, 2, 3] repeats a block of 6: held in its register when every
        // chunk starts at a repeat (a cut of 12), loaded when not (a cut of 3).
        let shape = [4, 2, 3];
        let (data, layout) = worked_out(&x, Some(&[1, 2]), &shape, 12).unwrap();
        let s = Source::laid(data, &layout);
        assert!(matches!(s, Source::Repeat(ref block) if block.len() == 6));
        let mut reg = vec![0.0; 16];
        s.fill(&mut reg);
        let want: Vec<f32> = (0..16).map(|k| (k % 6) as f32).collect();
        assert_eq!(reg, want);
        let (data, layout) = worked_out(&x, Some(&[1, 2]), &shape, 3).unwrap();
        let s = Source::laid(data, &layout);
        assert!(matches!(s, Source::Strided { .. }));
    }

    /// A source laid out at plan time from the value's shape reads what the source
    /// worked out at run time reads, for splats, repeated blocks, strided and
    /// contiguous leaves, and for every start and length.
    #[test]
    fn planned_layouts_read_as_run_time_ones() {
        let data: Vec<f32> = (0..6).map(|v| v as f32 + 0.5).collect();
        let a = Literal::F32(ArrayD::from_shape_vec(&[2, 3][..], data).unwrap());
        let scalar = Literal::F32(ArrayD::from_elem(&[][..], 2.5));
        let flags = Literal::Bool(ArrayD::from_shape_fn(&[2, 3][..], |ix| ix[0] == ix[1]));
        // The value, the broadcast's dims, the loop's shape and the cut.
        type Case<'c> = (&'c Literal, Option<&'c [usize]>, &'c [usize], usize);
        let cases: [Case<'_>; 7] = [
            (&a, Some(&[1, 2]), &[4, 2, 3], 12),
            (&a, Some(&[1, 2]), &[4, 2, 3], 3),
            (&a, Some(&[2, 0]), &[3, 4, 2], 1),
            (&a, None, &[2, 3], CHUNK),
            (&scalar, Some(&[]), &[5, 7], CHUNK),
            (&flags, Some(&[0, 2]), &[2, 2, 3], 6),
            (&flags, None, &[2, 3], CHUNK),
        ];
        for (lit, dims, shape, cut) in cases {
            let x = Operand::Value(Cow::Borrowed(lit));
            let (data, worked) = worked_out(&x, dims, shape, cut).unwrap();
            let run_time = Source::laid(data, &worked);
            let value = with_literal!(lit, a => Dims::from_slice(a.shape()));
            let len = value.iter().product();
            let layout = Layout::new(&value, &row_major(&value), len, dims, shape, cut).unwrap();
            let planned = Source::laid(lanes(lit), &layout);
            assert_eq!(
                std::mem::discriminant(&planned),
                std::mem::discriminant(&run_time)
            );
            let total: usize = shape.iter().product();
            let (mut p, mut r) = (vec![0.0; total], vec![0.0; total]);
            planned.fill(&mut p);
            run_time.fill(&mut r);
            assert_eq!(p, r);
            for start in 0..total {
                for len in 1..=total - start {
                    let (mut p, mut r) = (vec![0.0; len], vec![0.0; len]);
                    planned.load(&mut p, start);
                    run_time.load(&mut r, start);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&p), bits(&r), "{shape:?} from {start}, {len}");
                }
            }
        }
    }
}
