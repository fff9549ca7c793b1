//! Meshes of devices with named axes, and shardings that map tensor dims onto them
//! (Shardy's and JAX's named-axis model).

mod mesh;
mod parse;
mod spec;
mod sub_axis;
mod tiling;
mod visualize;

pub use mesh::Mesh;
pub use spec::{DimSharding, Sharding};
pub use sub_axis::AxisPart;
pub(crate) use sub_axis::{cut_at, merge_adjacent};
pub use tiling::dim_shard;
pub use visualize::visualize;
