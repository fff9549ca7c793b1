"""Runs the training steps of the LM (`examples/train_transformer.rs`), the U-Net
(`train_unet.rs`) and the MoE (`train_moe.rs`) with gspmd and with their JAX twins
(`lm_step.py`, `unet_step.py`, `moe_step.py`), alternating, and prints a table of the
medians, their ratio and how far JAX's first losses are from gspmd's; with `--readme`
it also rewrites that table in benches/README.md (between the `jax-table` markers).

Each row first runs the gspmd step once with `--dump` (initial parameters, first
batches and losses), which JAX then replays. Then the row's rounds (5; 3 for the
d_model 512 and 1024 rows, whose steps take seconds; `--rounds` sets every row's), each
one gspmd process and one JAX process, the order alternating from round to round (gspmd first in
odd rounds, JAX first in even ones). JAX gets exactly as many host devices as the
row's mesh (`XLA_FLAGS=--xla_force_host_platform_device_count=N`); rows on one device
run both sides under `taskset -c 0` (one core: XLA then sizes its pool to one thread).
A process reports the median ms/step of its timed steps; the table shows the median
over rounds of those, and the ratio is the median of the per-round ratios gspmd/JAX
(so a drift of the machine's speed cancels). The machine's load average is printed
per row: the machines are shared, so compare ratios only between runs at similar load.

    python3 benches/jax/compare.py --python /path/to/venv/bin/python --readme

Setup: benches/README.md. Needs only the standard library; the JAX side runs under
`--python`.
"""

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
README = os.path.join(ROOT, "benches", "README.md")
BEGIN, END = "<!-- jax-table:begin -->", "<!-- jax-table:end -->"
MEDIAN = re.compile(r"median ([0-9.]+) ms/step")
LOSS_DIFF = re.compile(r"max relative difference ([0-9.e+-]+)")
# The losses of the first steps must agree to this, relative.
LOSS_TOLERANCE = 1e-5


class Row:
    """One line of the table: `example` with `flags` on `mesh`, against `script`, for
    `steps` steps (`warmup` of them untimed) per process and `rounds` rounds; `pinned`
    runs both sides on CPU 0. The rows of steps of a few milliseconds time a few hundred
    steps per process over 5 rounds: on a shared host their ratio swings by up to 0.3
    from one round to the next, and one process of 30 steps lasts less than a second."""

    def __init__(self, name, example, script, flags, mesh, steps, warmup=3, rounds=5):
        self.name, self.example, self.script, self.flags = name, example, script, flags
        self.mesh, self.steps, self.warmup, self.rounds = mesh, steps, warmup, rounds
        a, b = (int(n) for n in mesh.split("x"))
        self.devices = a * b
        self.pinned = self.devices == 1


LM, UNET, MOE = ("train_transformer", "lm_step.py"), ("train_unet", "unet_step.py"), ("train_moe", "moe_step.py")
ROWS = [
    Row("LM, 1 device (one core)", *LM, ["--dims", "small"], "1x1", 150, warmup=5),
    Row("LM, 2x1", *LM, ["--dims", "small"], "2x1", 150, warmup=5),
    Row("LM, 1x2", *LM, ["--dims", "small"], "1x2", 150, warmup=5),
    Row("LM, 2x4", *LM, ["--dims", "small"], "2x4", 150, warmup=5),
    Row("LM d_model 128, 1 device (one core)", *LM, ["--dims", "128"], "1x1", 12),
    Row("LM d_model 256, 1 device (one core)", *LM, ["--dims", "256"], "1x1", 8),
    Row("LM d_model 512, 1 device (one core)", *LM, ["--dims", "512"], "1x1", 6, warmup=2, rounds=3),
    Row("LM d_model 1024, 1 device (one core)", *LM, ["--dims", "1024"], "1x1", 5, warmup=2, rounds=3),
    Row("U-Net, 1 device (one core)", *UNET, [], "1x1", 100, warmup=5),
    Row("U-Net, 2x4", *UNET, [], "2x4", 100, warmup=5),
    Row("MoE, 1 device (one core)", *MOE, [], "1x1", 300, warmup=5),
    Row("MoE, 2x4", *MOE, [], "2x4", 300, warmup=5),
]


def run(command, pinned, env=None):
    """Runs `command` (on CPU 0 only when `pinned`) and returns its standard output."""
    if pinned:
        command = ["taskset", "-c", "0", *command]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def median_of(output):
    return float(MEDIAN.search(output).group(1))


