//! One op statement into gspmd nodes: the ops gspmd has one for map one to one; the
//! two-operand argmax/argmin `reduce`, `clamp` and `select_and_scatter` are written
//! with several (see each function).

use super::text::{
    Stmt, int_list, ints_after, list_after, number_after, padding_after, parse_dense, result_types,
};
use super::{Reader, error, location, sdy};
use crate::error::Result;
use crate::ir::{
    BinaryOp, CompareOp, ConvConfig, ConvDimensionNumbers, DotDims, GatherDims, Literal, Op,
    ReduceKind, ScatterDims, ScatterKind, UnaryOp, ValueId, WindowDim,
};
use crate::types::{DType, TensorType};

/// The nodes of `%r = op_name ...` (`rhs` is the text after ` = `); its results.
pub(super) fn op(r: &mut Reader, stmt: &Stmt, op_name: &str, rhs: &str) -> Result<Vec<ValueId>> {
    let n = stmt.line;
    let types = result_types(rhs).map_err(|m| error(n, m))?;
    let operand_text = rhs.trim_start_matches('"')[op_name.len()..].to_string();
    let operands = r.operands(n, &operand_text)?;
    let result = types
        .first()
        .cloned()
        .unwrap_or_else(|| TensorType::new(vec![], DType::F32));
    let attr = |key: &str| -> Result<Vec<usize>> {
        list_after(rhs, key).ok_or_else(|| error(n, format!("{op_name}: no `{key}` list")))
    };
    let op = match op_name {
        "stablehlo.constant" => Op::Constant(parse_dense(rhs, &result).map_err(|m| error(n, m))?),
        "stablehlo.broadcast_in_dim" => Op::Broadcast {
            shape: result.shape.clone(),
            dims: attr("dims =")?,
        },
        "stablehlo.reshape" => Op::Reshape(result.shape.clone()),
        "stablehlo.transpose" => Op::Transpose(attr("dims =")?),
        "stablehlo.reverse" => Op::Reverse(attr("dims =")?),
        "stablehlo.convert" => Op::Convert(result.dtype),
        "stablehlo.select" => return select(r, n, &operands),
        "stablehlo.iota" => Op::Iota {
            shape: result.shape.clone(),
            dim: number_after(rhs, "dim =").ok_or_else(|| error(n, "iota: no dim".into()))?,
            dtype: result.dtype,
        },
        "stablehlo.concatenate" => Op::Concatenate(
            number_after(rhs, "dim =").ok_or_else(|| error(n, "concatenate: no dim".into()))?,
        ),
        "stablehlo.slice" => slice(rhs).ok_or_else(|| error(n, "slice: no `[a:b]` list".into()))?,
        "stablehlo.pad" => {
            let list =
                |key: &str| ints_after(rhs, key).ok_or_else(|| error(n, format!("pad: no {key}")));
            let interior = list("interior =")?;
            Op::Pad {
                low: list("low =")?,
                high: list("high =")?,
                interior: interior.into_iter().map(|v| v.max(0) as usize).collect(),
            }
        }
        "stablehlo.dynamic_slice" => Op::DynamicSlice(attr("sizes =")?),
        "stablehlo.dynamic_update_slice" => Op::DynamicUpdateSlice,
        "stablehlo.dot_general" => Op::DotGeneral(dot_dims(rhs)),
        "stablehlo.convolution" => {
            let kernel = r
                .program
                .ty(*operands
                    .get(1)
                    .ok_or_else(|| error(n, "convolution: two operands".into()))?)
                .clone();
            Op::Convolution(convolution(rhs, &kernel).map_err(|m| error(n, m))?)
        }
        "stablehlo.gather" => Op::Gather(
            gather_dims(rhs).ok_or_else(|| error(n, "gather: dimension numbers".into()))?,
        ),
        "stablehlo.scatter" => {
            let dims =
                scatter_dims(rhs).ok_or_else(|| error(n, "scatter: dimension numbers".into()))?;
            let kind = match combiner(stmt, 0) {
                Some("stablehlo.add") => ScatterKind::Add,
                Some("stablehlo.return") => ScatterKind::Replace,
                other => {
                    return Err(error(
                        n,
                        format!("scatter: combiner {other:?} (add or replace)"),
                    ));
                }
            };
            Op::Scatter { dims, kind }
        }
        "stablehlo.reduce" => return reduce(r, stmt, rhs, &operands),
        "stablehlo.reduce_window" => {
            let [x, init] = operands[..] else {
                return Err(error(
                    n,
                    "reduce_window: one operand and one init value expected".into(),
                ));
            };
            let kind = reduce_kind(combiner(stmt, 0)).ok_or_else(|| {
                error(
                    n,
                    "reduce_window: combiner other than add, maximum, minimum".into(),
                )
            })?;
            if !is_identity(r, init, kind) {
                return Err(error(
                    n,
                    "reduce_window: an init value other than the combiner's identity".into(),
                ));
            }
            let rank = r.program.ty(x).rank();
            let window = window(rhs, rank).map_err(|m| error(n, m))?;
            return Ok(vec![push(r, n, Op::ReduceWindow { kind, window }, &[x])?]);
        }
        "stablehlo.select_and_scatter" => return select_and_scatter(r, stmt, rhs, &operands),
        "stablehlo.clamp" => return clamp(r, n, &operands),
        "stablehlo.optimization_barrier" => return Ok(operands),
        "sdy.sharding_constraint" => {
            let at = rhs
                .find('<')
                .ok_or_else(|| error(n, "constraint: no sharding".into()))?;
            let sharding = sdy::parse_sharding(&rhs[at..], r.mesh).map_err(|m| error(n, m))?;
            let id = push(r, n, Op::ShardingConstraint, &operands)?;
            r.program.node_mut(id).annotation = Some(sharding);
            return Ok(vec![id]);
        }
        "stablehlo.compare" => {
            let direction = operand_text
                .split(|c: char| c == ',' || c.is_whitespace())
                .find(|w| !w.is_empty());
            Op::Compare(match direction {
                Some("EQ") => CompareOp::Eq,
                Some("NE") => CompareOp::Ne,
                Some("LT") => CompareOp::Lt,
                Some("LE") => CompareOp::Le,
                Some("GT") => CompareOp::Gt,
                Some("GE") => CompareOp::Ge,
                _ => return Err(error(n, "compare: no direction".into())),
            })
        }
        name => match (unary(name), binary(name)) {
            (Some(u), _) => Op::Unary(u),
            (_, Some(b)) => Op::Binary(b),
            (None, None) => {
                return Err(error(
                    n,
                    format!("{name} is outside the imported op subset"),
                ));
            }
        },
    };
    Ok(vec![push(r, n, op, &operands)?])
}

