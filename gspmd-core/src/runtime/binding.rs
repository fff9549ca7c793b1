//! The host side of a run, shared by the backends: checking a run's inputs and turning
//! each into what each device binds (a block, or a key into its store), padding and
//! trimming blocks, running a device's program on its bindings, and assembling global
//! outputs from blocks.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use super::backend::{Input, Output, Resident};
use super::blocks::{assemble, shard_literal};
use super::kernels;
use super::plan::Plan;
use crate::error::{AssembleProblem, Error, InputProblem, Placement, Result};
use crate::ir::{Literal, Op, TensorType, with_literal};
use crate::partition::SpmdProgram;
use crate::sharding::{Mesh, Sharding};

/// The unpadded sizes of device `device`'s block of a `shape` value sharded as
/// `sharding` on `mesh`.
pub(super) fn block_shape(
    sharding: &Sharding,
    mesh: &Mesh,
    shape: &[usize],
    device: usize,
) -> Vec<usize> {
    (sharding.device_block(mesh, shape, device).iter())
        .map(|b| b.1)
        .collect()
}

/// Checks that `block` is device `device`'s unpadded block of a `ty` value sharded as
/// `sharding` on `mesh`: its dtype and [`Sharding::device_block`]'s sizes.
fn check_block(
    block: &Literal,
    ty: &TensorType,
    sharding: &Sharding,
    mesh: &Mesh,
    device: usize,
) -> Result<(), InputProblem> {
    let expected = TensorType::new(block_shape(sharding, mesh, &ty.shape, device), ty.dtype);
    let given = TensorType::new(block.shape(), block.dtype());
    if given != expected {
        return Err(InputProblem::Block {
            device,
            expected,
            given,
        });
    }
    Ok(())
}

/// [`pad_to`] whose failure (a block larger than the local shape) is an
/// [`InputProblem::Invalid`].
fn pad_input(lit: Literal, shape: &[usize]) -> Result<Literal, InputProblem> {
    pad_to(lit, shape).map_err(|reason| InputProblem::Invalid { reason })
}

/// `lit` grown to `shape` with zeros at the end of each dim.
pub(super) fn pad_to(lit: Literal, shape: &[usize]) -> Result<Literal, String> {
    if with_literal!(&lit, a => a.shape() == shape) {
        return Ok(lit);
    }
    let have = lit.shape();
    if have.len() != shape.len() || have.iter().zip(shape).any(|(h, s)| h > s) {
        return Err(format!(
            "a block of shape {have:?} does not fit the local shape {shape:?}"
        ));
    }
    let high: Vec<i64> = shape
        .iter()
        .zip(&have)
        .map(|(s, h)| (*s as i64) - (*h as i64))
        .collect();
    let op = Op::Pad {
        low: vec![0; have.len()],
        high,
        interior: vec![0; have.len()],
    };
    let zero = Literal::full(&[], lit.dtype(), 0.0);
    kernels::eval(
        &op,
        &[&lit, &zero],
        &TensorType::new(shape.to_vec(), lit.dtype()),
    )
}

/// The first `shape` elements of each dim of `lit`.
pub(super) fn trim_to(lit: Literal, shape: &[usize]) -> Result<Literal, String> {
    let have = lit.shape();
    if have == shape {
        return Ok(lit);
    }
    let op = Op::Slice {
        start: vec![0; have.len()],
        limit: shape.to_vec(),
        stride: vec![1; have.len()],
    };
    kernels::eval(&op, &[&lit], &TensorType::new(shape.to_vec(), lit.dtype()))
}

/// What each device binds to a parameter: a block sent from the host, or a key into its
/// store (the value is moved out for the run and put back or replaced afterwards).
#[derive(Debug, Clone)]
pub(super) enum Bind {
    Host(Literal),
    Stored(Arc<str>),
}

/// An [`Error::WrongMesh`] unless `mesh` is the mesh `spmd` was partitioned for, an
/// [`Error::OutputCount`] unless `outputs` is its number of outputs.
pub(super) fn check_target(spmd: &SpmdProgram, mesh: &Mesh, outputs: usize) -> Result<()> {
    if mesh != &spmd.mesh {
        return Err(Error::WrongMesh {
            partitioned_for: spmd.mesh.to_string(),
            given: mesh.to_string(),
        });
    }
    if outputs != spmd.outputs.len() {
        return Err(Error::OutputCount {
            expected: spmd.outputs.len(),
            given: outputs,
        });
    }
    Ok(())
}

