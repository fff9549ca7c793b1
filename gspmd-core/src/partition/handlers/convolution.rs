//! `convolution` as a [`Contraction`]: batch (input and output) and output features
//! (kernel and output) keep the target's axes, input features (input and kernel) are
//! contracted like a dot's contracting dims (partial sums, reduced by the driver's
//! reshard), and spatial dims where the window moves nothing pass through like batch
//! dims. A spatial dim with a real window is
//!
//! - *windowed* when the input and the target's output are split along it: output
//!   block `i` reads the input window of [`halo::sliding_window`] (chunk `ceil(out /
//!   shards)`), which a halo exchange gives each device; the local convolution runs on
//!   that window (the kernel's dim whole) with the local padding `sliding_window` says:
//!   none, or with base (lhs) dilation the few positions that align the dilated
//!   window, so only undilated input rows cross devices (XLA's `lhs_dilate` halo);
//! - a *spatial contraction* when the kernel is split along it (a kernel gradient,
//!   whose "kernel" is the split cotangent): each device convolves
//!   the input window its kernel rows reach (the same formula with the roles of kernel
//!   and output swapped) with its own kernel rows, padding rows of an uneven kernel
//!   masked to 0, and the result is a partial sum over the kernel's axes (computed
//!   whole along the dim; the driver's reshard reduces it to the target);
//! - otherwise computed whole — gathered, with a warning naming the user's line and the
//!   reason, when the input or kernel was split along it.
//!
//! Base dilation along a split input dim that is not windowed so (a spatial
//! contraction, or a base dilation not dividing the output block's stride) is first
//! made an explicit, partitioned interior `pad` (see `undilated`).
//!
//! A convolution with `G > 1` feature (or batch) groups is split by whole groups, as
//! XLA does: when the target splits the output's features over `s` shards and `s`
//! divides `G`, the input's features (batch) and the kernel's output features take the
//! same axes (block `j` of each holds groups `j G/s .. (j+1) G/s`) and each device
//! convolves its blocks with `G/s` groups, with no communication. Otherwise the
//! features are computed whole, with a warning saying why. With batch groups, the
//! output's batch (one group's) is computed whole.

use super::super::emit::Emitter;
use super::super::halo::{self, HaloPlan};
use super::super::reshard::plan_reshard;
use super::super::value::PValue;
use super::contraction::{Contraction, contract};
use super::with_dims;
use crate::error::Result;
use crate::ir::{ConvConfig, Node, Op, WindowDim};
use crate::sharding::Sharding;

/// Base (lhs) dilation along dims the input is split along and that are not windowed
/// with an undilated halo (see the module doc), made explicit: the input padded with
/// `base_dilation - 1` zeros between elements (`data_movement::dilate`: a partitioned
/// interior `pad`, which exchanges halos) and the convolution's window
/// undilated there — the same convolution (XLA's definition of base dilation), now with
/// a window `halo::sliding` can plan. `None` when no such dim is base-dilated.
fn undilated(
    em: &mut Emitter,
    node: &Node,
    config: &ConvConfig,
    (input, kernel): (&PValue, &PValue),
    target: &Sharding,
) -> Result<Option<(PValue, ConvConfig)>> {
    let dn = &config.dims;
    let rank = input.global.rank();
    let mut interior = vec![0; rank];
    let mut local = config.clone();
    for (i, w) in config.window.iter().enumerate() {
        let x = dn.input_spatial[i];
        let out_size = node.ty.shape[dn.output_spatial[i]];
        if w.base_dilation > 1
            && em.mesh.axes_size(&input.sharding.dims[x].axes) > 1
            && !matches!(
                spatial(em, config, i, (input, kernel), target, out_size),
                Spatial::Windowed(..)
            )
        {
            interior[x] = w.base_dilation - 1;
            local.window[i].base_dilation = 1;
        }
    }
    if interior.iter().all(|&n| n == 0) {
        return Ok(None);
    }
    let x = super::data_movement::dilate(em, node, input, interior, 0.0)?;
    Ok(Some((x, local)))
}

