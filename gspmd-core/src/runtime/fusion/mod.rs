//! Fusion: a chain of float elementwise ops, with the broadcasts it reads and an optional
//! trailing reduction over the minor dims, run as one loop over contiguous memory
//! instead of an array per op (softmax's `exp(x - max)` and sum, layer norm, GELU,
//! the AdamW update of a weight and its two moments, the ReLU gradient's compares and
//! selects).
//!
//! Comparisons (of floats or of i32), `and`, `or`, `not`, `is_finite`, selects and
//! converts fuse through lanes ([`Lane`]): every register holds f32 lanes, a bool as a
//! mask ([`bool_lane`](code::bool_lane)), an i32 as its bits. A comparison writes masks, a select blends
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
//! outside the group, directly or through a broadcast, as a strided view; through a
//! reshape that only inserts or removes dims of one element too, whose operand it
//! reads instead, see [`unit_reshaped`]) is read in
//! place where it is contiguous, held in its register for the whole run where it is a
//! scalar or a contiguous block repeated along the outer dims (a bias row over the
//! rows, [`Source::Repeat`](source::Source::Repeat)), else loaded into its scratch register chunk by chunk;
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
//! (the same elements of the chunk were read already); each result has its own buffer. The evaluation loop binds every
//! result's value at the root.
//!
//! Results are bitwise those of the unfused kernels: every op applies the kernels'
//! scalar function (`kernels::f32_unary`, `f32_binary`, `compare_fn`), and a reduction
//! folds each row as `reduce` does (`kernels::Lanes`), however the row is cut into
//! chunks. The loop runs under `pulp`'s run-time dispatch (`Vectorised`, in [`run`]):
//! the same scalar functions, vectorised by the compiler for AVX2 and FMA or AVX-512.
//!
//! The rule (see [`plan_groups`]): from the last node back, a group grows from a float
//! elementwise op (a select or a convert included) or a reduction of trailing dims (its
//! root, or the reduction an epilogue root finishes) by every earlier elementwise op
//! of its float dtype, op giving bools and broadcast (see [`Role`]) of the loop's
//! shape, not yet in a group, such that
//! - all its readers are in the group (no broadcast among them) and it is no output
//!   (an inner member), or
//! - the member is a float elementwise op read by at least one member (no broadcast)
//!   or a sibling (it reads a value a member reads, not a scalar's broadcast: the
//!   gating's `gate1 / norm` beside `gate2 / norm`), every reader outside the group
//!   reads it after the root (the value exists from the root on; a member of a later
//!   group reads it at that group's root), and the group has fewer than
//!   [`MAX_RESULTS`] results: an extra result (outputs included). A reduction's group
//!   stores them too (softmax's `exp(x - max)` beside its sum, layer norm's `x - mean`
//!   beside the variance), or
//! - the member is a copy ([`Group::copies`]): a cheap float op (add, subtract,
//!   multiply, negate) read by a member and otherwise only before the root, no output,
//!   whose operands members read anyway (or scalar broadcasts, copied with it). The
//!   loop recomputes it from those leaves rather than read it stored; it is made where
//!   it was (its own node, or an earlier group, where its readers here no longer count).
//!   So a backward loop recomputes the forward's cheap values, as XLA's fusion duplicates
//!   cheap producers into their consumers: the GELU gradient's loop computes `x * x`,
//!   `0.5 * x` and `1 + tanh` from `x` and `tanh`, and the forward loop stores two
//!   values, not four. The same ops on the same values: bitwise what was stored.
//!
//! A reduction may be finished by one op on its reduced values ([`Epilogue`]: `mean`'s
//! division by the count, the log of a sum of exponentials), read through a reshape:
//! that op is then the group's root (see [`epilogue_of`]), and the group grows back
//! from the reduction as above (a reduction of a leaf alone, with no op in its loop,
//! included).
//!
//! A group is kept if it has at least two ops besides broadcasts, or one over at least
//! [`LONE_ELEMENTS`] elements (the loop then only vectorises it). Its leaves come
//! before the members that read them, so before the root, where they are read; a leaf
//! that is a result of an earlier group is bound at that group's root, which comes
//! before this one's.
//!
//! Here: the rule ([`plan_groups`]) and a group's plan ([`Group`]). The group's code on
//! registers is in [`code`], where its loop reads each leaf in [`source`], one op's
//! pass over a chunk in [`passes`], and the loop itself in [`run`]; a group whose code
//! is a [compiled chain](chains) runs that chain's loop ([`compiled`]) instead of the
//! passes.

