//! Host arrays with a runtime element type: constants in the IR, inputs and outputs of
//! runs (XLA calls this a literal).

use ndarray::{ArrayD, IxDyn};

use crate::types::{DType, Shape};

/// A dense host array of one of the IR's element types.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// f32 elements.
    F32(ArrayD<f32>),
    /// i32 elements.
    I32(ArrayD<i32>),
    /// bool elements.
    Bool(ArrayD<bool>),
}

impl Literal {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Literal::F32(_) => DType::F32,
            Literal::I32(_) => DType::I32,
            Literal::Bool(_) => DType::Bool,
        }
    }

    /// Dims.
    pub fn shape(&self) -> Shape {
        match self {
            Literal::F32(a) => a.shape().to_vec(),
            Literal::I32(a) => a.shape().to_vec(),
            Literal::Bool(a) => a.shape().to_vec(),
        }
    }

    /// An f32 scalar.
    pub fn scalar_f32(v: f32) -> Self {
        Literal::F32(ArrayD::from_elem(IxDyn(&[]), v))
    }

    /// A tensor of `shape` filled with `v` converted to `dtype` (non-zero is `true`).
    pub fn full(shape: &[usize], dtype: DType, v: f64) -> Self {
        let dim = IxDyn(shape);
        match dtype {
            DType::F32 => Literal::F32(ArrayD::from_elem(dim, v as f32)),
            DType::I32 => Literal::I32(ArrayD::from_elem(dim, v as i32)),
            DType::Bool => Literal::Bool(ArrayD::from_elem(dim, v != 0.0)),
        }
    }

    /// The f32 array, if this is one.
    pub fn as_f32(&self) -> Option<&ArrayD<f32>> {
        match self {
            Literal::F32(a) => Some(a),
            _ => None,
        }
    }

    /// The i32 array, if this is one.
    pub fn as_i32(&self) -> Option<&ArrayD<i32>> {
        match self {
            Literal::I32(a) => Some(a),
            _ => None,
        }
    }

    /// The bool array, if this is one.
    pub fn as_bool(&self) -> Option<&ArrayD<bool>> {
        match self {
            Literal::Bool(a) => Some(a),
            _ => None,
        }
    }
}

impl From<ArrayD<f32>> for Literal {
    fn from(a: ArrayD<f32>) -> Self {
        Literal::F32(a)
    }
}

impl From<ArrayD<i32>> for Literal {
    fn from(a: ArrayD<i32>) -> Self {
        Literal::I32(a)
    }
}

impl From<ArrayD<bool>> for Literal {
    fn from(a: ArrayD<bool>) -> Self {
        Literal::Bool(a)
    }
}
