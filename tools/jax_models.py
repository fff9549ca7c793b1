"""JAX models lowered to StableHLO for gspmd's import (the round trip of issue 31).

    python tools/jax_models.py DIR [NAME ...]

The models: an MLP and an attention block; JAX twins of the four example training
steps (`lm_step`, `unet_step`, `moe_step`, `pipeline_step`: the shapes and shardings of
`examples/export_check/models.rs`, `jax.value_and_grad` and an SGD update); and two op
fixtures (`scan_ops`, `window_ops`; copies live in `gspmd-core/tests/data/jax_*`).
NAMEs pick some.

For each model it writes DIR/NAME/: `jax.mlir` (`jax.jit(f).lower(..).as_text()`,
shardings over the model's mesh of CPU devices as Shardy annotations),
`inputs.safetensors`, `outputs.safetensors` (JAX's outputs on those inputs computed on
one device; the partitioned program's are compared with them and a difference is
printed) and `xla_collectives.txt` (the collectives in XLA's optimized per-device
program: kind, count, bytes). `cargo run --example export_check -- --import DIR`
imports each module into gspmd, partitions it, runs it on the thread mesh, compares
with JAX's outputs and prints gspmd's collectives beside XLA's.
"""

import json
import os
import struct
import sys
from functools import partial
from pathlib import Path

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from xla_check import xla_collective_sizes  # noqa: E402

MESH = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def constrain(x, *spec):
    return jax.lax.with_sharding_constraint(x, NamedSharding(MESH, P(*spec)))


def mlp(x, w1, b1, w2):
    h = jnp.maximum(x @ w1 + b1, 0.0)
    h = constrain(h, "data", "model")
    y = jnp.tanh(h) @ w2
    return jnp.mean(y * y), jnp.exp(-y).sum(axis=0)


def attention(x, wq, wk, wv, wo, scale):
    """One self-attention block with a residual and a layer norm: heads over
    `model` (Megatron), batch over `data`."""
    q = jnp.einsum("bsd,dhk->bhsk", x, wq)
    k = jnp.einsum("bsd,dhk->bhsk", x, wk)
    v = jnp.einsum("bsd,dhk->bhsk", x, wv)
    q = constrain(q, "data", "model", None, None)
    logits = jnp.einsum("bhsk,bhtk->bhst", q, k) * 0.25
    logits = logits - jnp.max(logits, axis=-1, keepdims=True)
    weights = jnp.exp(logits)
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    mixed = jnp.einsum("bhst,bhtk->bhsk", weights, v)
    y = x + jnp.einsum("bhsk,hkd->bsd", mixed, wo)
    mean = jnp.mean(y, axis=-1, keepdims=True)
    var = jnp.mean((y - mean) ** 2, axis=-1, keepdims=True)
    y = (y - mean) * jax.lax.rsqrt(var + 1e-5) * scale
    return jnp.sum(y * y)


def mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))


def constrain_on(mesh_, x, *spec):
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh_, P(*spec)))


LR = 0.05


def sgd_step(loss):
    """A training step of `loss(params, *data)`: the loss and the parameters after
    one SGD step (`jax.value_and_grad`)."""

    def step(params, *data):
        value, grads = jax.value_and_grad(loss)(params, *data)
        return value, jax.tree.map(lambda p, g: p - LR * g, params, grads)

    return step


def layer_norm(x):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5)


def cross_entropy(logits, targets, weights):
    log_p = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.sum(log_p * jax.nn.one_hot(targets, logits.shape[-1]), axis=-1)
    return -jnp.sum(picked * weights) / jnp.sum(weights)


LM_MESH = mesh((2, 4), ("data", "model"))


