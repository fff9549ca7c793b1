//! The μ-Transformer of Lucas Lingle's `mu_transformer` (github lucaslingle/mu_transformer,
//! `jax_impl/model.py`, in the 3-D layout of its "3d shazeer mesh" version): a
//! decoder-only Transformer in the maximal-update parameterisation (μP, Yang et al.
//! 2022) on a mesh of `rows` x `columns` x `planes`: the batch over `rows`, `d_model`
//! over `columns`, the heads and the FFN's hidden dim over `planes`, as the original's
//! sharding constraints (`RNC` activations, `CPN` query/key/value weights, `PNC` output
//! weights, `CP`/`PC` FFN weights, `RPNN` per-head activations, `RNP` FFN hidden).
//!
//! The layer: pre-RMSNorm (no gain), multi-head attention with rotary positions on the
//! queries and keys and scores scaled by `1 / d_head` (μP's, where standard attention
//! takes `1 / sqrt(d_head)`), a residual; pre-RMSNorm, a ReLU FFN, a residual. After
//! the layers, an RMSNorm and the unembedding to logits.
//!
//! μP's initialisation ([`MuTransformer`]'s `#[init]`s): the query and the unembedding
//! weights are zero, the embedding is `N(0, 1)`, every other weight `N(0, 1/fan_in)`.
//! Its learning rates ([`mu_adamw`]): Adam's update scaled by `1 / fan_in` for every
//! hidden and output weight, by 1 for the embedding.
//!
//! The layers run as one `scan` ([`Stacked::scan`]), as the original's `nn.scan` over a
//! rematerialised block: gspmd's scan is always rematerialised (its backward pass
//! recomputes each layer from the saved carry, as `jax.checkpoint` on the body).

use crate::ir::{Tensor, einsum};
use crate::models::transformer::{attend, rms_norm, rotary, weighted_cross_entropy};
use crate::params::Stacked;
use crate::train::{
    Mask, Optimizer, chain, clip_by_global_norm, scale_by_adam, scale_by_learning_rate,
    scale_masked,
};

/// The RMSNorm epsilon (the original's `norm_eps`).
pub const NORM_EPS: f32 = 1e-5;

/// One layer's attention weights `wq, wk, wv: [D, H, K]`, `wo: [H, K, D]`: `d_model` over
/// `columns`, heads over `planes`.
#[crate::params(mesh = (rows, columns, planes))]
pub struct MuAttention {
    /// Queries: zero (μP; the original's appendix D.2).
    #[shard(columns, planes, _)]
    #[init(zeros)]
    pub wq: Tensor<D, H, K>,
    /// Keys.
    #[shard(columns, planes, _)]
    #[init(normal_fan_in(0))]
    pub wk: Tensor<D, H, K>,
    /// Values.
    #[shard(columns, planes, _)]
    #[init(normal_fan_in(0))]
    pub wv: Tensor<D, H, K>,
    /// The output projection.
    #[shard(planes, _, columns)]
    #[init(normal_fan_in(0, 1))]
    pub wo: Tensor<H, K, D>,
}

/// One layer's FFN weights `w1: [D, F]`, `w2: [F, D]`: `d_model` over `columns`, the
/// hidden dim over `planes`.
#[crate::params(mesh = (rows, columns, planes))]
pub struct MuFfn {
    /// Into the hidden dim.
    #[shard(columns, planes)]
    #[init(normal_fan_in(0))]
    pub w1: Tensor<D, F>,
    /// Out of the hidden dim.
    #[shard(planes, columns)]
    #[init(normal_fan_in(0))]
    pub w2: Tensor<F, D>,
}

/// One layer's weights: `attn.{wq,wk,wv,wo}`, `ffn.{w1,w2}`.
#[crate::params(mesh = (rows, columns, planes))]
pub struct MuBlock {
    /// Self-attention.
    pub attn: MuAttention,
    /// Feed-forward.
    pub ffn: MuFfn,
}

