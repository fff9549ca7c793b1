//! HLO-like text form of a [`Program`]: one value a line with its type, its sharding
//! (the complete one after propagation, else the annotation) and its source line.
//!
//! ```text
//! program mlp {
//!   %0 = parameter(0) "x" : f32[8,16] sharding=(data, _) annotated  // src/main.rs:9
//!   %2 = dot_general(%0, %1), lhs_contracting={1}, rhs_contracting={0} : f32[8,64] sharding=(data, model)
//!   return %5
//! }
//! ```

use std::fmt::{self, Write};
use std::sync::Arc;

use super::flow::Flow;
use super::literal::Literal;
use super::op::{CompareOp, ConvConfig, ConvDimensionNumbers, Op, ReduceKind, WindowDim};
use super::program::{Node, Program};
use super::remat::Remat;
use crate::types::{ValueId, join};

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "program {} {{", self.name)?;
        write_body(f, self, 1)?;
        write!(f, "}}")
    }
}

/// The nodes and the `return` line of `program`, `depth` levels indented. A flow op's
/// regions follow its first result node, one level deeper; the instance's other result
/// nodes name that node.
fn write_body(f: &mut fmt::Formatter<'_>, program: &Program, depth: usize) -> fmt::Result {
    let indent = "  ".repeat(depth);
    let mut printed: Vec<(&Arc<Flow>, &[ValueId], ValueId)> = Vec::new();
    for v in program.values() {
        let node = program.node(v);
        write!(f, "{indent}{v} = {}", NodeText(node))?;
        let Op::Flow { flow, .. } = &node.op else {
            writeln!(f)?;
            continue;
        };
        let same = |&&(g, operands, _): &&(&Arc<Flow>, &[ValueId], ValueId)| {
            Arc::ptr_eq(g, flow) && operands == node.operands.as_slice()
        };
        if let Some(&(_, _, first)) = printed.iter().find(same) {
            writeln!(f, "  // regions of {first}")?;
            continue;
        }
        writeln!(f)?;
        printed.push((flow, &node.operands, v));
        for (name, region) in flow.region_names().iter().zip(flow.regions()) {
            writeln!(f, "{indent}  {name} {{")?;
            write_body(f, region, depth + 2)?;
            writeln!(f, "{indent}  }}")?;
        }
    }
    let outs: Vec<String> = program.outputs.iter().map(ToString::to_string).collect();
    writeln!(f, "{indent}return {}", outs.join(", "))
}

/// One node's text after `%N = `.
struct NodeText<'a>(&'a Node);

impl fmt::Display for NodeText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let node = self.0;
        let operands: Vec<String> = node.operands.iter().map(ToString::to_string).collect();
        let mut text = format!("{}({})", op_head(&node.op), operands.join(", "));
        text.push_str(&attributes(&node.op));
        if let Some(name) = &node.name {
            write!(text, " \"{name}\"")?;
        }
        write!(text, " : {}", node.ty)?;
        match (&node.sharding, &node.annotation) {
            (Some(s), Some(_)) => write!(text, " sharding={s} annotated")?,
            (Some(s), None) => write!(text, " sharding={s}")?,
            (None, Some(a)) => write!(text, " annotation={a}")?,
            (None, None) => {}
        }
        if node.location.line != 0 {
            write!(text, "  // {}", node.location)?;
        }
        f.write_str(&text)
    }
}

/// The op's name with a direction or kind where it has one (`compare.LT`, `reduce.sum`).
fn op_head(op: &Op) -> String {
    match op {
        Op::Compare(c) => format!(
            "compare.{}",
            match c {
                CompareOp::Eq => "EQ",
                CompareOp::Ne => "NE",
                CompareOp::Lt => "LT",
                CompareOp::Le => "LE",
                CompareOp::Gt => "GT",
                CompareOp::Ge => "GE",
            }
        ),
        Op::Reduce { kind, .. } => format!("reduce.{}", reduce_name(*kind)),
        Op::ReduceWindow { kind, .. } => format!("reduce_window.{}", reduce_name(*kind)),
        Op::Parameter { index, .. } => format!("parameter.{index}"),
        _ => op.name().to_string(),
    }
}