fn push(r: &mut Reader, n: usize, op: Op, operands: &[ValueId]) -> Result<ValueId> {
    r.program.push_op(op, operands, location(n))
}

/// A scalar constant of `dtype` broadcast to `shape`.
fn full(r: &mut Reader, n: usize, shape: &[usize], dtype: DType, value: f64) -> Result<ValueId> {
    let scalar = r.constant(n, Literal::full(&[], dtype, value))?;
    broadcast(r, n, scalar, shape, &[])
}

fn broadcast(
    r: &mut Reader,
    n: usize,
    x: ValueId,
    shape: &[usize],
    dims: &[usize],
) -> Result<ValueId> {
    let op = Op::Broadcast {
        shape: shape.to_vec(),
        dims: dims.to_vec(),
    };
    push(r, n, op, &[x])
}

/// The name of the first op of region `k`'s body (`stablehlo.return` if it only
/// returns an argument).
fn combiner(stmt: &Stmt, k: usize) -> Option<&str> {
    let first = stmt.regions.get(k)?.body.first()?;
    let text = first
        .text
        .split_once(" = ")
        .map_or(first.text.as_str(), |(_, r)| r);
    text.split_whitespace().next()
}

fn reduce_kind(combiner: Option<&str>) -> Option<ReduceKind> {
    match combiner? {
        "stablehlo.add" => Some(ReduceKind::Sum),
        "stablehlo.maximum" => Some(ReduceKind::Max),
        "stablehlo.minimum" => Some(ReduceKind::Min),
        _ => None,
    }
}

