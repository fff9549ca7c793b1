//! The reference interpreter: runs a [`Program`] on one device, node by node, with the
//! local [`kernels`](super::kernels). Its results are the oracle for every test.

use std::borrow::Cow;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::error::{Error, InputProblem, Result};
use crate::ir::{Literal, Node, Op, Program, TensorType, ValueId};

use super::buffers;
use super::deadline;
use super::flow::run_flow;
use super::kernels;
use super::kernels::{Operand, Operands};
use super::memory::available_memory;
use super::plan::{Fusion, Plan, PlannedProgram, Step};
use super::profile;

/// Runs `program` on `inputs` (one per parameter, in parameter order) and returns its
/// outputs in order.
///
/// Inputs are checked first: a wrong count, dtype or shape is an [`Error::Input`] naming
/// the parameter's index and name, expected vs. given. A kernel failure is an
/// [`Error::Runtime`] naming the value, op and source location. Each intermediate value
/// is dropped right after its last use, so peak memory is that of the live values.
/// Does not panic on any program that passes [`crate::ir::verify`].
///
/// The live values may take at most [`available_memory`] bytes (see
/// [`interpret_with_memory_limit`]).
pub fn interpret(program: &Program, inputs: &[Literal]) -> Result<Vec<Literal>> {
    interpret_with_memory_limit(program, inputs, available_memory())
}

/// [`interpret`] with the values live at any point limited to `memory_limit` bytes: a
/// value that would exceed it is an [`Error::OutOfMemory`] naming the value, op and
/// source location, raised before the value is allocated.
pub fn interpret_with_memory_limit(
    program: &Program,
    inputs: &[Literal],
    memory_limit: usize,
) -> Result<Vec<Literal>> {
    crate::ir::verify(program)?;
    let plan = Plan::new(program);
    execute(program, &plan, lend(inputs), memory_limit, eval_kernel)
}

/// [`interpret`] cancelled once it has run for `deadline`: an
/// [`Error::DeadlineExceeded`] naming the node it was at and the iteration of the
/// innermost loop (a `while_loop` that never ends, say). A zero deadline is an
/// [`Error::ZeroDuration`].
pub fn interpret_with_deadline(
    program: &Program,
    inputs: &[Literal],
    deadline: Duration,
) -> Result<Vec<Literal>> {
    let deadline = deadline::positive("interpret_with_deadline", deadline)?;
    let _deadline = deadline::DeadlineGuard::start(Instant::now(), Some(deadline));
    interpret(program, inputs)
}

/// `inputs` lent to a run (none donated).
pub(crate) fn lend(inputs: &[Literal]) -> Vec<Cow<'_, Literal>> {
    inputs.iter().map(Cow::Borrowed).collect()
}

/// A program planned once (its fusion groups included) and run on the calling thread
/// as [`interpret`] runs it, which plans on every call: for timing the fused loops
/// without the planning (`gspmd-core/benches/fusion.rs`).
pub struct Prepared {
    planned: PlannedProgram,
    /// The bound of the live values' bytes: [`available_memory`] when planned.
    memory_limit: usize,
}

impl Prepared {
    /// Plans `program`.
    pub fn new(program: &Program) -> Self {
        Prepared {
            planned: PlannedProgram::new(program.clone()),
            memory_limit: available_memory(),
        }
    }

    /// The outputs of the program on `inputs`, as [`interpret`] gives them (the same
    /// errors; bitwise the same values).
    pub fn run(&self, inputs: &[Literal]) -> Result<Vec<Literal>> {
        execute(
            &self.planned.program,
            &self.planned.plan,
            lend(inputs),
            self.memory_limit,
            eval_kernel,
        )
    }
}

