//! Procedural macros of gspmd: the `#[gspmd::model]` attribute, which turns an ordinary
//! Rust function over tensors into code that traces it into gspmd's IR,
//! `#[gspmd::params]`, which turns a struct into a tree of model parameters, and
//! `#[shard]`, which only those two read (used anywhere else it is a spanned error).
//!
//! Use it through the facade crate (`gspmd::model`, `gspmd::prelude::*`); the generated
//! code names items by `::gspmd::...` paths. The syntax and the generated API are
//! documented on [`macro@model`] and in `docs/dsl.md`.
//!
//! The macro runs in three stages, each a module: `parse` (syntax into a `Model`,
//! collecting errors), `validate` (names, ranks, the function's form), `expand`
//! (code). Sharding specs have their own parser in `spec`. On any error the function is
//! still emitted, with its `Tensor<..>` types rewritten, next to the `compile_error!`s,
//! so IDEs and later errors keep working.

mod errors;
mod expand;
mod params;
mod parse;
mod spec;
mod validate;

use proc_macro::TokenStream;
use quote::quote;

use errors::Errors;

/// Turns a function over declared tensors into a traceable model.
///
/// ```ignore
/// use gspmd::prelude::*;
///
/// /// Megatron MLP.
/// #[gspmd::model(mesh = (data, model))]
/// pub fn mlp(
///     #[shard(data, _)] x: Tensor<B, D>,
///     #[shard(_, model)] w1: Tensor<D, F>,
///     #[shard(model, _)] w2: Tensor<F, D>,
/// ) -> Tensor<B, D> {
///     #[shard(data, model)]
///     let h = x.matmul(&w1).relu();
///     h.matmul(&w2)
/// }
///
/// let program = mlp::trace(mlp::Dims { B: 8, D: 16, F: 64 })?;
/// let program = mlp::trace_shapes(&[&[8, 16], &[16, 64], &[64, 16]])?;
/// ```
///
/// **Attribute.** `mesh = (axis, ...)` (required) names the mesh axes, major to minor;
/// `out = (spec)` or `out = [(spec), ...]` pins the result shardings (one per result).
///
/// **Types.** `Tensor<B, D>`: one entry per dim, a shape symbol (`B`) or a fixed size
/// (`16`), optionally followed by the element type `f32` (default), `i32` or `bool`;
/// `Tensor<>` (which rustfmt writes `Tensor`) is an f32 scalar. The result is a `Tensor<..>` or a tuple of them; its
/// symbols must appear in some parameter. Other parameters (`layers: usize`) are
/// *static arguments*: passed through `trace` and `trace_shapes` to the body, except a
/// parameter struct marked `#[params(V, D)] p: &Model` (see [`macro@params`]).
///
/// **Shardings.** `#[shard(...)]` on a tensor parameter annotates it; on a
/// `let name = value;` it inserts a `sharding_constraint` on the value (named after the
/// binding). Entries: `_` replicated, `?` open (propagation may fill it), `axis`,
/// `(a, b)` several axes major to minor, a trailing `?` to leave a dim open, `@N` a
/// per-dim priority, `model:(1)2` a sub-axis (Shardy's `axis:(pre)size`); then options
/// `priority = N`, `unreduced = (axis, ..)`, `replicated = (axis, ..)`, `name = "..."`.
///
/// **Generated.** The function itself, same name and visibility, over
/// `gspmd::ir::Tensor` handles (callable from other models), and a module of the same
/// name with `Dims` (one `usize` field per shape symbol), `MESH_AXES`, `SIGNATURE`,
/// `mesh(sizes)`, `trace(dims, statics..)` and `trace_shapes(shapes, statics..)`.
///
/// A model may also be declared inside a function body; the types of its static
/// arguments must then be nameable from the enclosing module (the generated module
/// imports `super::*`).
#[proc_macro_attribute]
pub fn model(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func = match syn::parse::<syn::ItemFn>(item.clone()) {
        Ok(func) => func,
        Err(e) => {
            let message = format!("`#[gspmd::model]` goes on a free function: {e}");
            let error = syn::Error::new(e.span(), message).into_compile_error();
            let item = proc_macro2::TokenStream::from(item);
            return quote!(#error #item).into();
        }
    };
    let mut errors = Errors::default();
    let model = parse::model(attr.into(), func, &mut errors);
    validate::model(&model, &mut errors);
    match errors.finish() {
        Ok(()) => expand::model(&model).into(),
        Err(e) => {
            let func = expand::body_fn(&model, false);
            let errors = e.into_compile_error();
            quote!(#errors #func).into()
        }
    }
}

/// Turns a struct into a tree of model parameters (`gspmd::Params`).
///
/// ```ignore
/// use gspmd::prelude::*;
///
/// #[gspmd::params(mesh = (data, model))]
/// pub struct Mlp {
///     #[shard(_, model)]
///     #[init(fan_in(0))]
///     w1: Tensor<D, F>,
///     #[shard(model, _)]
///     #[init(fan_in(0))]
///     w2: Tensor<F, D>,
/// }
///
/// #[gspmd::model(mesh = (data, model))]
/// pub fn mlp(#[shard(data, _)] x: Tensor<B, D>, #[params(D, F)] p: &Mlp) -> Tensor<B, D> {
///     x.matmul(&p.w1).relu().matmul(&p.w2)
/// }
/// ```
///
/// **Attribute.** `mesh = (axis, ...)` (required): the axes the fields' shardings name.
///
/// **Fields**, in order, are the model's parameters, named by their paths:
/// - `w: Tensor<D, F>` (types as in [`macro@model`]), optionally `#[shard(..)]` (one entry
///   per dim; `name = ".."` renames the leaf) and `#[init(..)]`: `zeros`, `ones`,
///   `normal(std)`, `uniform(bound)`, `fan_in(dim, ..)` or `normal_fan_in(dim, ..)`
///   (`gspmd::train::Init`);
/// - `attn: Attention`: a nested parameter struct, its leaves named `attn.wq`;
/// - `blocks: Vec<Block, N>`: `N` copies (a shape symbol or a number), named
///   `blocks.3.wq`;
/// - `layers: Stacked<Block, N>`: every leaf of `Block` with a leading dim `N`, named
///   `layers.wq` (its sharding gets a replicated leading dim, its `fan_in` dims shift);
///   take layer `l` with `p.layers.layer(l)` or loop with `p.layers.scan(..)`.
///
/// **Generated.** The struct with concrete types (`Tensor`, `Vec<Block>`, `Stacked<Block>`:
/// the written paths without dims and lengths) and `impl gspmd::Params`, whose provided methods
/// give the leaves, the shape symbols and the `Initializer` of the `#[init]`s.
///
/// **In a model**, a parameter `#[params(D, F)] p: &Mlp` (or `p: Mlp`) declares the
/// struct's leaves in its place; the list names the struct's shape symbols (the macro
/// cannot see the struct), which join the model's `Dims`. Tracing checks the list
/// against the struct (`gspmd::Error::ParamsSymbol` names a missing or extra symbol).
#[proc_macro_attribute]
pub fn params(attr: TokenStream, item: TokenStream) -> TokenStream {
    params::expand(attr.into(), item.into()).into()
}

/// `#[shard(...)]` annotates a tensor parameter or a `let` of a [`macro@model`] function,
/// which reads and removes it. Anywhere else it does nothing and is a compile error
/// saying so; where Rust accepts no attribute macro (function parameters, statements
/// on stable Rust) rustc reports it first.
///
/// Outside a model, shard a traced value with the builder API instead:
/// `x.shard("(data, _)".parse()?)` inserts a `sharding_constraint` and
/// `x.annotate(..)` sets a parameter's own sharding.
#[proc_macro_attribute]
pub fn shard(_attr: TokenStream, item: TokenStream) -> TokenStream {
    let error = syn::Error::new(
        proc_macro2::Span::call_site(),
        "`#[shard]` only works inside a `#[gspmd::model]` function; elsewhere call \
         `tensor.shard(\"(data, _)\".parse()?)` (a `sharding_constraint`) or \
         `tensor.annotate(..)` on a builder parameter",
    )
    .into_compile_error();
    let item = proc_macro2::TokenStream::from(item);
    quote!(#error #item).into()
}
