//! The registry of sharding rules: [`sharding_rule`] gives every op its
//! [`OpShardingRule`]. All per-op knowledge of propagation lives in this one match.

use super::factor_propagation::Direction;
use super::rule::{FactorKind, OpShardingRule, TensorFactors};
use crate::ir::random::RandomOutput;
use crate::ir::{
    ConvConfig, Flow, Indexing, Op, Program, PropagationDirection, ScatterKind, ValueId,
};
use crate::sharding::{DimSharding, Mesh, Sharding};

/// XLA's sort along a split dim (`HandleSort`): an `argsort` whose operand the
/// propagated `program` splits along the sorted dim over axes `A` takes `A` on another
/// dim of its result instead — the first one whose size the added split divides — so
/// that the partitioner moves the split with one all-to-all (`(n - 1) / n` of a block
/// per device, where a gather of the dim receives `n - 1` blocks) and sorts locally, the
/// result staying as small per device as the operand. Returns, for each such `argsort`
/// not yet split so, its result's sharding with `A` added, open elsewhere (a hint the
/// driver applies to results the user did not annotate).
pub(super) fn moved_sort_splits(program: &Program, mesh: &Mesh) -> Vec<(ValueId, Sharding)> {
    let mut hints = Vec::new();
    for v in program.values() {
        let node = program.node(v);
        let Op::Argsort { dim, .. } = node.op else {
            continue;
        };
        let operand = program.node(node.operands[0]).sharding.as_ref();
        let (Some(operand), Some(result)) = (operand, node.sharding.as_ref()) else {
            continue;
        };
        let moved = &operand.dims[dim].axes;
        let taken = result.parts(mesh);
        let used = |a: &String| {
            mesh.axis_part(a)
                .is_none_or(|a| taken.iter().any(|t| t.overlaps(&a)))
                || result.unreduced.contains(a)
        };
        if moved.is_empty() || moved.iter().any(used) {
            continue;
        }
        let n = mesh.axes_size(moved);
        let shape = &node.ty.shape;
        let divides = |d: &usize| {
            let shards = mesh.axes_size(&result.dims[*d].axes) * n;
            *d != dim && shape[*d].is_multiple_of(shards)
        };
        let Some(to) = (0..shape.len()).find(divides) else {
            continue;
        };
        let mut hint =
            Sharding::new((result.dims.iter()).map(|d| DimSharding::open(d.axes.iter().cloned())));
        hint.dims[dim] = DimSharding::closed(Vec::<String>::new());
        hint.dims[to].axes.extend(moved.iter().cloned());
        hints.push((v, hint));
    }
    hints
}

