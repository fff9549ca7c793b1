//! Running a partitioned program on a [`ThreadMesh`]. Inputs come as global arrays (cut
//! into per-device blocks here), as per-device blocks, or resident on the devices;
//! outputs go back as global arrays, as per-device blocks, or stay resident, so that
//! parameters live on their devices across training steps.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use super::blocks::{assemble, shard_literal};
use super::buffers;
use super::device::run_planned;
use super::kernels;
use super::plan::PlannedProgram;
use super::thread_mesh::{DeviceContext, Resident, ThreadMesh};
use crate::error::{Error, Result};
use crate::ir::{Literal, Op, TensorType, with_literal};
use crate::partition::SpmdProgram;
use crate::sharding::{Mesh, Sharding};

/// One input of a run.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// A global array; the runtime cuts each device's block.
    Global(&'a Literal),
    /// Each device's block (`[d]` for device `d`), as [`shard_literal`](super::shard_literal) cuts it.
    Shards(&'a [Literal]),
    /// A value resident on the devices under this key (see [`ThreadMesh::resident`]).
    Resident(&'a str),
}

/// Where one output of a run goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Assembled into a global array (an unreduced output is summed over its pending
    /// axes).
    Global,
    /// Each device's block (unpadded), by device id; for an unreduced output, each
    /// device's partial value.
    Shards,
    /// Kept on the devices under this key (replacing what was there).
    Resident(String),
}

/// One output of a run, as requested by its [`Output`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A global array.
    Global(Literal),
    /// Each device's block.
    Shards(Vec<Literal>),
    /// Stored on the devices.
    Resident,
}

impl Value {
    /// The global array, if this is one.
    pub fn into_global(self) -> Option<Literal> {
        match self {
            Value::Global(l) => Some(l),
            _ => None,
        }
    }
}

/// Checks that `block` is device `device`'s unpadded block of a `ty` value sharded as
/// `sharding` on `mesh`: its dtype and [`Sharding::device_block`]'s sizes.
fn check_block(
    block: &Literal,
    ty: &TensorType,
    sharding: &Sharding,
    mesh: &Mesh,
    device: usize,
) -> Result<(), String> {
    let expected: Vec<usize> = (sharding.device_block(mesh, &ty.shape, device))
        .iter()
        .map(|b| b.1)
        .collect();
    if block.shape() != expected || block.dtype() != ty.dtype {
        return Err(format!(
            "device {device}'s block is {}{:?}, expected {}{expected:?}",
            block.dtype(),
            block.shape(),
            ty.dtype
        ));
    }
    Ok(())
}

