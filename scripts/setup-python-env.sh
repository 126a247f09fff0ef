#!/bin/sh
# Creates (or updates) the Python environment of loom's reference tests: a virtual environment on
# Debian's /usr/bin/python3 that sees its system packages (python3-torch, python3-regex) and adds
# the pinned PyPI packages of scripts/python-requirements.txt.
#
#   scripts/setup-python-env.sh            # -> ${LOOM_PYTHON_ENV:-$HOME/.cache/loom/python-env}
#
# CMake looks for the environment at the same place (LOOM_PYTHON_ENV) and hands its interpreter to
# the tests that need it; those tests skip, saying why, when it is missing. Called by
# scripts/install-deps.sh; a failure here (no PyPI access) is reported but does not stop the build.
set -e
here=$(cd "$(dirname "$0")" && pwd)
env_dir=${LOOM_PYTHON_ENV:-$HOME/.cache/loom/python-env}
requirements="$here/python-requirements.txt"
eval_requirements="$here/python-eval-requirements.txt"
stamp="$env_dir/.loom-requirements"
if [ -x "$env_dir/bin/python" ] && [ -f "$stamp" ] && cat "$requirements" "$eval_requirements" | cmp -s - "$stamp"; then
  exit 0
fi
echo "setting up the Python reference environment in $env_dir"
/usr/bin/python3 -m venv --system-site-packages "$env_dir"
"$env_dir/bin/pip" install -q --disable-pip-version-check -r "$requirements"
"$env_dir/bin/python" -c "import torch, transformers, safetensors, tokenizers, sentencepiece"
# PEFT for the LoRA test (tests/interop/peft_test.cpp), without dependencies: pip would replace
# Debian's torch 1.13.0a0 (a pre-release to pip) with a wheel. accelerate is the one PEFT imports.
"$env_dir/bin/pip" install -q --disable-pip-version-check --no-deps peft==0.13.2 accelerate==0.34.2 ||
  echo "peft was not installed: the LoRA test against PEFT will skip"
# lm-evaluation-harness for `loom eval`'s agreement test (tests/eval/harness_test.cpp): lm-eval without
# dependencies (it names torch), then its dependencies, pinned, none of which needs torch. It runs on
# Debian's torch 1.13 with transformers 4.46.3.
{ "$env_dir/bin/pip" install -q --disable-pip-version-check --no-deps lm-eval==0.4.5 &&
  "$env_dir/bin/pip" install -q --disable-pip-version-check -r "$eval_requirements" &&
  "$env_dir/bin/python" -c "import lm_eval.evaluator, lm_eval.models.huggingface"; } ||
  echo "lm-eval was not installed: the agreement test of loom eval will skip"
cat "$requirements" "$eval_requirements" >"$stamp"