use crate::ir::{BinaryOp, DType, Node, Op, Program, ReduceKind, UnaryOp, ValueId};
use crate::runtime::kernels::{Dims, row_major};

use chains::Chain;
use code::{Instr, Lane, Test, allocate, pair};
use source::Layout;

mod chains;
mod code;
#[rustfmt::skip]
mod compiled;
mod passes;
mod run;
mod source;

/// The elements a fused loop computes at a time: each register holds one chunk.
/// A multiple of the reduction's lane count, so that chunks cut a row's body whole.
pub(crate) const CHUNK: usize = 512;

/// The fewest elements of a group of one op (besides broadcasts): a lone op over
/// fewer runs as its unfused kernel, whose fixed cost is lower than a loop's; over
/// more, the loop's vectors (AVX2's 8 lanes, where the unfused kernels are compiled
/// for the baseline target's 4) pay for it.
pub(crate) const LONE_ELEMENTS: usize = 2048;

/// The most results a group stores (its root included): each is one more register
/// read back per chunk and one more buffer.
pub(crate) const MAX_RESULTS: usize = 4;

/// One fusion group, planned once per program: its nodes and its loop.
#[derive(Debug)]
pub(crate) struct Group {
    /// The group's nodes in node order; the last is the root, where the loop runs.
    pub(crate) members: Vec<ValueId>,
    /// The members the loop recomputes from its leaves although their value is made
    /// elsewhere too (by an earlier group or node, for readers before the root): cheap
    /// ops the group reads through instead of reading their stored values (see
    /// [`plan_groups`]). The plan computes them where they are made; here they are ops
    /// of the loop only.
    pub(crate) copies: Vec<ValueId>,
    /// The members whose values the loop stores (read outside the group, or outputs),
    /// in node order: the root last, and before it the extra results (of the loop's
    /// shape; with a reduction, stored as the chunks are folded).
    pub(crate) results: Vec<ValueId>,
    /// The values the loop reads from outside the group, in register order.
    pub(crate) leaves: Vec<Leaf>,
    /// The reshapes the loop reads through (see [`unit_reshaped`]): its leaves read
    /// their operands, so the plan need not compute them for it.
    pub(crate) through: Vec<ValueId>,
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
    /// An f32 group's code in canonical form, and the leaf of each of its inputs.
    chain: Option<(Chain, Vec<usize>)>,
    /// The index of `chain` among the [compiled chains](compiled::CHAINS), if it is
    /// one: the loop then runs it instead of the ops' passes.
    compiled: Option<usize>,
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

/// A value the fused loop reads.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Leaf {
    /// The value.
    pub(crate) value: ValueId,
    /// `None`: the value has the loop's shape; else the value broadcast to it, operand
    /// dim `i` becoming loop dim `dims[i]` (a broadcast in the group).
    dims: Option<Vec<usize>>,
    /// The value's dtype, which sets its lanes ([`Lane`]): a float (a narrow one
    /// widened), bool (a select's predicate, read as [bool lanes](code::bool_lane)) or i32
    /// (a comparison's operand or a convert's, read as its bits).
    dtype: DType,
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

/// Whether a group may recompute `op` rather than read its stored value: one pass of
/// an add, subtract, multiply or negate (no transcendental, no division).
fn cheap(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(UnaryOp::Neg) | Op::Binary(BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul)
    )
}

