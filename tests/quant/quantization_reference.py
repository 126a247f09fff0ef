"""Reference for loom's quantization codecs (tests/quant/quantization_test.cpp).

bitsandbytes (>= 0.44, the releases that quantize on the CPU) needs torch >= 2.4, and the reference
environment has Debian's torch 1.13: so this is a from-scratch NumPy version of QLoRA's algorithm
(Dettmers et al. 2023, section 3) as bitsandbytes' reference ("default" backend) kernels compute it,
not loom's code translated:

  python quantization_reference.py DIR

reads DIR/cases.json ([{"name", "rows", "cols"}]) and DIR/NAME.f32 (row-major float32) and writes,
for each case, NAME.nf4 (packed codes), NAME.absmax_codes (uint8), NAME.absmax_scales (float32),
NAME.nf4_dequant (float32), NAME.int8 (int8), NAME.int8_scales (float32), and DIR/reference.json
(the NormalFloat levels derived from normal quantiles, the absmax offsets). Exits 77 without NumPy
or torch.
"""
import json
import os
import statistics
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"numpy or torch is not available: {e}", file=sys.stderr)
    sys.exit(77)


def normal_float_levels(offset=0.9677083):
    """The paper's NF4 construction (bitsandbytes' create_normal_map(offset, use_extra_value=True)):
    8 positive quantiles of N(0, 1) over [0.5, offset], 7 negative ones, and an exact 0, scaled to
    [-1, 1]. Quantiles from Python's statistics.NormalDist (scipy is not in the environment)."""
    ppf = statistics.NormalDist().inv_cdf
    pos = [ppf(p) for p in np.linspace(offset, 0.5, 9)[:-1]]
    neg = [-ppf(p) for p in np.linspace(offset, 0.5, 8)[:-1]]
    v = np.array(sorted(pos + [0.0] + neg), dtype=np.float64)
    return v / v.max()


def dynamic_map():
    """bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), with its
    float32 torch.linspace (NumPy's linspace rounds differently in the last bit)."""
    data = []
    for i in range(7):
        boundaries = torch.linspace(0.1, 1, 2**i + 1, dtype=torch.float32)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist()
        data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0.0, 1.0]
    return np.array(sorted(data), dtype=np.float32)


# bitsandbytes' table (functional.get_4bit_type("nf4")), the one its kernels use.
NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], dtype=np.float32)


def blockwise(x, code, block):
    """Absmax per block, then each value's index in the sorted code: the number of float32
    midpoints strictly below value / absmax (torch.bucketize, right=False)."""
    n = x.size
    pad = (-n) % block
    xb = np.concatenate([x, np.zeros(pad, np.float32)]).reshape(-1, block)
    absmax = np.abs(xb).max(axis=1).astype(np.float32)
    inv = (np.float32(1.0) / np.maximum(absmax, np.float32(1e-38))).astype(np.float32)
    scaled = np.clip(xb * inv[:, None], np.float32(-1), np.float32(1)).astype(np.float32).reshape(-1)[:n]
    bounds = ((code[:-1] + code[1:]) / np.float32(2)).astype(np.float32)
    return np.searchsorted(bounds, scaled, side="left").astype(np.uint8), absmax


def dynamic_blockwise(x, code, block):
    """bitsandbytes 0.50.2's CPU kernel (cquantize_blockwise_cpu_fp32), as its outputs show it: each
    value times the float32 reciprocal of its block's absmax, then the code nearest to the point of
    torch.linspace(-1, 1, 65536) the product rounds to (index floor(fl(fl(v + 1) * 32767.5) + 0.5))."""
    n = x.size
    pad = (-n) % block
    xb = np.concatenate([x, np.zeros(pad, np.float32)]).reshape(-1, block)
    absmax = np.abs(xb).max(axis=1).astype(np.float32)
    inv = (np.float32(1.0) / np.maximum(absmax, np.float32(1e-38))).astype(np.float32)
    v = np.clip((xb * inv[:, None]).astype(np.float32), np.float32(-1), np.float32(1)).reshape(-1)[:n]
    points = np.array(torch.linspace(-1, 1, 65536, dtype=torch.float32).tolist(), dtype=np.float64)
    c = code.astype(np.float64)
    below = np.clip(np.searchsorted(c, points, side="right") - 1, 0, c.size - 2)
    table = np.where(c[below + 1] - points < points - c[below], below + 1, below)
    table[points >= 1.0] = c.size - 1
    index = np.floor((((v + np.float32(1)).astype(np.float32) * np.float32(32767.5)).astype(np.float32)
                      + np.float32(0.5)).astype(np.float32)).astype(np.int64)
    return table[np.clip(index, 0, 65535)].astype(np.uint8), absmax


def quantize_nf4(w):
    x = w.reshape(-1).astype(np.float32)
    q, absmax = blockwise(x, NF4, 64)
    if q.size % 2:
        q = np.concatenate([q, np.array([7], np.uint8)])  # bitsandbytes pads with 0: code 7
    packed = ((q[0::2] << 4) | q[1::2]).astype(np.uint8)
    # Double quantization as bitsandbytes 0.50.2 on the CPU: centre on torch.mean (float32, one
    # thread), then its 8-bit dynamic code in 256s (dynamic_blockwise).
    torch.set_num_threads(1)
    offset = np.float32(torch.tensor(absmax.tolist(), dtype=torch.float32).mean().item())
    dyn = dynamic_map()
    qa, scales = dynamic_blockwise((absmax - offset).astype(np.float32), dyn, 256)
    # Dequantization as bitsandbytes: absmax = code2[qa] * scale2 + offset (two roundings), then
    # code[q] * absmax.
    deq_absmax = (dyn[qa] * np.repeat(scales, 256)[: qa.size]).astype(np.float32) + offset
    codes = np.stack([packed >> 4, packed & 15], axis=1).reshape(-1)[: x.size]
    deq = (NF4[codes] * np.repeat(deq_absmax, 64)[: x.size]).astype(np.float32)
    return packed, qa, scales, offset, deq


def quantize_int8(w):
    """Per-row absmax, as bitsandbytes' int8_vectorwise_quant: round(w * (127 / absmax))."""
    w = w.astype(np.float32)
    absmax = np.abs(w).max(axis=1).astype(np.float32)
    k = np.where(absmax > 0, np.float32(127) / np.maximum(absmax, np.float32(1e-38)), np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(w * k[:, None]), -127, 127).astype(np.int8)
    return q, (absmax / np.float32(127)).astype(np.float32)


def main():
    d = sys.argv[1]
    with open(os.path.join(d, "cases.json")) as f:
        cases = json.load(f)
    out = {"normal_float_levels": normal_float_levels().tolist(), "dynamic_map": dynamic_map().tolist(), "offsets": {}}
    for c in cases:
        name, rows, cols = c["name"], c["rows"], c["cols"]
        w = np.fromfile(os.path.join(d, name + ".f32"), dtype=np.float32).reshape(rows, cols)
        packed, qa, scales, offset, deq = quantize_nf4(w)
        packed.tofile(os.path.join(d, name + ".nf4"))
        qa.tofile(os.path.join(d, name + ".absmax_codes"))
        scales.tofile(os.path.join(d, name + ".absmax_scales"))
        deq.tofile(os.path.join(d, name + ".nf4_dequant"))
        out["offsets"][name] = float(offset)
        q8, s8 = quantize_int8(w)
        q8.tofile(os.path.join(d, name + ".int8"))
        s8.tofile(os.path.join(d, name + ".int8_scales"))
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
