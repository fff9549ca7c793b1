//! [`Communicator`]: the collectives a per-device program calls, and their
//! shared-memory implementation for devices that are threads of one process.
//!
//! A collective acts over the *group* given by a list of mesh axes: the devices that
//! share coordinates on every other axis. Group members are ordered by the mixed-radix
//! index of their coordinates along the listed axes, first listed axis major — the
//! convention shard indices use ([`Mesh::group_index`]). An empty list makes every
//! device a group of one.
//!
//! Submodules: `call` (where a device is at a meeting, what it posts, the census when
//! devices disagree), `group` (a collective's members), `rendezvous` (the meetings of
//! each group's devices, and the mesh-wide abort, timeout and runs), `shared_memory`
//! (the collectives over shared buffers), `uplink` (the steps that devices sharing a
//! process hand to its thread when a mesh spans processes), `combine` (the element
//! types, their combine functions, the reduction order and the argument checks, shared
//! by the backends so results are equal bit for bit) and, with the `mpi` feature, `mpi`
//! (the collectives over MPI) and `hierarchical` (a process's steps over MPI).

mod call;
mod combine;
mod group;
#[cfg(feature = "mpi")]
mod hierarchical;
#[cfg(feature = "mpi")]
mod mpi;
mod rendezvous;
mod shared_memory;
mod uplink;

#[cfg(feature = "mpi")]
pub(crate) use hierarchical::{Hierarchy, RankSteps};
#[cfg(feature = "mpi")]
pub(crate) use mpi::MpiCommunicator;
pub(crate) use rendezvous::Rendezvous;
pub(crate) use shared_memory::{SharedMemoryCommunicator, reduction_scratch_bytes};
pub(crate) use uplink::{Process, Uplink};

use crate::error::{Error, Result};
use crate::ir::{Literal, ReduceKind};
use crate::sharding::Mesh;

/// One device's handle on the collectives of its mesh (MPI's communicator).
///
/// Contract for every collective: all devices of the mesh call the same collectives in
/// the same order with the same arguments (SPMD), and the members of each group pass
/// operands of one shape and dtype. A broken contract, or any other failure inside a
/// collective, is an error on the devices concerned and aborts the communicator, so no
/// device is left waiting. Operands are taken by value so their buffers can be shared
/// with the group without a copy.
pub trait Communicator {
    /// This device's id.
    fn device(&self) -> usize;

    /// The mesh the devices form.
    fn mesh(&self) -> &Mesh;

    /// Every group member gets the elementwise `kind` reduction of the members' `x`.
    fn all_reduce(&self, axes: &[String], kind: ReduceKind, x: Literal) -> Result<Literal>;

    /// Every group member gets the members' `x` concatenated along `dim`, in group order.
    fn all_gather(&self, axes: &[String], dim: usize, x: Literal) -> Result<Literal>;

    /// The member at group index `i` gets block `i` along `dim` of the elementwise `kind`
    /// reduction of the members' `x`; `x`'s `dim` must be divisible by the group size.
    fn reduce_scatter(
        &self,
        axes: &[String],
        kind: ReduceKind,
        dim: usize,
        x: Literal,
    ) -> Result<Literal>;

    /// Every member splits `x` along `split_dim` into group-size blocks and sends block
    /// `j` to member `j`; the blocks received are concatenated along `concat_dim` in
    /// sender order. `x`'s `split_dim` must be divisible by the group size.
    fn all_to_all(
        &self,
        axes: &[String],
        split_dim: usize,
        concat_dim: usize,
        x: Literal,
    ) -> Result<Literal>;

    /// For each `(source, target)` pair of group indices, `target` gets `source`'s `x`;
    /// a member that is no target gets zeros (`false`) of `x`'s shape. Sources are
    /// distinct, and so are targets.
    fn collective_permute(
        &self,
        axes: &[String],
        pairs: &[(usize, usize)],
        x: Literal,
    ) -> Result<Literal>;

    /// Releases every device waiting in a collective, and fails every later one, with
    /// [`Error::Aborted`] carrying `error`. Only the first abort's error is kept.
    fn abort(&self, error: Error);
}
