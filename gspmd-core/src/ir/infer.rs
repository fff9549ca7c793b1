//! Result-type inference for every primitive op: the one place that knows each op's
//! shape rules. The builder uses it to type new nodes, the verifier to re-check them.

use super::op::{BinaryOp, ConvConfig, DotDims, Op, PropagationDirection, UnaryOp, WindowDim};
use super::random::RandomOutput;
use crate::types::{DType, TensorType, checked_num_elements};

/// The result type of `op` applied to operands of types `operands`, or a message naming
/// what does not fit (the caller adds the op name and location).
///
/// Operand types must respect the size invariant of [`TensorType`]; the result then
/// does too (an op whose result would not, e.g. a reshape to `[1<<40, 1<<40]` or a pad
/// by `i64::MAX`, is an `Err`), and no size arithmetic here overflows.
pub fn infer_type(op: &Op, operands: &[&TensorType]) -> Result<TensorType, String> {
    let arity = op.arity();
    if !arity.accepts(operands.len()) {
        return Err(format!("expects {arity} operands, got {}", operands.len()));
    }
    let ty = match op {
        Op::Parameter { ty, .. } => Ok(ty.clone()),
        Op::Constant(lit) => Ok(TensorType::new(lit.shape(), lit.dtype())),
        Op::Iota { shape, dim, dtype } => {
            if *dim >= shape.len() {
                return Err(format!("iota dim {dim} out of range for shape {shape:?}"));
            }
            if *dtype == DType::Bool {
                return Err("iota of bool".into());
            }
            Ok(TensorType::new(shape.clone(), *dtype))
        }
        Op::RandomBits {
            shape,
            strides,
            output,
        } => {
            let (key, base) = (operands[0], operands[1]);
            if key.dtype != DType::I32 || key.shape != [2] {
                return Err(format!("the key must be i32[2] (two u32 words), got {key}"));
            }
            if base.dtype != DType::I32 || !base.shape.is_empty() {
                return Err(format!(
                    "the counter base must be an i32 scalar, got {base}"
                ));
            }
            if strides.len() != shape.len() {
                return Err(format!(
                    "{} counter strides for the {} dims of {shape:?}",
                    strides.len(),
                    shape.len()
                ));
            }
            // The largest counter offset: distinct counters need it below 2^32.
            let last = (shape.iter().zip(strides)).try_fold(0u64, |acc, (&n, &s)| {
                (n.saturating_sub(1) as u64)
                    .checked_mul(s as u64)
                    .and_then(|v| acc.checked_add(v))
            });
            if last.is_none_or(|last| last > u64::from(u32::MAX)) {
                return Err(format!(
                    "{shape:?} with counter strides {strides:?} needs more than 2^32 counters"
                ));
            }
            let mut dims = shape.clone();
            if *output == RandomOutput::Key {
                dims.push(2);
            }
            Ok(TensorType::new(dims, DType::I32))
        }
        Op::Unary(u) => {
            let t = operands[0];
            let is_logical = *u == UnaryOp::Not;
            check_dtype(t, is_logical)?;
            let float_only = !matches!(
                u,
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Not
            );
            if float_only && !t.dtype.is_float() {
                return Err(format!("needs a float operand, got {t}"));
            }
            // `is_finite` is a predicate: float in, bool out.
            let dtype = match u {
                UnaryOp::IsFinite => DType::Bool,
                _ => t.dtype,
            };
            Ok(TensorType::new(t.shape.clone(), dtype))
        }
        Op::Binary(b) => {
            let (a, c) = (operands[0], operands[1]);
            same_type(a, c)?;
            check_dtype(a, matches!(b, BinaryOp::And | BinaryOp::Or))?;
            Ok(a.clone())
        }
        Op::Compare(_) => {
            same_type(operands[0], operands[1])?;
            Ok(TensorType::new(operands[0].shape.clone(), DType::Bool))
        }
        Op::Select => {
            let (p, t, f) = (operands[0], operands[1], operands[2]);
            if p.dtype != DType::Bool {
                return Err(format!("predicate must be pred, got {p}"));
            }
            same_type(t, f)?;
            if p.shape != t.shape {
                return Err(format!("predicate {p} and branches {t} differ in shape"));
            }
            Ok(t.clone())
        }
        Op::Convert(dtype) => Ok(TensorType::new(operands[0].shape.clone(), *dtype)),
        Op::Broadcast { shape, dims } => {
            let t = operands[0];
            if dims.len() != t.rank() {
                return Err(format!(
                    "broadcast dims {dims:?} must have one entry per operand dim of {t}"
                ));
            }
            for (i, &d) in dims.iter().enumerate() {
                if d >= shape.len() || (i > 0 && d <= dims[i - 1]) {
                    return Err(format!(
                        "broadcast dims {dims:?} must be increasing and below rank {}",
                        shape.len()
                    ));
                }
                if t.shape[i] != 1 && t.shape[i] != shape[d] {
                    return Err(format!(
                        "cannot broadcast {t} to {shape:?}: operand dim {i} is {} but result dim {d} is {}",
                        t.shape[i], shape[d]
                    ));
                }
            }
            Ok(TensorType::new(shape.clone(), t.dtype))
        }
        Op::Reshape(shape) => {
            let t = operands[0];
            let (from, to) = (checked_num_elements(&t.shape), checked_num_elements(shape));
            if from != to {
                let count =
                    |n: Option<usize>| n.map_or("more than usize::MAX".into(), |n| n.to_string());
                return Err(format!(
                    "cannot reshape {t} ({} elements) to {shape:?} ({} elements)",
                    count(from),
                    count(to)
                ));
            }
            Ok(TensorType::new(shape.clone(), t.dtype))
        }
        Op::Transpose(perm) => {
            let t = operands[0];
            check_permutation(perm, t.rank())?;
            Ok(TensorType::new(
                perm.iter().map(|&p| t.shape[p]).collect::<Vec<_>>(),
                t.dtype,
            ))
        }
        Op::Reduce { dims, .. } => {
            let t = operands[0];
            check_distinct_dims(dims, t.rank(), "reduce")?;
            if t.dtype == DType::Bool {
                return Err(format!("cannot reduce {t}"));
            }
            let shape: Vec<usize> = (0..t.rank())
                .filter(|d| !dims.contains(d))
                .map(|d| t.shape[d])
                .collect();
            Ok(TensorType::new(shape, t.dtype))
        }
        Op::DotGeneral(dd) => infer_dot(dd, operands[0], operands[1]),
        Op::Slice {
            start,
            limit,
            stride,
        } => {
            let t = operands[0];
            let r = t.rank();
            if start.len() != r || limit.len() != r || stride.len() != r {
                return Err(format!(
                    "slice needs start, limit and stride of rank {r} for {t}"
                ));
            }
            let mut shape = Vec::with_capacity(r);
            for d in 0..r {
                if stride[d] == 0 || start[d] > limit[d] || limit[d] > t.shape[d] {
                    return Err(format!(
                        "slice [{}:{}:{}] does not fit dim {d} of size {} in {t}",
                        start[d], limit[d], stride[d], t.shape[d]
                    ));
                }
                shape.push((limit[d] - start[d]).div_ceil(stride[d]));
            }
            Ok(TensorType::new(shape, t.dtype))
        }
        Op::Pad {
            low,
            high,
            interior,
        } => {
            let (t, v) = (operands[0], operands[1]);
            let r = t.rank();
            if low.len() != r || high.len() != r || interior.len() != r {
                return Err(format!(
                    "pad needs low, high and interior of rank {r} for {t}"
                ));
            }
            if v.rank() != 0 || v.dtype != t.dtype {
                return Err(format!(
                    "padding value must be a {} scalar, got {v}",
                    t.dtype
                ));
            }
            let mut shape = Vec::with_capacity(r);
            for d in 0..r {
                let size =
                    padded_size(t.shape[d], low[d], high[d], interior[d]).ok_or_else(|| {
                        format!(
                            "pad of dim {d} in {t} by low {}, high {}, interior {} overflows",
                            low[d], high[d], interior[d]
                        )
                    })?;
                let size = usize::try_from(size)
                    .map_err(|_| format!("pad of dim {d} in {t} gives negative size {size}"))?;
                shape.push(size);
            }
            Ok(TensorType::new(shape, t.dtype))
        }
        Op::Concatenate(dim) => {
            let first = operands[0];
            if *dim >= first.rank() {
                return Err(format!("concatenate dim {dim} out of range for {first}"));
            }
            let mut shape = first.shape.clone();
            shape[*dim] = 0;
            for t in operands {
                let same_elsewhere = t.rank() == first.rank()
                    && (0..t.rank()).all(|d| d == *dim || t.shape[d] == first.shape[d]);
                if t.dtype != first.dtype || !same_elsewhere {
                    return Err(format!("operands {first} and {t} differ outside dim {dim}"));
                }
                shape[*dim] = shape[*dim]
                    .checked_add(t.shape[*dim])
                    .ok_or_else(|| format!("concatenating along dim {dim} overflows"))?;
            }
            Ok(TensorType::new(shape, first.dtype))
        }
        Op::ReduceWindow { window, .. } => infer_reduce_window(window, operands[0]),
        Op::Convolution(config) => infer_convolution(config, operands[0], operands[1]),
        Op::DynamicSlice(sizes) => {
            let t = operands[0];
            if sizes.len() != t.rank() || sizes.iter().zip(&t.shape).any(|(s, d)| s > d) {
                return Err(format!(
                    "slice sizes {sizes:?} do not fit {t}: one size per dim, none larger"
                ));
            }
            check_starts(&operands[1..], t)?;
            Ok(TensorType::new(sizes.clone(), t.dtype))
        }
        Op::DynamicUpdateSlice => {
            let (t, u) = (operands[0], operands[1]);
            let fits = u.rank() == t.rank() && u.shape.iter().zip(&t.shape).all(|(a, b)| a <= b);
            if u.dtype != t.dtype || !fits {
                return Err(format!(
                    "update {u} does not fit {t}: same rank and dtype, no dim larger"
                ));
            }
            check_starts(&operands[2..], t)?;
            Ok(t.clone())
        }
        Op::Cumulative { dim, .. } => {
            let t = operands[0];
            if *dim >= t.rank() || t.dtype == DType::Bool {
                return Err(format!("cannot scan dim {dim} of {t}"));
            }
            Ok(t.clone())
        }
        Op::Argsort { dim, .. } => {
            let t = operands[0];
            if *dim >= t.rank() {
                return Err(format!("sort dim {dim} out of range for {t}"));
            }
            if i32::try_from(t.shape[*dim]).is_err() {
                return Err(format!(
                    "dim {dim} of {t} has more elements than i32 indexes"
                ));
            }
            Ok(TensorType::new(t.shape.clone(), DType::I32))
        }
        Op::Reverse(dims) => {
            check_distinct_dims(dims, operands[0].rank(), "reverse")?;
            Ok(operands[0].clone())
        }
        Op::Gather(dims) => super::indexing::infer_gather(dims, operands[0], operands[1]),
        Op::Scatter { dims, kind } => {
            super::indexing::infer_scatter(dims, *kind, operands[0], operands[1], operands[2])
        }
        Op::ShardingConstraint | Op::AllReduce { .. } | Op::CollectivePermute { .. } => {
            Ok(operands[0].clone())
        }
        Op::CollectiveShift { .. } => Ok(operands[0].clone()),
        Op::PropagationBarrier(direction) => match direction {
            PropagationDirection::Both => Err(
                "allowed_direction BOTH would block nothing (Shardy rejects it too): use \
                 FORWARD, BACKWARD or NONE, or no barrier"
                    .into(),
            ),
            _ => Ok(operands[0].clone()),
        },
        Op::Flow { flow, result } => {
            let results = flow.result_types(operands)?;
            let count = results.len();
            results
                .into_iter()
                .nth(*result)
                .ok_or_else(|| format!("result {result} of a {} with {count} results", flow.name()))
        }
        Op::AxisIndex(_) => Ok(TensorType::new(vec![], DType::I32)),
        Op::AllGather { group, dim } => {
            let t = operands[0];
            let mut shape = t.shape.clone();
            let d = shape
                .get_mut(*dim)
                .ok_or_else(|| format!("dim {dim} out of range for {t}"))?;
            *d = d
                .checked_mul(group.size)
                .ok_or_else(|| format!("gathering dim {dim} of {t} overflows"))?;
            Ok(TensorType::new(shape, t.dtype))
        }
        Op::ReduceScatter { group, dim, .. } => {
            let t = operands[0];
            let mut shape = t.shape.clone();
            let d = shape
                .get_mut(*dim)
                .ok_or_else(|| format!("dim {dim} out of range for {t}"))?;
            if group.size == 0 || !d.is_multiple_of(group.size) {
                return Err(format!(
                    "dim {dim} of {t} is not divisible by the group size {}",
                    group.size
                ));
            }
            *d /= group.size;
            Ok(TensorType::new(shape, t.dtype))
        }
        Op::AllToAll {
            group,
            split_dim,
            concat_dim,
        } => {
            let t = operands[0];
            if *split_dim >= t.rank()
                || *concat_dim >= t.rank()
                || group.size == 0
                || !t.shape[*split_dim].is_multiple_of(group.size)
            {
                return Err(format!(
                    "all_to_all split dim {split_dim} / concat dim {concat_dim} do not fit {t} over {} devices",
                    group.size
                ));
            }
            let mut shape = t.shape.clone();
            shape[*split_dim] /= group.size;
            shape[*concat_dim] = shape[*concat_dim]
                .checked_mul(group.size)
                .ok_or_else(|| format!("all_to_all concat dim {concat_dim} of {t} overflows"))?;
            Ok(TensorType::new(shape, t.dtype))
        }
    }?;
    ty.check_size()?;
    Ok(ty)
}

