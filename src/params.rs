//! Parameter structs: the run-time side of [`macro@crate::params`].
//!
//! A struct under `#[gspmd::params]` implements [`Params`]: its leaves (`Tensor<..>`
//! fields, in field order, through nested structs, `Vec<Layer, N>` repeats and
//! `Stacked<Layer, N>` stacks) are a model's parameters, named by their field paths
//! (`layers.attn.wq`, `blocks.3.ffn.w1`). The macro generates only a walk over the
//! fields ([`Params::walk`], [`Params::for_each_leaf`], [`Params::map_leaves`]); names,
//! shapes, shardings and initialisers come from one [`Walk`], so they cannot disagree.
//!
//! **Why a run-time walk.** A proc macro sees one item: `#[gspmd::model]` cannot read the
//! struct's fields. The model therefore lists the struct's shape symbols where it takes
//! it (`#[params(V, D, L)] p: &LanguageModel`), which keeps the model's `Dims` a typed
//! struct with one field per symbol; at trace time the list is checked against the
//! symbols the walk meets ([`check_symbols`]), each mismatch an
//! [`Error::ParamsSymbol`] naming the symbol.

use gspmd_core::error::SymbolProblem;
use gspmd_core::ir::{Builder, DType, ScanOptions, Tensor};
use gspmd_core::sharding::{DimSharding, Sharding};
use gspmd_core::train::{Init, Initializer};
use gspmd_core::{Error, Result};

/// A struct of model parameters, implemented by `#[gspmd::params]`.
///
/// Leaves are visited in field order by all three generated methods; the provided
/// methods build on that order.
pub trait Params: Sized {
    /// Makes the struct with `walk`: each leaf from [`Walk::tensor`], each nested struct
    /// from [`Walk::nested`], each repeat from [`Walk::repeated`], each stack from
    /// [`Walk::stacked`], in field order.
    fn walk(walk: &mut Walk<'_>) -> Result<Self>;

    /// Calls `f` on each leaf, in field order.
    fn for_each_leaf(&self, f: &mut dyn FnMut(&Tensor));

    /// The same struct with each leaf replaced by `f(leaf)`, called in field order.
    fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self;

    /// The leaves, in field order (the order of the model's parameters).
    fn leaves(&self) -> Vec<Tensor> {
        let mut leaves = Vec::new();
        self.for_each_leaf(&mut |t| leaves.push(t.clone()));
        leaves
    }

    /// The shape symbols the struct's fields use (dims and lengths), in order of first
    /// appearance.
    fn symbols() -> Vec<&'static str> {
        let mut walk = Walk::new(Builder::new("params"), Mode::Pattern, "", "");
        // A pattern walk has no sizes to miss and so cannot fail.
        let _ = Self::walk(&mut walk);
        walk.symbols
    }

    /// Each leaf's declaration with the symbols sized by `sizes`, in field order.
    ///
    /// Errors: [`Error::ParamsSymbol`] for a symbol `sizes` does not give.
    fn declarations(sizes: &[(&str, usize)]) -> Result<Vec<Leaf>> {
        let lookup = |name: &str| sizes.iter().find(|(s, _)| *s == name).map(|(_, n)| *n);
        let name = std::any::type_name::<Self>();
        let mut walk = Walk::new(Builder::new(name), Mode::Declare(&lookup), "", name);
        Self::walk(&mut walk)?;
        Ok(walk.leaves)
    }

    /// An [`Initializer`] seeded `seed` with one rule per leaf that has an `#[init(..)]`:
    /// its exact name, or `blocks.*.w` for the leaves of a `Vec` repeat.
    fn initializer(seed: u64) -> Initializer {
        let mut walk = Walk::new(Builder::new("params"), Mode::Pattern, "", "");
        // A pattern walk cannot fail (see `symbols`).
        let _ = Self::walk(&mut walk);
        walk.leaves
            .into_iter()
            .filter_map(|leaf| Some((leaf.name, leaf.init?)))
            .fold(Initializer::new(seed), |init, (name, rule)| {
                init.rule(&name, rule)
            })
    }
}

/// One declared dim (or length) of a field: a shape symbol or a fixed size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// A shape symbol, by name.
    Symbol(&'static str),
    /// A fixed size.
    Fixed(usize),
}

/// One leaf as the walk declared it.
#[derive(Debug, Clone, PartialEq)]
pub struct Leaf {
    /// Its parameter name: the field path, dotted.
    pub name: String,
    /// Its declared dims, stacked dims first.
    pub dims: Vec<Size>,
    /// Its shape (symbols not yet sized are 1).
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Its `#[shard(..)]`, with a replicated dim per enclosing stack.
    pub sharding: Option<Sharding>,
    /// Its `#[init(..)]`, with fan-in dims shifted past the stacked dims.
    pub init: Option<Init>,
}