fn identity(kind: ReduceKind) -> f64 {
    match kind {
        ReduceKind::Sum => 0.0,
        ReduceKind::Max => f64::NEG_INFINITY,
        ReduceKind::Min => f64::INFINITY,
    }
}

/// Whether `v` is a constant (seen through broadcasts and reshapes) whose every
/// element is `value`.
fn is_splat(r: &Reader, v: ValueId, value: f64) -> bool {
    let node = r.program.node(v);
    match &node.op {
        Op::Constant(lit) => *lit == Literal::full(&node.ty.shape, node.ty.dtype, value),
        Op::Broadcast { .. } | Op::Reshape(_) => is_splat(r, node.operands[0], value),
        _ => false,
    }
}

fn is_identity(r: &Reader, v: ValueId, kind: ReduceKind) -> bool {
    is_splat(r, v, identity(kind))
}

/// `stablehlo.slice %x [a:b, c:d:s]`.
fn slice(rhs: &str) -> Option<Op> {
    let open = rhs.find('[')?;
    let inner = rhs[open + 1..].split(']').next()?;
    let (mut start, mut limit, mut stride) = (Vec::new(), Vec::new(), Vec::new());
    for part in inner.split(',') {
        let bounds: Vec<usize> =
            (part.split(':').map(|v| v.trim().parse().ok())).collect::<Option<_>>()?;
        match bounds[..] {
            [a, b] => (start.push(a), limit.push(b), stride.push(1)),
            [a, b, s] => (start.push(a), limit.push(b), stride.push(s)),
            _ => return None,
        };
    }
    Some(Op::Slice {
        start,
        limit,
        stride,
    })
}

/// `batching_dims = [0] x [0], contracting_dims = [2] x [1]`.
fn dot_dims(rhs: &str) -> DotDims {
    let pair = |key: &str| -> (Vec<usize>, Vec<usize>) {
        let lhs = list_after(rhs, key).unwrap_or_default();
        let rhs_list = (rhs.find(key))
            .and_then(|at| rhs[at..].find(" x ").map(|x| at + x + 3))
            .and_then(|at| list_after(&rhs[at..], ""))
            .unwrap_or_default();
        (lhs, rhs_list)
    };
    let (lhs_batch, rhs_batch) = pair("batching_dims =");
    let (lhs_contracting, rhs_contracting) = pair("contracting_dims =");
    DotDims {
        lhs_batch,
        rhs_batch,
        lhs_contracting,
        rhs_contracting,
    }
}