fn infer_dot(dd: &DotDims, lhs: &TensorType, rhs: &TensorType) -> Result<TensorType, String> {
    if lhs.dtype != rhs.dtype || lhs.dtype == DType::Bool {
        return Err(format!(
            "operands {lhs} and {rhs} must share a numeric dtype"
        ));
    }
    if dd.lhs_batch.len() != dd.rhs_batch.len()
        || dd.lhs_contracting.len() != dd.rhs_contracting.len()
    {
        return Err(format!(
            "batch or contracting dim lists differ in length: {dd:?}"
        ));
    }
    let lhs_used: Vec<usize> = dd
        .lhs_batch
        .iter()
        .chain(&dd.lhs_contracting)
        .copied()
        .collect();
    let rhs_used: Vec<usize> = dd
        .rhs_batch
        .iter()
        .chain(&dd.rhs_contracting)
        .copied()
        .collect();
    check_distinct_dims_unsorted(&lhs_used, lhs.rank(), "lhs")?;
    check_distinct_dims_unsorted(&rhs_used, rhs.rank(), "rhs")?;
    let pairs = dd.lhs_batch.iter().zip(&dd.rhs_batch).map(|p| ("batch", p));
    let pairs = pairs.chain(
        dd.lhs_contracting
            .iter()
            .zip(&dd.rhs_contracting)
            .map(|p| ("contracting", p)),
    );
    for (kind, (&l, &r)) in pairs {
        if lhs.shape[l] != rhs.shape[r] {
            return Err(format!(
                "{lhs} x {rhs}: {kind} dims {} (lhs dim {l}) and {} (rhs dim {r}) differ",
                lhs.shape[l], rhs.shape[r]
            ));
        }
    }
    let mut shape: Vec<usize> = dd.lhs_batch.iter().map(|&d| lhs.shape[d]).collect();
    shape.extend(dd.lhs_free(lhs.rank()).map(|d| lhs.shape[d]));
    shape.extend(dd.rhs_free(rhs.rank()).map(|d| rhs.shape[d]));
    Ok(TensorType::new(shape, lhs.dtype))
}

