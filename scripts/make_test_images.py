#!/usr/bin/env python3
"""Generates testdata/images/: a small synthetic image set for `make demo` and the tests.

Three classes a tiny model can learn quickly, one folder each (for `--labels subdirs`):
  circles/  a soft-edged disc on a plain background
  squares/  an axis-aligned filled square on a plain background
  stripes/  two-colour stripes, horizontal / vertical / diagonal
Sizes vary (48..96 px, not all square) so that `unet prepare` exercises resizing and cropping.
Two of every three images are PNG (written here with zlib; a few grayscale), the third JPEG
(needs PIL; without it that image is written as PNG too). Deterministic: same files every run.

    /usr/bin/python3 scripts/make_test_images.py [OUT_DIR]   # default testdata/images
"""
import os
import struct
import sys
import zlib

import numpy as np

try:
    from PIL import Image
except ImportError:  # JPEGs become PNGs
    Image = None

PER_CLASS = 20


def write_png(path, arr):
    """arr: uint8 HxWx3 (RGB) or HxW (gray). Plain PNG via zlib, filter 0 per row."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    h, w = arr.shape[:2]
    ctype = 2 if arr.ndim == 3 else 0
    raw = b"".join(b"\x00" + arr[y].tobytes() for y in range(h))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ctype, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def colour_pair(rng):
    """Two clearly different RGB colours."""
    while True:
        a, b = rng.randint(0, 256, size=(2, 3))
        if np.abs(a - b).sum() > 240:
            return a.astype(np.float64), b.astype(np.float64)


def circles(rng, w, h):
    fg, bg = colour_pair(rng)
    r = rng.uniform(0.2, 0.4) * min(w, h)
    cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
    yy, xx = np.mgrid[0:h, 0:w] + 0.5
    d = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
    cov = np.clip(r + 0.5 - d, 0, 1)[..., None]  # one-pixel soft edge
    return fg * cov + bg * (1 - cov)


def squares(rng, w, h):
    fg, bg = colour_pair(rng)
    s = int(rng.uniform(0.35, 0.7) * min(w, h))
    x0, y0 = rng.randint(0, w - s + 1), rng.randint(0, h - s + 1)
    img = np.empty((h, w, 3))
    img[:] = bg
    img[y0:y0 + s, x0:x0 + s] = fg
    return img


def stripes(rng, w, h):
    fg, bg = colour_pair(rng)
    period = rng.uniform(6, 16)
    kind = rng.randint(3)
    yy, xx = np.mgrid[0:h, 0:w] + 0.5
    t = xx if kind == 0 else yy if kind == 1 else (xx + yy) / np.sqrt(2)
    on = (np.floor((t + rng.uniform(0, period)) / period * 2) % 2)[..., None]
    return fg * on + bg * (1 - on)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "testdata", "images")
    rng = np.random.RandomState(20240)
    for name, fn in (("circles", circles), ("squares", squares), ("stripes", stripes)):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        for i in range(PER_CLASS):
            w, h = int(rng.choice([48, 64, 64, 80, 96])), int(rng.choice([48, 64, 64, 72, 96]))
            img = np.clip(np.rint(fn(rng, w, h)), 0, 255).astype(np.uint8)
            if i % 3 == 2 and Image is not None:
                Image.fromarray(img, "RGB").save(os.path.join(d, "%02d.jpg" % i), quality=92)
            elif i % 7 == 5:  # a few grayscale PNGs
                gray = np.rint(img @ np.array([0.299, 0.587, 0.114])).astype(np.uint8)
                write_png(os.path.join(d, "%02d.png" % i), gray)
            else:
                write_png(os.path.join(d, "%02d.png" % i), img)
    print("wrote %d images to %s" % (3 * PER_CLASS, os.path.normpath(out)))


if __name__ == "__main__":
    main()
