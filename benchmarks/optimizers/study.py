#!/usr/bin/env python3
"""The optimizer study of docs/optimizers.md: the quickstart model (a 4-layer GPT-2) on
character-level tiny Shakespeare (--data synthetic: on the quickstart's synthetic corpus) trained
for a fixed number of steps with each optimizer at each learning rate of
a small grid; the best rate of each optimizer (lowest final validation loss) is run once more, the
six best runs back to back so that their seconds compare, and goes into a Markdown table (loss
after the step budget and after a budget of seconds) and a plot of the loss against steps and
seconds, both made from the runs' metrics.jsonl.

    benchmarks/optimizers/study.py [--build build] [--steps 150] [--data shakespeare|synthetic]
                                   [--out benchmarks/optimizers/results]
    benchmarks/optimizers/study.py --report-only --out DIR     (table and plot from earlier runs)

The plot needs matplotlib (e.g. the loom Python environment: pip install matplotlib); without it
only the table is written. Run from the repository root.
"""

import argparse
import json
import os
import subprocess
import sys

ARGS = None  # the parsed command line

# optimizer -> (extra overrides, learning rates); the grid brackets each optimizer's usual rate.
GRID = {
    "adamw": ([], [2e-3, 4e-3, 8e-3]),
    "sgd": (["optimizer.momentum=0.9", "optimizer.nesterov=true"], [0.03, 0.1, 0.3]),
    "lion": ([], [2e-4, 5e-4, 1e-3, 2e-3]),
    "adafactor": ([], [1e-2, 3e-2, 1e-1, 3e-1]),
    "muon": ([], [0.02, 0.05, 0.1, 0.2]),
    "soap": ([], [3e-3, 6e-3, 1.2e-2, 2.4e-2]),
}


# --data: the overrides that choose the corpus (the byte tokenizer makes ASCII text character-level).
DATA = {
    "shakespeare": ["data.type=text", "data.paths=[configs/data/tinyshakespeare.txt]"],
    "synthetic": [],
}


def run(build, out, name, lr, extra, steps):
    run_dir = os.path.join(out, "%s-lr%g" % (name, lr))
    if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        return run_dir
    cmd = [os.path.join(build, "bin", "loom"), "train", "configs/quickstart.yaml", "optimizer.type=" + name,
           "optimizer.learning_rate=%g" % lr, "trainer.num_train_steps=%d" % steps, "lr_schedule.warmup=%d" % (steps // 10),
           "trainer.log_every=5", "trainer.steps_per_eval=0", "trainer.sample_length=0", "trainer.save_final=false",
           "trainer.trackers=[jsonl]", "trainer.run_dir=" + run_dir,
           # float32 products, as the recorded table in docs/optimizers.md (the cpu backend's
           # default computes them in bf16 where the CPU has AVX512-BF16).
           "backend.matmul_precision=f32"] + DATA[ARGS.data] + extra
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return run_dir


def read(run_dir):
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if line.strip()]
    train = [(r["step"], r["throughput/elapsed_seconds"], r["train/loss"]) for r in rows if "train/loss" in r]
    evals = [r["eval/loss"] for r in rows if "eval/loss" in r]
    return train, (evals[-1] if evals else float("nan"))


def loss_at_seconds(train, seconds):
    """The last logged train loss at or before `seconds` of the run."""
    best = None
    for _, t, loss in train:
        if t <= seconds:
            best = loss
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--out", default=os.path.join("benchmarks", "optimizers", "results"))
    parser.add_argument("--data", choices=sorted(DATA), default="shakespeare")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    global ARGS
    ARGS = args
    os.makedirs(args.out, exist_ok=True)

    best = {}
    for name, (extra, lrs) in GRID.items():
        for lr in lrs:
            run_dir = os.path.join(args.out, "%s-lr%g" % (name, lr))
            if not args.report_only:
                run_dir = run(args.build, args.out, name, lr, extra, args.steps)
            if not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
                continue
            train, final_eval = read(run_dir)
            if name not in best or final_eval < best[name][2]:
                best[name] = (lr, train, final_eval)

    # The grid's runs are spread over time, and the machine's load with them: the best run of each
    # optimizer is run again, one after the other, for the seconds (the losses are the same bits).
    if not args.report_only:
        for name, (lr, _, final_eval) in list(best.items()):
            final_dir = os.path.join(args.out, "final")
            os.makedirs(final_dir, exist_ok=True)
            train, _ = read(run(args.build, final_dir, name, lr, GRID[name][0], args.steps))
            best[name] = (lr, train, final_eval)
    else:
        for name, (lr, train, final_eval) in list(best.items()):
            final_dir = os.path.join(args.out, "final", "%s-lr%g" % (name, lr))
            if os.path.exists(os.path.join(final_dir, "metrics.jsonl")):
                best[name] = (lr, read(final_dir)[0], final_eval)

    # The seconds budget: the time the fastest optimizer's best run took.
    budget = min(train[-1][1] for _, train, _ in best.values())
    lines = ["| optimizer | tuned learning rate (of the grid) | train loss after %d steps | validation loss after %d steps | train loss after %.0f s | seconds for %d steps |"
             % (args.steps, args.steps, budget, args.steps),
             "| --- | --- | --- | --- | --- | --- |"]
    for name, (lr, train, final_eval) in sorted(best.items(), key=lambda kv: kv[1][2]):
        lines.append("| `%s` | %g (of %s) | %.4f | %.4f | %.4f | %.1f |"
                     % (name, lr, ", ".join("%g" % x for x in GRID[name][1]), train[-1][2], final_eval,
                        loss_at_seconds(train, budget), train[-1][1]))
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (lr, train, _) in sorted(best.items()):
        steps = [s for s, _, _ in train]
        seconds = [t for _, t, _ in train]
        losses = [l for _, _, l in train]
        by_step.plot(steps, losses, label="%s (lr %g)" % (name, lr))
        by_time.plot(seconds, losses, label=name)
    for ax, xlabel in ((by_step, "step"), (by_time, "seconds")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("train loss")
        ax.set_ylim(top=4.0)
        ax.grid(alpha=0.3)
    by_step.legend()
    corpus = "tiny Shakespeare, characters" if args.data == "shakespeare" else "the synthetic corpus"
    fig.suptitle("quickstart GPT-2 (4 layers, 128 wide) on %s, best rate of each optimizer" % corpus)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "optimizers.png"), dpi=90)


if __name__ == "__main__":
    main()
