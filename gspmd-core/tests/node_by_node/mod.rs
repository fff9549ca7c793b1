//! The unfused, unplanned oracle of the runtime's plan tests: each node computed from
//! fresh arrays by the checked kernels.

use gspmd_core::ir::{Literal, Op, Program};
use gspmd_core::runtime::kernels;

/// The outputs of `program` on `inputs`, each node computed by [`kernels::eval`] from
/// the values of its operands (a fresh array per node, nothing in place or fused).
pub fn node_by_node(program: &Program, inputs: &[Literal]) -> Vec<Literal> {
    let mut values: Vec<Literal> = Vec::new();
    for node in &program.nodes {
        let value = match &node.op {
            Op::Parameter { index, .. } => inputs[*index].clone(),
            op => {
                let operands: Vec<&Literal> =
                    node.operands.iter().map(|o| &values[o.index()]).collect();
                kernels::eval(op, &operands, &node.ty).expect("kernel runs")
            }
        };
        values.push(value);
    }
    program
        .outputs
        .iter()
        .map(|o| values[o.index()].clone())
        .collect()
}
