//! The execution plan of a [`Program`]: what the evaluation loop needs to know of each
//! node that does not depend on the inputs — where its value dies, which operands it
//! may take over, whether its types were checked, its bytes, the flow instance it reads
//! — worked out once per program (and its regions) instead of on every run.
//!
//! The plan holds no address, and no value but the small ones it folds (see
//! [`folding`](super::folding)): it is `Send + Sync` and made once per executable (see
//! [`PlannedProgram`]); the reference interpreter makes one per call.

use std::collections::HashMap;
use std::sync::Arc;

use super::buffers::Requests;
use super::folding::folded_values;
use super::fusion::{Group, plan_groups};
use crate::ir::{
    BinaryOp, DType, FlowInstance, Literal, Op, Program, ValueId, flow_instances, infer_type,
};

/// How the evaluation loop runs one program (see [`Plan::new`]).
#[derive(Debug)]
pub(crate) struct Plan {
    /// One per node, in node order.
    pub(crate) steps: Vec<Step>,
    /// One per flow instance (regions and operands) of the program, not of its regions.
    pub(crate) flows: Vec<FlowPlan>,
    /// The outputs in order, each with whether a later output repeats it (then the
    /// value is copied, not moved, into this one).
    pub(crate) outputs: Vec<(ValueId, bool)>,
    /// The fusion groups (see [`fusion`](super::fusion)).
    pub(crate) groups: Vec<Group>,
    /// By parameter index: whether the run consumes the input (it is *donated*, JAX's
    /// `donate_argnums`): the loop owns it, may write into its buffer at its last use
    /// and drops it there, instead of lending it for the whole run.
    pub(crate) donated: Vec<bool>,
    /// The most bytes a run's live values (as the loop counts them: inputs and
    /// constants included) and the device's pooled free buffers may hold together: the
    /// peak of the [memory analysis](crate::analysis::MemoryAnalysis) (see
    /// [`buffers`](super::buffers)).
    pub(crate) budget: usize,
    /// The new buffers a run asks the pool for, node by node: which pooled buffers go
    /// first when they do not all fit (see [`buffers`](super::buffers)).
    pub(crate) requests: Arc<Requests>,
    /// One per node: its value if the plan folded it ([`folding`](super::folding)):
    /// bound as a constant, the node reads nothing.
    pub(crate) folded: Vec<Option<Literal>>,
}

/// A node's part in fusion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fusion {
    /// Not fused: the node runs on its own.
    No,
    /// The root of [`Plan::groups`]`[k]`: the group's loop runs here.
    Root(usize),
    /// Inside a group, not its root nor a result, or the product of an
    /// [`Fusion::Accumulate`]: not computed, never read.
    Inside,
    /// A result of a group other than its root (see [`Group::results`]): not computed
    /// here; the group's loop binds its value at the root (which comes before every
    /// reader).
    Result,
    /// Not computed: its readers read its operand. A `dynamic_slice` of its operand's
    /// whole shape (as the partitioner emits for a mesh axis of size 1: the identity
    /// whatever the start indices, which are clamped to 0), or a reshape of dims of one
    /// element read only by fused loops, which read through it
    /// ([`Group::through`]).
    Alias,
    /// An f32 `add` of a `dot_general` (this node, marked [`Fusion::Inside`]) that only
    /// it reads and another value `c` (no broadcast), where the product adds to `c`
    /// bitwise as the `add` rounds (see [`accumulated_products`]): it reads the
    /// product's operands and `c`, and runs the product adding into `c`'s buffer (a
    /// copy of it unless handed over), no product result nor `add` pass.
    Accumulate(ValueId),
}

