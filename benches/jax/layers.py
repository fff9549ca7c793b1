"""Layers of gspmd's models in JAX, op for op as `gspmd::models` traces them (f32), for
the training-step twins. Import after `twin.parse` (it sets JAX's devices)."""

import jax
import jax.numpy as jnp
import numpy as np

LN_EPS = 1e-5


def layer_norm(x):
    """`(x - mean) / sqrt(var + 1e-5)` along the last dim, no scale or bias."""
    centered = x - x.mean(-1, keepdims=True)
    var = (centered * centered).mean(-1, keepdims=True)
    return centered * jax.lax.rsqrt(var + LN_EPS)


def gelu(x):
    """GELU, tanh approximation."""
    inner = (x + x * x * x * np.float32(0.044715)) * np.float32(np.sqrt(2.0 / np.pi))
    return x * np.float32(0.5) * (jnp.tanh(inner) + 1.0)


def softmax(x):
    e = jnp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def log_softmax(x):
    shifted = x - x.max(-1, keepdims=True)
    return shifted - jnp.log(jnp.exp(shifted).sum(-1, keepdims=True))


def one_hot(ids, n):
    return jax.nn.one_hot(ids, n, dtype=jnp.float32)


def rotary(x):
    """RoFormer's rotary embedding of `x: [B, H, S, K]`: at position `s` the pair `i`,
    `i + K/2` turns by `s * 10000^(-2i/K)` (`gspmd::models::transformer::rotary`)."""
    seq, k = x.shape[2], x.shape[3]
    half = k // 2
    position = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.float32)[:, None], (seq, half))
    scale = np.float32(-2.0) * np.log(np.float32(10000.0)) / np.float32(k)
    frequency = jnp.exp(jnp.arange(half, dtype=jnp.float32)[None, :] * scale)
    angle = position * frequency
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=3)


def attention(x, wq, wk, wv, wo, position=lambda t: t):
    """Causal multi-head self-attention over `x: [B, S, D]`, `position` applied to the
    queries and keys, scores scaled by `1 / sqrt(K)` and masked with -1e9."""
    q = position(jnp.einsum("bsd,dhk->bhsk", x, wq))
    k = position(jnp.einsum("btd,dhk->bhtk", x, wk))
    v = jnp.einsum("btd,dhk->bhtk", x, wv)
    scores = jnp.einsum("bhsk,bhtk->bhst", q, k) * np.float32(1.0 / np.sqrt(q.shape[3]))
    s, t = scores.shape[2], scores.shape[3]
    causal = jnp.arange(s)[:, None] >= jnp.arange(t)[None, :]
    scores = jnp.where(causal, scores, np.float32(-1e9))
    context = jnp.einsum("bhst,bhtk->bhsk", softmax(scores), v)
    return jnp.einsum("bhsk,hkd->bsd", context, wo)