/// Checks `inputs` of a run of `spmd` (resident ones against `resident`, what the
/// backend holds under a key) and turns each into what each of `devices` (this
/// process's devices) binds, by device in that range.
pub(super) fn bind_inputs(
    spmd: &SpmdProgram,
    resident: &dyn Fn(&str) -> Option<Resident>,
    inputs: &[Input],
    devices: Range<usize>,
) -> Result<Vec<Vec<Bind>>> {
    check_input_count(spmd, inputs.len())?;
    let mut binds: Vec<Vec<Bind>> = vec![Vec::with_capacity(inputs.len()); devices.len()];
    for (index, (input, (ty, sharding))) in inputs.iter().zip(&spmd.inputs).enumerate() {
        let fail = |problem: InputProblem| input_error(spmd, index, problem);
        if !sharding.unreduced.is_empty() && !matches!(input, Input::Shards(_)) {
            return Err(fail(InputProblem::Unreduced {
                axes: sharding.unreduced.clone(),
            }));
        }
        match input {
            Input::Global(lit) => {
                if !kernels::has_type(lit, ty) {
                    return Err(fail(InputProblem::Type {
                        expected: ty.clone(),
                        given: TensorType::new(lit.shape(), lit.dtype()),
                    }));
                }
                let local = sharding.local_shape(&spmd.mesh, &ty.shape);
                for (device, b) in devices.clone().zip(&mut binds) {
                    let block = shard_literal(lit, sharding, &spmd.mesh, device);
                    b.push(Bind::Host(pad_input(block, &local).map_err(fail)?));
                }
            }
            Input::Shards(shards) => {
                if shards.len() != devices.len() {
                    return Err(fail(InputProblem::ShardCount {
                        expected: devices.len(),
                        given: shards.len(),
                    }));
                }
                let local = sharding.local_shape(&spmd.mesh, &ty.shape);
                for ((device, b), block) in devices.clone().zip(&mut binds).zip(*shards) {
                    check_block(block, ty, sharding, &spmd.mesh, device).map_err(fail)?;
                    b.push(Bind::Host(pad_input(block.clone(), &local).map_err(fail)?));
                }
            }
            Input::Resident(key) => {
                let Some(r) = resident(key) else {
                    return Err(fail(InputProblem::NoResident {
                        key: key.to_string(),
                    }));
                };
                if &r.ty != ty || &r.sharding != sharding {
                    let placement = |ty: &TensorType, sharding: &Sharding| {
                        Box::new(Placement {
                            ty: ty.clone(),
                            sharding: sharding.to_string(),
                        })
                    };
                    return Err(fail(InputProblem::Resident {
                        key: key.to_string(),
                        expected: placement(ty, sharding),
                        given: placement(&r.ty, &r.sharding),
                    }));
                }
                let key = RunKeys::input(index, key);
                for b in &mut binds {
                    b.push(Bind::Stored(Arc::clone(&key)));
                }
            }
        }
    }
    Ok(binds)
}

/// Output `k` of `spmd` as a global array, from every device's block (by device id,
/// padded).
pub(super) fn global_output(spmd: &SpmdProgram, k: usize, blocks: Vec<Literal>) -> Result<Literal> {
    let (ty, sharding) = &spmd.outputs[k];
    let devices = 0..spmd.mesh.num_devices();
    let blocks = trimmed_blocks(spmd, k, blocks, devices)?;
    let (blocks, sharding) = sum_partials(blocks, sharding, &spmd.mesh)?;
    assemble(&blocks, &sharding, &spmd.mesh, &ty.shape)
}

/// An [`Error::Input`] unless `given` is the number of inputs of `spmd`.
fn check_input_count(spmd: &SpmdProgram, given: usize) -> Result<()> {
    let expected = spmd.inputs.len();
    if given == expected {
        return Ok(());
    }
    let problem = InputProblem::Count { expected, given };
    Err(input_error(spmd, given.min(expected), problem))
}

/// An [`Error::Input`] for input `index` of `spmd`, named after its parameter.
fn input_error(spmd: &SpmdProgram, index: usize, problem: InputProblem) -> Error {
    let name = (spmd.program.params.get(index))
        .and_then(|&p| spmd.program.node(p).name.clone())
        .unwrap_or_else(|| format!("#{index}"));
    Error::Input {
        index,
        name,
        problem,
    }
}