/// What the plan knows of one node.
#[derive(Debug)]
pub(crate) struct Step {
    /// The bytes of the node's value (its type's size; 0 inside a fusion group, unless
    /// it is a result).
    pub(crate) bytes: usize,
    /// The values the node reads: its operands; a group's root reads the group's
    /// leaves, a node inside a group none.
    pub(crate) reads: Vec<ValueId>,
    /// Its part in fusion.
    pub(crate) fusion: Fusion,
    /// For each value of `reads`, whether this node reads it last and only once (and it is no
    /// output, and no deferred broadcast of it is read by this node or later): the
    /// loop may then hand the value over instead of lending it.
    pub(crate) hand_over: Vec<bool>,
    /// The values whose bytes stop counting once this node is computed, each once: the
    /// operands it reads last, and its own value if nothing reads it and it is no
    /// output. (A deferred broadcast counts its full bytes while it is live.)
    pub(crate) frees: Vec<ValueId>,
    /// The values dropped once this node is computed: as `frees`, except that the
    /// operand of a deferred broadcast lives as long as the broadcast is read.
    pub(crate) drops: Vec<ValueId>,
    /// A `broadcast_in_dim` read only by elementwise ops (binary, compare, select),
    /// with `typed` set: not materialised, its readers view its operand.
    pub(crate) deferred: bool,
    /// Whether the op's shape rule, given the node types of the operands, gives the
    /// node's type: operands whose values have their node types then fit the kernel
    /// without a check at run time.
    pub(crate) typed: bool,
    /// For a flow result: its instance in [`Plan::flows`].
    pub(crate) flow: Option<usize>,
    /// The scratch bytes the node's kernel may hold while it runs
    /// ([`kernel_scratch`](super::liveness::kernel_scratch)): the buffer pool leaves
    /// them free.
    pub(crate) scratch: usize,
    /// The bytes the device holds in buffers, inputs included, while the node runs
    /// (its result included, its kernel's scratch not) and once it has dropped what it
    /// drops, as the [memory analysis](crate::analysis::MemoryAnalysis) models them:
    /// what the buffer pool counts as live (see [`buffers`](super::buffers)). Unlike
    /// the evaluation loop's count against the memory limit, a result written in
    /// place of an operand, a deferred broadcast and a constant hold no new buffer.
    pub(crate) held: [usize; 2],
}

/// What the plan knows of one flow instance.
#[derive(Debug)]
pub(crate) struct FlowPlan {
    /// For each result of the op: how many nodes read it, and its bytes (0 if none).
    pub(crate) results: Vec<(usize, usize)>,
    /// The plans of the op's regions, in [`Flow::regions`](crate::ir::Flow::regions)
    /// order.
    pub(crate) regions: Vec<Plan>,
}

impl Plan {
    /// The plan of `program` and, recursively, of its regions. Never fails: a node
    /// whose types do not fit its op is planned unchecked (`typed == false`), so the
    /// run reports it where the loop reaches it, as if there were no plan.
    pub(crate) fn new(program: &Program) -> Plan {
        Plan::donating(program, &[])
    }

