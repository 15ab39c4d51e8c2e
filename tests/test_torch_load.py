"""PyTorch side of the checkpoint contract (SPEC §2/§3):
- scripts/unet_torch.py builds guided-diffusion's state_dict exactly (names, order, shapes of
  testdata/spec/params_*.txt);
- checkpoints written by `unet init` load with load_state_dict(strict=True), every tensor equals
  the file, and the weights are exactly those of the documented init generator (an independent
  numpy transcription) -- which also checks the engine<->PyTorch layout conversion;
- save_checkpoint writes the SPEC layout and load_checkpoint reads it back;
- the golden files reproduce with the current unet_torch.py.
Run by ctest with env UNET_BINARY, UNET_SOURCE_DIR, PYTHONPATH=scripts. Exit 77 = skipped.
"""

import os
import subprocess
import sys
import traceback

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(77)

from e2e_common import BINARY, SRC, work_dir  # noqa: E402 (also puts scripts/ on the path)
from unet_ckpt import load_checkpoint, read_flags, read_state_dict, save_checkpoint, unet_init_state_dict  # noqa
from unet_torch import PRESETS, create_model, normalize_flags  # noqa

TMP = work_dir("unet-torch-")  # removed at exit

FULL32 = dict(image_size=32, num_channels=32, channel_mult="1,2", num_res_blocks=1, attention_resolutions="16",
              num_heads=2, num_head_channels=-1, use_new_attention_order=False, use_scale_shift_norm=True,
              resblock_updown=True, learn_sigma=True, class_cond=True, num_classes=10)
FULL32_CLI = ("--image-size 32 --num-channels 32 --channel-mult 1,2 --num-res-blocks 1 --attention-resolutions 16 "
              "--num-heads 2 --num-head-channels -1 --use-new-attention-order=false --use-scale-shift-norm "
              "--resblock-updown --learn-sigma --class-cond --num-classes 10")

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def spec_rows(name):
    rows = []
    with open(os.path.join(SRC, "testdata", "spec", f"params_{name}.txt")) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                n, s = line.split()
                rows.append((n, tuple(int(d) for d in s.split("x"))))
    return rows


def test_state_dict_matches_spec():
    for name, flags in (("seed64", normalize_flags(preset="seed64")), ("tiny32", normalize_flags(preset="tiny32")),
                        ("full32", normalize_flags(FULL32))):
        sd = create_model(flags).state_dict()
        got = [(k, tuple(v.shape)) for k, v in sd.items()]
        want = spec_rows(name)
        check(got == want, f"{name}: state_dict differs from params_{name}.txt")


def test_zero_modules_and_forward():
    m = create_model(preset="tiny32").eval()
    sd = m.state_dict()
    for k, v in sd.items():
        if ".out_layers.3." in k or ".proj_out." in k or k.startswith("out.2."):
            check(bool((v == 0).all()), f"{k} should be zero-initialised")
    x = torch.randn(2, 3, 32, 32)
    out = m(x, torch.tensor([3.0, 999.0]))
    check(tuple(out.shape) == (2, 3, 32, 32), "tiny32 output shape")
    check(bool((out == 0).all()), "fresh model output is exactly zero (out.2 is zero)")


