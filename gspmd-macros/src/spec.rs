//! The sharding spec language of `#[shard(...)]` and `out = ...`, JAX `PartitionSpec`
//! style: one entry per tensor dim, then `key = value` options.
//!
//! ```text
//! spec    := entry ("," entry)* ","?
//! entry   := dim | option
//! dim     := ("_" | "?" | axis "?"? | "(" axis ("," axis)* ")" "?"?) ("@" INT)?
//! option  := "priority" "=" INT | "unreduced" "=" axes | "replicated" "=" axes
//!          | "name" "=" STRING
//! axes    := axis | "(" axis ("," axis)* ")"
//! axis    := NAME (":" "(" INT ")" INT)?       (a sub-axis `model:(pre)size`)
//! ```
//!
//! `_` is a replicated closed dim, `?` an open dim propagation may fill, `data` a dim
//! split over mesh axis `data`, `(data, model)` a dim split over both (major to minor);
//! a trailing `?` leaves a dim with axes open, `@N` gives it user priority `N` (0 is
//! the highest); `model:(1)2` is a sub-axis (Shardy's `axis:(pre)size`: the digit of
//! `size` values of `model` after its major digits of product `pre`). This module only
//! parses; names are checked in `validate`.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Ident, LitInt, LitStr, Token, token};

/// The keys an option entry may have.
pub const OPTION_KEYS: &str = "priority, unreduced, replicated, name";

/// A parsed sharding spec.
pub struct ShardSpec {
    /// One entry per tensor dim.
    pub dims: Vec<DimSpec>,
    /// `priority = N`: the priority of every dim without its own `@N`.
    pub priority: Option<u32>,
    /// `unreduced = (...)`: axes along which the value is a pending partial sum.
    pub unreduced: Vec<AxisSpec>,
    /// `replicated = (...)`: axes the value is explicitly replicated over.
    pub replicated: Vec<AxisSpec>,
    /// `name = "..."`: a name for reports.
    pub name: Option<LitStr>,
    /// The spec's tokens, for errors about the spec as a whole.
    pub tokens: TokenStream,
}

/// One dim of a spec.
pub struct DimSpec {
    /// Mesh axes or sub-axes, major to minor; empty for `_` and `?`.
    pub axes: Vec<AxisSpec>,
    /// True for `?` and a trailing `?`.
    pub open: bool,
    /// `@N`.
    pub priority: Option<u32>,
}

/// A mesh axis, or a sub-axis `model:(pre)size` of one, as written in a spec.
pub struct AxisSpec {
    /// The mesh axis (without `r#`).
    pub name: Ident,
    /// `(pre, size)` of a sub-axis; `None` for the whole axis.
    pub sub: Option<(usize, usize)>,
    /// The tokens written, for errors.
    pub tokens: TokenStream,
}

impl std::fmt::Display for AxisSpec {
    /// `model` or `model:(1)2`: the name the sharding gets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.sub {
            Some((pre, size)) => write!(f, "{}:({pre}){size}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

impl ToTokens for AxisSpec {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        self.tokens.to_tokens(tokens);
    }
}

impl ShardSpec {
    /// Every axis the spec names, in order of appearance (dims, unreduced, replicated).
    pub fn axes(&self) -> impl Iterator<Item = &AxisSpec> {
        self.dims
            .iter()
            .flat_map(|d| &d.axes)
            .chain(&self.unreduced)
            .chain(&self.replicated)
    }
}

impl Parse for ShardSpec {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let tokens: TokenStream = input.fork().parse()?;
        let mut spec = ShardSpec {
            dims: Vec::new(),
            priority: None,
            unreduced: Vec::new(),
            replicated: Vec::new(),
            name: None,
            tokens,
        };
        let mut seen_keys: Vec<Ident> = Vec::new();
        while !input.is_empty() {
            if input.peek(Ident) && input.peek2(Token![=]) {
                let key: Ident = input.parse()?;
                input.parse::<Token![=]>()?;
                if seen_keys.contains(&key) {
                    return Err(syn::Error::new_spanned(
                        &key,
                        format!("option `{key}` given twice: give each option once"),
                    ));
                }
                parse_option(&key, input, &mut spec)?;
                seen_keys.push(key);
            } else {
                if let Some(key) = seen_keys.first() {
                    return Err(syn::Error::new(
                        input.span(),
                        format!("dims must come before options such as `{key} = ...`"),
                    ));
                }
                spec.dims.push(input.parse()?);
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(spec)
    }
}

fn parse_option(key: &Ident, input: ParseStream, spec: &mut ShardSpec) -> syn::Result<()> {
    match key.to_string().as_str() {
        "priority" => spec.priority = Some(parse_priority(input)?),
        "unreduced" => spec.unreduced = parse_list(input, parse_axis_spec)?,
        "replicated" => spec.replicated = parse_list(input, parse_axis_spec)?,
        "name" => {
            let name = input.parse().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    "expected the value's name as a string: `name = \"h\"`",
                )
            })?;
            spec.name = Some(name);
        }
        _ => {
            return Err(syn::Error::new_spanned(
                key,
                format!("unknown sharding option `{key}`; valid options: {OPTION_KEYS}"),
            ));
        }
    }
    Ok(())
}

