"""Classifier checkpoints: `unet init --classifier` (flags, presets, PyTorch's init), strict loading
by scripts/classifier_torch.py's EncoderUNetModel, scripts/unet_ckpt.py import/export of
guided-diffusion classifier state_dicts (round trips bit-identical, float16 converted, the
classifier recognised by its names), and the one-line errors. Exit 77 = skipped.
"""

import os
import subprocess
import sys

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(77)

from e2e_common import BINARY, check, failures, require_binary, SRC, work_dir  # noqa: E402
import classifier_torch as ct  # noqa: E402
from unet_ckpt import load_classifier_checkpoint  # noqa: E402

require_binary()
CKPT_PY = os.path.join(SRC, "scripts", "unet_ckpt.py")
TMP = work_dir("unet-clsckpt-")  # removed at exit
SEED = int(os.environ.get("UNET_TEST_SEED", np.random.SeedSequence().entropy % (1 << 31)))
print(f"UNET_TEST_SEED={SEED}")


def unet(*args):
    return subprocess.run([BINARY] + list(args), capture_output=True, text=True)


def ckpt_py(*args):
    return subprocess.run([sys.executable, CKPT_PY] + list(args), capture_output=True, text=True)


def one_line_error(r, *needles):
    err = r.stderr.strip()
    return r.returncode == 1 and len(err.splitlines()) == 1 and all(n in err for n in needles)


def group(path, name="model"):
    with h5py.File(path, "r") as f:
        return {k: v[()] for k, v in f[name].items()}


