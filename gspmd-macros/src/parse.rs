//! Parsing: the attribute's arguments and the model function into a [`Model`].
//!
//! Parsing is syntax only and never stops at the first problem: malformed specs and
//! tensor types, parameters that hold tensors without being one, duplicate or misplaced
//! `#[shard]`s (also inside macro calls), and what the body cannot contain (declared
//! dims, `?`) are collected in [`Errors`]. Every `#[shard]` is taken off the function,
//! so the function left in [`Model::func`] is plain Rust apart from its `Tensor<..>`
//! types.

use std::collections::HashSet;

use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::visit_mut::{self, VisitMut};
use syn::{
    Attribute, Expr, FnArg, GenericArgument, Ident, ItemFn, Lit, Pat, PathArguments, ReturnType,
    Token, Type, token,
};

use crate::errors::Errors;
use crate::spec::{self, ShardSpec};

/// The keys `#[gspmd::model(...)]` accepts.
pub const MODEL_KEYS: &str = "mesh, out";

/// The arguments of `#[gspmd::model(mesh = (...), out = ...)]`.
pub struct ModelArgs {
    /// `mesh = (axis, ...)`; `None` if missing.
    pub mesh: Option<Vec<Ident>>,
    /// `out = spec` or `out = [spec, ...]`.
    pub out: Option<OutSpecs>,
}

/// The output shardings given by `out = ...`.
pub struct OutSpecs {
    /// The `out` key, for errors.
    pub key: Ident,
    /// One spec per listed output.
    pub specs: Vec<ShardSpec>,
}

/// A parsed model function.
pub struct Model {
    /// The attribute's arguments; `None` if they did not parse (already reported).
    pub args: Option<ModelArgs>,
    /// The function, with every `#[shard]` removed.
    pub func: ItemFn,
    /// Its parameters, in order.
    pub params: Vec<Param>,
    /// The declared result; `None` if it is not a tensor or a tuple of them.
    pub output: Option<Output>,
    /// The `#[shard]`-annotated `let` statements of the body.
    pub lets: Vec<LetShard>,
}

/// One parameter of the model function.
pub struct Param {
    /// The parameter's pattern.
    pub pat: Pat,
    /// Its declared type.
    pub ty: Type,
    /// `Some` for a `Tensor<..>` parameter; `None` for a static argument.
    pub tensor: Option<TensorDecl>,
    /// Its `#[shard(...)]`, if any.
    pub shard: Option<Shard>,
    /// `Some` for a parameter struct `#[params(V, D)] p: &Model`.
    pub structure: Option<StructArg>,
}

/// A model parameter taking a parameter struct: `#[params(V, D)] p: &Model`.
pub struct StructArg {
    /// The `#[params(..)]` attribute, for spans.
    pub attr: Attribute,
    /// The struct's shape symbols as the model lists them.
    pub symbols: Vec<Ident>,
    /// The struct type (`Model` of `&Model`).
    pub ty: Type,
    /// True for `&Model`, false for `Model`.
    pub by_ref: bool,
}

/// A `#[shard(...)]` attribute and its parsed spec.
pub struct Shard {
    /// The attribute, for spans.
    pub attr: Attribute,
    /// The spec.
    pub spec: ShardSpec,
}

/// A declared tensor type `Tensor<B, 16, i32>`.
pub struct TensorDecl {
    /// Dims, major to minor.
    pub dims: Vec<DimDecl>,
    /// Element type.
    pub dtype: DType,
}

impl std::fmt::Display for TensorDecl {
    /// As the user writes it: `Tensor<B, 16, i32>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = self
            .dims
            .iter()
            .map(|d| match d {
                DimDecl::Symbol(s) => s.to_string(),
                DimDecl::Fixed(n) => n.to_string(),
            })
            .collect();
        match self.dtype {
            DType::F32 => {}
            DType::BF16 => parts.push("bf16".into()),
            DType::F16 => parts.push("f16".into()),
            DType::I32 => parts.push("i32".into()),
            DType::Bool => parts.push("bool".into()),
        }
        write!(f, "Tensor<{}>", parts.join(", "))
    }
}

/// True if `a` and `b` are the same Rust identifier (`r#B` is `B`).
pub fn same_ident(a: &Ident, b: &Ident) -> bool {
    a.unraw() == b.unraw()
}