/// The kernel of `node` on `operands` (drained): unchecked ([`kernels::eval_typed`])
/// if `typed` (the plan checked the node and the operands have their node types), else
/// checked ([`kernels::eval`]), with the same errors as without a plan.
pub(crate) fn eval_kernel(
    node: &Node,
    operands: &mut Operands<'_>,
    typed: bool,
) -> Result<Literal, String> {
    if typed {
        kernels::eval_typed(&node.op, operands, &node.ty)
    } else {
        let values = operands
            .drain(..)
            .map(Operand::into_value)
            .collect::<Result<Vec<_>, String>>()?;
        let refs: Vec<&Literal> = values.iter().map(AsRef::as_ref).collect();
        kernels::eval(&node.op, &refs, &node.ty)
    }
}

/// The evaluation loop shared by the reference interpreter and the per-device runtime:
/// checks `inputs` (one per parameter: owned exactly for the parameters the plan marks
/// [donated](Plan::donated), which the loop may then write into at their last use and
/// drops there; lent otherwise), binds parameters and constants (and the values the plan
/// folded, [`Plan::folded`], as constants), computes every other
/// node with
/// `eval` (an `Err` becomes an [`Error::Runtime`] naming the node), frees each value
/// after its last use, and returns the outputs. `plan` is [`Plan::new`] of `program`.
///
/// `eval` gets the node, its operands (the loop's list, lent mutably: `eval` drains
/// what it takes, so the inline list of about 2 KB is not moved from call to call) —
/// each handed over by value ([`Cow::Owned`]) when this node is its last use and it
/// was computed by the loop, else lent; a broadcast the plan deferred as its operand's
/// view — and whether they
/// fit the node unchecked (the plan's type check passed and every operand has its
/// node's type; see [`kernels::eval_typed`]). A deferred broadcast whose operand does
/// not have its node's type is materialised like any node.
///
/// Memory: every live value counts (parameters and constants too), by its type's size.
/// Before a node's value is bound or computed, the live bytes plus its bytes are checked
/// against `memory_limit`, with the scratch its kernel holds while it runs (as the
/// memory analysis estimates it: [`Step::scratch`]); over it is an
/// [`Error::OutOfMemory`] for that node, so no allocation beyond the limit is
/// attempted. An operand handed over still counts until the node is computed.
///
/// Before each node, a run past its deadline (see `super::deadline`) stops with an
/// [`Error::DeadlineExceeded`] naming the node.
///
/// Control flow ([`Op::Flow`]) runs its regions through this same loop with the same
/// `eval` (so collectives inside a loop body run once per iteration), each region run
/// limited to the bytes left by the live values. The op runs once per instance (its
/// regions and operands): the first of its result nodes computes all results, the
/// others take theirs; results waiting for their node count as live (a scan's
/// residuals kept for the backward pass are), and the instance is dropped once every
/// result was taken.
///
/// A fusion group's loop runs at its root and binds every result of the group at once:
/// the root's value and those of the members the plan marks [`Fusion::Result`] (passed
/// over at their positions, read only after the root); the root's check against the
/// memory limit counts all their bytes.
pub(crate) fn execute(
    program: &Program,
    plan: &Plan,
    inputs: Vec<Cow<'_, Literal>>,
    memory_limit: usize,
    mut eval: impl FnMut(&Node, &mut Operands<'_>, bool) -> Result<Literal, String>,
) -> Result<Vec<Literal>> {
    let headroom = buffers::headroom(plan.budget, memory_limit);
    let _run = buffers::start_run(plan.budget + headroom, 0);
    execute_dyn(program, plan, inputs, memory_limit, 0, &mut eval)
}

/// The results of flow instances (by index in [`Plan::flows`]) computed for one result
/// node and waiting for the others, each with how many of the instance's result nodes
/// still read it.
type Pending = HashMap<usize, Vec<(Option<Literal>, usize)>>;

/// Computes one node from its operands (see [`execute`]; an `Err` message on failure).
type Eval<'a> = dyn FnMut(&Node, &mut Operands<'_>, bool) -> Result<Literal, String> + 'a;

