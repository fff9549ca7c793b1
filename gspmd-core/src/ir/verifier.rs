//! The verifier: checks a [`Program`]'s invariants and reports every violation at once.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::flow::distinct_flows;
use super::infer::infer_type;
use super::op::Op;
use super::program::Program;
use crate::error::{Error, Result};
use crate::types::TensorType;

/// Checks that `program` is well formed:
/// - operands are defined before use (SSA order);
/// - each node's type is what [`infer_type`] gives for its op and operands;
/// - `params[i]` is the parameter node with index `i`, and every parameter is listed;
/// - no two parameters have the same name ([`Error::DuplicateName`]);
/// - annotations have the value's rank and use no axis twice;
///   `sharding_constraint` nodes carry an annotation;
/// - outputs are defined values;
/// - the regions of control-flow ops are well formed (recursively); their signatures
///   fit the operands (the op's shape rule checks that).
///
/// Returns all violations together ([`Error::Many`] when several).
pub fn verify(program: &Program) -> Result<()> {
    let mut errors = Vec::new();
    let mut sharding_errors = Vec::new();
    let n = program.nodes.len();
    for v in program.values() {
        let node = program.node(v);
        let mut fail = |message: String| {
            errors.push(Error::Verify {
                value: v,
                location: node.location,
                message,
            });
        };
        if let Some(bad) = node.operands.iter().find(|o| o.index() >= v.index()) {
            fail(format!("operand {bad} is not defined before use"));
            continue;
        }
        let types: Vec<&TensorType> = node.operands.iter().map(|&o| program.ty(o)).collect();
        match infer_type(&node.op, &types) {
            Ok(ty) if ty == node.ty => {}
            Ok(ty) => fail(format!(
                "{} has type {} but its operands give {ty}",
                node.op.name(),
                node.ty
            )),
            Err(message) => fail(format!("{}: {message}", node.op.name())),
        }
        if let Op::Parameter { index, .. } = node.op
            && program.params.get(index) != Some(&v)
        {
            fail(format!(
                "parameter {index} is not listed at position {index} of the parameters"
            ));
        }
        match &node.annotation {
            Some(s) => {
                // Sharding faults get the sharding error variants (reported after the
                // structural errors).
                let context = format!("{}: {v}: ", node.location);
                if s.dims.len() != node.ty.rank() {
                    sharding_errors.push(Error::ShardingRank {
                        sharding: s.to_string(),
                        spec_rank: s.dims.len(),
                        rank: node.ty.rank(),
                        context: context.clone(),
                    });
                }
                if let Some(axis) = s.repeated_axis() {
                    sharding_errors.push(Error::DuplicateAxis {
                        axis: axis.to_string(),
                        sharding: s.to_string(),
                        context,
                    });
                }
            }
            None if node.op == Op::ShardingConstraint => {
                fail("sharding_constraint without a sharding".into())
            }
            None => {}
        }
        if let Some(s) = &node.sharding
            && s.dims.len() != node.ty.rank()
        {
            fail(format!(
                "sharding {s} has {} dims but the value has rank {}",
                s.dims.len(),
                node.ty.rank()
            ));
        }
    }
    for (i, &p) in program.params.iter().enumerate() {
        if p.index() >= n
            || !matches!(program.node(p).op, Op::Parameter { index, .. } if index == i)
        {
            errors.push(Error::Verify {
                value: p,
                location: super::Location::synthetic(),
                message: format!("params[{i}] is not parameter {i}"),
            });
        }
    }
    let mut first_of = HashMap::new();
    for node in program
        .params
        .iter()
        .filter(|p| p.index() < n)
        .map(|&p| program.node(p))
    {
        let Some(name) = node.name.as_deref() else {
            continue;
        };
        match first_of.entry(name) {
            Entry::Occupied(first) => errors.push(Error::DuplicateName {
                name: name.to_string(),
                first: *first.get(),
                second: node.location,
            }),
            Entry::Vacant(slot) => {
                slot.insert(node.location);
            }
        }
    }
    for &o in &program.outputs {
        if o.index() >= n {
            errors.push(Error::Verify {
                value: o,
                location: super::Location::synthetic(),
                message: "output is not a value of the program".into(),
            });
        }
    }
    for (_, flow) in distinct_flows(program) {
        for region in flow.regions() {
            match verify(region) {
                Ok(()) => {}
                Err(Error::Many(list)) => errors.extend(list),
                Err(e) => errors.push(e),
            }
        }
    }
    errors.append(&mut sharding_errors);
    Error::from_list(errors)
}