fn infer_reduce_window(window: &[WindowDim], t: &TensorType) -> Result<TensorType, String> {
    if window.len() != t.rank() {
        return Err(format!(
            "window of rank {} for {t}: needs one window dim per operand dim",
            window.len()
        ));
    }
    if t.dtype == DType::Bool {
        return Err(format!("cannot reduce {t}"));
    }
    let shape = (window.iter().enumerate())
        .map(|(d, w)| {
            if w.padding_low < 0 || w.padding_high < 0 {
                return Err(format!(
                    "window dim {d} has padding {}_{}: reduce_window takes no negative padding",
                    w.padding_low, w.padding_high
                ));
            }
            window_output_size(d, w, t, d)
        })
        .collect::<Result<Vec<usize>, String>>()?;
    Ok(TensorType::new(shape, t.dtype))
}

/// Number of spatial dims a convolution may have.
const CONV_SPATIAL_DIMS: std::ops::RangeInclusive<usize> = 1..=3;

fn infer_convolution(
    config: &ConvConfig,
    input: &TensorType,
    kernel: &TensorType,
) -> Result<TensorType, String> {
    let (dn, window, groups) = (&config.dims, &config.window, config.feature_group_count);
    if input.dtype != kernel.dtype || input.dtype == DType::Bool {
        return Err(format!(
            "input {input} and kernel {kernel} must share a numeric dtype"
        ));
    }
    let spatial = dn.input_spatial.len();
    if !CONV_SPATIAL_DIMS.contains(&spatial)
        || dn.kernel_spatial.len() != spatial
        || dn.output_spatial.len() != spatial
    {
        return Err(format!(
            "dimension numbers must name 1 to 3 spatial dims, the same number for input, kernel and output: {dn:?}"
        ));
    }
    let rank = spatial + 2;
    if input.rank() != rank || kernel.rank() != rank {
        return Err(format!(
            "input {input} and kernel {kernel} must have rank {rank} for {spatial} spatial dims"
        ));
    }
    let all = |a: usize, b: usize, rest: &[usize]| [&[a, b][..], rest].concat();
    let tensors = [
        (
            "input",
            all(dn.input_batch, dn.input_feature, &dn.input_spatial),
        ),
        (
            "kernel",
            all(
                dn.kernel_input_feature,
                dn.kernel_output_feature,
                &dn.kernel_spatial,
            ),
        ),
        (
            "output",
            all(dn.output_batch, dn.output_feature, &dn.output_spatial),
        ),
    ];
    for (what, dims) in &tensors {
        check_distinct_dims_unsorted(dims, rank, &format!("{what} dimension numbers"))?;
    }
    if window.len() != spatial {
        return Err(format!(
            "window has {} dims for {spatial} spatial dims",
            window.len()
        ));
    }
    let features = input.shape[dn.input_feature];
    let out_features = kernel.shape[dn.kernel_output_feature];
    if groups == 0 || !features.is_multiple_of(groups) || !out_features.is_multiple_of(groups) {
        return Err(format!(
            "feature_group_count {groups} must divide the input features {features} and the output features {out_features}"
        ));
    }
    if kernel.shape[dn.kernel_input_feature] != features / groups {
        return Err(format!(
            "kernel {kernel} has {} input features (dim {}), but input {input} has {features} features in {groups} group(s) of {}",
            kernel.shape[dn.kernel_input_feature],
            dn.kernel_input_feature,
            features / groups
        ));
    }
    let (batch, batch_groups) = (input.shape[dn.input_batch], config.batch_group_count);
    if batch_groups == 0 || (groups > 1 && batch_groups > 1) {
        return Err(format!(
            "batch_group_count {batch_groups} with feature_group_count {groups}: the batch group count must be at least 1, and at most one of the two may exceed 1"
        ));
    }
    if !batch.is_multiple_of(batch_groups) || !out_features.is_multiple_of(batch_groups) {
        return Err(format!(
            "batch_group_count {batch_groups} must divide the input batch {batch} and the output features {out_features}"
        ));
    }
    let mut shape = vec![0; rank];
    shape[dn.output_batch] = batch / batch_groups;
    shape[dn.output_feature] = out_features;
    for (i, w) in window.iter().enumerate() {
        let k = kernel.shape[dn.kernel_spatial[i]];
        if w.size != k {
            return Err(format!(
                "window dim {i} has size {}, but the kernel {kernel} has {k} (dim {})",
                w.size, dn.kernel_spatial[i]
            ));
        }
        shape[dn.output_spatial[i]] = window_output_size(i, w, input, dn.input_spatial[i])?;
    }
    Ok(TensorType::new(shape, input.dtype))
}