/// Output `k`'s blocks of `devices` (padded, in that order) with the padding cut off.
pub(super) fn trimmed_blocks(
    spmd: &SpmdProgram,
    k: usize,
    blocks: Vec<Literal>,
    devices: Range<usize>,
) -> Result<Vec<Literal>> {
    let (ty, sharding): &(TensorType, Sharding) = &spmd.outputs[k];
    blocks
        .into_iter()
        .zip(devices)
        .map(|(block, device)| {
            let shape = block_shape(sharding, &spmd.mesh, &ty.shape, device);
            trim_to(block, &shape).map_err(|reason| Error::Assemble {
                sharding: sharding.to_string(),
                problem: AssembleProblem::Block { reason },
            })
        })
        .collect()
}

/// The keys of the last run started on this thread, reused by the next run while they
/// are equal (a training loop passes the same keys every step), so that a run does not
/// copy its resident values' keys for the device threads.
#[derive(Default)]
pub(super) struct RunKeys {
    /// By input: the key of a resident input.
    inputs: Vec<Option<Arc<str>>>,
    /// The output modes.
    outputs: Option<Arc<Vec<Output>>>,
}

thread_local! {
    static RUN_KEYS: RefCell<RunKeys> = RefCell::new(RunKeys::default());
}

impl RunKeys {
    /// `key`, the key of resident input `index`, shared.
    fn input(index: usize, key: &str) -> Arc<str> {
        RUN_KEYS.with_borrow_mut(|keys| {
            if keys.inputs.len() <= index {
                keys.inputs.resize(index + 1, None);
            }
            let slot = &mut keys.inputs[index];
            match slot {
                Some(last) if **last == *key => Arc::clone(last),
                _ => Arc::clone(slot.insert(Arc::from(key))),
            }
        })
    }

    /// `outputs`, shared.
    pub(super) fn outputs(outputs: &[Output]) -> Arc<Vec<Output>> {
        RUN_KEYS.with_borrow_mut(|keys| match &keys.outputs {
            Some(last) if last.as_slice() == outputs => Arc::clone(last),
            _ => Arc::clone(keys.outputs.insert(Arc::new(outputs.to_vec()))),
        })
    }
}

/// Blocks of a value with pending sums over `sharding.unreduced`, summed over the
/// devices that differ only along those axes: each device's block of the full value,
/// and the sharding without pending sums. Other values pass through.
fn sum_partials(
    blocks: Vec<Literal>,
    sharding: &Sharding,
    mesh: &Mesh,
) -> Result<(Vec<Literal>, Sharding)> {
    if sharding.unreduced.is_empty() {
        return Ok((blocks, sharding.clone()));
    }
    let reduced = Sharding {
        unreduced: Vec::new(),
        ..sharding.clone()
    };
    let unreduced: Vec<usize> = sharding
        .unreduced
        .iter()
        .filter_map(|a| mesh.axis_index(a))
        .collect();
    // Devices with equal coordinates off the unreduced axes hold parts of one block.
    let key = |d: usize| -> Vec<usize> {
        let coords = mesh.device_coords(d).unwrap_or_default();
        coords
            .iter()
            .enumerate()
            .filter(|(i, _)| !unreduced.contains(i))
            .map(|(_, &c)| c)
            .collect()
    };
    let add = Op::Binary(crate::ir::BinaryOp::Add);
    let fail = |reason: String| Error::Assemble {
        sharding: sharding.to_string(),
        problem: AssembleProblem::Block { reason },
    };
    let keys: Vec<Vec<usize>> = (0..blocks.len()).map(key).collect();
    let mut totals: HashMap<&[usize], Literal> = HashMap::new();
    for (k, block) in keys.iter().zip(&blocks) {
        let total = match totals.remove(k.as_slice()) {
            None => block.clone(),
            Some(acc) => {
                let ty = TensorType::new(acc.shape(), acc.dtype());
                kernels::eval(&add, &[&acc, block], &ty).map_err(fail)?
            }
        };
        totals.insert(k, total);
    }
    let sums = keys.iter().map(|k| totals[k.as_slice()].clone()).collect();
    Ok((sums, reduced))
}