def main():
    a = os.path.join(TMP, "a.h5")
    r = unet("init", "--classifier", "--preset", "tiny32", "--seed", str(SEED % 100000), "-o", a)
    check(r.returncode == 0 and "classifier tiny32" in r.stdout, f"init --classifier: {r.stdout.strip()}")
    model, flags = load_classifier_checkpoint(a)  # strict state_dict load
    check(flags == ct.normalize_classifier_flags(preset="tiny32"), "flags read back are the preset's")
    with h5py.File(a, "r") as f:
        check(f.attrs["format"] == "unet-classifier", "format attribute unet-classifier")
        sd = {k: v[()] for k, v in f["model"].items()}
    C = 64
    pos = sd["out.2.positional_embedding"]
    check(pos.shape == (C, 8 * 8 + 1) and abs(pos.std() * np.sqrt(C) - 1) < 0.1 and abs(pos.mean()) < 0.02,
          f"positional_embedding ~ N(0, 1/C): std*sqrt(C) {pos.std() * np.sqrt(C):.3f}")
    b = 1 / np.sqrt(C)
    w = sd["out.2.c_proj.weight"]
    check(np.abs(w).max() <= b and np.abs(w).max() > 0.9 * b, "c_proj ~ U(-1/sqrt(C), 1/sqrt(C)) (not zeroed)")
    check((sd["out.0.weight"] == 1).all() and (sd["out.0.bias"] == 0).all(), "GroupNorm affine 1 / 0")
    check((sd["input_blocks.1.0.out_layers.3.weight"] == 0).all(), "ResBlocks' out_layers.3 zeroed")
    with torch.no_grad():
        logits = model(torch.randn(2, 3, 32, 32), torch.tensor([3.0, 700.0]))
    check(tuple(logits.shape) == (2, 10), "the classifier loads and runs in PyTorch")

    # flags override the preset; guided-diffusion's defaults without one
    r = unet("init", "--classifier", "--image-size", "128", "--classifier-depth", "1", "--print-params")
    names = [ln.split()[0] for ln in r.stdout.splitlines() if not ln.startswith("#")]
    want = [k for k, _ in ct.classifier_state_dict_shapes(image_size=128, classifier_depth=1)]
    check(r.returncode == 0 and names == want, "--print-params lists create_classifier's state_dict for 128x128")

    # export -> import -> bit-identical
    pt, back, pt2 = (os.path.join(TMP, n) for n in ("a.pt", "back.h5", "back.pt"))
    r = ckpt_py("export", a, "-o", pt)
    check(r.returncode == 0 and "CLASSIFIER_FLAGS" in r.stdout, f"export: {r.stdout.strip().splitlines()[-1:]}")
    r = ckpt_py("import", pt, "--preset", "tiny32", "-o", back)
    check(r.returncode == 0 and "classifier" in r.stdout, f"import --preset tiny32: {r.stdout.strip()}")
    ga, gb = group(a), group(back)
    check(ga.keys() == gb.keys() and all(np.array_equal(ga[k], gb[k]) for k in ga), ".h5 -> .pt -> .h5 bit-identical")
    r = ckpt_py("export", back, "-o", pt2)
    s1, s2 = torch.load(pt), torch.load(pt2)
    check(r.returncode == 0 and list(s1) == list(s2) and all(torch.equal(s1[k], s2[k]) for k in s1),
          ".pt -> .h5 -> .pt bit-identical, guided-diffusion's order")
    check(list(s1) == [k for k, _ in ct.classifier_state_dict_shapes(preset="tiny32")], "export in state_dict order")
    # recognised without --classifier, from explicit flags (guided-diffusion spellings)
    auto = os.path.join(TMP, "auto.h5")
    r = ckpt_py("import", pt, "--image_size", "32", "--classifier_width", "32", "--classifier_depth", "1",
                "--classifier-channel-mult", "1,2,2", "--classifier_attention_resolutions", "16,8",
                "--classifier-num-head-channels", "32", "--num-classes", "10", "-o", auto)
    check(r.returncode == 0 and all(np.array_equal(ga[k], v) for k, v in group(auto).items()),
          f"import recognises a classifier state_dict by its flags: {r.stdout.strip() or r.stderr.strip()}")
    # float16 tensors become float32 exactly
    h = os.path.join(TMP, "half.pt")
    torch.save({k: v.half() for k, v in s1.items()}, h)
    r = ckpt_py("import", h, "--preset", "tiny32", "-o", os.path.join(TMP, "half.h5"))
    gh = group(os.path.join(TMP, "half.h5"))
    check(r.returncode == 0 and "float16" in r.stdout and
          all(np.array_equal(gh[k], s1[k].half().float().numpy()) for k in gh), "float16 state_dict -> float32")
    # the C++ side loads the import: unet init's reader and unet sample's guide path
    r = unet("init", "--classifier", "--preset", "default", "--print-params")
    check(r.returncode == 0 and "out.2.c_proj.weight 1000x512x1" in r.stdout, "default preset: 1000 classes, 512 ch")

    # errors: one line, exit 1
    r = ckpt_py("import", pt, "--preset", "imagenet64", "--classifier", "-o", os.path.join(TMP, "x.h5"))
    check(one_line_error(r, "does not match the classifier", "missing", "tiny32"),
          f"wrong preset names the matching one: {r.stderr.strip()}")
    r = unet("init", "--classifier", "--num-channels", "64", "-o", os.path.join(TMP, "x.h5"))
    check(one_line_error(r, "--num-channels", "diffusion-model flag"), f"model flag: {r.stderr.strip()}")
    r = unet("init", "--preset", "default", "-o", os.path.join(TMP, "x.h5"))
    check(one_line_error(r, "classifier preset"), f"classifier preset without --classifier: {r.stderr.strip()}")
    r = unet("init", "--classifier-width", "64", "-o", os.path.join(TMP, "x.h5"))
    check(one_line_error(r, "--classifier"), f"--classifier-* without --classifier: {r.stderr.strip()}")
    r = unet("init", "--classifier", "--image-size", "48", "-o", os.path.join(TMP, "x.h5"))
    check(one_line_error(r, "48", "--classifier-channel-mult"), f"image size without multipliers: {r.stderr.strip()}")
    r = unet("init", "--classifier", "--classifier-pool", "adaptive", "-o", os.path.join(TMP, "x.h5"))
    check(one_line_error(r, "--classifier-pool", "adaptive"), f"pool: {r.stderr.strip()}")
    r = unet("sample", a, "-o", "")
    check(one_line_error(r, a, "classifier checkpoint"), f"sampling a classifier: {r.stderr.strip()}")
    check(not os.path.exists(os.path.join(TMP, "x.h5")), "no file written on errors")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # a crash is a failure, not a skip
        import traceback
        traceback.print_exc()
        failures.append("exception")
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
