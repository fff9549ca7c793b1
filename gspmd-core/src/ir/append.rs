//! [`Appender`]: appends typed primitive nodes to an existing program, each at one
//! source location — for passes that extend a program (the gradient rules of
//! `autodiff`, the optimizer updates of `train`). Shape helpers that would be identities
//! emit nothing.

use super::{
    BinaryOp, CompareOp, ConvConfig, DType, DotDims, Literal, Location, Node, Op, Program,
    ReduceKind, TensorType, UnaryOp, ValueId,
};
use crate::error::{Error, Result};
use crate::sharding::Sharding;

/// Appends nodes to `program`. Each node gets `location` (the forward node's) and is
/// typed with [`infer_type`]; shape helpers that would be identities emit nothing.
pub(crate) struct Appender<'p> {
    program: &'p mut Program,
    /// Location given to the nodes emitted next.
    pub(crate) location: Location,
    /// What is being built, for errors: `gradient`, `training step`.
    context: &'static str,
}

impl<'p> Appender<'p> {
    /// An appender to `program`; errors say they arose building `context`.
    pub(crate) fn new(program: &'p mut Program, context: &'static str) -> Self {
        Appender {
            program,
            location: Location::synthetic(),
            context,
        }
    }

    /// Type of `v` (a forward value or one emitted before).
    pub(crate) fn ty(&self, v: ValueId) -> &TensorType {
        self.program.ty(v)
    }

    /// Shape of `v`, owned (rules keep it while emitting).
    pub(crate) fn shape(&self, v: ValueId) -> Vec<usize> {
        self.ty(v).shape.clone()
    }

    /// Gives `v` a name for printed programs and reports, unless it has one.
    pub(crate) fn name_if_unnamed(&mut self, v: ValueId, name: String) {
        self.program.node_mut(v).name.get_or_insert(name);
    }

    /// Appends `op` applied to `operands`, carrying `annotation`.
    fn push_annotated(
        &mut self,
        op: Op,
        operands: &[ValueId],
        annotation: Option<Sharding>,
    ) -> Result<ValueId> {
        // A failure here is a pass emitting ill-typed nodes; it names the op and the
        // location rather than panicking.
        let id =
            self.program
                .push_op(op, operands, self.location)
                .map_err(|error| match error {
                    Error::Shape {
                        op,
                        location,
                        message,
                    } => Error::Shape {
                        op,
                        location,
                        message: format!("in the {}: {message}", self.context),
                    },
                    other => other,
                })?;
        self.program.node_mut(id).annotation = annotation;
        Ok(id)
    }

    /// Replaces the op of the existing node `v` by `op`, which must give `v`'s type on
    /// `v`'s operands (the autodiff of a scan adds outputs to the scan of its forward
    /// result nodes).
    pub(crate) fn replace_op(&mut self, v: ValueId, op: Op) {
        self.program.node_mut(v).op = op;
    }

    /// Appends `op` applied to `operands`.
    pub(crate) fn push(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        self.push_annotated(op, operands, None)
    }

    /// A `shape`-shaped `dtype` tensor of `value`: a scalar constant, broadcast if needed.
    pub(crate) fn full(&mut self, shape: &[usize], dtype: DType, value: f32) -> Result<ValueId> {
        let constant = Literal::full(&[], dtype, f64::from(value));
        let scalar = self.push(Op::Constant(constant), &[])?;
        self.broadcast(scalar, shape, &[])
    }

    /// `value` shaped and typed like `v`.
    fn full_like(&mut self, v: ValueId, value: f32) -> Result<ValueId> {
        let TensorType { shape, dtype } = self.ty(v).clone();
        self.full(&shape, dtype, value)
    }

    /// `0` shaped and typed like `v`.
    pub(crate) fn zeros_like(&mut self, v: ValueId) -> Result<ValueId> {
        self.full_like(v, 0.0)
    }

    pub(crate) fn unary(&mut self, op: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.push(Op::Unary(op), &[x])
    }

    pub(crate) fn binary(&mut self, op: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.push(Op::Binary(op), &[x, y])
    }

