//! "Why is %12 sharded like this": the origin of each dim of a propagated value.

use crate::ir::{Program, Source, ValueId};

/// Explains the sharding of `value` in a program returned by
/// [`crate::propagation::propagate`]: per dim, its axes and the annotated value they
/// come from, with that value's name and source line.
///
/// ```text
/// %2 = dot_general : f32[8,32] sharding=(data, model)
///   dim 0 (8): data, from the annotation of %0 "x" at src/main.rs:9
///   dim 1 (32): model, from the annotation of %1 "w1" at src/main.rs:10
/// ```
pub fn explain(program: &Program, value: ValueId) -> String {
    let Some(node) = program.nodes.get(value.index()) else {
        return format!("{value} is not a value of program {}", program.name);
    };
    let Some(sharding) = &node.sharding else {
        return format!("{value} has no sharding yet: run propagation first");
    };
    let sources = Source::of(program, value);
    let mut text = format!(
        "{value} = {} : {} sharding={sharding}",
        node.op.name(),
        node.ty
    );
    for (d, dim) in sharding.dims.iter().enumerate() {
        let size = node.ty.shape.get(d).copied().unwrap_or(0);
        text += &format!("\n  dim {d} ({size}): ");
        if dim.axes.is_empty() {
            text += "not split";
            continue;
        }
        text += &dim.axes.join(", ");
        match sources.iter().find(|s| s.dim == d) {
            Some(s) if s.value == value => text += ", from its own annotation",
            Some(s) => {
                text += &format!(", from the annotation of {}", s.value);
                if let Some(name) = &s.name {
                    text += &format!(" \"{name}\"");
                }
                text += &format!(" at {}", s.location);
            }
            None => text += ", origin unknown",
        }
    }
    text
}
