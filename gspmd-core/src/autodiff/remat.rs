//! A region's VJP under a [`Remat`] policy: the forward values the policy saves are
//! read as parameters instead of recomputed.
//!
//! [`super::sweep::vjp`] copies the forward region and appends the backward nodes,
//! which read forward values (a product's operands, a `tanh`'s result). A saved value
//! turns, in place, into a parameter (its id and its readers unchanged, so the
//! backward nodes built from its op's rule stay right); the recomputation that only fed
//! saved values is then dead code. Only values the gradients read are saved: a value
//! whose readers are all recomputed from other saved values is not (the walk treats
//! every value the policy could save as a leaf, and saves those it reaches). Only the
//! region's own values can be saved: a scan nested in the body stacks its residuals
//! as new nodes of the VJP, which the backward body recomputes (its forward scan runs
//! again) under every policy.

use crate::ir::{Op, Program, Remat, ValueId};

/// Turns the values of `region` (the forward part of `vjp`, its first nodes) that
/// `remat` saves and `vjp`'s outputs read into parameters of `vjp`, after its others,
/// named `saved(<value>)`. Returns them in parameter order. Values that depend on no
/// parameter of `region` (constants) are recomputed under every policy.
pub(super) fn read_saved(vjp: &mut Program, region: &Program, remat: Remat) -> Vec<ValueId> {
    if remat == Remat::NothingSaveable {
        return Vec::new();
    }
    let mut varying = vec![false; region.nodes.len()];
    for (i, node) in region.nodes.iter().enumerate() {
        varying[i] = matches!(node.op, Op::Parameter { .. })
            || node.operands.iter().any(|o| varying[o.index()]);
    }
    let saveable = |i: usize| i < region.nodes.len() && varying[i] && remat.saves(&vjp.nodes[i]);
    let mut read = vec![false; vjp.nodes.len()];
    for o in &vjp.outputs {
        read[o.index()] = true;
    }
    for i in (0..vjp.nodes.len()).rev() {
        if read[i] && !saveable(i) {
            for o in &vjp.nodes[i].operands {
                read[o.index()] = true;
            }
        }
    }
    let saved: Vec<ValueId> = (0..region.nodes.len())
        .filter(|&i| read[i] && saveable(i))
        .map(|i| ValueId(i as u32))
        .collect();
    for &v in &saved {
        let index = vjp.params.len();
        let node = vjp.node_mut(v);
        let what = node.name.clone().unwrap_or_else(|| v.to_string());
        node.name = Some(format!("saved({what})"));
        node.op = Op::Parameter {
            index,
            ty: node.ty.clone(),
        };
        node.operands.clear();
        vjp.params.push(v);
    }
    saved
}