/// One declared dim.
pub enum DimDecl {
    /// A shape symbol such as `B`, bound when tracing.
    Symbol(Ident),
    /// A fixed size.
    Fixed(usize),
}

/// The element types a tensor may declare.
#[derive(Clone, Copy)]
pub enum DType {
    /// `f32` (the default).
    F32,
    /// `bf16` (`gspmd::bf16`).
    BF16,
    /// `f16` (`gspmd::f16`).
    F16,
    /// `i32`.
    I32,
    /// `bool`.
    Bool,
}

/// The declared result: one tensor or a tuple of them.
pub struct Output {
    /// The return type as written.
    pub ty: Type,
    /// The declared tensors.
    pub tensors: Vec<TensorDecl>,
    /// True for a tuple (even of one).
    pub tuple: bool,
}

/// A `#[shard(...)] let name = init;` statement of the body.
pub struct LetShard {
    /// Position of the `let` among all `let`s of the body, in syntax-tree order.
    pub index: usize,
    /// The attribute and spec.
    pub shard: Shard,
    /// The bound name.
    pub binding: Ident,
}

impl Parse for ModelArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = ModelArgs {
            mesh: None,
            out: None,
        };
        let mut seen: Vec<Ident> = Vec::new();
        while !input.is_empty() {
            let key: Ident = input.parse()?;
            if seen.contains(&key) {
                return Err(syn::Error::new_spanned(
                    &key,
                    format!("`{key}` given twice: give each option once"),
                ));
            }
            input.parse::<Token![=]>()?;
            match key.to_string().as_str() {
                "mesh" => args.mesh = Some(spec::parse_axes(input)?),
                "out" => {
                    args.out = Some(OutSpecs {
                        key: key.clone(),
                        specs: parse_out(input)?,
                    })
                }
                _ => {
                    return Err(syn::Error::new_spanned(
                        &key,
                        format!("unknown model option `{key}`; valid options: {MODEL_KEYS}"),
                    ));
                }
            }
            seen.push(key);
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// `(spec)` for one output, `[(spec), ...]` for several.
fn parse_out(input: ParseStream) -> syn::Result<Vec<ShardSpec>> {
    let paren_spec = |input: ParseStream| -> syn::Result<ShardSpec> {
        if !input.peek(token::Paren) {
            return Err(input.error("expected an output sharding in parentheses, e.g. `(data, _)`"));
        }
        let content;
        syn::parenthesized!(content in input);
        content.parse()
    };
    if input.peek(token::Bracket) {
        let content;
        syn::bracketed!(content in input);
        let specs = content.parse_terminated(paren_spec, Token![,])?;
        Ok(specs.into_iter().collect())
    } else {
        Ok(vec![paren_spec(input)?])
    }
}

/// Parses the model: `attr` is the attribute's arguments, `func` the function.
pub fn model(attr: TokenStream, mut func: ItemFn, errors: &mut Errors) -> Model {
    let args = match syn::parse2::<ModelArgs>(attr) {
        Ok(args) => Some(args),
        Err(e) => {
            errors.push(e);
            None
        }
    };
    // A second `#[gspmd::model]` would expand the emitted function again.
    func.attrs.retain(|attr| {
        let path = attr.path();
        let again = path.is_ident("model")
            || (path.segments.len() == 2
                && path.segments[0].ident == "gspmd"
                && path.segments[1].ident == "model");
        if again {
            errors.spanned(attr, "`#[gspmd::model]` given twice: remove one");
        }
        !again
    });
    let params: Vec<Param> = func
        .sig
        .inputs
        .iter_mut()
        .filter_map(|arg| match arg {
            FnArg::Typed(pt) => Some(param(pt, errors)),
            FnArg::Receiver(_) => None,
        })
        .collect();
    let output = match &func.sig.output {
        ReturnType::Default => {
            errors.spanned(
                &func.sig.ident,
                "a model returns a `Tensor<..>` or a tuple of them: add `-> Tensor<..>`",
            );
            None
        }
        ReturnType::Type(_, ty) => output(ty, errors),
    };
    let mut lets = Body {
        errors,
        count: 0,
        found: Vec::new(),
        nested: 0,
        loop_body: None,
        rewritten: 0,
        symbols: symbol_sizes(&params),
        bound: bound_names(&func.block),
    };
    lets.visit_block_mut(&mut func.block);
    let lets = lets.found;
    // Misplaced `#[shard]`s were reported; without them the emitted function has no
    // follow-on errors. Taking an outer attribute off keeps the block well-formed.
    let mut misplaced = Vec::new();
    let stripped = strip_shards(func.block.to_token_stream(), &mut misplaced);
    if !misplaced.is_empty()
        && let Ok(block) = syn::parse2(stripped)
    {
        *func.block = block;
    }
    Model {
        args,
        func,
        params,
        output,
        lets,
    }
}

/// Takes the `#[shard]` attributes off `attrs`: the first parsed, the others errors.
pub fn take_shard(attrs: &mut Vec<Attribute>, errors: &mut Errors) -> Option<Shard> {
    let (shards, rest): (Vec<Attribute>, Vec<Attribute>) =
        std::mem::take(attrs).into_iter().partition(spec::is_shard);
    *attrs = rest;
    let mut shards = shards.into_iter();
    let first = shards.next()?;
    for dup in shards {
        errors.spanned(&dup, "duplicate `#[shard]`: give one sharding per value");
    }
    match spec::parse_attribute(&first) {
        Ok(spec) => Some(Shard { attr: first, spec }),
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

fn param(pt: &mut syn::PatType, errors: &mut Errors) -> Param {
    let shard = take_shard(&mut pt.attrs, errors);
    let structure = take_struct_arg(pt, errors);
    for attr in &pt.attrs {
        errors.spanned(
            attr,
            format!(
                "`#[{}]` on a model parameter: the generated `trace` passes every parameter, \
                 so none may be configured away or changed; only `#[shard(..)]` and \
                 `#[params(..)]` go on a parameter (put lint attributes such as `#[allow(..)]` \
                 on the function)",
                attr.path().to_token_stream()
            ),
        );
    }
    let tensor = tensor_decl(&pt.ty, errors);
    let plain_name = matches!(&*pt.pat, Pat::Ident(p) if p.subpat.is_none());
    if tensor.is_some() && !plain_name {
        errors.spanned(
            &pt.pat,
            "a tensor parameter must be a plain name, which names it in the program: \
             `w: Tensor<..>` (`_w` if the body does not use it)",
        );
    }
    if structure.is_some() && !plain_name {
        errors.spanned(
            &pt.pat,
            "a parameter struct must be bound to a plain name: `p: &Model`",
        );
    }
    if tensor.is_none()
        && structure.is_none()
        && !is_tensor_type(&pt.ty)
        && let Some(message) = holds_tensor(&pt.ty)
    {
        errors.spanned(&pt.ty, message);
    }
    Param {
        pat: (*pt.pat).clone(),
        ty: (*pt.ty).clone(),
        tensor,
        shard,
        structure,
    }
}

/// Takes `#[params(V, D)]` off a parameter: its symbols and the struct type it marks.
fn take_struct_arg(pt: &mut syn::PatType, errors: &mut Errors) -> Option<StructArg> {
    let position = pt.attrs.iter().position(|a| a.path().is_ident("params"))?;
    let attr = pt.attrs.remove(position);
    if let Some(dup) = pt.attrs.iter().position(|a| a.path().is_ident("params")) {
        let dup = pt.attrs.remove(dup);
        errors.spanned(
            &dup,
            "duplicate `#[params]`: give the struct's symbols once",
        );
    }
    let symbols = match &attr.meta {
        syn::Meta::Path(_) => Ok(Vec::new()),
        syn::Meta::List(list) => list
            .parse_args_with(syn::punctuated::Punctuated::<Ident, Token![,]>::parse_terminated)
            .map(|symbols| symbols.into_iter().collect())
            .map_err(|e| {
                syn::Error::new(
                    e.span(),
                    "expected the struct's shape symbols: `#[params(V, D, L)]`",
                )
            }),
        syn::Meta::NameValue(_) => Err(syn::Error::new_spanned(
            &attr,
            "expected the struct's shape symbols: `#[params(V, D, L)]`",
        )),
    };
    let symbols = match symbols {
        Ok(symbols) => symbols,
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    let (ty, by_ref) = match strip_group(&pt.ty) {
        Type::Reference(r) if r.mutability.is_none() && r.lifetime.is_none() => {
            ((*r.elem).clone(), true)
        }
        ty @ Type::Path(_) => (ty.clone(), false),
        _ => {
            errors.spanned(
                &pt.ty,
                "`#[params(..)]` marks a parameter struct, taken as `p: &Model` or `p: Model`",
            );
            return None;
        }
    };
    if is_tensor_type(&ty) {
        errors.spanned(
            &attr,
            "`#[params(..)]` on a tensor: it marks a parameter struct (`#[gspmd::params]`); \
             declare a tensor parameter as `x: Tensor<B, D>`",
        );
        return None;
    }
    Some(StructArg {
        attr,
        symbols,
        ty,
        by_ref,
    })
}

fn output(ty: &Type, errors: &mut Errors) -> Option<Output> {
    let mut result = |t: &Type| {
        if !is_tensor_type(t) {
            errors.spanned(
                t,
                "a model returns a `Tensor<..>` or a tuple of them, e.g. `-> Tensor<B, D>`",
            );
        }
        tensor_decl(t, errors)
    };
    let (tensors, tuple) = match strip_group(ty) {
        Type::Tuple(tuple) if !tuple.elems.is_empty() => {
            let tensors: Vec<Option<TensorDecl>> = tuple.elems.iter().map(&mut result).collect();
            (tensors.into_iter().collect::<Option<Vec<_>>>()?, true)
        }
        _ => (vec![result(ty)?], false),
    };
    Some(Output {
        ty: ty.clone(),
        tensors,
        tuple,
    })
}

/// If `ty` is not a `Tensor<..>` but holds one (`&Tensor<..>`, a tuple, `Vec`, array or
/// slice of them): what to write instead. A model parameter is traced as one tensor.
/// Behaviour (`impl Fn(&Tensor) -> Tensor`, `dyn ..`, `fn(..)`) is a static argument.
pub fn holds_tensor(ty: &Type) -> Option<&'static str> {
    fn inside(ty: &Type) -> bool {
        match strip_group(ty) {
            Type::Path(p) => {
                is_tensor_type(ty)
                    || p.path.segments.iter().any(|s| match &s.arguments {
                        PathArguments::AngleBracketed(a) => a
                            .args
                            .iter()
                            .any(|g| matches!(g, GenericArgument::Type(t) if inside(t))),
                        _ => false,
                    })
            }
            Type::Reference(r) => inside(&r.elem),
            Type::Ptr(p) => inside(&p.elem),
            Type::Tuple(t) => t.elems.iter().any(inside),
            Type::Array(a) => inside(&a.elem),
            Type::Slice(s) => inside(&s.elem),
            _ => false,
        }
    }
    if !inside(ty) {
        return None;
    }
    Some(match strip_group(ty) {
        Type::Reference(r) if is_tensor_type(&r.elem) => {
            "take a tensor parameter by value: `x: Tensor<B, D>`, not `&Tensor<B, D>` \
             (a `Tensor` is a cheap handle that `trace` creates)"
        }
        Type::Tuple(_) => {
            "a model parameter declares one tensor: give each tensor its own parameter \
             (`a: Tensor<B, D>, b: Tensor<B, D>`)"
        }
        _ => {
            "a model parameter declares one tensor, so a collection of tensors cannot be \
             traced: give each tensor its own parameter, or stack them into one tensor with \
             a leading dim (`ws: Tensor<L, D, D>`) and take layer `l` in the body with \
             `ws.slice_axis(0, l, l + 1)`"
        }
    })
}

pub fn strip_group(ty: &Type) -> &Type {
    match ty {
        Type::Group(g) => strip_group(&g.elem),
        Type::Paren(p) => strip_group(&p.elem),
        _ => ty,
    }
}

/// True if `ty`'s last path segment is `Tensor` (well-formed or not).
pub fn is_tensor_type(ty: &Type) -> bool {
    match strip_group(ty) {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "Tensor"),
        _ => false,
    }
}

/// `Some` if `ty` is a well-formed `Tensor<..>`; a malformed one is reported and `None`.
/// Any type whose last path segment is not `Tensor` is not a tensor: `None`, no error.
pub fn tensor_decl(ty: &Type, errors: &mut Errors) -> Option<TensorDecl> {
    let Type::Path(path) = strip_group(ty) else {
        return None;
    };
    let segment = path.path.segments.last()?;
    if !is_tensor_type(ty) {
        return None;
    }
    let args = match &segment.arguments {
        PathArguments::AngleBracketed(args) => args,
        // `Tensor<>` is an f32 scalar, and rustfmt writes it `Tensor`.
        PathArguments::None => {
            return Some(TensorDecl {
                dims: Vec::new(),
                dtype: DType::F32,
            });
        }
        PathArguments::Parenthesized(_) => {
            errors.spanned(
                ty,
                "declare the tensor's dims in angle brackets: `Tensor<B, D>`",
            );
            return None;
        }
    };
    let mut dims = Vec::new();
    let mut dtype = None;
    let count = args.args.len();
    let mut ok = true;
    for (i, arg) in args.args.iter().enumerate() {
        let last = i + 1 == count;
        match generic_dim(arg) {
            Some(Ok(DimDecl::Symbol(ident))) => match element_type(&ident) {
                Some(Ok(dt)) if last => dtype = Some(dt),
                Some(Ok(_)) => {
                    errors.spanned(
                        &ident,
                        "the element type must come last: `Tensor<B, D, i32>`",
                    );
                    ok = false;
                }
                Some(Err(message)) => {
                    errors.spanned(&ident, message);
                    ok = false;
                }
                None => dims.push(DimDecl::Symbol(ident)),
            },
            Some(Ok(fixed)) => dims.push(fixed),
            Some(Err(e)) => {
                errors.push(e);
                ok = false;
            }
            None => {
                errors.spanned(
                    arg,
                    "expected a dim (a shape symbol such as `B` or a size such as `16`) \
                     or, last, an element type (`f32`, `i32`, `bool`)",
                );
                ok = false;
            }
        }
    }
    ok.then(|| TensorDecl {
        dims,
        dtype: dtype.unwrap_or(DType::F32),
    })
}

/// A single identifier or an integer literal; `None` for anything else.
fn generic_dim(arg: &GenericArgument) -> Option<syn::Result<DimDecl>> {
    match arg {
        GenericArgument::Type(Type::Path(p)) if p.qself.is_none() => {
            p.path.get_ident().map(|i| match i.to_string().as_str() {
                "Self" | "self" | "super" | "crate" => Err(syn::Error::new_spanned(
                    i,
                    format!(
                        "`{i}` is a keyword, not a shape symbol: name the dim with a symbol \
                         such as `N`, or give its size such as `16`"
                    ),
                )),
                _ => Ok(DimDecl::Symbol(i.clone())),
            })
        }
        GenericArgument::Const(Expr::Lit(lit)) => match &lit.lit {
            Lit::Int(int) => Some(int.base10_parse().map(DimDecl::Fixed).map_err(|_| {
                let message = if int.base10_digits().starts_with('-') {
                    "a dim size is a non-negative integer such as `16`; a dim whose size is \
                     set when tracing is a shape symbol such as `N`"
                        .to_string()
                } else {
                    format!("dim size `{int}` does not fit in `usize`")
                };
                syn::Error::new_spanned(int, message)
            })),
            _ => None,
        },
        _ => None,
    }
}

/// `Some(Ok)` for a supported element type, `Some(Err)` for another primitive type,
/// `None` for a name that is a shape symbol.
fn element_type(ident: &Ident) -> Option<Result<DType, String>> {
    let name = ident.to_string();
    match name.as_str() {
        "f32" => Some(Ok(DType::F32)),
        "i32" => Some(Ok(DType::I32)),
        "bool" => Some(Ok(DType::Bool)),
        "bf16" => Some(Ok(DType::BF16)),
        "f16" => Some(Ok(DType::F16)),
        "f64" | "f128" | "i8" | "i16" | "i64" | "i128" | "isize" | "u8" | "u16" | "u32" | "u64"
        | "u128" | "usize" | "char" | "str" => Some(Err(format!(
            "unsupported element type `{name}`; gspmd tensors are `f32`, `bf16`, `f16`, `i32` or `bool`"
        ))),
        _ => None,
    }
}

/// Scans the body: takes `#[shard]` off `let` statements (recording them) and reports
/// it anywhere else, including inside macro calls (whose tokens it is removed from);
/// reports declared dims (`Tensor<B, D>`) and, outside closures and nested items, `?`.
struct Body<'a> {
    errors: &'a mut Errors,
    count: usize,
    found: Vec<LetShard>,
    /// Depth of closures, `async` blocks and items: they have their own return type.
    nested: usize,
    /// The loop method (`scan`, `fori_loop`, ...) whose body closure is being visited
    /// (at `nested` 0: a loop body is traced as part of the model, not called).
    loop_body: Option<String>,
    /// How many `?`s and symbols used as values were reported and rewritten.
    rewritten: usize,
    /// Each shape symbol with where its size is, e.g. `x.shape()[1]`.
    symbols: Vec<(String, String)>,
    /// Every name a pattern of the body binds: a symbol's name bound there is a value.
    bound: HashSet<String>,
}

/// The methods whose closure arguments are bodies traced into a region of the program:
/// the builder's loops, `cond` and `shard_map`, and a stacked parameter struct's `scan`.
const TRACED_BODIES: [&str; 7] = [
    "scan",
    "scan_reverse",
    "scan_with",
    "fori_loop",
    "while_loop",
    "cond",
    "shard_map",
];

/// Each shape symbol of the tensor parameters with where its size is while tracing
/// (`x.shape()[1]` for the first parameter and dim declaring it); a symbol only a
/// parameter struct uses says to read it from one of its tensors.
fn symbol_sizes(params: &[Param]) -> Vec<(String, String)> {
    let mut sizes: Vec<(String, String)> = Vec::new();
    for p in params {
        let Pat::Ident(name) = &p.pat else { continue };
        if let Some(tensor) = &p.tensor {
            for (dim, d) in tensor.dims.iter().enumerate() {
                if let DimDecl::Symbol(s) = d {
                    let symbol = s.unraw().to_string();
                    if !sizes.iter().any(|(n, _)| *n == symbol) {
                        let at = format!(
                            "`{}.shape()[{dim}]` (parameter `{}: {tensor}`)",
                            name.ident, name.ident
                        );
                        sizes.push((symbol, at));
                    }
                }
            }
        }
        if let Some(structure) = &p.structure {
            for s in &structure.symbols {
                let symbol = s.unraw().to_string();
                if !sizes.iter().any(|(n, _)| *n == symbol) {
                    let at = format!(
                        "the `.shape()` of a tensor of `{}` declared with it",
                        name.ident
                    );
                    sizes.push((symbol, at));
                }
            }
        }
    }
    sizes
}

/// Every name bound by a pattern in `block` (`let`, closure parameters, `for`, `match`
/// arms), and every constant, static and `use` it declares.
fn bound_names(block: &syn::Block) -> HashSet<String> {
    struct Names(HashSet<String>);
    impl syn::visit::Visit<'_> for Names {
        fn visit_pat_ident(&mut self, p: &syn::PatIdent) {
            self.0.insert(p.ident.unraw().to_string());
            syn::visit::visit_pat_ident(self, p);
        }
        fn visit_item_const(&mut self, item: &syn::ItemConst) {
            self.0.insert(item.ident.unraw().to_string());
            syn::visit::visit_item_const(self, item);
        }
        fn visit_item_static(&mut self, item: &syn::ItemStatic) {
            self.0.insert(item.ident.unraw().to_string());
            syn::visit::visit_item_static(self, item);
        }
        fn visit_use_name(&mut self, name: &syn::UseName) {
            self.0.insert(name.ident.unraw().to_string());
        }
        fn visit_use_rename(&mut self, rename: &syn::UseRename) {
            self.0.insert(rename.rename.unraw().to_string());
        }
    }
    let mut names = Names(HashSet::new());
    syn::visit::Visit::visit_block(&mut names, block);
    names.0
}

