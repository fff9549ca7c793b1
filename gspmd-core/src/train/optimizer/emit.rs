//! [`Emitter`]: the ops a [`Transform`](super::Transform) emits its update with,
//! appended to the step program (the gradient's ops of [`Appender`], made public for
//! transforms written outside the crate).

use super::transform::Param;
use crate::error::Result;
use crate::ir::{Appender, BinaryOp, DType, Location, UnaryOp, ValueId};

/// Appends nodes to the step program. Nodes are located at the step's loss unless
/// emitted inside [`Emitter::each`], which locates them at the parameter's definition.
pub struct Emitter<'a, 'p> {
    a: &'a mut Appender<'p>,
    /// The location of nodes not of one parameter.
    step: Location,
}

impl<'a, 'p> Emitter<'a, 'p> {
    /// An emitter appending through `a`; nodes go at `a`'s current location.
    pub(crate) fn new(a: &'a mut Appender<'p>) -> Self {
        let step = a.location;
        Emitter { a, step }
    }

    /// Calls `f` on each of `params` in turn with the nodes it emits located at that
    /// parameter: the form of a transform that updates each parameter on its own.
    pub fn each(
        &mut self,
        params: &mut [Param],
        mut f: impl FnMut(&mut Self, &mut Param) -> Result<()>,
    ) -> Result<()> {
        for p in params {
            self.a.location = p.location;
            let done = f(self, p);
            self.a.location = self.step;
            done?;
        }
        Ok(())
    }

    /// The shape of `v`.
    pub fn shape(&self, v: ValueId) -> Vec<usize> {
        self.a.shape(v)
    }

    /// The dtype of `v`.
    pub fn dtype(&self, v: ValueId) -> DType {
        self.a.ty(v).dtype
    }

    /// Names `v` in printed programs and reports.
    pub fn name(&mut self, v: ValueId, name: &str) {
        self.a.name(v, name.to_string());
    }

    /// An elementwise unary op.
    pub fn unary(&mut self, op: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.a.unary(op, x)
    }

    /// An elementwise binary op of two values of one shape and dtype.
    pub fn binary(&mut self, op: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.a.binary(op, x, y)
    }

    /// `x + y`.
    pub fn add(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.a.add(x, y)
    }

    /// `x - y`.
    pub fn sub(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.a.sub(x, y)
    }

    /// `x * y`.
    pub fn mul(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.a.mul(x, y)
    }

    /// `x / y`.
    pub fn div(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.a.div(x, y)
    }

    /// `x * c` for a constant `c`.
    pub fn scale(&mut self, x: ValueId, c: f32) -> Result<ValueId> {
        self.a.scale(x, c)
    }

    /// `x + c` for a constant `c`.
    pub fn add_constant(&mut self, x: ValueId, c: f32) -> Result<ValueId> {
        self.a.add_constant(x, c)
    }

    /// `c - x` for a constant `c`.
    pub fn rsub(&mut self, c: f32, x: ValueId) -> Result<ValueId> {
        self.a.rsub(c, x)
    }

    /// `x * s` for a scalar value `s` (rank 0), broadcast.
    pub fn mul_scalar(&mut self, x: ValueId, s: ValueId) -> Result<ValueId> {
        self.a.mul_scalar(x, s)
    }

    /// `x / s` for a scalar value `s` (rank 0), broadcast.
    pub fn div_scalar(&mut self, x: ValueId, s: ValueId) -> Result<ValueId> {
        self.a.div_scalar(x, s)
    }

    /// A `shape`-shaped f32 constant `value`.
    pub fn full(&mut self, shape: &[usize], value: f32) -> Result<ValueId> {
        self.a.full(shape, DType::F32, value)
    }

    /// `max(x, c)` for a scalar `x` and a constant `c`.
    pub fn max_constant(&mut self, x: ValueId, c: f32) -> Result<ValueId> {
        let c = self.a.full(&[], self.dtype(x), c)?;
        self.a.binary(BinaryOp::Max, x, c)
    }

    /// `broadcast_in_dim`: `x`'s dim `i` becomes dim `dims[i]` of `shape`.
    pub fn broadcast(&mut self, x: ValueId, shape: &[usize], dims: &[usize]) -> Result<ValueId> {
        self.a.broadcast(x, shape, dims)
    }

    /// The sum over `dims` (sorted; removed).
    pub fn reduce_sum(&mut self, x: ValueId, dims: &[usize]) -> Result<ValueId> {
        self.a.reduce_sum(x, dims)
    }

    /// The sum of all elements: a scalar.
    pub fn sum_all(&mut self, x: ValueId) -> Result<ValueId> {
        self.a.sum_all(x)
    }

    /// The mean over dim `dim` (removed).
    pub fn mean_over(&mut self, x: ValueId, dim: usize) -> Result<ValueId> {
        let size = self.shape(x)[dim];
        let sum = self.a.reduce_sum(x, &[dim])?;
        self.a.scale(sum, 1.0 / size as f32)
    }

    /// `sqrt(mean(x^2))` over all elements: a scalar.
    pub fn root_mean_square(&mut self, x: ValueId) -> Result<ValueId> {
        let count: usize = self.shape(x).iter().product();
        let squares = self.a.mul(x, x)?;
        let sum = self.a.sum_all(squares)?;
        let mean = self.a.scale(sum, 1.0 / count.max(1) as f32)?;
        self.a.unary(UnaryOp::Sqrt, mean)
    }
}