/// `dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [..],
/// pad = [[..]], lhs_dilate = [..], rhs_dilate = [..], reverse = [..]}` and the group
/// counts.
fn convolution(rhs: &str, kernel: &TensorType) -> std::result::Result<ConvConfig, String> {
    let at = rhs
        .find("dim_numbers = ")
        .ok_or("convolution: no dim_numbers")?
        + "dim_numbers = ".len();
    let spec = rhs[at..].split(", window").next().unwrap_or("");
    let spec = spec.split(" {").next().unwrap_or(spec);
    let (input, rest) = spec.split_once("]x[").ok_or("convolution: dim_numbers")?;
    let (kernel_labels, output) = rest.split_once("]->[").ok_or("convolution: dim_numbers")?;
    let labels = |s: &str| -> Vec<String> {
        s.trim_matches(['[', ']', ' '])
            .split(',')
            .map(|l| l.trim().to_string())
            .collect()
    };
    let (input, kernel_labels, output) = (labels(input), labels(kernel_labels), labels(output));
    let find = |labels: &[String], l: &str| -> std::result::Result<usize, String> {
        labels
            .iter()
            .position(|x| x == l)
            .ok_or(format!("convolution: no `{l}` in {labels:?}"))
    };
    let spatial = input.len().saturating_sub(2);
    let spatial_of = |labels: &[String]| -> std::result::Result<Vec<usize>, String> {
        (0..spatial).map(|k| find(labels, &k.to_string())).collect()
    };
    let dims = ConvDimensionNumbers {
        input_batch: find(&input, "b")?,
        input_feature: find(&input, "f")?,
        input_spatial: spatial_of(&input)?,
        kernel_input_feature: find(&kernel_labels, "i")?,
        kernel_output_feature: find(&kernel_labels, "o")?,
        kernel_spatial: spatial_of(&kernel_labels)?,
        output_batch: find(&output, "b")?,
        output_feature: find(&output, "f")?,
        output_spatial: spatial_of(&output)?,
    };
    let window_text = rhs
        .split_once("window = {")
        .map_or("", |(_, w)| w.split('}').next().unwrap_or(""));
    let ones = vec![1; spatial];
    let stride = list_after(window_text, "stride =").unwrap_or_else(|| ones.clone());
    let lhs_dilate = list_after(window_text, "lhs_dilate =").unwrap_or_else(|| ones.clone());
    let rhs_dilate = list_after(window_text, "rhs_dilate =").unwrap_or_else(|| ones.clone());
    if window_text.contains("true") {
        return Err("convolution: a reversed window is outside the imported subset".into());
    }
    let pad = match window_text.find("pad = ") {
        Some(at) => int_list(&window_text[at + "pad = ".len()..]),
        None => vec![0; 2 * spatial],
    };
    if [stride.len(), lhs_dilate.len(), rhs_dilate.len()] != [spatial; 3]
        || pad.len() != 2 * spatial
        || kernel.rank() != kernel_labels.len()
    {
        return Err(format!(
            "convolution: a window or kernel of other than {spatial} spatial dims"
        ));
    }
    let window = (0..spatial)
        .map(|k| {
            WindowDim::new(
                kernel.shape[dims.kernel_spatial[k]],
                stride[k],
                (pad[2 * k], pad[2 * k + 1]),
            )
            .with_window_dilation(rhs_dilate[k])
            .with_base_dilation(lhs_dilate[k])
        })
        .collect();
    let count = |key: &str| number_after(rhs, key).unwrap_or(1);
    Ok(ConvConfig {
        dims,
        window,
        feature_group_count: count("feature_group_count ="),
        batch_group_count: count("batch_group_count ="),
    })
}

/// A `reduce_window`'s or `select_and_scatter`'s window over a rank-`rank` operand.
fn window(rhs: &str, rank: usize) -> std::result::Result<Vec<WindowDim>, String> {
    let ones = vec![1; rank];
    let list = |key: &str| {
        ints_after(rhs, key).map(|v| v.into_iter().map(|x| x as usize).collect::<Vec<usize>>())
    };
    let size = list("window_dimensions =").ok_or("no window_dimensions")?;
    let stride = list("window_strides =").unwrap_or_else(|| ones.clone());
    let base = list("base_dilations =").unwrap_or_else(|| ones.clone());
    let dilation = list("window_dilations =").unwrap_or_else(|| ones.clone());
    let padding = padding_after(rhs, "padding =", rank)?;
    if [size.len(), stride.len(), base.len(), dilation.len()] != [rank; 4] {
        return Err(format!("a window of other than {rank} dims"));
    }
    Ok((0..rank)
        .map(|d| {
            WindowDim::new(size[d], stride[d], padding[d])
                .with_window_dilation(dilation[d])
                .with_base_dilation(base[d])
        })
        .collect())
}

fn gather_dims(rhs: &str) -> Option<GatherDims> {
    let list = |key: &str| list_after(rhs, key).unwrap_or_default();
    Some(GatherDims {
        offset_dims: list("offset_dims ="),
        collapsed_slice_dims: list("collapsed_slice_dims ="),
        operand_batching_dims: list("operand_batching_dims ="),
        start_indices_batching_dims: list("start_indices_batching_dims ="),
        start_index_map: list("start_index_map ="),
        index_vector_dim: number_after(rhs, "index_vector_dim =")?,
        slice_sizes: list_after(rhs, "slice_sizes =")?,
    })
}

