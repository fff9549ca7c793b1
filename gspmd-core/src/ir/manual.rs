//! Manual sharding: a `shard_map` region ([`Flow::Manual`], JAX's `shard_map`, Shardy's
//! `sdy.manual_computation`, the GSPMD paper's partially manual sharding, section 3.6).
//!
//! The body is a per-device program: it sees the blocks of its operands cut along the
//! *manual* mesh axes as the in-specs say, may call collectives over those axes
//! ([`Tensor::psum`], [`Tensor::all_gather`], [`Tensor::psum_scatter`],
//! [`Tensor::all_to_all`], [`Tensor::ppermute`], [`Builder::axis_index`]), and returns
//! blocks that the out-specs assemble into the results. Mesh axes that are not manual
//! stay automatic, around the region and inside it: an operand keeps the automatic
//! axes propagation gives it (minor to the spec's manual axes in each dim), the body is
//! propagated and partitioned over them like any program, and annotations inside the
//! body may name them. See ARCHITECTURE.md, "Manual regions".

use super::builder::{Builder, Tensor, any_poisoned, close_region, manual_scope, mark_manual};
use super::builder::{push, region_builder};
use super::flow::{Flow, check_params, outputs};
use super::op::{AxisGroup, Op, ReduceKind};
use super::program::Program;
use crate::error::Error;
use crate::sharding::{DimSharding, Mesh, Sharding};
use crate::types::{Location, TensorType};

/// The attributes of a manual region: its manual axes and how its operands and results
/// are cut into the body's blocks. Each spec names, per dim, manual axes only (major to
/// minor); a dim split over axes of product `k` must be a multiple of `k` (blocks are
/// even, as JAX's `shard_map` requires).
#[derive(Debug, Clone, PartialEq)]
pub struct ManualSpec {
    /// The manual axes with their sizes, in the enclosing mesh's order: the body's
    /// collectives name them and the reference interpreter runs one body per device of
    /// this mesh.
    pub mesh: Mesh,
    /// Per operand (the captured values last, replicated), how it is cut into blocks.
    pub in_specs: Vec<Sharding>,
    /// Per result, how the body's output blocks assemble into it.
    pub out_specs: Vec<Sharding>,
}

impl ManualSpec {
    /// The body's block of a global value of type `ty` cut by `spec`, or why `spec`
    /// does not fit it (rank, an axis that is not manual, a dim its axes do not divide).
    pub fn block(&self, spec: &Sharding, ty: &TensorType) -> Result<TensorType, String> {
        self.check(spec, ty.rank())?;
        let mut shape = ty.shape.clone();
        for (d, (size, dim)) in shape.iter_mut().zip(&spec.dims).enumerate() {
            let k = self.mesh.axes_size(&dim.axes);
            if *size % k != 0 {
                return Err(format!(
                    "dim {d} of {ty} ({size}) is not divisible by the {k} devices of {dim}"
                ));
            }
            *size /= k;
        }
        Ok(TensorType::new(shape, ty.dtype))
    }

    /// The global value assembled from blocks of type `block` by `spec`.
    pub fn global(&self, spec: &Sharding, block: &TensorType) -> Result<TensorType, String> {
        self.check(spec, block.rank())?;
        let mut shape = block.shape.clone();
        for (size, dim) in shape.iter_mut().zip(&spec.dims) {
            let k = self.mesh.axes_size(&dim.axes);
            *size = size
                .checked_mul(k)
                .ok_or_else(|| format!("{block} assembled by {spec} overflows"))?;
        }
        let global = TensorType::new(shape, block.dtype);
        global.check_size()?;
        Ok(global)
    }

