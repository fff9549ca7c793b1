"""Checks gspmd's StableHLO export with real XLA (JAX 0.12 on CPU).

    python tools/xla_check.py DIR

DIR holds one directory per case, as `cargo run --example export_check -- DIR` writes
them: `per_device.mlir` (gspmd's partitioned program in an `sdy.manual_computation`),
`global.mlir` (the propagated program, every value's sharding as an `sdy` constraint),
`traced.mlir` (the traced program with the user's annotations only), the inputs and
gspmd's thread-mesh outputs (`inputs.safetensors`, `outputs.safetensors`), gspmd's
collective counts and the mesh's device count.

Each module is compiled by XLA for that many CPU devices (one partition each, Shardy
partitioner), run on the inputs sharded as the module's parameters say, and its outputs
are compared with gspmd's: floats to 1e-5 of the tensor's largest magnitude, integers
and booleans exactly. XLA runs with `--xla_allow_excess_precision=false`: gspmd rounds
every bf16 value, and so must XLA for the values to be comparable. For every form it prints the collectives in XLA's optimized
per-device HLO beside those of gspmd's per-device program. Exits non-zero if a module
fails to compile or run, or an output differs.
"""

import json
import os
import re
import struct
import sys
from pathlib import Path

TOLERANCE = 1e-5
FORMS = ("per_device", "global", "traced")
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def read_safetensors(path):
    """The tensors of a safetensors file, by name, as numpy arrays."""
    import ml_dtypes
    import numpy as np

    dtypes = {
        "F32": np.float32,
        "BF16": ml_dtypes.bfloat16,
        "F16": np.float16,
        "I32": np.int32,
        "BOOL": np.bool_,
    }
    data = Path(path).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    body = data[8 + size :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        array = np.frombuffer(body[start:end], dtype=dtypes[info["dtype"]])
        tensors[name] = array.reshape(info["shape"])
    return [tensors[k] for k in sorted(tensors)]


def xla_collectives(hlo_text):
    """Counts of each collective kind in optimized HLO text (async pairs once)."""
    return {k: n for k, (n, _) in xla_collective_sizes(hlo_text).items()}


ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4}


def xla_collective_sizes(hlo_text):
    """Each collective kind in optimized HLO text: (count, bytes of their results per
    device), async pairs once (a `-start`'s result tuple counts its last shape), each op
    once however often a loop runs it."""
    sizes = {}
    shape = re.compile(r"\b(pred|[suf]\d+|bf16)\[([\d,]*)\]")
    for kind in KINDS:
        pattern = re.compile(rf"^\s*(ROOT )?%\S+ = (.*) {kind}(-start)?\(")
        for line in hlo_text.splitlines():
            match = pattern.search(line)
            if not match:
                continue
            shapes = shape.findall(match.group(2))
            if match.group(3):
                shapes = shapes[-1:]
            total = 0
            for dtype, dims in shapes:
                count = 1
                for d in filter(None, dims.split(",")):
                    count *= int(d)
                total += count * ELEMENT_BYTES.get(dtype, 8)
            n, b = sizes.get(kind.replace("-", "_"), (0, 0))
            sizes[kind.replace("-", "_")] = (n + 1, b + total)
    return sizes


def gspmd_collectives(case):
    counts = {}
    for line in (case / "gspmd_collectives.txt").read_text().splitlines():
        if line.strip():
            kind, n = line.split()[:2]
            counts[kind] = int(n)
    return counts


def compare(got, want):
    """The worst difference of `got` from `want`: relative to want's largest magnitude
    for floats, a count of unequal elements otherwise."""
    import numpy as np

    if got.shape != want.shape:
        return float("inf"), f"shape {got.shape} != {want.shape}"
    if np.issubdtype(want.dtype, np.integer) or want.dtype == np.bool_:
        wrong = int(np.sum(got != want))
        return float(wrong), f"{wrong} elements differ"
    got = got.astype(np.float64)
    want = want.astype(np.float64)
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1e-30)
    err = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
    return err, f"max |diff| / max |want| = {err:.2e}"


