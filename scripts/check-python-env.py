#!/usr/bin/env python3
"""Checks loom's Python reference environment (scripts/setup-python-env.sh): every package of
scripts/python-constraints.txt installed at its pinned version, and Debian's torch able to use the
NumPy it sees (torch.from_numpy, which NumPy 2 breaks for torch 1.13).

    ENV/bin/python scripts/check-python-env.py [CONSTRAINTS]

Prints one line per problem and exits 1 when there is any, 0 (with a summary) otherwise.
setup-python-env.sh runs it last, and ctest runs it as `python_env` (a reference test)."""
import os
import re
import sys
from importlib import metadata


def pins(path):
    out = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
            if not m:
                raise SystemExit("%s:%d: expected NAME==VERSION, got %r" % (path, number, line))
            out[m.group(1)] = m.group(2)
    return out


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "python-constraints.txt")
    problems = []
    expected = pins(path)
    for name, version in expected.items():
        try:
            found = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append("%s is not installed (%s pins %s)" % (name, path, version))
            continue
        if canonical(found) != canonical(version):
            problems.append("%s %s is installed, %s pins %s" % (name, found, path, version))
    try:
        import numpy
        import torch

        t = torch.from_numpy(numpy.arange(4, dtype=numpy.float32))
        if t.sum().item() != 6.0:
            problems.append("torch.from_numpy gave %r for [0, 1, 2, 3]" % (t,))
    except Exception as e:  # any failure here is the environment's, reported as such
        problems.append("torch cannot use this NumPy: torch.from_numpy raised %s: %s" % (type(e).__name__, e))
    for p in problems:
        print("python environment %s: %s" % (sys.prefix, p))
    if problems:
        print("rerun scripts/setup-python-env.sh to bring it to the pinned versions")
        return 1
    print("python environment %s: %d pinned packages as pinned; torch %s uses NumPy %s" %
          (sys.prefix, len(expected), torch.__version__, numpy.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
