#!/usr/bin/python3
"""Fashion-MNIST idx files -> one folder of PNGs per class, for `unet prepare --labels subdirs`.

    python3 scripts/fashion_mnist_to_png.py /usr/share/datasets/fashion-mnist demo/fashion \\
        --split train --limit-per-class 1000

IDXDIR holds train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
t10k-labels-idx1-ubyte, each plain or gzipped (.gz), as Debian's `dataset-fashion-mnist` installs
them in /usr/share/datasets/fashion-mnist. Writes OUT/<class>/<index>.png (index = the image's
position in the split, zero-padded) with the folders named so that their sorted order is the
standard label order 0..9 (`prepare --labels subdirs` numbers classes in sorted order):

    00_tshirt_top 01_trouser 02_pullover 03_dress 04_coat 05_sandal 06_shirt 07_sneaker 08_bag
    09_ankle_boot

Images are written as 8-bit grayscale PNGs (prepare replicates gray into RGB). --size 32 (the
default) pads each 28x28 image with a 2-pixel black border to 32x32 (Fashion-MNIST's background is
black, so the pixels stay exact and prepare --image-size 32 has nothing to resize); --size 28
writes them as they are and leaves the 28->32 upscale to `prepare --image-size 32` (bicubic,
PIL-exact). Any --size >= 28 pads to that size. Needs numpy only (the PNG encoder is zlib).
"""

import argparse
import gzip
import os
import struct
import sys
import zlib

import numpy as np

CLASSES = ["00_tshirt_top", "01_trouser", "02_pullover", "03_dress", "04_coat", "05_sandal", "06_shirt",
           "07_sneaker", "08_bag", "09_ankle_boot"]
NATIVE = 28


class Error(Exception):
    pass


def find_idx(idxdir, stem):
    for name in (stem, stem + ".gz"):
        p = os.path.join(idxdir, name)
        if os.path.isfile(p):
            return p
    raise Error(f"{os.path.join(idxdir, stem)}[.gz]: not found")


def read_idx(path):
    """An idx file (http://yann.lecun.com/exdb/mnist/) as a numpy uint8 array."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise Error(f"{path}: cannot read ({e})")
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise Error(f"{path}: not an idx file (bad magic number)")
    if data[2] != 0x08:
        raise Error(f"{path}: idx element type 0x{data[2]:02x}, expected unsigned byte (0x08)")
    ndim = data[3]
    head = 4 + 4 * ndim
    if len(data) < head:
        raise Error(f"{path}: truncated header")
    shape = struct.unpack(">" + "I" * ndim, data[4:head])
    n = int(np.prod(shape, dtype=np.int64))
    if len(data) - head != n:
        raise Error(f"{path}: {len(data) - head} data bytes, expected {n} for shape {shape}")
    return np.frombuffer(data, dtype=np.uint8, offset=head).reshape(shape)


def png_gray(img):
    """An 8-bit grayscale PNG of a 2-D uint8 array."""
    h, w = img.shape

    def chunk(tag, body):
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))  # filter type 0 per row
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def pad_to(img, size):
    h, w = img.shape
    if size == h and size == w:
        return img
    out = np.zeros((size, size), np.uint8)
    y, x = (size - h) // 2, (size - w) // 2
    out[y:y + h, x:x + w] = img
    return out


def convert(idxdir, out, split="train", limit_per_class=0, size=32):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(find_idx(idxdir, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find_idx(idxdir, f"{prefix}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise Error(f"{idxdir}: {prefix} images {images.shape} and labels {labels.shape} do not match")
    if labels.size and labels.max() >= len(CLASSES):
        raise Error(f"{idxdir}: label {labels.max()} out of range 0..{len(CLASSES) - 1}")
    if size < max(images.shape[1:]):
        raise Error(f"--size {size} is smaller than the images ({images.shape[1]}x{images.shape[2]})")
    for c in CLASSES:
        os.makedirs(os.path.join(out, c), exist_ok=True)
    digits = len(str(max(len(images) - 1, 0)))
    counts = [0] * len(CLASSES)
    for i in range(len(images)):
        k = int(labels[i])
        if limit_per_class and counts[k] >= limit_per_class:
            if min(counts) >= limit_per_class:
                break
            continue
        path = os.path.join(out, CLASSES[k], f"{i:0{digits}d}.png")
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(png_gray(pad_to(images[i], size)))
        os.replace(tmp, path)
        counts[k] += 1
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Fashion-MNIST idx files -> OUT/<class>/<index>.png for `unet prepare --labels subdirs`.",
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("idxdir", metavar="IDXDIR", help="folder with the idx files (plain or .gz)")
    ap.add_argument("out", metavar="OUT", help="output folder (class folders are created in it)")
    ap.add_argument("--split", choices=["train", "test"], default="train", help="train (60000) or test (10000)")
    ap.add_argument("--limit-per-class", type=int, default=0, metavar="N",
                    help="at most N images per class, the first ones of the split (default: all)")
    ap.add_argument("--size", type=int, default=32, metavar="S",
                    help="pad the 28x28 images with black to SxS (default 32; 28 = as they are)")
    a = ap.parse_args(argv)
    if a.limit_per_class < 0:
        ap.error("--limit-per-class must be >= 0")
    try:
        counts = convert(a.idxdir, a.out, a.split, a.limit_per_class, a.size)
    except Error as e:
        print(f"fashion_mnist_to_png: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"fashion_mnist_to_png: {e.filename or a.out}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {sum(counts)} images ({a.size}x{a.size}, {a.split} split) to {a.out}/: "
          + " ".join(f"{c}={n}" for c, n in zip(CLASSES, counts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