    /// [`Plan::new`] with the inputs of parameter indices `donated` consumed by the
    /// run (see [`Plan::donated`]); indices beyond the parameters are ignored.
    pub(crate) fn donating(program: &Program, donated: &[usize]) -> Plan {
        let n = program.nodes.len();
        let typed = typed_nodes(program);
        let alias = identity_slices(program, &typed);
        let folded = folded_values(program, &typed);
        let resolve = |o: &ValueId| alias.get(o.index()).copied().flatten().unwrap_or(*o);
        // What each node reads with aliases resolved; an alias and a folded node read
        // nothing.
        let mut reads: Vec<Vec<ValueId>> = (program.nodes.iter().zip(&alias).zip(&folded))
            .map(|((x, a), f)| match (a, f) {
                (None, None) => x.operands.iter().map(resolve).collect(),
                _ => Vec::new(),
            })
            .collect();
        let program_outputs: Vec<ValueId> = program.outputs.iter().map(resolve).collect();
        let mut fusion: Vec<Fusion> = (alias.iter())
            .map(|a| match a {
                Some(_) => Fusion::Alias,
                None => Fusion::No,
            })
            .collect();
        // Products added into a value, planned before fusion groups: their adds stay
        // out of the groups (as unchecked nodes do), which read their sums as leaves.
        let accumulated = accumulated_products(program, &reads, &program_outputs, &typed, &fusion);
        // A folded node is a leaf of the groups that read it, as a constant is.
        let mut groupable: Vec<bool> = (typed.iter().zip(&folded))
            .map(|(&t, f)| t && f.is_none())
            .collect();
        for (add, _) in &accumulated {
            groupable[add.index()] = false;
        }
        let groups = plan_groups(program, &reads, &program_outputs, &groupable);
        for (k, group) in groups.iter().enumerate() {
            // A copy is computed where it is made (its own node, or its group's).
            let made_here = |m: &&ValueId| group.copies.binary_search(m).is_err();
            for m in group.members.iter().filter(made_here) {
                fusion[m.index()] = if group.results.contains(m) {
                    Fusion::Result
                } else {
                    Fusion::Inside
                };
                reads[m.index()].clear();
            }
            if let Some(root) = group.members.last() {
                fusion[root.index()] = Fusion::Root(k);
                reads[root.index()] = group.leaves.iter().map(|l| l.value).collect();
            }
        }
        for (add, dot) in accumulated {
            let [lhs, rhs] = [0, 1].map(|k| reads[dot.index()][k]);
            let c = reads[add.index()].iter().find(|&&o| o != dot).copied();
            reads[add.index()] = [lhs, rhs].into_iter().chain(c).collect();
            reads[dot.index()].clear();
            fusion[dot.index()] = Fusion::Inside;
            fusion[add.index()] = Fusion::Accumulate(dot);
        }
        // A reshape the groups read through that nothing else reads is not computed.
        let mut read = vec![false; n];
        for o in reads.iter().flatten().chain(&program_outputs) {
            if let Some(slot) = read.get_mut(o.index()) {
                *slot = true;
            }
        }
        for r in groups.iter().flat_map(|g| &g.through) {
            if !read[r.index()] && fusion[r.index()] == Fusion::No {
                fusion[r.index()] = Fusion::Alias;
                reads[r.index()].clear();
            }
        }
        // For each value, the last node reading it (itself if none); `None` for outputs.
        let mut last: Vec<Option<usize>> = (0..n).map(Some).collect();
        for (i, values) in reads.iter().enumerate() {
            for o in values {
                if let Some(slot) = last.get_mut(o.index()) {
                    *slot = Some(i);
                }
            }
        }
        for o in &program_outputs {
            if let Some(slot) = last.get_mut(o.index()) {
                *slot = None;
            }
        }
        let deferred = deferred_broadcasts(program, &typed, &reads, &fusion, &program_outputs);
        // `last`, with the operand of each deferred broadcast read until the broadcast's
        // last reader.
        let mut last_data = last.clone();
        for (i, values) in reads.iter().enumerate() {
            for o in values {
                if deferred.get(o.index()) == Some(&true) {
                    let source = reads[o.index()][0].index();
                    if let Some(Some(slot)) = last_data.get_mut(source) {
                        *slot = (*slot).max(i);
                    }
                }
            }
        }
        let mut flow_index: HashMap<FlowInstance, usize> = HashMap::new();
        let mut flows = Vec::new();
        let instances = flow_instances(program);
        let steps = program
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let operands = &reads[i];
                let dies =
                    |last: &[Option<usize>], o: &ValueId| last.get(o.index()) == Some(&Some(i));
                let once = |o: &ValueId| operands.iter().filter(|&p| p == o).count() == 1;
                // The operands of the deferred broadcasts read here.
                let viewed: Vec<ValueId> = operands
                    .iter()
                    .filter(|b| deferred.get(b.index()) == Some(&true))
                    .map(|b| reads[b.index()][0])
                    .collect();
                let dying = |last: &[Option<usize>]| {
                    let mut values: Vec<ValueId> = Vec::new();
                    let candidates = operands.iter().chain(&viewed);
                    for o in candidates.chain(std::iter::once(&ValueId(i as u32))) {
                        if dies(last, o) && !values.contains(o) {
                            values.push(*o);
                        }
                    }
                    values
                };
                let flow = match &node.op {
                    Op::Flow { flow, .. } => {
                        let key = (std::sync::Arc::as_ptr(flow), node.operands.clone());
                        let next = flows.len();
                        let index = *flow_index.entry(key.clone()).or_insert(next);
                        if index == next {
                            let readers = instances.get(&key).map_or(&[][..], Vec::as_slice);
                            let results = readers
                                .iter()
                                .map(|nodes| {
                                    let bytes = nodes
                                        .first()
                                        .map_or(0, |r| program.nodes[r.index()].ty.size_in_bytes());
                                    (nodes.len(), bytes)
                                })
                                .collect();
                            let regions = flow.regions().into_iter().map(Plan::new).collect();
                            flows.push(FlowPlan { results, regions });
                        }
                        Some(index)
                    }
                    _ => None,
                };
                let inside = matches!(fusion[i], Fusion::Inside | Fusion::Alias);
                let not_here = inside || matches!(fusion[i], Fusion::Result);
                Step {
                    bytes: if inside { 0 } else { node.ty.size_in_bytes() },
                    reads: operands.clone(),
                    fusion: fusion[i],
                    hand_over: operands
                        .iter()
                        .map(|o| dies(&last_data, o) && once(o) && !viewed.contains(o))
                        .collect(),
                    // A node inside a group is never computed: its value neither. A
                    // result is read after the root or an output: its value outlives
                    // its position.
                    frees: if not_here { Vec::new() } else { dying(&last) },
                    drops: if not_here {
                        Vec::new()
                    } else {
                        dying(&last_data)
                    },
                    deferred: deferred[i],
                    typed: typed[i],
                    flow,
                    scratch: match fusion[i] {
                        _ if not_here => 0,
                        Fusion::Accumulate(dot) => {
                            super::liveness::kernel_scratch(program, &program.nodes[dot.index()])
                        }
                        _ => super::liveness::kernel_scratch(program, node),
                    },
                    // Set below, from the memory analysis of the plan.
                    held: [0, 0],
                }
            })
            .collect();
        let outputs = (program_outputs.iter().enumerate())
            .map(|(k, &o)| (o, program_outputs[k + 1..].contains(&o)))
            .collect();
        let donated = (0..program.params.len())
            .map(|i| donated.contains(&i))
            .collect();
        let mut plan = Plan {
            steps,
            flows,
            outputs,
            groups,
            donated,
            budget: 0,
            requests: Arc::default(),
            folded,
        };
        let model = super::liveness::pool_model(program, &plan);
        plan.budget = model.budget;
        plan.requests = Arc::new(model.requests);
        for (step, held) in plan.steps.iter_mut().zip(model.held) {
            step.held = held;
        }
        plan
    }
}