def lm_loss(p, tokens, targets, weights):
    """examples/train_transformer's model (gspmd's `language_model`): embedding
    lookup (a gather), position table, 2 pre-norm layers (causal attention, GELU FFN),
    the 2-D finalized weight sharding, vocabulary-split logits."""
    c = partial(constrain_on, LM_MESH)
    x = c(p["embed"][tokens] + p["position"], "data", None, None)
    seq = tokens.shape[1]
    causal = jnp.arange(seq)[:, None] >= jnp.arange(seq)[None, :]
    for l in range(p["wq"].shape[0]):
        h = layer_norm(x)
        q = jnp.einsum("bsd,dhk->bhsk", h, p["wq"][l])
        k = jnp.einsum("btd,dhk->bhtk", h, p["wk"][l])
        v = jnp.einsum("btd,dhk->bhtk", h, p["wv"][l])
        scores = jnp.einsum("bhsk,bhtk->bhst", q, k) / jnp.sqrt(q.shape[-1] * 1.0)
        scores = jnp.where(causal, scores, -1e9)
        context = jnp.einsum("bhst,bhtk->bhsk", jax.nn.softmax(scores, axis=-1), v)
        x = c(x + jnp.einsum("bhsk,hkd->bsd", context, p["wo"][l]), "data", None, None)
        hidden = jax.nn.gelu(jnp.einsum("bsd,df->bsf", layer_norm(x), p["w1"][l]))
        hidden = c(hidden, "data", None, "model")
        x = x + jnp.einsum("bsf,fd->bsd", hidden, p["w2"][l])
    logits = jnp.einsum("bsd,dv->bsv", layer_norm(x), p["unembed"])
    return cross_entropy(logits, targets, weights)


UNET_MESH = mesh((2, 4), ("data", "space"))


def conv_relu(x, w, padding="SAME"):
    y = jax.lax.conv_general_dilated(
        x, w, (1, 1), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return jax.nn.relu(y)


def max_pool(x):
    return jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"
    )


def upsample(x):
    return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


