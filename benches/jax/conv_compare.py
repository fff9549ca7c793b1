"""Runs the convolution kernel bench (`gspmd-core/benches/conv.rs`, group
`conv_passes`: forward, input gradient and kernel gradient of each layer) and JAX's
`lax.conv_general_dilated` on the same shapes (`conv_passes.py`), both on one core
(`taskset -c 0`, JAX with one host device), the two sides alternating in order from
round to round, and prints per pass the medians over rounds and the median of the
per-round ratios gspmd/JAX.

    cargo bench -p gspmd-core --bench conv --no-run
    python3 benches/jax/conv_compare.py --python /path/to/venv/bin/python

Needs only the standard library; the JAX side runs under `--python`.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# criterion: "conv_passes/<layer>/<pass>" then "time: [low median high]" (maybe on
# the next line).
CRITERION = re.compile(
    r"(conv_passes/\S+)\s+time:\s+\[\S+ \S+ ([0-9.]+) (ns|µs|us|ms|s) ", re.S)
UNIT = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}


def run(command, env=None):
    command = ["taskset", "-c", "0", *command]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def gspmd_side(binary):
    """Microseconds per pass from one criterion run of the `conv_passes` group (of the
    built bench `binary`, or through cargo)."""
    command = [binary, "--bench"] if binary else [
        "cargo", "bench", "-q", "-p", "gspmd-core", "--bench", "conv", "--"]
    out = run([*command, "conv_passes"])
    return {name: float(t) * UNIT[unit] for name, t, unit in CRITERION.findall(out)}


def jax_side(python, seconds):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=1")
    out = run([python, os.path.join(HERE, "conv_passes.py"), "--seconds", str(seconds)],
              env)
    return {name: float(t) for name, t in (line.split() for line in out.splitlines())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=os.environ.get("JAX_PYTHON", "python3"),
                        help="a Python with jax 0.12 installed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="JAX's timing per pass")
    parser.add_argument("--bench-binary", help="the built conv bench (else cargo bench)")
    args = parser.parse_args()
    os.chdir(ROOT)
    rounds = []
    for r in range(args.rounds):
        sides = [("gspmd", lambda: gspmd_side(args.bench_binary)), ("jax", lambda: jax_side(args.python, args.seconds))]
        if r % 2:
            sides.reverse()
        times = {name: side() for name, side in sides}
        rounds.append(times)
        print(f"round {r + 1}: {' then '.join(name for name, _ in sides)}", file=sys.stderr)
    names = [n for n in rounds[0]["jax"] if all(n in t["gspmd"] for t in rounds)]
    print("| layer / pass | gspmd µs | JAX µs | gspmd/JAX |")
    print("|---|---|---|---|")
    for n in names:
        g = statistics.median(t["gspmd"][n] for t in rounds)
        j = statistics.median(t["jax"][n] for t in rounds)
        ratio = statistics.median(t["gspmd"][n] / t["jax"][n] for t in rounds)
        print(f"| {n.removeprefix('conv_passes/')} | {g:.1f} | {j:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
