//! The language model of [`super`] under axlearn's mesh rule: mesh axes `data`, `fsdp`
//! and `model`; every weight split over `fsdp` (its model dim) and `model` (its heads,
//! FFN hidden dim or vocabulary), the batch over `(data, fsdp)`. Each device stores
//! `1/(fsdp*model)` of every weight; before use the weight is all-gathered over `fsdp`
//! and its gradient reduce-scattered back (fully sharded data parallelism, ZeRO-3),
//! while `data` is plain data parallelism (weights replicated, gradients all-reduced).
//!
//! The layer math is the LM's ([`pre_norm_layer()`], [`language_model_loss()`]); only
//! the shardings differ: the parameter structs here declare axlearn's, the model
//! functions pin the activations with the batch over `(data, fsdp)`. Parameter names
//! and initialisers are the LM's, so the same checkpoint names and `#[init]`s apply.

use super::{dropout_at, language_model_loss, pre_norm_layer};
use crate::ir::{DType, Tensor};
use crate::params::Stacked;

/// One layer's attention weights `wq, wk, wv: [D, H, K]`, `wo: [H, K, D]`: the model
/// dim over `fsdp`, heads over `model`.
#[crate::params(mesh = (data, fsdp, model))]
pub struct Attention {
    /// Queries.
    #[shard(fsdp, model, _)]
    #[init(fan_in(0))]
    pub wq: Tensor<D, H, K>,
    /// Keys.
    #[shard(fsdp, model, _)]
    #[init(fan_in(0))]
    pub wk: Tensor<D, H, K>,
    /// Values.
    #[shard(fsdp, model, _)]
    #[init(fan_in(0))]
    pub wv: Tensor<D, H, K>,
    /// The output projection.
    #[shard(model, _, fsdp)]
    #[init(fan_in(0, 1))]
    pub wo: Tensor<H, K, D>,
}

/// One layer's FFN weights `w1: [D, F]`, `w2: [F, D]`: the model dim over `fsdp`, the
/// hidden dim over `model`.
#[crate::params(mesh = (data, fsdp, model))]
pub struct Ffn {
    /// Into the hidden dim.
    #[shard(fsdp, model)]
    #[init(fan_in(0))]
    pub w1: Tensor<D, F>,
    /// Out of the hidden dim.
    #[shard(model, fsdp)]
    #[init(fan_in(0))]
    pub w2: Tensor<F, D>,
}

/// One layer's weights: `attn.{wq,wk,wv,wo}`, `ffn.{w1,w2}`.
#[crate::params(mesh = (data, fsdp, model))]
pub struct Block {
    /// Self-attention.
    pub attn: Attention,
    /// Feed-forward.
    pub ffn: Ffn,
}

/// The language model's weights under axlearn's rule: `embed: [V, D]` (vocabulary over
/// `model`, the model dim over `fsdp`), `position: [S, D]` (the model dim over
/// `fsdp`), the stacked `layers` and `unembed: [D, V]`.
#[crate::params(mesh = (data, fsdp, model))]
pub struct LanguageModel {
    /// The token embedding table.
    #[shard(model, fsdp)]
    #[init(uniform(1.0))]
    pub embed: Tensor<V, D>,
    /// The position table.
    #[shard(_, fsdp)]
    #[init(uniform(1.0))]
    pub position: Tensor<S, D>,
    /// The layers.
    pub layers: Stacked<Block, L>,
    /// The output projection to the vocabulary.
    #[shard(fsdp, model)]
    #[init(fan_in(0))]
    pub unembed: Tensor<D, V>,
}

/// One pre-norm layer ([`pre_norm_layer()`]), number `layer`, its activations pinned
/// with the batch over `(data, fsdp)` and the FFN's hidden dim over `model`; residual
/// dropout at `rate` from `key` as [`super::block()`]'s.
#[crate::model(mesh = (data, fsdp, model))]
pub fn block(
    x: Tensor<B, S, D>,
    #[params(D, H, K, F)] w: &Block,
    key: Tensor<2, i32>,
    rate: f64,
    layer: usize,
) -> Tensor<B, S, D> {
    let Attention { wq, wk, wv, wo } = &w.attn;
    let ffn = [&w.ffn.w1, &w.ffn.w2];
    let pin_attended = |y: Tensor| {
        #[shard((data, fsdp), _, _)]
        let attended = y;
        attended
    };
    let pin_hidden = |h: Tensor| {
        #[shard((data, fsdp), _, model)]
        let hidden = h;
        hidden
    };
    let site = 2 * layer as u32;
    let drop = |t: &Tensor, i: u32| dropout_at(t, rate, &key, site + i);
    pre_norm_layer(&x, [wq, wk, wv, wo], ffn, pin_attended, pin_hidden, drop)
}

/// The language model's loss ([`language_model_loss()`]) under axlearn's mesh rule:
/// the parameters are named as [`super::language_model()`]'s (`tokens`, `targets`,
/// `weights`, `embed`, `position`, `layers.attn.*`, `layers.ffn.*`, `unembed`), and
/// `LanguageModel::initializer(seed)` draws what `super::LanguageModel`'s does.
/// `compute` is the activations' dtype and `dropout` the rate of the dropouts drawn
/// from the key `rng`, as there (the same masks).
#[crate::model(mesh = (data, fsdp, model))]
pub fn language_model(
    #[shard((data, fsdp), _)] tokens: Tensor<B, S, i32>,
    #[shard((data, fsdp), _)] targets: Tensor<B, S, i32>,
    #[shard((data, fsdp), _)] weights: Tensor<B, S>,
    #[params(V, D, S, L, H, K, F)] p: &LanguageModel,
    rng: Tensor<2, i32>,
    compute: DType,
    dropout: f64,
) -> Tensor {
    let pin_embedded = |e: Tensor| {
        #[shard((data, fsdp), _, _)]
        let x = dropout_at(&e, dropout, &rng, 2 * p.layers.len() as u32);
        x
    };
    language_model_loss(
        [&tokens, &targets, &weights],
        [&p.embed, &p.position, &p.unembed],
        compute,
        pin_embedded,
        |x, low| {
            let layers = p.layers.map(low);
            (0..layers.len()).fold(x, |x, l| {
                block(x, &layers.layer(l), rng.clone(), dropout, l)
            })
        },
    )
}
