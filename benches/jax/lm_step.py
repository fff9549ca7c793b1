"""The training step of `examples/train_transformer.rs` in JAX, for timing side by side.

The model is `gspmd::models::transformer::language_model`: a learned position table
added to a vocabulary-parallel embedding, pre-norm layers (causal multi-head attention,
then a tanh-GELU FFN; layer norm without scale or bias, eps 1e-5), a final layer norm,
the unembedding, and the mean weighted next-token cross-entropy. The update is the
repository's AdamW (lr 3e-3, betas 0.9/0.99, eps 1e-8, no weight decay; bias
corrections computed in f64 per step and passed in as f32). Shardings are the model's
`#[shard]`s on a `data` x `model` mesh, given as `NamedSharding`s and sharding
constraints, with the parameters and optimizer state donated to the jitted step.

The initial parameters and the first batches come from a file the example writes
(`train_transformer N --bench --dump PATH`), so the first losses can be compared with
the ones gspmd recorded there. Prints those losses, their relative difference from
gspmd's, and the median ms/step after the warm-up steps.

    python lm_step.py --dump /tmp/lm.safetensors --mesh 2x4 --steps 30

Setup: see benches/README.md.
"""

import argparse
import os
import re
import statistics
import time

# Eight virtual CPU devices, as the thread mesh has, unless the caller set them.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

LR, BETA1, BETA2, EPS = 3e-3, 0.9, 0.99, 1e-8
LN_EPS = 1e-5
NAMES = ["embed", "position", "wq", "wk", "wv", "wo", "w1", "w2", "unembed"]
SPECS = {
    "embed": P("model", None),
    "position": P(None, None),
    "wq": P(None, "data", "model", None),
    "wk": P(None, "data", "model", None),
    "wv": P(None, "data", "model", None),
    "wo": P(None, "model", None, "data"),
    "w1": P(None, "data", "model"),
    "w2": P(None, "model", "data"),
    "unembed": P("data", "model"),
}
DATA_SPEC = P("data", None)


def layer_norm(x):
    centered = x - x.mean(-1, keepdims=True)
    var = (centered * centered).mean(-1, keepdims=True)
    return centered * jax.lax.rsqrt(var + LN_EPS)


def gelu(x):
    inner = (x + x * x * x * np.float32(0.044715)) * np.float32(np.sqrt(2.0 / np.pi))
    return x * np.float32(0.5) * (jnp.tanh(inner) + 1.0)


def attention(x, wq, wk, wv, wo):
    q = jnp.einsum("bsd,dhk->bhsk", x, wq)
    k = jnp.einsum("btd,dhk->bhtk", x, wk)
    v = jnp.einsum("btd,dhk->bhtk", x, wv)
    scores = jnp.einsum("bhsk,bhtk->bhst", q, k) * np.float32(1.0 / np.sqrt(q.shape[3]))
    s, t = scores.shape[2], scores.shape[3]
    causal = jnp.arange(s)[:, None] >= jnp.arange(t)[None, :]
    scores = jnp.where(causal, scores, np.float32(-1e9))
    context = jnp.einsum("bhst,bhtk->bhsk", softmax(scores), v)
    return jnp.einsum("bhsk,hkd->bsd", context, wo)


def softmax(x):
    e = jnp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def make_loss(mesh):
    def pin(x, *spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))

    def loss(params, tokens, targets, weights):
        p = params
        vocab = p["embed"].shape[0]
        x = pin(jnp.take(p["embed"], tokens, axis=0, mode="clip") + p["position"], "data", None, None)
        for l in range(p["wq"].shape[0]):
            a = attention(layer_norm(x), p["wq"][l], p["wk"][l], p["wv"][l], p["wo"][l])
            attended = pin(x + a, "data", None, None)
            hidden = pin(gelu(jnp.einsum("bsd,df->bsf", layer_norm(attended), p["w1"][l])), "data", None, "model")
            x = attended + jnp.einsum("bsf,fd->bsd", hidden, p["w2"][l])
        x = pin(x, "data", None, None)
        logits = jnp.einsum("bsd,dv->bsv", layer_norm(x), p["unembed"])
        shifted = logits - logits.max(-1, keepdims=True)
        log_p = shifted - jnp.log(jnp.exp(shifted).sum(-1, keepdims=True))
        picked = (log_p * jax.nn.one_hot(targets, vocab, dtype=jnp.float32)).sum(-1)
        return -((picked * weights).sum() / weights.sum())

    return loss


