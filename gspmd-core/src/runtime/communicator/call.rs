//! Where a device is at a rendezvous ([`Call`]), what it posts there ([`Post`]), and the
//! census that says where every device is when they disagree.

use std::fmt;
use std::sync::Arc;

use crate::error::{Census, CollectiveProblem};
use crate::ir::{Literal, ReduceKind};

/// Where a device is at a rendezvous; every device of a meeting must be at the same place.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Call {
    /// A collective over the group of `axes`.
    Collective { op: CollectiveOp, axes: Vec<String> },
    /// The end of the device's program (the thread mesh's last meeting of a run, of all
    /// devices).
    End,
    /// The process's own thread, ready to take its devices' next step (`uplink`).
    Process,
}

/// A collective and its attributes.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum CollectiveOp {
    AllReduce(ReduceKind),
    AllGather { dim: usize },
    ReduceScatter { kind: ReduceKind, dim: usize },
    AllToAll { split_dim: usize, concat_dim: usize },
    CollectivePermute { pairs: Vec<(usize, usize)> },
}

impl fmt::Display for Call {
    /// `all_reduce(sum) over [data, model]`, `the end of its program`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (op, axes) = match self {
            Call::Collective { op, axes } => (op, axes),
            Call::End => return f.write_str("the end of its program"),
            Call::Process => return f.write_str("its process's next step"),
        };
        let kind_name = |kind: &ReduceKind| format!("{kind:?}").to_lowercase();
        match op {
            CollectiveOp::AllReduce(kind) => write!(f, "all_reduce({})", kind_name(kind)),
            CollectiveOp::AllGather { dim } => write!(f, "all_gather(dim={dim})"),
            CollectiveOp::ReduceScatter { kind, dim } => {
                write!(f, "reduce_scatter({}, dim={dim})", kind_name(kind))
            }
            CollectiveOp::AllToAll {
                split_dim,
                concat_dim,
            } => write!(
                f,
                "all_to_all(split_dim={split_dim}, concat_dim={concat_dim})"
            ),
            CollectiveOp::CollectivePermute { pairs } => {
                write!(f, "collective_permute(pairs={pairs:?})")
            }
        }?;
        write!(f, " over [{}]", axes.join(", "))
    }
}

/// What one device contributes to one round of a rendezvous: where it is, and its
/// operand when its group needs it; `checked` if the others check that this operand has
/// the shape and dtype of theirs.
#[derive(Debug, Clone)]
pub(super) struct Post {
    pub(super) call: Arc<Call>,
    pub(super) checked: bool,
    pub(super) data: Option<Arc<Literal>>,
}

/// The posts of one completed round of a meeting, by slot (the meeting's devices in
/// increasing id order).
pub(super) type Round = Arc<Vec<Post>>;

/// Checks that every post of `round` (the posts of `devices`, in that order) is at
/// `call`; otherwise [`CollectiveProblem::Disagree`] with the census of where they are,
/// the same on every device. A post whose call is `call` itself (the meeting's shared
/// instance) is not compared.
pub(super) fn check_calls(
    round: &[Post],
    devices: &[usize],
    call: &Arc<Call>,
) -> Result<(), CollectiveProblem> {
    if (round.iter()).all(|p| Arc::ptr_eq(&p.call, call) || *p.call == **call) {
        return Ok(());
    }
    let places = devices.iter().zip(round).map(|(&d, p)| (d, &*p.call));
    let census = Census::of(places);
    Err(CollectiveProblem::Disagree { census })
}