/// A priority: an integer literal that fits `u32`.
fn parse_priority(input: ParseStream) -> syn::Result<u32> {
    let message = format!(
        "a priority is an integer from 0 (the highest) to {} (`u32::MAX`)",
        u32::MAX
    );
    let lit: LitInt = input
        .parse()
        .map_err(|e| syn::Error::new(e.span(), &message))?;
    lit.base10_parse::<u32>()
        .map_err(|_| syn::Error::new_spanned(&lit, &message))
}

/// `axis` or `(axis, ...)`: mesh axis names (of `mesh = ...`).
pub fn parse_axes(input: ParseStream) -> syn::Result<Vec<Ident>> {
    parse_list(input, parse_axis)
}

/// `item` or `(item, ...)`.
fn parse_list<T>(
    input: ParseStream,
    item: fn(ParseStream) -> syn::Result<T>,
) -> syn::Result<Vec<T>> {
    if input.peek(token::Paren) {
        let content;
        let paren = syn::parenthesized!(content in input);
        let items: Punctuated<T, Token![,]> = content.parse_terminated(item, Token![,])?;
        if items.is_empty() {
            return Err(syn::Error::new(
                paren.span.join(),
                "empty axis list: name at least one mesh axis, e.g. `(data)`",
            ));
        }
        Ok(items.into_iter().collect())
    } else {
        Ok(vec![item(input)?])
    }
}

/// A mesh axis name, then `:(pre)size` for a sub-axis.
fn parse_axis_spec(input: ParseStream) -> syn::Result<AxisSpec> {
    let name = parse_axis(input)?;
    let mut tokens = name.to_token_stream();
    if !input.peek(Token![:]) || input.peek(Token![::]) {
        return Ok(AxisSpec {
            name,
            sub: None,
            tokens,
        });
    }
    let colon: Token![:] = input.parse()?;
    let wanted = "expected `(pre)size` after `:`: a sub-axis is written `model:(1)2`";
    if !input.peek(token::Paren) {
        return Err(input.error(wanted));
    }
    let content;
    let paren = syn::parenthesized!(content in input);
    let pre: LitInt = content
        .parse()
        .map_err(|e| syn::Error::new(e.span(), wanted))?;
    let size: LitInt = input
        .parse()
        .map_err(|e| syn::Error::new(e.span(), wanted))?;
    colon.to_tokens(&mut tokens);
    paren.surround(&mut tokens, |t| pre.to_tokens(t));
    size.to_tokens(&mut tokens);
    Ok(AxisSpec {
        name,
        sub: Some((pre.base10_parse()?, size.base10_parse()?)),
        tokens,
    })
}

/// One mesh axis name: an identifier other than `_`. The name is the identifier's text
/// without `r#`: `r#type` (and `type`) name the axis `type`, as printed shardings and
/// [`Mesh`](gspmd_core::sharding::Mesh) show it.
fn parse_axis(input: ParseStream) -> syn::Result<Ident> {
    if input.peek(Token![_]) {
        return Err(
            input.error("`_` stands for a whole replicated dim, not for an axis inside `( )`")
        );
    }
    if input.peek(Token![?]) {
        return Err(input.error(
            "`?` inside `( )`: to leave a dim with axes open, put `?` after the list: \
             `(data, model)?`",
        ));
    }
    if input.peek(token::Paren) {
        return Err(input.error(
            "axis lists do not nest: list a dim's axes flat, major to minor: \
             `(data, model, pipe)`",
        ));
    }
    if input.peek(syn::Lit) {
        return Err(input.error(
            "a mesh axis is a name such as `data`, not a literal; sizes are given when \
             building the mesh (`model_name::mesh([2, 4])`)",
        ));
    }
    input
        .call(Ident::parse_any)
        .map(|axis| axis.unraw())
        .map_err(|e| syn::Error::new(e.span(), "expected a mesh axis name such as `data`"))
}

impl Parse for DimSpec {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut dim = if input.peek(Token![_]) {
            input.parse::<Token![_]>()?;
            DimSpec {
                axes: Vec::new(),
                open: false,
                priority: None,
            }
        } else if input.peek(Token![?]) {
            input.parse::<Token![?]>()?;
            DimSpec {
                axes: Vec::new(),
                open: true,
                priority: None,
            }
        } else if input.peek(Ident::peek_any) || input.peek(token::Paren) {
            let axes = parse_list(input, parse_axis_spec)?;
            let open = input.peek(Token![?]);
            if open {
                input.parse::<Token![?]>()?;
            }
            DimSpec {
                axes,
                open,
                priority: None,
            }
        } else {
            return Err(input.error(
                "expected a dim: `_` (replicated), `?` (open), a mesh axis, \
                 `(axis, ...)`, or an option `key = value`",
            ));
        };
        if input.peek(Token![@]) {
            input.parse::<Token![@]>()?;
            dim.priority = Some(parse_priority(input)?);
        }
        Ok(dim)
    }
}

/// Parses the arguments of a `#[shard(...)]` attribute. `#[shard]` and
/// `#[shard = ...]` are errors.
pub fn parse_attribute(attr: &syn::Attribute) -> syn::Result<ShardSpec> {
    match &attr.meta {
        syn::Meta::List(list) => list.parse_args(),
        _ => Err(syn::Error::new_spanned(
            attr,
            "expected `#[shard(dim, ...)]`, e.g. `#[shard(data, _)]`",
        )),
    }
}

/// True if `attr` is `#[shard...]`.
pub fn is_shard(attr: &syn::Attribute) -> bool {
    attr.path().is_ident("shard")
}
