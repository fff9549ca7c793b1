//! The StableHLO writer: one gspmd op at a time into MLIR's generic op form
//! (`%3 = "stablehlo.add"(%1, %2) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>`),
//! regions for reductions, sorts, scatters and control flow, and the collectives of a
//! per-device program with their device lists from the mesh ([`super::groups`]).
//!
//! The match over [`Op`] is exhaustive: a new op does not compile until it exports.
//! What StableHLO with `sdy` cannot say is an [`Error::Export`] naming the value and
//! its source line.

use std::collections::HashMap;
use std::fmt;

use super::groups;
use super::sdy::{self, Keep};
use crate::error::{Error, Result};
use crate::ir::{
    BinaryOp, CompareOp, ConvConfig, CumulativeKind, Flow, Literal, Node, Op, Program, ReduceKind,
    ScatterKind, UnaryOp, ValueId, WindowDim,
};
use crate::sharding::{Mesh, Sharding};
use crate::types::{DType, TensorType};

/// An element type as StableHLO spells it: gspmd's dtypes, and the `ui32` of random
/// bits and partition ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Elem {
    F32,
    BF16,
    F16,
    I32,
    I1,
    U32,
}

impl Elem {
    fn of(dtype: DType) -> Elem {
        match dtype {
            DType::F32 => Elem::F32,
            DType::BF16 => Elem::BF16,
            DType::F16 => Elem::F16,
            DType::I32 => Elem::I32,
            DType::Bool => Elem::I1,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::BF16 | Elem::F16)
    }

    /// `compare_type` of a comparison of this element type.
    fn compare_type(self) -> &'static str {
        match self {
            Elem::F32 | Elem::BF16 | Elem::F16 => "FLOAT",
            Elem::I32 => "SIGNED",
            Elem::I1 | Elem::U32 => "UNSIGNED",
        }
    }

    /// `v` as an element literal of a `dense<..>` attribute (floats by bit pattern, so
    /// infinities and NaNs are exact).
    fn scalar(self, v: f64) -> String {
        match self {
            Elem::F32 => format!("0x{:08X}", (v as f32).to_bits()),
            Elem::BF16 => format!("0x{:04X}", half::bf16::from_f64(v).to_bits()),
            Elem::F16 => format!("0x{:04X}", half::f16::from_f64(v).to_bits()),
            Elem::I32 => format!("{}", v as i32),
            Elem::U32 => format!("{}", v as u32),
            Elem::I1 => (v != 0.0).to_string(),
        }
    }

    /// A quiet NaN with the sign bit clear.
    fn nan(self) -> String {
        match self {
            Elem::F32 => "0x7FC00000".into(),
            Elem::BF16 => "0x7FC0".into(),
            Elem::F16 => "0x7E00".into(),
            Elem::I32 | Elem::U32 | Elem::I1 => "0".into(),
        }
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Elem::F32 => "f32",
            Elem::BF16 => "bf16",
            Elem::F16 => "f16",
            Elem::I32 => "i32",
            Elem::I1 => "i1",
            Elem::U32 => "ui32",
        })
    }
}

/// A ranked tensor type: `tensor<8x16xf32>`, `tensor<i32>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ty {
    pub shape: Vec<usize>,
    pub elem: Elem,
}

impl Ty {
    pub fn of(t: &TensorType) -> Ty {
        Ty {
            shape: t.shape.clone(),
            elem: Elem::of(t.dtype),
        }
    }

    pub fn new(shape: &[usize], elem: Elem) -> Ty {
        Ty {
            shape: shape.to_vec(),
            elem,
        }
    }

    fn scalar(elem: Elem) -> Ty {
        Ty::new(&[], elem)
    }

    pub fn with_elem(&self, elem: Elem) -> Ty {
        Ty::new(&self.shape, elem)
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.elem)
    }
}

/// An SSA value of the text being written: its name and type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Val {
    pub name: String,
    pub ty: Ty,
}

/// Which program is written, and so what becomes of shardings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// A traced program: each user annotation becomes an `sdy.sharding_constraint`
    /// keeping its open dims and priorities.
    Traced,
    /// A propagated program: every value's complete sharding becomes a constraint
    /// (its split axes; a dim in reversed device order, which `sdy` cannot name, leaves
    /// the value unconstrained).
    Propagated,
    /// A per-device program inside a manual computation: no shardings; its collectives
    /// are written with their device lists.
    PerDevice,
}

/// `array<i64: 1, 2>`.
fn i64_array(items: impl IntoIterator<Item = impl fmt::Display>) -> String {
    let items: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    if items.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", items.join(", "))
    }
}

/// `[1, 2]`.
fn list(items: &[usize]) -> String {
    let items: Vec<String> = items.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// `dense<[[0, 1], [1, 1]]> : tensor<2x2xi64>`: per dim `(low, high)` padding.
fn padding_attr(pads: &[(i64, i64)]) -> String {
    if pads.is_empty() {
        return "dense<> : tensor<0x2xi64>".into();
    }
    let rows: Vec<String> = pads.iter().map(|(l, h)| format!("[{l}, {h}]")).collect();
    format!(
        "dense<[{}]> : tensor<{}x2xi64>",
        rows.join(", "),
        pads.len()
    )
}

/// The combining op and identity of a reduction.
fn reduction(kind: ReduceKind, elem: Elem) -> (&'static str, String) {
    let identity = match (kind, elem) {
        (ReduceKind::Sum, e) => e.scalar(0.0),
        (ReduceKind::Max, Elem::I32) => i32::MIN.to_string(),
        (ReduceKind::Min, Elem::I32) => i32::MAX.to_string(),
        (ReduceKind::Max, Elem::U32) => "0".into(),
        (ReduceKind::Min, Elem::U32) => u32::MAX.to_string(),
        (ReduceKind::Max, e) => e.scalar(f64::NEG_INFINITY),
        (ReduceKind::Min, e) => e.scalar(f64::INFINITY),
    };
    let op = match kind {
        ReduceKind::Sum => "stablehlo.add",
        ReduceKind::Max => "stablehlo.maximum",
        ReduceKind::Min => "stablehlo.minimum",
    };
    (op, identity)
}

/// The writer of one function's body: text, indentation, fresh names, channels.
pub(super) struct Writer<'a> {
    mesh: &'a Mesh,
    form: Form,
    text: String,
    depth: usize,
    fresh: usize,
    channels: usize,
    /// Inside a manual computation's body (its axes are manual: no shardings).
    manual: bool,
}