fn scatter_dims(rhs: &str) -> Option<ScatterDims> {
    let list = |key: &str| list_after(rhs, key).unwrap_or_default();
    Some(ScatterDims {
        update_window_dims: list("update_window_dims ="),
        inserted_window_dims: list("inserted_window_dims ="),
        input_batching_dims: list("input_batching_dims ="),
        scatter_indices_batching_dims: list("scatter_indices_batching_dims ="),
        scatter_dims_to_operand_dims: list("scatter_dims_to_operand_dims ="),
        index_vector_dim: number_after(rhs, "index_vector_dim =")?,
    })
}

/// `reduce(x init: c) applies op across dimensions = [..]` (or with a `reducer`
/// region of one op): the reduction, combined with `c` unless `c` is the kind's
/// identity (gspmd's reduce starts from the identity). Two operands with an
/// argmax/argmin reducer (JAX's `argmax`: values and an iota, compared `GT`/`LT`, ties
/// to the lower index): see [`arg_extreme`].
fn reduce(r: &mut Reader, stmt: &Stmt, rhs: &str, operands: &[ValueId]) -> Result<Vec<ValueId>> {
    let n = stmt.line;
    let dims =
        list_after(rhs, "dimensions =").ok_or_else(|| error(n, "reduce: no dimensions".into()))?;
    let applied = rhs
        .split("applies ")
        .nth(1)
        .and_then(|a| a.split_whitespace().next());
    if let [x, _, index, _] = operands[..] {
        let first_op = stmt.regions.first().and_then(|g| g.body.first());
        let kind = match combiner(stmt, 0).zip(first_op) {
            Some(("stablehlo.compare", first)) if first.text.contains(" GT,") => ReduceKind::Max,
            Some(("stablehlo.compare", first)) if first.text.contains(" LT,") => ReduceKind::Min,
            _ => {
                return Err(error(
                    n,
                    "reduce: of two operands, only argmax and argmin".into(),
                ));
            }
        };
        return arg_extreme(r, n, kind, &dims, x, index);
    }
    let [x, init] = operands[..] else {
        return Err(error(
            n,
            "reduce: one operand and one init value expected".into(),
        ));
    };
    let kind = reduce_kind(applied.or_else(|| combiner(stmt, 0))).ok_or_else(|| {
        error(
            n,
            "reduce: combiner other than add, maximum, minimum".into(),
        )
    })?;
    let id = push(r, n, Op::Reduce { kind, dims }, &[x])?;
    if is_identity(r, init, kind) {
        return Ok(vec![id]);
    }
    let shape = r.program.ty(id).shape.clone();
    let init = broadcast(r, n, init, &shape, &[])?;
    let combine = match kind {
        ReduceKind::Sum => BinaryOp::Add,
        ReduceKind::Max => BinaryOp::Max,
        ReduceKind::Min => BinaryOp::Min,
    };
    Ok(vec![push(r, n, Op::Binary(combine), &[id, init])?])
}

/// JAX's argmax (`kind` max) or argmin over `dims` of `x` with positions `index`:
/// the extreme `e = reduce(x)`, and the least `index` where `x == e` or `x` is NaN
/// (NaN counts as the extreme, as JAX's reducer has it).
fn arg_extreme(
    r: &mut Reader,
    n: usize,
    kind: ReduceKind,
    dims: &[usize],
    x: ValueId,
    index: ValueId,
) -> Result<Vec<ValueId>> {
    let ty = r.program.ty(x).clone();
    let kept: Vec<usize> = (0..ty.rank()).filter(|d| !dims.contains(d)).collect();
    let extreme = push(
        r,
        n,
        Op::Reduce {
            kind,
            dims: dims.to_vec(),
        },
        &[x],
    )?;
    let spread = broadcast(r, n, extreme, &ty.shape, &kept)?;
    let equal = push(r, n, Op::Compare(CompareOp::Eq), &[x, spread])?;
    let nan = push(r, n, Op::Compare(CompareOp::Ne), &[x, x])?;
    let hit = push(r, n, Op::Binary(BinaryOp::Or), &[equal, nan])?;
    let index_ty = r.program.ty(index).clone();
    let past: usize = dims.iter().map(|&d| ty.shape[d]).product();
    let none = full(r, n, &index_ty.shape, index_ty.dtype, past as f64)?;
    let candidates = push(r, n, Op::Select, &[hit, index, none])?;
    let first = Op::Reduce {
        kind: ReduceKind::Min,
        dims: dims.to_vec(),
    };
    Ok(vec![extreme, push(r, n, first, &[candidates])?])
}