/// A program with its plan: what every device thread of a run shares, made once per
/// executable (see [`Executable`](crate::Executable)).
#[derive(Debug)]
pub(crate) struct PlannedProgram {
    pub(crate) program: Program,
    pub(crate) plan: Plan,
}

/// For each node that is an [`Fusion::Alias`] (with its types checked: `typed`), the
/// value it forwards (through aliases of aliases).
fn identity_slices(program: &Program, typed: &[bool]) -> Vec<Option<ValueId>> {
    let mut alias: Vec<Option<ValueId>> = vec![None; program.nodes.len()];
    for (i, node) in program.nodes.iter().enumerate() {
        let Op::DynamicSlice(sizes) = &node.op else {
            continue;
        };
        let Some(&o) = node.operands.first().filter(|o| o.index() < i) else {
            continue;
        };
        if typed[i] && program.nodes[o.index()].ty == node.ty && node.ty.shape == *sizes {
            alias[i] = Some(alias[o.index()].unwrap_or(o));
        }
    }
    alias
}

/// For each node, whether the op's shape rule, given the node types of the operands,
/// gives the node's type.
fn typed_nodes(program: &Program) -> Vec<bool> {
    program
        .nodes
        .iter()
        .map(|node| {
            let types: Option<Vec<_>> = node
                .operands
                .iter()
                .map(|o| program.nodes.get(o.index()).map(|n| &n.ty))
                .collect();
            types.is_some_and(|t| infer_type(&node.op, &t).is_ok_and(|ty| ty == node.ty))
        })
        .collect()
}