def run(text, devices, inputs):
    """Compiles `text` for `devices`, runs it on `inputs`; outputs and HLO text."""
    import jax
    import numpy as np
    from jax._src import compiler
    from jax._src.lib import _jax
    from jax._src.sharding_impls import GSPMDSharding

    backend = jax.extend.backend.get_backend()
    n = len(devices)
    options = compiler.get_compile_options(
        num_replicas=1,
        num_partitions=n,
        device_assignment=np.array(devices).reshape(1, n),
        backend=backend,
    )
    options.executable_build_options.use_shardy_partitioner = True
    exe = backend.compile_and_load(text, _jax.DeviceList(tuple(devices)), options)
    params = exe.get_parameter_shardings()
    args = [
        jax.device_put(x, GSPMDSharding(devices, s)) for x, s in zip(inputs, params)
    ]
    results = exe.execute_sharded(args).disassemble_into_single_device_arrays()
    outs = []
    for shards, sharding, shape in zip(
        results, exe.get_output_shardings(), (s for s in output_shapes(text))
    ):
        array = jax.make_array_from_single_device_arrays(
            shape, GSPMDSharding(devices, sharding), shards
        )
        outs.append(np.asarray(array))
    return outs, exe.hlo_modules()[0].to_string()


def output_shapes(text):
    """The global result shapes of `@main`, from its signature."""
    signature = re.search(r"func\.func public @main\(.*?\) -> \((.*)\) \{\n", text)
    results = signature.group(1) if signature else ""
    shapes = []
    for dims in re.findall(r"tensor<([0-9x]*)(?:[a-z]+[0-9]+)>", results):
        shapes.append(tuple(int(d) for d in dims.split("x") if d))
    return shapes


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "target/export_check")
    cases = sorted(p for p in root.iterdir() if (p / "devices.txt").exists())
    if not cases:
        print(f"no cases under {root}")
        return 1
    most = max(int((c / "devices.txt").read_text()) for c in cases)
    flags = os.environ.get("XLA_FLAGS", "")
    # XLA may skip a bf16 result's rounding when a convert to f32 follows (excess
    # precision, on by default); gspmd rounds every bf16 value, so exact bf16 semantics
    # are asked for (without it a bf16 product converted to i32 differed by one).
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_force_host_platform_device_count={most}"
        " --xla_allow_excess_precision=false"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.extend  # noqa: F401  (the backend accessor)

    print(f"JAX {jax.__version__}, {len(jax.devices())} CPU devices")
    failures = []
    for case in cases:
        n = int((case / "devices.txt").read_text())
        devices = jax.devices()[:n]
        inputs = read_safetensors(case / "inputs.safetensors")
        wants = read_safetensors(case / "outputs.safetensors")
        print(f"\n== {case.name} ({n} devices, {len(inputs)} inputs, {len(wants)} outputs)")
        print(f"   gspmd collectives:          {gspmd_collectives(case)}")
        for form in FORMS:
            path = case / f"{form}.mlir"
            if not path.exists():
                continue
            try:
                outs, hlo = run(path.read_text(), devices, inputs)
            except Exception as e:  # a compile or run failure is a finding, not a crash
                first = str(e).strip().splitlines()[0][:300] if str(e).strip() else repr(e)
                print(f"   {form:<11} FAILED: {type(e).__name__}: {first}")
                failures.append(f"{case.name}/{form}: {first}")
                continue
            worst, worst_text = 0.0, "no outputs"
            bad = []
            for k, (got, want) in enumerate(zip(outs, wants)):
                err, text = compare(got, want)
                exact = not (want.dtype.kind == "f" or "bfloat16" in str(want.dtype))
                limit = 0 if exact else TOLERANCE
                if err > limit:
                    bad.append(f"output {k}: {text}")
                if err >= worst:
                    worst, worst_text = err, f"output {k}: {text}"
            if len(outs) != len(wants):
                bad.append(f"{len(outs)} outputs, gspmd has {len(wants)}")
            status = "ok" if not bad else "DIFFERS"
            print(f"   {form:<11} {status}; worst {worst_text}")
            print(f"   {'':<11} XLA collectives: {xla_collectives(hlo)}")
            for b in bad[:5]:
                print(f"   {'':<11} {b}")
            if bad:
                failures.append(f"{case.name}/{form}: {bad[0]}")
    print()
    if failures:
        print(f"{len(failures)} failures:")
        for f in failures:
            print(f"  {f}")
        return 1
    print(f"all {len(cases)} cases agree with gspmd under XLA in every form")
    return 0


if __name__ == "__main__":
    sys.exit(main())