/// The sharding rule of the op defining `value`.
///
/// `value` must be a value of `program`, and `program` should be verified
/// ([`crate::ir::verify`]): the rule trusts the op's attributes to fit the operand
/// types, and a malformed node gets an arbitrary (but well-formed) rule.
pub fn sharding_rule(program: &Program, value: ValueId) -> OpShardingRule {
    let node = program.node(value);
    let result_shape = node.ty.shape.as_slice();
    let operand_shape = |i: usize| -> &[usize] {
        node.operands
            .get(i)
            .map_or(&[], |&o| program.ty(o).shape.as_slice())
    };
    let mut rule = OpShardingRule::default();
    match &node.op {
        Op::Parameter { .. } | Op::Constant(_) | Op::Iota { .. } => {
            // No operands; every result dim (iota's counting dim too) may be sharded.
            rule.result = own_factors(&mut rule, result_shape);
        }
        Op::RandomBits { output, .. } => {
            // Every counter dim may be sharded (each device counts from its block's
            // offset); a key's word dim and the key operand are whole; the base is a
            // scalar.
            rule.result = own_factors(&mut rule, result_shape);
            if *output == RandomOutput::Key {
                set_kind(
                    &mut rule,
                    result_shape.len() - 1,
                    FactorKind::NeedReplication,
                );
            }
            let key = rule.add_factor(2, FactorKind::NeedReplication);
            rule.operands = vec![TensorFactors {
                dims: vec![vec![key]],
            }];
            rule.operands.extend(scalars(1));
        }
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert(_)
        | Op::ShardingConstraint
        | Op::PropagationBarrier(_) => {
            // A barrier's direction is not in its rule but in `direction_at`.
            let shared = own_factors(&mut rule, result_shape);
            rule.operands = vec![shared.clone(); node.operands.len()];
            rule.result = shared;
        }
        Op::Flow { flow, result } => {
            // A carried value's result shares its factors with its initial value (the
            // regions are propagated afterwards with this boundary fixed:
            // `super::regions`); a stacked dim is not split (phase 1: a scan slices
            // every stacked operand whole along it).
            let carried = match **flow {
                Flow::While { .. } => usize::MAX,
                Flow::Scan { carried, .. } => carried,
                Flow::Cond { .. } | Flow::Manual { .. } => 0,
            };
            let stacked = match **flow {
                Flow::Scan {
                    carried, stacked, ..
                } => carried..carried + stacked,
                Flow::While { .. } | Flow::Cond { .. } | Flow::Manual { .. } => 0..0,
            };
            rule.result = own_factors(&mut rule, result_shape);
            let stacked_result = matches!(**flow, Flow::Scan { .. }) && *result >= carried;
            stacked_dim_replicated(&mut rule.result, &mut rule.factors, stacked_result);
            rule.operands = (0..node.operands.len())
                .map(|i| {
                    if i == *result && i < carried {
                        return rule.result.clone();
                    }
                    let mut factors = own_factors(&mut rule, operand_shape(i));
                    stacked_dim_replicated(&mut factors, &mut rule.factors, stacked.contains(&i));
                    factors
                })
                .collect();
        }
        Op::Broadcast { dims, .. } => {
            rule.result = own_factors(&mut rule, result_shape);
            let operand = operand_shape(0);
            let operand_dims = (operand.iter().zip(dims))
                .map(|(&size, &to)| match rule.result.dims.get(to) {
                    Some(fs) if size != 1 && size == result_shape[to] => fs.clone(),
                    _ => Vec::new(),
                })
                .collect();
            rule.operands = vec![TensorFactors { dims: operand_dims }];
        }
        Op::Reshape(_) => {
            let (operand, result) = reshape_factors(&mut rule, operand_shape(0), result_shape);
            rule.operands = vec![operand];
            rule.result = result;
        }
        Op::Transpose(perm) => {
            let operand = own_factors(&mut rule, operand_shape(0));
            rule.result.dims = (perm.iter())
                .map(|&p| operand.dims.get(p).cloned().unwrap_or_default())
                .collect();
            rule.operands = vec![operand];
        }
        Op::Reduce { dims, .. } => {
            let mut operand = TensorFactors::default();
            for (d, &size) in operand_shape(0).iter().enumerate() {
                let reduced = dims.contains(&d);
                let kind = if reduced {
                    FactorKind::Reduction
                } else {
                    FactorKind::PassThrough
                };
                let f = rule.add_factor(size, kind);
                operand.dims.push(vec![f]);
                if !reduced {
                    rule.result.dims.push(vec![f]);
                }
            }
            rule.operands = vec![operand];
        }
        Op::DotGeneral(dd) => {
            let (lhs, rhs) = (operand_shape(0), operand_shape(1));
            let mut lhs_dims = vec![Vec::new(); lhs.len()];
            let mut rhs_dims = vec![Vec::new(); rhs.len()];
            let mut map = |rule: &mut OpShardingRule, l: Option<usize>, r: Option<usize>, kind| {
                let size = (l.and_then(|l| lhs.get(l)))
                    .or_else(|| r.and_then(|r| rhs.get(r)))
                    .copied()
                    .unwrap_or(1);
                let f = rule.add_factor(size, kind);
                for (d, dims) in [(l, &mut lhs_dims), (r, &mut rhs_dims)] {
                    if let Some(slot) = d.and_then(|d| dims.get_mut(d)) {
                        slot.push(f);
                    }
                }
                f
            };
            let pass = FactorKind::PassThrough;
            for (&l, &r) in dd.lhs_batch.iter().zip(&dd.rhs_batch) {
                let f = map(&mut rule, Some(l), Some(r), pass);
                rule.result.dims.push(vec![f]);
            }
            for l in dd.lhs_free(lhs.len()) {
                let f = map(&mut rule, Some(l), None, pass);
                rule.result.dims.push(vec![f]);
            }
            for r in dd.rhs_free(rhs.len()) {
                let f = map(&mut rule, None, Some(r), pass);
                rule.result.dims.push(vec![f]);
            }
            for (&l, &r) in dd.lhs_contracting.iter().zip(&dd.rhs_contracting) {
                map(&mut rule, Some(l), Some(r), FactorKind::Reduction);
            }
            rule.operands = vec![
                TensorFactors { dims: lhs_dims },
                TensorFactors { dims: rhs_dims },
            ];
        }
        Op::Slice {
            start,
            limit,
            stride,
        } => {
            let operand = operand_shape(0);
            let moved = |d: usize| {
                start.get(d) != Some(&0)
                    || limit.get(d) != operand.get(d)
                    || stride.get(d) != Some(&1)
            };
            rule.result = windowed_factors(&mut rule, operand, result_shape, moved);
            rule.operands = vec![rule.result.clone()];
        }
        Op::Pad {
            low,
            high,
            interior,
        } => {
            let moved = |d: usize| {
                low.get(d) != Some(&0) || high.get(d) != Some(&0) || interior.get(d) != Some(&0)
            };
            rule.result = windowed_factors(&mut rule, operand_shape(0), result_shape, moved);
            // The scalar padding value has no dims.
            rule.operands = vec![rule.result.clone(), TensorFactors::default()];
        }
        Op::Concatenate(dim) => {
            rule.result = own_factors(&mut rule, result_shape);
            set_kind(&mut rule, *dim, FactorKind::Permutation);
            rule.operands = vec![rule.result.clone(); node.operands.len()];
        }
        Op::ReduceWindow { window, .. } => {
            // Shardy's rule for windowed ops: a dim the window leaves alone passes
            // through; a windowed dim is a permutation factor (it may stay split, the
            // partitioner exchanging halos).
            let moved = |d: usize| !window.get(d).is_some_and(|w| w.is_trivial());
            rule.result = windowed_factors(&mut rule, operand_shape(0), result_shape, moved);
            rule.operands = vec![rule.result.clone()];
        }
        Op::Convolution(config) => {
            let (input, kernel) = (operand_shape(0), operand_shape(1));
            (rule.operands, rule.result) =
                convolution_factors(&mut rule, config, [input, kernel, result_shape]);
        }
        Op::DynamicSlice(_) => {
            // Shardy's rule: a dim the slice keeps whole passes through; a sliced dim is
            // one factor that needs replication (the partitioner still takes it split:
            // each device contributes the part of the window it holds to a sum).
            let operand = operand_shape(0);
            rule.result = windowed_factors(&mut rule, operand, result_shape, |_| false);
            for (d, fs) in rule.result.dims.iter().enumerate() {
                if operand.get(d) != result_shape.get(d) {
                    rule.factors[fs[0]].kind = FactorKind::NeedReplication;
                }
            }
            rule.operands = vec![rule.result.clone()];
            rule.operands
                .extend(scalars(node.operands.len().saturating_sub(1)));
        }
        Op::DynamicUpdateSlice => {
            // The operand passes through to the result (each device writes the part of
            // the update inside its block); an update dim smaller than the operand's is a
            // factor of its own that needs replication.
            let (operand, update) = (operand_shape(0), operand_shape(1));
            rule.result = own_factors(&mut rule, operand);
            let update_dims = (update.iter().enumerate())
                .map(|(d, &size)| match rule.result.dims.get(d) {
                    Some(fs) if operand[d] == size => fs.clone(),
                    _ => vec![rule.add_factor(size, FactorKind::NeedReplication)],
                })
                .collect();
            rule.operands = vec![rule.result.clone(), TensorFactors { dims: update_dims }];
            rule.operands
                .extend(scalars(node.operands.len().saturating_sub(2)));
        }
        Op::Cumulative { dim, .. } => {
            // The scanned dim may stay split: the partitioner combines shard totals.
            rule.result = own_factors(&mut rule, result_shape);
            set_kind(&mut rule, *dim, FactorKind::Permutation);
            rule.operands = vec![rule.result.clone()];
        }
        Op::Argsort { dim, .. } => {
            // The sorted dim needs its whole lane; a split of it moves to another dim
            // (`moved_sort_splits`).
            rule.result = own_factors(&mut rule, result_shape);
            set_kind(&mut rule, *dim, FactorKind::NeedReplication);
            rule.operands = vec![rule.result.clone()];
        }
        Op::Reverse(dims) => {
            let operand = operand_shape(0);
            rule.result = windowed_factors(&mut rule, operand, result_shape, |d| dims.contains(&d));
            rule.operands = vec![rule.result.clone()];
        }
        Op::Gather(dims) => {
            let (operand, indices) = (operand_shape(0), operand_shape(1));
            let (o, i, data) = indexing_factors(
                &mut rule,
                dims.indexing(),
                [operand, indices, result_shape],
                &dims.slice_sizes,
                FactorKind::PassThrough,
                FactorKind::Reduction,
            );
            rule.operands = vec![o, i];
            rule.result = data;
        }
        Op::Scatter { dims, kind } => {
            let (operand, indices, updates) =
                (operand_shape(0), operand_shape(1), operand_shape(2));
            let ix = dims.indexing();
            // Updates split along their batch dims add up (partial sums); replacing
            // needs them whole, in order.
            let batch = match kind {
                ScatterKind::Add => FactorKind::Reduction,
                ScatterKind::Replace => FactorKind::NeedReplication,
            };
            let (o, i, data) = indexing_factors(
                &mut rule,
                ix,
                [operand, indices, updates],
                &ix.window_sizes(operand.len(), updates),
                batch,
                FactorKind::PassThrough,
            );
            rule.result = o.clone();
            rule.operands = vec![o, i, data];
        }
        // Per-device ops, only in a manual region's body (`propagate` rejects them
        // elsewhere), propagated over the automatic axes: a collective moves or combines
        // blocks elementwise except along the dims it gathers, scatters or exchanges,
        // which must be whole.
        Op::AxisIndex(_) => rule.result = own_factors(&mut rule, result_shape),
        Op::AllReduce { .. }
        | Op::AllGather { .. }
        | Op::ReduceScatter { .. }
        | Op::AllToAll { .. }
        | Op::CollectivePermute { .. }
        | Op::CollectiveShift { .. } => {
            rule.result = own_factors(&mut rule, result_shape);
            let mut operand = rule.result.clone();
            for d in crate::ir::moved_dims(&node.op) {
                set_kind(&mut rule, d, FactorKind::NeedReplication);
                operand.dims[d] =
                    vec![rule.add_factor(operand_shape(0)[d], FactorKind::NeedReplication)];
            }
            rule.operands = vec![operand];
        }
    }
    rule
}