/// The `(add, dot)` pairs of [`Fusion::Accumulate`] given what each node reads
/// (`reads`, aliases resolved: `fusion`) and the program's `outputs`: an f32 `add`
/// node, not an alias, its types checked (`typed`), of two
/// distinct values, one a `dot_general` (not an alias, typed, of the add's type)
/// that no other node reads and that is no output, whose products add exactly
/// ([`kernels::dot_adds_in_place`](super::kernels::dot_adds_in_place): one block of
/// contracted elements), the other no `broadcast_in_dim` (a view the product cannot
/// add into). Each dot is in one pair at most (it has one reader).
fn accumulated_products(
    program: &Program,
    reads: &[Vec<ValueId>],
    outputs: &[ValueId],
    typed: &[bool],
    fusion: &[Fusion],
) -> Vec<(ValueId, ValueId)> {
    let mut readers = vec![0usize; program.nodes.len()];
    for o in reads.iter().flatten().chain(outputs) {
        if let Some(count) = readers.get_mut(o.index()) {
            *count += 1;
        }
    }
    let plain = |v: ValueId| typed[v.index()] && fusion[v.index()] == Fusion::No;
    let mut pairs = Vec::new();
    for (i, node) in program.nodes.iter().enumerate() {
        let add = ValueId(i as u32);
        let (Op::Binary(BinaryOp::Add), [x, y]) = (&node.op, reads[i].as_slice()) else {
            continue;
        };
        if !plain(add) || node.ty.dtype != DType::F32 || x == y {
            continue;
        }
        let is_product = |v: ValueId| {
            let dot = &program.nodes[v.index()];
            let Op::DotGeneral(dd) = &dot.op else {
                return false;
            };
            let shape = |k: usize| &program.ty(reads[v.index()][k]).shape;
            plain(v)
                && readers[v.index()] == 1
                && dot.ty == node.ty
                && reads[v.index()].len() == 2
                && super::kernels::dot_adds_in_place(dd, shape(0), shape(1))
        };
        let not_broadcast =
            |v: ValueId| !matches!(program.nodes[v.index()].op, Op::Broadcast { .. });
        if is_product(*x) && not_broadcast(*y) {
            pairs.push((add, *x));
        } else if is_product(*y) && not_broadcast(*x) {
            pairs.push((add, *y));
        }
    }
    pairs
}

/// For each node, whether it is a deferred broadcast: a `broadcast_in_dim` with its
/// types checked (`typed`), read (by `reads`) by at least one node, only by binary,
/// compare and select nodes and fusion roots (whose loops read views), and none of
/// `outputs` (the program's, aliases resolved).
fn deferred_broadcasts(
    program: &Program,
    typed: &[bool],
    reads: &[Vec<ValueId>],
    fusion: &[Fusion],
    outputs: &[ValueId],
) -> Vec<bool> {
    let mut deferred: Vec<bool> = program
        .nodes
        .iter()
        .zip(typed)
        .map(|(node, &typed)| typed && matches!(node.op, Op::Broadcast { .. }))
        .collect();
    let mut read = vec![false; program.nodes.len()];
    for ((node, values), fusion) in program.nodes.iter().zip(reads).zip(fusion) {
        let elementwise = match fusion {
            Fusion::Root(_) => true,
            Fusion::Accumulate(_) => false,
            _ => matches!(node.op, Op::Binary(_) | Op::Compare(_) | Op::Select),
        };
        for o in values {
            if let Some(slot) = deferred.get_mut(o.index()) {
                *slot &= elementwise;
                read[o.index()] = true;
            }
        }
    }
    for o in outputs {
        if let Some(slot) = deferred.get_mut(o.index()) {
            *slot = false;
        }
    }
    deferred.iter().zip(read).map(|(&d, r)| d && r).collect()
}

