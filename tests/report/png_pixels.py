#!/usr/bin/python3
"""Counts pixels of a PNG screenshot: `png_pixels.py FILE RRGGBB...` prints one line per colour,
`RRGGBB COUNT` (pixels within 48 of it on every channel), then `nonwhite COUNT`. Only the standard
library (zlib), so that the browser test needs nothing beyond Debian's python3."""
import struct
import sys
import zlib


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"{path}: not a PNG file")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    channels = {2: 3, 6: 4}.get(colour)
    if depth != 8 or channels is None or interlace:
        raise SystemExit(f"{path}: only 8-bit non-interlaced RGB or RGBA is read (depth {depth}, colour {colour})")
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = previous[i]
            c = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        previous = line
    return width, height, channels, rows


def main():
    width, height, channels, rows = decode(sys.argv[1])
    targets = [tuple(int(h[i:i + 2], 16) for i in (0, 2, 4)) for h in sys.argv[2:]]
    counts = [0] * len(targets)
    nonwhite = 0
    for line in rows:
        for x in range(width):
            r, g, b = line[x * channels:x * channels + 3]
            if r < 240 or g < 240 or b < 240:
                nonwhite += 1
            for k, (tr, tg, tb) in enumerate(targets):
                if abs(r - tr) <= 48 and abs(g - tg) <= 48 and abs(b - tb) <= 48:
                    counts[k] += 1
    for h, n in zip(sys.argv[2:], counts):
        print(h, n)
    print("nonwhite", nonwhite)


main()