/// The μ-Transformer's weights: `embed: [V, D]`, the stacked `layers` and
/// `unembed: [D, V]`.
#[crate::params(mesh = (rows, columns, planes))]
pub struct MuTransformer {
    /// The token embedding table, `N(0, 1)`.
    #[shard(_, columns)]
    #[init(normal(1.0))]
    pub embed: Tensor<V, D>,
    /// The layers.
    pub layers: Stacked<MuBlock, L>,
    /// The output projection to the vocabulary: zero (μP).
    #[shard(columns, _)]
    #[init(zeros)]
    pub unembed: Tensor<D, V>,
}

/// One μ-Transformer layer on `x: [B, S, D]` (see the module docs).
#[crate::model(mesh = (rows, columns, planes))]
pub fn mu_block(x: Tensor<B, S, D>, #[params(D, H, K, F)] w: &MuBlock) -> Tensor<B, S, D> {
    let MuAttention { wq, wk, wv, wo } = &w.attn;
    let scale = 1.0 / wq.shape()[2] as f32;
    let a = attend(&rms_norm(&x, NORM_EPS), [wq, wk, wv, wo], rotary, scale);
    #[shard(rows, _, columns)]
    let attended = &x + &a;
    #[shard(rows, _, planes)]
    let hidden = einsum("bsd,df->bsf", &rms_norm(&attended, NORM_EPS), &w.ffn.w1).relu();
    #[shard(rows, _, columns)]
    let out = &attended + &einsum("bsf,fd->bsd", &hidden, &w.ffn.w2);
    out
}

/// The μ-Transformer's loss: the mean over positions (weighted by `weights`) of the
/// cross-entropy of predicting `targets` from `tokens`.
///
/// Its parameters: the data `tokens`, `targets`, `weights`, then the leaves of
/// [`MuTransformer`]: `embed`, `layers.attn.{wq,wk,wv,wo}`, `layers.ffn.{w1,w2}`
/// (stacked over the `L` layers) and `unembed`; `MuTransformer::initializer(seed)`
/// initialises them.
#[crate::model(mesh = (rows, columns, planes))]
pub fn mu_transformer(
    #[shard(rows, _)] tokens: Tensor<B, S, i32>,
    #[shard(rows, _)] targets: Tensor<B, S, i32>,
    #[shard(rows, _)] weights: Tensor<B, S>,
    #[params(V, D, L, H, K, F)] p: &MuTransformer,
) -> Tensor {
    #[shard(rows, _, columns)]
    let x = p.embed.embedding(&tokens);
    let x = p
        .layers
        .scan(&[x], |layer, carry| vec![mu_block(carry[0].clone(), layer)]);
    #[shard(rows, _, _)]
    let logits = einsum("bsd,dv->bsv", &rms_norm(&x[0], NORM_EPS), &p.unembed);
    weighted_cross_entropy(&logits, &targets, &weights)
}

/// μP's AdamW for [`mu_transformer()`] with `d_model` `d` and FFN width `f` (the
/// original's `grad_transform_factory`): gradients clipped to a global norm of 1,
/// Adam's direction (`beta1`, `beta2`, `eps`), scaled by `1 / d` for the attention
/// weights, `w1` and `unembed` and by `1 / f` for `w2` (`1 / fan_in`; the embedding
/// keeps 1), then by the learning rate `lr`. No weight decay (the original's default).
pub fn mu_adamw(lr: f32, [beta1, beta2, eps]: [f32; 3], d: usize, f: usize) -> Optimizer {
    chain([
        clip_by_global_norm(1.0),
        scale_by_adam(beta1, beta2, eps),
        scale_masked(
            1.0 / d as f32,
            Mask::only(&["layers.attn.*", "layers.ffn.w1", "unembed"]),
        ),
        scale_masked(1.0 / f as f32, Mask::only(&["layers.ffn.w2"])),
        scale_by_learning_rate(lr),
    ])
}