/// `lit` grown to `shape` with zeros at the end of each dim.
fn pad_to(lit: Literal, shape: &[usize]) -> Result<Literal, String> {
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
fn trim_to(lit: Literal, shape: &[usize]) -> Result<Literal, String> {
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

impl SpmdProgram {
    /// Runs with global `inputs` and returns global outputs: [`SpmdProgram::execute`]
    /// with every input and output [`Global`](Input::Global).
    pub fn run(&self, mesh: &ThreadMesh, inputs: &[Literal]) -> Result<Vec<Literal>> {
        let planned = Arc::new(PlannedProgram::new(self.program.clone()));
        self.run_planned(&planned, mesh, inputs)
    }

    /// [`SpmdProgram::run`] with `planned`, the plan of [`SpmdProgram::program`].
    pub(crate) fn run_planned(
        &self,
        planned: &Arc<PlannedProgram>,
        mesh: &ThreadMesh,
        inputs: &[Literal],
    ) -> Result<Vec<Literal>> {
        let inputs: Vec<Input> = inputs.iter().map(Input::Global).collect();
        let outputs = vec![Output::Global; self.outputs.len()];
        let values = self.execute_planned(planned, mesh, &inputs, &outputs)?;
        Ok(values.into_iter().filter_map(Value::into_global).collect())
    }

    /// Runs on `mesh` (the mesh the program was partitioned for). Inputs are checked
    /// (count, global type, sharding of resident values, shapes of blocks) before any
    /// thread starts; a device failure is returned as an error, no device is left
    /// waiting, and resident values keep their old contents. Plans the program for this
    /// run; [`Executable::execute`](crate::Executable::execute) reuses one plan.
    pub fn execute(
        &self,
        mesh: &ThreadMesh,
        inputs: &[Input],
        outputs: &[Output],
    ) -> Result<Vec<Value>> {
        let planned = Arc::new(PlannedProgram::new(self.program.clone()));
        self.execute_planned(&planned, mesh, inputs, outputs)
    }

    /// [`SpmdProgram::execute`] with `planned`, the plan of [`SpmdProgram::program`].
    pub(crate) fn execute_planned(
        &self,
        planned: &Arc<PlannedProgram>,
        mesh: &ThreadMesh,
        inputs: &[Input],
        outputs: &[Output],
    ) -> Result<Vec<Value>> {
        self.check_target(mesh.mesh(), outputs.len())?;
        let binds = self.bind_inputs(
            &|key| mesh.resident_shared(key),
            inputs,
            0..self.mesh.num_devices(),
        )?;
        let planned = Arc::clone(planned);
        // Each device takes its own bindings (moved, not copied).
        let binds: Arc<Vec<Mutex<Vec<Bind>>>> =
            Arc::new(binds.into_iter().map(Mutex::new).collect());
        let modes = RunKeys::outputs(outputs);
        let settle_modes = Arc::clone(&modes);
        let on_device = move |ctx: &mut DeviceContext| {
            let device = ctx.device();
            let memory_limit = ctx.memory_limit();
            let (comm, store) = ctx.communicator_and_store();
            let mine =
                std::mem::take(&mut *binds[device].lock().unwrap_or_else(PoisonError::into_inner));
            let result = run_bound(device, mine, store, |locals| {
                run_planned(&planned.program, &planned.plan, comm, locals, memory_limit)
            });
            let outs = result?;
            Ok(stage_resident(outs, &modes, ctx.staged_mut()))
        };
        // Every device staged its new resident values: once its program has ended, each
        // makes them current if every device succeeded, or drops them.
        let settle = move |ctx: &mut DeviceContext, committed: bool| {
            let (store, staged) = ctx.store_and_staged();
            for (mode, value) in settle_modes.iter().zip(staged.drain(..)) {
                if let (Output::Resident(key), Some(v), true) = (mode, value, committed) {
                    match store.get_mut(key) {
                        // The old value's buffer goes to the pool: the next step's new
                        // value has its dtype and length.
                        Some(slot) => buffers::release(std::mem::replace(slot, v)),
                        None => {
                            store.insert(key.clone(), v);
                        }
                    }
                }
            }
        };
        let results = mesh.run_then_settle(on_device, settle);
        let results = results?;
        for (mode, (ty, sharding)) in outputs.iter().zip(&self.outputs) {
            if let Output::Resident(key) = mode {
                mesh.keep_resident(key, ty, sharding);
            }
        }
        let mut per_output: Vec<Vec<Option<Literal>>> = vec![Vec::new(); self.outputs.len()];
        for device_outs in results {
            for (k, out) in device_outs.into_iter().enumerate() {
                per_output[k].push(out);
            }
        }
        per_output
            .into_iter()
            .enumerate()
            .map(|(k, blocks)| match &outputs[k] {
                Output::Resident(_) => Ok(Value::Resident),
                Output::Shards => Ok(Value::Shards(self.trimmed_blocks(k, blocks)?)),
                Output::Global => Ok(Value::Global(self.global_output(k, blocks)?)),
            })
            .collect()
    }

    /// Checks `inputs` (resident ones against `resident`, what the mesh holds under a
    /// key) and turns each into what each of `devices` binds, by device in that range.
    pub(super) fn bind_inputs(
        &self,
        resident: &dyn Fn(&str) -> Option<Arc<Resident>>,
        inputs: &[Input],
        devices: Range<usize>,
    ) -> Result<Vec<Vec<Bind>>> {
        self.check_input_count(inputs.len())?;
        let n = self.mesh.num_devices();
        let mut binds: Vec<Vec<Bind>> = vec![Vec::with_capacity(inputs.len()); devices.len()];
        for (index, (input, (ty, sharding))) in inputs.iter().zip(&self.inputs).enumerate() {
            let fail = |message: String| self.input_error(index, message);
            if !sharding.unreduced.is_empty() && !matches!(input, Input::Shards(_)) {
                return Err(fail(format!(
                    "the parameter is unreduced over {:?}: give each device's partial sum as shards",
                    sharding.unreduced
                )));
            }
            match input {
                Input::Global(lit) => {
                    for (device, b) in devices.clone().zip(&mut binds) {
                        b.push(Bind::Host(self.global_input_block(index, lit, device)?));
                    }
                }
                Input::Shards(shards) => {
                    if shards.len() != n {
                        return Err(fail(format!(
                            "{} shards given for {n} devices",
                            shards.len()
                        )));
                    }
                    let local = sharding.local_shape(&self.mesh, &ty.shape);
                    for (device, b) in devices.clone().zip(&mut binds) {
                        let block = &shards[device];
                        check_block(block, ty, sharding, &self.mesh, device).map_err(fail)?;
                        b.push(Bind::Host(pad_to(block.clone(), &local).map_err(fail)?));
                    }
                }
                Input::Resident(key) => {
                    let Some(r) = resident(key) else {
                        return Err(fail(format!("no resident value `{key}` on the mesh")));
                    };
                    if &r.ty != ty || &r.sharding != sharding {
                        return Err(fail(format!(
                            "resident `{key}` is {} sharded {}, but the parameter is {ty} sharded {sharding}",
                            r.ty, r.sharding
                        )));
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

    /// Device `device`'s block of the global value `lit` of input `index`, padded to the
    /// local shape; an [`Error::Input`] if `lit` is not of the input's type.
    pub(super) fn global_input_block(
        &self,
        index: usize,
        lit: &Literal,
        device: usize,
    ) -> Result<Literal> {
        let (ty, sharding) = &self.inputs[index];
        if !kernels::has_type(lit, ty) {
            let given = TensorType::new(lit.shape(), lit.dtype());
            return Err(self.input_error(index, format!("expected {ty}, given {given}")));
        }
        let local = sharding.local_shape(&self.mesh, &ty.shape);
        let block = shard_literal(lit, sharding, &self.mesh, device);
        pad_to(block, &local).map_err(|message| self.input_error(index, message))
    }

    /// Output `k` as a global array, from every device's block (by device id).
    pub(super) fn global_output(&self, k: usize, blocks: Vec<Option<Literal>>) -> Result<Literal> {
        let (ty, sharding) = &self.outputs[k];
        let blocks = self.trimmed_blocks(k, blocks)?;
        let (blocks, sharding) = sum_partials(blocks, sharding, &self.mesh)?;
        assemble(&blocks, &sharding, &self.mesh, &ty.shape)
    }

    /// An [`Error::WrongMesh`] unless `mesh` is the mesh the program was partitioned
    /// for, an [`Error::OutputCount`] unless `outputs` is its number of outputs.
    pub(super) fn check_target(&self, mesh: &Mesh, outputs: usize) -> Result<()> {
        if mesh != &self.mesh {
            return Err(Error::WrongMesh {
                partitioned_for: self.mesh.to_string(),
                given: mesh.to_string(),
            });
        }
        if outputs != self.outputs.len() {
            return Err(Error::OutputCount {
                expected: self.outputs.len(),
                given: outputs,
            });
        }
        Ok(())
    }

    /// An [`Error::Input`] unless `given` is the program's number of inputs.
    pub(super) fn check_input_count(&self, given: usize) -> Result<()> {
        if given == self.inputs.len() {
            return Ok(());
        }
        let message = format!(
            "the program takes {} inputs but {given} were given",
            self.inputs.len()
        );
        Err(self.input_error(given.min(self.inputs.len()), message))
    }

    /// An [`Error::Input`] for input `index`, named after its parameter.
    fn input_error(&self, index: usize, message: String) -> Error {
        let name = self
            .program
            .params
            .get(index)
            .and_then(|&p| self.program.node(p).name.clone())
            .unwrap_or_else(|| format!("#{index}"));
        Error::Input {
            index,
            name,
            message,
        }
    }

    /// Output `k`'s blocks (by device) with the padding cut off.
    pub(super) fn trimmed_blocks(
        &self,
        k: usize,
        blocks: Vec<Option<Literal>>,
    ) -> Result<Vec<Literal>> {
        let (ty, sharding): &(TensorType, Sharding) = &self.outputs[k];
        blocks
            .into_iter()
            .enumerate()
            .map(|(device, block)| {
                let fail = |message: String| Error::Assemble {
                    sharding: sharding.to_string(),
                    message,
                };
                let block =
                    block.ok_or_else(|| fail(format!("device {device} returned no block")))?;
                let shape: Vec<usize> = sharding
                    .device_block(&self.mesh, &ty.shape, device)
                    .iter()
                    .map(|b| b.1)
                    .collect();
                trim_to(block, &shape).map_err(fail)
            })
            .collect()
    }
}

/// The keys of the last run started on this thread, reused by the next run while they
/// are equal (a training loop passes the same keys every step), so that a run does not
/// copy its resident values' keys for the device threads.
#[derive(Default)]
struct RunKeys {
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
    fn outputs(outputs: &[Output]) -> Arc<Vec<Output>> {
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
    let fail = |message: String| Error::Assemble {
        sharding: sharding.to_string(),
        message,
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

/// Runs `run` on device `device`'s local inputs, bound as `binds` says: stored ones are
/// moved out of `store` for the run and put back after it, whatever its result (a key
/// missing from `store` is an [`Error::MissingResident`] and `run` is not called).
pub(super) fn run_bound<T>(
    device: usize,
    binds: Vec<Bind>,
    store: &mut HashMap<String, Literal>,
    run: impl FnOnce(&[Literal]) -> Result<T>,
) -> Result<T> {
    let mut locals = Vec::with_capacity(binds.len());
    let mut moved = Vec::new();
    let mut missing = None;
    for bind in binds {
        match bind {
            Bind::Host(l) => locals.push(l),
            // The store's own key goes back with the value: no new key.
            Bind::Stored(key) => match store.remove_entry(&*key) {
                Some((key, l)) => {
                    moved.push((locals.len(), key));
                    locals.push(l);
                }
                None => missing = Some(key.to_string()),
            },
        }
    }
    let result = match missing {
        Some(key) => Err(Error::MissingResident { device, key }),
        None => run(&locals),
    };
    // Put moved resident inputs back (before the caller stores new outputs over them).
    for (i, key) in moved.into_iter().rev() {
        store.insert(key, locals.swap_remove(i));
    }
    result
}

/// Stages the outputs whose mode is [`Output::Resident`] in `staged` (by output
/// index); returns the others.
fn stage_resident(
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

/// The error of uploading `key`.
fn upload_error(key: &str, message: String) -> Error {
    Error::Input {
        index: 0,
        name: key.to_string(),
        message,
    }
}

/// Checks that a global value of type `ty` can be uploaded under `key` sharded as
/// `sharding`: a valid sharding of its rank, and not unreduced.
fn check_upload(mesh: &Mesh, key: &str, ty: &TensorType, sharding: &Sharding) -> Result<()> {
    sharding.validate(mesh, ty.rank(), &format!("upload `{key}`: "))?;
    if !sharding.unreduced.is_empty() {
        return Err(upload_error(
            key,
            format!(
                "cannot upload a global value as unreduced over {:?}",
                sharding.unreduced
            ),
        ));
    }
    Ok(())
}

/// What `key` holds once the global `value` is uploaded sharded as `sharding`, and the
/// block (padded to the local shape) of each of `devices`, by device in that range.
pub(super) fn resident_blocks(
    mesh: &Mesh,
    key: &str,
    value: &Literal,
    sharding: &Sharding,
    devices: Range<usize>,
) -> Result<(Resident, Vec<Literal>)> {
    let ty = TensorType::new(value.shape(), value.dtype());
    check_upload(mesh, key, &ty, sharding)?;
    let local = sharding.local_shape(mesh, &ty.shape);
    let blocks = devices
        .map(|d| pad_to(shard_literal(value, sharding, mesh, d), &local))
        .collect::<Result<Vec<Literal>, String>>()
        .map_err(|message| upload_error(key, message))?;
    let resident = Resident {
        ty,
        sharding: sharding.clone(),
    };
    Ok((resident, blocks))
}

/// The global value of resident `r` from every device's block (padded), by device id.
pub(super) fn assemble_resident(
    mesh: &Mesh,
    r: &Resident,
    blocks: Vec<Literal>,
) -> Result<Literal> {
    let blocks = blocks
        .into_iter()
        .enumerate()
        .map(|(d, b)| {
            let shape: Vec<usize> = r
                .sharding
                .device_block(mesh, &r.ty.shape, d)
                .iter()
                .map(|b| b.1)
                .collect();
            trim_to(b, &shape)
        })
        .collect::<Result<Vec<Literal>, String>>()
        .map_err(|message| Error::Assemble {
            sharding: r.sharding.to_string(),
            message,
        })?;
    assemble(&blocks, &r.sharding, mesh, &r.ty.shape)
}

impl ThreadMesh {
    /// Puts the global `value` on the devices under `key`, sharded as `sharding`
    /// (replacing what was there).
    pub fn upload(&self, key: &str, value: &Literal, sharding: &Sharding) -> Result<()> {
        let devices = 0..self.mesh().num_devices();
        let (resident, blocks) = resident_blocks(self.mesh(), key, value, sharding, devices)?;
        self.store_blocks(key, resident, blocks)
    }

    /// Puts a value of type `ty` on the devices under `key`, sharded as `sharding`,
    /// from each device's block (`blocks[d]`: the unpadded block
    /// [`Sharding::device_block`] gives device `d`), so that no global array is needed
    /// (replacing what was there). A wrong block count, shape or dtype, or an unreduced
    /// sharding, is an [`Error::Input`].
    pub fn upload_blocks(
        &self,
        key: &str,
        ty: &TensorType,
        sharding: &Sharding,
        blocks: Vec<Literal>,
    ) -> Result<()> {
        check_upload(self.mesh(), key, ty, sharding)?;
        let n = self.mesh().num_devices();
        if blocks.len() != n {
            return Err(upload_error(
                key,
                format!("{} blocks given for {n} devices", blocks.len()),
            ));
        }
        let local = sharding.local_shape(self.mesh(), &ty.shape);
        let blocks = (blocks.into_iter().enumerate())
            .map(|(d, block)| {
                check_block(&block, ty, sharding, self.mesh(), d)?;
                pad_to(block, &local)
            })
            .collect::<Result<Vec<Literal>, String>>()
            .map_err(|message| upload_error(key, message))?;
        let resident = Resident {
            ty: ty.clone(),
            sharding: sharding.clone(),
        };
        self.store_blocks(key, resident, blocks)
    }

    /// Stores `blocks[d]` (padded) on device `d` under `key`, described by `resident`.
    fn store_blocks(&self, key: &str, resident: Resident, blocks: Vec<Literal>) -> Result<()> {
        let blocks = Arc::new(blocks);
        let k = key.to_string();
        self.run(move |ctx| {
            let device = ctx.device();
            ctx.store_mut().insert(k.clone(), blocks[device].clone());
            Ok(())
        })?;
        self.set_resident(key, Some(resident));
        Ok(())
    }

    /// The global value resident under `key`, assembled from the devices' blocks.
    pub fn fetch(&self, key: &str) -> Result<Literal> {
        let r = self
            .resident(key)
            .ok_or_else(|| Error::ThreadMesh(format!("no resident value `{key}` on the mesh")))?;
        let k = key.to_string();
        let blocks = self.run(move |ctx| {
            let device = ctx.device();
            ctx.store().get(&k).cloned().ok_or_else(|| {
                Error::ThreadMesh(format!("device {device} holds no resident value `{k}`"))
            })
        })?;
        assemble_resident(self.mesh(), &r, blocks)
    }

    /// Drops the value resident under `key` from every device.
    pub fn remove(&self, key: &str) -> Result<()> {
        let k = key.to_string();
        self.run(move |ctx| {
            ctx.store_mut().remove(&k);
            Ok(())
        })?;
        self.set_resident(key, None);
        Ok(())
    }
}
