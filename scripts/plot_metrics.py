#!/usr/bin/python3
"""Plots a `unet train` run: RUNDIR/metrics.csv -> RUNDIR/metrics.png.

    python3 scripts/plot_metrics.py runs/x            # writes runs/x/metrics.png
    python3 scripts/plot_metrics.py runs/x -o a.png

Panels, step on x: loss (log scale), grad norm, learning rate, images/s. Columns other than step,
loss, grad_norm, lr, images_per_s and ms_per_step (e.g. mse, vb of a learned-sigma run) get a
panel each after those. Empty cells, "nan" and "inf" are left out of a curve. Needs numpy and
matplotlib (Debian: python3-numpy python3-matplotlib); renders with the Agg backend, no display.
"""

import argparse
import csv
import math
import os
import sys

PANELS = [("loss", "loss", True), ("grad_norm", "grad norm", False), ("lr", "learning rate", False),
          ("images_per_s", "images/s", False)]
NOT_PLOTTED = {"step", "ms_per_step"}  # x axis; images/s already shows the speed


class Error(Exception):
    pass


def read_metrics(path):
    """{column: [float or nan]} in file order, with 'step' present and at least one row."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except FileNotFoundError:
        raise Error(f"{path}: not found")
    except (OSError, UnicodeDecodeError) as e:
        raise Error(f"{path}: cannot read ({e})")
    rows = [(n, r) for n, r in enumerate(rows, start=1) if any(c.strip() for c in r)]  # (line, fields)
    if not rows:
        raise Error(f"{path}: empty")
    header = [h.strip() for h in rows[0][1]]
    if "step" not in header:
        raise Error(f"{path}: no 'step' column in the header ({','.join(header)})")
    if len(set(header)) != len(header) or any(not h for h in header):
        raise Error(f"{path}: malformed header ({','.join(header)})")
    if len(rows) < 2:
        raise Error(f"{path}: no rows after the header")
    cols = {h: [] for h in header}
    for n, r in rows[1:]:
        if len(r) != len(header):
            raise Error(f"{path}: line {n} has {len(r)} fields, the header has {len(header)}")
        for h, cell in zip(header, r):
            cell = cell.strip()
            try:
                v = float(cell) if cell else math.nan
            except ValueError:
                raise Error(f"{path}: line {n}: {h} = '{cell}' is not a number")
            cols[h].append(v)
    if any(math.isnan(s) for s in cols["step"]):
        raise Error(f"{path}: a row has no step")
    return header, cols


def plot(header, cols, out, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in PANELS if p[0] in cols]
    known = {p[0] for p in PANELS} | NOT_PLOTTED
    panels += [(h, h, False) for h in header if h not in known]
    if not panels:
        raise Error("no columns to plot besides step")
    ncol = 2
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(10, 3.2 * nrow), squeeze=False)
    step = cols["step"]
    for ax, (key, label, log) in zip(axes.flat, panels):
        pts = [(s, v) for s, v in zip(step, cols[key]) if math.isfinite(v)]
        if log:
            pts = [(s, v) for s, v in pts if v > 0]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, lw=1.2, marker="." if len(pts) < 30 else None)
            if log:
                ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3, which="both")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = out + ".tmp.png"
    try:
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, out)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise Error(f"{out}: cannot write ({e.strerror or e})")
    finally:
        plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description="RUNDIR/metrics.csv of `unet train` -> a PNG of the curves.",
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rundir", metavar="RUNDIR", help="a run directory of `unet train` (or a metrics.csv)")
    ap.add_argument("-o", "--output", metavar="OUT.png", help="default: RUNDIR/metrics.png")
    a = ap.parse_args(argv)
    csv_path = a.rundir if a.rundir.endswith(".csv") else os.path.join(a.rundir, "metrics.csv")
    out = a.output or os.path.join(os.path.dirname(csv_path), "metrics.png")
    try:
        header, cols = read_metrics(csv_path)
        steps = cols["step"]
        title = f"{os.path.basename(os.path.dirname(os.path.abspath(csv_path)))}: steps {steps[0]:g}-{steps[-1]:g}"
        plot(header, cols, out, title)
    except Error as e:
        print(f"plot_metrics: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"plot_metrics: {e} (Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