/// Shardy's gather/scatter rule over the operand, the indices and the data (a
/// gather's result, a scatter's updates), given the window size per operand dim: the
/// batching dims of operand and indices and the data's batch dim are one pass-through
/// factor; the other indices batch dims and the data's are one factor of `batch` kind;
/// a window dim the window covers whole passes through between operand and data; an
/// indexed dim (in the index map) with a one-element window is an operand factor of
/// `indexed` kind (a gather's like a contracting dim: split, each device looks up its
/// own range into a partial sum); every other operand dim and the index vector dim
/// need replication. A malformed op (dims out of range) gives unfactored tensors.
fn indexing_factors(
    rule: &mut OpShardingRule,
    ix: Indexing<'_>,
    [operand, indices, data]: [&[usize]; 3],
    window: &[usize],
    batch: FactorKind,
    indexed: FactorKind,
) -> (TensorFactors, TensorFactors, TensorFactors) {
    let unfactored = |rank: usize| TensorFactors {
        dims: vec![Vec::new(); rank],
    };
    let (mut o, mut i, mut x) = (
        unfactored(operand.len()),
        unfactored(indices.len()),
        unfactored(data.len()),
    );
    let operand_window = ix.operand_window(operand.len());
    let (indices_batch, data_batch) = (ix.indices_batch(indices.len()), ix.data_batch(data.len()));
    let fits = window.len() == operand.len()
        && operand_window.len() == ix.window.len()
        && indices_batch.len() == data_batch.len()
        && ix.window.iter().all(|&d| d < data.len())
        && (ix.operand_batching.iter().zip(ix.indices_batching))
            .all(|(&a, &b)| a < operand.len() && b < indices.len())
        && ix.index_map.iter().all(|&d| d < operand.len());
    if !fits {
        return (o, i, x);
    }
    let need = FactorKind::NeedReplication;
    for (&ib, &db) in indices_batch.iter().zip(&data_batch) {
        let kind = match ix.indices_batching.iter().position(|&b| b == ib) {
            Some(j) => {
                let f = rule.add_factor(indices[ib], FactorKind::PassThrough);
                o.dims[ix.operand_batching[j]].push(f);
                f
            }
            None => rule.add_factor(indices[ib], batch),
        };
        i.dims[ib].push(kind);
        x.dims[db].push(kind);
    }
    if ix.explicit_vector(indices.len()) && indices[ix.index_vector_dim] != 1 {
        i.dims[ix.index_vector_dim].push(rule.add_factor(indices[ix.index_vector_dim], need));
    }
    for d in 0..operand.len() {
        if ix.operand_batching.contains(&d) {
            continue;
        }
        let data_dim = (operand_window.iter().position(|&w| w == d)).map(|k| ix.window[k]);
        if window[d] == operand[d] && operand[d] != 1 {
            let f = rule.add_factor(operand[d], FactorKind::PassThrough);
            o.dims[d].push(f);
            if let Some(dd) = data_dim {
                x.dims[dd].push(f);
            }
            continue;
        }
        let kind = if window[d] == 1 && ix.index_map.contains(&d) {
            indexed
        } else {
            need
        };
        if operand[d] != 1 {
            o.dims[d].push(rule.add_factor(operand[d], kind));
        }
        if let Some(dd) = data_dim.filter(|_| window[d] != 1) {
            x.dims[dd].push(rule.add_factor(window[d], need));
        }
    }
    (o, i, x)
}

