//! Running a partitioned program on a [`ThreadMesh`]: global inputs are cut into
//! per-device blocks (padded to the local shape), every device runs the one per-device
//! program, and the output blocks are assembled into global arrays.

use std::sync::Arc;

use super::device::run_on_device;
use super::kernels;
use super::thread_mesh::ThreadMesh;
use crate::error::{Error, Result};
use crate::ir::{Literal, Op, TensorType};
use crate::partition::SpmdProgram;
use crate::sharding::{Sharding, assemble, shard_literal};

/// `lit` grown to `shape` with zeros at the end of each dim.
fn pad_to(lit: &Literal, shape: &[usize]) -> Result<Literal, String> {
    let have = lit.shape();
    if have == shape {
        return Ok(lit.clone());
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
        &[lit, &zero],
        &TensorType::new(shape.to_vec(), lit.dtype()),
    )
}

/// The first `shape` elements of each dim of `lit`.
fn trim_to(lit: &Literal, shape: &[usize]) -> Result<Literal, String> {
    let have = lit.shape();
    if have == shape {
        return Ok(lit.clone());
    }
    let op = Op::Slice {
        start: vec![0; have.len()],
        limit: shape.to_vec(),
        stride: vec![1; have.len()],
    };
    kernels::eval(&op, &[lit], &TensorType::new(shape.to_vec(), lit.dtype()))
}

impl SpmdProgram {
    /// Runs the program on `mesh` (which must be the mesh it was partitioned for) with
    /// global `inputs`, returning global outputs. Inputs are checked (count, dtype,
    /// shape) before any thread starts; a device failure is returned as an error and no
    /// device is left waiting.
    pub fn run(&self, mesh: &ThreadMesh, inputs: &[Literal]) -> Result<Vec<Literal>> {
        if mesh.mesh() != &self.mesh {
            return Err(Error::InvalidMesh(format!(
                "program partitioned for {} cannot run on {}",
                self.mesh,
                mesh.mesh()
            )));
        }
        self.check_inputs(inputs)?;
        let n = self.mesh.num_devices();
        let mut per_device: Vec<Vec<Literal>> = vec![Vec::with_capacity(inputs.len()); n];
        for (index, (input, (ty, sharding))) in inputs.iter().zip(&self.inputs).enumerate() {
            let local = sharding.local_shape(&self.mesh, &ty.shape);
            for (device, shards) in per_device.iter_mut().enumerate() {
                let block = shard_literal(input, sharding, &self.mesh, device);
                let padded =
                    pad_to(&block, &local).map_err(|message| self.input_error(index, message))?;
                shards.push(padded);
            }
        }
        let program = Arc::new(self.program.clone());
        let per_device = Arc::new(per_device);
        let results = mesh.run(move |ctx| {
            run_on_device(&program, ctx.communicator(), &per_device[ctx.device()])
        })?;
        (0..self.outputs.len())
            .map(|k| self.assemble_output(k, &results))
            .collect()
    }

    fn check_inputs(&self, inputs: &[Literal]) -> Result<()> {
        if inputs.len() != self.inputs.len() {
            let index = inputs.len().min(self.inputs.len());
            let message = format!(
                "the program takes {} inputs but {} were given",
                self.inputs.len(),
                inputs.len()
            );
            return Err(self.input_error(index, message));
        }
        for (index, (input, (ty, _))) in inputs.iter().zip(&self.inputs).enumerate() {
            let given = TensorType::new(input.shape(), input.dtype());
            if &given != ty {
                return Err(self.input_error(index, format!("expected {ty}, given {given}")));
            }
        }
        Ok(())
    }

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

    /// Output `k` assembled from every device's local block.
    fn assemble_output(&self, k: usize, results: &[Vec<Literal>]) -> Result<Literal> {
        let (ty, sharding): &(TensorType, Sharding) = &self.outputs[k];
        let blocks = results
            .iter()
            .enumerate()
            .map(|(device, outs)| {
                let block: Vec<usize> = sharding
                    .device_block(&self.mesh, &ty.shape, device)
                    .iter()
                    .map(|b| b.1)
                    .collect();
                trim_to(&outs[k], &block).map_err(|message| Error::Assemble {
                    sharding: sharding.to_string(),
                    message,
                })
            })
            .collect::<Result<Vec<Literal>>>()?;
        assemble(&blocks, sharding, &self.mesh, &ty.shape)
    }
}