/// How a [`Walk`] sizes symbols.
#[derive(Clone, Copy)]
pub enum Mode<'a> {
    /// No sizes: symbols are recorded, dims are 1, each `Vec` repeat is walked once as
    /// element `*` (names become glob patterns).
    Pattern,
    /// Sizes bound so far: dims without a size are 1, but a `Vec` length must be sized.
    Bind(&'a dyn Fn(&str) -> Option<usize>),
    /// All sizes: a symbol without one is an error.
    Declare(&'a dyn Fn(&str) -> Option<usize>),
}

/// A walk over a parameter struct's fields, making each leaf a parameter of a builder.
pub struct Walk<'a> {
    builder: Builder,
    mode: Mode<'a>,
    /// The model and its parameter taking the struct, for errors.
    model: String,
    param: String,
    /// The field path so far.
    path: Vec<String>,
    /// The leading dims of the enclosing stacks, outermost first.
    stack: Vec<Size>,
    leaves: Vec<Leaf>,
    symbols: Vec<&'static str>,
}

impl<'a> Walk<'a> {
    /// A walk adding parameters to `builder`, for parameter `param` of model `model`.
    pub fn new(builder: Builder, mode: Mode<'a>, model: &str, param: &str) -> Self {
        Walk {
            builder,
            mode,
            model: model.to_string(),
            param: param.to_string(),
            path: Vec::new(),
            stack: Vec::new(),
            leaves: Vec::new(),
            symbols: Vec::new(),
        }
    }

    /// The leaves declared so far.
    pub fn leaves(&self) -> &[Leaf] {
        &self.leaves
    }

    /// Leaf `field` of the current struct: a parameter named by its path, of the stacked
    /// dims then `dims`, annotated with `sharding` (a replicated dim per stack prepended).
    ///
    /// Errors: as [`Walk::size`].
    #[track_caller]
    pub fn tensor(
        &mut self,
        field: &str,
        dims: &[Size],
        dtype: DType,
        sharding: Option<Sharding>,
        init: Option<Init>,
    ) -> Result<Tensor> {
        let stacked = self.stack.len();
        let dims: Vec<Size> = self.stack.iter().chain(dims).copied().collect();
        let shape = (dims.iter())
            .map(|&d| self.size(d, false))
            .collect::<Result<Vec<usize>>>()?;
        let name = self.name(field);
        let sharding = sharding.map(|mut s| {
            let replicated = (0..stacked).map(|_| DimSharding::closed(Vec::<String>::new()));
            s.dims.splice(0..0, replicated);
            s
        });
        let init = init.map(|init| match init {
            Init::FanIn { scale, in_dims } => Init::FanIn {
                scale,
                in_dims: in_dims.iter().map(|d| d + stacked).collect(),
            },
            Init::NormalFanIn { in_dims } => Init::NormalFanIn {
                in_dims: in_dims.iter().map(|d| d + stacked).collect(),
            },
            other => other,
        });
        let mut tensor = self.builder.parameter(&name, shape.clone(), dtype);
        if let Some(sharding) = &sharding {
            tensor = tensor.annotate(sharding.clone());
        }
        self.leaves.push(Leaf {
            name,
            dims,
            shape,
            dtype,
            sharding,
            init,
        });
        Ok(tensor)
    }

    /// Nested struct `field`: its leaves are named `field.leaf`.
    pub fn nested<T: Params>(&mut self, field: &str) -> Result<T> {
        self.path.push(field.to_string());
        let nested = T::walk(self);
        self.path.pop();
        nested
    }

    /// `len` copies of `T` in field `field`, copy `i` named `field.i.leaf`.
    ///
    /// Errors: as [`Walk::size`]; the length must be sized even when binding.
    pub fn repeated<T: Params>(&mut self, field: &str, len: Size) -> Result<Vec<T>> {
        let len = self.size(len, true)?;
        if let Mode::Pattern = self.mode {
            return Ok(vec![self.nested(&format!("{field}.*"))?]);
        }
        (0..len)
            .map(|i| self.nested(&format!("{field}.{i}")))
            .collect()
    }

    /// `T` stacked `len` times in field `field`: every leaf of `T` gets a leading dim of
    /// size `len` and is named `field.leaf`.
    ///
    /// Errors: as [`Walk::size`].
    pub fn stacked<T: Params>(&mut self, field: &str, len: Size) -> Result<Stacked<T>> {
        let size = self.size(len, false)?;
        self.stack.push(len);
        let layers = self.nested(field);
        self.stack.pop();
        Ok(Stacked {
            layers: layers?,
            len: size,
        })
    }

    /// The size of `size`, recording its symbol. Without a size (always in
    /// [`Mode::Pattern`], for a dim in [`Mode::Bind`]) a symbol is 1.
    ///
    /// Errors: [`Error::ParamsSymbol`] for a symbol without a size in
    /// [`Mode::Declare`], or for a length (`length`) in [`Mode::Bind`].
    pub fn size(&mut self, size: Size, length: bool) -> Result<usize> {
        let symbol = match size {
            Size::Fixed(n) => return Ok(n),
            Size::Symbol(symbol) => symbol,
        };
        if !self.symbols.contains(&symbol) {
            self.symbols.push(symbol);
        }
        let (sized, required) = match self.mode {
            Mode::Pattern => (None, false),
            Mode::Bind(sizes) => (sizes(symbol), length),
            Mode::Declare(sizes) => (sizes(symbol), true),
        };
        match sized {
            Some(n) => Ok(n),
            None if !required => Ok(1),
            None => Err(self.symbol_error(
                symbol,
                if length {
                    SymbolProblem::LengthUnsized
                } else {
                    SymbolProblem::NoSize
                },
            )),
        }
    }