/// `select(pred, a, b)`; a scalar `pred` (StableHLO's picks a whole operand) is
/// broadcast.
fn select(r: &mut Reader, n: usize, operands: &[ValueId]) -> Result<Vec<ValueId>> {
    let [pred, a, b] = operands[..] else {
        return Err(error(n, "select: three operands expected".into()));
    };
    let shape = r.program.ty(a).shape.clone();
    let pred = match r.program.ty(pred).rank() == 0 && !shape.is_empty() {
        true => broadcast(r, n, pred, &shape, &[])?,
        false => pred,
    };
    Ok(vec![push(r, n, Op::Select, &[pred, a, b])?])
}

/// `clamp(lo, x, hi)` as `min(max(x, lo), hi)` (scalar bounds broadcast).
fn clamp(r: &mut Reader, n: usize, operands: &[ValueId]) -> Result<Vec<ValueId>> {
    let [lo, x, hi] = operands[..] else {
        return Err(error(n, "clamp: three operands expected".into()));
    };
    let shape = r.program.ty(x).shape.clone();
    let mut bound = |b: ValueId| -> Result<ValueId> {
        match r.program.ty(b).shape == shape {
            true => Ok(b),
            false => broadcast(r, n, b, &shape, &[]),
        }
    };
    let (lo, hi) = (bound(lo)?, bound(hi)?);
    let above = push(r, n, Op::Binary(BinaryOp::Max), &[x, lo])?;
    Ok(vec![push(r, n, Op::Binary(BinaryOp::Min), &[above, hi])?])
}

