#!/usr/bin/env python3
"""20 random SIGKILLs of a longer `loom train` run, each resumed with the same command.

For the record (issue 9.6): every trial starts a fresh run directory, kills the run with SIGKILL
at a random point, runs the same command again (trainer.resume: auto continues from the latest
checkpoint) and compares the final model.safetensors byte for byte, and the losses of
metrics.jsonl, with those of one uninterrupted run. Odd trials slow each stage of a checkpoint
write (LOOM_TEST_CHECKPOINT_STAGE_DELAY_MS) and kill inside one. Prints how many resumes were
byte-identical.

    benchmarks/checkpoint/kill_resume.py [BUILD_DIR] [--trials 20]
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

CONFIG = """
model: {type: gpt2, seq_len: 64, hidden_dim: 64, num_layers: 2, num_heads: 4, attention: flash, resid_pdrop: 0.1}
tokenizer: byte
data: {type: synthetic, num_documents: 4000}
optimizer: {type: adamw, learning_rate: 2.0e-3, weight_decay: 0.1}
lr_schedule: {type: cosine, warmup: 20}
trainer:
  num_train_steps: 600
  train_batch_size: 8
  microbatch_size: 4
  log_every: 5
  steps_per_eval: 100
  max_eval_batches: 4
  sample_length: 32
  skip_bad_steps: true
  peak_flops: 1.0e9
  run_id: kill-resume
  trackers: [jsonl]
  checkpoint: {save_every_steps: 25, keep_last: 2}
"""
STEPS = 600


def last_step(run):
    step = -1
    try:
        with open(os.path.join(run, "metrics.jsonl")) as f:
            for line in f:
                try:
                    step = json.loads(line)["step"]
                except (ValueError, KeyError):
                    pass
    except FileNotFoundError:
        pass
    return step


def losses(run):
    out = []
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            out.append((r["step"], r.get("train/loss"), r.get("train/grad_norm"), r.get("eval/loss")))
    return out


def writing(run):
    d = os.path.join(run, "checkpoints")
    return os.path.isdir(d) and any(n.startswith(".tmp-step-") for n in os.listdir(d))


def train(loom, config, run, env=None):
    return subprocess.Popen([loom, "train", config, "trainer.run_dir=" + run], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build", nargs="?", default="build")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    loom = os.path.join(args.build, "bin", "loom")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="loom-kill-resume-") as tmp:
        config = os.path.join(tmp, "run.yaml")
        with open(config, "w") as f:
            f.write(CONFIG)
        reference = os.path.join(tmp, "reference")
        t0 = time.time()
        if train(loom, config, reference).wait() != 0:
            sys.exit("the reference run failed")
        print("reference run: %d steps in %.1f s; seed %d" % (STEPS, time.time() - t0, seed), flush=True)
        with open(os.path.join(reference, "model.safetensors"), "rb") as f:
            want_weights = f.read()
        want_losses = losses(reference)
        identical = 0
        for trial in range(args.trials):
            run = os.path.join(tmp, "trial-%d" % trial)
            in_write = trial % 2 == 1
            env = dict(os.environ)
            if in_write:
                env["LOOM_TEST_CHECKPOINT_STAGE_DELAY_MS"] = "25"
            proc = train(loom, config, run, env)
            if in_write:  # a random checkpoint write, then a random instant inside it (or just after)
                writes = rng.randrange(1, STEPS // 25 - 1)
                seen = 0
                while proc.poll() is None and seen < writes:
                    while proc.poll() is None and not writing(run):
                        time.sleep(0.0005)
                    seen += 1
                    if seen < writes:
                        while proc.poll() is None and writing(run):
                            time.sleep(0.0005)
                time.sleep(rng.uniform(0, 0.1))
                where = "in checkpoint write %d" % writes
            else:  # once a random step is logged, after a random delay of up to one step
                target = rng.randrange(1, STEPS - 5)
                while proc.poll() is None and last_step(run) < target:
                    time.sleep(0.0005)
                time.sleep(rng.uniform(0, 0.03))
                where = "after step %d" % target
            if proc.poll() is not None:
                print("trial %2d: the run ended before the kill (%s)" % (trial, where))
                continue
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            left = sorted(os.listdir(os.path.join(run, "checkpoints"))) if os.path.isdir(
                os.path.join(run, "checkpoints")) else []
            if train(loom, config, run).wait() != 0:
                print("trial %2d: killed %s; the resumed run FAILED" % (trial, where))
                continue
            with open(os.path.join(run, "model.safetensors"), "rb") as f:
                same_weights = f.read() == want_weights
            same_losses = losses(run) == want_losses
            identical += same_weights and same_losses
            print("trial %2d: killed %-26s left %-50s -> weights %s, metrics %s" %
                  (trial, where, " ".join(left), "identical" if same_weights else "DIFFER",
                   "identical" if same_losses else "DIFFER"), flush=True)
        print("%d of %d resumed runs ended byte-identical to the uninterrupted one" % (identical, args.trials))
        return 0 if identical == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
