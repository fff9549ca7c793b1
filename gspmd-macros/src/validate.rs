//! Validation: what a parsed [`Model`] must satisfy before it is expanded. Every check
//! reports on the user's token and all problems are collected.
//!
//! Checked here: the function's form (not `async`, `const`, `unsafe`, `extern`, generic
//! or with a `where` clause, a method or variadic), `mesh = ...` present with distinct axes, every axis of every
//! spec a mesh axis and used once per spec, spec length equal to the declared rank
//! (parameters and `out`), `#[shard]` only on tensor parameters, output symbols bound
//! by some parameter (a tensor's dim or a parameter struct's `#[params(..)]`), each symbol
//! listed once per `#[params(..)]`. A `let`'s rank is only known when tracing: checked there.

use quote::ToTokens;
use syn::{FnArg, Ident};

use crate::errors::Errors;
use crate::parse::{self, DimDecl, Model, Param, TensorDecl};
use crate::spec::{AxisSpec, ShardSpec};

/// Checks `model`, adding what is wrong to `errors`.
pub fn model(model: &Model, errors: &mut Errors) {
    signature(&model.func.sig, errors);
    let mesh = model.args.as_ref().and_then(|args| {
        if args.mesh.is_none() {
            errors.push(syn::Error::new(
                proc_macro2::Span::call_site(),
                "missing `mesh = (axis, ...)`: name the mesh axes the model is sharded over, \
                 e.g. `#[gspmd::model(mesh = (data, model))]`",
            ));
        }
        args.mesh.as_deref()
    });
    if let Some(mesh) = mesh {
        for (i, axis) in mesh.iter().enumerate() {
            if mesh[..i].contains(axis) {
                errors.spanned(axis, format!("mesh axis `{axis}` is listed twice"));
            }
        }
    }
    for param in &model.params {
        let Some(shard) = &param.shard else { continue };
        match &param.tensor {
            Some(decl) => {
                let what = format!("`{}`", param.pat.to_token_stream());
                sharding(&shard.spec, &shard.attr, mesh, Some((decl, &what)), errors);
            }
            None => errors.spanned(
                &shard.attr,
                format!(
                    "`#[shard]` on `{}: {}`, which is not a tensor; only `Tensor<..>` \
                     parameters can be sharded",
                    param.pat.to_token_stream(),
                    param.ty.to_token_stream()
                ),
            ),
        }
    }
    for arg in model.params.iter().filter_map(|p| p.structure.as_ref()) {
        for (i, symbol) in arg.symbols.iter().enumerate() {
            if arg.symbols[..i]
                .iter()
                .any(|s| parse::same_ident(s, symbol))
            {
                errors.spanned(symbol, format!("shape symbol `{symbol}` is listed twice"));
            }
        }
    }
    for let_shard in &model.lets {
        sharding(
            &let_shard.shard.spec,
            &let_shard.shard.attr,
            mesh,
            None,
            errors,
        );
    }
    outputs(model, mesh, errors);
}

fn signature(sig: &syn::Signature, errors: &mut Errors) {
    if let Some(t) = &sig.constness {
        errors.spanned(t, "a model function cannot be `const`");
    }
    if let Some(t) = &sig.asyncness {
        errors.spanned(
            t,
            "a model function cannot be `async`: tracing runs it once, eagerly",
        );
    }
    if let syn::Safety::Unsafe(t) = &sig.safety {
        errors.spanned(t, "a model function cannot be `unsafe`");
    }
    if let Some(abi) = &sig.abi {
        errors.spanned(abi, "a model function cannot have an `extern` ABI");
    }
    for param in &sig.generics.params {
        let message = match param {
            syn::GenericParam::Type(_) => {
                "a model function cannot be generic: declare dims as shape symbols \
                 (`Tensor<B, D>`) and pass other settings as ordinary parameters"
            }
            syn::GenericParam::Lifetime(_) => {
                "a model function cannot have lifetime parameters: leave the lifetimes of \
                 static arguments elided (`label: &str`)"
            }
            syn::GenericParam::Const(_) => {
                "a model function cannot have const generic parameters: declare the dim as a \
                 shape symbol (`Tensor<B, N>`) or a fixed size (`Tensor<B, 16>`)"
            }
        };
        errors.spanned(param, message);
    }
    if let Some(clause) = &sig.generics.where_clause {
        errors.spanned(
            clause,
            "a model function cannot have a `where` clause: it has no generic parameters \
             to bound",
        );
    }
    if let Some(FnArg::Receiver(r)) = sig.inputs.first() {
        errors.spanned(r, "a model is a free function, not a method: remove `self`");
    }
    if let Some(v) = &sig.variadic {
        errors.spanned(v, "a model function cannot be variadic");
    }
}