    fn name(&self, field: &str) -> String {
        let mut name = self.path.join(".");
        if !name.is_empty() {
            name.push('.');
        }
        name.push_str(field);
        name
    }

    fn symbol_error(&self, symbol: &str, problem: SymbolProblem) -> Error {
        Error::ParamsSymbol {
            model: self.model.clone(),
            param: self.param.clone(),
            symbol: symbol.to_string(),
            problem,
        }
    }
}

/// Checks that `listed` (a model's `#[params(..)]` for its parameter `param`) names
/// exactly the shape symbols `T`'s fields use.
///
/// Errors: [`Error::ParamsSymbol`] for the first symbol the struct uses but the list
/// lacks, else the first listed one the struct does not use.
pub fn check_symbols<T: Params>(model: &str, param: &str, listed: &[&str]) -> Result<()> {
    let used = T::symbols();
    let error = |symbol: &str, problem: SymbolProblem| Error::ParamsSymbol {
        model: model.to_string(),
        param: param.to_string(),
        symbol: symbol.to_string(),
        problem,
    };
    let used_names = || used.iter().map(ToString::to_string).collect();
    if let Some(missing) = used.iter().find(|s| !listed.contains(s)) {
        let used = used_names();
        return Err(error(missing, SymbolProblem::NotListed { used }));
    }
    if let Some(extra) = listed.iter().find(|s| !used.contains(s)) {
        let used = used_names();
        return Err(error(extra, SymbolProblem::NotUsed { used }));
    }
    Ok(())
}

/// `T` stacked over a leading dim: each leaf of [`Stacked::stacked`] holds all layers.
/// A field `layers: Stacked<Block, L>` of a parameter struct.
#[derive(Debug, Clone)]
pub struct Stacked<T> {
    layers: T,
    len: usize,
}

impl<T: Params> Stacked<T> {
    /// The number of layers (the leading dim's size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for zero layers.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The struct whose leaves hold every layer (leading dim first).
    pub fn stacked(&self) -> &T {
        &self.layers
    }

    /// The same stack with each stacked leaf replaced by `f(leaf)` (which keeps the
    /// leading dim, e.g. a dtype conversion).
    pub fn map(&self, mut f: impl FnMut(&Tensor) -> Tensor) -> Self {
        Stacked {
            layers: self.layers.map_leaves(&mut f),
            len: self.len,
        }
    }

    /// Layer `l`: each leaf sliced at `l` along its leading dim, which is dropped. A
    /// Python-style loop `for l in 0..stack.len()` unrolls the layers in the program.
    pub fn layer(&self, l: usize) -> T {
        self.layers.map_leaves(&mut |w| {
            let rest = w.shape()[1..].to_vec();
            w.slice_axis(0, l, l + 1).reshape(rest)
        })
    }

    /// Runs `body(layer, carry)` over the layers in order as one `scan` op
    /// ([`Builder::scan`]): the body is traced once, whatever the number of layers.
    /// Returns the final carry. A stack without leaves and carry returns nothing.
    #[track_caller]
    pub fn scan(
        &self,
        init: &[Tensor],
        body: impl FnOnce(&T, &[Tensor]) -> Vec<Tensor>,
    ) -> Vec<Tensor> {
        self.scan_with(init, ScanOptions::default(), body)
    }

    /// [`Stacked::scan`] with `options` ([`Builder::scan_with`]): e.g. the layers
    /// rematerialised under a policy (`ScanOptions::new().remat(Remat::DotsSaveable)`
    /// keeps the matrix products for the backward pass).
    #[track_caller]
    pub fn scan_with(
        &self,
        init: &[Tensor],
        options: ScanOptions,
        body: impl FnOnce(&T, &[Tensor]) -> Vec<Tensor>,
    ) -> Vec<Tensor> {
        let xs = self.layers.leaves();
        let Some(builder) = xs.first().or(init.first()).map(Tensor::builder) else {
            return Vec::new();
        };
        let (carry, _) = builder.scan_with(&xs, init, options, |carry, x| {
            let mut slices = x.iter();
            let layer = self
                .layers
                .map_leaves(&mut |w| slices.next().unwrap_or(w).clone());
            (body(&layer, carry), Vec::new())
        });
        carry
    }
}

/// Walks `T` for its declarations only (a type-erased [`Params::walk`], which
/// [`dsl::ParamsDecl`](crate::dsl::ParamsDecl) holds).
pub fn describe<T: Params>(walk: &mut Walk<'_>) -> Result<()> {
    T::walk(walk).map(drop)
}
