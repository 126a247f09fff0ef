#!/bin/sh
# Regenerates docs/config-reference.md from the options the built-in plugins declare. Run it on a
# build with every plugin (the cuda backend needs a CUDA toolkit: docs/cuda.md); a build without
# one checks the reference without the backend/cuda section (tests/docs).
#   scripts/update-config-reference.sh [BUILD_DIR]   (default: build)
set -e
build=${1:-build}
"$build/bin/loom" config schema --markdown --no-default-plugin-path --plugin-path "$build/lib/loom/plugins" \
  > docs/config-reference.md
