//! Element types, shapes and value ids.

use std::fmt;

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 32-bit float: activations and weights.
    F32,
    /// bfloat16 (`half::bf16`: f32's exponent, 8 bits of significand): activations and
    /// weights in mixed precision. Arithmetic runs in f32 (see `runtime::kernels`).
    BF16,
    /// IEEE half precision (`half::f16`). Arithmetic runs in f32, like [`DType::BF16`].
    F16,
    /// 32-bit signed integer: indices, token ids.
    I32,
    /// Boolean: masks and predicates.
    Bool,
}

impl DType {
    /// Every element type.
    pub const ALL: [DType; 5] = [DType::F32, DType::BF16, DType::F16, DType::I32, DType::Bool];

    /// Size of one element in bytes.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point type (f32, bf16, f16): the dtypes of
    /// differentiable values and of the transcendental functions.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }

    /// Whether this is a float narrower than f32 (bf16, f16), whose arithmetic the kernels
    /// run in f32.
    pub const fn is_narrow_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16)
    }

    /// The printed name, HLO style (`pred` for bool).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::Bool => "pred",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The dims of a tensor, major to minor. Rank 0 is a scalar.
pub type Shape = Vec<usize>;

/// Number of elements of a shape (1 for a scalar). Cannot overflow for the shape of a
/// [`TensorType`] that respects its size invariant; for other shapes use
/// `checked_num_elements`.
pub fn num_elements(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Number of elements of a shape, or `None` if it does not fit in `usize`.
pub(crate) fn checked_num_elements(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// Shape and element type of a value.
///
/// **Size invariant.** Every type in a traced or verified program (the result of
/// the IR's shape rules (`infer_type`), which checks it with [`TensorType::check_size`]) has
/// `product of its non-zero dims × element size ≤ isize::MAX`, the most bytes one
/// allocation may hold. So its element count, its byte size, the product of any subset
/// of its dims and each dim as an `i64` fit without overflow, and code handling a
/// program's types may multiply and convert them freely.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Dims, major to minor.
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
}

impl TensorType {
    /// A tensor type.
    pub fn new(shape: impl Into<Shape>, dtype: DType) -> Self {
        TensorType {
            shape: shape.into(),
            dtype,
        }
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Size in bytes of the whole (unsharded) tensor. Cannot overflow for a type that
    /// respects the size invariant.
    pub fn size_in_bytes(&self) -> usize {
        num_elements(&self.shape) * self.dtype.size_in_bytes()
    }

    /// Checks the size invariant (see [`TensorType`]); `Err` names the type.
    pub fn check_size(&self) -> Result<(), String> {
        let bytes = self
            .shape
            .iter()
            .filter(|&&d| d != 0)
            .try_fold(self.dtype.size_in_bytes(), |n, &d| n.checked_mul(d));
        match bytes {
            Some(b) if isize::try_from(b).is_ok() => Ok(()),
            _ => Err(format!(
                "{self} is too large: its non-zero dims times {} bytes exceed isize::MAX",
                self.dtype.size_in_bytes()
            )),
        }
    }
}

impl fmt::Display for TensorType {
    /// HLO style: `f32[8,16]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.dtype, join(&self.shape))
    }
}

/// Comma-joins displayable items (no spaces), as HLO prints dims.
pub(crate) fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Identifies one SSA value of an IR program: the result of node number `.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The node index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}
