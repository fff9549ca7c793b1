//! The execution plan of a [`Program`]: what the evaluation loop needs to know of each
//! node that does not depend on the inputs — where its value dies, which operands it
//! may take over, whether its types were checked, its bytes, the flow instance it reads
//! — worked out once per program (and its regions) instead of on every run.
//!
//! The plan holds no value and no address: it is `Send + Sync` and made once per
//! executable (see [`PlannedProgram`]); the reference interpreter makes one per call.

use std::collections::HashMap;

use crate::ir::{FlowInstance, Op, Program, ValueId, flow_instances, infer_type};

/// How the evaluation loop runs one program (see [`Plan::new`]).
#[derive(Debug)]
pub(crate) struct Plan {
    /// One per node, in node order.
    pub(super) steps: Vec<Step>,
    /// One per flow instance (regions and operands) of the program, not of its regions.
    pub(super) flows: Vec<FlowPlan>,
    /// The outputs in order, each with whether a later output repeats it (then the
    /// value is copied, not moved, into this one).
    pub(super) outputs: Vec<(ValueId, bool)>,
}

/// What the plan knows of one node.
#[derive(Debug)]
pub(super) struct Step {
    /// The bytes of the node's value (its type's size).
    pub(super) bytes: usize,
    /// For each operand, whether this node reads it last and only once (and it is no
    /// output): the loop may then hand the value over instead of lending it.
    pub(super) hand_over: Vec<bool>,
    /// The values dropped once this node is computed, each once: the operands it reads
    /// last, and its own value if nothing reads it and it is no output.
    pub(super) frees: Vec<ValueId>,
    /// Whether the op's shape rule, given the node types of the operands, gives the
    /// node's type: operands whose values have their node types then fit the kernel
    /// without a check at run time.
    pub(super) typed: bool,
    /// For a flow result: its instance in [`Plan::flows`].
    pub(super) flow: Option<usize>,
}

/// What the plan knows of one flow instance.
#[derive(Debug)]
pub(super) struct FlowPlan {
    /// For each result of the op: how many nodes read it, and its bytes (0 if none).
    pub(super) results: Vec<(usize, usize)>,
    /// The plans of the op's regions, in [`Flow::regions`](crate::ir::Flow::regions)
    /// order.
    pub(super) regions: Vec<Plan>,
}

impl Plan {
    /// The plan of `program` and, recursively, of its regions. Never fails: a node
    /// whose types do not fit its op is planned unchecked (`typed == false`), so the
    /// run reports it where the loop reaches it, as if there were no plan.
    pub(crate) fn new(program: &Program) -> Plan {
        let n = program.nodes.len();
        // For each value, the last node reading it (itself if none); `None` for outputs.
        let mut last: Vec<Option<usize>> = (0..n).map(Some).collect();
        for (i, node) in program.nodes.iter().enumerate() {
            for o in &node.operands {
                if let Some(slot) = last.get_mut(o.index()) {
                    *slot = Some(i);
                }
            }
        }
        for o in &program.outputs {
            if let Some(slot) = last.get_mut(o.index()) {
                *slot = None;
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
                let dies_here = |o: &ValueId| last.get(o.index()) == Some(&Some(i));
                let once = |o: &ValueId| node.operands.iter().filter(|&p| p == o).count() == 1;
                let mut frees: Vec<ValueId> = Vec::new();
                for o in node
                    .operands
                    .iter()
                    .chain(std::iter::once(&ValueId(i as u32)))
                {
                    if dies_here(o) && !frees.contains(o) {
                        frees.push(*o);
                    }
                }
                let types: Option<Vec<_>> = node
                    .operands
                    .iter()
                    .map(|o| program.nodes.get(o.index()).map(|n| &n.ty))
                    .collect();
                let typed =
                    types.is_some_and(|t| infer_type(&node.op, &t).is_ok_and(|ty| ty == node.ty));
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
                Step {
                    bytes: node.ty.size_in_bytes(),
                    hand_over: node
                        .operands
                        .iter()
                        .map(|o| dies_here(o) && once(o))
                        .collect(),
                    frees,
                    typed,
                    flow,
                }
            })
            .collect();
        let outputs = program
            .outputs
            .iter()
            .enumerate()
            .map(|(k, &o)| (o, program.outputs[k + 1..].contains(&o)))
            .collect();
        Plan {
            steps,
            flows,
            outputs,
        }
    }
}

/// A program with its plan: what every device thread of a run shares, made once per
/// executable (see [`Executable`](crate::Executable)).
#[derive(Debug)]
pub(crate) struct PlannedProgram {
    pub(crate) program: Program,
    pub(crate) plan: Plan,
}

impl PlannedProgram {
    /// Plans `program`.
    pub(crate) fn new(program: Program) -> Self {
        let plan = Plan::new(&program);
        PlannedProgram { program, plan }
    }
}
