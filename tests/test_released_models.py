"""OpenAI's released guided-diffusion models (issue 16):
- every preset is guided-diffusion's README MODEL_FLAGS on top of its model_and_diffusion_defaults(),
  in unet (C++) and in scripts/unet_torch.py alike;
- `unet init --preset X --print-params` lists exactly the state_dict names/shapes/order of the
  PyTorch model (built on the meta device: nothing of the 550 M-parameter models is allocated);
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
from unet_torch import PRESETS, normalize_flags, state_dict_shapes  # noqa: E402

BINARY = os.environ.get("UNET_BINARY", os.path.join(SRC, "build", "bin", "unet"))
TMP = tempfile.mkdtemp(prefix="unet-released-")
failures = []

# guided-diffusion README, MODEL_FLAGS verbatim.
README_FLAGS = {
    "imagenet64": "--attention_resolutions 32,16,8 --class_cond True --diffusion_steps 1000 --dropout 0.1 "
                  "--image_size 64 --learn_sigma True --noise_schedule cosine --num_channels 192 "
                  "--num_head_channels 64 --num_res_blocks 3 --resblock_updown True --use_new_attention_order True "
                  "--use_fp16 True --use_scale_shift_norm True",
    "imagenet128": "--attention_resolutions 32,16,8 --class_cond True --diffusion_steps 1000 --image_size 128 "
                   "--learn_sigma True --noise_schedule linear --num_channels 256 --num_heads 4 --num_res_blocks 2 "
                   "--resblock_updown True --use_fp16 True --use_scale_shift_norm True",
    "imagenet256": "--attention_resolutions 32,16,8 --class_cond True --diffusion_steps 1000 --image_size 256 "
                   "--learn_sigma True --noise_schedule linear --num_channels 256 --num_head_channels 64 "
                   "--num_res_blocks 2 --resblock_updown True --use_fp16 True --use_scale_shift_norm True",
    "imagenet256-uncond": "--attention_resolutions 32,16,8 --class_cond False --diffusion_steps 1000 --image_size 256 "
                          "--learn_sigma True --noise_schedule linear --num_channels 256 --num_head_channels 64 "
                          "--num_res_blocks 2 --resblock_updown True --use_fp16 True --use_scale_shift_norm True",
    "imagenet512": "--attention_resolutions 32,16,8 --class_cond True --diffusion_steps 1000 --image_size 512 "
                   "--learn_sigma True --noise_schedule linear --num_channels 256 --num_head_channels 64 "
                   "--num_res_blocks 2 --resblock_updown True --use_fp16 False --use_scale_shift_norm True",
    "lsun256": "--attention_resolutions 32,16,8 --class_cond False --diffusion_steps 1000 --dropout 0.1 "
               "--image_size 256 --learn_sigma True --noise_schedule linear --num_channels 256 --num_head_channels 64 "
               "--num_res_blocks 2 --resblock_updown True --use_fp16 True --use_scale_shift_norm True",
}
# guided_diffusion/script_util.py: model_and_diffusion_defaults() (model and schedule part) and
# create_model's channel_mult by image size; NUM_CLASSES = 1000.
GD_DEFAULTS = dict(image_size=64, num_channels=128, num_res_blocks=2, num_heads=4, num_head_channels=-1,
                   attention_resolutions="16,8", dropout=0.0, class_cond=False, use_scale_shift_norm=True,
                   resblock_updown=False, use_new_attention_order=False, learn_sigma=False, diffusion_steps=1000,
                   noise_schedule="linear")
GD_MULT = {512: (0.5, 1, 1, 2, 2, 4, 4), 256: (1, 1, 2, 2, 4, 4), 128: (1, 1, 2, 3, 4), 64: (1, 2, 3, 4)}
# Fractional multiplier like imagenet512's first level.
HALF = dict(image_size=16, num_channels=64, channel_mult="0.5,1", num_res_blocks=1, attention_resolutions="8",
            num_head_channels=32)
HALF_ARGS = ["--image-size", "16", "--num-channels", "64", "--channel-mult", "0.5,1", "--num-res-blocks", "1",
             "--attention-resolutions", "8", "--num-head-channels", "32"]


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def gd_flags(line):
    """README MODEL_FLAGS -> our flag dict, the way guided-diffusion's scripts resolve them."""
    f = dict(GD_DEFAULTS)
    toks = line.split()
    for k, v in zip(toks[::2], toks[1::2]):
        f[k[2:]] = v
    f.pop("use_fp16")  # precision at run time, not the model
    for k in ("class_cond", "learn_sigma", "use_scale_shift_norm", "resblock_updown", "use_new_attention_order"):
        f[k] = f[k] in (True, "True")
    f["channel_mult"] = GD_MULT[int(f["image_size"])]
    f["num_classes"] = 1000
    return normalize_flags(f)


def unet(*args):
    return subprocess.run([BINARY] + list(args), capture_output=True, text=True)


def parse_describe(line):
    """`# image_size=64 ... noise_schedule=linear` (ModelConfig::describe) -> normalized flags."""
    kv = dict(t.split("=", 1) for t in line.lstrip("# ").split())
    return normalize_flags(kv)


def test_presets_are_guided_diffusion_readme_flags():
    for name, line in README_FLAGS.items():
        want = gd_flags(line)
        check(normalize_flags(preset=name) == want, f"{name}: unet_torch preset {normalize_flags(preset=name)} != {want}")
    check(set(PRESETS) == {"seed64", "tiny32"} | set(README_FLAGS), f"python presets {sorted(PRESETS)}")


def test_cpp_presets_match_pytorch():
    if not os.path.exists(BINARY):
        check(False, f"no unet binary at {BINARY}")
        return
    for name in PRESETS:
        r = unet("init", "--preset", name, "--print-params")
        check(r.returncode == 0, f"{name}: init --print-params failed: {r.stderr.strip()}")
        lines = r.stdout.splitlines()
        flags = parse_describe(lines[0])
        check(flags == normalize_flags(preset=name), f"{name}: C++ preset {flags} != python {normalize_flags(preset=name)}")
        rows = [(n, tuple(int(d) for d in s.split("x"))) for n, s in (ln.split() for ln in lines[2:])]
        want = state_dict_shapes(preset=name)
        diff = next(((i, a, b) for i, (a, b) in enumerate(zip(rows, want)) if a != b), None)
        check(rows == want, f"{name}: C++ parameter table differs from the PyTorch state_dict "
                            f"({len(rows)} vs {len(want)} tensors; first difference {diff})")
        n = sum(int(np.prod(s)) for _, s in want)
        check(f"{len(want)} tensors, {n} parameters" in lines[1], f"{name}: count line {lines[1]!r}, want {n}")
    # flags still override a preset
    r = unet("init", "--preset", "imagenet512", "--print-params", "--class-cond=false", "--channel-mult", "0.5,1,2,2,4,4,4")
    want = state_dict_shapes(preset="imagenet512", class_cond=False, channel_mult="0.5,1,2,2,4,4,4")
    rows = [(n, tuple(int(d) for d in s.split("x"))) for n, s in (ln.split() for ln in r.stdout.splitlines()[2:])]
    check(r.returncode == 0 and rows == want, "imagenet512 with overrides")
    check(not os.listdir(TMP), "--print-params writes nothing")


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
        unet_ckpt._write_flags(f, normalize_flags(preset="imagenet256"))
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