/// One new pass-through factor per dim of `shape`.
fn own_factors(rule: &mut OpShardingRule, shape: &[usize]) -> TensorFactors {
    TensorFactors {
        dims: (shape.iter())
            .map(|&size| vec![rule.add_factor(size, FactorKind::PassThrough)])
            .collect(),
    }
}

/// Marks the leading dim's factor of `tensor` as needing replication when `stacked`
/// (a scan's stacked dim).
fn stacked_dim_replicated(
    tensor: &mut TensorFactors,
    factors: &mut [super::rule::Factor],
    stacked: bool,
) {
    let leading = tensor.dims.first().and_then(|d| d.first());
    if let (true, Some(&f)) = (stacked, leading) {
        factors[f].kind = FactorKind::NeedReplication;
    }
}

/// `n` scalar tensors (start indices): no dims, no factors.
fn scalars(n: usize) -> Vec<TensorFactors> {
    vec![TensorFactors::default(); n]
}

/// Makes the result's factor along `dim` of kind `kind` (nothing for a dim out of range).
fn set_kind(rule: &mut OpShardingRule, dim: usize, kind: FactorKind) {
    if let Some(&[f]) = rule.result.dims.get(dim).map(Vec::as_slice) {
        rule.factors[f].kind = kind;
    }
}