def make_step(mesh):
    loss_fn = make_loss(mesh)
    one_minus_b1 = np.float32(1) - np.float32(BETA1)
    one_minus_b2 = np.float32(1) - np.float32(BETA2)

    def step(params, m, v, tokens, targets, weights, correction1, correction2):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets, weights)
        new_p, new_m, new_v = {}, {}, {}
        for name, w in params.items():
            g = grads[name]
            new_m[name] = m[name] * np.float32(BETA1) + g * one_minus_b1
            new_v[name] = v[name] * np.float32(BETA2) + (g * g) * one_minus_b2
            direction = (new_m[name] / correction1) / (jnp.sqrt(new_v[name] / correction2) + np.float32(EPS))
            new_p[name] = w - direction * np.float32(LR)
        return loss, new_p, new_m, new_v

    weights = {n: NamedSharding(mesh, SPECS[n]) for n in NAMES}
    data = NamedSharding(mesh, DATA_SPEC)
    scalar = NamedSharding(mesh, P())
    return jax.jit(
        step,
        in_shardings=(weights, weights, weights, data, data, data, scalar, scalar),
        out_shardings=(scalar, weights, weights, weights),
        donate_argnums=(0, 1, 2),
    )


def corrections(t):
    """`1 - beta^t` for both betas, in f64, as f32: the repository's Optimizer::scalars."""
    return np.float32(1.0 - BETA1**t), np.float32(1.0 - BETA2**t)


def report(hlo):
    """Prints how many collectives of each kind and how many fusions the optimized
    per-device HLO module `hlo` runs (the instructions of every computation, so ops
    inside a loop body count once)."""
    kinds = ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"]
    shape = r"= (\([^)]*\)|\S+)"  # an array shape or a tuple of them
    counts = {k: len(re.findall(rf"{shape} {k}(-start)?\(", hlo)) for k in kinds}
    fusions = len(re.findall(rf"{shape} fusion\(", hlo))
    listed = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    print(f"XLA's per-device program: {listed or 'no collectives'}; {fusions} fusions")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", required=True, help="file written by train_transformer --bench --dump")
    parser.add_argument("--mesh", default="2x4", help="DATAxMODEL (default 2x4)")
    parser.add_argument("--steps", type=int, default=30, help="steps in all (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="steps not timed (default 3)")
    parser.add_argument("--report", action="store_true",
                        help="also print the collectives and fusions of XLA's per-device program")
    args = parser.parse_args()
    data_size, model_size = (int(n) for n in args.mesh.split("x"))
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")

    dump = load_file(args.dump)
    gspmd_losses = dump["losses"]
    batches = [tuple(dump[f"{k}.{i}"] for k in ("tokens", "targets", "weights")) for i in range(len(gspmd_losses))]
    devices = np.array(jax.devices()[: data_size * model_size]).reshape(data_size, model_size)
    mesh = Mesh(devices, ("data", "model"))
    step = make_step(mesh)
    shard = lambda name, x: jax.device_put(x, NamedSharding(mesh, SPECS[name]))  # noqa: E731
    params = {n: shard(n, dump[n]) for n in NAMES}
    m = {n: shard(n, np.zeros_like(dump[n])) for n in NAMES}
    v = {n: shard(n, np.zeros_like(dump[n])) for n in NAMES}

    if args.report:
        c1, c2 = corrections(1)
        report(step.lower(params, m, v, *batches[0], c1, c2).compile().as_text())

    losses, times = [], []
    for i in range(args.steps):
        tokens, targets, weights = batches[i % len(batches)]
        c1, c2 = corrections(i + 1)
        started = time.perf_counter()
        loss, params, m, v = step(params, m, v, tokens, targets, weights, c1, c2)
        loss = float(loss)  # waits for the step
        elapsed = (time.perf_counter() - started) * 1e3
        if i >= args.warmup:
            times.append(elapsed)
        if i < len(gspmd_losses):
            losses.append(loss)
            print(f"step {i + 1} loss {loss:.8f}")
    diff = max(abs(a - float(b)) / abs(float(b)) for a, b in zip(losses, gspmd_losses))
    print(f"first {len(losses)} losses vs gspmd's: max relative difference {diff:.2e}")
    print(
        f"mesh {args.mesh}, d_model {dump['embed'].shape[1]}: median {statistics.median(times):.3f} ms/step "
        f"over {len(times)} steps (min {min(times):.3f}, max {max(times):.3f})"
    )


if __name__ == "__main__":
    main()