impl<'a> Writer<'a> {
    pub fn new(mesh: &'a Mesh, form: Form, depth: usize) -> Self {
        Writer {
            mesh,
            form,
            text: String::new(),
            depth,
            fresh: 0,
            channels: 0,
            manual: false,
        }
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.text
    }

    fn line(&mut self, line: &str) {
        for _ in 0..self.depth {
            self.text.push_str("  ");
        }
        self.text.push_str(line);
        self.text.push('\n');
    }

    fn fresh_name(&mut self) -> String {
        self.fresh += 1;
        format!("%v{}", self.fresh)
    }

    /// Writes `"name"(operands) (regions) {attrs} : (types) -> (results)` and returns
    /// its results.
    pub fn emit(
        &mut self,
        name: &str,
        operands: &[&Val],
        regions: &[String],
        attrs: &str,
        results: &[Ty],
    ) -> Vec<Val> {
        let base = self.fresh_name();
        let (lhs, vals) = match results.len() {
            0 => (String::new(), Vec::new()),
            1 => (
                format!("{base} = "),
                vec![Val {
                    name: base.clone(),
                    ty: results[0].clone(),
                }],
            ),
            n => (
                format!("{base}:{n} = "),
                (results.iter().enumerate())
                    .map(|(i, t)| Val {
                        name: format!("{base}#{i}"),
                        ty: t.clone(),
                    })
                    .collect(),
            ),
        };
        let names: Vec<&str> = operands.iter().map(|v| v.name.as_str()).collect();
        let types: Vec<String> = operands.iter().map(|v| v.ty.to_string()).collect();
        let result_types: Vec<String> = results.iter().map(ToString::to_string).collect();
        let result_types = match result_types.as_slice() {
            [one] => one.clone(),
            many => format!("({})", many.join(", ")),
        };
        let regions = if regions.is_empty() {
            String::new()
        } else {
            format!(" ({})", regions.join(", "))
        };
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" {{{attrs}}}")
        };
        self.line(&format!(
            "{lhs}\"{name}\"({}){regions}{attrs} : ({}) -> {result_types}",
            names.join(", "),
            types.join(", ")
        ));
        vals
    }

    /// One op of one result.
    fn op(&mut self, name: &str, operands: &[&Val], attrs: &str, ty: Ty) -> Val {
        let mut results = self.emit(name, operands, &[], attrs, &[ty]);
        results.remove(0)
    }

    /// A splat constant of `ty` whose elements are the literal `element`.
    fn splat(&mut self, element: &str, ty: Ty) -> Val {
        let attrs = format!("value = dense<{element}> : {ty}");
        self.op("stablehlo.constant", &[], &attrs, ty)
    }

    fn i32_scalar(&mut self, v: i64) -> Val {
        self.splat(&v.to_string(), Ty::scalar(Elem::I32))
    }

    /// A region of one block: `block_args` become its arguments (written as `^bb0`
    /// when `label`), `body` writes its ops and gives the values that `ret` returns.
    /// Returns the region's text (`{ .. }`) and, unlabelled, the argument list for a
    /// custom header.
    fn region(
        &mut self,
        block_args: &[Ty],
        label: bool,
        ret: &str,
        body: impl FnOnce(&mut Self, Vec<Val>) -> Result<Vec<Val>>,
    ) -> Result<(String, String)> {
        let outer = std::mem::take(&mut self.text);
        let args: Vec<Val> = (block_args.iter())
            .map(|t| Val {
                name: self.fresh_name(),
                ty: t.clone(),
            })
            .collect();
        let header: Vec<String> = args
            .iter()
            .map(|a| format!("{}: {}", a.name, a.ty))
            .collect();
        let header = header.join(", ");
        if label && !args.is_empty() {
            let depth = self.depth;
            self.depth = depth.saturating_sub(1);
            self.line(&format!("^bb0({header}):"));
            self.depth = depth;
        }
        self.depth += 1;
        let outs = body(self, args);
        let outs = match outs {
            Ok(outs) => outs,
            Err(e) => {
                self.depth -= 1;
                self.text = outer;
                return Err(e);
            }
        };
        let refs: Vec<&Val> = outs.iter().collect();
        self.emit(ret, &refs, &[], "", &[]);
        self.depth -= 1;
        let inner = std::mem::replace(&mut self.text, outer);
        let indent = "  ".repeat(self.depth);
        Ok((format!("{{\n{inner}{indent}}}"), header))
    }

    /// The region `(a, b) -> op(a, b)` over scalars of `elem` (`op` empty: `b`, a
    /// scatter that overwrites).
    fn combiner(&mut self, op: &str, elem: Elem) -> Result<String> {
        let scalar = Ty::scalar(elem);
        let (text, _) = self.region(
            &[scalar.clone(), scalar.clone()],
            true,
            "stablehlo.return",
            |w, args| {
                if op.is_empty() {
                    return Ok(vec![args[1].clone()]);
                }
                Ok(vec![w.op(op, &[&args[0], &args[1]], "", scalar)])
            },
        )?;
        Ok(text)
    }

    /// The next `channel_handle` attribute (device to device).
    fn channel(&mut self) -> String {
        self.channels += 1;
        format!(
            "channel_handle = #stablehlo.channel_handle<handle = {}, type = 1>",
            self.channels
        )
    }

    /// Writes `program`'s nodes with its parameters bound to `args` (in parameter
    /// order); returns its outputs.
    pub fn program(&mut self, program: &Program, args: Vec<Val>) -> Result<Vec<Val>> {
        let mut vals: Vec<Option<Val>> = vec![None; program.nodes.len()];
        let mut flows: HashMap<(*const Flow, Vec<ValueId>), Vec<Val>> = HashMap::new();
        for v in program.values() {
            let node = program.node(v);
            let operands = (node.operands.iter())
                .map(|&o| lookup(&vals, program, v, o))
                .collect::<Result<Vec<Val>>>()?;
            let val = self.node(node, v, &operands, &args, &mut flows)?;
            let val = self.constrain(node, v, val)?;
            vals[v.index()] = Some(val);
        }
        (program.outputs.iter())
            .map(|&o| lookup(&vals, program, o, o))
            .collect()
    }

    /// `val` through an `sdy.sharding_constraint` to the node's sharding, where the
    /// form writes one (see [`Form`]); parameters take theirs as attributes.
    fn constrain(&mut self, node: &Node, v: ValueId, val: Val) -> Result<Val> {
        if self.manual || matches!(node.op, Op::Parameter { .. } | Op::ShardingConstraint) {
            return Ok(val);
        }
        let sharding = match self.form {
            Form::Traced => node.annotation.as_ref(),
            Form::Propagated => node.sharding.as_ref().filter(|s| s.is_in_mesh_order()),
            Form::PerDevice => None,
        };
        let Some(sharding) = sharding else {
            return Ok(val);
        };
        self.sharding_constraint(node, v, val, sharding)
    }

    fn sharding_constraint(
        &mut self,
        node: &Node,
        v: ValueId,
        val: Val,
        sharding: &Sharding,
    ) -> Result<Val> {
        let keep = match self.form {
            Form::Traced => Keep::Annotation,
            Form::Propagated | Form::PerDevice => Keep::Split,
        };
        let attr = sharding_attr(self.mesh, node, v, sharding, keep)?;
        let ty = val.ty.clone();
        Ok(self.op(
            "sdy.sharding_constraint",
            &[&val],
            &format!("sharding = {attr}"),
            ty,
        ))
    }

    /// One node; `args` are the program's parameters, `flows` the results of the
    /// control-flow ops written so far (a flow's result nodes share one op).
    fn node(
        &mut self,
        node: &Node,
        v: ValueId,
        operands: &[Val],
        args: &[Val],
        flows: &mut HashMap<(*const Flow, Vec<ValueId>), Vec<Val>>,
    ) -> Result<Val> {
        let ty = Ty::of(&node.ty);
        let x = operands.first();
        let unsupported = |message: String| Error::Export {
            value: v,
            op: node.op.name(),
            location: node.location,
            message,
        };
        let first = || x.ok_or_else(|| unsupported("the op has no operand".into()));
        let ops: Vec<&Val> = operands.iter().collect();
        Ok(match &node.op {
            Op::Parameter { index, .. } => args.get(*index).cloned().ok_or_else(|| {
                unsupported(format!("parameter {index} of {} arguments", args.len()))
            })?,
            Op::Constant(lit) => self.constant(lit, ty),
            Op::Iota { dim, .. } => self.op(
                "stablehlo.iota",
                &[],
                &format!("iota_dimension = {dim} : i64"),
                ty,
            ),
            Op::RandomBits {
                shape,
                strides,
                output,
            } => {
                let [key, base] = operands else {
                    return Err(unsupported("random_bits takes a key and a base".into()));
                };
                self.random_bits(key, base, shape, strides, *output, ty)
            }
            Op::Unary(u) => {
                let name = match u {
                    UnaryOp::Neg => "stablehlo.negate",
                    UnaryOp::Abs => "stablehlo.abs",
                    UnaryOp::Exp => "stablehlo.exponential",
                    UnaryOp::Log => "stablehlo.log",
                    UnaryOp::Sqrt => "stablehlo.sqrt",
                    UnaryOp::Rsqrt => "stablehlo.rsqrt",
                    UnaryOp::Tanh => "stablehlo.tanh",
                    UnaryOp::Logistic => "stablehlo.logistic",
                    UnaryOp::Not => "stablehlo.not",
                    UnaryOp::Sin => "stablehlo.sine",
                    UnaryOp::Cos => "stablehlo.cosine",
                    // StableHLO has no erf; CHLO's is legalized by every XLA compile.
                    UnaryOp::Erf => "chlo.erf",
                    UnaryOp::Floor => "stablehlo.floor",
                    UnaryOp::Ceil => "stablehlo.ceil",
                    UnaryOp::Round => "stablehlo.round_nearest_even",
                    UnaryOp::Sign => "stablehlo.sign",
                    UnaryOp::IsFinite => "stablehlo.is_finite",
                };
                self.op(name, &ops, "", ty)
            }
            Op::Binary(b) => {
                let name = match b {
                    BinaryOp::Add => "stablehlo.add",
                    BinaryOp::Sub => "stablehlo.subtract",
                    BinaryOp::Mul => "stablehlo.multiply",
                    BinaryOp::Div => "stablehlo.divide",
                    BinaryOp::Max => "stablehlo.maximum",
                    BinaryOp::Min => "stablehlo.minimum",
                    BinaryOp::Pow => "stablehlo.power",
                    BinaryOp::And => "stablehlo.and",
                    BinaryOp::Or => "stablehlo.or",
                    BinaryOp::Rem => "stablehlo.remainder",
                };
                self.op(name, &ops, "", ty)
            }
            Op::Compare(c) => {
                let direction = match c {
                    CompareOp::Eq => "EQ",
                    CompareOp::Ne => "NE",
                    CompareOp::Lt => "LT",
                    CompareOp::Le => "LE",
                    CompareOp::Gt => "GT",
                    CompareOp::Ge => "GE",
                };
                let elem = first()?.ty.elem;
                self.compare(&ops, direction, elem.compare_type(), ty)
            }
            Op::Select => self.op("stablehlo.select", &ops, "", ty),
            Op::Convert(_) => self.op("stablehlo.convert", &ops, "", ty),
            Op::Broadcast { dims, .. } => self.op(
                "stablehlo.broadcast_in_dim",
                &ops,
                &format!("broadcast_dimensions = {}", i64_array(dims)),
                ty,
            ),
            Op::Reshape(_) => self.op("stablehlo.reshape", &ops, "", ty),
            Op::Transpose(perm) => self.op(
                "stablehlo.transpose",
                &ops,
                &format!("permutation = {}", i64_array(perm)),
                ty,
            ),
            Op::Reduce { kind, dims } => {
                let x = first()?;
                let (combine, identity) = reduction(*kind, x.ty.elem);
                let init = self.splat(&identity, Ty::scalar(x.ty.elem));
                let region = self.combiner(combine, x.ty.elem)?;
                let attrs = format!("dimensions = {}", i64_array(dims));
                let mut r = self.emit("stablehlo.reduce", &[x, &init], &[region], &attrs, &[ty]);
                r.remove(0)
            }
            Op::DotGeneral(d) => {
                let attrs = format!(
                    "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = {}, \
                     rhs_batching_dimensions = {}, lhs_contracting_dimensions = {}, \
                     rhs_contracting_dimensions = {}>",
                    list(&d.lhs_batch),
                    list(&d.rhs_batch),
                    list(&d.lhs_contracting),
                    list(&d.rhs_contracting)
                );
                self.op("stablehlo.dot_general", &ops, &attrs, ty)
            }
            Op::Slice {
                start,
                limit,
                stride,
            } => {
                let attrs = format!(
                    "start_indices = {}, limit_indices = {}, strides = {}",
                    i64_array(start),
                    i64_array(limit),
                    i64_array(stride)
                );
                self.op("stablehlo.slice", &ops, &attrs, ty)
            }
            Op::Pad {
                low,
                high,
                interior,
            } => {
                let attrs = format!(
                    "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
                    i64_array(low),
                    i64_array(high),
                    i64_array(interior)
                );
                self.op("stablehlo.pad", &ops, &attrs, ty)
            }
            Op::Concatenate(dim) => self.op(
                "stablehlo.concatenate",
                &ops,
                &format!("dimension = {dim} : i64"),
                ty,
            ),
            Op::ReduceWindow { kind, window } => {
                let x = first()?;
                let (combine, identity) = reduction(*kind, x.ty.elem);
                self.reduce_window(x, combine, &identity, window, ty)?
            }
            Op::Convolution(config) => self.op(
                "stablehlo.convolution",
                &ops,
                &convolution_attrs(config),
                ty,
            ),
            Op::DynamicSlice(sizes) => self.op(
                "stablehlo.dynamic_slice",
                &ops,
                &format!("slice_sizes = {}", i64_array(sizes)),
                ty,
            ),
            Op::DynamicUpdateSlice => self.op("stablehlo.dynamic_update_slice", &ops, "", ty),
            Op::Cumulative { kind, dim, reverse } => {
                let x = first()?;
                let (combine, identity) = match kind {
                    CumulativeKind::Sum => ("stablehlo.add", x.ty.elem.scalar(0.0)),
                    CumulativeKind::Prod => ("stablehlo.multiply", x.ty.elem.scalar(1.0)),
                };
                let n = x.ty.shape.get(*dim).copied().unwrap_or(1).max(1);
                let window: Vec<WindowDim> = (0..x.ty.shape.len())
                    .map(|d| match d == *dim {
                        false => WindowDim::new(1, 1, (0, 0)),
                        true if *reverse => WindowDim::new(n, 1, (0, n as i64 - 1)),
                        true => WindowDim::new(n, 1, (n as i64 - 1, 0)),
                    })
                    .collect();
                self.reduce_window(x, combine, &identity, &window, ty)?
            }
            Op::Argsort { dim, descending } => self.argsort(first()?, *dim, *descending, ty)?,
            Op::Reverse(dims) => self.op(
                "stablehlo.reverse",
                &ops,
                &format!("dimensions = {}", i64_array(dims)),
                ty,
            ),
            Op::Gather(d) => {
                let attrs = format!(
                    "dimension_numbers = #stablehlo.gather<offset_dims = {}, \
                     collapsed_slice_dims = {}, operand_batching_dims = {}, \
                     start_indices_batching_dims = {}, start_index_map = {}, \
                     index_vector_dim = {}>, slice_sizes = {}, indices_are_sorted = false",
                    list(&d.offset_dims),
                    list(&d.collapsed_slice_dims),
                    list(&d.operand_batching_dims),
                    list(&d.start_indices_batching_dims),
                    list(&d.start_index_map),
                    d.index_vector_dim,
                    i64_array(&d.slice_sizes)
                );
                self.op("stablehlo.gather", &ops, &attrs, ty)
            }
            Op::Scatter { dims: d, kind } => {
                let combine = match kind {
                    ScatterKind::Add => "stablehlo.add",
                    ScatterKind::Replace => "",
                };
                let region = self.combiner(combine, ty.elem)?;
                let attrs = format!(
                    "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = {}, \
                     inserted_window_dims = {}, input_batching_dims = {}, \
                     scatter_indices_batching_dims = {}, scatter_dims_to_operand_dims = {}, \
                     index_vector_dim = {}>, indices_are_sorted = false, unique_indices = false",
                    list(&d.update_window_dims),
                    list(&d.inserted_window_dims),
                    list(&d.input_batching_dims),
                    list(&d.scatter_indices_batching_dims),
                    list(&d.scatter_dims_to_operand_dims),
                    d.index_vector_dim
                );
                let mut r = self.emit("stablehlo.scatter", &ops, &[region], &attrs, &[ty]);
                r.remove(0)
            }
            Op::AxisIndex(group) => {
                let table = groups::index_table(self.mesh, group)?;
                let n = table.len();
                let table: Vec<String> = table.iter().map(ToString::to_string).collect();
                let table =
                    self.splat(&format!("[{}]", table.join(", ")), Ty::new(&[n], Elem::I32));
                let id = self.op("stablehlo.partition_id", &[], "", Ty::scalar(Elem::U32));
                let id = self.op("stablehlo.convert", &[&id], "", Ty::scalar(Elem::I32));
                let at = self.op(
                    "stablehlo.dynamic_slice",
                    &[&table, &id],
                    "slice_sizes = array<i64: 1>",
                    Ty::new(&[1], Elem::I32),
                );
                self.op("stablehlo.reshape", &[&at], "", ty)
            }
            Op::AllReduce { group, kind } => {
                let (combine, _) = reduction(*kind, ty.elem);
                let region = self.combiner(combine, ty.elem)?;
                let attrs = format!(
                    "replica_groups = {}, {}, use_global_device_ids",
                    self.groups(group)?,
                    self.channel()
                );
                let mut r = self.emit("stablehlo.all_reduce", &ops, &[region], &attrs, &[ty]);
                r.remove(0)
            }
            Op::AllGather { group, dim } => {
                let attrs = format!(
                    "all_gather_dim = {dim} : i64, replica_groups = {}, {}, use_global_device_ids",
                    self.groups(group)?,
                    self.channel()
                );
                self.op("stablehlo.all_gather", &ops, &attrs, ty)
            }
            Op::ReduceScatter { group, kind, dim } => {
                let (combine, _) = reduction(*kind, ty.elem);
                let region = self.combiner(combine, ty.elem)?;
                let attrs = format!(
                    "scatter_dimension = {dim} : i64, replica_groups = {}, {}, \
                     use_global_device_ids",
                    self.groups(group)?,
                    self.channel()
                );
                let mut r = self.emit("stablehlo.reduce_scatter", &ops, &[region], &attrs, &[ty]);
                r.remove(0)
            }
            Op::AllToAll {
                group,
                split_dim,
                concat_dim,
            } => {
                let attrs = format!(
                    "split_dimension = {split_dim} : i64, concat_dimension = {concat_dim} : i64, \
                     split_count = {} : i64, replica_groups = {}, {}",
                    group.size,
                    self.groups(group)?,
                    self.channel()
                );
                self.op("stablehlo.all_to_all", &ops, &attrs, ty)
            }
            Op::CollectivePermute { group, from } => {
                let pairs = groups::permute_pairs(self.mesh, group, from)?;
                self.collective_permute(&ops, &pairs, ty)
            }
            Op::CollectiveShift {
                group,
                offset,
                wrap,
                mirror,
            } => {
                let pairs = groups::shift_pairs(self.mesh, group, *offset, *wrap, *mirror)?;
                self.collective_permute(&ops, &pairs, ty)
            }
            Op::ShardingConstraint => {
                let x = first()?.clone();
                let sharding = match self.form {
                    Form::Traced => node.annotation.as_ref(),
                    // As for any value: a reversed dim leaves it unconstrained.
                    Form::Propagated => node.sharding.as_ref().filter(|s| s.is_in_mesh_order()),
                    Form::PerDevice => None,
                };
                match sharding {
                    Some(s) if !self.manual => self.sharding_constraint(node, v, x, s)?,
                    _ => x,
                }
            }
            Op::PropagationBarrier(direction) => {
                let x = first()?.clone();
                if self.form == Form::PerDevice || self.manual {
                    x
                } else {
                    let name = self.fresh_name();
                    self.line(&format!(
                        "{name} = sdy.propagation_barrier {} allowed_direction={} : {}",
                        x.name,
                        direction.name(),
                        x.ty
                    ));
                    Val { name, ty: x.ty }
                }
            }
            Op::Flow { flow, result } => {
                let key = (std::sync::Arc::as_ptr(flow), node.operands.clone());
                if !flows.contains_key(&key) {
                    let results = self.flow(flow, operands, &unsupported)?;
                    flows.insert(key.clone(), results);
                }
                flows
                    .get(&key)
                    .and_then(|r| r.get(*result))
                    .cloned()
                    .ok_or_else(|| unsupported(format!("{} has no result {result}", flow.name())))?
            }
        })
    }

    /// `dense<[[..]]> : tensor<GxNxi64>` of the groups of `group`.
    fn groups(&self, group: &crate::ir::AxisGroup) -> Result<String> {
        let g = groups::replica_groups(self.mesh, group)?;
        Ok(groups::i64_matrix(&g, group.size))
    }

    fn collective_permute(&mut self, ops: &[&Val], pairs: &[(usize, usize)], ty: Ty) -> Val {
        let rows: Vec<Vec<usize>> = pairs.iter().map(|&(s, t)| vec![s, t]).collect();
        let attrs = format!(
            "source_target_pairs = {}, {}",
            groups::i64_matrix(&rows, 2),
            self.channel()
        );
        self.op("stablehlo.collective_permute", ops, &attrs, ty)
    }

    fn compare(&mut self, ops: &[&Val], direction: &str, compare_type: &str, ty: Ty) -> Val {
        let attrs = format!(
            "comparison_direction = #stablehlo<comparison_direction {direction}>, \
             compare_type = #stablehlo<comparison_type {compare_type}>"
        );
        self.op("stablehlo.compare", ops, &attrs, ty)
    }

    /// A constant: floats and integers as their little-endian bytes in hex (exact), a
    /// bool array as the i32 zeros and ones converted.
    fn constant(&mut self, lit: &Literal, ty: Ty) -> Val {
        let bytes = lit.to_le_bytes();
        if ty.elem == Elem::I1 {
            let ints: Vec<u8> = bytes.iter().flat_map(|&b| [b, 0, 0, 0]).collect();
            let ints = self.splat(&hex(&ints), ty.with_elem(Elem::I32));
            return self.op("stablehlo.convert", &[&ints], "", ty);
        }
        self.splat(&hex(&bytes), ty)
    }

    fn reduce_window(
        &mut self,
        x: &Val,
        combine: &str,
        identity: &str,
        window: &[WindowDim],
        ty: Ty,
    ) -> Result<Val> {
        let init = self.splat(identity, Ty::scalar(x.ty.elem));
        let region = self.combiner(combine, x.ty.elem)?;
        let pads: Vec<(i64, i64)> = window
            .iter()
            .map(|w| (w.padding_low, w.padding_high))
            .collect();
        let attrs = format!(
            "window_dimensions = {}, window_strides = {}, base_dilations = {}, \
             window_dilations = {}, padding = {}",
            i64_array(window.iter().map(|w| w.size)),
            i64_array(window.iter().map(|w| w.stride)),
            i64_array(window.iter().map(|w| w.base_dilation)),
            i64_array(window.iter().map(|w| w.window_dilation)),
            padding_attr(&pads)
        );
        let mut r = self.emit(
            "stablehlo.reduce_window",
            &[x, &init],
            &[region],
            &attrs,
            &[ty],
        );
        Ok(r.remove(0))
    }

    /// A stable sort of `x` and an iota along `dim`; the iota's result. Floats compare
    /// in total order after `-0` becomes `0` and every NaN the positive quiet NaN, so
    /// NaNs sort last (first descending) and `-0 == 0`, as gspmd's kernel.
    fn argsort(&mut self, x: &Val, dim: usize, descending: bool, ty: Ty) -> Result<Val> {
        let elem = x.ty.elem;
        let mut key = x.clone();
        if elem.is_float() {
            let pred = x.ty.with_elem(Elem::I1);
            let zero = self.splat(&elem.scalar(0.0), x.ty.clone());
            let is_zero = self.compare(&[x, &zero], "EQ", "FLOAT", pred.clone());
            let key0 = self.op("stablehlo.select", &[&is_zero, &zero, x], "", x.ty.clone());
            let nan = self.splat(&elem.nan(), x.ty.clone());
            let is_nan = self.compare(&[x, x], "NE", "FLOAT", pred);
            key = self.op(
                "stablehlo.select",
                &[&is_nan, &nan, &key0],
                "",
                x.ty.clone(),
            );
        }
        let iota = self.op(
            "stablehlo.iota",
            &[],
            &format!("iota_dimension = {dim} : i64"),
            ty.clone(),
        );
        let compare_type = if elem.is_float() {
            "TOTALORDER"
        } else {
            elem.compare_type()
        };
        let direction = if descending { "GT" } else { "LT" };
        let (scalar, index) = (Ty::scalar(elem), Ty::scalar(Elem::I32));
        let (region, _) = self.region(
            &[scalar.clone(), scalar, index.clone(), index],
            true,
            "stablehlo.return",
            |w, a| {
                let pred = Ty::scalar(Elem::I1);
                Ok(vec![w.compare(
                    &[&a[0], &a[1]],
                    direction,
                    compare_type,
                    pred,
                )])
            },
        )?;
        let attrs = format!("dimension = {dim} : i64, is_stable = true");
        let sorted = self.emit(
            "stablehlo.sort",
            &[&key, &iota],
            &[region],
            &attrs,
            &[key.ty.clone(), ty],
        );
        Ok(sorted[1].clone())
    }

    /// A control-flow op: `while` and `scan` as `stablehlo.while`, `cond` as
    /// `stablehlo.if`, a manual region as `sdy.manual_computation`. Returns its results.
    fn flow(
        &mut self,
        flow: &Flow,
        operands: &[Val],
        unsupported: &dyn Fn(String) -> Error,
    ) -> Result<Vec<Val>> {
        match flow {
            Flow::While { cond, body } => {
                let n = body.outputs.len();
                let tys: Vec<Ty> = operands.iter().map(|v| v.ty.clone()).collect();
                let (cond_text, _) =
                    self.region(&tys, true, "stablehlo.return", |w, a| w.program(cond, a))?;
                let (body_text, _) = self.region(&tys, true, "stablehlo.return", |w, a| {
                    let mut outs = w.program(body, a.clone())?;
                    outs.extend(a.into_iter().skip(n));
                    Ok(outs)
                })?;
                let ops: Vec<&Val> = operands.iter().collect();
                let mut results =
                    self.emit("stablehlo.while", &ops, &[cond_text, body_text], "", &tys);
                results.truncate(n);
                Ok(results)
            }
            Flow::Scan {
                body,
                carried,
                stacked,
                length,
                reverse,
                ..
            } => self.scan(body, *carried, *stacked, *length, *reverse, operands),
            Flow::Cond { on_true, on_false } => {
                let (pred, captures) = (operands.split_first())
                    .ok_or_else(|| unsupported("cond has no predicate".into()))?;
                let tys: Vec<Ty> = (on_true.outputs.iter())
                    .map(|&o| Ty::of(on_true.ty(o)))
                    .collect();
                let mut regions = Vec::new();
                for branch in [on_true, on_false] {
                    let (text, _) = self.region(&[], false, "stablehlo.return", |w, _| {
                        w.program(branch, captures.to_vec())
                    })?;
                    regions.push(text);
                }
                Ok(self.emit("stablehlo.if", &[pred], &regions, "", &tys))
            }
            Flow::Manual { body, spec } => {
                if self.form == Form::PerDevice {
                    // The partitioner inlines manual regions; one left here has no
                    // meaning inside the per-device program's own manual computation.
                    return Err(unsupported(
                        "a manual region in a per-device program".into(),
                    ));
                }
                let blocks = (operands.iter().zip(&spec.in_specs))
                    .map(|(x, s)| {
                        let global = TensorType::new(x.ty.shape.clone(), dtype_of(x.ty.elem));
                        spec.block(s, &global).map(|t| Ty::of(&t))
                    })
                    .collect::<std::result::Result<Vec<Ty>, String>>()
                    .map_err(unsupported)?;
                let results: Vec<Ty> = (body.outputs.iter().zip(&spec.out_specs))
                    .map(|(&o, s)| {
                        let mut t = Ty::of(body.ty(o));
                        for (size, dim) in t.shape.iter_mut().zip(&s.dims) {
                            *size *= spec.mesh.axes_size(&dim.axes);
                        }
                        t
                    })
                    .collect();
                let (text, header) = self.manual_region(&blocks, body)?;
                let shardings = |specs: &[Sharding]| -> String {
                    let each: Vec<String> = (specs.iter())
                        .map(|s| sdy::sharding_body(self.mesh, s, Keep::Split))
                        .collect();
                    format!("[{}]", each.join(", "))
                };
                let axes: Vec<String> = spec.mesh.axis_names().map(String::from).collect();
                let header = format!(
                    "sdy.manual_computation({}) in_shardings={} out_shardings={} \
                     manual_axes={} ({header}) {text} : ({}) -> {}",
                    names(operands),
                    shardings(&spec.in_specs),
                    shardings(&spec.out_specs),
                    sdy::manual_axes(self.mesh, &axes),
                    types(operands.iter().map(|v| &v.ty)),
                    result_types(&results)
                );
                Ok(self.assign(&header, &results))
            }
        }
    }

    /// The body of a `sdy.manual_computation`: `program` on blocks of types `blocks`,
    /// its axes manual (no shardings written inside). Returns the region and its
    /// argument list (written in the op's header).
    pub fn manual_region(&mut self, blocks: &[Ty], program: &Program) -> Result<(String, String)> {
        let manual = std::mem::replace(&mut self.manual, true);
        let region = self.region(blocks, false, "sdy.return", |w, a| w.program(program, a));
        self.manual = manual;
        region
    }

    /// Writes `lhs = text` for an op in custom form with `results`; returns them.
    pub fn assign(&mut self, text: &str, results: &[Ty]) -> Vec<Val> {
        let base = self.fresh_name();
        let (lhs, vals): (String, Vec<Val>) = match results {
            [one] => (
                format!("{base} = "),
                vec![Val {
                    name: base.clone(),
                    ty: one.clone(),
                }],
            ),
            many => (
                format!("{base}:{} = ", many.len()),
                (many.iter().enumerate())
                    .map(|(i, t)| Val {
                        name: format!("{base}#{i}"),
                        ty: t.clone(),
                    })
                    .collect(),
            ),
        };
        let lhs = if results.is_empty() {
            String::new()
        } else {
            lhs
        };
        self.line(&format!("{lhs}{text}"));
        vals
    }

    /// `scan` as a `while` over `(i, carried.., stacked.., captures.., ys..)`: each
    /// iteration slices the stacked operands at `i` (from the end with `reverse`) and
    /// writes the body's `y`s there.
    fn scan(
        &mut self,
        body: &Program,
        n: usize,
        k: usize,
        length: usize,
        reverse: bool,
        operands: &[Val],
    ) -> Result<Vec<Val>> {
        let ys: Vec<Ty> = (body.outputs.iter().skip(n))
            .map(|&o| {
                let mut t = Ty::of(body.ty(o));
                t.shape.insert(0, length);
                t
            })
            .collect();
        let m = ys.len();
        let start = self.i32_scalar(0);
        let mut state: Vec<Val> = vec![start];
        state.extend(operands.iter().cloned());
        for y in &ys {
            let zero = self.splat(&y.elem.scalar(0.0), y.clone());
            state.push(zero);
        }
        let tys: Vec<Ty> = state.iter().map(|v| v.ty.clone()).collect();
        let (cond, _) = self.region(&tys, true, "stablehlo.return", |w, a| {
            let end = w.i32_scalar(length as i64);
            Ok(vec![w.compare(
                &[&a[0], &end],
                "LT",
                "SIGNED",
                Ty::scalar(Elem::I1),
            )])
        })?;
        let (body_text, _) = self.region(&tys, true, "stablehlo.return", |w, a| {
            let scalar = Ty::scalar(Elem::I32);
            let index = if reverse {
                let last = w.i32_scalar(length as i64 - 1);
                w.op("stablehlo.subtract", &[&last, &a[0]], "", scalar.clone())
            } else {
                a[0].clone()
            };
            let zero = w.i32_scalar(0);
            let mut params: Vec<Val> = a[1..1 + n].to_vec();
            for s in &a[1 + n..1 + n + k] {
                let mut sizes = s.ty.shape.clone();
                if let Some(first) = sizes.first_mut() {
                    *first = 1;
                }
                let mut starts = vec![&index];
                starts.extend(std::iter::repeat_n(&zero, sizes.len().saturating_sub(1)));
                let mut slice_ops = vec![s];
                slice_ops.extend(starts);
                let slice = w.op(
                    "stablehlo.dynamic_slice",
                    &slice_ops,
                    &format!("slice_sizes = {}", i64_array(&sizes)),
                    Ty::new(&sizes, s.ty.elem),
                );
                let row = Ty::new(&s.ty.shape[1..], s.ty.elem);
                params.push(w.op("stablehlo.reshape", &[&slice], "", row));
            }
            params.extend(a[1 + n + k..a.len() - m].iter().cloned());
            let outs = w.program(body, params)?;
            let one = w.i32_scalar(1);
            let next = w.op("stablehlo.add", &[&a[0], &one], "", scalar);
            let mut new_state = vec![next];
            new_state.extend(outs[..n].iter().cloned());
            new_state.extend(a[1 + n..a.len() - m].iter().cloned());
            for (buf, y) in a[a.len() - m..].iter().zip(&outs[n..]) {
                let mut shape = y.ty.shape.clone();
                shape.insert(0, 1);
                let row = w.op("stablehlo.reshape", &[y], "", Ty::new(&shape, y.ty.elem));
                let mut update_ops = vec![buf, &row, &index];
                update_ops.extend(std::iter::repeat_n(&zero, y.ty.shape.len()));
                let ty = buf.ty.clone();
                new_state.push(w.op("stablehlo.dynamic_update_slice", &update_ops, "", ty));
            }
            Ok(new_state)
        })?;
        let ops: Vec<&Val> = state.iter().collect();
        let results = self.emit("stablehlo.while", &ops, &[cond, body_text], "", &tys);
        let mut out: Vec<Val> = results[1..1 + n].to_vec();
        out.extend(results[results.len() - m..].iter().cloned());
        Ok(out)
    }

    /// Element-type helpers for [`super::threefry`].
    pub(super) fn unsigned_splat(&mut self, v: u32, shape: &[usize]) -> Val {
        self.splat(&v.to_string(), Ty::new(shape, Elem::U32))
    }

    /// `name(a, b)` of one result typed as `a`.
    pub(super) fn binary(&mut self, name: &str, a: &Val, b: &Val) -> Val {
        let ty = a.ty.clone();
        self.op(name, &[a, b], "", ty)
    }

    /// One op of one result, for [`super::threefry`].
    pub(super) fn op_of(&mut self, name: &str, operands: &[&Val], attrs: &str, ty: Ty) -> Val {
        self.op(name, operands, attrs, ty)
    }
}