/// Factors shared dim by dim by an operand and a result of the same rank: pass-through
/// where the op leaves the dim alone, a permutation factor (of the larger of the two
/// sizes) where it `moved` elements along the dim (slice, pad, reduce_window).
fn windowed_factors(
    rule: &mut OpShardingRule,
    operand: &[usize],
    result: &[usize],
    moved: impl Fn(usize) -> bool,
) -> TensorFactors {
    let dims = (operand.iter().zip(result).enumerate())
        .map(|(d, (&a, &b))| {
            let kind = if moved(d) {
                FactorKind::Permutation
            } else {
                FactorKind::PassThrough
            };
            vec![rule.add_factor(a.max(b), kind)]
        })
        .collect();
    TensorFactors { dims }
}

/// Shardy's convolution rule: batch (input and output) and output features (kernel and
/// output) pass through; input features (input and kernel) are a reduction; spatial
/// dim `i` of input and output is one permutation factor, or pass-through where the
/// window moves nothing ([`crate::ir::WindowDim::is_trivial`]), and the kernel's spatial
/// dims need replication. With `G > 1` feature groups, the feature dims are compound:
/// the group factor (size `G`, pass-through) is the major part of the input's features,
/// the kernel's output features and the output's features (a split by whole groups
/// partitions with no communication); the features within a group (the input's and the
/// kernel's input features, the kernel's and the output's output features) need
/// replication. With `B > 1` batch groups, the batch-group factor (size `B`,
/// pass-through) is the major part of the input's batch, the kernel's output features
/// and the output's features; the batch within a group (input and output) and the
/// output features within a group need replication. A malformed config (dims out of
/// range) gives unfactored tensors.
fn convolution_factors(
    rule: &mut OpShardingRule,
    config: &ConvConfig,
    [input, kernel, result]: [&[usize]; 3],
) -> (Vec<TensorFactors>, TensorFactors) {
    let dn = &config.dims;
    let unfactored = |rank: usize| TensorFactors {
        dims: vec![Vec::new(); rank],
    };
    let (mut x, mut k, mut out) = (
        unfactored(input.len()),
        unfactored(kernel.len()),
        unfactored(result.len()),
    );
    let fits = |dims: &[usize], rank: usize| dims.iter().all(|&d| d < rank);
    let all_fit = fits(&[dn.input_batch, dn.input_feature], input.len())
        && fits(&dn.input_spatial, input.len())
        && fits(
            &[dn.kernel_input_feature, dn.kernel_output_feature],
            kernel.len(),
        )
        && fits(&dn.kernel_spatial, kernel.len())
        && fits(&[dn.output_batch, dn.output_feature], result.len())
        && fits(&dn.output_spatial, result.len())
        && config.window.len() == dn.input_spatial.len()
        && dn.kernel_spatial.len() == dn.input_spatial.len()
        && dn.output_spatial.len() == dn.input_spatial.len();
    if !all_fit {
        return (vec![x, k], out);
    }
    let (feature_groups, batch_groups) = (config.feature_group_count, config.batch_group_count);
    let groups = feature_groups * batch_groups;
    if groups > 1 {
        let grouped = if batch_groups > 1 {
            dn.input_batch
        } else {
            dn.input_feature
        };
        let g = rule.add_factor(groups, FactorKind::PassThrough);
        x.dims[grouped].push(g);
        k.dims[dn.kernel_output_feature].push(g);
        out.dims[dn.output_feature].push(g);
    }
    // The factors within a group; with groups, a size-1 one is left out.
    let kind = |grouped: bool, kind| {
        if grouped {
            FactorKind::NeedReplication
        } else {
            kind
        }
    };
    let batch = result[dn.output_batch];
    if batch_groups == 1 || batch > 1 {
        let f = rule.add_factor(batch, kind(batch_groups > 1, FactorKind::PassThrough));
        x.dims[dn.input_batch].push(f);
        out.dims[dn.output_batch].push(f);
    }
    let out_features = kernel[dn.kernel_output_feature] / groups;
    if groups == 1 || out_features > 1 {
        let f = rule.add_factor(out_features, kind(groups > 1, FactorKind::PassThrough));
        k.dims[dn.kernel_output_feature].push(f);
        out.dims[dn.output_feature].push(f);
    }
    let in_features = kernel[dn.kernel_input_feature];
    if feature_groups == 1 || in_features > 1 {
        let f = rule.add_factor(in_features, kind(feature_groups > 1, FactorKind::Reduction));
        x.dims[dn.input_feature].push(f);
        k.dims[dn.kernel_input_feature].push(f);
    }
    for (i, w) in config.window.iter().enumerate() {
        let (xd, kd, od) = (
            dn.input_spatial[i],
            dn.kernel_spatial[i],
            dn.output_spatial[i],
        );
        if w.is_trivial() {
            let f = rule.add_factor(input[xd], FactorKind::PassThrough);
            x.dims[xd].push(f);
            out.dims[od].push(f);
        } else {
            let f = rule.add_factor(input[xd].max(result[od]), FactorKind::Permutation);
            x.dims[xd].push(f);
            out.dims[od].push(f);
            let kf = rule.add_factor(w.size, FactorKind::NeedReplication);
            k.dims[kd].push(kf);
        }
    }
    (vec![x, k], out)
}