    /// Checks that `spec` has `rank` dims and names distinct manual axes only.
    fn check(&self, spec: &Sharding, rank: usize) -> Result<(), String> {
        let manual: Vec<&str> = self.mesh.axis_names().collect();
        if let Some(a) = (spec
            .axes()
            .chain(spec.replicated.iter().map(String::as_str)))
        .chain(spec.unreduced.iter().map(String::as_str))
        .find(|a| !manual.contains(a))
        {
            return Err(format!(
                "spec {spec} names `{a}`, which is not a manual axis (manual: {})",
                manual.join(", ")
            ));
        }
        if !spec.replicated.is_empty() || !spec.unreduced.is_empty() {
            return Err(format!("spec {spec} may only list manual axes per dim"));
        }
        spec.validate(&self.mesh, rank, "")
            .map_err(|e| e.to_string())
    }

    /// The manual axes `spec` names nowhere, in the mesh's order: every device along
    /// them holds the same block.
    pub fn unnamed_axes(&self, spec: &Sharding) -> Vec<String> {
        let named: Vec<&str> = spec.axes().collect();
        (self.mesh.axis_names())
            .filter(|a| !named.contains(a))
            .map(ToString::to_string)
            .collect()
    }

    /// The annotation of an operand or result cut by `spec`: its manual axes per dim,
    /// open (propagation may add automatic axes after them), and the manual axes it
    /// does not name explicitly replicated (propagation may not add them).
    pub fn annotation(&self, spec: &Sharding) -> Sharding {
        Sharding {
            dims: (spec.dims.iter())
                .map(|d| DimSharding::open(d.axes.clone()))
                .collect(),
            replicated: self.unnamed_axes(spec),
            unreduced: Vec::new(),
        }
    }

    /// The automatic part of `outside`, a sharding of an operand or result on `mesh`,
    /// for its blocks of shape `block` inside the body (closed): per dim its axes that
    /// are not manual, as many as split the block dim evenly. Only an even split of a
    /// block is the same tiling as the whole value's split over the manual axes then
    /// these ([`ManualSpec::around`]); the partitioner reshards across the rest.
    pub fn inside(&self, outside: &Sharding, block: &[usize], mesh: &Mesh) -> Sharding {
        let manual: Vec<&str> = self.mesh.axis_names().collect();
        let dims = outside.dims.iter().zip(block).map(|(d, &size)| {
            let mut kept: Vec<String> = Vec::new();
            for a in d.axes.iter().filter(|a| !manual.contains(&a.as_str())) {
                kept.push(a.clone());
                if !size.is_multiple_of(mesh.axes_size(&kept)) {
                    kept.pop();
                    break;
                }
            }
            DimSharding::closed(kept)
        });
        Sharding::new(dims)
    }

    /// The sharding on the whole mesh of a value cut by `spec` whose blocks are sharded
    /// `inside` over automatic axes: per dim the spec's manual axes, then `inside`'s
    /// (closed; the region's boundary).
    pub fn around(spec: &Sharding, inside: &Sharding) -> Sharding {
        let dims = spec.dims.iter().enumerate().map(|(d, dim)| {
            let auto = inside
                .dims
                .get(d)
                .map(|i| i.axes.clone())
                .unwrap_or_default();
            DimSharding::closed(dim.axes.iter().cloned().chain(auto))
        });
        Sharding::new(dims)
    }

    /// The result types of a manual region with body `body` on operands of types
    /// `operands`, or a message naming what does not fit.
    pub(super) fn result_types(
        &self,
        body: &Program,
        operands: &[&TensorType],
    ) -> Result<Vec<TensorType>, String> {
        if operands.len() != self.in_specs.len() {
            return Err(format!(
                "shard_map has {} in-specs but {} operands",
                self.in_specs.len(),
                operands.len()
            ));
        }
        let blocks = (operands.iter().zip(&self.in_specs))
            .map(|(t, s)| self.block(s, t))
            .collect::<Result<Vec<_>, _>>()?;
        check_params("body", body, &blocks.iter().collect::<Vec<_>>())?;
        let outs = outputs(body);
        if outs.len() != self.out_specs.len() {
            return Err(format!(
                "the body returns {} blocks but {} out-specs were given",
                outs.len(),
                self.out_specs.len()
            ));
        }
        (outs.iter().zip(&self.out_specs))
            .enumerate()
            .map(|(i, (t, s))| {
                (self.global(s, t)).map_err(|e| format!("result {i}: the body returns {t}: {e}"))
            })
            .collect()
    }
}