/// The op's attributes, HLO style: `, dims={0,1}`.
fn attributes(op: &Op) -> String {
    match op {
        Op::Constant(lit) => match lit {
            Literal::F32(a) if a.ndim() == 0 => {
                format!(", value={}", a.iter().next().copied().unwrap_or(0.0))
            }
            Literal::I32(a) if a.ndim() == 0 => {
                format!(", value={}", a.iter().next().copied().unwrap_or(0))
            }
            Literal::Bool(a) if a.ndim() == 0 => {
                format!(", value={}", a.iter().next().copied().unwrap_or(false))
            }
            _ => format!(
                ", value=<{} elements>",
                lit.shape().iter().product::<usize>()
            ),
        },
        Op::Iota { dim, .. } => format!(", iota_dim={dim}"),
        Op::RandomBits {
            strides, output, ..
        } => format!(", strides={{{}}}, output={output:?}", join(strides)),
        Op::Broadcast { dims, .. } => format!(", dims={{{}}}", join(dims)),
        Op::Transpose(perm) => format!(", permutation={{{}}}", join(perm)),
        Op::Reduce { dims, .. } => format!(", dims={{{}}}", join(dims)),
        Op::DotGeneral(d) => {
            let mut s = String::new();
            if !d.lhs_batch.is_empty() {
                s += &format!(
                    ", lhs_batch={{{}}}, rhs_batch={{{}}}",
                    join(&d.lhs_batch),
                    join(&d.rhs_batch)
                );
            }
            s + &format!(
                ", lhs_contracting={{{}}}, rhs_contracting={{{}}}",
                join(&d.lhs_contracting),
                join(&d.rhs_contracting)
            )
        }
        Op::Slice {
            start,
            limit,
            stride,
        } => {
            let parts: Vec<String> = (0..start.len())
                .map(|i| format!("[{}:{}:{}]", start[i], limit[i], stride[i]))
                .collect();
            format!(", slice={{{}}}", parts.join(","))
        }
        Op::Pad {
            low,
            high,
            interior,
        } => {
            let parts: Vec<String> = (0..low.len())
                .map(|i| format!("{}_{}_{}", low[i], high[i], interior[i]))
                .collect();
            format!(", padding={}", parts.join("x"))
        }
        Op::Concatenate(dim) => format!(", dim={dim}"),
        Op::ReduceWindow { window, .. } => format!(", window={}", window_text(window)),
        Op::Convolution(config) => convolution_attributes(config),
        Op::DynamicSlice(sizes) => format!(", sizes={{{}}}", join(sizes)),
        Op::DynamicUpdateSlice => String::new(),
        Op::Cumulative { dim, reverse, .. } => format!(", dim={dim}, reverse={reverse}"),
        Op::Argsort { dim, descending } => format!(", dim={dim}, descending={descending}"),
        Op::Reverse(dims) => format!(", dims={{{}}}", join(dims)),
        Op::Gather(d) => format!(
            ", offset_dims={{{}}}, collapsed_slice_dims={{{}}}, operand_batching_dims={{{}}}, start_indices_batching_dims={{{}}}, start_index_map={{{}}}, index_vector_dim={}, slice_sizes={{{}}}",
            join(&d.offset_dims),
            join(&d.collapsed_slice_dims),
            join(&d.operand_batching_dims),
            join(&d.start_indices_batching_dims),
            join(&d.start_index_map),
            d.index_vector_dim,
            join(&d.slice_sizes)
        ),
        Op::Scatter { dims: d, .. } => format!(
            ", update_window_dims={{{}}}, inserted_window_dims={{{}}}, input_batching_dims={{{}}}, scatter_indices_batching_dims={{{}}}, scatter_dims_to_operand_dims={{{}}}, index_vector_dim={}",
            join(&d.update_window_dims),
            join(&d.inserted_window_dims),
            join(&d.input_batching_dims),
            join(&d.scatter_indices_batching_dims),
            join(&d.scatter_dims_to_operand_dims),
            d.index_vector_dim
        ),
        Op::AxisIndex(group) => format!(", axes={group}"),
        Op::AllReduce { group, kind } => format!(", axes={group}, to_apply={}", reduce_name(*kind)),
        Op::AllGather { group, dim } => format!(", axes={group}, dim={dim}"),
        Op::ReduceScatter { group, kind, dim } => {
            format!(", axes={group}, dim={dim}, to_apply={}", reduce_name(*kind))
        }
        Op::AllToAll {
            group,
            split_dim,
            concat_dim,
        } => {
            format!(", axes={group}, split_dim={split_dim}, concat_dim={concat_dim}")
        }
        Op::CollectivePermute { group, from } => {
            format!(", axes={group}, from={{{}}}", from.join(","))
        }
        Op::CollectiveShift {
            group,
            offset,
            wrap,
            mirror,
        } => {
            let mirror = if *mirror { ", mirror=true" } else { "" };
            format!(", axes={group}, offset={offset}, wrap={wrap}{mirror}")
        }
        Op::Flow { flow, result } => match **flow {
            Flow::Scan {
                carried,
                stacked,
                length,
                reverse,
                remat,
                ..
            } => {
                // The default policy is left out (as the text was before policies).
                let remat = match remat {
                    Remat::NothingSaveable => String::new(),
                    remat => format!(", remat={remat}"),
                };
                format!(
                    ", result={result}, carried={carried}, stacked={stacked}, length={length}, \
                     reverse={reverse}{remat}"
                )
            }
            Flow::While { .. } | Flow::Cond { .. } => format!(", result={result}"),
            Flow::Manual { ref spec, .. } => {
                let specs = |s: &[crate::sharding::Sharding]| {
                    s.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let manual: Vec<&str> = spec.mesh.axis_names().collect();
                format!(
                    ", result={result}, manual={{{}}}, in_specs=[{}], out_specs=[{}]",
                    manual.join(","),
                    specs(&spec.in_specs),
                    specs(&spec.out_specs)
                )
            }
        },
        Op::Parameter { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert(_)
        | Op::Reshape(_)
        | Op::ShardingConstraint => String::new(),
        Op::PropagationBarrier(allowed) => format!(", allowed_direction={}", allowed.name()),
    }
}

/// XLA's window text: `{size=3x3 stride=1x1 pad=1_1x1_1}`, `lhs_dilate` and
/// `rhs_dilate` only when some dim is dilated.
fn window_text(w: &[WindowDim]) -> String {
    let each = |f: &dyn Fn(&WindowDim) -> String| -> String {
        w.iter().map(f).collect::<Vec<_>>().join("x")
    };
    let mut s = format!(
        "{{size={} stride={} pad={}",
        each(&|d| d.size.to_string()),
        each(&|d| d.stride.to_string()),
        each(&|d| format!("{}_{}", d.padding_low, d.padding_high))
    );
    if w.iter().any(|d| d.base_dilation != 1) {
        s += &format!(" lhs_dilate={}", each(&|d| d.base_dilation.to_string()));
    }
    if w.iter().any(|d| d.window_dilation != 1) {
        s += &format!(" rhs_dilate={}", each(&|d| d.window_dilation.to_string()));
    }
    s + "}"
}

/// XLA's form: `, window={size=3x3 stride=1x1 pad=1_1x1_1}, dim_labels=b01f_01io->b01f`,
/// then `feature_group_count` and `batch_group_count` where not 1.
fn convolution_attributes(config: &ConvConfig) -> String {
    let mut s = format!(
        ", window={}, dim_labels={}",
        window_text(&config.window),
        dim_labels(&config.dims)
    );
    if config.feature_group_count != 1 {
        s += &format!(", feature_group_count={}", config.feature_group_count);
    }
    if config.batch_group_count != 1 {
        s += &format!(", batch_group_count={}", config.batch_group_count);
    }
    s
}

/// `b01f_01io->b01f`: a letter per dim of input, kernel and output; spatial dims by
/// their number.
fn dim_labels(dn: &ConvDimensionNumbers) -> String {
    let labels = |(a, la): (usize, char), (b, lb): (usize, char), spatial: &[usize]| {
        // A malformed node (dims out of range) prints `?` rather than panicking.
        let mut l = vec!['?'; spatial.len() + 2];
        let named = spatial.iter().zip('0'..='9').chain([(&a, la), (&b, lb)]);
        for (&d, c) in named {
            if let Some(slot) = l.get_mut(d) {
                *slot = c;
            }
        }
        l.into_iter().collect::<String>()
    };
    format!(
        "{}_{}->{}",
        labels(
            (dn.input_batch, 'b'),
            (dn.input_feature, 'f'),
            &dn.input_spatial
        ),
        labels(
            (dn.kernel_input_feature, 'i'),
            (dn.kernel_output_feature, 'o'),
            &dn.kernel_spatial
        ),
        labels(
            (dn.output_batch, 'b'),
            (dn.output_feature, 'f'),
            &dn.output_spatial
        ),
    )
}

fn reduce_name(kind: ReduceKind) -> &'static str {
    match kind {
        ReduceKind::Sum => "sum",
        ReduceKind::Max => "max",
        ReduceKind::Min => "min",
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::{Builder, ConvDimensionNumbers, DType, Padding};

    /// The text of the last node of a program holding `conv` of an input and kernel.
    fn conv_text(input: &[usize], kernel: &[usize], labels: [&str; 3], dilated: bool) -> String {
        let b = Builder::new("p");
        let x = b.parameter("x", input.to_vec(), DType::F32);
        let k = b.parameter("k", kernel.to_vec(), DType::F32);
        let [i, kl, o] = labels;
        let dn = ConvDimensionNumbers::from_labels(i, kl, o).unwrap();
        let (lhs, rhs, groups): (&[usize], &[usize], usize) = if dilated {
            (&[1, 2], &[2, 1], 2)
        } else {
            (&[], &[], 1)
        };
        let y = x.conv_general_dilated(&k, &[1, 2], Padding::Same, lhs, rhs, &dn, groups);
        let p = b.finish(&[&y]).unwrap();
        let text = p.to_string();
        let line = text.lines().find(|l| l.contains("convolution")).unwrap();
        line.split("  //").next().unwrap().trim().to_string()
    }

    #[test]
    fn convolution_prints_window_and_dim_labels_as_xla() {
        assert_eq!(
            conv_text(
                &[8, 32, 32, 8],
                &[3, 3, 8, 16],
                ["NHWC", "HWIO", "NHWC"],
                false
            ),
            "%2 = convolution(%0, %1), window={size=3x3 stride=1x2 pad=1_1x0_1}, \
             dim_labels=b01f_01io->b01f : f32[8,32,16,16]"
        );
        assert_eq!(
            conv_text(&[8, 4, 6, 5], &[2, 2, 5, 2], ["NCHW", "OIHW", "NHWC"], true),
            "%2 = convolution(%0, %1), window={size=5x2 stride=1x2 pad=4_4x0_1 lhs_dilate=1x2 \
             rhs_dilate=2x1}, dim_labels=bf01_oi01->b01f, feature_group_count=2 : f32[8,6,5,2]"
        );
    }
}
