//! Export to StableHLO with Shardy's `sdy` dialect: MLIR text that XLA (through JAX,
//! PJRT or IREE) compiles for accelerators.
//!
//! Two forms, both a `module` with an `sdy.mesh @mesh` of the mesh's named axes and a
//! `func.func public @main` taking and returning global arrays, each argument and
//! result with its `#sdy.sharding`:
//!
//! - **global** ([`Program::to_stablehlo`] for a traced program, its annotations kept
//!   with open dims and priorities; [`Executable::to_stablehlo_global`] for the
//!   propagated one, every value's complete sharding): the program as written, its
//!   shardings as `sdy.sharding_constraint`s, for XLA to propagate and partition itself;
//! - **per device** ([`Executable::to_stablehlo`]): gspmd's partitioned program inside
//!   one `sdy.manual_computation` over every mesh axis, its collectives as
//!   `stablehlo.all_reduce`, `all_gather`, `reduce_scatter`, `all_to_all` and
//!   `collective_permute` with their device lists computed from the mesh and a
//!   channel each, `axis_index` as a table lookup of `stablehlo.partition_id`: XLA
//!   runs gspmd's plan unchanged.
//!
//! Every op exports (the match is exhaustive, no fallback); what the text cannot say
//! is an [`Error::Export`] naming the value and its source line: a sharding in reversed
//! device order at a boundary, a per-device block padded because its axes do not
//! divide the dim, unreduced results of a per-device program. `tools/xla_check.py`
//! compiles and runs both forms with JAX's XLA and compares them with gspmd.

mod groups;
mod sdy;
mod stablehlo;
mod threefry;

use sdy::Keep;
use stablehlo::{Form, Ty, Val, Writer};

use crate::error::{Error, Result};
use crate::executable::Executable;
use crate::ir::{Node, Program, ValueId};
use crate::sharding::{Mesh, Sharding};
use crate::types::TensorType;

impl Program {
    /// The traced program as StableHLO for `mesh` (the global form, see
    /// [`crate::export`]): parameters and outputs carry their annotations as
    /// `sdy.sharding` attributes, other annotated values pass through
    /// `sdy.sharding_constraint`s; open dims (`?`), priorities, replicated and unreduced
    /// axes are kept. An [`Error::Export`] for an annotation in reversed device order.
    pub fn to_stablehlo(&self, mesh: &Mesh) -> Result<String> {
        global(self, mesh, Form::Traced)
    }
}

impl Executable {
    /// The per-device program as StableHLO (see [`crate::export`]): `@main` takes the
    /// global inputs sharded as [`SpmdProgram::inputs`](crate::partition::SpmdProgram)
    /// and runs the per-device program in an `sdy.manual_computation` over every mesh
    /// axis, its collectives spelled out. [`Error::Export`] when an input or output
    /// block is padded (its axes do not divide the dim), in reversed device order, or an
    /// output is unreduced: a manual computation's boundary cannot say so.
    pub fn to_stablehlo(&self) -> Result<String> {
        per_device(self)
    }

    /// The propagated global program as StableHLO (see [`crate::export`]): every value's
    /// complete sharding (its split axes) as an `sdy` constraint, so that XLA's
    /// partitioner starts from gspmd's choices; the collectives are XLA's own.
    pub fn to_stablehlo_global(&self) -> Result<String> {
        global(self.propagated(), &self.spmd().mesh, Form::Propagated)
    }
}

/// The global form: `program` with `form`'s shardings.
fn global(program: &Program, mesh: &Mesh, form: Form) -> Result<String> {
    fn sharding_of(node: &Node, form: Form) -> Option<&Sharding> {
        match form {
            Form::Traced => node.annotation.as_ref(),
            Form::Propagated => node.sharding.as_ref().filter(|s| s.is_in_mesh_order()),
            Form::PerDevice => None,
        }
    }
    let keep = match form {
        Form::Traced => Keep::Annotation,
        Form::Propagated | Form::PerDevice => Keep::Split,
    };
    let attr = |v: ValueId| -> Result<Option<String>> {
        let node = program.node(v);
        sharding_of(node, form)
            .map(|s| stablehlo::sharding_attr(mesh, node, v, s, keep))
            .transpose()
    };
    let args: Vec<Val> = (program.params.iter().enumerate())
        .map(|(i, &p)| Val {
            name: format!("%arg{i}"),
            ty: Ty::of(program.ty(p)),
        })
        .collect();
    let arg_attrs = (program.params.iter())
        .map(|&p| attr(p))
        .collect::<Result<Vec<_>>>()?;
    let result_attrs = (program.outputs.iter())
        .map(|&o| attr(o))
        .collect::<Result<Vec<_>>>()?;
    let mut w = Writer::new(mesh, form, 2);
    let outs = w.program(program, args.clone())?;
    Ok(module(
        &program.name,
        mesh,
        &args,
        &arg_attrs,
        &outs,
        &result_attrs,
        w,
    ))
}