impl Builder {
    /// `shard_map(mesh, manual_axes, inputs, in_specs, out_specs, body)`: a manual region.
    /// `body` gets this region's builder and the per-device blocks of `inputs` (each
    /// cut along the manual axes as its in-spec says) and returns per-device blocks,
    /// which the out-specs assemble into the results. Inside, collectives over the
    /// manual axes ([`Tensor::psum`], ...) talk to the other devices' bodies. Values of
    /// the enclosing program used inside are passed whole (replicated) to every body.
    /// Mesh axes not in `manual_axes` stay automatic around the region and inside it:
    /// they shard the body's values as propagation decides (an operand's automatic axes
    /// come in with it; annotations in the body may name automatic axes).
    ///
    /// Errors ([`Error::Manual`] at the caller's line): a manual axis that is not a mesh
    /// axis; as many specs as inputs and results expected; a spec naming an axis that
    /// is not manual; a dim not divisible by its axes' devices; a body result whose rank
    /// does not fit its out-spec; a sharding annotation inside the body naming a
    /// manual axis; a `shard_map` inside a body.
    #[track_caller]
    pub fn shard_map(
        &self,
        mesh: &Mesh,
        manual_axes: &[&str],
        inputs: &[Tensor],
        in_specs: &[Sharding],
        out_specs: &[Sharding],
        body: impl FnOnce(&Builder, &[Tensor]) -> Vec<Tensor>,
    ) -> Vec<Tensor> {
        let location = Location::caller();
        let poisoned = || {
            let ty = TensorType::new(vec![], crate::types::DType::F32);
            out_specs
                .iter()
                .map(|_| self.poisoned(ty.clone()))
                .collect()
        };
        let fail = |message: String| -> Vec<Tensor> {
            self.record_error(Error::Manual {
                op: "shard_map",
                location,
                message,
            });
            poisoned()
        };
        let refs: Vec<&Tensor> = inputs.iter().collect();
        if any_poisoned(&refs) {
            return poisoned();
        }
        if manual_scope(self) != Err(false) {
            return fail("a shard_map inside a shard_map body is not supported".into());
        }
        let spec = match manual_mesh(mesh, manual_axes) {
            Ok(m) => ManualSpec {
                mesh: m,
                in_specs: in_specs.to_vec(),
                out_specs: out_specs.to_vec(),
            },
            Err(message) => return fail(message),
        };
        if in_specs.len() != inputs.len() {
            return fail(format!(
                "{} inputs but {} in-specs",
                inputs.len(),
                in_specs.len()
            ));
        }
        let mut blocks = Vec::with_capacity(inputs.len());
        for (i, (x, s)) in inputs.iter().zip(in_specs).enumerate() {
            match spec.block(s, x.ty()) {
                Ok(t) => blocks.push(t),
                Err(e) => return fail(format!("input {i}: {e}")),
            }
        }
        if let Some((i, e)) = (out_specs.iter().enumerate())
            .find_map(|(i, s)| spec.check(s, s.dims.len()).err().map(|e| (i, e)))
        {
            return fail(format!("out-spec {i}: {e}"));
        }
        let pinned: Vec<Tensor> = (inputs.iter().zip(in_specs))
            .map(|(x, s)| x.shard(spec.annotation(s)))
            .collect();
        let b = region_builder(self, "shard_map");
        mark_manual(&b, spec.mesh.clone());
        let params: Vec<Tensor> = (blocks.into_iter().enumerate())
            .map(|(i, t)| b.parameter_at(&format!("block.{i}"), t, location))
            .collect();
        let outs = body(&b, &params);
        let Some((program, captures)) = close_region(&b, &outs, location, false) else {
            return poisoned();
        };
        let manual: Vec<&str> = spec.mesh.axis_names().collect();
        let names_manual = |s: &Sharding| -> Option<String> {
            (s.axes().chain(s.replicated.iter().map(String::as_str)))
                .chain(s.unreduced.iter().map(String::as_str))
                .find(|a| manual.iter().any(|m| a.split(':').next() == Some(*m)))
                .map(ToString::to_string)
        };
        let annotated = program
            .nodes
            .iter()
            .filter_map(|n| Some((n, n.annotation.as_ref()?)));
        if let Some((n, a)) = annotated
            .filter_map(|(n, s)| Some((n, names_manual(s)?)))
            .next()
        {
            return fail(format!(
                "a sharding annotation inside the body (traced at {}) names manual axis \
                 `{a}`: inside a manual region only automatic axes shard values",
                n.location
            ));
        }
        let mut spec = spec;
        let captured = captures.iter().map(|(_, t)| Sharding::replicated(t.rank()));
        spec.in_specs.extend(captured);
        let operand_types: Vec<&TensorType> = (inputs.iter().map(Tensor::ty))
            .chain(captures.iter().map(|(_, t)| t))
            .collect();
        let types = match spec.result_types(&program, &operand_types) {
            Ok(types) => types,
            Err(message) => return fail(message),
        };
        let annotations: Vec<Sharding> = out_specs.iter().map(|s| spec.annotation(s)).collect();
        let flow = Flow::Manual {
            body: program,
            spec,
        };
        let captured = captures.into_iter().map(|(outer, _)| outer).collect();
        let operands: Vec<&Tensor> = pinned.iter().collect();
        let results = self.flow_results(Some((flow, captured)), &operands, types, location);
        (results.iter().zip(annotations))
            .map(|(r, s)| r.shard(s))
            .collect()
    }

