//! [`Emitter`]: appends typed nodes to the per-device program being built, and the
//! small SPMD idioms every handler needs (axis index, shard offsets, scalar constants).

use std::collections::HashMap;
use std::sync::Arc;

use super::PValue;
use super::handlers::LocalFlow;
use crate::error::{Error, Result};
use crate::ir::{
    AxisGroup, DType, Flow, Literal, Location, Op, Program, Purpose, Source, TensorType, ValueId,
    Why,
};
use crate::sharding::{Mesh, Sharding};

/// Builds the per-device program. Every node gets the location of the global node being
/// partitioned, so reports and errors point at the user's source line.
pub(crate) struct Emitter<'m> {
    pub program: Program,
    pub mesh: &'m Mesh,
    /// The global program being partitioned.
    pub global: &'m Program,
    /// The global value each per-device value holds, for the values the driver has
    /// partitioned (a handler's intermediates are not listed).
    pub globals: HashMap<ValueId, ValueId>,
    /// Why the collectives emitted now are there, while a resharding is emitted;
    /// `None`: they are part of the current op's partitioned algorithm.
    pub reason: Option<Why>,
    /// The global value being partitioned and its source location.
    pub current: (ValueId, &'static str, Location),
    /// Notes on costly choices (whole-dim gathers), each naming the value and location.
    pub warnings: Vec<String>,
    /// The per-device form of each flow op partitioned so far, keyed by the global
    /// program's regions (alive while partitioning): an instance's result nodes share
    /// one.
    pub flows: HashMap<*const Flow, Arc<LocalFlow>>,
}

impl<'m> Emitter<'m> {
    pub fn new(global: &'m Program, mesh: &'m Mesh) -> Self {
        Emitter {
            program: Program::new(global.name.clone()),
            mesh,
            global,
            globals: HashMap::new(),
            reason: None,
            current: (ValueId(0), "", Location::synthetic()),
            warnings: Vec::new(),
            flows: HashMap::new(),
        }
    }

    /// An error about the value being partitioned.
    pub fn error(&self, message: impl Into<String>) -> Error {
        let (value, op, location) = self.current;
        Error::Partition {
            value,
            op,
            location,
            message: message.into(),
        }
    }

    /// Records a note about the value being partitioned.
    pub fn warn(&mut self, message: String) {
        let (value, op, location) = self.current;
        self.warnings
            .push(format!("{location}: {value} = {op}: {message}"));
    }

    /// Appends `op(operands)`, typed by [`infer_type`]. A collective over a group of one
    /// device is the identity and emits nothing (a non-wrapping shift there would give
    /// zeros: its callers read only the positions a real neighbour sends); any other
    /// collective gets its [`Why`]: the current [`reason`](Self::reason), or part of
    /// the current op's algorithm.
    pub fn emit(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        if let Some(group) = op.collective_group()
            && group.size == 1
        {
            return Ok(operands[0]);
        }
        let collective = op.is_collective();
        let location = self.current.2;
        let id = (self.program.push_op(op, operands, location))
            .map_err(|e| self.error(format!("internal: {e}")))?;
        if collective {
            let why = (self.reason.clone()).unwrap_or_else(|| self.why(Purpose::Algorithm, None));
            self.program.node_mut(id).why = vec![why];
        }
        Ok(id)
    }

    /// Emits `program`'s nodes with its parameters bound to `locals`; returns the id of
    /// each node's copy (a parameter's: its local).
    pub fn inline(&mut self, program: &Program, locals: &[ValueId]) -> Result<Vec<ValueId>> {
        let mut ids: Vec<ValueId> = Vec::with_capacity(program.nodes.len());
        for node in &program.nodes {
            let id = match &node.op {
                Op::Parameter { index, .. } => locals[*index],
                op => {
                    let operands: Vec<ValueId> =
                        node.operands.iter().map(|o| ids[o.index()]).collect();
                    self.emit(op.clone(), &operands)?
                }
            };
            ids.push(id);
        }
        Ok(ids)
    }

    /// Why moving `v` to `target` for the current op: an operand of it (the global
    /// value `v` holds, if the driver partitioned it), or the op's result (when `v` holds
    /// the current value).
    pub fn why_moving(&self, v: &PValue, target: &Sharding) -> Why {
        let (user, ..) = self.current;
        let value = self.globals.get(&v.id).copied();
        let purpose = if value == Some(user) {
            Purpose::Result
        } else {
            Purpose::Operand
        };
        let mut why = self.why(purpose, value);
        why.from = Some(v.sharding.clone());
        why.to = Some(target.clone());
        if purpose == Purpose::Operand {
            why.from_sources = value
                .map(|o| Source::of(self.global, o))
                .unwrap_or_default();
        }
        why
    }

    /// A [`Why`] of `purpose` for the current op, moving `value`, with the current
    /// value's annotations as the required side's sources and no shardings yet.
    fn why(&self, purpose: Purpose, value: Option<ValueId>) -> Why {
        let (user, op, location) = self.current;
        Why {
            purpose,
            user,
            op,
            location,
            value,
            from: None,
            to: None,
            from_sources: Vec::new(),
            user_sharding: self.global.node(user).sharding.clone(),
            to_sources: match purpose {
                Purpose::Algorithm => Vec::new(),
                _ => Source::of(self.global, user),
            },
        }
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.program.ty(v)
    }

