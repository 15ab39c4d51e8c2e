#!/usr/bin/python3
"""How often a classifier names the class each sample was asked for (issue 13's end-to-end check).

    python3 scripts/classifier_eval.py JUDGE.h5 DIR_OR_FILE... [--t 0] [--ema]

JUDGE.h5 is a unet classifier checkpoint (`unet train-classifier`, best one trained on clean images:
--noised=false); each DIR_OR_FILE is a `unet sample --h5` output (datasets `samples` [N,C,H,W] in
[-1, 1] and `labels` [N], the classes asked for) or a folder of them. The judge's top-1 class of
every image at timestep --t (default 0: clean images) is compared with its label; prints one line
per argument, `NAME: A/N = P% top-1 agreement with the requested class`, and exits 1 with one line
on stderr for unreadable input. Runs the PyTorch EncoderUNetModel (scripts/classifier_torch.py) on
the CPU: a few hundred small images take seconds.
"""

import argparse
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class Error(Exception):
    pass


def sample_files(path):
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.h5")))
        if not files:
            raise Error(f"{path}: no .h5 files")
        return files
    if not os.path.isfile(path):
        raise Error(f"{path}: no such file or directory")
    return [path]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("judge", help="classifier checkpoint (unet train-classifier)")
    p.add_argument("samples", nargs="+", help="`unet sample --h5` files, or folders of them")
    p.add_argument("--t", type=int, default=0, help="timestep the judge is given (default 0)")
    p.add_argument("--ema", action="store_true", help="the judge's EMA weights (when it has them)")
    a = p.parse_args(argv)
    try:
        import h5py
        import numpy as np
        import torch
        from unet_ckpt import load_classifier_checkpoint
        try:
            judge, flags = load_classifier_checkpoint(a.judge, use_ema=a.ema)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            msg = str(e).splitlines()[0]
            raise Error(msg if msg.startswith(a.judge) else f"{a.judge}: {msg}")
        judge = judge.double()
        for arg in a.samples:
            hits = total = 0
            for path in sample_files(arg):
                try:
                    with h5py.File(path, "r") as f:
                        x, y = f["samples"][()], f["labels"][()]
                except (OSError, KeyError) as e:
                    raise Error(f"{path}: not a `unet sample --h5` output with labels ({str(e).splitlines()[0]})")
                if x.ndim != 4 or x.shape[1:] != (flags["in_channels"], flags["image_size"], flags["image_size"]):
                    raise Error(f"{path}: samples {x.shape} do not fit the judge ({flags['in_channels']}x"
                                f"{flags['image_size']}x{flags['image_size']})")
                with torch.no_grad():
                    xt = torch.from_numpy(np.asarray(x, np.float64))
                    t = torch.full((len(xt),), float(a.t), dtype=torch.float64)
                    pred = judge(xt, t).argmax(-1).numpy()
                hits += int((pred == y).sum())
                total += len(y)
            print(f"{arg}: {hits}/{total} = {100.0 * hits / max(total, 1):.1f}% top-1 agreement with the requested "
                  "class")
    except Error as e:
        print(f"classifier_eval: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
