//! The liveness walk of a per-device program: the bytes the evaluation loop holds at
//! each node, following the execution plan ([`Plan`]: which values each node drops,
//! which operands it takes over, which broadcasts are views, which nodes a fused loop
//! computes) and the runtime's buffer reuse. The plan's buffer-pool budget comes from
//! it ([`pool_model`]), and so does the memory analysis
//! ([`MemoryAnalysis`](crate::analysis::MemoryAnalysis)), which explains the model.

use crate::ir::{ConvConfig, DType, Flow, Node, Op, Program, ValueId, num_elements};

use super::buffers::Requests;
use super::plan::{Fusion, Plan};

/// The bytes of `program`'s inputs that a run with `plan` borrows for its whole
/// length: all but the donated ones (see [`Plan::donated`]).
pub(crate) fn lent_input_bytes(program: &Program, plan: &Plan) -> usize {
    (program.params.iter().enumerate())
        .filter(|&(i, _)| !plan.donated.get(i).copied().unwrap_or(false))
        .map(|(_, &p)| program.ty(p).size_in_bytes())
        .sum()
}

/// What the device's buffer pool knows of a run of `program` with `plan` (see
/// `buffers`): its budget ([`Plan::budget`]: the analysis's peak, the walk's bytes plus
/// the lent inputs) and, for each node, the bytes held as the analysis models them,
/// inputs included (each step's `held`): while the node runs (its result included, its
/// kernel's scratch not) and once it has dropped what it drops; and the new buffers
/// the nodes ask for ([`Requests`]).
pub(crate) fn pool_model(program: &Program, plan: &Plan) -> PoolModel {
    let inputs = lent_input_bytes(program, plan);
    let walk = Walk::of(program, plan);
    let held = (walk.buffers.iter())
        .map(|&[during, after]| [inputs + during, inputs + after])
        .collect();
    PoolModel {
        budget: walk.max + inputs,
        held,
        requests: Requests::new(program.nodes.len(), walk.requests),
    }
}

/// What the buffer pool knows of a run (see [`pool_model`]).
pub(crate) struct PoolModel {
    /// The most bytes live values and pooled buffers may hold together.
    pub(crate) budget: usize,
    /// For each node, the bytes held while it runs and once it has dropped what it drops.
    pub(crate) held: Vec<[usize; 2]>,
    /// The new buffers the run asks for, node by node.
    pub(crate) requests: Requests,
}

/// The liveness walk of one program: the bytes the loop owns — computed values and
/// donated inputs (from the start of the run until their last use); lent inputs
/// excluded.
pub(crate) struct Walk {
    /// For each node: the computed bytes held while it runs.
    pub(crate) held: Vec<usize>,
    /// For each node: the computed bytes in buffers (no copies) while it runs and once
    /// it has dropped what it drops.
    pub(crate) buffers: Vec<[usize; 2]>,
    /// The first node with the most bytes held.
    pub(crate) peak: Option<ValueId>,
    /// The most computed bytes held at once.
    pub(crate) max: usize,
    /// At the peak: the copies the node makes and the results of control flow waiting
    /// for their nodes.
    pub(crate) transient: usize,
    /// At the peak: the computed values holding a buffer, with their bytes (a value
    /// written in place of its operand holds the operand's buffer).
    pub(crate) live: Vec<(ValueId, usize)>,
    /// The new buffers the nodes' results take, in node order: the node's position,
    /// the result's dtype and elements (the buffer pool's [`Requests`]).
    pub(crate) requests: Vec<(usize, DType, usize)>,
}

