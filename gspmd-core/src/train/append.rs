//! [`Appender`]: appends typed nodes to a program, each at one source location. The
//! optimizer updates and the step program's new parameters speak only through it.

use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Literal, Location, Node, Op, Program, TensorType, UnaryOp, ValueId};
use crate::sharding::Sharding;

/// Appends nodes to `program`, typed with [`infer_type`] and located at `location`.
pub(super) struct Appender<'p> {
    program: &'p mut Program,
    /// Location given to the nodes appended next (the trained parameter's).
    pub(super) location: Location,
}

impl<'p> Appender<'p> {
    /// An appender to `program`.
    pub(super) fn new(program: &'p mut Program) -> Self {
        Appender {
            program,
            location: Location::synthetic(),
        }
    }

    /// Type, annotation and location of `v`.
    pub(super) fn describe(&self, v: ValueId) -> (TensorType, Option<Sharding>, Location) {
        let node = self.program.node(v);
        (node.ty.clone(), node.annotation.clone(), node.location)
    }

    /// Appends the next parameter of the program, typed `ty`, named and annotated;
    /// returns its parameter index and value.
    pub(super) fn parameter(
        &mut self,
        name: String,
        ty: TensorType,
        annotation: Option<Sharding>,
    ) -> (usize, ValueId) {
        let index = self.program.params.len();
        let id = self.program.push(Node {
            op: Op::Parameter {
                index,
                ty: ty.clone(),
            },
            operands: Vec::new(),
            ty,
            annotation,
            sharding: None,
            origin: None,
            name: Some(name),
            location: self.location,
        });
        self.program.params.push(id);
        (index, id)
    }

    /// Appends `op` applied to `operands`, carrying `annotation`.
    fn push(
        &mut self,
        op: Op,
        operands: &[ValueId],
        annotation: Option<Sharding>,
    ) -> Result<ValueId> {
        let name = op.name();
        let id = (self.program.push_op(op, operands, self.location)).map_err(|message| {
            Error::Shape {
                op: name,
                location: self.location,
                message: format!("in the training step: {message}"),
            }
        })?;
        self.program.node_mut(id).annotation = annotation;
        Ok(id)
    }

    pub(super) fn binary(&mut self, op: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.push(Op::Binary(op), &[x, y], None)
    }

    pub(super) fn unary(&mut self, op: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.push(Op::Unary(op), &[x], None)
    }

    /// The f32 scalar `s` (a value of rank 0) broadcast to the shape of `like`.
    pub(super) fn broadcast_like(&mut self, s: ValueId, like: ValueId) -> Result<ValueId> {
        let shape = self.program.ty(like).shape.clone();
        self.push(
            Op::Broadcast {
                shape,
                dims: Vec::new(),
            },
            &[s],
            None,
        )
    }

    /// `x * c` for an f32 constant `c`.
    pub(super) fn scale(&mut self, x: ValueId, c: f32) -> Result<ValueId> {
        let c = self.push(Op::Constant(Literal::scalar_f32(c)), &[], None)?;
        let c = self.broadcast_like(c, x)?;
        self.binary(BinaryOp::Mul, x, c)
    }

    /// `x + c` for an f32 constant `c`.
    pub(super) fn add_constant(&mut self, x: ValueId, c: f32) -> Result<ValueId> {
        let c = self.push(Op::Constant(Literal::scalar_f32(c)), &[], None)?;
        let c = self.broadcast_like(c, x)?;
        self.binary(BinaryOp::Add, x, c)
    }

    /// `x / s` for an f32 scalar value `s`.
    pub(super) fn div_scalar(&mut self, x: ValueId, s: ValueId) -> Result<ValueId> {
        let s = self.broadcast_like(s, x)?;
        self.binary(BinaryOp::Div, x, s)
    }

    /// `x` pinned to `annotation` by a `sharding_constraint`, or `x` itself for `None`.
    pub(super) fn constrain(
        &mut self,
        x: ValueId,
        annotation: Option<Sharding>,
    ) -> Result<ValueId> {
        match annotation {
            Some(sharding) => self.push(Op::ShardingConstraint, &[x], Some(sharding)),
            None => Ok(x),
        }
    }

    /// Names `v` for printed programs and reports.
    pub(super) fn name(&mut self, v: ValueId, name: String) {
        self.program.node_mut(v).name = Some(name);
    }
}