impl Body<'_> {
    fn shard_let(&mut self, index: usize, shard: Shard, local: &syn::Local) {
        let (pat, ty) = match &local.pat {
            Pat::Type(t) => (&*t.pat, Some(&*t.ty)),
            other => (other, None),
        };
        let binding = match pat {
            Pat::Ident(p) if p.subpat.is_none() => Some(p.ident.clone()),
            _ => None,
        };
        if binding.is_none() {
            self.errors.spanned(
                pat,
                "`#[shard]` annotates one tensor bound to one name: write \
                 `#[shard(..)] let h = ..;` and destructure after, or give each part its \
                 own `#[shard(..)] let`",
            );
        }
        if let Some(ty) = ty
            && !matches!(ty, Type::Infer(_))
            && !is_tensor_type(ty)
        {
            self.errors.spanned(
                &shard.attr,
                format!(
                    "`#[shard]` on `{}: {}`, which is not a tensor; only tensors can be sharded",
                    pat.to_token_stream(),
                    ty.to_token_stream()
                ),
            );
        }
        match &local.init {
            None => self.errors.spanned(
                &shard.attr,
                "`#[shard]` on a `let` needs a value: `let h = ...;`",
            ),
            Some(init) if init.diverge.is_some() => self
                .errors
                .spanned(&shard.attr, "`#[shard]` cannot annotate a `let ... else`"),
            Some(_) => {
                if let Some(binding) = binding {
                    self.found.push(LetShard {
                        index,
                        shard,
                        binding,
                    });
                }
            }
        }
    }

    fn nested(&mut self, visit: impl FnOnce(&mut Self)) {
        self.nested += 1;
        visit(self);
        self.nested -= 1;
    }
}

