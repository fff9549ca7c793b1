"""What the JAX twins of gspmd's training steps share (`lm_step.py`, `unet_step.py`,
`moe_step.py`): the command line, the repository's AdamW, and the timed loop that
replays a gspmd `--bench --dump` file.

Each twin calls `parse(doc)` before importing JAX: it sets
`XLA_FLAGS=--xla_force_host_platform_device_count=<devices of --mesh>` and
`JAX_PLATFORMS=cpu` unless the caller set them, so JAX gets exactly as many host
devices as the mesh has (more devices make XLA's 1-device step slower: FACTS.md).
Then `run(args, axes, specs, loss_fn, data_keys, data_spec)` jits the step (value and
gradient of `loss_fn`, then AdamW; parameters and optimizer state donated), starts from
the dumped initial weights, replays the dumped batches and prints the first losses,
their largest relative difference from gspmd's, and the median ms/step after the
warm-up steps, in the lines `compare.py` reads.
"""

import argparse
import json
import os
import re
import statistics
import time

LR, BETA1, BETA2, EPS = 3e-3, 0.9, 0.99, 1e-8


def parse(doc):
    """The twins' command line (see `--help`); sets the device count of `--mesh`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--dump", required=True, help="file written by the example's --bench --dump")
    parser.add_argument("--mesh", default="2x4", help="AxB, the mesh's two axis sizes (default 2x4)")
    parser.add_argument("--steps", type=int, default=30, help="steps in all (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="steps not timed (default 3)")
    parser.add_argument("--report", action="store_true",
                        help="also print the collectives and fusions of XLA's per-device program")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    args.shape = tuple(int(n) for n in args.mesh.split("x"))
    devices = args.shape[0] * args.shape[1]
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={devices}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return args


def load_safetensors(path):
    """The tensors of a safetensors file (8-byte little-endian header size, a JSON
    header of dtype, shape and byte range per name, then the data) as numpy arrays."""
    import numpy as np

    dtypes = {"F32": np.float32, "I32": np.int32, "F64": np.float64, "I64": np.int64}
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        array = np.frombuffer(data[start:end], dtype=dtypes[info["dtype"]])
        tensors[name] = array.reshape(info["shape"]).copy()
    return tensors


def corrections(t):
    """`1 - beta^t` for both betas, in f64, as f32: the repository's Optimizer::scalars."""
    import numpy as np

    return np.float32(1.0 - BETA1**t), np.float32(1.0 - BETA2**t)


def adamw(params, grads, m, v, correction1, correction2):
    """The repository's AdamW (lr 3e-3, betas 0.9/0.99, eps 1e-8, no weight decay), op
    for op: returns the new parameters and moments."""
    import jax.numpy as jnp
    import numpy as np

    one_minus_b1 = np.float32(1) - np.float32(BETA1)
    one_minus_b2 = np.float32(1) - np.float32(BETA2)
    new_p, new_m, new_v = {}, {}, {}
    for name, w in params.items():
        g = grads[name]
        new_m[name] = m[name] * np.float32(BETA1) + g * one_minus_b1
        new_v[name] = v[name] * np.float32(BETA2) + (g * g) * one_minus_b2
        direction = (new_m[name] / correction1) / (jnp.sqrt(new_v[name] / correction2) + np.float32(EPS))
        new_p[name] = w - direction * np.float32(LR)
    return new_p, new_m, new_v


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


def run(args, axes, specs, make_loss, data_keys, data_spec, label):
    """Times `args.steps` steps of AdamW on `make_loss(mesh)` (a function of the
    parameters dict and the data arrays named `data_keys`) on a mesh of `args.shape` with
    axis names `axes`; `specs` maps each parameter name to its `PartitionSpec`, and
    `data_spec` is the data's. Parameters and batches come from `args.dump`."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    dump = load_safetensors(args.dump)
    gspmd_losses = dump["losses"]
    batches = [tuple(dump[f"{k}.{i}"] for k in data_keys) for i in range(len(gspmd_losses))]
    devices = np.array(jax.devices()[: args.shape[0] * args.shape[1]]).reshape(args.shape)
    mesh = Mesh(devices, axes)
    loss_fn = make_loss(mesh)

    def step(params, m, v, data, correction1, correction2):
        loss, grads = jax.value_and_grad(loss_fn)(params, *data)
        return (loss, *adamw(params, grads, m, v, correction1, correction2))

    weights = {n: NamedSharding(mesh, s) for n, s in specs.items()}
    data = tuple(NamedSharding(mesh, data_spec) for _ in data_keys)
    scalar = NamedSharding(mesh, P())
    step = jax.jit(
        step,
        in_shardings=(weights, weights, weights, data, scalar, scalar),
        out_shardings=(scalar, weights, weights, weights),
        donate_argnums=(0, 1, 2),
    )
    params = {n: jax.device_put(dump[n], weights[n]) for n in specs}
    m = {n: jax.device_put(np.zeros_like(dump[n]), weights[n]) for n in specs}
    v = {n: jax.device_put(np.zeros_like(dump[n]), weights[n]) for n in specs}

    if args.report:
        report(step.lower(params, m, v, batches[0], *corrections(1)).compile().as_text())

    losses, times = [], []
    for i in range(args.steps):
        started = time.perf_counter()
        loss, params, m, v = step(params, m, v, batches[i % len(batches)], *corrections(i + 1))
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
        f"{label}, mesh {args.mesh}: median {statistics.median(times):.3f} ms/step "
        f"over {len(times)} steps (min {min(times):.3f}, max {max(times):.3f})"
    )