/// [`execute`] with the evaluator as a trait object, so that regions recurse; `outer`
/// is the bytes held in the loops this one runs inside (0 for a program, what the
/// caller's plan holds at the flow node for a region), so the pool's budget counts
/// them (see [`buffers`](super::buffers) and [`Step::held`]).
fn execute_dyn<'a>(
    program: &'a Program,
    plan: &Plan,
    inputs: Vec<Cow<'a, Literal>>,
    memory_limit: usize,
    outer: usize,
    eval: &mut Eval<'_>,
) -> Result<Vec<Literal>> {
    check_inputs(program, &inputs)?;
    let _following = buffers::follow(&plan.requests);
    let mut inputs: Vec<Option<Cow<'a, Literal>>> = inputs.into_iter().map(Some).collect();
    let mut pending: Pending = HashMap::new();
    let mut values: Vec<Option<Cow<'_, Literal>>> = vec![None; program.nodes.len()];
    // The deferred broadcasts computed as views of their operands (no value).
    let mut views = vec![false; program.nodes.len()];
    let mut live: usize = 0;
    let most_reads = plan.steps.iter().map(|s| s.reads.len()).max();
    let mut taken = Vec::with_capacity(most_reads.unwrap_or(0));
    for (i, (node, step)) in program.nodes.iter().zip(&plan.steps).enumerate() {
        let v = ValueId(i as u32);
        let fail = |message: String| Error::Runtime {
            value: v,
            op: node.op.name(),
            location: node.location,
            message,
        };
        if matches!(step.fusion, Fusion::Inside | Fusion::Result | Fusion::Alias) {
            // Computed by its group's loop at the root, or its readers read its operand.
            continue;
        }
        let _timer = profile::Timer::start(program, plan, i);
        // A run past its deadline stops here, naming this node.
        deadline::check(node.op.name(), node.location)?;
        // A fusion root computes every result of its group.
        let bytes = match step.fusion {
            Fusion::Root(k) => plan.groups.get(k).map_or(step.bytes, |g| {
                g.results.iter().map(|r| plan.steps[r.index()].bytes).sum()
            }),
            _ => step.bytes,
        };
        // The kernel's scratch is allocated beside its result while it runs.
        if live.saturating_add(bytes).saturating_add(step.scratch) > memory_limit {
            return Err(Error::OutOfMemory {
                value: v,
                op: node.op.name(),
                location: node.location,
                bytes,
                scratch: step.scratch,
                live,
                limit: memory_limit,
            });
        }
        live += bytes;
        let elements = node.ty.shape.iter().product();
        buffers::reserve(
            outer + step.held[0],
            step.scratch,
            node.ty.dtype,
            elements,
            i,
        );
        let folded = plan.folded.get(i).and_then(Option::as_ref);
        let value = match (&node.op, folded) {
            (Op::Parameter { index, .. }, _) => (inputs.get_mut(*index))
                .and_then(Option::take)
                .ok_or_else(|| fail(format!("no input for parameter {index}")))?,
            (Op::Constant(lit), _) | (_, Some(lit)) => Cow::Borrowed(lit),
            _ => {
                let available = |o: &&ValueId| {
                    matches!(values.get(o.index()), Some(Some(_))) || views[o.index()]
                };
                if let Some(o) = step.reads.iter().find(|o| !available(o)) {
                    return Err(fail(format!("operand {o} is not available")));
                }
                let source_fits = |o: &ValueId| {
                    values[o.index()]
                        .as_deref()
                        .is_some_and(|x| kernels::has_type(x, &program.nodes[o.index()].ty))
                };
                if step.deferred && step.reads.first().is_some_and(source_fits) {
                    views[i] = true;
                    continue_after(step, plan, &mut values, &mut views, &mut live, outer);
                    continue;
                }
                // The operands a kernel drops (see `lend_spare`), declared before the
                // operands that borrow them.
                let mut spare = SmallVec::new();
                // Filled in place (not returned): the inline list is not moved.
                let mut operands = Operands::new();
                gather_operands(
                    program,
                    plan,
                    step,
                    &mut values,
                    &views,
                    &mut taken,
                    &mut operands,
                )
                .ok_or_else(|| fail("a viewed operand is not available".into()))?;
                match (&node.op, step.flow, step.fusion) {
                    (_, _, Fusion::Root(k)) => {
                        let group = plan.groups.get(k);
                        let group = group.ok_or_else(|| fail("no fusion group".into()))?;
                        // The leaves handed over that the loop will not write a
                        // result into: lent to it, then pooled.
                        let root_ty = &node.ty;
                        let mut in_place = 0;
                        lend_spare(&mut operands, &mut spare, |k, x| {
                            let fits = in_place < group.results.len()
                                && group.writes_in_place(k)
                                && kernels::has_type(x, root_ty);
                            in_place += usize::from(fits);
                            fits
                        });
                        let mut results = SmallVec::new();
                        let run = group.run(&mut operands, &mut results);
                        drop(operands);
                        spare.into_iter().for_each(buffers::release);
                        run.map_err(fail)?;
                        // The root's value is the last; the others are bound now.
                        let root = results.pop().ok_or_else(|| fail("no result".into()))?;
                        for (r, lit) in group.results.iter().zip(results.drain(..)) {
                            values[r.index()] = Some(Cow::Owned(lit));
                        }
                        Cow::Owned(root)
                    }
                    (_, _, Fusion::Accumulate(dot)) => {
                        let Op::DotGeneral(dd) = &program.nodes[dot.index()].op else {
                            return Err(fail(format!("{dot} is not a product")));
                        };
                        Cow::Owned(kernels::dot_general_accumulate(dd, operands).map_err(fail)?)
                    }
                    (Op::Flow { flow, result }, Some(instance), _) => {
                        let flow_plan = &plan.flows[instance];
                        let size_of = |j: usize| flow_plan.results.get(j).map_or(0, |r| r.1);
                        let reads_of = |j: usize| flow_plan.results.get(j).map_or(0, |r| r.0);
                        let results = match pending.entry(instance) {
                            Entry::Occupied(slot) => slot.into_mut(),
                            Entry::Vacant(slot) => {
                                let left = memory_limit - live;
                                let enclosing = outer + step.held[0];
                                let regions = flow.regions();
                                let mut run = |region: &Program, args: &[Literal], limit| {
                                    let fresh;
                                    let region_plan =
                                        match regions.iter().position(|r| std::ptr::eq(*r, region))
                                        {
                                            Some(j) => &flow_plan.regions[j],
                                            None => {
                                                fresh = Plan::new(region);
                                                &fresh
                                            }
                                        };
                                    execute_dyn(
                                        region,
                                        region_plan,
                                        lend(args),
                                        limit,
                                        enclosing,
                                        eval,
                                    )
                                };
                                let operands = operands
                                    .into_iter()
                                    .map(Operand::into_value)
                                    .collect::<Result<Vec<_>, String>>()
                                    .map_err(&fail)?;
                                let refs: Vec<&Literal> =
                                    operands.iter().map(AsRef::as_ref).collect();
                                let all = run_flow(flow, &refs, left, &mut run, &fail)?;
                                // Results waiting for their nodes are live; a result no
                                // node reads is dropped now.
                                let held: usize = (0..all.len())
                                    .filter(|&j| reads_of(j) > 0)
                                    .map(size_of)
                                    .sum();
                                if live.saturating_add(held) > memory_limit {
                                    return Err(Error::OutOfMemory {
                                        value: v,
                                        op: node.op.name(),
                                        location: node.location,
                                        bytes: held,
                                        scratch: 0,
                                        live,
                                        limit: memory_limit,
                                    });
                                }
                                live += held;
                                let all = all.into_iter().enumerate();
                                slot.insert(
                                    all.map(|(j, r)| ((reads_of(j) > 0).then_some(r), reads_of(j)))
                                        .collect(),
                                )
                            }
                        };
                        // The last node reading a result takes it (the waiting copy
                        // stops counting); earlier ones copy it.
                        let value = results.get_mut(*result).and_then(|(r, left)| {
                            *left = left.saturating_sub(1);
                            if *left == 0 {
                                live -= size_of(*result);
                                r.take()
                            } else {
                                r.clone()
                            }
                        });
                        if results.iter().all(|(r, _)| r.is_none()) {
                            pending.remove(&instance);
                        }
                        Cow::Owned(value.ok_or_else(|| fail(format!("no result {result}")))?)
                    }
                    _ => {
                        let typed = step.typed
                            && operands.iter().zip(&node.operands).all(|(x, o)| match x {
                                Operand::Value(x) => {
                                    kernels::has_type(x, &program.nodes[o.index()].ty)
                                }
                                // Its operand was checked when it was deferred.
                                Operand::Broadcast { .. } => true,
                            });
                        // An elementwise kernel writes its result into the first
                        // operand handed over that has the result's type (see
                        // `liveness::in_place_operand`); the others it would drop:
                        // lent to it, then pooled.
                        let candidates = match &node.op {
                            Op::Select => Some(1..3),
                            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Convert(_) => {
                                Some(0..2)
                            }
                            _ => None,
                        };
                        let mut found = false;
                        lend_spare(&mut operands, &mut spare, |k, x| {
                            let Some(candidates) = &candidates else {
                                return true;
                            };
                            let keep =
                                !found && candidates.contains(&k) && kernels::has_type(x, &node.ty);
                            found |= keep;
                            keep
                        });
                        let value = eval(node, &mut operands, typed);
                        drop(operands);
                        spare.into_iter().for_each(buffers::release);
                        Cow::Owned(value.map_err(fail)?)
                    }
                }
            }
        };
        values[i] = Some(value);
        continue_after(step, plan, &mut values, &mut views, &mut live, outer);
    }
    let mut outputs = Vec::with_capacity(plan.outputs.len());
    for (k, &(o, again)) in plan.outputs.iter().enumerate() {
        let slot = values.get_mut(o.index());
        let lit = match slot {
            Some(slot) if again => slot.clone(),
            Some(slot) => slot.take(),
            None => None,
        };
        let lit = lit.ok_or_else(|| Error::Runtime {
            value: o,
            op: "output",
            location: crate::ir::Location::synthetic(),
            message: format!("output {k} is not a computed value"),
        })?;
        outputs.push(lit.into_owned());
    }
    Ok(outputs)
}

