//! `#[gspmd::params]`: a struct of model parameters. Parsing, checking and expansion of
//! the struct in one pass over its fields, reusing the model's tensor types
//! ([`parse::tensor_decl`]), sharding specs ([`spec`], [`validate::sharding`],
//! [`expand::sharding`]) and error collection.
//!
//! A field is a `Tensor<..>` (with optional `#[shard(..)]` and `#[init(..)]`), a nested
//! parameter struct (a plain type path), `Vec<Layer, N>` (`N` copies, named
//! `field.i.leaf`) or `Stacked<Layer, N>` (every leaf of `Layer` with a leading dim
//! `N`, named `field.leaf`); `N` is a shape symbol or a number. The expansion is the
//! struct with those types made concrete (`Tensor`, `Vec<Layer>`, `Stacked<Layer>`) and an `impl gspmd::Params` that walks the fields
//! in order; everything else is run-time code in the facade's `params` module. The
//! user's `Tensor`, `Vec` and `Stacked` paths are kept (the prelude brings `Stacked`).

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Attribute, Fields, GenericArgument, Ident, Lit, PathArguments, Token, Type};

use crate::errors::Errors;
use crate::expand;
use crate::parse::{self, DimDecl, ModelArgs, Shard, TensorDecl};
use crate::validate;

/// The field types a parameter struct accepts, for errors.
const FIELD_TYPES: &str = "a parameter struct's field is a `Tensor<..>`, a nested parameter \
     struct (`attn: Attention`), `Vec<Layer, N>` (N copies, named `field.3.leaf`) or \
     `Stacked<Layer, N>` (leaves stacked over a leading dim N); N is a shape symbol or a \
     number. Pass other settings to the model as static arguments";

/// The initialisers `#[init(..)]` accepts, for errors.
const INITS: &str = "`zeros`, `ones`, `normal(0.02)`, `uniform(0.1)`, `fan_in(0)` or \
     `normal_fan_in(0)` (the input dims, e.g. `fan_in(0, 1)`)";

/// One field of the struct.
struct Field {
    ident: Ident,
    kind: Kind,
}

enum Kind {
    Tensor {
        decl: TensorDecl,
        shard: Option<Shard>,
        init: Option<TokenStream>,
    },
    Nested(Type),
    Repeated(Type, DimDecl),
    Stacked(Type, DimDecl),
}