/// Runs `run` on device `device`'s local inputs, bound as `binds` says, each owned if
/// `donated` says so for its input (the run consumes it, see [`Plan::donated`]) and
/// lent otherwise. Stored ones are moved out of `store` for the run; the lent ones are
/// put back after it, whatever its result, the donated ones never. A key missing from
/// `store` is an [`Error::MissingResident`] and `run` is not called.
pub(super) fn run_bound<T>(
    device: usize,
    binds: Vec<Bind>,
    store: &mut HashMap<String, Literal>,
    donated: &[bool],
    run: impl FnOnce(Vec<Cow<'_, Literal>>) -> Result<T>,
) -> Result<T> {
    /// Where an input is: owned by the run, or lent from `lent[j]`.
    enum Slot {
        Owned(Literal),
        Lent(usize),
    }
    // Lent values, with the store's own key of a stored one (no new key).
    let mut lent: Vec<(Literal, Option<String>)> = Vec::with_capacity(binds.len());
    let mut slots = Vec::with_capacity(binds.len());
    let mut missing = None;
    for (i, bind) in binds.into_iter().enumerate() {
        let (value, key) = match bind {
            Bind::Host(l) => (l, None),
            Bind::Stored(key) => match store.remove_entry(&*key) {
                Some((key, l)) => (l, Some(key)),
                None => {
                    missing = Some(key.to_string());
                    continue;
                }
            },
        };
        if donated.get(i).copied().unwrap_or(false) {
            slots.push(Slot::Owned(value));
        } else {
            slots.push(Slot::Lent(lent.len()));
            lent.push((value, key));
        }
    }
    let result = match missing {
        Some(key) => Err(Error::MissingResident { device, key }),
        None => run(slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Owned(l) => Cow::Owned(l),
                Slot::Lent(j) => Cow::Borrowed(&lent[j].0),
            })
            .collect()),
    };
    // Put lent resident inputs back (before the caller stores new outputs over them).
    for (value, key) in lent {
        if let Some(key) = key {
            store.insert(key, value);
        }
    }
    result
}

/// The keys of the resident inputs among `inputs` that `plan` donates: a run consumes
/// them, so after it they hold nothing unless an output stores them again.
pub(super) fn donated_keys<'a>(plan: &Plan, inputs: &[Input<'a>]) -> Vec<&'a str> {
    (inputs.iter().enumerate())
        .filter_map(|(i, input)| match input {
            Input::Resident(key) if plan.donated.get(i).copied().unwrap_or(false) => Some(*key),
            _ => None,
        })
        .collect()
}

/// Splits a device's outputs by `modes`: those whose mode is [`Output::Resident`] go
/// into `staged` (by output index, `None` for the others); the others are returned (by
/// output index, `None` for the staged ones).
pub(super) fn stage_resident(
    outs: Vec<Literal>,
    modes: &[Output],
    staged: &mut Vec<Option<Literal>>,
) -> Vec<Option<Literal>> {
    staged.clear();
    outs.into_iter()
        .zip(modes)
        .map(|(out, mode)| match mode {
            Output::Resident(_) => {
                staged.push(Some(out));
                None
            }
            _ => {
                staged.push(None);
                Some(out)
            }
        })
        .collect()
}

/// The blocks of `devices` (unpadded, in that order) of a value stored under `key` as
/// `resident` on `mesh`, checked and padded to the sharding's local shape: what each
/// device keeps. A wrong count, dtype or shape, an invalid sharding or an unreduced one
/// is an [`Error::Input`] naming `key`.
pub(super) fn padded_blocks(
    mesh: &Mesh,
    key: &str,
    resident: &Resident,
    blocks: Vec<Literal>,
    devices: Range<usize>,
) -> Result<Vec<Literal>> {
    let Resident { ty, sharding } = resident;
    let fail = |problem: InputProblem| Error::Input {
        index: 0,
        name: key.to_string(),
        problem,
    };
    sharding.validate(mesh, ty.rank(), &format!("store `{key}`: "))?;
    if !sharding.unreduced.is_empty() {
        return Err(fail(InputProblem::Unreduced {
            axes: sharding.unreduced.clone(),
        }));
    }
    if blocks.len() != devices.len() {
        return Err(fail(InputProblem::ShardCount {
            expected: devices.len(),
            given: blocks.len(),
        }));
    }
    let local = sharding.local_shape(mesh, &ty.shape);
    (blocks.into_iter().zip(devices))
        .map(|(block, d)| {
            check_block(&block, ty, sharding, mesh, d)?;
            pad_input(block, &local)
        })
        .collect::<Result<Vec<Literal>, InputProblem>>()
        .map_err(fail)
}

/// Device `device`'s stored block of `resident` on `mesh` (padded) without its padding.
pub(super) fn unpadded_block(
    mesh: &Mesh,
    resident: &Resident,
    device: usize,
    block: Literal,
) -> Result<Literal> {
    let shape = block_shape(&resident.sharding, mesh, &resident.ty.shape, device);
    trim_to(block, &shape).map_err(|reason| Error::Assemble {
        sharding: resident.sharding.to_string(),
        problem: AssembleProblem::Block { reason },
    })
}
