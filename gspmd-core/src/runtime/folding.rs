//! Constant folding at plan time: the values of a program that do not depend on its
//! inputs — an `iota`, and the elementwise and data-movement ops computed from iotas and
//! constants (a one-hot's index grid, a causal mask's `iota >= iota`, rotary positions
//! and their sines) — are computed once when the plan is made and bound as constants on
//! every run, instead of recomputed each step. XLA's `HloConstantFolding` does the same
//! at compile time, and likewise leaves large values alone: a folded value holds at most
//! [`MOST_FOLDED_BYTES`], and broadcasts are never folded (the loop reads a broadcast as
//! a view or in a fused loop's register; folded, it would be an array).
//!
//! The program is unchanged (the partitioner and the reference interpreter see the same
//! nodes): the plan marks a folded node, which reads nothing at run time; the values are
//! those of the same kernels on the same operands, so a run is bitwise what it was.

use crate::ir::{Literal, Op, Program};
use crate::runtime::kernels;

/// The most bytes one folded value may hold: the plan keeps it for as long as it lives.
pub(crate) const MOST_FOLDED_BYTES: usize = 64 << 10;

/// For each node of `program`, its value if the plan folds it (else `None`): a node
/// whose types were checked (`typed`) that is an `iota`, or a pure elementwise or
/// data-movement op (no broadcast) reading at least one folded value and otherwise
/// constants, folded values or broadcasts of them, whose value holds at most
/// [`MOST_FOLDED_BYTES`]. A node whose kernel fails is not folded (its run reports it).
pub(crate) fn folded_values(program: &Program, typed: &[bool]) -> Vec<Option<Literal>> {
    let nodes = &program.nodes;
    let mut folded: Vec<Option<Literal>> = vec![None; nodes.len()];
    // The broadcasts of known values, materialised only while folding their readers,
    // and whether each node's value comes from a folded one (directly or broadcast).
    let mut broadcasts: Vec<Option<Literal>> = vec![None; nodes.len()];
    let mut seeded = vec![false; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        if !typed.get(i).copied().unwrap_or(false) {
            continue;
        }
        let known = |k: usize| -> Option<&Literal> {
            match &nodes.get(k)?.op {
                Op::Constant(lit) => Some(lit),
                _ => folded[k].as_ref().or(broadcasts[k].as_ref()),
            }
        };
        let earlier = node.operands.iter().all(|o| o.index() < i);
        let operands: Option<Vec<&Literal>> = (node.operands.iter())
            .map(|o| earlier.then(|| known(o.index())).flatten())
            .collect();
        let Some(operands) = operands else {
            continue;
        };
        let from_fold = node.operands.iter().any(|o| seeded[o.index()]);
        if node.ty.size_in_bytes() > MOST_FOLDED_BYTES {
            continue;
        }
        let broadcast = match &node.op {
            Op::Broadcast { .. } => true,
            Op::Iota { .. } => false,
            op if from_fold && pure(op) => false,
            _ => continue,
        };
        let value = kernels::eval(&node.op, &operands, &node.ty).ok();
        seeded[i] = value.is_some() && (from_fold || matches!(node.op, Op::Iota { .. }));
        if broadcast {
            broadcasts[i] = value;
        } else {
            folded[i] = value;
        }
    }
    folded
}

/// Whether `op`'s value depends on its operands alone (and is not a broadcast, an
/// iota or a constant): the elementwise ops and the data movement a folded value may
/// pass through.
fn pure(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Slice { .. }
            | Op::Concatenate(_)
            | Op::Reverse(_)
            | Op::Reduce { .. }
            | Op::Cumulative { .. }
    )
}

#[cfg(test)]
mod tests {
    use crate::ir::{Builder, DType, Literal, Op};
    use crate::runtime::plan::Plan;
    use crate::runtime::{interpret, kernels};

    /// A causal mask's `iota >= iota`, converted and scaled, and a one-hot's compare of
    /// an iota with labels: the plan folds what depends on iotas and constants alone
    /// (not the broadcasts, not what reads a parameter, not an iota over 64 KiB), and a
    /// run gives bitwise what the kernels give node by node.
    #[test]
    fn values_computed_from_iotas_alone_are_folded() {
        let b = Builder::new("masks");
        let x = b.parameter("x", [16, 16], DType::F32);
        let labels = b.parameter("labels", [16], DType::I32);
        let rows = b.iota([16, 16], 0, DType::I32);
        let cols = b.iota([16, 16], 1, DType::I32);
        let mask = rows.ge(&cols).convert(DType::F32);
        let scaled = &mask * &mask.scalar_like(0.5);
        let masked = &x * &scaled;
        let classes = b.iota([16, 16], 1, DType::I32);
        let hot = classes
            .eq(&labels.broadcast_in_dim([16, 16], &[0]))
            .convert(DType::F32);
        let large = b.iota([128, 129], 1, DType::F32).sum(&[0, 1]);
        let program = b.finish(&[&masked, &hot, &large]).expect("traces");
        let plan = Plan::new(&program);
        let folded: Vec<&str> = (program.nodes.iter().zip(&plan.folded))
            .filter(|(_, f)| f.is_some())
            .map(|(n, _)| n.op.name())
            .collect();
        // rows, cols, their compare, its convert, its product with the broadcast 0.5;
        // the classes' iota.
        assert_eq!(
            folded,
            ["iota", "iota", "compare", "convert", "multiply", "iota"],
            "{program}"
        );
        for (node, value) in program.nodes.iter().zip(&plan.folded) {
            assert!(value.is_none() || !matches!(node.op, Op::Broadcast { .. }));
        }
        let inputs = [
            Literal::full(&[16, 16], DType::F32, 1.5),
            Literal::full(&[16], DType::I32, 3.0),
        ];
        let got = interpret(&program, &inputs).expect("runs");
        // Node by node through the checked kernels, nothing planned.
        let mut values: Vec<Literal> = Vec::new();
        for node in &program.nodes {
            values.push(match &node.op {
                Op::Parameter { index, .. } => inputs[*index].clone(),
                op => {
                    let operands: Vec<&Literal> =
                        node.operands.iter().map(|o| &values[o.index()]).collect();
                    kernels::eval(op, &operands, &node.ty).expect("kernel runs")
                }
            });
        }
        let want = program.outputs.iter().map(|o| &values[o.index()]);
        assert_eq!(got.len(), program.outputs.len());
        for (got, want) in got.iter().zip(want) {
            assert_eq!(got.bit_patterns(), want.bit_patterns());
        }
    }
}