    pub(crate) fn add(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Add, x, y)
    }

    pub(crate) fn sub(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Sub, x, y)
    }

    pub(crate) fn mul(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Mul, x, y)
    }

    pub(crate) fn div(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Div, x, y)
    }

    /// `x * c` for a constant `c` (in `x`'s dtype).
    pub(crate) fn scale(&mut self, x: ValueId, c: f32) -> Result<ValueId> {
        let c = self.full_like(x, c)?;
        self.mul(x, c)
    }

    /// `c - x` for a constant `c` (in `x`'s dtype).
    pub(crate) fn rsub(&mut self, c: f32, x: ValueId) -> Result<ValueId> {
        let c = self.full_like(x, c)?;
        self.sub(c, x)
    }

    pub(crate) fn compare(&mut self, op: CompareOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.push(Op::Compare(op), &[x, y])
    }

    pub(crate) fn select(&mut self, pred: ValueId, t: ValueId, f: ValueId) -> Result<ValueId> {
        self.push(Op::Select, &[pred, t, f])
    }

    /// A bool mask as 0/1 in the dtype of `like`.
    pub(crate) fn mask_like(&mut self, mask: ValueId, like: ValueId) -> Result<ValueId> {
        let dtype = self.ty(like).dtype;
        self.push(Op::Convert(dtype), &[mask])
    }

    /// `broadcast_in_dim`; nothing if `x` already has `shape`.
    pub(crate) fn broadcast(
        &mut self,
        x: ValueId,
        shape: &[usize],
        dims: &[usize],
    ) -> Result<ValueId> {
        if self.ty(x).shape == shape {
            return Ok(x);
        }
        let op = Op::Broadcast {
            shape: shape.to_vec(),
            dims: dims.to_vec(),
        };
        self.push(op, &[x])
    }

    /// Sum over `dims` (sorted); nothing if `dims` is empty.
    pub(crate) fn reduce_sum(&mut self, x: ValueId, dims: &[usize]) -> Result<ValueId> {
        if dims.is_empty() {
            return Ok(x);
        }
        let op = Op::Reduce {
            kind: ReduceKind::Sum,
            dims: dims.to_vec(),
        };
        self.push(op, &[x])
    }

    /// Sum of all elements: an f32 scalar.
    pub(crate) fn sum_all(&mut self, x: ValueId) -> Result<ValueId> {
        let dims: Vec<usize> = (0..self.ty(x).rank()).collect();
        self.reduce_sum(x, &dims)
    }

    /// Row-major reshape; nothing if `x` already has `shape`.
    pub(crate) fn reshape(&mut self, x: ValueId, shape: &[usize]) -> Result<ValueId> {
        if self.ty(x).shape == shape {
            return Ok(x);
        }
        self.push(Op::Reshape(shape.to_vec()), &[x])
    }

    /// Transpose; nothing for the identity permutation.
    pub(crate) fn transpose(&mut self, x: ValueId, perm: &[usize]) -> Result<ValueId> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        self.push(Op::Transpose(perm.to_vec()), &[x])
    }

    /// Strided slice; nothing if it takes all of `x`.
    pub(crate) fn slice(
        &mut self,
        x: ValueId,
        start: Vec<usize>,
        limit: Vec<usize>,
        stride: Vec<usize>,
    ) -> Result<ValueId> {
        let whole = start.iter().all(|&s| s == 0)
            && stride.iter().all(|&s| s == 1)
            && limit == self.ty(x).shape;
        if whole {
            return Ok(x);
        }
        let op = Op::Slice {
            start,
            limit,
            stride,
        };
        self.push(op, &[x])
    }

    /// Pads `x` with the scalar `value` (in `x`'s dtype).
    pub(crate) fn pad(
        &mut self,
        x: ValueId,
        value: f32,
        low: Vec<i64>,
        high: Vec<i64>,
        interior: Vec<usize>,
    ) -> Result<ValueId> {
        let value = Literal::full(&[], self.ty(x).dtype, f64::from(value));
        let value = self.push(Op::Constant(value), &[])?;
        let op = Op::Pad {
            low,
            high,
            interior,
        };
        self.push(op, &[x, value])
    }

    pub(crate) fn dot_general(&mut self, x: ValueId, y: ValueId, dims: DotDims) -> Result<ValueId> {
        self.push(Op::DotGeneral(dims), &[x, y])
    }

    pub(crate) fn convolution(
        &mut self,
        input: ValueId,
        kernel: ValueId,
        config: ConvConfig,
    ) -> Result<ValueId> {
        self.push(Op::Convolution(config), &[input, kernel])
    }

    /// `x` reversed along `dims`; `x` itself when `dims` is empty.
    pub(crate) fn reverse(&mut self, x: ValueId, dims: &[usize]) -> Result<ValueId> {
        if dims.is_empty() {
            return Ok(x);
        }
        self.push(Op::Reverse(dims.to_vec()), &[x])
    }

    /// A `sharding_constraint` pinning `x` to `sharding`; `x` itself for `None`.
    pub(crate) fn constrain(&mut self, x: ValueId, sharding: Option<Sharding>) -> Result<ValueId> {
        match sharding {
            Some(s) => self.push_annotated(Op::ShardingConstraint, &[x], Some(s)),
            None => Ok(x),
        }
    }

    /// Type, annotation and location of `v`.
    pub(crate) fn describe(&self, v: ValueId) -> (TensorType, Option<Sharding>, Location) {
        let node = self.program.node(v);
        (node.ty.clone(), node.annotation.clone(), node.location)
    }

    /// Appends the next parameter of the program, typed `ty`, named and annotated;
    /// returns its parameter index and value.
    pub(crate) fn parameter(
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
            why: Vec::new(),
        });
        self.program.params.push(id);
        (index, id)
    }

    /// `x + c` for a constant `c` (in `x`'s dtype).
    pub(crate) fn add_constant(&mut self, x: ValueId, c: f32) -> Result<ValueId> {
        let c = self.full_like(x, c)?;
        self.add(x, c)
    }

    /// `x / s` for an f32 scalar value `s` (rank 0).
    pub(crate) fn div_scalar(&mut self, x: ValueId, s: ValueId) -> Result<ValueId> {
        let shape = self.shape(x);
        let s = self.broadcast(s, &shape, &[])?;
        self.div(x, s)
    }

    /// `x * s` for an f32 scalar value `s`.
    pub(crate) fn mul_scalar(&mut self, x: ValueId, s: ValueId) -> Result<ValueId> {
        let shape = self.shape(x);
        let s = self.broadcast(s, &shape, &[])?;
        self.mul(x, s)
    }

    /// Names `v` for printed programs and reports.
    pub(crate) fn name(&mut self, v: ValueId, name: String) {
        self.program.node_mut(v).name = Some(name);
    }
}

impl super::EmitOps for Appender<'_> {
    fn emit_op(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        self.push(op, operands)
    }

    fn shape_of(&self, v: ValueId) -> Vec<usize> {
        self.shape(v)
    }
}