/// Factors of a row-major reshape: both shapes are cut into their common factors by
/// walking them major to minor with gcds. `[8] -> [2, 4]` gives factors 2 and 4, the
/// operand dim being compound; `[2, 4] -> [8]` the reverse. Size-1 dims map to no
/// factor. Where the shapes share no further factor (`[2, 3] -> [3, 2]`), each remaining
/// dim gets a factor of its own that needs replication.
fn reshape_factors(
    rule: &mut OpShardingRule,
    operand: &[usize],
    result: &[usize],
) -> (TensorFactors, TensorFactors) {
    let mut lhs = vec![Vec::new(); operand.len()];
    let mut rhs = vec![Vec::new(); result.len()];
    // (dim, size of the dim still to be covered by factors) on each side.
    let next = |shape: &[usize], from: usize| -> Option<(usize, usize)> {
        (from..shape.len())
            .find(|&d| shape[d] != 1)
            .map(|d| (d, shape[d]))
    };
    let mut a = next(operand, 0);
    let mut b = next(result, 0);
    while let (Some((da, ra)), Some((db, rb))) = (a, b) {
        let g = gcd(ra, rb);
        if g == 1 {
            break;
        }
        let f = rule.add_factor(g, FactorKind::PassThrough);
        lhs[da].push(f);
        rhs[db].push(f);
        a = if ra == g {
            next(operand, da + 1)
        } else {
            Some((da, ra / g))
        };
        b = if rb == g {
            next(result, db + 1)
        } else {
            Some((db, rb / g))
        };
    }
    for (mut rest, shape, dims) in [(a, operand, &mut lhs), (b, result, &mut rhs)] {
        while let Some((d, remaining)) = rest {
            dims[d].push(rule.add_factor(remaining, FactorKind::NeedReplication));
            rest = next(shape, d + 1);
        }
    }
    (TensorFactors { dims: lhs }, TensorFactors { dims: rhs })
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Op priority: propagation first crosses elementwise ops only (level 0), then every op
/// but broadcasts only backward, from result to operand (level 1), then every op both
/// ways (level 2). Propagating through the cheapest, least ambiguous ops first keeps a
/// dot's or broadcast's guess from overriding what the elementwise chain says (GSPMD
/// section 3.5).
pub(super) const OP_PRIORITY_LEVELS: usize = 3;

/// Which tensors of `op` propagation may refine at op-priority `level` (below
/// [`OP_PRIORITY_LEVELS`]); `None` while the op is not yet crossed. A propagation
/// barrier is crossed at every level, only in its allowed direction (`NONE`: never).
pub(super) fn direction_at(op: &Op, level: usize) -> Option<Direction> {
    match (op, level) {
        (Op::PropagationBarrier(allowed), _) => match allowed {
            PropagationDirection::None => None,
            PropagationDirection::Forward => Some(Direction::Forward),
            PropagationDirection::Backward => Some(Direction::Backward),
            PropagationDirection::Both => Some(Direction::Both),
        },
        (op, _) if op.is_elementwise() => Some(Direction::Both),
        (_, 0) => None,
        (Op::Broadcast { .. }, 1) => Some(Direction::Backward),
        _ => Some(Direction::Both),
    }
}