    /// `jax.lax.axis_index`: this device's index (i32 scalar) in the group spanned by
    /// `axes` (major to minor), inside a `shard_map` body. Errors ([`Error::Manual`]):
    /// outside a body, or an axis that is not manual.
    #[track_caller]
    pub fn axis_index(&self, axes: &[&str]) -> Tensor {
        let location = Location::caller();
        let ty = TensorType::new(vec![], crate::types::DType::I32);
        match group(manual_scope(self), "axis_index", axes, location) {
            Ok(group) => match self.push_ids(Op::AxisIndex(group), &[], location) {
                Some(id) => self.handle(id),
                None => self.poisoned(ty),
            },
            Err(e) => {
                self.record_error(e);
                self.poisoned(ty)
            }
        }
    }
}

impl Tensor {
    /// `jax.lax.psum`: the sum of this block over the devices of `axes` (manual axes
    /// of the enclosing `shard_map` body), on each of them.
    #[track_caller]
    pub fn psum(&self, axes: &[&str]) -> Tensor {
        self.collective("psum", axes, |group| Op::AllReduce {
            group,
            kind: ReduceKind::Sum,
        })
    }

    /// `jax.lax.all_gather(x, axes, axis=dim, tiled=True)`: the blocks of the devices
    /// of `axes` concatenated along `dim`, in group order.
    #[track_caller]
    pub fn all_gather(&self, axes: &[&str], dim: usize) -> Tensor {
        self.collective("all_gather", axes, |group| Op::AllGather { group, dim })
    }

    /// `jax.lax.psum_scatter(x, axes, scatter_dimension=dim, tiled=True)`: the sum over
    /// the devices of `axes`, member `i` keeping the `i`-th block along `dim`.
    #[track_caller]
    pub fn psum_scatter(&self, axes: &[&str], dim: usize) -> Tensor {
        self.collective("psum_scatter", axes, |group| Op::ReduceScatter {
            group,
            kind: ReduceKind::Sum,
            dim,
        })
    }

    /// `jax.lax.all_to_all(x, axes, split_axis, concat_axis, tiled=True)`: block `j`
    /// along `split_dim` goes to member `j`; the received blocks are concatenated along
    /// `concat_dim` in sender order.
    #[track_caller]
    pub fn all_to_all(&self, axes: &[&str], split_dim: usize, concat_dim: usize) -> Tensor {
        self.collective("all_to_all", axes, |group| Op::AllToAll {
            group,
            split_dim,
            concat_dim,
        })
    }