/// The per-device form of `exe`.
fn per_device(exe: &Executable) -> Result<String> {
    let spmd = exe.spmd();
    let mesh = &spmd.mesh;
    let program = &spmd.program;
    let boundary = |what: &str, i: usize, v: ValueId, global: &TensorType, s: &Sharding| {
        let node = program.node(v);
        let error = |message: String| Error::Export {
            value: v,
            op: node.op.name(),
            location: node.location,
            message: format!("{what} {i}: {message}"),
        };
        if !s.unreduced.is_empty() {
            return Err(error(format!(
                "sharding {s} holds pending sums, which a manual computation's boundary \
                 cannot express"
            )));
        }
        for (d, (&n, dim)) in global.shape.iter().zip(&s.dims).enumerate() {
            let k = mesh.axes_size(&dim.axes);
            if n % k != 0 {
                return Err(error(format!(
                    "dim {d} of {global} is split {k} ways by {s}: the blocks are padded, \
                     which a manual computation's boundary cannot express"
                )));
            }
        }
        let attr = stablehlo::sharding_attr(mesh, node, v, s, Keep::Split)?;
        Ok(attr)
    };
    let arg_attrs = (spmd.inputs.iter().zip(&program.params).enumerate())
        .map(|(i, ((t, s), &p))| boundary("input", i, p, t, s).map(Some))
        .collect::<Result<Vec<_>>>()?;
    let result_attrs = (spmd.outputs.iter().zip(&program.outputs).enumerate())
        .map(|(i, ((t, s), &o))| boundary("output", i, o, t, s).map(Some))
        .collect::<Result<Vec<_>>>()?;
    let args: Vec<Val> = (spmd.inputs.iter().enumerate())
        .map(|(i, (t, _))| Val {
            name: format!("%arg{i}"),
            ty: Ty::of(t),
        })
        .collect();
    let result_tys: Vec<Ty> = spmd.outputs.iter().map(|(t, _)| Ty::of(t)).collect();
    let bodies = |shardings: &mut dyn Iterator<Item = &Sharding>| -> String {
        let each: Vec<String> = shardings
            .map(|s| sdy::sharding_body(mesh, s, Keep::Split))
            .collect();
        format!("[{}]", each.join(", "))
    };
    let mut w = Writer::new(mesh, Form::PerDevice, 2);
    let blocks: Vec<Ty> = (program.params.iter())
        .map(|&p| Ty::of(program.ty(p)))
        .collect();
    let axes: Vec<String> = mesh.axis_names().map(String::from).collect();
    let (body, header) = w.manual_region(&blocks, program)?;
    let text = format!(
        "sdy.manual_computation({}) in_shardings={} out_shardings={} manual_axes={} \
         ({header}) {body} : ({}) -> {}",
        stablehlo::names(&args),
        bodies(&mut spmd.inputs.iter().map(|(_, s)| s)),
        bodies(&mut spmd.outputs.iter().map(|(_, s)| s)),
        sdy::manual_axes(mesh, &axes),
        stablehlo::types(args.iter().map(|v| &v.ty)),
        stablehlo::result_types(&result_tys)
    );
    let outs = w.assign(&text, &result_tys);
    Ok(module(
        &program.name,
        mesh,
        &args,
        &arg_attrs,
        &outs,
        &result_attrs,
        w,
    ))
}

/// The module around `@main`: its arguments with their attributes, the body `w`
/// wrote, and the return of `outs`.
fn module(
    name: &str,
    mesh: &Mesh,
    args: &[Val],
    arg_attrs: &[Option<String>],
    outs: &[Val],
    result_attrs: &[Option<String>],
    w: Writer<'_>,
) -> String {
    let with_attr = |ty: String, attr: &Option<String>| match attr {
        Some(a) => format!("{ty} {{sdy.sharding = {a}}}"),
        None => ty,
    };
    let params: Vec<String> = (args.iter().zip(arg_attrs))
        .map(|(a, attr)| with_attr(format!("{}: {}", a.name, a.ty), attr))
        .collect();
    let results: Vec<String> = (outs.iter().zip(result_attrs))
        .map(|(o, attr)| with_attr(o.ty.to_string(), attr))
        .collect();
    let symbol: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let symbol = if symbol.is_empty() {
        "gspmd".into()
    } else {
        symbol
    };
    let mut text = format!(
        "module @{symbol} attributes {{mhlo.num_partitions = {} : i32, mhlo.num_replicas = 1 : i32}} {{\n",
        mesh.num_devices()
    );
    text += &format!("  {}\n", sdy::mesh_op(mesh));
    text += &format!(
        "  func.func public @main({}) -> ({}) {{\n",
        params.join(", "),
        results.join(", ")
    );
    text += &w.finish();
    text += &format!(
        "    \"func.return\"({}) : ({}) -> ()\n  }}\n}}\n",
        stablehlo::names(outs),
        stablehlo::types(outs.iter().map(|v| &v.ty))
    );
    text
}
