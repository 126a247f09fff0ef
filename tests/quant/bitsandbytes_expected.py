"""How tests/quant/quantization_test.cpp's bitsandbytes codes (Nf4.DoubleQuantizationIsBitsandbytes)
were made: by bitsandbytes 0.50.2's own CPU kernel. Not run by the tests: bitsandbytes needs a
torch >= 2.4 and the reference environment has torch 1.13, so its Python package cannot be
imported there; its kernel library can, and that is what this script calls.

  pip download --no-deps bitsandbytes==0.50.2 -d /tmp/bnb && unzip /tmp/bnb/*.whl -d /tmp/bnb
  python bitsandbytes_expected.py /tmp/bnb/bitsandbytes/libbitsandbytes_cpu.so

What it reproduces (bitsandbytes 0.50.2):
  functional.py:938-940, quantize_4bit(compress_statistics=True):
      offset = _absmax.mean(); qabsmax, state2 = quantize_blockwise(_absmax - offset, blocksize=256)
  functional.py:658, quantize_blockwise -> backends/cpu/ops.py:38-55, a float32 tensor on the CPU:
      lib.cquantize_blockwise_cpu_fp32(code, A, absmax, out, blocksize, n)
with code = create_dynamic_map() (functional.py) and the mean in float32 by torch (one thread).
The absmaxes are those of 64-value blocks of a [256, 1024] matrix whose rows 0-127, 128-191 and
192-255 are its parts (a fused q, k, v), quantized whole and part by part. It prints each case's
means, scales, a hash of the codes and the blocks whose code is not the level nearest to their
normalised value (what the kernel's 65536-point table changes).
"""
import ctypes
import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from quantization_reference import blockwise, dynamic_map  # noqa: E402

ROWS, COLS, PARTS = 256, 1024, [0, 128, 192, 256]


def matrix():
    """The test's matrix, bf16 values of a bell-shaped spread (many blocks share an absmax, as a
    bf16 checkpoint's do): each the sum of 4 of an LCG's 16-bit draws less 2 * 65535, times
    2^-23, rounded to bf16 (to nearest even)."""
    r = 12345
    vals = np.empty(ROWS * COLS, np.int64)
    for i in range(vals.size):
        s = 0
        for _ in range(4):
            r = (r * 1664525 + 1013904223) % 2**32
            s += r >> 16
        vals[i] = s - 2 * 65535
    u = (vals.astype(np.float64) * 2.0**-23).astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ int(b)) * 0x100000001B3) % 2**64
    return h


def main(lib_path):
    lib = ctypes.CDLL(lib_path)
    ptr = ctypes.c_void_p
    w = matrix()
    absmax = np.abs(w.reshape(-1, 64)).max(axis=1).astype(np.float32)
    torch.set_num_threads(1)

    def double_quantize(a):
        offset = np.float32(torch.tensor(a.tolist(), dtype=torch.float32).mean().item())
        centred = (a - offset).astype(np.float32)
        code = dynamic_map().astype(np.float32)
        out = np.empty(centred.size, np.uint8)
        scales = np.empty(-(-centred.size // 256), np.float32)
        lib.cquantize_blockwise_cpu_fp32(code.ctypes.data_as(ptr), centred.ctypes.data_as(ptr),
                                         scales.ctypes.data_as(ptr), out.ctypes.data_as(ptr),
                                         ctypes.c_longlong(256), ctypes.c_longlong(centred.size))
        return offset, scales, out

    def show(name, parts):
        offsets, scales, codes, nearest = [], [], [], []
        for b, e in zip(parts[:-1], parts[1:]):
            a = absmax[b * COLS // 64:e * COLS // 64]
            o, s, c = double_quantize(a)
            offsets.append(o)
            scales += list(s)
            codes += list(c)
            # The nearest level to each normalised value, bitsandbytes' own offset and scales.
            n, _ = blockwise((a - o).astype(np.float32), dynamic_map(), 256)
            nearest += list(n)
        print(f"// {name}")
        print("offsets:", ", ".join(f"{float(o).hex()}f" for o in offsets))
        print("scales:", ", ".join(f"{float(s).hex()}f" for s in scales))
        print("codes fnv1a64:", hex(fnv1a64(codes)))
        print("not the nearest level (block, code):",
              ", ".join(f"{{{i}, {c}}}" for i, (c, n) in enumerate(zip(codes, nearest)) if c != n))

    show("whole", [0, ROWS])
    show("parts", PARTS)


if __name__ == "__main__":
    main(sys.argv[1])
