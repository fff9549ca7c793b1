//! `convolution` as a [`Contraction`]: batch (input and output) and output features
//! (kernel and output) keep the target's axes, input features (input and kernel) are
//! contracted like a dot's contracting dims (partial sums, reduced by the driver's
//! reshard), and spatial dims where the window moves nothing pass through like batch
//! dims. Spatial dims with a real window are computed whole — gathered, with a warning
//! naming the user's line, until halo exchange exists — and so are the feature dims of
//! a grouped convolution.

use super::super::emit::Emitter;
use super::super::value::PValue;
use super::contraction::{Contraction, contract};
use crate::error::Result;
use crate::ir::{ConvConfig, Node};
use crate::sharding::Sharding;

pub(super) fn convolution(
    em: &mut Emitter,
    node: &Node,
    config: &ConvConfig,
    input: &PValue,
    kernel: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let dn = &config.dims;
    let grouped = config.feature_group_count != 1;
    let rank = node.ty.rank();
    let mut result = vec![(None, None); rank];
    result[dn.output_batch] = (Some(dn.input_batch), None);
    if !grouped {
        result[dn.output_feature] = (None, Some(dn.kernel_output_feature));
    }
    let mut gathered = Vec::new();
    for (i, w) in config.window.iter().enumerate() {
        let (x, k, out) = (
            dn.input_spatial[i],
            dn.kernel_spatial[i],
            dn.output_spatial[i],
        );
        if w.is_trivial() {
            result[out] = (Some(x), None);
        } else if !input.sharding.dims[x].axes.is_empty()
            || !target.dims[out].axes.is_empty()
            || !kernel.sharding.dims[k].axes.is_empty()
        {
            gathered.push(i);
        }
    }
    if !gathered.is_empty() {
        em.warn(format!(
            "spatial dims {gathered:?} gathered whole until halo exchange"
        ));
    }
    let split = |v: &PValue, d: usize| !v.sharding.dims[d].axes.is_empty();
    if grouped
        && (split(input, dn.input_feature)
            || split(kernel, dn.kernel_input_feature)
            || split(kernel, dn.kernel_output_feature)
            || !target.dims[dn.output_feature].axes.is_empty())
    {
        em.warn(format!(
            "features in {} groups gathered whole",
            config.feature_group_count
        ));
    }
    let contracting = if grouped {
        Vec::new()
    } else {
        vec![(dn.input_feature, dn.kernel_input_feature)]
    };
    let c = Contraction {
        result,
        contracting,
        lhs_rank: input.global.rank(),
        rhs_rank: kernel.global.rank(),
        taps: dn
            .kernel_spatial
            .iter()
            .map(|&d| kernel.global.shape[d] as f64)
            .product(),
    };
    let local = node.op.clone();
    contract(em, &c, input, kernel, target, node.ty.clone(), local)
}