/// Checks one spec: axes against `mesh` (if known), each axis once, and the rank
/// against `tensor` (its declaration and a description such as `` `x` ``) if known;
/// a rank error is spanned on `anchor`.
pub fn sharding(
    spec: &ShardSpec,
    anchor: &dyn ToTokens,
    mesh: Option<&[Ident]>,
    tensor: Option<(&TensorDecl, &str)>,
    errors: &mut Errors,
) {
    let axes: Vec<&AxisSpec> = spec.axes().collect();
    for (i, axis) in axes.iter().enumerate() {
        if let Some(mesh) = mesh
            && !mesh.contains(&axis.name)
        {
            let names: Vec<String> = mesh.iter().map(ToString::to_string).collect();
            errors.spanned(
                axis,
                format!(
                    "unknown mesh axis `{}`; the model's mesh axes are: {}",
                    axis.name,
                    names.join(", ")
                ),
            );
        }
        if let Some(problem) = sub_axis_problem(axis, spec) {
            errors.spanned(axis, problem);
        }
        let text = axis.to_string();
        if axes[..i].iter().any(|a| a.to_string() == text) {
            errors.spanned(
                axis,
                format!("mesh axis `{text}` is used twice in this sharding"),
            );
        } else if let Some(other) = axes[..i].iter().find(|a| overlap(a, axis)) {
            errors.spanned(
                axis,
                format!(
                    "`{text}` overlaps `{other}` in this sharding: parts of one mesh axis \
                     must be disjoint digits (`model:(1)2` and `model:(2)2`, not `model` \
                     and `model:(1)2`)"
                ),
            );
        }
    }
    if let Some((decl, what)) = tensor
        && spec.dims.len() != decl.dims.len()
    {
        errors.spanned(
            anchor,
            format!(
                "this sharding has {} but {what} has rank {} (`{decl}`): give one entry per dim",
                count(spec.dims.len(), "dim"),
                decl.dims.len(),
            ),
        );
    }
}

/// What is wrong with `axis` as a sub-axis that can be told without the mesh sizes
/// (whether `pre * size` divides the axis size is checked when the model is traced).
fn sub_axis_problem(axis: &AxisSpec, spec: &ShardSpec) -> Option<String> {
    let (pre, size) = axis.sub?;
    if size < 2 {
        Some(format!(
            "sub-axis `{axis}` has size {size}: a sub-axis has at least 2 devices"
        ))
    } else if pre == 0 {
        Some(format!(
            "sub-axis `{axis}` has `pre` 0: it is at least 1 (`model:(1)2` is the major digit)"
        ))
    } else if spec.unreduced.iter().any(|u| std::ptr::eq(u, axis)) {
        Some(format!(
            "`{axis}` in `unreduced`: partial sums are kept over whole mesh axes"
        ))
    } else {
        None
    }
}

/// True if two axes of a spec share digits of one mesh axis: an axis and a sub-axis of
/// it, or two sub-axes neither of which lies wholly major to the other.
fn overlap(a: &AxisSpec, b: &AxisSpec) -> bool {
    a.name == b.name
        && match (a.sub, b.sub) {
            (Some((pa, sa)), Some((pb, sb))) => {
                !(pb.is_multiple_of(pa.saturating_mul(sa))
                    || pa.is_multiple_of(pb.saturating_mul(sb)))
            }
            _ => true,
        }
}

fn outputs(model: &Model, mesh: Option<&[Ident]>, errors: &mut Errors) {
    let Some(output) = &model.output else { return };
    // A malformed parameter type was reported already; its symbols are unknown.
    let params_known = model.params.iter().all(|p| {
        p.tensor.is_some()
            || p.structure.is_some()
            || (!parse::is_tensor_type(&p.ty) && parse::holds_tensor(&p.ty).is_none())
    });
    for decl in output.tensors.iter().filter(|_| params_known) {
        for dim in &decl.dims {
            if let DimDecl::Symbol(symbol) = dim
                && !model.params.iter().any(|p| declares(p, symbol))
            {
                errors.spanned(
                    symbol,
                    format!(
                        "shape symbol `{symbol}` of the result appears in no parameter, so \
                         tracing cannot know its size"
                    ),
                );
            }
        }
    }
    let Some(out) = model.args.as_ref().and_then(|a| a.out.as_ref()) else {
        return;
    };
    if out.specs.len() != output.tensors.len() {
        errors.spanned(
            &out.key,
            format!(
                "`out` gives {} but the model returns {}",
                count(out.specs.len(), "sharding"),
                count(output.tensors.len(), "tensor")
            ),
        );
        return;
    }
    for (i, (spec, decl)) in out.specs.iter().zip(&output.tensors).enumerate() {
        let what = if output.tuple {
            format!("result {i}")
        } else {
            "the result".to_string()
        };
        sharding(spec, &spec.tokens, mesh, Some((decl, &what)), errors);
    }
}

/// True if parameter `param` declares `symbol`: in a dim, or in its `#[params(..)]`.
fn declares(param: &Param, symbol: &Ident) -> bool {
    let in_dims = param.tensor.as_ref().is_some_and(|d| {
        d.dims
            .iter()
            .any(|dim| matches!(dim, DimDecl::Symbol(s) if parse::same_ident(s, symbol)))
    });
    let listed = (param.structure.as_ref())
        .is_some_and(|a| a.symbols.iter().any(|s| parse::same_ident(s, symbol)));
    in_dims || listed
}

/// `1 dim`, `2 dims`.
fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}
