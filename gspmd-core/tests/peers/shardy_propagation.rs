//! Cases ported from `shardy/dialect/sdy/transforms/propagation/test/*.mlir`.

use crate::harness::Case;

/// The ported cases, in the order of the peer's file.
pub const CASES: &[Case] = &[];