impl Walk {
    pub(crate) fn of(program: &Program, plan: &Plan) -> Walk {
        let n = program.nodes.len();
        // The bytes of the buffer each value holds now (0: none, or lent).
        let mut buffer = vec![0usize; n];
        // Whether the loop owns the value (it computed it): only then can a node take
        // it over.
        let mut owned = vec![false; n];
        let mut live = 0usize;
        // Donated inputs are the loop's from the start (their parameter nodes may come
        // late: an optimizer's state is declared after the model).
        for (i, &p) in program.params.iter().enumerate() {
            if plan.donated.get(i).copied().unwrap_or(false) {
                buffer[p.index()] = plan.steps[p.index()].bytes;
                owned[p.index()] = true;
                live += buffer[p.index()];
            }
        }
        // Results of flow instances computed and not yet taken by their nodes.
        let mut pending: Vec<Option<Vec<usize>>> = vec![None; plan.flows.len()];
        let mut pending_bytes = 0usize;
        let mut walk = Walk {
            held: Vec::with_capacity(n),
            buffers: Vec::with_capacity(n),
            peak: None,
            max: 0,
            transient: 0,
            live: Vec::new(),
            requests: Vec::new(),
        };
        for (i, (node, step)) in program.nodes.iter().zip(&plan.steps).enumerate() {
            if matches!(step.fusion, Fusion::Inside | Fusion::Result | Fusion::Alias) {
                // Computed by its group's loop at the root, or read as its operand.
                walk.held.push(live + pending_bytes);
                walk.buffers.push([live + pending_bytes; 2]);
                continue;
            }
            let read_bytes = |k: usize| program.ty(step.reads[k]).size_in_bytes();
            let taken = |k: usize| step.hand_over[k] && owned[step.reads[k].index()];
            let mut copies = 0;
            // The operands a control-flow instance copies, held while its regions run.
            let mut instance_copies = 0;
            // Whether the node computes a value into a buffer, and the read value whose
            // buffer it takes over.
            let (mut computed, mut reuse) = (false, None);
            match (&node.op, step.flow, step.fusion) {
                (Op::Parameter { .. } | Op::Constant(_), _, _) => {}
                // Bound as a constant of the plan.
                _ if plan.folded[i].is_some() => {}
                _ if step.deferred => {}
                (_, _, Fusion::Root(k)) => {
                    // Each result in order takes the buffer of the next leaf handed
                    // over that the loop writes in place, else a new one (as
                    // `Group::run` does).
                    let group = &plan.groups[k];
                    let in_place: Vec<usize> = (0..step.reads.len())
                        .filter(|&j| taken(j) && group.writes_in_place(j))
                        .map(|j| step.reads[j].index())
                        .collect();
                    let mut leaves = in_place.into_iter();
                    for r in &group.results {
                        let r = r.index();
                        buffer[r] = match leaves.next() {
                            Some(leaf) => std::mem::take(&mut buffer[leaf]),
                            None => {
                                let ty = &program.nodes[r].ty;
                                walk.requests.push((i, ty.dtype, num_elements(&ty.shape)));
                                live += plan.steps[r].bytes;
                                plan.steps[r].bytes
                            }
                        };
                        owned[r] = true;
                    }
                }
                (_, _, Fusion::Accumulate(dot)) => {
                    // The product adds into the accumulator's buffer when handed over
                    // (else a new one), with its product's scratch.
                    reuse = taken(2).then_some(2);
                    copies = kernel_scratch(program, &program.nodes[dot.index()]);
                    computed = true;
                }
                (Op::Flow { flow, result }, Some(instance), _) => {
                    let flow_plan = &plan.flows[instance];
                    if pending[instance].is_none() {
                        let results: Vec<usize> = (flow_plan.results.iter())
                            .map(|&(reads, bytes)| if reads > 0 { bytes } else { 0 })
                            .collect();
                        let regions = flow_plan.regions.iter().zip(flow.regions());
                        let inner = regions
                            .map(|(plan, region)| Walk::of(region, plan).max)
                            .max()
                            .unwrap_or(0);
                        // The instance copies its operands, but a scan reads its stacked
                        // operands in place; each iteration of a scan hands its body
                        // another copy of the carried values and captures and a slice
                        // of each stacked operand (see `runtime::flow`).
                        let (in_place, length) = match flow.as_ref() {
                            Flow::Scan {
                                carried,
                                stacked,
                                length,
                                ..
                            } => (*carried..carried + stacked, Some((*length).max(1))),
                            _ => (0..0, None),
                        };
                        let kept: usize = (0..step.reads.len())
                            .filter(|k| !in_place.contains(k))
                            .map(read_bytes)
                            .sum();
                        let arguments = length.map_or(0, |length| {
                            kept + in_place.clone().map(read_bytes).sum::<usize>() / length
                        });
                        copies = kept + arguments + inner;
                        instance_copies = kept;
                        pending_bytes += results.iter().sum::<usize>();
                        pending[instance] = Some(results);
                    }
                    let slot = pending[instance].as_mut().and_then(|r| r.get_mut(*result));
                    let bytes = slot.map_or(0, std::mem::take);
                    pending_bytes -= bytes;
                    buffer[i] = bytes;
                    live += bytes;
                    owned[i] = true;
                }
                (op, _, _) => {
                    reuse = (step.typed)
                        .then(|| in_place_operand(op, node, &step.reads, program, &taken))
                        .flatten();
                    if op.is_collective() {
                        copies = reduction_scratch(node);
                        if !step.reads.is_empty() && !taken(0) {
                            copies += read_bytes(0);
                        }
                    }
                    match op {
                        Op::Convolution(config) => {
                            copies = convolution_bytes(program, node, config)
                        }
                        // f32 products: the operand copies and packing buffers they
                        // allocate outside the pool (narrow ones: not modelled).
                        Op::DotGeneral(_) if node.ty.dtype == DType::F32 => {
                            copies = kernel_scratch(program, node)
                        }
                        _ => {}
                    }
                    computed = true;
                }
            }
            if computed {
                match reuse {
                    // The operand's buffer becomes the result's: nothing new.
                    Some(k) => buffer[i] = std::mem::take(&mut buffer[step.reads[k].index()]),
                    None => {
                        walk.requests
                            .push((i, node.ty.dtype, num_elements(&node.ty.shape)));
                        buffer[i] = step.bytes;
                        live += step.bytes;
                    }
                }
                owned[i] = true;
            }
            let held = live + copies + pending_bytes;
            if walk.peak.is_none() || held > walk.max {
                walk.peak = Some(ValueId(i as u32));
                walk.max = held;
                walk.transient = copies + pending_bytes;
                walk.live = (0..n)
                    .filter(|&v| buffer[v] > 0)
                    .map(|v| (ValueId(v as u32), buffer[v]))
                    .collect();
            }
            walk.held.push(held);
            let during = live + pending_bytes + instance_copies;
            for o in &step.drops {
                live -= std::mem::take(&mut buffer[o.index()]);
            }
            walk.buffers.push([during, live + pending_bytes]);
        }
        walk
    }
}

