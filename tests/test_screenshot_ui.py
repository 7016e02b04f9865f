"""tools/screenshot_ui.py end to end: a real engine, real requests, real Chromium, and a PNG
of the size asked for that shows a drawn page (the README's docs/img/ui.png comes from it).

The PNG is read with the standard library (signature, IHDR, IDAT, the five scanline filters):
a blank or half-loaded page would be a handful of colours, the drawn /ui has hundreds.
Needs node, Chromium and frontend_probe/node_modules; the script fails naming what is missing.
"""
from __future__ import annotations

import struct
import subprocess
import sys
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 800, 600          # not the default: the flags must reach the viewport
TIMEOUT_S = 420


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of pixel bytes) of an 8-bit, non-interlaced RGB or RGBA PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, header, idat = 8, None, []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        crc, = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + chunk) == crc, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        pos += 12 + length
    assert header is not None and kind == b"IEND", "no IHDR, or not ended by IEND"
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    assert len(raw) == height * (stride + 1), "IDAT does not hold width x height pixels"
    rows, prev = [], bytes(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)]
        rows.append(prev := _unfilter(kind, line, prev, bpp))
    return width, height, [r if bpp == 3 else _drop_alpha(r) for r in rows]


def _unfilter(kind: int, line: bytes, prev: bytes, bpp: int) -> bytes:
    if kind == 0:
        return line
    if kind == 2:
        return bytes((a + b) & 0xFF for a, b in zip(line, prev))
    out = bytearray(line)
    for i in range(len(out)):
        left = out[i - bpp] if i >= bpp else 0
        up = prev[i]
        if kind == 1:
            out[i] = (out[i] + left) & 0xFF
        elif kind == 3:
            out[i] = (out[i] + ((left + up) >> 1)) & 0xFF
        else:                                       # 4, Paeth
            upleft = prev[i - bpp] if i >= bpp else 0
            p = left + up - upleft
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - upleft)
            pred = left if pa <= pb and pa <= pc else up if pb <= pc else upleft
            out[i] = (out[i] + pred) & 0xFF
    return bytes(out)


def _drop_alpha(row: bytes) -> bytes:
    return bytes(b for i, b in enumerate(row) if i % 4 != 3)


def test_the_script_screenshots_a_drawn_ui_page(tmp_path):
    out = tmp_path / "img" / "ui.png"
    run = subprocess.run([sys.executable, str(REPO / "tools" / "screenshot_ui.py"), "--out",
                          str(out), "--width", str(WIDTH), "--height", str(HEIGHT),
                          "--timeout-s", str(TIMEOUT_S - 60)],
                         cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "/ui on trace " in run.stdout and "browser joined: True" in run.stdout, run.stdout

    width, height, rows = read_png(out)
    assert (width, height) == (WIDTH, HEIGHT)
    colours = {row[i:i + 3] for row in rows for i in range(0, len(row), 3)}
    assert len(colours) > 200, f"{len(colours)} colours: a blank or unstyled page?"
    # not one colour with a few specks: the most common colour leaves most pixels to the rest
    counts: dict[bytes, int] = {}
    for row in rows:
        for i in range(0, len(row), 3):
            counts[row[i:i + 3]] = counts.get(row[i:i + 3], 0) + 1
    assert max(counts.values()) < 0.9 * width * height, "(nearly) one colour"