/// `operands` with each one handed over (owned) that `keeps(k, value)` rejects moved
/// into `spare` and lent instead, in place (the ~2 KB of inline operands is not moved):
/// a kernel drops the operands it takes over and does not write its result into, where
/// the caller gives them to the pool ([`buffers::release`]) once the kernel has run.
fn lend_spare<'s>(
    operands: &mut Operands<'s>,
    spare: &'s mut SmallVec<[Literal; 4]>,
    mut keeps: impl FnMut(usize, &Literal) -> bool,
) {
    let mut lent: SmallVec<[usize; 4]> = SmallVec::new();
    for (k, x) in operands.iter_mut().enumerate() {
        if let Operand::Value(Cow::Owned(lit)) = x
            && !keeps(k, lit)
        {
            // Its place is held by an empty array until `spare` is complete.
            spare.extend(x.take_owned());
            lent.push(k);
        }
    }
    let spare: &'s SmallVec<[Literal; 4]> = spare;
    for (&k, lit) in lent.iter().zip(spare) {
        operands[k] = Operand::Value(Cow::Borrowed(lit));
    }
}

/// Drops the values `step` drops (the buffers of those the loop owns go to the pool),
/// and stops counting the bytes it frees; tells the pool the bytes now held
/// ([`Step::held`]), `outer` (those of enclosing loops) included.
fn continue_after(
    step: &Step,
    plan: &Plan,
    values: &mut [Option<Cow<'_, Literal>>],
    views: &mut [bool],
    live: &mut usize,
    outer: usize,
) {
    for o in &step.frees {
        *live -= plan.steps[o.index()].bytes;
    }
    buffers::set_live(outer + step.held[1]);
    for o in &step.drops {
        if let Some(Cow::Owned(lit)) = values[o.index()].take() {
            buffers::give(lit);
        }
        views[o.index()] = false;
    }
}

/// Pushes the values `step` reads (each present in `values` or in `views`) onto
/// `operands` (empty): each one whose `hand_over` is set and that the loop owns is
/// moved out of `values`, the others are lent; a view is its broadcast's operand (as
/// `plan` resolves it) with the broadcast's shape and dims. `None` if a view's operand
/// is not in `values`.
///
/// `taken` is scratch space the loop keeps across nodes (left empty), so that moving
/// the handed-over values out allocates nothing; `operands` is the caller's, filled in
/// place, so the inline list (about 2 KB) is not moved.
fn gather_operands<'v>(
    program: &'v Program,
    plan: &Plan,
    step: &Step,
    values: &'v mut [Option<Cow<'_, Literal>>],
    views: &[bool],
    taken: &mut Vec<Option<Literal>>,
    operands: &mut Operands<'v>,
) -> Option<()> {
    taken.extend(step.reads.iter().zip(&step.hand_over).map(|(o, &last)| {
        match values.get_mut(o.index()) {
            Some(slot @ Some(Cow::Owned(_))) if last => match slot.take() {
                Some(Cow::Owned(lit)) => Some(lit),
                _ => None,
            },
            _ => None,
        }
    }));
    let values: &'v [Option<Cow<'_, Literal>>] = values;
    for (o, taken) in step.reads.iter().zip(taken.drain(..)) {
        let operand = match taken {
            Some(lit) => Operand::Value(Cow::Owned(lit)),
            None => match (&program.nodes[o.index()].op, views[o.index()]) {
                (Op::Broadcast { shape, dims }, true) => Operand::Broadcast {
                    source: values
                        .get(plan.steps.get(o.index())?.reads.first()?.index())?
                        .as_deref()?,
                    shape,
                    dims,
                },
                _ => Operand::Value(Cow::Borrowed(values.get(o.index())?.as_deref()?)),
            },
        };
        operands.push(operand);
    }
    Some(())
}