    pub fn shape(&self, v: ValueId) -> Vec<usize> {
        self.program.ty(v).shape.clone()
    }

    /// The group of devices spanned by `axes`.
    pub fn group(&self, axes: &[String]) -> AxisGroup {
        let size = self.mesh.axes_size(axes);
        AxisGroup {
            axes: axes.to_vec(),
            size,
        }
    }

    /// A scalar constant.
    pub fn scalar(&mut self, dtype: DType, value: f64) -> Result<ValueId> {
        self.emit(Op::Constant(Literal::full(&[], dtype, value)), &[])
    }

    /// `axis_index(axes) * stride` as an i32 scalar: the offset of this device's block
    /// when blocks of `stride` elements are laid out in group order.
    pub fn block_offset(&mut self, axes: &[String], stride: usize) -> Result<ValueId> {
        let idx = self.emit(Op::AxisIndex(self.group(axes)), &[])?;
        if stride == 1 {
            return Ok(idx);
        }
        let s = self.scalar(DType::I32, stride as f64)?;
        self.emit(Op::Binary(crate::ir::BinaryOp::Mul), &[idx, s])
    }

    /// Broadcasts a scalar to `shape`.
    pub fn splat(&mut self, scalar: ValueId, shape: &[usize]) -> Result<ValueId> {
        self.emit(
            Op::Broadcast {
                shape: shape.to_vec(),
                dims: vec![],
            },
            &[scalar],
        )
    }

    /// `dynamic_slice` of `x` to `sizes`, starting at `starts` (None: 0) per dim.
    pub fn dynamic_slice(
        &mut self,
        x: ValueId,
        starts: &[Option<ValueId>],
        sizes: &[usize],
    ) -> Result<ValueId> {
        let mut operands = vec![x];
        for s in starts {
            operands.push(match s {
                Some(v) => *v,
                None => self.scalar(DType::I32, 0.0)?,
            });
        }
        self.emit(Op::DynamicSlice(sizes.to_vec()), &operands)
    }

    /// Pads `x` with zeros at the end of `dim` to `len` elements (no-op if already).
    pub fn pad_to(&mut self, x: ValueId, dim: usize, len: usize) -> Result<ValueId> {
        let ty = self.ty(x).clone();
        if ty.shape[dim] >= len {
            return Ok(x);
        }
        let zero = self.scalar(ty.dtype, 0.0)?;
        let mut high = vec![0i64; ty.rank()];
        high[dim] = (len - ty.shape[dim]) as i64;
        self.emit(
            Op::Pad {
                low: vec![0; ty.rank()],
                high,
                interior: vec![0; ty.rank()],
            },
            &[x, zero],
        )
    }

    /// Keeps the first `len` elements of `dim` (no-op if already that long).
    pub fn truncate(&mut self, x: ValueId, dim: usize, len: usize) -> Result<ValueId> {
        self.slice_dim(x, dim, 0, len)
    }

    /// Elements `start..end` of `dim`, all of the other dims (no-op if that is all).
    pub fn slice_dim(
        &mut self,
        x: ValueId,
        dim: usize,
        start: usize,
        end: usize,
    ) -> Result<ValueId> {
        let shape = self.shape(x);
        if start == 0 && end == shape[dim] {
            return Ok(x);
        }
        let mut first = vec![0; shape.len()];
        first[dim] = start;
        let mut limit = shape.clone();
        limit[dim] = end;
        self.emit(
            Op::Slice {
                start: first,
                limit,
                stride: vec![1; shape.len()],
            },
            &[x],
        )
    }

    /// [`Op::CollectiveShift`] of `x` by `offset` along the group of `axes`.
    pub fn shift(
        &mut self,
        x: ValueId,
        axes: &[String],
        offset: i64,
        wrap: bool,
    ) -> Result<ValueId> {
        self.collective_shift(x, axes, offset, wrap, false)
    }

    /// [`Op::CollectiveShift`] of `x` with `mirror`, by `offset` without wrap, along the
    /// group of `axes`: member `i` receives member `size - 1 - (i - offset)`'s `x`
    /// (zeros when that is outside the group).
    pub fn mirror(&mut self, x: ValueId, axes: &[String], offset: i64) -> Result<ValueId> {
        self.collective_shift(x, axes, offset, false, true)
    }

    fn collective_shift(
        &mut self,
        x: ValueId,
        axes: &[String],
        offset: i64,
        wrap: bool,
        mirror: bool,
    ) -> Result<ValueId> {
        let group = self.group(axes);
        self.emit(
            Op::CollectiveShift {
                group,
                offset,
                wrap,
                mirror,
            },
            &[x],
        )
    }
}

impl crate::ir::EmitOps for Emitter<'_> {
    fn emit_op(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        self.emit(op, operands)
    }

    fn shape_of(&self, v: ValueId) -> Vec<usize> {
        self.shape(v)
    }
}
