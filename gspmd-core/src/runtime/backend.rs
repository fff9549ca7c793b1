//! [`Backend`]: the one interface through which programs run on devices, whatever the
//! devices are — the reference interpreter's one device, a [`ThreadMesh`]'s threads,
//! MPI ranks — in the spirit of a PJRT client: [`Executable`](crate::Executable)s,
//! trainers, evaluators and checkpoints are written once against it.
//!
//! A backend is driven by one or more *processes*; each holds some of the mesh's devices
//! (its *local devices*, a contiguous range of device ids) and the blocks of the values
//! they hold. Every process calls the same methods in the same order with the same
//! arguments (SPMD), except the per-device data, which each process gives and gets for
//! its local devices only: no process needs another's blocks, so none ever holds more
//! than its devices' share of a sharded value.
//!
//! [`ThreadMesh`]: super::ThreadMesh

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use super::blocks::{assemble, shard_literal};
use super::plan::Plan;
use crate::error::{AssembleProblem, Error, InputProblem, Result};
use crate::ir::{DType, Literal, TensorType};
use crate::partition::SpmdProgram;
use crate::sharding::{Mesh, Sharding};

/// A per-device program ready to run: the partitioned program with the global type and
/// sharding of each input and output ([`SpmdProgram`]), its execution plan (made once)
/// and its fingerprint. What every [`Backend`] runs; an
/// [`Executable`](crate::Executable) makes one at its first run and reuses it.
#[derive(Debug)]
pub struct Loaded {
    spmd: SpmdProgram,
    pub(crate) plan: Plan,
    fingerprint: OnceLock<String>,
}

impl Loaded {
    /// `spmd` with its plan made, no input donated.
    pub fn new(spmd: SpmdProgram) -> Self {
        Loaded::donating(spmd, &[])
    }

    /// `spmd` with its plan made, the inputs of parameter indices `donated` consumed by
    /// every run (see [`CompileOptions::donated`](crate::CompileOptions::donated)).
    pub fn donating(spmd: SpmdProgram, donated: &[usize]) -> Self {
        let plan = Plan::donating(&spmd.program, donated);
        Loaded::with_plan(spmd, plan)
    }

    /// `spmd` with `plan`, which must be [`Plan::donating`] of `spmd.program`.
    pub(crate) fn with_plan(spmd: SpmdProgram, plan: Plan) -> Self {
        Loaded {
            spmd,
            plan,
            fingerprint: OnceLock::new(),
        }
    }

    /// Runs on `backend` with global inputs (the same on every process of `backend`);
    /// returns global outputs. See [`Backend::execute`].
    pub fn run<B: Backend + ?Sized>(
        self: &Arc<Self>,
        backend: &B,
        inputs: &[Literal],
    ) -> Result<Vec<Literal>> {
        let inputs: Vec<Input> = inputs.iter().map(Input::Global).collect();
        let outputs = vec![Output::Global; self.spmd.outputs.len()];
        let values = backend.execute(self, &inputs, &outputs)?;
        Ok(values.into_iter().filter_map(Value::into_global).collect())
    }

    /// The per-device program and its global inputs and outputs.
    pub fn spmd(&self) -> &SpmdProgram {
        &self.spmd
    }

    /// `program <hash> on mesh <mesh>`: a hash of the per-device program, its mesh and
    /// its global inputs and outputs, equal on processes that run the same program
    /// (made once).
    pub fn fingerprint(&self) -> &str {
        self.fingerprint.get_or_init(|| {
            use std::hash::{Hash, Hasher};
            let spmd = &self.spmd;
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            format!("{}{:?}{:?}", spmd.program, spmd.inputs, spmd.outputs).hash(&mut hasher);
            format!("program {:016x} on mesh {}", hasher.finish(), spmd.mesh)
        })
    }
}

