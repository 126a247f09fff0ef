#!/bin/sh
# Installs the Debian 12 packages loom builds, tests and runs with. Run as root or with sudo.
set -e
# librsvg2-dev: `loom report --png` renders its charts with it; chromium: the test that opens the
# report in a real browser (tests/report).
packages="
  build-essential cmake ninja-build git pkg-config clang-format clang
  libboost-dev libboost-filesystem-dev libboost-program-options-dev
  libyaml-cpp-dev nlohmann-json3-dev libeigen3-dev libopenblas-dev libtbb-dev libpcre2-dev libutf8proc-dev libsentencepiece-dev
  libopenmpi-dev openmpi-bin
  librsvg2-dev chromium
  libgtest-dev libgmock-dev libbenchmark-dev python3-regex python3-torch python3-venv
"
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
missing=""
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends $missing
fi
# PyPI packages of the reference tests (transformers, tokenizers, ...), in a virtual environment.
"$(dirname "$0")/setup-python-env.sh" || echo "warning: the Python reference environment could not be set up; the tests that need it will skip"