/// Checks the number, dtypes and shapes of `inputs` against the program's parameters.
fn check_inputs(program: &Program, inputs: &[Cow<'_, Literal>]) -> Result<()> {
    let name = |index: usize| -> String {
        program
            .params
            .get(index)
            .and_then(|&p| program.nodes.get(p.index()))
            .and_then(|n| n.name.clone())
            .unwrap_or_else(|| format!("#{index}"))
    };
    let (expected, given) = (program.params.len(), inputs.len());
    if expected != given {
        let index = expected.min(given);
        return Err(Error::Input {
            index,
            name: if index < expected {
                name(index)
            } else {
                "(no such parameter)".into()
            },
            problem: InputProblem::Count { expected, given },
        });
    }
    for (index, (&p, input)) in program.params.iter().zip(inputs).enumerate() {
        let ty = program.nodes.get(p.index()).map(|n| &n.ty);
        if ty.is_some_and(|ty| kernels::has_type(input, ty)) {
            continue;
        }
        let given = TensorType::new(input.shape(), input.dtype());
        let problem = match ty {
            Some(expected) => InputProblem::Type {
                expected: expected.clone(),
                given,
            },
            None => InputProblem::Invalid {
                reason: "the program's parameter has no node".into(),
            },
        };
        return Err(Error::Input {
            index,
            name: name(index),
            problem,
        });
    }
    Ok(())
}