/// Expands `#[gspmd::params(attr)] item`.
pub fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut item = match syn::parse2::<syn::Item>(item.clone()) {
        Ok(syn::Item::Struct(item)) => item,
        Ok(other) => {
            let anchor = item_keyword(&other).unwrap_or_else(|| other.to_token_stream());
            let error = syn::Error::new_spanned(
                anchor,
                "`#[gspmd::params]` goes on a struct with named fields, e.g. \
                 `struct Mlp { w1: Tensor<D, F>, w2: Tensor<F, D> }`",
            )
            .into_compile_error();
            return quote!(#error #item);
        }
        Err(e) => return e.into_compile_error(),
    };
    let mut errors = Errors::default();
    let mesh = mesh(attr, &mut errors);
    if let Some(param) = item.generics.params.first() {
        errors.spanned(
            param,
            "a parameter struct cannot be generic: declare its dims as shape symbols in \
             its fields (`w: Tensor<D, F>`), listed where a model takes it \
             (`#[params(D, F)] p: &Mlp`)",
        );
    }
    let fields = match &mut item.fields {
        Fields::Named(named) => named
            .named
            .iter_mut()
            .filter_map(|f| field(f, mesh.as_deref(), &mut errors))
            .collect(),
        Fields::Unnamed(unnamed) => {
            for f in &mut unnamed.unnamed {
                Retype.visit_type_mut(&mut f.ty);
            }
            errors.spanned(
                &*unnamed,
                "a parameter struct's fields name its parameters: give each a name, \
                 `struct Mlp { w1: Tensor<D, F> }`",
            );
            Vec::new()
        }
        Fields::Unit => {
            errors.spanned(
                &item.ident,
                "a parameter struct holds parameters: give it named fields, \
                 `struct Mlp { w1: Tensor<D, F> }`",
            );
            Vec::new()
        }
    };
    match errors.finish() {
        Ok(()) => {
            let params = impl_params(&item.ident, &fields);
            quote!(#item #params)
        }
        Err(e) => {
            let errors = e.into_compile_error();
            quote!(#errors #item)
        }
    }
}

/// The keyword that starts `item`, where an error about its kind belongs.
fn item_keyword(item: &syn::Item) -> Option<TokenStream> {
    Some(match item {
        syn::Item::Enum(i) => i.enum_token.to_token_stream(),
        syn::Item::Fn(i) => i.sig.fn_token.to_token_stream(),
        syn::Item::Union(i) => i.union_token.to_token_stream(),
        syn::Item::Type(i) => i.type_token.to_token_stream(),
        syn::Item::Trait(i) => i.trait_token.to_token_stream(),
        syn::Item::Impl(i) => i.impl_token.to_token_stream(),
        syn::Item::Mod(i) => i.mod_token.to_token_stream(),
        _ => return None,
    })
}

/// The mesh axes of `mesh = (..)`; `out` is a model's option.
fn mesh(attr: TokenStream, errors: &mut Errors) -> Option<Vec<Ident>> {
    let args = match syn::parse2::<ModelArgs>(attr) {
        Ok(args) => args,
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    if let Some(out) = &args.out {
        errors.spanned(
            &out.key,
            "`out` shards a model's results; a parameter struct takes only `mesh = (..)`",
        );
    }
    if args.mesh.is_none() {
        errors.push(syn::Error::new(
            Span::call_site(),
            "missing `mesh = (axis, ...)`: name the mesh axes the fields are sharded over, \
             e.g. `#[gspmd::params(mesh = (data, model))]`",
        ));
    }
    args.mesh
}

/// Parses and checks one field, taking its `#[shard]` and `#[init]` off and making its
/// type concrete.
fn field(f: &mut syn::Field, mesh: Option<&[Ident]>, errors: &mut Errors) -> Option<Field> {
    let shard = parse::take_shard(&mut f.attrs, errors);
    let init_attr = take_init(&mut f.attrs, errors);
    let ident = f.ident.clone()?;
    let kind = if parse::is_tensor_type(&f.ty) {
        parse::tensor_decl(&f.ty, errors).map(|decl| {
            if let Some(shard) = &shard {
                let what = format!("`{}`", ident.unraw());
                validate::sharding(&shard.spec, &shard.attr, mesh, Some((&decl, &what)), errors);
            }
            let init = init_attr.and_then(|attr| init(&attr, decl.dims.len(), errors));
            Kind::Tensor { decl, shard, init }
        })
    } else {
        if let Some(shard) = &shard {
            errors.spanned(
                &shard.attr,
                "`#[shard]` on a field that is not a tensor: shard the tensor fields of the \
                 nested struct instead",
            );
        }
        if let Some(attr) = &init_attr {
            errors.spanned(
                attr,
                "`#[init]` on a field that is not a tensor: give the tensor fields of the \
                 nested struct their own `#[init(..)]`",
            );
        }
        composite(&f.ty, errors)
    };
    // Also after an error: the struct is emitted, and should raise no follow-on errors.
    Retype.visit_type_mut(&mut f.ty);
    Some(Field { ident, kind: kind? })
}

/// A nested struct, `Vec<Layer, N>` or `Stacked<Layer, N>`; anything else is reported.
fn composite(ty: &Type, errors: &mut Errors) -> Option<Kind> {
    let unsupported = |errors: &mut Errors| {
        errors.spanned(ty, FIELD_TYPES);
        None
    };
    let Type::Path(path) = parse::strip_group(ty) else {
        return unsupported(errors);
    };
    let last = path.path.segments.last()?;
    let repeat = last.ident == "Vec" || last.ident == "Stacked";
    match &last.arguments {
        PathArguments::None if path.qself.is_none() && !is_primitive(&last.ident) => {
            Some(Kind::Nested(ty.clone()))
        }
        PathArguments::AngleBracketed(args) if repeat => {
            let wanted = format!(
                "write `{}<Layer, N>`: the layer's parameter struct, then the number of \
                 layers (a shape symbol such as `L` or a number such as `4`)",
                last.ident
            );
            let (layer, len) = match (args.args.first(), args.args.get(1), args.args.len()) {
                (Some(GenericArgument::Type(layer)), Some(len), 2) => (layer, len),
                _ => {
                    errors.spanned(args, wanted);
                    return None;
                }
            };
            let len = match len {
                GenericArgument::Type(Type::Path(p)) if p.qself.is_none() => {
                    p.path.get_ident().map(|i| DimDecl::Symbol(i.clone()))
                }
                GenericArgument::Const(syn::Expr::Lit(syn::ExprLit {
                    lit: Lit::Int(n), ..
                })) => n.base10_parse().ok().map(DimDecl::Fixed),
                _ => None,
            };
            let Some(len) = len else {
                errors.spanned(&args.args[1], wanted);
                return None;
            };
            Some(if last.ident == "Vec" {
                Kind::Repeated(layer.clone(), len)
            } else {
                Kind::Stacked(layer.clone(), len)
            })
        }
        _ => unsupported(errors),
    }
}

/// Primitive and standard scalar types, which cannot be parameter structs.
fn is_primitive(ident: &Ident) -> bool {
    matches!(
        ident.to_string().as_str(),
        "f32"
            | "f64"
            | "i8"
            | "i16"
            | "i32"
            | "i64"
            | "i128"
            | "isize"
            | "u8"
            | "u16"
            | "u32"
            | "u64"
            | "u128"
            | "usize"
            | "bool"
            | "char"
            | "str"
            | "String"
    )
}

/// Takes the `#[init]` attributes off `attrs`: the first, the others errors.
fn take_init(attrs: &mut Vec<Attribute>, errors: &mut Errors) -> Option<Attribute> {
    let (inits, rest): (Vec<Attribute>, Vec<Attribute>) = std::mem::take(attrs)
        .into_iter()
        .partition(|a| a.path().is_ident("init"));
    *attrs = rest;
    let mut inits = inits.into_iter();
    let first = inits.next()?;
    for dup in inits {
        errors.spanned(&dup, "duplicate `#[init]`: give one initialiser per tensor");
    }
    Some(first)
}

/// `#[init(..)]` of a tensor of rank `rank` as a `::gspmd::train::Init` expression.
fn init(attr: &Attribute, rank: usize, errors: &mut Errors) -> Option<TokenStream> {
    let parsed = match &attr.meta {
        syn::Meta::List(list) => list.parse_args::<InitSpec>(),
        _ => Err(syn::Error::new_spanned(
            attr,
            format!("expected `#[init(..)]` with one of {INITS}"),
        )),
    };
    let spec = match parsed {
        Ok(spec) => spec,
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    let init = quote!(::gspmd::train::Init);
    let value = |args: &[Lit], errors: &mut Errors| {
        let parsed = match args {
            [Lit::Float(f)] => f.base10_parse::<f32>().ok(),
            [Lit::Int(i)] => i.base10_parse::<f32>().ok(),
            _ => None,
        };
        let value = parsed.filter(|v| v.is_finite() && *v >= 0.0);
        if value.is_none() {
            let name = &spec.name;
            let anchor = args
                .first()
                .map_or_else(|| name.to_token_stream(), ToTokens::to_token_stream);
            errors.spanned(
                anchor,
                format!("`{name}` takes one non-negative number: `{name}(0.02)`"),
            );
        }
        value
    };
    match (spec.name.to_string().as_str(), &spec.args) {
        ("zeros", None) => Some(quote!(#init::Zeros)),
        ("ones", None) => Some(quote!(#init::Ones)),
        ("normal", Some(args)) => {
            value(args, errors).map(|std| quote!(#init::Normal { std: #std }))
        }
        ("uniform", Some(args)) => {
            value(args, errors).map(|bound| quote!(#init::Uniform { bound: #bound }))
        }
        (kind @ ("fan_in" | "normal_fan_in"), Some(args)) => {
            let mut dims = Vec::new();
            for arg in args {
                match arg {
                    Lit::Int(i) if i.base10_parse::<usize>().is_ok_and(|d| d < rank) => {
                        dims.push(i.base10_parse::<usize>().ok()?);
                    }
                    other => {
                        errors.spanned(
                            other,
                            format!(
                                "`{kind}` lists input dims of the tensor, from 0 to {}: \
                                 `{kind}(0)`",
                                rank.saturating_sub(1)
                            ),
                        );
                        return None;
                    }
                }
            }
            let in_dims = quote!(::std::vec![#(#dims),*]);
            Some(if kind == "fan_in" {
                quote!(#init::FanIn { scale: 1.0, in_dims: #in_dims })
            } else {
                quote!(#init::NormalFanIn { in_dims: #in_dims })
            })
        }
        ("zeros" | "ones", Some(_)) => {
            let name = &spec.name;
            errors.spanned(
                name,
                format!("`{name}` takes no arguments: `#[init({name})]`"),
            );
            None
        }
        ("normal" | "uniform" | "fan_in" | "normal_fan_in", None) => {
            let name = &spec.name;
            let wanted = match name.to_string().as_str() {
                "normal" => "its standard deviation: `normal(0.02)`",
                "uniform" => "its bound: `uniform(0.1)`",
                "fan_in" => "the input dims: `fan_in(0)`",
                _ => "the input dims: `normal_fan_in(0)`",
            };
            errors.spanned(name, format!("`{name}` takes {wanted}"));
            None
        }
        _ => {
            errors.spanned(
                &spec.name,
                format!(
                    "unknown initialiser `{}`; write one of {INITS}",
                    spec.tokens
                ),
            );
            None
        }
    }
}

/// `name` or `name(lit, ..)`.
struct InitSpec {
    name: Ident,
    args: Option<Vec<Lit>>,
    tokens: TokenStream,
}

impl Parse for InitSpec {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let tokens: TokenStream = input.fork().parse()?;
        let name: Ident = input.parse().map_err(|e| {
            syn::Error::new(e.span(), format!("expected an initialiser: one of {INITS}"))
        })?;
        let args = if input.peek(syn::token::Paren) {
            let content;
            syn::parenthesized!(content in input);
            let args = Punctuated::<Lit, Token![,]>::parse_terminated(&content).map_err(|e| {
                syn::Error::new(e.span(), format!("expected numbers; one of {INITS}"))
            })?;
            Some(args.into_iter().collect())
        } else {
            None
        };
        if !input.is_empty() {
            return Err(input.error(format!("expected one initialiser: one of {INITS}")));
        }
        Ok(InitSpec { name, args, tokens })
    }
}

/// `Tensor<B, D>` → `Tensor`, `Vec<Layer, N>` → `Vec<Layer>`, `Stacked<Layer, N>` →
/// `Stacked<Layer>`: the user's paths (so their `use`s resolve them), without the
/// declaration's dims and lengths.
struct Retype;

impl VisitMut for Retype {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        syn::visit_mut::visit_type_mut(self, ty);
        let Type::Path(path) = ty else { return };
        let Some(last) = path.path.segments.last_mut() else {
            return;
        };
        if last.ident == "Tensor" {
            last.arguments = PathArguments::None;
        } else if let PathArguments::AngleBracketed(args) = &mut last.arguments
            && (last.ident == "Vec" || last.ident == "Stacked")
        {
            let layer: Punctuated<GenericArgument, Token![,]> =
                args.args.iter().take(1).cloned().collect();
            args.args = layer;
        }
    }
}

/// `::gspmd::params::Size::Symbol("L")` or `Size::Fixed(4)`.
fn size(dim: &DimDecl) -> TokenStream {
    match dim {
        DimDecl::Symbol(s) => {
            let name = s.unraw().to_string();
            quote!(::gspmd::params::Size::Symbol(#name))
        }
        DimDecl::Fixed(n) => quote!(::gspmd::params::Size::Fixed(#n)),
    }
}

/// `impl ::gspmd::Params for Name`: the walk, visit and map over the fields in order.
fn impl_params(name: &Ident, fields: &[Field]) -> TokenStream {
    let walk = Ident::new("walk", Span::mixed_site());
    let f = Ident::new("f", Span::mixed_site());
    let mut makes = Vec::new();
    let mut visits = Vec::new();
    let mut maps = Vec::new();
    for field in fields {
        let ident = &field.ident;
        let span = ident.span();
        let (make, visit, map) = match &field.kind {
            Kind::Tensor { decl, shard, init } => {
                let leaf = (shard.as_ref())
                    .and_then(|s| s.spec.name.as_ref())
                    .map_or_else(|| ident.unraw().to_string(), syn::LitStr::value);
                let dims = decl.dims.iter().map(size);
                let dtype = expand::dtype(decl.dtype);
                let sharding = shard.as_ref().map_or_else(
                    || quote!(::std::option::Option::None),
                    |s| {
                        let s = expand::sharding(&s.spec);
                        quote!(::std::option::Option::Some(#s))
                    },
                );
                let init = init.as_ref().map_or_else(
                    || quote!(::std::option::Option::None),
                    |i| quote!(::std::option::Option::Some(#i)),
                );
                (
                    quote_spanned!(span=> #walk.tensor(#leaf, &[#(#dims),*], #dtype, #sharding, #init)?),
                    quote!(#f(&self.#ident);),
                    quote!(#f(&self.#ident)),
                )
            }
            Kind::Nested(ty) => {
                let leaf = ident.unraw().to_string();
                (
                    quote_spanned!(ty.span()=> #walk.nested::<#ty>(#leaf)?),
                    quote!(::gspmd::params::Params::for_each_leaf(&self.#ident, #f);),
                    quote!(::gspmd::params::Params::map_leaves(&self.#ident, #f)),
                )
            }
            Kind::Repeated(ty, len) => {
                let leaf = ident.unraw().to_string();
                let len = size(len);
                (
                    quote_spanned!(ty.span()=> #walk.repeated::<#ty>(#leaf, #len)?),
                    quote!(for layer in &self.#ident {
                        ::gspmd::params::Params::for_each_leaf(layer, #f);
                    }),
                    quote!(self.#ident.iter()
                        .map(|layer| ::gspmd::params::Params::map_leaves(layer, #f))
                        .collect()),
                )
            }
            Kind::Stacked(ty, len) => {
                let leaf = ident.unraw().to_string();
                let len = size(len);
                (
                    quote_spanned!(ty.span()=> #walk.stacked::<#ty>(#leaf, #len)?),
                    quote!(::gspmd::params::Params::for_each_leaf(self.#ident.stacked(), #f);),
                    quote!(self.#ident.map(&mut *#f)),
                )
            }
        };
        makes.push(quote!(#ident: #make));
        visits.push(visit);
        maps.push(quote!(#ident: #map));
    }
    quote! {
        #[allow(unused_variables)]
        impl ::gspmd::params::Params for #name {
            fn walk(#walk: &mut ::gspmd::params::Walk<'_>) -> ::gspmd::Result<Self> {
                ::std::result::Result::Ok(Self { #(#makes),* })
            }

            fn for_each_leaf(&self, #f: &mut dyn ::std::ops::FnMut(&::gspmd::ir::Tensor)) {
                #(#visits)*
            }

            fn map_leaves(
                &self,
                #f: &mut dyn ::std::ops::FnMut(&::gspmd::ir::Tensor) -> ::gspmd::ir::Tensor,
            ) -> Self {
                Self { #(#maps),* }
            }
        }
    }
}