impl PlannedProgram {
    /// Plans `program`.
    pub(crate) fn new(program: Program) -> Self {
        PlannedProgram::donating(program, &[])
    }

    /// Plans `program` with the inputs of parameter indices `donated` consumed by the
    /// run ([`Plan::donating`]).
    pub(crate) fn donating(program: Program, donated: &[usize]) -> Self {
        let plan = Plan::donating(&program, donated);
        PlannedProgram { program, plan }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Builder, DotDims};

    /// A gradient sum `add(dot(a, w), c)` (`a` by rows or transposed, the dot first or
    /// second) is planned as one product adding into `c` where its `k` fits one block
    /// of contracted elements; not with a `k` of 300, nor when the dot is read again.
    #[test]
    fn products_summed_into_a_value_are_planned_where_they_add_exactly() {
        // On CPUs with AVX-512, `gemm` takes the transposed case and it is not planned (its
        // order is its own): the kernels of CPUs without it are pinned.
        crate::runtime::kernels::without_avx512(|| {
            for (k, read_again, planned) in [
                (64, false, true),
                (256, false, true),
                (300, false, false),
                (64, true, false),
            ] {
                for transposed in [false, true] {
                    for dot_first in [true, false] {
                        let b = Builder::new("gradient sum");
                        let a_shape = if transposed { [k, 128] } else { [128, k] };
                        let a = b.parameter("a", a_shape, DType::F32);
                        let w = b.parameter("w", [k, 96], DType::F32);
                        let c = b.parameter("c", [128, 96], DType::F32);
                        let dims = DotDims {
                            lhs_batch: vec![],
                            rhs_batch: vec![],
                            lhs_contracting: vec![usize::from(!transposed)],
                            rhs_contracting: vec![0],
                        };
                        let product = a.dot_general(&w, dims);
                        let sum = if dot_first {
                            product.add(&c)
                        } else {
                            c.add(&product)
                        };
                        let outputs = if read_again {
                            vec![&sum, &product]
                        } else {
                            vec![&sum]
                        };
                        let program = b.finish(&outputs).expect("traces");
                        let plan = Plan::new(&program);
                        let accumulating: Vec<usize> = (plan.steps.iter().enumerate())
                            .filter(|(_, s)| matches!(s.fusion, Fusion::Accumulate(_)))
                            .map(|(i, _)| i)
                            .collect();
                        let case = format!("k {k}, transposed {transposed}, dot first {dot_first}");
                        if planned {
                            let add = program.outputs[0].index();
                            assert_eq!(accumulating, [add], "{case}");
                            let dot = product.id().expect("a value").index();
                            assert_eq!(plan.steps[dot].fusion, Fusion::Inside, "{case}");
                            assert_eq!(plan.steps[add].reads.len(), 3, "{case}");
                        } else {
                            assert!(accumulating.is_empty(), "{case}");
                        }
                    }
                }
            }
        })
    }

