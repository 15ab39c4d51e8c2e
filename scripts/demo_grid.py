#!/usr/bin/python3
"""Per-class sample grids side by side in one PNG, for `make demo`.

    python3 scripts/demo_grid.py -o demo/grid.png --data demo/data.h5 \\
        --panel "shipped model" demo/samples/pretrained --panel "trained here" demo/samples/trained

Each --panel TITLE DIR is one grid: DIR holds one `unet sample --h5` file per class
(class_00.h5, class_01.h5, ...; sorted by name, one row each, the images of the file's 'images'
dataset left to right). --data adds a first panel with real images of each class from a
`unet prepare --labels subdirs` dataset (as many per row as the widest sample panel); the rows
are labelled with its class names. Needs numpy, h5py and matplotlib (Agg backend).
"""

import argparse
import glob
import os
import sys
import textwrap

import numpy as np

# Folder names of scripts/fashion_mnist_to_png.py -> the dataset's own class names.
PRETTY = {"00_tshirt_top": "T-shirt/top", "01_trouser": "Trouser", "02_pullover": "Pullover",
          "03_dress": "Dress", "04_coat": "Coat", "05_sandal": "Sandal", "06_shirt": "Shirt",
          "07_sneaker": "Sneaker", "08_bag": "Bag", "09_ankle_boot": "Ankle boot"}
PAD = 2


class Error(Exception):
    pass


def tile(rows):
    """rows: list of uint8 [n_i, H, W, C] -> one [R*(H+PAD)+PAD, maxn*(W+PAD)+PAD, C] image, black gaps."""
    h, w, c = rows[0].shape[1:]
    ncol = max(len(r) for r in rows)
    out = np.zeros((len(rows) * (h + PAD) + PAD, ncol * (w + PAD) + PAD, c), np.uint8)
    for i, r in enumerate(rows):
        for j, img in enumerate(r):
            y, x = PAD + i * (h + PAD), PAD + j * (w + PAD)
            out[y:y + h, x:x + w] = img
    return out


def read_panel(d):
    import h5py
    files = sorted(glob.glob(os.path.join(d, "*.h5")))
    if not files:
        raise Error(f"{d}: no sample files (*.h5)")
    rows = []
    for p in files:
        try:
            with h5py.File(p, "r") as f:
                rows.append(f["images"][()])
        except (OSError, KeyError) as e:
            raise Error(f"{p}: cannot read 'images' ({e})")
    return rows


def read_data(path, nrows, ncol):
    import h5py
    try:
        with h5py.File(path, "r") as f:
            labels = f["labels"][()]
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in f["labels"].attrs["class_names"]]
            rows = []
            for k in range(min(nrows, len(names))):
                idx = np.flatnonzero(labels == k)[:ncol]
                rows.append(f["images"][np.sort(idx)] if len(idx) else np.zeros((0,) + f["images"].shape[1:], np.uint8))
    except (OSError, KeyError) as e:
        raise Error(f"{path}: cannot read images/labels/class_names ({e})")
    return rows, names


def main(argv=None):
    ap = argparse.ArgumentParser(description="Per-class sample grids side by side -> one PNG.",
                                 epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", required=True, metavar="OUT.png")
    ap.add_argument("--data", metavar="DATA.h5", help="dataset for a panel of real images and the row names")
    ap.add_argument("--panel", nargs=2, action="append", default=[], metavar=("TITLE", "DIR"))
    ap.add_argument("--title", default="", help="figure title")
    a = ap.parse_args(argv)
    if not a.panel and not a.data:
        ap.error("nothing to draw: give --panel and/or --data")
    try:
        panels = [(t, read_panel(d)) for t, d in a.panel]
        nrows = max((len(r) for _, r in panels), default=10)
        ncol = max((len(x) for _, rows in panels for x in rows), default=8)
        names = []
        if a.data:
            rows, names = read_data(a.data, nrows, ncol)
            panels.insert(0, ("training data", rows))
        shapes = {r.shape[1:] for _, rows in panels for r in rows if len(r)}
        if len(shapes) != 1:
            raise Error(f"images of different shapes: {sorted(shapes)}")
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        grids = [(t, tile(rows)) for t, rows in panels]
        h, w = grids[0][1].shape[:2]
        scale = 2.0 / 100  # 2 screen pixels per image pixel at dpi 100
        width = sum(g.shape[1] for _, g in grids) * scale + 1.6 + 0.3 * len(grids)
        title_lines = len(textwrap.wrap(a.title, int(width * 100 / 9.5))) if a.title else 0
        longest = max(len(textwrap.wrap(t, max(12, int(g.shape[1] * scale * 100 / 8.5)))) for t, g in grids)
        fig, axes = plt.subplots(1, len(grids), squeeze=False,
                                 figsize=(width, h * scale + 0.7 + 0.2 * longest + 0.25 * title_lines))
        label_h = shapes.pop()[0] + PAD
        for n, (ax, (t, g)) in enumerate(zip(axes[0], grids)):
            ax.imshow(g if g.shape[2] == 3 else g[..., 0], cmap="gray", interpolation="nearest")
            ax.set_title(textwrap.fill(t, max(12, int(g.shape[1] * scale * 100 / 8.5))), fontsize=10)
            ax.set_xticks([])
            if n == 0 and names:
                ax.set_yticks([PAD + label_h * (k + 0.5) - PAD / 2 for k in range(len(g) // label_h)][:len(names)])
                ax.set_yticklabels([PRETTY.get(s, s) for s in names][:len(ax.get_yticks())], fontsize=9)
                ax.tick_params(left=False)
            else:
                ax.set_yticks([])
            for s in ax.spines.values():
                s.set_visible(False)
        if a.title:
            fig.suptitle(textwrap.fill(a.title, int(fig.get_figwidth() * 100 / 9.5)), fontsize=11)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.25 * title_lines / fig.get_figheight()) if a.title else None)
        tmp = a.output + ".tmp.png"
        fig.savefig(tmp, dpi=100)
        plt.close(fig)
        os.replace(tmp, a.output)
    except Error as e:
        print(f"demo_grid: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"demo_grid: {e.filename or a.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