/// `select_and_scatter(x, source, init)` with windows that tile `x` (size equals
/// stride, no padding, dims divisible), selecting with `GE` (max pooling's gradient)
/// or `LE` and scattering with `add`: each window's first extreme element of `x`
/// receives its `source` element, the others `init`. Written as `x` cut into its
/// windows (reshape, transpose, reshape to `[windows.., W]`), the first position of the
/// extreme per window, a one-hot select of the broadcast source, and the inverse
/// reshapes.
fn select_and_scatter(
    r: &mut Reader,
    stmt: &Stmt,
    rhs: &str,
    operands: &[ValueId],
) -> Result<Vec<ValueId>> {
    let n = stmt.line;
    let [x, source, init] = operands[..] else {
        return Err(error(
            n,
            "select_and_scatter: three operands expected".into(),
        ));
    };
    let select = stmt
        .regions
        .first()
        .and_then(|g| g.body.first())
        .map(|s| s.text.as_str())
        .unwrap_or("");
    let kind = if select.contains("compare GE,") {
        ReduceKind::Max
    } else if select.contains("compare LE,") {
        ReduceKind::Min
    } else {
        return Err(error(
            n,
            "select_and_scatter: a select other than GE or LE".into(),
        ));
    };
    if combiner(stmt, 1) != Some("stablehlo.add") {
        return Err(error(
            n,
            "select_and_scatter: a scatter other than add".into(),
        ));
    }
    let ty = r.program.ty(x).clone();
    let rank = ty.rank();
    let window = window(rhs, rank).map_err(|m| error(n, m))?;
    let tiles = window.iter().zip(&ty.shape).all(|(w, &d)| {
        w.size == w.stride
            && w.padding_low == 0
            && w.padding_high == 0
            && w.window_dilation == 1
            && w.base_dilation == 1
            && w.size > 0
            && d % w.size == 0
    });
    if !tiles {
        return Err(error(
            n,
            "select_and_scatter: only windows that tile the operand (size = stride, no padding)"
                .into(),
        ));
    }
    let outer: Vec<usize> = window
        .iter()
        .zip(&ty.shape)
        .map(|(w, &d)| d / w.size)
        .collect();
    let sizes: Vec<usize> = window.iter().map(|w| w.size).collect();
    let cells: usize = sizes.iter().product();
    let interleaved: Vec<usize> = outer
        .iter()
        .zip(&sizes)
        .flat_map(|(&o, &s)| [o, s])
        .collect();
    let perm: Vec<usize> = (0..rank)
        .map(|d| 2 * d)
        .chain((0..rank).map(|d| 2 * d + 1))
        .collect();
    let mut inverse = vec![0; 2 * rank];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    let grouped: Vec<usize> = outer.iter().chain(&sizes).copied().collect();
    let mut flat = outer.clone();
    flat.push(cells);
    let kept: Vec<usize> = (0..rank).collect();

    let cut = push(r, n, Op::Reshape(interleaved.clone()), &[x])?;
    let cut = push(r, n, Op::Transpose(perm), &[cut])?;
    let cut = push(r, n, Op::Reshape(flat.clone()), &[cut])?;
    let position = push(
        r,
        n,
        Op::Iota {
            shape: flat.clone(),
            dim: rank,
            dtype: DType::I32,
        },
        &[],
    )?;
    let [_, first] = arg_extreme(r, n, kind, &[rank], cut, position)?[..] else {
        unreachable!("arg_extreme gives two results")
    };
    let first = broadcast(r, n, first, &flat, &kept)?;
    let chosen = push(r, n, Op::Compare(CompareOp::Eq), &[position, first])?;
    let spread = broadcast(r, n, source, &flat, &kept)?;
    let zero = full(r, n, &flat, ty.dtype, 0.0)?;
    let scattered = push(r, n, Op::Select, &[chosen, spread, zero])?;
    let back = push(r, n, Op::Reshape(grouped), &[scattered])?;
    let back = push(r, n, Op::Transpose(inverse), &[back])?;
    let back = push(r, n, Op::Reshape(ty.shape.clone()), &[back])?;
    if is_splat(r, init, 0.0) {
        return Ok(vec![back]);
    }
    let init = broadcast(r, n, init, &ty.shape, &[])?;
    Ok(vec![push(r, n, Op::Binary(BinaryOp::Add), &[back, init])?])
}

fn unary(name: &str) -> Option<UnaryOp> {
    Some(match name {
        "stablehlo.negate" => UnaryOp::Neg,
        "stablehlo.abs" => UnaryOp::Abs,
        "stablehlo.exponential" => UnaryOp::Exp,
        "stablehlo.log" => UnaryOp::Log,
        "stablehlo.sqrt" => UnaryOp::Sqrt,
        "stablehlo.rsqrt" => UnaryOp::Rsqrt,
        "stablehlo.tanh" => UnaryOp::Tanh,
        "stablehlo.logistic" => UnaryOp::Logistic,
        "stablehlo.not" => UnaryOp::Not,
        "stablehlo.sine" => UnaryOp::Sin,
        "stablehlo.cosine" => UnaryOp::Cos,
        "chlo.erf" => UnaryOp::Erf,
        "stablehlo.floor" => UnaryOp::Floor,
        "stablehlo.ceil" => UnaryOp::Ceil,
        "stablehlo.round_nearest_even" => UnaryOp::Round,
        "stablehlo.sign" => UnaryOp::Sign,
        "stablehlo.is_finite" => UnaryOp::IsFinite,
        _ => return None,
    })
}

fn binary(name: &str) -> Option<BinaryOp> {
    Some(match name {
        "stablehlo.add" => BinaryOp::Add,
        "stablehlo.subtract" => BinaryOp::Sub,
        "stablehlo.multiply" => BinaryOp::Mul,
        "stablehlo.divide" => BinaryOp::Div,
        "stablehlo.maximum" => BinaryOp::Max,
        "stablehlo.minimum" => BinaryOp::Min,
        "stablehlo.power" => BinaryOp::Pow,
        "stablehlo.and" => BinaryOp::And,
        "stablehlo.or" => BinaryOp::Or,
        "stablehlo.remainder" => BinaryOp::Rem,
        _ => return None,
    })
}