impl VisitMut for Body<'_> {
    fn visit_local_mut(&mut self, local: &mut syn::Local) {
        let index = self.count;
        self.count += 1;
        if let Some(shard) = take_shard(&mut local.attrs, self.errors) {
            self.shard_let(index, shard, local);
        }
        visit_mut::visit_local_mut(self, local);
    }

    fn visit_attribute_mut(&mut self, attr: &mut Attribute) {
        if spec::is_shard(attr) {
            self.errors.spanned(
                &*attr,
                "`#[shard]` annotates a model parameter or a `let` statement only; to shard \
                 a result, bind it (`#[shard(..)] let y = ..; y`) or use `out = (..)`",
            );
        }
    }

    fn visit_macro_mut(&mut self, mac: &mut syn::Macro) {
        let mut found = Vec::new();
        mac.tokens = strip_shards(std::mem::take(&mut mac.tokens), &mut found);
        for attr in found {
            self.errors.spanned(
                attr,
                "`#[shard]` inside a macro call is not seen by `#[gspmd::model]` \
                 (a macro's arguments are opaque tokens): bind the value first, \
                 `#[shard(..)] let h = ..;`, and pass `h` to the macro",
            );
        }
        // Arguments that are expressions (`vec![..]`, `assert!(..)`) are checked like
        // the body; the tokens are rewritten only where something was reported.
        let before = self.rewritten;
        let parser = Punctuated::<Expr, Token![,]>::parse_terminated;
        if let Ok(mut args) = mac.parse_body_with(parser) {
            for arg in &mut args {
                self.visit_expr_mut(arg);
            }
            if self.rewritten > before {
                mac.tokens = args.to_token_stream();
            }
        }
        visit_mut::visit_macro_mut(self, mac);
    }

    /// Reports declared dims and drops them, so the emitted function has no follow-on
    /// errors.
    fn visit_type_path_mut(&mut self, ty: &mut syn::TypePath) {
        visit_mut::visit_type_path_mut(self, ty);
        if let Some(last) = ty.path.segments.last_mut()
            && last.ident == "Tensor"
            && let PathArguments::AngleBracketed(args) = &last.arguments
            && !args.args.is_empty()
        {
            self.errors.spanned(
                args,
                "dims are declared on the model's parameters and result only: in the body \
                 write `Tensor` (or leave the type out); shapes are checked when tracing",
            );
            last.arguments = PathArguments::None;
        }
    }

    /// Reports `?` (in the body or a loop body) and a shape symbol used as a value,
    /// and removes them, so the emitted function has no follow-on errors.
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        if self.nested == 0
            && let Expr::Try(e) = expr
        {
            let message = match &self.loop_body {
                None => "`?` in a model body: the model returns tensors, not a `Result`. \
                         Tensor ops need no `?` (tracing records shape errors and `trace` \
                         returns them); handle other errors before tracing and pass the \
                         value as an argument"
                    .to_string(),
                Some(method) => format!(
                    "`?` in the body of `{method}`: the body is a closure traced once into \
                     the program, returning tensors, not a `Result`. Tensor ops \
                     need no `?`: tracing records their shape errors at your line and `trace` \
                     returns them; compute anything else that can fail before the model \
                     (pass it as an argument) or before the `{method}` (capture the value)"
                ),
            };
            self.errors.spanned(e.question_token, message);
            self.rewritten += 1;
            *expr = (*e.expr).clone();
        }
        if let Expr::Path(path) = expr
            && path.qself.is_none()
            && let Some(ident) = path.path.get_ident()
            && let name = ident.unraw().to_string()
            && !self.bound.contains(&name)
            && let Some((_, at)) = self.symbols.iter().find(|(s, _)| *s == name)
        {
            self.errors.spanned(
                &*path,
                format!(
                    "`{name}` is a shape symbol: it names a dim in the model's tensor types, \
                     not a value (a model takes no const generics). Its size while tracing \
                     is {at}"
                ),
            );
            self.rewritten += 1;
            *expr = syn::parse_quote!(0usize);
            return;
        }
        visit_mut::visit_expr_mut(self, expr);
    }

    /// A closure given to a loop or branch method ([`TRACED_BODIES`]) is visited as part
    /// of the body (its `?` is an error); other arguments as usual.
    fn visit_expr_method_call_mut(&mut self, call: &mut syn::ExprMethodCall) {
        let method = call.method.to_string();
        if self.nested > 0 || !TRACED_BODIES.contains(&method.as_str()) {
            return visit_mut::visit_expr_method_call_mut(self, call);
        }
        for attr in &mut call.attrs {
            self.visit_attribute_mut(attr);
        }
        self.visit_expr_mut(&mut call.receiver);
        for arg in &mut call.args {
            match arg {
                Expr::Closure(closure) => {
                    let outer = self.loop_body.replace(method.clone());
                    visit_mut::visit_expr_closure_mut(self, closure);
                    self.loop_body = outer;
                }
                other => self.visit_expr_mut(other),
            }
        }
    }

    fn visit_expr_closure_mut(&mut self, expr: &mut syn::ExprClosure) {
        let outer = self.loop_body.take();
        self.nested(|v| visit_mut::visit_expr_closure_mut(v, expr));
        self.loop_body = outer;
    }

    fn visit_expr_async_mut(&mut self, expr: &mut syn::ExprAsync) {
        self.nested(|v| visit_mut::visit_expr_async_mut(v, expr));
    }

    fn visit_item_mut(&mut self, item: &mut syn::Item) {
        self.nested(|v| visit_mut::visit_item_mut(v, item));
    }
}

