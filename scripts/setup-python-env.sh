#!/bin/sh
# Creates (or updates) the Python environment of loom's reference tests: a virtual environment on
# Debian's /usr/bin/python3 that sees its system packages (python3-torch, python3-regex) and adds
# the PyPI packages of scripts/python-requirements.txt (and the eval ones below), every package at
# the version scripts/python-constraints.txt pins, transitive dependencies included.
#
#   scripts/setup-python-env.sh            # -> ${LOOM_PYTHON_ENV:-$HOME/.cache/loom/python-env}
#
# CMake looks for the environment at the same place (LOOM_PYTHON_ENV) and hands its interpreter to
# the tests that need it; those tests skip, saying why, when it is missing (and fail under
# -DLOOM_REQUIRE_REFERENCE_TESTS=ON). Called by scripts/install-deps.sh; a failure here (no PyPI
# access) is reported but does not stop the build. Rerun after changing a requirements or the
# constraints file: an existing environment is brought to the pins (a NumPy 2 that an older,
# unpinned install pulled in is replaced), and scripts/check-python-env.py checks it last.
set -e
here=$(cd "$(dirname "$0")" && pwd)
env_dir=${LOOM_PYTHON_ENV:-$HOME/.cache/loom/python-env}
requirements="$here/python-requirements.txt"
eval_requirements="$here/python-eval-requirements.txt"
constraints="$here/python-constraints.txt"
stamp="$env_dir/.loom-requirements"
if [ -x "$env_dir/bin/python" ] && [ -f "$stamp" ] &&
  cat "$requirements" "$eval_requirements" "$constraints" | cmp -s - "$stamp" &&
  "$env_dir/bin/python" "$here/check-python-env.py" "$constraints" >/dev/null 2>&1; then
  exit 0
fi
echo "setting up the Python reference environment in $env_dir"
/usr/bin/python3 -m venv --system-site-packages "$env_dir"
pip() { "$env_dir/bin/pip" install -q --disable-pip-version-check "$@"; }
pip -c "$constraints" -r "$requirements"
"$env_dir/bin/python" -c "import torch, transformers, safetensors, tokenizers, sentencepiece, tensorboard"
# PEFT for the LoRA test (tests/interop/peft_test.cpp), without dependencies: pip would replace
# Debian's torch 1.13.0a0 (a pre-release to pip) with a wheel. accelerate is the one PEFT imports.
pip --no-deps -c "$constraints" peft accelerate || echo "peft was not installed: the LoRA test against PEFT will skip"
# lm-evaluation-harness for `loom eval`'s agreement test (tests/eval/harness_test.cpp): lm-eval without
# dependencies (it names torch), then its dependencies, pinned, none of which needs torch. It runs on
# Debian's torch 1.13 with transformers 4.46.3.
{ pip --no-deps -c "$constraints" lm-eval && pip -c "$constraints" -r "$eval_requirements" &&
  "$env_dir/bin/python" -c "import lm_eval.evaluator, lm_eval.models.huggingface"; } ||
  echo "lm-eval was not installed: the agreement test of loom eval will skip"
# Every package at its pin, whatever an earlier install left (pip keeps an installed version that
# satisfies a requirement, even one newer than what the tests were run with).
pip --no-deps -r "$constraints"
"$env_dir/bin/python" "$here/check-python-env.py" "$constraints"
cat "$requirements" "$eval_requirements" "$constraints" >"$stamp"
