//! Expansion: a validated [`Model`] becomes
//!
//! - the body function, same name, doc and visibility, over traced `Tensor` handles
//!   (the user's `Tensor` path with the declared dims dropped), each `#[shard] let` a `sharding_constraint`;
//! - a module of the same name (modules and functions live in different namespaces)
//!   holding `Dims`, `MESH_AXES`, `SIGNATURE`, `mesh`, `trace` and `trace_shapes`;
//! - next to them, an `impl` on the module's hidden `Body` type whose `trace_sizes`
//!   calls the function. The module reaches the function through that `impl` rather
//!   than a `super::` path, so a model also works when declared inside a function body
//!   (where `super::` skips the body's items).
//!
//! Calls whose source line matters (`parameter`, `annotate`, `shard`, the result
//! check) are spanned on the user's tokens, so `#[track_caller]` records the user's
//! file and line. Internal local names use mixed-site hygiene and cannot clash with
//! the user's names.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Expr, FnArg, Ident, ItemFn, Pat};

use crate::parse::{DType, DimDecl, LetShard, Model, Param, StructArg, TensorDecl, same_ident};
use crate::spec::{AxisSpec, ShardSpec};

/// The body function: tensor types become `::gspmd::ir::Tensor`; with `constraints`,
/// each `#[shard] let` also becomes a `sharding_constraint` (off when the model has
/// errors: the function is then emitted only to keep IDEs and later errors useful).
pub fn body_fn(model: &Model, constraints: bool) -> ItemFn {
    let mut func = model.func.clone();
    // A model's parameters are its weights: usually more than clippy likes. And
    // `#[shard(..)] let y = ..; y` is how a result is sharded, not a needless `let`.
    func.attrs.push(syn::parse_quote!(
        #[allow(clippy::too_many_arguments, clippy::let_and_return)]
    ));
    for arg in &mut func.sig.inputs {
        if let FnArg::Typed(pt) = arg {
            Retype.visit_type_mut(&mut pt.ty);
        }
    }
    Retype.visit_return_type_mut(&mut func.sig.output);
    if constraints {
        WrapLets {
            lets: &model.lets,
            count: 0,
        }
        .visit_block_mut(&mut func.block);
    }
    func
}

/// `Tensor<B, D>` → `Tensor` wherever it occurs in a type (also nested, as in a
/// reported `Vec<Tensor<D, D>>`): the user's own path (so their `use` resolves it) with
/// the declaration's arguments dropped.
struct Retype;

impl VisitMut for Retype {
    fn visit_type_path_mut(&mut self, ty: &mut syn::TypePath) {
        visit_mut::visit_type_path_mut(self, ty);
        if let Some(last) = ty.path.segments.last_mut()
            && last.ident == "Tensor"
        {
            last.arguments = syn::PathArguments::None;
        }
    }
}

/// Wraps the value of each recorded `let` (found by its position, as `parse` counted).
struct WrapLets<'a> {
    lets: &'a [LetShard],
    count: usize,
}

