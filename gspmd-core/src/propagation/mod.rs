//! Sharding propagation (GSPMD section 3.5, Shardy's factor-based propagation): from a
//! few user annotations, a sharding for every value.
//!
//! - `rule`: [`OpShardingRule`], an op's dims as shared factors;
//! - `registry`: [`sharding_rule`], the rule of every op (the only per-op knowledge);
//! - `factor_sharding`: a dim's axes projected onto its factors, and refined through one;
//! - `factor_propagation`: one step at one op;
//! - `propagate`: the driver ([`propagate`]), with priorities and fixed-point sweeps;
//! - `regions`: the regions of control-flow ops, propagated with a fixed boundary;
//! - `explain`: [`explain`], where a value's sharding came from.

mod explain;
mod factor_propagation;
mod factor_sharding;
mod propagate;
mod regions;
mod registry;
mod rule;
mod state;

pub use explain::explain;
pub use propagate::propagate;
pub use registry::sharding_rule;
pub use rule::{Factor, FactorKind, OpShardingRule, TensorFactors};
