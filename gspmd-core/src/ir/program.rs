//! [`Program`]: an SSA list of [`Node`]s with parameters and outputs.

use super::op::Op;
use super::why::Why;
use crate::error::{Error, Result};
use crate::sharding::Sharding;
use crate::types::Location;
use crate::types::{TensorType, ValueId};

/// Where each dim's sharding of a value came from: the value whose user annotation
/// supplied the axes of that dim (`None` for a dim without axes). Filled by propagation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Origin {
    /// One entry per dim of the value.
    pub dims: Vec<Option<ValueId>>,
}

/// One SSA value: the result of `op` applied to `operands`.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The primitive op.
    pub op: Op,
    /// Operands; each defined earlier in the program.
    pub operands: Vec<ValueId>,
    /// Result type, as [`crate::ir::infer_type`] gives it.
    pub ty: TensorType,
    /// The user's sharding annotation. Closed dims are never changed by propagation;
    /// open dims (`?`) may be filled.
    pub annotation: Option<Sharding>,
    /// The complete sharding, set by propagation (`None` before it runs).
    pub sharding: Option<Sharding>,
    /// Where `sharding` came from, set by propagation.
    pub origin: Option<Origin>,
    /// A name for reports (parameter names, user-named values).
    pub name: Option<String>,
    /// Where the value was traced.
    pub location: Location,
    /// For a collective of a partitioned program: why it is there (several reasons
    /// when equal collectives were merged or combined into one); empty otherwise.
    pub why: Vec<Why>,
}

/// A program in SSA form: node `i` defines value `%i`. Parameters are the nodes whose op
/// is [`Op::Parameter`], listed in `params` by parameter index.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Program {
    /// Name for printing.
    pub name: String,
    /// All nodes in definition order.
    pub nodes: Vec<Node>,
    /// Parameter values, in parameter-index order.
    pub params: Vec<ValueId>,
    /// Returned values.
    pub outputs: Vec<ValueId>,
}

impl Program {
    /// An empty program.
    pub fn new(name: impl Into<String>) -> Self {
        Program {
            name: name.into(),
            ..Program::default()
        }
    }

    /// The node defining `v`. Panics if `v` is not of this program (a caller bug, not
    /// user input: ids only come from this program).
    pub fn node(&self, v: ValueId) -> &Node {
        &self.nodes[v.index()]
    }

    /// Mutable access to the node defining `v`.
    pub fn node_mut(&mut self, v: ValueId) -> &mut Node {
        &mut self.nodes[v.index()]
    }

    /// Type of `v`.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.node(v).ty
    }

    /// All value ids in definition order.
    pub fn values(&self) -> impl Iterator<Item = ValueId> + '_ {
        (0..self.nodes.len() as u32).map(ValueId)
    }

    /// Reorders the parameters: new parameter `i` is old parameter `order[i]` (`order` a
    /// permutation of the parameter indices). Nodes keep their ids.
    pub(crate) fn permute_params(&mut self, order: &[usize]) {
        let params: Vec<ValueId> = order.iter().map(|&i| self.params[i]).collect();
        for (index, &p) in params.iter().enumerate() {
            if let Op::Parameter { index: slot, .. } = &mut self.nodes[p.index()].op {
                *slot = index;
            }
        }
        self.params = params;
    }

    /// Appends a node and returns its value id. The caller guarantees operands exist and
    /// `ty` is right; [`crate::ir::verify`] checks both.
    #[doc(hidden)]
    pub fn push(&mut self, node: Node) -> ValueId {
        let id = ValueId(self.nodes.len() as u32);
        self.nodes.push(node);
        id
    }

    /// Appends `op(operands)` at `location`, typed by [`crate::ir::infer_type`], with no
    /// annotation or name. If the operands do not fit the op, nothing is appended and the
    /// error is an [`Error::Shape`] naming the op, `location`, what does not fit and the
    /// operands' types.
    pub fn push_op(&mut self, op: Op, operands: &[ValueId], location: Location) -> Result<ValueId> {
        let types: Vec<&TensorType> = operands.iter().map(|&o| self.ty(o)).collect();
        let ty = super::infer::infer_type(&op, &types).map_err(|message| {
            let shapes: Vec<String> = types.iter().map(ToString::to_string).collect();
            let message = if shapes.is_empty() || message.contains(&shapes[0]) {
                message
            } else {
                format!("{message} (operands {})", shapes.join(", "))
            };
            Error::Shape {
                op: op.name(),
                location,
                message,
            }
        })?;
        Ok(self.push(Node {
            op,
            operands: operands.to_vec(),
            ty,
            annotation: None,
            sharding: None,
            origin: None,
            name: None,
            location,
            why: Vec::new(),
        }))
    }

    /// Routes output `j` through a new `sharding_constraint` to `sharding` (its
    /// annotation; also its complete sharding when `complete`, for a program already
    /// propagated), located at the output's node; returns the new output.
    pub fn constrain_output(&mut self, j: usize, sharding: Sharding, complete: bool) -> ValueId {
        let o = self.outputs[j];
        let source = self.node(o);
        let constraint = Node {
            op: Op::ShardingConstraint,
            operands: vec![o],
            ty: source.ty.clone(),
            sharding: complete.then(|| sharding.clone()),
            annotation: Some(sharding),
            origin: None,
            name: None,
            location: source.location,
            why: Vec::new(),
        };
        self.outputs[j] = self.push(constraint);
        self.outputs[j]
    }

    /// For each value, the values that use it as an operand (in program order).
    pub fn users(&self) -> Vec<Vec<ValueId>> {
        let mut users = vec![Vec::new(); self.nodes.len()];
        for v in self.values() {
            for &o in &self.node(v).operands {
                if users[o.index()].last() != Some(&v) {
                    users[o.index()].push(v);
                }
            }
        }
        users
    }
}