/// The result size of window dim `i` over dim `dim` of `t` (see [`WindowDim`]), or a
/// message naming what does not fit.
fn window_output_size(
    i: usize,
    w: &WindowDim,
    t: &TensorType,
    dim: usize,
) -> Result<usize, String> {
    if w.size == 0 || w.stride == 0 || w.window_dilation == 0 || w.base_dilation == 0 {
        return Err(format!(
            "window dim {i} has size {}, stride {}, window dilation {} and base dilation {}: each must be at least 1",
            w.size, w.stride, w.window_dilation, w.base_dilation
        ));
    }
    let n = t.shape[dim];
    let overflow = || format!("window dim {i} of {t} overflows");
    let padded =
        padded_size(n, w.padding_low, w.padding_high, w.base_dilation - 1).ok_or_else(overflow)?;
    let span = dilated_size(w.size, w.window_dilation).ok_or_else(overflow)?;
    if span > padded {
        return Err(format!(
            "window dim {i} spans {span} elements, more than the {padded} of dim {dim} of {t} dilated by {} and padded by {}_{}",
            w.base_dilation, w.padding_low, w.padding_high
        ));
    }
    let stride = i64::try_from(w.stride).unwrap_or(i64::MAX);
    usize::try_from((padded - span) / stride + 1).map_err(|_| overflow())
}