/// `shape`'s element type as a gspmd dtype (for a manual region's block rule).
fn dtype_of(elem: Elem) -> DType {
    match elem {
        Elem::F32 => DType::F32,
        Elem::BF16 => DType::BF16,
        Elem::F16 => DType::F16,
        Elem::I32 | Elem::U32 => DType::I32,
        Elem::I1 => DType::Bool,
    }
}

/// The value `o` read by `v`, written before it.
fn lookup(vals: &[Option<Val>], program: &Program, v: ValueId, o: ValueId) -> Result<Val> {
    vals.get(o.index()).cloned().flatten().ok_or_else(|| {
        let node = program.node(v);
        Error::Export {
            value: v,
            op: node.op.name(),
            location: node.location,
            message: format!("operand {o} is not defined before it"),
        }
    })
}

/// `"0x0000803F"`: bytes in hex, the raw-data form of a `dense` attribute.
fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return String::new();
    }
    let mut s = String::with_capacity(2 * bytes.len() + 4);
    s.push_str("\"0x");
    for b in bytes {
        s.push_str(&format!("{b:02X}"));
    }
    s.push('"');
    s
}

/// The attributes of a `stablehlo.convolution`: window, `[b, 0, 1, f]x[0, 1, i,
/// o]->[b, 0, 1, f]` dimension numbers, group counts.
fn convolution_attrs(config: &ConvConfig) -> String {
    let d = &config.dims;
    let labels = |rank: usize, named: [(usize, &str); 2], spatial: &[usize]| -> String {
        let mut l = vec!["?".to_string(); rank];
        for (i, &s) in spatial.iter().enumerate() {
            if let Some(slot) = l.get_mut(s) {
                *slot = i.to_string();
            }
        }
        for (dim, name) in named {
            if let Some(slot) = l.get_mut(dim) {
                *slot = name.to_string();
            }
        }
        format!("[{}]", l.join(", "))
    };
    let rank = d.input_spatial.len() + 2;
    let w = &config.window;
    let pads: Vec<(i64, i64)> = w.iter().map(|w| (w.padding_low, w.padding_high)).collect();
    format!(
        "dimension_numbers = #stablehlo.conv<{}x{}->{}>, window_strides = {}, padding = {}, \
         lhs_dilation = {}, rhs_dilation = {}, feature_group_count = {} : i64, \
         batch_group_count = {} : i64",
        labels(
            rank,
            [(d.input_batch, "b"), (d.input_feature, "f")],
            &d.input_spatial
        ),
        labels(
            rank,
            [
                (d.kernel_input_feature, "i"),
                (d.kernel_output_feature, "o")
            ],
            &d.kernel_spatial
        ),
        labels(
            rank,
            [(d.output_batch, "b"), (d.output_feature, "f")],
            &d.output_spatial
        ),
        i64_array(w.iter().map(|w| w.stride)),
        padding_attr(&pads),
        i64_array(w.iter().map(|w| w.base_dilation)),
        i64_array(w.iter().map(|w| w.window_dilation)),
        config.feature_group_count,
        config.batch_group_count
    )
}