/// `tokens` without its `#[shard..]` / `#![shard..]` attributes, at any depth; each one
/// removed is added to `found`.
fn strip_shards(tokens: TokenStream, found: &mut Vec<TokenStream>) -> TokenStream {
    let mut out: Vec<TokenTree> = Vec::new();
    let mut iter = tokens.into_iter().peekable();
    while let Some(tree) = iter.next() {
        match tree {
            TokenTree::Punct(p) if p.as_char() == '#' => {
                let mut ahead = iter.clone();
                let bang = matches!(ahead.peek(), Some(TokenTree::Punct(b)) if b.as_char() == '!');
                if bang {
                    ahead.next();
                }
                let is_shard = matches!(ahead.peek(), Some(TokenTree::Group(g))
                    if g.delimiter() == Delimiter::Bracket
                        && matches!(g.stream().into_iter().next(),
                            Some(TokenTree::Ident(i)) if i == "shard"));
                if !is_shard {
                    out.push(TokenTree::Punct(p));
                    continue;
                }
                let attr_len = if bang { 2 } else { 1 };
                let attr = std::iter::once(TokenTree::Punct(p))
                    .chain(iter.by_ref().take(attr_len))
                    .collect();
                found.push(attr);
            }
            TokenTree::Group(g) => {
                let mut inner = Group::new(g.delimiter(), strip_shards(g.stream(), found));
                inner.set_span(g.span());
                out.push(TokenTree::Group(inner));
            }
            other => out.push(other),
        }
    }
    out.into_iter().collect()
}
