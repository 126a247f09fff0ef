#!/bin/sh
# A CUDA 13.0 toolkit for building loom's CUDA plugins from PyPI's NVIDIA wheels, for a machine
# without NVIDIA's toolkit packages (docs/cuda.md, "Building"): nvcc, its NVVM and headers, the
# CUDA runtime, CCCL and cuBLAS/cuBLASLt, installed into PREFIX (default ~/.cache/loom/cuda-13.0),
# with the unversioned library names CMake's FindCUDAToolkit looks for. Prints the CMake flags
# that point a build at it.
#
#   scripts/cuda-from-wheels.sh [PREFIX]
#   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $(scripts/cuda-from-wheels.sh)
set -e
prefix=${1:-${HOME}/.cache/loom/cuda-13.0}
python=${PYTHON:-python3}
if [ ! -x "$prefix/nvidia/cu13/bin/nvcc" ]; then
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$prefix" \
    "nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" \
    "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*" "nvidia-cublas==13.0.*" >&2
fi
cuda=$prefix/nvidia/cu13
[ -x "$cuda/bin/nvcc" ] || { echo "cuda-from-wheels: no nvcc in $cuda/bin after installing the wheels" >&2; exit 1; }
# The wheels ship libcudart.so.13 and the like; a link needs libcudart.so.
for lib in cudart cublas cublasLt; do
  [ -e "$cuda/lib/lib$lib.so" ] || ln -s "lib$lib.so.13" "$cuda/lib/lib$lib.so"
done
echo "-DCMAKE_CUDA_COMPILER=$cuda/bin/nvcc -DCUDAToolkit_ROOT=$cuda"