/// How spatial dim `i` of a convolution is partitioned.
enum Spatial {
    /// Output blocks read halo-exchanged input windows, through the local window.
    Windowed(HaloPlan, WindowDim),
    /// Kernel blocks read halo-exchanged input windows; the sum over them is pending.
    Contracted(HaloPlan),
    /// Computed whole; `Some(reason)` when that gathers a split operand.
    Whole(Option<&'static str>),
}

/// The partitioning of the non-trivial spatial dim `i` (see the module doc).
fn spatial(
    em: &Emitter,
    config: &ConvConfig,
    i: usize,
    (input, kernel): (&PValue, &PValue),
    target: &Sharding,
    out_size: usize,
) -> Spatial {
    let dn = &config.dims;
    let (x, k, out) = (
        dn.input_spatial[i],
        dn.kernel_spatial[i],
        dn.output_spatial[i],
    );
    let w = &config.window[i];
    let shards = |axes: &[String]| em.mesh.axes_size(axes);
    let (x_shards, k_shards) = (
        shards(&input.sharding.dims[x].axes),
        shards(&kernel.sharding.dims[k].axes),
    );
    let out_shards = shards(&target.dims[out].axes);
    let plan = |window: Result<halo::Window, &'static str>, n: usize| {
        window.and_then(|win| {
            halo::plan(input.global.shape[x], n, win)
                .ok_or("a halo exchange would receive more than gathering")
        })
    };
    if k_shards > 1 {
        let k_axes = &kernel.sharding.dims[k].axes;
        let other_spatial = (dn.output_spatial.iter()).filter(|&&d| d != out);
        if other_spatial
            .flat_map(|&d| &target.dims[d].axes)
            .any(|a| k_axes.contains(a))
        {
            return Spatial::Whole(Some(
                "the target splits another spatial dim over the kernel's axes",
            ));
        }
        // The groups' split (see `split_groups`) keeps those axes.
        let grouped = config.feature_group_count * config.batch_group_count > 1;
        if grouped && (target.dims[dn.output_feature].axes.iter()).any(|a| k_axes.contains(a)) {
            return Spatial::Whole(Some("the target splits the groups over the kernel's axes"));
        }
        // The kernel's rows slide over the input as the output's do in the forward
        // direction: output and kernel swap sizes, strides and dilations.
        let swapped = WindowDim {
            size: out_size,
            stride: w.window_dilation,
            window_dilation: w.stride,
            ..*w
        };
        let chunk = kernel.global.shape[k].div_ceil(k_shards);
        return match plan(halo::sliding(&swapped, x, chunk), k_shards) {
            Ok(p) => Spatial::Contracted(p),
            Err(reason) => Spatial::Whole(Some(reason)),
        };
    }
    if x_shards > 1 && out_shards == 1 {
        return Spatial::Whole(Some("the target's output is not split along it"));
    }
    if out_shards == 1 {
        return Spatial::Whole(None);
    }
    let windowed = halo::sliding_window(w, x, out_size.div_ceil(out_shards))
        .and_then(|(window, local)| Ok((plan(Ok(window), out_shards)?, local)));
    match windowed {
        Ok((p, local))
            if x_shards > 1 || windowing_is_cheaper(em, config, i, input, target, &p) =>
        {
            Spatial::Windowed(p, local)
        }
        Ok(_) => Spatial::Whole(None),
        Err(reason) if x_shards > 1 => Spatial::Whole(Some(reason)),
        Err(_) => Spatial::Whole(None),
    }
}

/// Whether spatial dim `i`, along which the input is not split but the target's output
/// is, costs fewer elements received per device windowed (the input resharded to the
/// output's axes there — an all-to-all when they split its batch, XLA's batch-to-spatial
/// plan — then the halo exchange `plan`) than computed whole (the input resharded with
/// that dim whole, its batch as the target's: an all-gather when the target does not
/// split the batch). Both reshards give the input's batch the target's axes and take
/// the output dim's axes off every other dim; a replicated input is cheaper whole (a
/// local slice of the result, no halo).
fn windowing_is_cheaper(
    em: &Emitter,
    config: &ConvConfig,
    i: usize,
    input: &PValue,
    target: &Sharding,
    plan: &HaloPlan,
) -> bool {
    let dn = &config.dims;
    let (x, out) = (dn.input_spatial[i], dn.output_spatial[i]);
    let out_axes = &target.dims[out].axes;
    let mut dims: Vec<Vec<String>> = input.sharding.dims.iter().map(|d| d.axes.clone()).collect();
    dims[dn.input_batch] = target.dims[dn.output_batch].axes.clone();
    for d in &mut dims {
        d.retain(|a| !out_axes.contains(a));
    }
    let whole = with_dims(dims.clone(), Vec::new());
    dims[x] = out_axes.clone();
    let windowed = with_dims(dims, Vec::new());
    let shape = &input.global.shape;
    let cost = |to: &Sharding| plan_reshard(em.mesh, shape, &input.sharding, to).cost;
    let local = windowed.local_shape(em.mesh, shape);
    let halo = plan.received() * local.iter().product::<usize>() / local[x].max(1);
    cost(&windowed) + (halo as f64) < cost(&whole)
}

