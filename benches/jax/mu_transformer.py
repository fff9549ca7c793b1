"""The training steps of `examples/train_mu_transformer.rs` in JAX and optax, to check
gspmd's first losses against an independent implementation.

The model is `gspmd::models::mu_transformer` (after lucaslingle's mu_transformer):
token embedding; `L` pre-RMSNorm layers (no gain, eps 1e-5) under `lax.scan` with
`jax.checkpoint` on the body, each causal multi-head attention with rotary positions on
the queries and keys and scores scaled by 1/d_head, then a ReLU FFN; a final RMSNorm
and the unembedding; the mean weighted next-token cross-entropy. The update is μP's
AdamW as optax transforms: `clip_by_global_norm(1)`, `scale_by_adam(0.9, 0.98, 1e-9)`,
`masked(scale(1/d_model))` on the attention weights, `w1` and `unembed`,
`masked(scale(1/d_ff))` on `w2`, `scale_by_learning_rate(lr)`. Shardings are the
model's on a `rows` x `columns` x `planes` mesh (batch over rows, d_model over columns,
heads and FFN hidden over planes).

The initial weights, the first batches, gspmd's losses on them and the learning rate
come from the file the example writes (`train_mu_transformer N --dump PATH`). Prints
JAX's losses and their largest relative difference from gspmd's; exits 1 if it is
above `--tolerance` (default 1e-5).

    python mu_transformer.py --dump /tmp/mu.safetensors

Setup: see benches/README.md.
"""

import argparse
import os
import sys

# Eight virtual CPU devices, as the thread mesh has, unless the caller set them.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

ADAM = dict(b1=0.9, b2=0.98, eps=1e-9)
NORM_EPS = 1e-5
SPECS = {
    "embed": P(None, "columns"),
    "layers.attn.wq": P(None, "columns", "planes", None),
    "layers.attn.wk": P(None, "columns", "planes", None),
    "layers.attn.wv": P(None, "columns", "planes", None),
    "layers.attn.wo": P(None, "planes", None, "columns"),
    "layers.ffn.w1": P(None, "columns", "planes"),
    "layers.ffn.w2": P(None, "planes", "columns"),
    "unembed": P("columns", None),
}
DATA = P("rows", None)


def rms_norm(x):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1) + np.float32(NORM_EPS))[..., None]


def rotary(x):
    """Pairs `i`, `i + K/2` rotated by `s * 10000^(-2i/K)`, the frequencies computed as
    gspmd computes them (`exp(i * -2 ln(10000) / K)`)."""
    seq, k = x.shape[2], x.shape[3]
    half = k // 2
    exponent = np.float32(-2.0) * np.float32(np.log(10000.0)) / np.float32(k)
    frequency = jnp.exp(jnp.arange(half, dtype=jnp.float32) * exponent)
    angle = jnp.arange(seq, dtype=jnp.float32)[:, None] * frequency[None, :]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def make_loss(mesh):
    def pin(x, *spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))

    def block(x, w):
        h = rms_norm(x)
        q = pin(rotary(jnp.einsum("bsd,dhk->bhsk", h, w["layers.attn.wq"])), "rows", "planes", None, None)
        k = pin(rotary(jnp.einsum("btd,dhk->bhtk", h, w["layers.attn.wk"])), "rows", "planes", None, None)
        v = pin(jnp.einsum("btd,dhk->bhtk", h, w["layers.attn.wv"]), "rows", "planes", None, None)
        scores = jnp.einsum("bhsk,bhtk->bhst", q, k) * np.float32(1.0 / q.shape[3])
        s, t = scores.shape[2], scores.shape[3]
        causal = jnp.arange(s)[:, None] >= jnp.arange(t)[None, :]
        scores = jnp.where(causal, scores, np.float32(-1e9))
        context = jnp.einsum("bhst,bhtk->bhsk", jax.nn.softmax(scores, axis=-1), v)
        attended = pin(x + jnp.einsum("bhsk,hkd->bsd", context, w["layers.attn.wo"]), "rows", None, "columns")
        hidden = pin(jax.nn.relu(jnp.einsum("bsd,df->bsf", rms_norm(attended), w["layers.ffn.w1"])), "rows", None, "planes")
        return pin(attended + jnp.einsum("bsf,fd->bsd", hidden, w["layers.ffn.w2"]), "rows", None, "columns")

    def loss(params, tokens, targets, weights):
        x = pin(jnp.take(params["embed"], tokens, axis=0), "rows", None, "columns")
        layers = {n: w for n, w in params.items() if n.startswith("layers.")}
        x, _ = jax.lax.scan(lambda x, w: (jax.checkpoint(block)(x, w), None), x, layers)
        logits = pin(jnp.einsum("bsd,dv->bsv", rms_norm(x), params["unembed"]), "rows", None, None)
        log_p = jax.nn.log_softmax(logits, axis=-1)
        picked = (log_p * jax.nn.one_hot(targets, logits.shape[-1], dtype=jnp.float32)).sum(-1)
        return -((picked * weights).sum() / weights.sum())

    return loss


def mu_adamw(lr, d_model, d_ff):
    """μP's AdamW: per-weight learning rates `lr / fan_in` (the embedding keeps `lr`)."""
    hidden = {"layers.attn.wq", "layers.attn.wk", "layers.attn.wv", "layers.attn.wo", "layers.ffn.w1", "unembed"}
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.scale_by_adam(**ADAM),
        optax.masked(optax.scale(1.0 / d_model), {n: n in hidden for n in SPECS}),
        optax.masked(optax.scale(1.0 / d_ff), {n: n == "layers.ffn.w2" for n in SPECS}),
        optax.scale_by_learning_rate(lr),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", required=True, help="file written by train_mu_transformer N --dump PATH")
    parser.add_argument("--mesh", default="2x2x2", help="ROWSxCOLUMNSxPLANES (default 2x2x2)")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest relative difference allowed")
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.mesh.split("x"))

    dump = load_file(args.dump)
    gspmd_losses = dump["losses"]
    devices = np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape)
    mesh = Mesh(devices, ("rows", "columns", "planes"))
    shardings = {n: NamedSharding(mesh, spec) for n, spec in SPECS.items()}
    params = {n: jax.device_put(dump[n], shardings[n]) for n in SPECS}
    d_model, d_ff = params["layers.ffn.w1"].shape[1:]
    optimizer = mu_adamw(float(dump["lr"]), d_model, d_ff)
    state = optimizer.init(params)
    loss_fn = make_loss(mesh)

    @jax.jit
    def step(params, state, tokens, targets, weights):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets, weights)
        updates, state = optimizer.update(grads, state, params)
        return loss, optax.apply_updates(params, updates), state

    data = NamedSharding(mesh, DATA)
    diff = 0.0
    for i, want in enumerate(gspmd_losses):
        batch = [jax.device_put(dump[f"{k}.{i}"], data) for k in ("tokens", "targets", "weights")]
        loss, params, state = step(params, state, *batch)
        loss = float(loss)
        diff = max(diff, abs(loss - float(want)) / abs(float(want)))
        print(f"step {i + 1} loss {loss:.8f} (gspmd {float(want):.8f})")
    print(f"first {len(gspmd_losses)} losses vs gspmd's: max relative difference {diff:.2e}")
    if diff > args.tolerance:
        sys.exit(f"the losses differ by more than {args.tolerance:.0e}")


if __name__ == "__main__":
    main()