/// Size of `n` elements with `dilation - 1` holes between neighbours; `None` on overflow.
fn dilated_size(n: usize, dilation: usize) -> Option<i64> {
    padded_size(n, 0, 0, dilation.checked_sub(1)?)
}

/// Size of a dim of `n` elements padded by `low` and `high` (negative: cropped) with
/// `interior` elements between neighbours; `None` if the arithmetic overflows `i64`.
fn padded_size(n: usize, low: i64, high: i64, interior: usize) -> Option<i64> {
    let n = i64::try_from(n).ok()?;
    let interior_total = i64::try_from(interior).ok()?.checked_mul((n - 1).max(0))?;
    low.checked_add(n)?
        .checked_add(interior_total)?
        .checked_add(high)
}

/// `starts` are one i32 scalar per dim of `t` (the start indices of a dynamic slice or
/// update).
fn check_starts(starts: &[&TensorType], t: &TensorType) -> Result<(), String> {
    if starts.len() != t.rank() {
        return Err(format!(
            "{} start indices for {t}: needs one per dim",
            starts.len()
        ));
    }
    match starts
        .iter()
        .find(|i| i.rank() != 0 || i.dtype != DType::I32)
    {
        Some(bad) => Err(format!("start indices must be i32 scalars, got {bad}")),
        None => Ok(()),
    }
}

