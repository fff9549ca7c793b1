//! Dead-code elimination (XLA's `HloDCE`): nodes no output depends on are removed.

use super::{Fate, rebuild};
use crate::ir::Program;

/// `program` without the nodes that no output depends on. Parameters are the program's
/// interface and are always kept, so parameter `i` stays `params[i]`.
///
/// No op has an effect beyond its result. The collectives of a per-device program
/// communicate, but every device runs the same program, so removing an unused
/// collective removes it on every device and the others still meet in order.
pub(crate) fn eliminate_dead_code(program: &Program) -> Program {
    let mut live = vec![false; program.nodes.len()];
    for &v in program.outputs.iter().chain(&program.params) {
        live[v.index()] = true;
    }
    // Operands come before their users: one backward sweep marks everything live.
    for (index, node) in program.nodes.iter().enumerate().rev() {
        if live[index] {
            for &o in &node.operands {
                live[o.index()] = true;
            }
        }
    }
    let fate: Vec<Fate> = live
        .iter()
        .map(|&l| if l { Fate::Keep } else { Fate::Drop })
        .collect();
    rebuild(program, &fate)
}
