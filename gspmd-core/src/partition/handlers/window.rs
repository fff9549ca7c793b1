//! `reduce_window`. Dims the window leaves alone (size 1, stride 1, no padding) keep
//! the target's axes: result element `j` there is computed from operand element `j`
//! alone, so a block padded along them only computes padding. Windowed dims are made
//! whole first, with a warning naming the user's line, and the op runs locally with its
//! global window; so no block padding ever falls under a window, and max and min never
//! see it. (Halo exchange for split windowed dims is a later refinement; results are
//! exact now.)

use super::super::emit::Emitter;
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::with_dims;
use crate::error::Result;
use crate::ir::{Node, WindowDim};
use crate::sharding::Sharding;

pub(super) fn reduce_window(
    em: &mut Emitter,
    node: &Node,
    window: &[WindowDim],
    x: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let windowed: Vec<usize> = (0..window.len())
        .filter(|&d| !window[d].is_trivial())
        .collect();
    let split: Vec<usize> = (windowed.iter().copied())
        .filter(|&d| !target.dims[d].axes.is_empty() || !x.sharding.dims[d].axes.is_empty())
        .collect();
    if !split.is_empty() {
        em.warn(format!(
            "reduce_window along split dims {split:?}: windowed dim gathered whole until halo exchange"
        ));
    }
    let dims = (target.dims.iter().enumerate())
        .map(|(d, s)| {
            if windowed.contains(&d) {
                Vec::new()
            } else {
                s.axes.clone()
            }
        })
        .collect();
    let want = with_dims(dims, Vec::new());
    let x = reshard(em, x, &want)?;
    let id = em.emit(node.op.clone(), &[x.id])?;
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding: want,
    })
}