/// One input of a run.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Input<'a> {
    /// A global array, the same on every process; each device gets its block.
    Global(&'a Literal),
    /// The blocks of this process's devices, in [`Backend::local_devices`] order
    /// (unpadded, as [`shard_literal`](super::shard_literal) cuts them). On a
    /// single-process backend: every device's block, by device id.
    Shards(&'a [Literal]),
    /// A value resident on the devices under this key (see [`Backend::resident`]).
    Resident(&'a str),
}

/// Where one output of a run goes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Output {
    /// Assembled into a global array on every process (an unreduced output is summed
    /// over its pending axes).
    Global,
    /// The blocks of this process's devices (unpadded), in [`Backend::local_devices`]
    /// order; for an unreduced output, each device's partial value.
    Shards,
    /// Kept on the devices under this key (replacing what was there).
    Resident(String),
}

/// One output of a run, as requested by its [`Output`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// A global array.
    Global(Literal),
    /// The blocks of this process's devices.
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

/// What a resident value is: every device holds its block (padded to the sharding's
/// local shape) under the value's key.
#[derive(Debug, Clone, PartialEq)]
pub struct Resident {
    /// The global type.
    pub ty: TensorType,
    /// How it is sharded.
    pub sharding: Sharding,
}

/// A set of devices that runs per-device programs ([`Loaded`]) and keeps values
/// resident on them between runs.
///
/// A backend is driven by one or more *processes*; each holds some of the mesh's
/// devices (its *local devices*, a contiguous range of device ids) and the blocks of the
/// values they hold. Every process calls the same methods in the same order with the
/// same arguments (SPMD), except the per-device data, which each process gives and gets
/// for its local devices only.
///
/// Failure contract, for every method that runs on the devices: when one device fails
/// (an error or a panic), every process returns an error naming it, no device is left
/// waiting, and values stored by the run change on all devices or on none.
pub trait Backend {
    /// The mesh whose devices this backend runs: programs must be partitioned for it.
    fn mesh(&self) -> &Mesh;

    /// Whether programs are partitioned for [`Backend::mesh`] before they run here;
    /// `false` for the reference interpreter, which runs global programs as written
    /// ([`Reference`](super::Reference)).
    fn partitions(&self) -> bool {
        true
    }

    /// This process's index among the processes driving the backend, and their count.
    fn process(&self) -> (usize, usize) {
        (0, 1)
    }

    /// The devices of this process, by id (all of them on a single-process backend).
    fn local_devices(&self) -> Range<usize> {
        0..self.mesh().num_devices()
    }

    /// The bytes of live values each device's runtime may hold.
    fn memory_limit(&self) -> usize;

    /// Runs `program` (partitioned for [`Backend::mesh`]) on every device with `inputs`
    /// and returns its outputs as `outputs` asks. Inputs are checked (count, global
    /// type, sharding of resident values, shapes of blocks) before any device computes;
    /// a program for another mesh is an [`Error::WrongMesh`].
    fn execute(
        &self,
        program: &Arc<Loaded>,
        inputs: &[Input],
        outputs: &[Output],
    ) -> Result<Vec<Value>>;

    /// The global type and sharding of the value resident under `key`, if any (the same
    /// on every process).
    fn resident(&self, key: &str) -> Option<Resident>;

    /// Stores under `key` a value described by `resident` from the blocks of this
    /// process's devices (unpadded, as [`Sharding::device_block`] cuts them, in
    /// [`Backend::local_devices`] order), replacing what was there. A wrong block
    /// count, shape or dtype, or an unreduced sharding, is an [`Error::Input`].
    fn store_blocks(&self, key: &str, resident: Resident, blocks: Vec<Literal>) -> Result<()>;

    /// The blocks of this process's devices (unpadded) of the value resident under
    /// `key`, in [`Backend::local_devices`] order.
    fn local_blocks(&self, key: &str) -> Result<Vec<Literal>>;

    /// Drops the value resident under `key` from every device.
    fn remove(&self, key: &str) -> Result<()>;

    /// Every process's `bytes`, by process index: all processes call it at the same
    /// point, with the same `place` (a name for error messages).
    fn all_gather_bytes(&self, place: &str, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let _ = place;
        Ok(vec![bytes])
    }

    /// Runs `work` on this process, as every process does at the same point with the
    /// same `place`: an error on one process is an error on every process (naming the
    /// place), and every process returns once all are done.
    fn together(&self, place: &str, work: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let _ = place;
        work()
    }

    /// Puts the global `value` (the same on every process) on the devices under `key`,
    /// sharded as `sharding`: each process keeps its devices' blocks.
    fn upload(&self, key: &str, value: &Literal, sharding: &Sharding) -> Result<()> {
        let ty = TensorType::new(value.shape(), value.dtype());
        let blocks = (self.local_devices())
            .map(|d| shard_literal(value, sharding, self.mesh(), d))
            .collect();
        self.store_blocks(
            key,
            Resident {
                ty,
                sharding: sharding.clone(),
            },
            blocks,
        )
    }

    /// The global value resident under `key`, assembled from every device's block on
    /// every process (all processes call it at the same point).
    fn fetch(&self, key: &str) -> Result<Literal> {
        let resident = self.resident(key).ok_or_else(|| Error::Input {
            index: 0,
            name: key.to_string(),
            problem: InputProblem::NoResident {
                key: key.to_string(),
            },
        })?;
        let mine = self.local_blocks(key)?;
        let blocks = if self.process().1 == 1 {
            mine
        } else {
            let place = format!("the fetch of `{key}`");
            let gathered = self.all_gather_bytes(&place, encode_blocks(&mine))?;
            let mut blocks = Vec::with_capacity(self.mesh().num_devices());
            for bytes in gathered {
                blocks.extend(decode_blocks(&bytes).map_err(|message| Error::Assemble {
                    sharding: resident.sharding.to_string(),
                    problem: AssembleProblem::Block {
                        reason: format!("{place}: {message}"),
                    },
                })?);
            }
            blocks
        };
        assemble(&blocks, &resident.sharding, self.mesh(), &resident.ty.shape)
    }
}

/// `blocks` as bytes: per block its dtype, rank, dims and elements (little-endian).
pub(crate) fn encode_blocks(blocks: &[Literal]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in blocks {
        out.push(dtype_code(block.dtype()));
        let shape = block.shape();
        out.push(shape.len() as u8);
        for n in shape {
            out.extend_from_slice(&(n as u64).to_le_bytes());
        }
        out.extend_from_slice(&block.to_le_bytes());
    }
    out
}

/// The blocks [`encode_blocks`] wrote into `bytes`.
pub(crate) fn decode_blocks(mut bytes: &[u8]) -> Result<Vec<Literal>, String> {
    /// The next `n` of `bytes`.
    fn take<'a>(n: usize, bytes: &mut &'a [u8]) -> Result<&'a [u8], String> {
        if bytes.len() < n {
            return Err("truncated block bytes".into());
        }
        let (head, tail) = bytes.split_at(n);
        *bytes = tail;
        Ok(head)
    }
    let mut blocks = Vec::new();
    while !bytes.is_empty() {
        let header = take(2, &mut bytes)?;
        let dtype = DType::ALL
            .into_iter()
            .find(|&d| dtype_code(d) == header[0])
            .ok_or_else(|| format!("unknown dtype code {}", header[0]))?;
        let shape = (0..header[1])
            .map(|_| {
                let word = take(8, &mut bytes)?;
                let n = u64::from_le_bytes(word.try_into().map_err(|_| "a short dim")?);
                usize::try_from(n).map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<usize>, String>>()?;
        let count: usize = shape.iter().product();
        let data = take(count * dtype.size_in_bytes(), &mut bytes)?;
        blocks.push(Literal::from_le_bytes(dtype, &shape, data)?);
    }
    Ok(blocks)
}

/// A one-byte code of `dtype` in [`encode_blocks`].
fn dtype_code(dtype: DType) -> u8 {
    DType::ALL.iter().position(|&d| d == dtype).unwrap_or(0) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_survive_their_bytes() {
        let blocks = vec![
            Literal::full(&[2, 3], DType::F32, -1.5),
            Literal::full(&[0, 4], DType::BF16, 2.0),
            Literal::full(&[], DType::I32, -7.0),
            Literal::full(&[5], DType::Bool, 1.0),
            Literal::full(&[1, 1, 2], DType::F16, 0.25),
        ];
        let bytes = encode_blocks(&blocks);
        assert_eq!(decode_blocks(&bytes), Ok(blocks));
        assert!(decode_blocks(&bytes[..bytes.len() - 1]).is_err());
        assert!(Literal::from_le_bytes(DType::Bool, &[1], &[2]).is_err());
    }
}