/// An attribute `#sdy.sharding<..>` of `sharding`, or the typed error for a dim in
/// reversed device order (Shardy's mesh has one device order for all dims).
pub(super) fn sharding_attr(
    mesh: &Mesh,
    node: &Node,
    value: ValueId,
    sharding: &Sharding,
    keep: Keep,
) -> Result<String> {
    if !sharding.is_in_mesh_order() {
        return Err(Error::Export {
            value,
            op: node.op.name(),
            location: node.location,
            message: format!(
                "sharding {sharding} puts a dim in reversed device order, which an sdy \
                 sharding cannot express"
            ),
        });
    }
    Ok(sdy::sharding_attr(mesh, sharding, keep))
}

/// `%a, %b`.
pub(super) fn names(vals: &[Val]) -> String {
    let names: Vec<&str> = vals.iter().map(|v| v.name.as_str()).collect();
    names.join(", ")
}

/// `tensor<..>, tensor<..>`.
pub(super) fn types<'t>(tys: impl IntoIterator<Item = &'t Ty>) -> String {
    let tys: Vec<String> = tys.into_iter().map(ToString::to_string).collect();
    tys.join(", ")
}

/// `tensor<..>` for one result, `(tensor<..>, ..)` otherwise.
pub(super) fn result_types(tys: &[Ty]) -> String {
    match tys {
        [one] => one.to_string(),
        many => format!("({})", types(many)),
    }
}