def unet_loss(p, noisy, clean):
    """examples/train_unet's model (gspmd's `denoise`): 3x3 convolutions, 2x2 max
    pooling (reduce_window), nearest upsampling, skip connections; batch over `data`,
    height over `space`."""
    c = partial(constrain_on, UNET_MESH)
    spatial = ("data", "space", None, None)
    skip1 = c(conv_relu(conv_relu(noisy, p["down1a"]), p["down1b"]), *spatial)
    skip2 = c(conv_relu(max_pool(skip1), p["down2"]), *spatial)
    deep = c(conv_relu(max_pool(skip2), p["bottleneck"]), *spatial)

    def up(x, skip, w_up, w_merge):
        joined = jnp.concatenate([conv_relu(upsample(x), w_up), skip], axis=3)
        return conv_relu(joined, w_merge)

    y2 = c(up(deep, skip2, p["up2"], p["merge2"]), *spatial)
    y1 = up(y2, skip1, p["up1"], p["merge1"])
    predicted = c(
        jax.lax.conv_general_dilated(
            y1, p["out"], (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
        ),
        *spatial,
    )
    return jnp.mean((predicted - clean) ** 2)


MOE_MESH = mesh((2, 4), ("data", "expert"))


def rotary(x):
    seq, k = x.shape[2], x.shape[3]
    half = k // 2
    position = jnp.arange(seq, dtype=jnp.float32)[:, None]
    frequency = jnp.exp(jnp.arange(half, dtype=jnp.float32) * (-2.0 * np.log(10000.0) / k))
    angle = position * frequency[None, :]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def moe_loss(p, tokens, targets, weights, capacity=2):
    """examples/train_moe's model (gspmd's `moe_language_model`): rotary attention,
    GShard top-2 gating (argmax: a two-operand reduce; cumsum; one-hots), dispatch and
    combine einsums with the experts over `expert` (the all-to-alls)."""
    c = partial(constrain_on, MOE_MESH)
    groups = ("data", "expert")
    vocab, experts = p["embed"].shape[0], p["wg"].shape[1]
    x = c(jnp.einsum("gsv,vm->gsm", jax.nn.one_hot(tokens, vocab), p["embed"]), groups, None, None)
    h = layer_norm(x)
    q = rotary(jnp.einsum("gsm,mnk->gnsk", h, p["wq"]))
    k = rotary(jnp.einsum("gsm,mnk->gnsk", h, p["wk"]))
    v = jnp.einsum("gsm,mnk->gnsk", h, p["wv"])
    seq = tokens.shape[1]
    causal = jnp.arange(seq)[:, None] >= jnp.arange(seq)[None, :]
    scores = jnp.where(causal, jnp.einsum("gnsk,gntk->gnst", q, k) / np.sqrt(q.shape[-1]), -1e9)
    context = jnp.einsum("gnst,gntk->gnsk", jax.nn.softmax(scores, axis=-1), v)
    x = x + jnp.einsum("gnsk,nkm->gsm", context, p["wo"])

    h = layer_norm(x)
    gates = jax.nn.softmax(jnp.einsum("gsm,me->gse", h, p["wg"]), axis=-1)
    first = jax.nn.one_hot(jnp.argmax(gates, axis=-1), experts)
    aux_loss = jnp.mean(jnp.mean(first, axis=1) * jnp.mean(gates, axis=1)) * experts**2
    second = jax.nn.one_hot(jnp.argmax(gates * (1.0 - first), axis=-1), experts)
    fits = lambda position: (position < capacity).astype(jnp.float32)  # noqa: E731
    position1 = (jnp.cumsum(first, axis=1) - 1.0) * first
    first = first * fits(position1)
    taken = jnp.sum(first, axis=1, keepdims=True)
    position2 = (jnp.cumsum(second, axis=1) - 1.0 + taken) * second
    second = second * fits(position2)
    gate1 = jnp.sum(gates * first, axis=-1)
    gate2 = jnp.sum(gates * second, axis=-1)
    norm = gate1 + gate2 + 1e-9

    def route(mask, position):
        slot = jax.nn.one_hot(jnp.sum(position * mask, axis=-1).astype(jnp.int32), capacity)
        return mask[..., None] * slot[:, :, None, :]

    route1, route2 = route(first, position1), route(second, position2)
    weighted = (gate1 / norm)[..., None, None] * route1 + (gate2 / norm)[..., None, None] * route2
    combine = c(weighted, groups, None, None, None)
    dispatch = c(route1 + route2, groups, None, None, None)
    experts_split = ("expert", "data", None, None)
    dispatched = c(jnp.einsum("gsec,gsm->egcm", dispatch, h), *experts_split)
    hidden = c(jax.nn.gelu(jnp.einsum("egcm,emh->egch", dispatched, p["w_in"])), *experts_split)
    expert_out = c(jnp.einsum("egch,ehm->egcm", hidden, p["w_out"]), *experts_split)
    combined = c(jnp.einsum("gsec,egcm->gsm", combine, expert_out), groups, None, None)
    x = x + combined
    logits = jnp.einsum("gsm,mv->gsv", layer_norm(x), p["unembed"])
    return cross_entropy(logits, targets, weights) + 0.01 * aux_loss


PIPE_MESH = mesh((4, 2), ("stage", "model"))
STAGES, REPEATS, MICROBATCHES = 4, 2, 6


def pipeline_loss(p, xs, ys):
    """examples/train_pipeline's model (gspmd's `mlp_loss`, circular schedule): a
    `lax.scan` over `M R + S - 1` iterations of a stage buffer split over `stage`
    (dynamic slices of the microbatches and of a queue, a `roll`: the
    collective-permute), each stage applying its repeat's residual MLP layer picked by
    a one-hot contraction."""
    c = partial(constrain_on, PIPE_MESH)
    s, r, m = STAGES, REPEATS, MICROBATCHES
    row = (s,) + xs.shape[1:]
    buffer = c(jnp.zeros(row, xs.dtype), "stage", None, None)
    queue = c(jnp.zeros((s, m) + xs.shape[1:], xs.dtype), "stage", None, None, None)
    stage = jnp.arange(s)
    first_stage = (stage == 0)[:, None, None]

    def body(carry, t):
        buffer, queue = carry
        fresh = jax.lax.dynamic_slice_in_dim(xs, jnp.minimum(t, m - 1), 1, axis=0)
        queued = jax.lax.dynamic_slice_in_dim(queue, t % m, 1, axis=1)[:, 0]
        entering = jnp.where(t < m, jnp.broadcast_to(fresh, row), queued)
        state = jnp.where(first_stage, entering, buffer)
        repeat = jnp.clip(jnp.maximum(t - stage, 0) // m, 0, r - 1)
        one_hot = jax.nn.one_hot(repeat, r)
        w1 = jnp.einsum("sr,srdf->sdf", one_hot, p["w1"])
        w2 = jnp.einsum("sr,srfd->sfd", one_hot, p["w2"])
        hidden = jax.nn.relu(jnp.einsum("sbd,sdf->sbf", state, w1))
        out = state + jnp.einsum("sbf,sfd->sbd", hidden, w2)
        shifted = c(jnp.roll(out, 1, axis=0), "stage", None, None)
        slot = (t + m - (s - 1) % m) % m
        queue = jax.lax.dynamic_update_slice_in_dim(queue, shifted[:, None], slot, axis=1)
        return (shifted, queue), out

    iterations = m * r + s - 1
    _, outs = jax.lax.scan(body, (buffer, queue), jnp.arange(iterations))
    start = m * r - m + s - 1
    last = outs[start : start + m, s - 1]
    return jnp.mean((last - ys) ** 2)


STEP_MODELS = {
    "lm_step": (LM_MESH, lm_loss),
    "unet_step": (UNET_MESH, unet_loss),
    "moe_step": (MOE_MESH, moe_loss),
    "pipeline_step": (PIPE_MESH, pipeline_loss),
}


def scan_ops(xs, w, starts):
    """Control flow and slicing (a test fixture): a `lax.scan` (while) whose body
    reads a dynamic slice, writes a dynamic update, rolls, clamps and takes a
    `lax.cond` (case); private functions (calls)."""
    c = partial(constrain_on, MESH)

    def body(carry, x):
        i = carry[1]
        row = jax.lax.dynamic_slice_in_dim(carry[0], jax.lax.clamp(0, i % 3, 2), 2, axis=0)
        y = jnp.tanh(row @ w + x[None, :])
        big = jnp.sum(y) > 0.0
        y = jax.lax.cond(big, lambda v: jnp.sin(v), lambda v: -v, y)
        state = jax.lax.dynamic_update_slice_in_dim(carry[0], y, starts[i % 4], axis=0)
        return (jnp.roll(state, 1, axis=1), i + 1), jnp.sum(y, axis=0)

    init = c(jnp.ones((8, 16), jnp.float32), "data", "model")
    (state, _), ys = jax.lax.scan(body, (init, jnp.int32(0)), xs)
    return state, ys


OPS_MESH = mesh((2, 2), ("data", "model"))


def window_ops(image, kernel, ids, table):
    """Windows and indexing with their gradients (a test fixture): a strided,
    dilated grouped convolution, max pooling (reduce_window; its gradient a
    select_and_scatter), average pooling, a transposed convolution, an embedding
    lookup (gather; its gradient a scatter-add), argmax and cumsum."""

    def loss(image, kernel, table):
        c = partial(constrain_on, OPS_MESH)
        y = jax.lax.conv_general_dilated(
            image, kernel, (1, 1), "SAME", rhs_dilation=(2, 1),
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=2,
        )
        y = c(jnp.tanh(y), "data", "model", None, None)
        pooled = max_pool(y)
        mean = jax.lax.reduce_window(y, 0.0, jax.lax.add, (1, 3, 3, 1), (1, 1, 1, 1), "SAME") / 9.0
        up = jax.lax.conv_transpose(
            pooled, kernel.transpose(0, 1, 3, 2), (2, 2), "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )
        rows = table[ids]
        picked = jnp.argmax(rows, axis=-1).astype(jnp.float32)
        running = jnp.cumsum(rows, axis=1)
        return jnp.sum(up * up) + jnp.sum(mean) + jnp.sum(running * running) + jnp.sum(picked)

    return jax.value_and_grad(loss, argnums=(0, 1, 2))(image, kernel, table)


def fixtures(rng):
    """The test fixtures' functions and arguments."""

    def arg(shape, *spec, mesh_=MESH):
        value = rng.uniform(-0.5, 0.5, shape).astype(np.float32)
        return value, NamedSharding(mesh_, P(*spec))

    def ints(values, mesh_=MESH):
        return np.array(values, np.int32), NamedSharding(mesh_, P())

    yield "scan_ops", scan_ops, [
        arg((5, 16), None, None),
        arg((16, 16), None, "model"),
        ints([0, 3, 6, 2]),
    ]
    ids = rng.integers(0, 6, (4, 3)).astype(np.int32)
    yield "window_ops", window_ops, [
        arg((2, 8, 8, 4), "data", None, None, None, mesh_=OPS_MESH),
        arg((3, 3, 2, 4), None, None, None, None, mesh_=OPS_MESH),
        (ids, NamedSharding(OPS_MESH, P("data", None))),
        arg((6, 8), "model", None, mesh_=OPS_MESH),
    ]


def models():
    """Each model: name, function, and its arguments as (value, sharding) pairs."""
    rng = np.random.default_rng(0)

    def arg(shape, *spec, scale=0.5, mesh_=MESH):
        value = rng.uniform(-scale, scale, shape).astype(np.float32)
        return value, NamedSharding(mesh_, P(*spec))

    yield "mlp", mlp, [
        arg((16, 32), "data", None),
        arg((32, 64), None, "model"),
        arg((64,), "model"),
        arg((64, 32), "model", None),
    ]
    yield "attention", attention, [
        arg((4, 8, 16), "data", None, None),
        arg((16, 4, 8), None, "model", None),
        arg((16, 4, 8), None, "model", None),
        arg((16, 4, 8), None, "model", None),
        arg((4, 8, 16), "model", None, None),
        arg((16,), None),
    ]
    for name, (mesh_, loss) in STEP_MODELS.items():
        params, data = step_arguments(name, rng, mesh_)
        yield name, flat_step(loss, [n for n, _ in params]), [a for _, a in params] + data
    yield from fixtures(rng)


def step_arguments(name, rng, mesh_):
    """The parameters (name, (value, sharding)) and data of a step model, with the
    shapes and shardings of the gspmd example it twins (`examples/export_check.rs`)."""

    def weight(shape, *spec, fan_in=None):
        scale = 1.0 if fan_in is None else 1.0 / np.sqrt(fan_in)
        value = rng.uniform(-scale, scale, shape).astype(np.float32)
        return value, NamedSharding(mesh_, P(*spec))

    def ids(shape, vocab, *spec):
        value = rng.integers(0, vocab, shape).astype(np.int32)
        return value, NamedSharding(mesh_, P(*spec))

    if name == "lm_step":
        b, s, v, d, layers, h, k, f = 16, 16, 16, 64, 2, 4, 16, 256
        qkv = lambda: weight((layers, d, h, k), None, "data", "model", None, fan_in=d)  # noqa: E731
        params = [
            ("embed", weight((v, d), "model", None)),
            ("position", weight((s, d), None, None)),
            ("wq", qkv()),
            ("wk", qkv()),
            ("wv", qkv()),
            ("wo", weight((layers, h, k, d), None, "model", None, "data", fan_in=h * k)),
            ("w1", weight((layers, d, f), None, "data", "model", fan_in=d)),
            ("w2", weight((layers, f, d), None, "model", "data", fan_in=f)),
            ("unembed", weight((d, v), "data", "model", fan_in=d)),
        ]
        batch = ("data", None)
        data = [ids((b, s), v, *batch), ids((b, s), v, *batch), weight((b, s), *batch)]
        data[2] = (np.abs(data[2][0]), data[2][1])
    elif name == "unet_step":
        kernels = {
            "down1a": (1, 8),
            "down1b": (8, 8),
            "down2": (8, 16),
            "bottleneck": (16, 16),
            "up2": (16, 16),
            "merge2": (32, 16),
            "up1": (16, 8),
            "merge1": (16, 8),
        }
        params = [
            (n, weight((3, 3, i, o), None, None, None, None, fan_in=9 * i))
            for n, (i, o) in kernels.items()
        ]
        params.append(("out", weight((1, 1, 8, 1), None, None, None, None, fan_in=8)))
        image = ("data", "space", None, None)
        data = [weight((2, 16, 8, 1), *image), weight((2, 16, 8, 1), *image)]
    elif name == "moe_step":
        g, s, v, m, n, k, e, h = 8, 6, 8, 8, 2, 4, 4, 8
        params = [
            ("embed", weight((v, m), None, None)),
            ("wq", weight((m, n, k), None, None, None, fan_in=m)),
            ("wk", weight((m, n, k), None, None, None, fan_in=m)),
            ("wv", weight((m, n, k), None, None, None, fan_in=m)),
            ("wo", weight((n, k, m), None, None, None, fan_in=n * k)),
            ("wg", weight((m, e), None, None, fan_in=m)),
            ("w_in", weight((e, m, h), "expert", None, None, fan_in=m)),
            ("w_out", weight((e, h, m), "expert", None, None, fan_in=h)),
            ("unembed", weight((m, v), None, None, fan_in=m)),
        ]
        groups = (("data", "expert"), None)
        data = [ids((g, s), v, *groups), ids((g, s), v, *groups), weight((g, s), *groups)]
        data[2] = (np.abs(data[2][0]), data[2][1])
    else:
        d, f = 8, 16
        params = [
            ("w1", weight((STAGES, REPEATS, d, f), "stage", None, None, "model", fan_in=d)),
            ("w2", weight((STAGES, REPEATS, f, d), "stage", None, "model", None, fan_in=f)),
        ]
        data = [weight((MICROBATCHES, 4, d), None, None, None) for _ in range(2)]
    return params, data


def flat_step(loss, names):
    """`sgd_step(loss)` over flat arguments (the parameters by `names`, then the
    data), returning the loss and the updated parameters in that order."""
    step = sgd_step(loss)

    def f(*args):
        params = dict(zip(names, args[: len(names)]))
        value, new = step(params, *args[len(names) :])
        return (value, *(new[n] for n in names))

    return f


def write_safetensors(path, arrays):
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}
    header, offset, blobs = {}, 0, []
    for i, a in enumerate(arrays):
        a = np.ascontiguousarray(a)
        blob = a.tobytes()
        header[f"t{i:04}"] = {
            "dtype": dtypes[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def relative_difference(got, want):
    """The largest difference of two arrays relative to `want`'s largest magnitude."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max(initial=0.0) / max(np.abs(want).max(initial=0.0), 1e-30))


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "target/jax_models")
    only = set(sys.argv[2:])
    for name, f, args in models():
        if only and name not in only:
            continue
        case = root / name
        case.mkdir(parents=True, exist_ok=True)
        values = [jax.device_put(v, s) for v, s in args]
        lowered = jax.jit(f).lower(*values)
        (case / "jax.mlir").write_text(lowered.as_text())
        # The expected outputs are XLA's on one device; its partitioned program's
        # outputs are compared with them (they differ where XLA's partitioner errs).
        outs = jax.tree.leaves(jax.jit(f)(*[v for v, _ in args]))
        partitioned = jax.tree.leaves(jax.jit(f)(*values))
        worst = max(relative_difference(a, b) for a, b in zip(partitioned, outs))
        write_safetensors(case / "inputs.safetensors", [v for v, _ in args])
        write_safetensors(case / "outputs.safetensors", [np.asarray(o) for o in outs])
        sizes = xla_collective_sizes(lowered.compile().as_text())
        lines = "".join(f"{k} {n} {b}\n" for k, (n, b) in sorted(sizes.items()))
        (case / "xla_collectives.txt").write_text(lines)
        print(f"{name}: {len(args)} inputs, {len(outs)} outputs, XLA collectives {sizes}")
        if worst > 1e-5:
            print(f"   XLA's partitioned outputs differ from its one-device outputs by {worst:.2e}")


if __name__ == "__main__":
    main()