/// An estimate of the scratch space `node`'s kernel may hold besides its operands and
/// result, which the buffer pool leaves free while the node runs (see
/// [`Plan::budget`]): a convolution's padded input, packed kernel and tables, a
/// collective's copy of its operand (and a reduction's accumulators), the flat
/// positions (an `Option<usize>` per element) of a gather's result or a scatter's
/// updates, a dot's operands where they are copied and its packing buffers
/// (see `kernels::dot_scratch_bytes`); none for elementwise ops, data movement
/// (transposes, slices, pads, concatenations, reshapes), broadcasts, iotas, random bits
/// and control flow (its regions' loops reserve their own); a copy of the operands and
/// of the result for any other op (an operand copied to standard layout, say). An
/// estimate above what the kernel holds costs time, not memory: the pool frees that
/// many bytes of its buffers before the node, and later results find them gone.
pub(crate) fn kernel_scratch(program: &Program, node: &Node) -> usize {
    let operand = |k: usize| {
        node.operands
            .get(k)
            .map_or(0, |&o| program.ty(o).size_in_bytes())
    };
    let positions = |elements: usize| elements * size_of::<Option<usize>>();
    match &node.op {
        Op::Convolution(config) => convolution_bytes(program, node, config),
        // f32 and i32: the operands copied where their contracting dims do not merge,
        // and the matmul's packing buffers.
        Op::DotGeneral(dd) if !node.ty.dtype.is_narrow_float() => {
            match (node.operands.first(), node.operands.get(1)) {
                (Some(&l), Some(&r)) => super::kernels::dot_scratch_bytes(
                    dd,
                    &program.ty(l).shape,
                    &program.ty(r).shape,
                    node.ty.dtype.size_in_bytes(),
                ),
                _ => 0,
            }
        }
        // bf16 and f16 compute in f32: the operands converted (twice their bytes, at
        // most), the f32 product and its scratch.
        Op::DotGeneral(_) => 2 * (operand(0) + operand(1)) + node.ty.size_in_bytes(),
        op if op.is_collective() => operand(0) + reduction_scratch(node),
        Op::Gather(_) => positions(num_elements(&node.ty.shape)),
        Op::Scatter { .. } => {
            (node.operands.get(2)).map_or(0, |&u| positions(num_elements(&program.ty(u).shape)))
        }
        Op::Parameter { .. }
        | Op::Constant(_)
        | Op::Iota { .. }
        | Op::RandomBits { .. }
        | Op::Broadcast { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert(_)
        | Op::ShardingConstraint
        | Op::PropagationBarrier(_)
        | Op::Flow { .. } => 0,
        // Data movement writes each element of its (pooled) result straight from its
        // operand, in place where it is handed over (`reshape`, `dynamic_update_slice`).
        Op::Transpose(_)
        | Op::Slice { .. }
        | Op::DynamicSlice(_)
        | Op::Pad { .. }
        | Op::Concatenate(_)
        | Op::Reverse(_)
        | Op::Reshape(_)
        | Op::DynamicUpdateSlice => 0,
        // A copy of its operands (regrouped, or in standard layout) and of its result.
        _ => (0..node.operands.len()).map(operand).sum::<usize>() + node.ty.size_in_bytes(),
    }
}

/// The accumulators a reduction collective holds besides its operand and result (see
/// `communicator::reduction_scratch_bytes`); none for other ops.
fn reduction_scratch(node: &Node) -> usize {
    node.op.collective_group().map_or(0, |group| {
        let elements = num_elements(&node.ty.shape);
        super::communicator::reduction_scratch_bytes(&node.op, node.ty.dtype, elements, group.size)
    })
}

/// The scratch the convolution kernel holds besides its operands and result, at most
/// (`kernels::convolution_scratch`).
fn convolution_bytes(program: &Program, node: &Node, config: &ConvConfig) -> usize {
    let [Some(input), Some(kernel)] = [0, 1].map(|k| node.operands.get(k).map(|&o| program.ty(o)))
    else {
        return 0;
    };
    let size = node.ty.dtype.size_in_bytes();
    super::kernels::convolution_scratch(config, &input.shape, &kernel.shape, &node.ty.shape, size)
}

/// The operand an elementwise kernel overwrites with its result (see the elementwise
/// kernels): the first one of `operands` (what the node reads) taken over (`taken(k)`)
/// whose type is the result's.
fn in_place_operand(
    op: &Op,
    node: &Node,
    operands: &[ValueId],
    program: &Program,
    taken: &dyn Fn(usize) -> bool,
) -> Option<usize> {
    let candidates: &[usize] = match op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Convert(_)
        | Op::ShardingConstraint
        | Op::PropagationBarrier(_) => &[0, 1],
        Op::Select => &[1, 2],
        _ => return None,
    };
    candidates
        .iter()
        .copied()
        .find(|&k| k < operands.len() && taken(k) && program.ty(operands[k]) == &node.ty)
}
