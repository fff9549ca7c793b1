//! The vocabulary every layer shares: element types, shapes, tensor types, value ids and
//! source locations. This module depends on nothing else in the crate, so errors,
//! shardings and the IR can all name these types without a cycle.

mod location;
mod tensor;

pub use location::Location;
pub use tensor::{DType, Shape, TensorType, ValueId, num_elements};
pub(crate) use tensor::{checked_num_elements, join};