    /// `jax.lax.ppermute` with the cyclic permutation `i -> (i + shift) mod n` over the
    /// group of `axes` (`n` devices): each member receives the block of member
    /// `i - shift` (a ring step: `shift` 1 passes every block to the next device).
    #[track_caller]
    pub fn ppermute(&self, axes: &[&str], shift: i64) -> Tensor {
        self.collective("ppermute", axes, |group| Op::CollectiveShift {
            group,
            offset: shift,
            wrap: true,
            mirror: false,
        })
    }

    /// The collective `make(group)` on this value over `axes`, checked against the
    /// enclosing `shard_map` body's manual axes.
    #[track_caller]
    fn collective(
        &self,
        name: &'static str,
        axes: &[&str],
        make: impl FnOnce(AxisGroup) -> Op,
    ) -> Tensor {
        let location = Location::caller();
        if any_poisoned(&[self]) {
            return self.clone();
        }
        let b = self.builder();
        match group(manual_scope(&b), name, axes, location) {
            Ok(group) => push(self, make(group), &[], location),
            Err(e) => {
                b.record_error(e);
                b.poisoned(self.ty().clone())
            }
        }
    }
}

/// The dims a collective gathers, scatters or exchanges (none for the others): each
/// device's piece of them must be the whole block dim, so a manual body keeps them
/// unsplit over automatic axes (propagation's factor rule, the partitioner's handler).
pub fn moved_dims(op: &Op) -> Vec<usize> {
    match op {
        Op::AllGather { dim, .. } | Op::ReduceScatter { dim, .. } => vec![*dim],
        Op::AllToAll {
            split_dim,
            concat_dim,
            ..
        } => vec![*split_dim, *concat_dim],
        _ => Vec::new(),
    }
}

/// The mesh of `mesh`'s axes named in `manual` (in `mesh`'s order), or why not.
fn manual_mesh(mesh: &Mesh, manual: &[&str]) -> Result<Mesh, String> {
    if manual.is_empty() {
        return Err("no manual axes".into());
    }
    for (i, a) in manual.iter().enumerate() {
        if mesh.axis_size(a).is_none() || a.contains(':') {
            return Err(format!(
                "manual axis `{a}` is not an axis of the mesh ({})",
                mesh.axis_list()
            ));
        }
        if manual[..i].contains(a) {
            return Err(format!("manual axis `{a}` is listed twice"));
        }
    }
    let axes = (mesh.axes().iter()).filter(|(name, _)| manual.contains(&name.as_str()));
    Mesh::new(axes.cloned()).map_err(|e| e.to_string())
}

/// The group of `axes` for the collective `op`, given the manual scope of the builder
/// it is traced in ([`manual_scope`]).
fn group(
    scope: Result<Mesh, bool>,
    op: &'static str,
    axes: &[&str],
    location: Location,
) -> Result<AxisGroup, Error> {
    let error = |message: String| Error::Manual {
        op,
        location,
        message,
    };
    let manual = match scope {
        Ok(m) => m,
        Err(false) => {
            return Err(error(format!(
                "{op} is only defined on values traced inside a shard_map body (a value \
                 from outside is an input of the region)"
            )));
        }
        Err(true) => {
            return Err(error(format!(
                "{op} inside control flow within a shard_map body is not supported \
                 (unroll the loop in Rust)"
            )));
        }
    };
    if axes.is_empty() {
        return Err(error("no axes given".into()));
    }
    for (i, a) in axes.iter().enumerate() {
        if manual.axis_size(a).is_none() || a.contains(':') {
            let names: Vec<&str> = manual.axis_names().collect();
            return Err(error(format!(
                "axis `{a}` is not a manual axis of this shard_map (manual: {})",
                names.join(", ")
            )));
        }
        if axes[..i].contains(a) {
            return Err(error(format!("axis `{a}` is listed twice")));
        }
    }
    Ok(AxisGroup {
        axes: axes.iter().map(ToString::to_string).collect(),
        size: manual.axes_size(axes),
    })
}