def run_init(path, args):
    r = subprocess.run([BINARY, "init", "-o", path] + args.split(), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"unet init {args} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def test_unet_init_loads_strict():
    if not os.path.exists(BINARY):
        check(False, f"no unet binary at {BINARY}")
        return
    cases = [("tiny32", "--preset tiny32 --seed 7", 7), ("full32", FULL32_CLI + " --seed 123", 123),
             ("seed64", "", 0)]
    if os.environ.get("UNET_SLOW"):
        cases.append(("imagenet64", "--preset imagenet64 --seed 1", 1))
    for name, args, seed in cases:
        path = os.path.join(TMP, name + ".h5")
        run_init(path, args)
        model, flags = load_checkpoint(path)  # strict=True inside
        sd = model.state_dict()
        with h5py.File(path, "r") as f:
            check(f.attrs["format"] == "unet-checkpoint", f"{name}: format attribute")
            check(int(f.attrs["version"]) == 1, f"{name}: version attribute")
            check(list(f["model"].keys()) == sorted(sd.keys()), f"{name}: tensor names")
            for k, v in sd.items():
                d = f["model"][k]
                check(d.dtype == np.float32, f"{name}: {k} dtype {d.dtype}")
                check(np.array_equal(d[()], v.numpy()), f"{name}: {k} differs from the file")
            for k in ("ema", "optimizer"):
                check(k not in f, f"{name}: fresh checkpoint has no {k}")
        if name == "full32":
            want = normalize_flags(FULL32)
            check(flags == want, f"full32 flags {flags} != {want}")
        elif name in PRESETS:
            check(flags == normalize_flags(preset=name), f"{name}: flags {flags}")
        # The exact weights of the documented generator (also checks the conv3x3 layout conversion).
        ref = unet_init_state_dict(flags, seed)
        for k, v in sd.items():
            if k == "label_emb.weight":  # Box-Muller: libm may differ in the last bit
                check(torch.allclose(v, ref[k], rtol=0, atol=1e-6), f"{name}: {k} init values")
            else:
                check(torch.equal(v, ref[k]), f"{name}: {k} init values")
        # It runs in PyTorch.
        x = torch.randn(2, flags["in_channels"], flags["image_size"], flags["image_size"])
        y = torch.tensor([1, 2]) if flags["class_cond"] else None
        with torch.no_grad():
            out = model(x, torch.tensor([0.0, 500.0]), y)
        check(out.shape[1] == (6 if flags["learn_sigma"] else 3), f"{name}: output channels")


def test_save_checkpoint_layout_and_round_trip():
    flags = normalize_flags(FULL32, dropout=0.1, noise_schedule="cosine", diffusion_steps=400)
    torch.manual_seed(0)
    model = create_model(flags)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    ema = {k: v + 1 for k, v in model.state_dict().items()}
    path = os.path.join(TMP, "py.h5")
    save_checkpoint(model, flags, path, ema=ema)
    check(not [n for n in os.listdir(TMP) if ".tmp" in n], "no temporary left behind")
    with h5py.File(path, "r") as f:
        a = f.attrs
        check(a["format"] == "unet-checkpoint" and int(a["version"]) == 1, "format/version")
        for k in ("image_size", "num_channels", "num_res_blocks", "num_heads", "num_head_channels", "num_classes",
                  "class_cond", "learn_sigma", "use_scale_shift_norm", "resblock_updown",
                  "use_new_attention_order", "diffusion_steps", "in_channels"):
            check(a[k].dtype == np.int64, f"attribute {k} is {a[k].dtype}, expected int64")
        check(list(a["channel_mult"]) == [1, 2] and a["channel_mult"].dtype == np.int64, "channel_mult")
        check(list(a["attention_resolutions"]) == [16], "attention_resolutions")
        check(a["dropout"] == 0.1 and a["noise_schedule"] == "cosine", "dropout / noise_schedule")
        # SPEC §2's one-liner works.
        m2 = create_model(read_flags(f))
        m2.load_state_dict({k: torch.from_numpy(v[()]) for k, v in f["model"].items()}, strict=True)
        for k, v in model.state_dict().items():
            check(torch.equal(m2.state_dict()[k], v), f"round trip {k}")
        e = read_state_dict(f["ema"])
        check(all(torch.equal(e[k], ema[k]) for k in ema), "ema round trip")
    m3, fl3 = load_checkpoint(path, use_ema=True)
    check(fl3 == flags, "flags round trip")
    check(all(torch.equal(m3.state_dict()[k], ema[k]) for k in ema), "use_ema loads ema/")


def test_goldens_reproduce():
    gdir = os.path.join(SRC, "testdata", "golden")
    files = sorted(n for n in os.listdir(gdir) if n.endswith(".h5")) if os.path.isdir(gdir) else []
    check(len(files) >= 3, "golden files present")
    for n in files:
        with h5py.File(os.path.join(gdir, n), "r") as f:
            flags = read_flags(f)
            m = create_model(flags).double().eval()
            m.load_state_dict({k: v.double() for k, v in read_state_dict(f["model"]).items()}, strict=True)
            x = torch.from_numpy(f["x"][()]).double()
            t = torch.from_numpy(f["t"][()])
            y = torch.from_numpy(f["labels"][()]) if "labels" in f else None
            out = m(x, t, y)
            (out * torch.from_numpy(f["dout"][()]).double()).sum().backward()
            ref = torch.from_numpy(f["out"][()]).double()
            err = ((out.detach() - ref).norm() / ref.norm()).item()
            check(err < 1e-6, f"{n}: out differs from the file by {err:.2e}")
            for k, p in m.named_parameters():
                g = torch.from_numpy(f["grad"][k][()]).double()
                e = ((p.grad - g).norm() / g.norm()).item()
                check(e < 1e-6, f"{n}: grad/{k} differs by {e:.2e}")


def main():
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            print("RUN", name, flush=True)
            try:
                fn()
            except Exception:
                traceback.print_exc()
                failures.append(name)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