def load():
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def measure(row, args, tmp):
    """Runs `row`'s rounds; returns gspmd's and JAX's medians, the ratio, the largest
    loss difference and the load average before and after."""
    before = load()
    dump = os.path.join(tmp, f"{row.example}_{'_'.join(row.flags)}_{row.mesh}.safetensors")
    common = ["--mesh", row.mesh, "--warmup", str(row.warmup)]
    gspmd = [os.path.join(ROOT, "target", "release", "examples", row.example), str(row.steps), "--bench",
             *row.flags, *common]
    jax = [args.python, os.path.join(HERE, row.script), "--dump", dump, "--steps", str(row.steps), *common]
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={row.devices}")
    run([*gspmd, "--dump", dump], row.pinned)
    ours, theirs, diffs = [], [], []
    for r in range(args.rounds or row.rounds):
        sides = ["gspmd", "jax"] if r % 2 == 0 else ["jax", "gspmd"]
        for side in sides:
            if side == "gspmd":
                ours.append(median_of(run(gspmd, row.pinned)))
            else:
                output = run(jax, row.pinned, env)
                theirs.append(median_of(output))
                diffs.append(float(LOSS_DIFF.search(output).group(1)))
        print(f"  {row.name}, round {r + 1} ({' then '.join(sides)}): gspmd {ours[-1]:.2f} ms, "
              f"JAX {theirs[-1]:.2f} ms", flush=True)
    ratio = statistics.median(a / b for a, b in zip(ours, theirs))
    return statistics.median(ours), statistics.median(theirs), ratio, max(diffs), before, load()


def table(results):
    lines = ["| configuration | gspmd ms/step | JAX ms/step | gspmd/JAX | first losses, max rel. diff | load before / after |",
             "|---|---|---|---|---|---|"]
    for name, (ours, theirs, ratio, diff, before, after) in results:
        flag = "" if diff <= LOSS_TOLERANCE else " (over 1e-5)"
        lines.append(f"| {name} | {ours:.1f} | {theirs:.1f} | {ratio:.2f}x | {diff:.1e}{flag} | {before} / {after} |")
    return "\n".join(lines)


def rewrite_readme(text):
    with open(README) as f:
        readme = f.read()
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    with open(README, "w") as f:
        f.write(readme[:start] + "\n" + text + "\n" + readme[end:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=os.environ.get("JAX_PYTHON", "python3"),
                        help="the Python that has JAX (default $JAX_PYTHON or python3)")
    parser.add_argument("--rounds", type=int,
                        help="alternating rounds of every row (default: the row's, 5 or 3)")
    parser.add_argument("--only", help="run only the rows whose name contains this")
    parser.add_argument("--readme", action="store_true",
                        help="rewrite the table in benches/README.md (all rows only)")
    parser.add_argument("--no-build", action="store_true", help="skip `cargo build --release`")
    args = parser.parse_args()
    if args.readme and args.only:
        parser.error("--readme rewrites the whole table: run it without --only")
    if not args.no_build:
        examples = sorted({row.example for row in ROWS})
        command = ["cargo", "build", "--release", *(a for e in examples for a in ("--example", e))]
        subprocess.run(command, cwd=ROOT, check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    started = datetime.datetime.now(datetime.timezone.utc)
    rounds = f"{args.rounds} alternating rounds" if args.rounds else "5 alternating rounds (3 for d_model 512 and 1024)"
    print(f"{rounds}; commit {commit}; load average {load()}", flush=True)

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for row in ROWS:
            if not args.only or args.only in row.name:
                results.append((row.name, measure(row, args, tmp)))

    text = table(results)
    print()
    print(text)
    finished = datetime.datetime.now(datetime.timezone.utc)
    flag = f" --rounds {args.rounds}" if args.rounds else ""
    note = (f"\n`compare.py --readme{flag}` ({rounds}) at commit {commit}, "
            f"{started:%Y-%m-%d %H:%M}-{finished:%H:%M} UTC; load average (1/5/15 min) per row in the last column.")
    print(note)
    if args.readme:
        rewrite_readme(text + "\n" + note)
        print(f"rewrote the table in {README}")
    if any(r[1][3] > LOSS_TOLERANCE for r in results):
        sys.exit(f"first losses differ from gspmd's by more than {LOSS_TOLERANCE} relative")


if __name__ == "__main__":
    main()