/// The fusion groups of `program` (see the module documentation for the rule), no
/// node in two but as a copy ([`Group::copies`]) in one, with node `i` reading
/// `operands[i]` (its operands, or as the plan resolves them) and `outputs` the
/// program's outputs (likewise). `typed[i]`: node `i`'s types were checked (only
/// checked nodes fuse).
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
    // A broadcast of a scalar: a group may read it wherever it reads the scalar.
    let scalar_broadcast = |i: usize| {
        roles[i] == Role::Broadcast
            && (operands[i].iter()).all(|o| nodes[o.index()].ty.shape.is_empty())
    };
    let mut claimed = vec![false; n];
    // Where each node's value is read: a member of a group (made before it) at the
    // group's root, where its loop runs; another node where it is.
    let mut read_at: Vec<usize> = (0..n).collect();
    let mut in_group = vec![false; n];
    let mut copy = vec![false; n];
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
        let mut copies = Vec::new();
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
            // A member reads `j` here; a copy reads the value its original reads, so it
            // does not make that value the group's alone.
            let reads_here = |r: usize| in_group[r] && roles[r] != Role::Broadcast;
            let member_reader = |r: usize| reads_here(r) && !copy[r];
            let inner = !output[j]
                && !readers[j].is_empty()
                && readers[j].iter().all(|&r| member_reader(r));
            // A sibling: an op no member reads that reads a value a member reads (not
            // a scalar's broadcast), all its readers after the root: the loop computes
            // it beside them, reading that value once.
            let sibling = || {
                !readers[j].is_empty()
                    && operands[j].iter().any(|o| {
                        !scalar_broadcast(o.index())
                            && (readers[o.index()].iter()).any(|&r| member_reader(r))
                    })
            };
            let result = !inner
                && roles[j] == Role::Elementwise
                && results.len() < MAX_RESULTS
                && readers[j]
                    .iter()
                    .all(|&r| member_reader(r) || (!in_group[r] && read_at[r] > root))
                && (readers[j].iter().any(|&r| member_reader(r)) || sibling());
            // A cheap op also read before the root, whose operands the group reads
            // anyway or are scalar broadcasts: recomputed here rather than stored where
            // it is made and read back.
            let unread = |o: &ValueId| !readers[o.index()].iter().any(|&r| member_reader(r));
            let recomputed = !inner
                && !result
                && cheap(&nodes[j].op)
                && roles[j] == Role::Elementwise
                && !output[j]
                && readers[j].iter().any(|&r| reads_here(r))
                && readers[j].iter().all(|&r| reads_here(r) || r < root)
                && (operands[j].iter())
                    .filter(|o| unread(o))
                    .all(|o| scalar_broadcast(o.index()));
            // Those scalar broadcasts, copied with it (the loop reads their scalars).
            let mut lone: Vec<usize> = (operands[j].iter())
                .filter(|o| recomputed && unread(o) && !in_group[o.index()])
                .map(|o| o.index())
                .collect();
            lone.sort_unstable();
            lone.dedup();
            if inner || result || recomputed {
                in_group[j] = true;
                members.push(j);
                if result {
                    results.push(j);
                }
                if recomputed {
                    for c in lone.into_iter().chain([j]) {
                        in_group[c] = true;
                        copy[c] = true;
                        copies.push(c);
                        if c != j {
                            members.push(c);
                        }
                    }
                } else if matches!(roles[j], Role::Elementwise | Role::Predicate) {
                    low = low.min(lowest_operand(j).unwrap_or(j));
                }
            }
        }
        for &m in &members {
            in_group[m] = false;
            copy[m] = false;
        }
        members.sort_unstable();
        results.sort_unstable();
        let ops = members
            .iter()
            .filter(|&&m| matches!(roles[m], Role::Elementwise | Role::Predicate))
            .count();
        let reduces = usize::from(roles[end] == Role::TrailingReduce);
        let long = shape.iter().product::<usize>() >= LONE_ELEMENTS;
        if ops == 0 || (ops + reduces < 2 && !long) {
            continue;
        }
        for &m in &members {
            claimed[m] = !copies.contains(&m);
            if claimed[m] {
                read_at[m] = root;
            }
        }
        // A copy's readers here read the group's value: the original's readers are
        // the others.
        for &c in &copies {
            readers[c].retain(|r| members.binary_search(r).is_err());
        }
        let mut group = Group::new(
            program,
            operands,
            &members,
            &results,
            shape.clone(),
            dtype,
            finishing.is_some(),
        );
        copies.sort_unstable();
        group.copies = copies.into_iter().map(|c| ValueId(c as u32)).collect();
        groups.push(group);
    }
    groups
}

