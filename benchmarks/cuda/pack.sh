#!/bin/sh
# Packs a loom build for a machine with a GPU that has none of loom's build dependencies (the
# device machine of docs/cuda.md: CUDA and PyTorch, no Boost, yaml-cpp, TBB or OpenBLAS): the
# `loom` command, its libraries and plugins (the cuda backend's kernels included), the
# conformance runner and its data, and every shared library they load that is not the C
# library's, the C++ runtime's or CUDA's (those are the device machine's own), into one
# directory that benchmarks/cuda/device_check.sh runs from.
#
#   benchmarks/cuda/pack.sh [BUILD_DIR] [PACK_DIR]     (default: build, build-device)
#
# PACK_DIR matches .gitignore's /build*/, so a device tool can carry it by name. It holds one
# file, loom-device.tar.xz (the device tool carries at most 64 MiB in all: OpenBLAS, and the ICU
# data that `loom report`'s SVG rendering pulls in, are most of it), which device_check.sh
# unpacks. Left out: the MPI collective (no MPI there; one GPU) and the optimizers' recorded
# PyTorch trajectories (the optimizer suites, which the GPU does not change).
set -eu
build=${1:-build}
pack=${2:-build-device}
[ -x "$build/bin/loom" ] || { echo "pack.sh: no $build/bin/loom: build loom first" >&2; exit 2; }
[ -f "$build/lib/loom/plugins/cuda-backend-kernels.so" ] ||
  { echo "pack.sh: $build has no CUDA backend (configure with -DLOOM_CUDA=ON on a machine with a CUDA toolkit)" >&2; exit 2; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
final=$pack
pack=$stage/loom-device
mkdir -p "$pack/bin" "$pack/lib/loom/plugins" "$pack/deps"
cp "$build/bin/loom" "$pack/bin/"
[ -x "$build/bin/loom_cuda_attention_bench" ] && cp "$build/bin/loom_cuda_attention_bench" "$pack/bin/"
cp -P "$build"/lib/*.so* "$pack/lib/"
cp "$build"/lib/loom/plugins/*.so "$pack/lib/loom/plugins/"
rm -f "$pack/lib/loom/plugins/libloom-collective-mpi.so"
[ -f "$build/lib/loom/loom-conformance" ] && cp "$build/lib/loom/loom-conformance" "$pack/lib/loom/"
# The shared libraries they need, but for the C library, the C++ runtime and CUDA's, which the
# device machine has in versions at least as new.
for f in "$pack"/bin/* "$pack"/lib/*.so* "$pack"/lib/loom/plugins/*.so "$pack"/lib/loom/loom-conformance; do
  [ -f "$f" ] || continue
  ldd "$f" 2>/dev/null | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnvrtc*|libnvJitLink*) ;;
    libloom*) ;;
    *) cp -L "$lib" "$pack/deps/" ;;
  esac
done
strip --strip-unneeded "$pack"/bin/* "$pack"/lib/*.so* "$pack"/lib/loom/plugins/*.so "$pack"/deps/*.so* 2>/dev/null || true
[ -f "$pack/lib/loom/loom-conformance" ] && strip --strip-unneeded "$pack/lib/loom/loom-conformance" 2>/dev/null || true
rm -rf "$final"
mkdir -p "$final"
tar -C "$stage" -cJf "$final/loom-device.tar.xz" loom-device
echo "pack.sh: $final/loom-device.tar.xz: $(du -sh "$final/loom-device.tar.xz" | cut -f1) ($(du -sh "$pack" | cut -f1) unpacked, $(ls "$pack/deps" | wc -l) libraries carried)"