/// The (input dim, kernel dim) the output's features are split alike with (see
/// [`Contraction::result`]): the kernel's output features without groups; with `G > 1`
/// feature or batch groups, the grouped input dim (features or batch) and the kernel's
/// output features when the target splits the output's features over `s` shards and
/// `s` divides `G` (`local` then convolves `G / s` groups); otherwise neither, with a
/// warning saying why.
fn split_groups(
    em: &mut Emitter,
    config: &ConvConfig,
    target: &Sharding,
    local: &mut ConvConfig,
) -> (Option<usize>, Option<usize>) {
    let dn = &config.dims;
    let (feature_groups, batch_groups) = (config.feature_group_count, config.batch_group_count);
    let groups = feature_groups * batch_groups;
    if groups == 1 {
        return (None, Some(dn.kernel_output_feature));
    }
    let shards = em.mesh.axes_size(&target.dims[dn.output_feature].axes);
    let (grouped, what) = if batch_groups > 1 {
        (dn.input_batch, "batch")
    } else {
        (dn.input_feature, "features")
    };
    if !groups.is_multiple_of(shards) {
        em.warn(format!(
            "{what} in {groups} groups gathered whole: the target splits the output features in {shards}, which does not divide the groups"
        ));
        return (None, None);
    }
    if batch_groups > 1 {
        local.batch_group_count = groups / shards;
    } else {
        local.feature_group_count = groups / shards;
    }
    (Some(grouped), Some(dn.kernel_output_feature))
}

pub(super) fn convolution(
    em: &mut Emitter,
    node: &Node,
    config: &ConvConfig,
    input: &PValue,
    kernel: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    if let Some((input, config)) = undilated(em, node, config, (input, kernel), target)? {
        return convolution(em, node, &config, &input, kernel, target);
    }
    let dn = &config.dims;
    let rank = node.ty.rank();
    let mut result = vec![(None, None); rank];
    if config.batch_group_count == 1 {
        result[dn.output_batch] = (Some(dn.input_batch), None);
    }
    let mut local = config.clone();
    result[dn.output_feature] = split_groups(em, config, target, &mut local);
    let (mut halos, mut contracting, mut gathered) = (Vec::new(), Vec::new(), Vec::new());
    for (i, w) in config.window.iter().enumerate() {
        let (x, k, out) = (
            dn.input_spatial[i],
            dn.kernel_spatial[i],
            dn.output_spatial[i],
        );
        if w.is_trivial() {
            result[out] = (Some(x), None);
            continue;
        }
        let out_size = node.ty.shape[out];
        match spatial(em, config, i, (input, kernel), target, out_size) {
            Spatial::Windowed(plan, window) => {
                result[out] = (Some(x), None);
                local.window[i] = window;
                halos.push(plan);
            }
            Spatial::Contracted(plan) => {
                contracting.push((x, k));
                local.window[i].size = kernel.global.shape[k].div_ceil(plan.shards());
                // The exchanged window holds exactly what the local block reads.
                (local.window[i].padding_low, local.window[i].padding_high) = (0, 0);
                halos.push(plan);
            }
            Spatial::Whole(None) => {}
            Spatial::Whole(Some(reason)) => gathered.push(format!("spatial dim {i}: {reason}")),
        }
    }
    if !gathered.is_empty() {
        em.warn(format!(
            "convolution gathers split dims whole ({})",
            gathered.join("; ")
        ));
    }
    if config.feature_group_count == 1 {
        contracting.push((dn.input_feature, dn.kernel_input_feature));
    }
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
        halos,
    };
    contract(
        em,
        &c,
        input,
        kernel,
        target,
        node.ty.clone(),
        Op::Convolution(local),
    )
}