fn check_dtype(t: &TensorType, logical: bool) -> Result<(), String> {
    match (logical, t.dtype) {
        (true, DType::Bool) | (false, DType::F32 | DType::BF16 | DType::F16 | DType::I32) => Ok(()),
        (true, _) => Err(format!("logical op needs pred operands, got {t}")),
        (false, _) => Err(format!("arithmetic op needs numeric operands, got {t}")),
    }
}

fn same_type(a: &TensorType, b: &TensorType) -> Result<(), String> {
    if a == b {
        Ok(())
    } else {
        Err(format!("operands {a} and {b} differ"))
    }
}

/// `perm` is a permutation of `0..rank`.
pub(crate) fn check_permutation(perm: &[usize], rank: usize) -> Result<(), String> {
    let mut seen = vec![false; rank];
    if perm.len() != rank {
        return Err(format!("permutation {perm:?} must have {rank} entries"));
    }
    for &p in perm {
        if p >= rank || std::mem::replace(&mut seen[p], true) {
            return Err(format!("{perm:?} is not a permutation of 0..{rank}"));
        }
    }
    Ok(())
}

fn check_distinct_dims(dims: &[usize], rank: usize, what: &str) -> Result<(), String> {
    if dims.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("{what} dims {dims:?} must be sorted and distinct"));
    }
    check_distinct_dims_unsorted(dims, rank, what)
}

fn check_distinct_dims_unsorted(dims: &[usize], rank: usize, what: &str) -> Result<(), String> {
    for (i, &d) in dims.iter().enumerate() {
        if d >= rank || dims[..i].contains(&d) {
            return Err(format!(
                "{what} dims {dims:?} must be distinct and below rank {rank}"
            ));
        }
    }
    Ok(())
}
