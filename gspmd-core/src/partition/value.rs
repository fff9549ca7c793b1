//! [`PValue`]: a global value as the per-device program holds it.

use crate::ir::{TensorType, ValueId};
use crate::sharding::Sharding;

/// A global value in the per-device program: `id` holds this device's block of a value
/// of type `global` sharded as `sharding` — padded to the sharding's local shape (each
/// dim rounded up); the padding holds arbitrary values. Devices along
/// `sharding.unreduced` hold partial sums of the value.
#[derive(Debug, Clone)]
pub struct PValue {
    /// The local block.
    pub id: ValueId,
    /// The global type.
    pub global: TensorType,
    /// How the global value is tiled over the mesh.
    pub sharding: Sharding,
}