impl VisitMut for WrapLets<'_> {
    fn visit_local_mut(&mut self, local: &mut syn::Local) {
        let index = self.count;
        self.count += 1;
        visit_mut::visit_local_mut(self, local);
        let Some(found) = self.lets.iter().find(|l| l.index == index) else {
            return;
        };
        let Some(init) = &mut local.init else { return };
        let span = found.shard.attr.span();
        let expr = &init.expr;
        let sharding = sharding(&found.shard.spec);
        let wrapped = quote_spanned!(span=> ::gspmd::ir::Tensor::shard(&(#expr), #sharding));
        let name = found.shard.spec.name.as_ref().map_or_else(
            || found.binding.unraw().to_string().to_token_stream(),
            ToTokens::to_token_stream,
        );
        *init.expr =
            Expr::Verbatim(quote_spanned!(span=> ::gspmd::ir::Tensor::named(&#wrapped, #name)));
    }
}

/// A `::gspmd::sharding::Sharding` struct literal for `spec`.
pub fn sharding(spec: &ShardSpec) -> TokenStream {
    let strings = |axes: &[AxisSpec]| {
        let names = axes.iter().map(ToString::to_string);
        quote!(::std::vec![#(::std::string::String::from(#names)),*])
    };
    let dims = spec.dims.iter().map(|d| {
        let axes = strings(&d.axes);
        let closed = !d.open;
        let priority = match d.priority.or(spec.priority) {
            Some(p) => quote!(::std::option::Option::Some(#p)),
            None => quote!(::std::option::Option::None),
        };
        quote!(::gspmd::sharding::DimSharding { axes: #axes, closed: #closed, priority: #priority, reversed: false })
    });
    let replicated = strings(&spec.replicated);
    let unreduced = strings(&spec.unreduced);
    quote!(::gspmd::sharding::Sharding {
        dims: ::std::vec![#(#dims),*],
        replicated: #replicated,
        unreduced: #unreduced,
    })
}

/// Shape symbols in order of first appearance among the tensor parameters' dims and the
/// parameter structs' `#[params(..)]` lists.
fn symbols(model: &Model) -> Vec<&Ident> {
    let mut symbols: Vec<&Ident> = Vec::new();
    for param in &model.params {
        let dims = param.tensor.iter().flat_map(|decl| &decl.dims);
        let in_dims = dims.filter_map(|dim| match dim {
            DimDecl::Symbol(s) => Some(s),
            DimDecl::Fixed(_) => None,
        });
        let listed = param.structure.iter().flat_map(|s| &s.symbols);
        for s in in_dims.chain(listed) {
            if !symbols.iter().any(|x| same_ident(x, s)) {
                symbols.push(s);
            }
        }
    }
    symbols
}

/// Position of `symbol` in `symbols` (which lists every symbol of the parameters).
fn symbol_index(symbols: &[&Ident], symbol: &Ident) -> usize {
    symbols
        .iter()
        .position(|x| same_ident(x, symbol))
        .unwrap_or_default()
}

pub fn dtype(dtype: DType) -> TokenStream {
    match dtype {
        DType::F32 => quote!(::gspmd::ir::DType::F32),
        DType::BF16 => quote!(::gspmd::ir::DType::BF16),
        DType::F16 => quote!(::gspmd::ir::DType::F16),
        DType::I32 => quote!(::gspmd::ir::DType::I32),
        DType::Bool => quote!(::gspmd::ir::DType::Bool),
    }
}

/// `::gspmd::dsl::TensorDecl { .. }` for `decl`.
fn decl_literal(name: &str, decl: &TensorDecl, symbols: &[&Ident]) -> TokenStream {
    let dims = decl.dims.iter().map(|dim| match dim {
        DimDecl::Symbol(s) => {
            let k = symbol_index(symbols, s);
            quote!(::gspmd::dsl::Dim::Symbol(#k))
        }
        DimDecl::Fixed(n) => quote!(::gspmd::dsl::Dim::Fixed(#n)),
    });
    let dtype = dtype(decl.dtype);
    quote!(::gspmd::dsl::TensorDecl { name: #name, dims: &[#(#dims),*], dtype: #dtype })
}

/// `::gspmd::dsl::ParamsDecl { .. }` for struct parameter `name`.
fn struct_literal(name: &str, arg: &StructArg) -> TokenStream {
    let ty = &arg.ty;
    let symbols = arg.symbols.iter().map(|s| s.unraw().to_string());
    quote!(::gspmd::dsl::ParamsDecl {
        name: #name,
        symbols: &[#(#symbols),*],
        check: ::gspmd::params::check_symbols::<#ty>,
        describe: ::gspmd::params::describe::<#ty>,
    })
}

/// The body function and the model's module.
pub fn model(model: &Model) -> TokenStream {
    let func = body_fn(model, true);
    let fn_name = &func.sig.ident;
    let model_name = fn_name.to_string();
    let vis = &func.vis;
    let outer_attrs: Vec<_> = func
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc") || a.path().is_ident("cfg"))
        .collect();
    let cfg_attrs = outer_attrs.iter().filter(|a| a.path().is_ident("cfg"));
    let symbols = symbols(model);
    let n_symbols = symbols.len();
    let mesh: Vec<String> = model
        .args
        .as_ref()
        .and_then(|a| a.mesh.as_ref())
        .map(|m| m.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    let n_axes = mesh.len();

    let builder = Ident::new("builder", Span::mixed_site());
    let sizes = Ident::new("sizes", Span::mixed_site());
    let dims = Ident::new("dims", Span::mixed_site());
    let shapes = Ident::new("shapes", Span::mixed_site());
    let signature = quote!(#fn_name::SIGNATURE);
    let mut call_args = Vec::new();
    let mut statics = Vec::new();
    let mut static_names = Vec::new();
    let mut param_decls = Vec::new();
    for (i, param) in model.params.iter().enumerate() {
        match (&param.tensor, &param.structure) {
            (Some(decl), _) => {
                call_args.push(parameter(param, decl, &symbols, &builder, &sizes));
                let decl = decl_literal(&param_name(param), decl, &symbols);
                param_decls.push(quote!(::gspmd::dsl::Arg::Tensor(#decl)));
            }
            (None, Some(arg)) => {
                let name = param_name(param);
                call_args.push(declare(&name, arg, &builder, &sizes, &signature));
                let decl = struct_literal(&name, arg);
                param_decls.push(quote!(::gspmd::dsl::Arg::Params(#decl)));
            }
            (None, None) => {
                let ident = match &param.pat {
                    Pat::Ident(p) => p.ident.clone(),
                    _ => format_ident!("arg{}", i, span = Span::mixed_site()),
                };
                let ty = &param.ty;
                statics.push(quote!(#ident: #ty));
                call_args.push(ident.to_token_stream());
                static_names.push(ident);
            }
        }
    }

    let (result, output_decls, outputs_done) =
        outputs(model, &symbols, &builder, &sizes, &signature);

    let sym_names = symbols.iter().map(|s| s.unraw().to_string());
    let dims_doc = format!(
        "Sizes of the shape symbols of model [`{model_name}`](fn@super::{model_name}), \
         in order of first appearance."
    );
    let symbol_fields = symbols.iter().map(|s| {
        let doc = format!("Size of shape symbol `{s}`.");
        quote!(#[doc = #doc] pub #s: usize)
    });
    let result_ty = quote!(::gspmd::Result<::gspmd::ir::Program>);
    quote! {
        #func

        #(#outer_attrs)*
        #[allow(non_snake_case, dead_code, unused_imports, clippy::all)]
        #vis mod #fn_name {
            use super::*;

            /// Mesh axes the model's shardings name, major to minor.
            pub const MESH_AXES: &[&str] = &[#(#mesh),*];

            #[doc = #dims_doc]
            #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
            pub struct Dims { #(#symbol_fields),* }

            impl Dims {
                fn sizes(self) -> [usize; #n_symbols] {
                    [#(self.#symbols),*]
                }
            }

            /// The model's declared signature: shape symbols, parameters, results.
            pub const SIGNATURE: ::gspmd::dsl::Signature<#n_symbols> = ::gspmd::dsl::Signature {
                model: #model_name,
                symbols: [#(#sym_names),*],
                params: &[#(#param_decls),*],
                outputs: &[#(#output_decls),*],
            };

            /// A mesh with the model's axes and the given sizes (major to minor).
            pub fn mesh(sizes: [usize; #n_axes]) -> ::gspmd::Result<::gspmd::sharding::Mesh> {
                ::gspmd::sharding::Mesh::new(MESH_AXES.iter().copied().zip(sizes))
            }

            /// Reaches the model's function: see `trace_sizes` next to the function.
            #[doc(hidden)]
            pub struct Body;

            /// Traces the model with the given symbol sizes into a program.
            ///
            /// Errors: every shape error the body's ops record (each naming the user's
            /// source line), and a result whose type differs from the declared one.
            pub fn trace(#dims: Dims, #(#statics),*) -> #result_ty {
                Body::trace_sizes(#dims.sizes(), #(#static_names),*)
            }

            /// Traces the model with symbol sizes bound from one concrete shape per
            /// tensor parameter, in order.
            ///
            /// Errors: a wrong number of shapes, a shape whose rank or fixed size does not
            /// fit its declaration, a symbol given two sizes; then as [`trace`].
            pub fn trace_shapes(#shapes: &[&[usize]], #(#statics),*) -> #result_ty {
                let #sizes = SIGNATURE.bind_shapes(#shapes)?;
                Body::trace_sizes(#sizes, #(#static_names),*)
            }
        }

        #(#cfg_attrs)*
        #[allow(clippy::all)]
        impl #fn_name::Body {
            /// Calls the function on fresh parameters of the given symbol sizes and
            /// finishes the program.
            fn trace_sizes(#sizes: [usize; #n_symbols], #(#statics),*) -> #result_ty {
                let #builder = ::gspmd::ir::Builder::new(#model_name);
                let #result = #fn_name(#(#call_args),*);
                #outputs_done
            }
        }
    }
}

/// The parameter's name in the program (its `name = ".."` or its identifier).
fn param_name(param: &Param) -> String {
    let explicit = param
        .shard
        .as_ref()
        .and_then(|s| s.spec.name.as_ref())
        .map(syn::LitStr::value);
    explicit.unwrap_or_else(|| match &param.pat {
        Pat::Ident(p) => p.ident.unraw().to_string(),
        other => other.to_token_stream().to_string(),
    })
}

/// `&model::SIGNATURE.declare::<Model>(&builder, "p", &["V", ..], &sizes)?`, spanned on the
/// `#[params(..)]`: the struct's leaves become parameters, in field order.
fn declare(
    name: &str,
    arg: &StructArg,
    builder: &Ident,
    sizes: &Ident,
    signature: &TokenStream,
) -> TokenStream {
    let ty = &arg.ty;
    let symbols = arg.symbols.iter().map(|s| s.unraw().to_string());
    let span = arg.attr.span();
    let value = quote_spanned!(span=>
        #signature.declare::<#ty>(&#builder, #name, &[#(#symbols),*], &#sizes)?);
    if arg.by_ref { quote!(&#value) } else { value }
}

/// `builder.parameter("x", vec![sizes[0], 16], F32)`, then `.annotate(..)`, spanned on
/// the parameter and its `#[shard]`.
fn parameter(
    param: &Param,
    decl: &TensorDecl,
    symbols: &[&Ident],
    builder: &Ident,
    sizes: &Ident,
) -> TokenStream {
    let name = param_name(param);
    let dims = decl.dims.iter().map(|dim| match dim {
        DimDecl::Symbol(s) => {
            let k = Literal::usize_unsuffixed(symbol_index(symbols, s));
            quote!(#sizes[#k])
        }
        DimDecl::Fixed(n) => Literal::usize_unsuffixed(*n).to_token_stream(),
    });
    let dtype = dtype(decl.dtype);
    let span = param.pat.span();
    let mut expr =
        quote_spanned!(span=> #builder.parameter(#name, ::std::vec![#(#dims),*], #dtype));
    if let Some(shard) = &param.shard {
        let span = shard.attr.span();
        let sharding = sharding(&shard.spec);
        expr = quote_spanned!(span=> #expr.annotate(#sharding));
    }
    expr
}

/// The pattern binding the body's result, the `SIGNATURE.outputs` entries, and the
/// code that applies `out = ..` shardings and finishes the program.
fn outputs(
    model: &Model,
    symbols: &[&Ident],
    builder: &Ident,
    sizes: &Ident,
    signature: &TokenStream,
) -> (TokenStream, Vec<TokenStream>, TokenStream) {
    let Some(output) = &model.output else {
        return (TokenStream::new(), Vec::new(), TokenStream::new());
    };
    let names: Vec<Ident> = (0..output.tensors.len())
        .map(|i| format_ident!("result{}", i, span = Span::mixed_site()))
        .collect();
    let pattern = if output.tuple {
        quote!((#(#names),*))
    } else {
        quote!(#(#names)*)
    };
    let decls = output
        .tensors
        .iter()
        .enumerate()
        .map(|(i, decl)| {
            let name = if output.tuple {
                format!("result.{i}")
            } else {
                "result".to_string()
            };
            decl_literal(&name, decl, symbols)
        })
        .collect();
    let out_specs = model.args.as_ref().and_then(|a| a.out.as_ref());
    let constraints = names.iter().enumerate().filter_map(|(i, name)| {
        let spec = out_specs?.specs.get(i)?;
        let span = spec
            .tokens
            .clone()
            .into_iter()
            .next()
            .map_or(Span::call_site(), |t| t.span());
        let sharding = sharding(spec);
        let named = spec
            .name
            .as_ref()
            .map(|n| quote_spanned!(span=> .named(#n)));
        Some(quote_spanned!(span=> let #name = #name.shard(#sharding) #named;))
    });
    let span = output.ty.span();
    let finish = quote_spanned!(span=> #signature.finish(#builder, &[#(&#names),*], &#sizes));
    (pattern, decls, quote!(#(#constraints)* #finish))
}