/// If `v` is a reshape that only inserts or removes dims of one element (of its
/// operand's dtype, to the shape its type has), read by a broadcast along `dims`: the
/// reshape's operand and the dims the same broadcast reads it along — the same
/// elements at the same loop indices, so a loop reads the operand as it would the
/// reshape (XLA treats such a reshape as a bitcast). Each dim of more than one element
/// goes where the reshape's matching dim went; one of one element to any loop dim (it
/// is read with stride 0). `operands` as [`plan_groups`] has them.
fn unit_reshaped(
    program: &Program,
    operands: &[Vec<ValueId>],
    v: ValueId,
    dims: &[usize],
) -> Option<(ValueId, Vec<usize>)> {
    let node = &program.nodes[v.index()];
    let (Op::Reshape(shape), &[source]) = (&node.op, &operands[v.index()][..]) else {
        return None;
    };
    let operand = &program.nodes[source.index()].ty;
    if *shape != node.ty.shape || operand.dtype != node.ty.dtype {
        return None;
    }
    let from = &operand.shape;
    let wide = |shape: &[usize]| -> Vec<(usize, usize)> {
        (shape.iter().copied().enumerate())
            .filter(|&(_, n)| n != 1)
            .collect()
    };
    let (wide_from, wide_to) = (wide(from), wide(shape));
    let same = wide_from.len() == wide_to.len()
        && (wide_from.iter().zip(&wide_to)).all(|(&(_, a), &(_, b))| a == b);
    if !same {
        return None;
    }
    let &any = dims.first()?;
    let mut along = vec![any; from.len()];
    for (&(k, _), &(d, _)) in wide_from.iter().zip(&wide_to) {
        along[k] = *dims.get(d)?;
    }
    Some((source, along))
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
        let mut through = Vec::new();
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
                Op::Broadcast { dims, .. } => {
                    let read = operands[m][0];
                    let (value, dims) = match unit_reshaped(program, operands, read, dims) {
                        Some(source) => {
                            through.push(read);
                            source
                        }
                        None => (read, dims.clone()),
                    };
                    leaf(
                        &mut leaves,
                        Leaf {
                            value,
                            dims: Some(dims),
                            dtype: node.ty.dtype,
                        },
                    )
                }
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
        let chain = (dtype == DType::F32)
            .then(|| Chain::of(base, &code, &stores))
            .flatten();
        let compiled = (chain.as_ref())
            .and_then(|(chain, _)| compiled::CHAINS.iter().position(|c| c == chain));
        let Registered {
            code,
            stores,
            writers,
            last_reads,
            registers,
        } = Registered::new(base, code, stores);
        let ids = |nodes: &[usize]| nodes.iter().map(|&m| ValueId(m as u32)).collect();
        through.sort_unstable();
        through.dedup();
        let mut group = Group {
            members: ids(members),
            results: ids(results),
            leaves,
            through,
            shape,
            code,
            stores,
            writers,
            last_reads,
            registers,
            layouts: Vec::new(),
            copies: Vec::new(),
            reduce,
            epilogue: finish.map(|op| Epilogue {
                op,
                shape: root.map_or_else(Vec::new, |r| program.nodes[r].ty.shape.to_vec()),
            }),
            dtype,
            chain,
            compiled,
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
}

/// A group's code on its registers (see [`allocate`]), with what a run needs to know
/// of it.
struct Registered {
    /// The ops, each with the register it writes.
    code: Vec<(Instr, usize)>,
    /// The register of each stored value.
    stores: Vec<usize>,
    /// The op writing each of `stores`.
    writers: Vec<usize>,
    /// The last op reading each leaf's register (`None`: none reads it).
    last_reads: Vec<Option<usize>>,
    /// The registers the code uses, the leaves' included.
    registers: usize,
}

impl Registered {
    /// `code` (op `k` writing register `base + k`, the leaves' registers below `base`)
    /// storing `stores`, on registers.
    fn new(base: usize, code: Vec<Instr>, stores: Vec<usize>) -> Registered {
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
        Registered {
            code,
            stores,
            writers,
            last_reads,
            registers,
        }
    }
}

/// The greatest common divisor of `a` and `b`.
fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The fusion groups of `program`'s plan, each as its nodes in node order (the root
/// last): for tests (see `gspmd-core/tests/fusion.rs`).
pub fn fusion_groups(program: &Program) -> Vec<Vec<ValueId>> {
    let plan = super::plan::Plan::new(program);
    plan.groups.iter().map(|g| g.members.clone()).collect()
}

/// The Rust source of the compiled chains of the f32 fusion groups of `programs`'
/// plans (each chain of at least two passes whose ops all have scalar f32 functions,
/// once, in the order first met):
/// what `tests/compiled_chains.rs` in the workspace keeps in `runtime/fusion/compiled.rs`.
pub fn compiled_chains_source(programs: &[&Program]) -> String {
    let mut found: Vec<Chain> = Vec::new();
    for program in programs {
        let plan = super::plan::Plan::new(program);
        for (chain, _) in plan.groups.iter().filter_map(|g| g.chain.as_ref()) {
            if chain.compilable() && !found.contains(chain) {
                found.push(chain.clone());
            }
        }
    }
    chains::source(&found)
}

/// The passes each fusion group of `program`'s plan makes over a chunk (its ops, an
/// `Instr::Pair` one pass for two), in the order of [`fusion_groups`]: for tests.
pub fn fusion_passes(program: &Program) -> Vec<usize> {
    let plan = super::plan::Plan::new(program);
    plan.groups.iter().map(|g| g.code.len()).collect()
}