    /// A reshape of dims of one element that only broadcasts in fused loops read
    /// (softmax's max and sum kept as columns, over rows long enough that the last
    /// divide is a loop alone; a column reshaped to a `[rows, 1]` matrix without its
    /// unit dim) is not computed: the loops read its operand. One read elsewhere too,
    /// or one that moves elements, is.
    #[test]
    fn reshapes_of_unit_dims_read_only_by_loops_are_not_computed() {
        let b = Builder::new("softmax");
        let x = b.parameter("x", [8, 512], DType::F32);
        let y = x.softmax(-1);
        let program = b.finish(&[&y]).expect("traces");
        let plan = Plan::new(&program);
        let reshapes: Vec<usize> = (program.nodes.iter().enumerate())
            .filter(|(_, n)| matches!(n.op, Op::Reshape(_)))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(reshapes.len(), 2);
        for &r in &reshapes {
            assert_eq!(plan.steps[r].fusion, Fusion::Alias, "{program}");
            assert!(plan.steps[r].reads.is_empty());
            assert_eq!(plan.steps[r].bytes, 0);
        }
        // `[8, 1, 1]` reshaped to `[8, 1]` (a unit dim removed, one kept) and to
        // `[1, 8]` (the unit dim moved), broadcast; `[2, 4]` reshaped to `[4, 2]` (not
        // unit dims alone): the first two are read through.
        let b = Builder::new("columns");
        let col = b.parameter("col", [8, 1, 1], DType::F32);
        let x = b.parameter("x", [8, 16], DType::F32);
        let pairs = b.parameter("pairs", [2, 4], DType::F32);
        let through = col.reshape([8, 1]).broadcast_in_dim([8, 16], &[0, 1]);
        let moved = col.reshape([1, 8]).broadcast_in_dim([8, 8], &[0, 1]);
        let swapped = pairs.reshape([4, 2]).broadcast_in_dim([4, 2, 3], &[0, 1]);
        let y = x.mul(&through).exp();
        let z = moved.add(&moved.scalar_like(1.0)).exp();
        let w = swapped.sub(&swapped.scalar_like(1.0)).exp();
        let read = col.reshape([8]);
        let kept = read.broadcast_in_dim([8, 16], &[0]).mul(&x).exp();
        let program = b.finish(&[&y, &z, &w, &kept, &read]).expect("traces");
        let plan = Plan::new(&program);
        let fusion_of = |t: &crate::ir::Tensor| {
            let Op::Broadcast { .. } = program.nodes[t.id().expect("a value").index()].op else {
                panic!("not a broadcast");
            };
            let reshape = program.nodes[t.id().expect("a value").index()].operands[0];
            plan.steps[reshape.index()].fusion
        };
        assert_eq!(fusion_of(&through), Fusion::Alias, "{program}");
        assert_eq!(fusion_of(&moved), Fusion::Alias, "{program}");
        assert_eq!(fusion_of(&swapped), Fusion::No, "{program}");
        let read = plan.steps[read.id().expect("a value").index()].fusion;
        assert_eq!(read, Fusion::No, "an output");
        // The loops read the operands where the reshapes would have put them.
        let values = |n: usize| (0..n).map(|v| v as f32 * 0.37 - 1.0).collect::<Vec<f32>>();
        let array = |shape: &[usize]| {
            let n = shape.iter().product();
            Literal::F32(ndarray::ArrayD::from_shape_vec(shape, values(n)).expect("fits"))
        };
        let inputs = [array(&[8, 1, 1]), array(&[8, 16]), array(&[2, 4])];
        let got = crate::runtime::interpret(&program, &inputs).expect("runs");
        let (col, x, pairs) = (values(8), values(128), values(8));
        let exp = crate::runtime::kernels::elementary::exp;
        let want: [Vec<f32>; 4] = [
            (0..128).map(|k| exp(x[k] * col[k / 16])).collect(),
            (0..64).map(|k| exp(col[k % 8] + 1.0)).collect(),
            (0..24).map(|k| exp(pairs[k / 3] - 1.0)).collect(),
            (0..128).map(|k| exp(col[k / 16] * x[k])).collect(),
        ];
        for (k, want) in want.iter().enumerate() {
            let got = got[k].as_f32().expect("f32").iter().copied();
            assert_eq!(
                got.map(f32::to_bits).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "output {k}"
            );
        }
    }
}
