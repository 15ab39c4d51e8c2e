"""OpenAI's released guided-diffusion models (issue 16):
- fractional channel_mult (imagenet512's 0.5) is stored as float64 and read back by unet and h5py.
Run by ctest with env UNET_BINARY, UNET_SOURCE_DIR, PYTHONPATH=scripts. Exit 77 = skipped.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import traceback

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(77)

SRC = os.environ.get("UNET_SOURCE_DIR", os.path.normpath(os.path.join(os.path.dirname(__file__), "..")))
sys.path.insert(0, os.path.join(SRC, "scripts"))
import unet_ckpt  # noqa: E402
from unet_torch import normalize_flags  # noqa: E402

BINARY = os.environ.get("UNET_BINARY", os.path.join(SRC, "build", "bin", "unet"))
TMP = tempfile.mkdtemp(prefix="unet-released-")
failures = []

# Fractional multiplier like imagenet512's first level.
HALF = dict(image_size=16, num_channels=64, channel_mult="0.5,1", num_res_blocks=1, attention_resolutions="8",
            num_head_channels=32)
HALF_ARGS = ["--image-size", "16", "--num-channels", "64", "--channel-mult", "0.5,1", "--num-res-blocks", "1",
             "--attention-resolutions", "8", "--num-head-channels", "32"]


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def unet(*args):
    return subprocess.run([BINARY] + list(args), capture_output=True, text=True)


def test_fractional_channel_mult_in_checkpoints():
    path = os.path.join(TMP, "half_init.h5")
    r = unet("init", "-o", path, "--seed", "3", *HALF_ARGS)
    check(r.returncode == 0, f"init with --channel-mult 0.5,1: {r.stderr.strip()}")
    if r.returncode:
        return
    with h5py.File(path, "r") as f:
        a = f.attrs["channel_mult"]
        check(a.dtype == np.float64 and list(a) == [0.5, 1.0], f"channel_mult attribute {a!r} {a.dtype}")
        check(f["model/input_blocks.0.0.weight"].shape == (32, 3, 3, 3), "level 0 has int(0.5*64) channels")
    model, flags = unet_ckpt.load_checkpoint(path)  # strict
    check(flags["channel_mult"] == (0.5, 1), f"python reads {flags['channel_mult']}")
    # Python-written checkpoint of the same configuration: float64 too, and unet samples from it.
    out = os.path.join(TMP, "half_py.h5")
    unet_ckpt.save_checkpoint(model, flags, out)
    with h5py.File(out, "r") as f:
        check(f.attrs["channel_mult"].dtype == np.float64, "save_checkpoint writes fractional mult as float64")
    r = unet("sample", out, "-n", "1", "--sampler", "ddim", "--steps", "2", "--device", "cpu",
             "-o", os.path.join(TMP, "half.png"))
    check(r.returncode == 0, f"unet sample of a 0.5-multiplier checkpoint: {r.stderr.strip()}")
    os.remove(os.path.join(TMP, "half.png"))
    # Whole multipliers stay int64, as before.
    with h5py.File(os.path.join(TMP, "i.h5"), "w") as f:
        unet_ckpt._write_flags(f, normalize_flags(channel_mult="1,1,2,2,4,4"))
        check(f.attrs["channel_mult"].dtype == np.int64, "whole multipliers are int64")
    for n in ("half_init.h5", "half_py.h5", "i.h5"):
        os.remove(os.path.join(TMP, n))


def main():
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            print("RUN", name, flush=True)
            try:
                fn()
            except Exception:
                traceback.print_exc()
                failures.append(name)
    shutil.rmtree(TMP, ignore_errors=True)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
