"""OpenAI's released guided-diffusion models (issue 16, items 1-2):
- every preset is guided-diffusion's README MODEL_FLAGS on top of its model_and_diffusion_defaults(),
  in unet (C++) and in scripts/unet_torch.py alike; the released classifiers' presets are its
  CLASSIFIER_FLAGS on top of classifier_defaults(), and their state_dicts create_classifier's;
- `unet init --preset X --print-params` lists exactly the state_dict names/shapes/order of the
  PyTorch model (built on the meta device: nothing of the 550 M-parameter models is allocated);
- fractional channel_mult (imagenet512's 0.5) is stored as float64 and read back by unet and h5py;
- `unet_ckpt.py import` of state_dicts made by the PyTorch model (float32 and float16) writes the
  attributes `unet init` writes, `unet sample` loads the result, and `export` gives back the
  original state_dict bit for bit, in guided-diffusion's order; MODEL_FLAGS given to `import`
  without a preset resolve as guided-diffusion's scripts resolve them;
- user errors (missing / unexpected / misshaped tensors, wrong preset, unreadable or non-state_dict
  files, output onto input, no EMA) are one line, exit 1, and write nothing.
Run by ctest with env UNET_BINARY, UNET_SOURCE_DIR, PYTHONPATH=scripts. Exit 77 = skipped.
"""

import contextlib
import io
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
import classifier_torch as ct  # noqa: E402
import unet_ckpt  # noqa: E402
from unet_torch import PRESETS, create_model, normalize_flags, state_dict_shapes  # noqa: E402

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
# guided-diffusion README, the released classifiers' CLASSIFIER_FLAGS (the 64x64 one: `--classifier_depth 4`
# on its sampling command line, whose MODEL_FLAGS give the diffusion: cosine schedule, 1000 steps).
README_CLASSIFIER_FLAGS = {
    "imagenet64": "--image_size 64 --classifier_depth 4 --noise_schedule cosine --diffusion_steps 1000",
    "imagenet128": "--image_size 128 --classifier_attention_resolutions 32,16,8 --classifier_depth 2 "
                   "--classifier_width 128 --classifier_pool attention --classifier_resblock_updown True "
                   "--classifier_use_scale_shift_norm True",
    "imagenet256": "--image_size 256 --classifier_attention_resolutions 32,16,8 --classifier_depth 2 "
                   "--classifier_width 128 --classifier_pool attention --classifier_resblock_updown True "
                   "--classifier_use_scale_shift_norm True",
    "imagenet512": "--image_size 512 --classifier_attention_resolutions 32,16,8 --classifier_depth 2 "
                   "--classifier_width 128 --classifier_pool attention --classifier_resblock_updown True "
                   "--classifier_use_scale_shift_norm True",
}
# guided_diffusion/script_util.py: classifier_defaults(), and what create_classifier fixes
# (num_head_channels 64, out_channels NUM_CLASSES, channel_mult by image size, in_channels 3).
GD_CLASSIFIER_DEFAULTS = dict(image_size=64, classifier_width=128, classifier_depth=2,
                              classifier_attention_resolutions="32,16,8", classifier_use_scale_shift_norm=True,
                              classifier_resblock_updown=True, classifier_pool="attention",
                              classifier_num_head_channels=64, num_classes=1000, in_channels=3,
                              diffusion_steps=1000, noise_schedule="linear")
# guided_diffusion/script_util.py: model_and_diffusion_defaults() (model and schedule part) and
# create_model's channel_mult by image size; NUM_CLASSES = 1000.
GD_DEFAULTS = dict(image_size=64, num_channels=128, num_res_blocks=2, num_heads=4, num_head_channels=-1,
                   attention_resolutions="16,8", dropout=0.0, class_cond=False, use_scale_shift_norm=True,
                   resblock_updown=False, use_new_attention_order=False, learn_sigma=False, diffusion_steps=1000,
                   noise_schedule="linear")
GD_MULT = {512: (0.5, 1, 1, 2, 2, 4, 4), 256: (1, 1, 2, 2, 4, 4), 128: (1, 1, 2, 3, 4), 64: (1, 2, 3, 4)}
# A small model that exercises every shape-changing flag; samples on the CPU in a second.
SMALL = dict(image_size=16, num_channels=32, channel_mult="1,2", num_res_blocks=1, attention_resolutions="8",
             num_heads=2, num_head_channels=-1, use_new_attention_order=False, use_scale_shift_norm=True,
             resblock_updown=True, learn_sigma=True, class_cond=True, num_classes=10)
# import takes guided-diffusion's spellings (--image_size, --learn_sigma True) as well as unet's
SMALL_ARGS = ["--preset", "tiny32", "--image_size", "16", "--attention_resolutions", "8", "--num_heads", "2",
              "--num_head_channels", "-1", "--use_new_attention_order", "False", "--use-scale-shift-norm",
              "--resblock-updown", "--learn_sigma", "True", "--class-cond", "--num-classes", "10"]
SMALL_CLI = ["--preset", "tiny32", "--image-size", "16", "--attention-resolutions", "8", "--num-heads", "2",
             "--num-head-channels", "-1", "--use-new-attention-order=false", "--use-scale-shift-norm",
             "--resblock-updown", "--learn-sigma", "--class-cond", "--num-classes", "10"]
# Fractional multiplier like imagenet512's first level.
HALF = dict(image_size=16, num_channels=64, channel_mult="0.5,1", num_res_blocks=1, attention_resolutions="8",
            num_head_channels=32)
HALF_ARGS = ["--preset", "seed64", "--image-size", "16", "--num-channels", "64", "--channel-mult", "0.5,1",
             "--num-res-blocks", "1", "--attention-resolutions", "8", "--num-head-channels", "32"]


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


def ckpt(*argv):
    """unet_ckpt.main in this process (importing torch once): (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = unet_ckpt.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def random_state_dict(flags, seed):
    torch.manual_seed(seed)
    m = create_model(flags)
    with torch.no_grad():
        for p in m.parameters():  # zero modules too, so every tensor is checked
            p.normal_()
    return m.state_dict()


def bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_presets_are_guided_diffusion_readme_flags():
    for name, line in README_FLAGS.items():
        want = gd_flags(line)
        got = normalize_flags(preset=name)
        check(got == want, f"{name}: unet_torch preset {got} != {want}")
    check(set(PRESETS) == {"seed64", "tiny32"} | set(README_FLAGS), f"python presets {sorted(PRESETS)}")


def test_import_resolves_model_flags_as_guided_diffusion():
    """Pasted MODEL_FLAGS: without --preset they take guided-diffusion's defaults (not unet's), so
    they give the released configuration; on top of the preset they change nothing."""
    for name, line in README_FLAGS.items():
        for pre in ([], ["--preset", name]):
            a = unet_ckpt.build_parser().parse_args(["import", "x.pt", *pre, *line.split(), "-o", "y.h5"])
            flags, _ = unet_ckpt.import_flags(a)
            check(flags == normalize_flags(preset=name), f"{name} {pre}: import resolves {flags}")
    a = unet_ckpt.build_parser().parse_args(["import", "x.pt", "--image-size", "32", "-o", "y.h5"])
    try:
        unet_ckpt.import_flags(a)
        check(False, "image_size 32 without channel_mult and preset should be an error")
    except unet_ckpt.CliError as e:
        check("channel_mult" in str(e), f"error {e}")


def test_cpp_presets_match_pytorch():
    if not os.path.exists(BINARY):
        check(False, f"no unet binary at {BINARY}")
        return
    for name in PRESETS:
        r = unet("init", "--preset", name, "--print-params")
        check(r.returncode == 0, f"{name}: init --print-params failed: {r.stderr.strip()}")
        lines = r.stdout.splitlines()
        flags = parse_describe(lines[0])
        py = normalize_flags(preset=name)
        check(flags == py, f"{name}: C++ preset {flags} != python {py}")
        rows = [(n, tuple(int(d) for d in s.split("x"))) for n, s in (ln.split() for ln in lines[2:])]
        want = state_dict_shapes(preset=name)
        diff = next(((i, a, b) for i, (a, b) in enumerate(zip(rows, want)) if a != b), None)
        check(rows == want, f"{name}: C++ parameter table differs from the PyTorch state_dict "
                            f"({len(rows)} vs {len(want)} tensors; first difference {diff})")
        n = sum(int(np.prod(s)) for _, s in want)
        check(f"{len(want)} tensors, {n} parameters" in lines[1], f"{name}: count line {lines[1]!r}, want {n}")
    # flags still override a preset
    r = unet("init", "--preset", "imagenet512", "--print-params", "--class-cond=false",
             "--channel-mult", "0.5,1,2,2,4,4,4")
    want = state_dict_shapes(preset="imagenet512", class_cond=False, channel_mult="0.5,1,2,2,4,4,4")
    rows = [(n, tuple(int(d) for d in s.split("x"))) for n, s in (ln.split() for ln in r.stdout.splitlines()[2:])]
    check(r.returncode == 0 and rows == want, "imagenet512 with overrides")
    check(not os.listdir(TMP), "--print-params writes nothing")


def gd_classifier_flags(line):
    """README CLASSIFIER_FLAGS -> the classifier's flag dict, as guided-diffusion's scripts resolve them."""
    f = dict(GD_CLASSIFIER_DEFAULTS)
    toks = line.split()
    for k, v in zip(toks[::2], toks[1::2]):
        f[k[2:]] = v
    for k in ("classifier_use_scale_shift_norm", "classifier_resblock_updown"):
        f[k] = f[k] in (True, "True")
    f["classifier_channel_mult"] = GD_MULT[int(f["image_size"])]
    return ct.normalize_classifier_flags(f)


def test_classifier_presets_are_released_classifiers():
    """Issue 16 item 1 for the classifiers: each released classifier's preset is its README flags, in
    unet (C++) and scripts/classifier_torch.py alike, and `unet init --classifier --preset X
    --print-params` lists exactly create_classifier's state_dict names/shapes/order (built on the
    meta device)."""
    check(set(ct.CLASSIFIER_PRESETS) == {"default", "tiny32"} | set(README_CLASSIFIER_FLAGS),
          f"python classifier presets {sorted(ct.CLASSIFIER_PRESETS)}")
    for name, line in README_CLASSIFIER_FLAGS.items():
        want = gd_classifier_flags(line)
        py = ct.normalize_classifier_flags(preset=name)
        check(py == want, f"classifier {name}: classifier_torch preset {py} != README {want}")
        if not os.path.exists(BINARY):
            check(False, f"no unet binary at {BINARY}")
            continue
        r = unet("init", "--classifier", "--preset", name, "--print-params")
        check(r.returncode == 0, f"classifier {name}: init --print-params failed: {r.stderr.strip()}")
        if r.returncode:
            continue
        lines = r.stdout.splitlines()
        check(lines[0].startswith("# classifier "), f"classifier {name}: first line {lines[0]!r}")
        kv = dict(t.split("=", 1) for t in lines[0][len("# classifier "):].split())
        cpp = ct.normalize_classifier_flags(kv)
        check(cpp == py, f"classifier {name}: C++ preset {cpp} != python {py}")
        rows = [(n, tuple(int(d) for d in s.split("x"))) for n, s in (ln.split() for ln in lines[2:])]
        shapes = ct.classifier_state_dict_shapes(preset=name)
        diff = next(((i, a, b) for i, (a, b) in enumerate(zip(rows, shapes)) if a != b), None)
        check(rows == shapes, f"classifier {name}: C++ parameter table differs from create_classifier's state_dict "
                              f"({len(rows)} vs {len(shapes)} tensors; first difference {diff})")
        n = sum(int(np.prod(s)) for _, s in shapes)
        check(f"{len(shapes)} tensors, {n} parameters" in lines[1], f"classifier {name}: count line {lines[1]!r}")
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


def round_trip(tag, flags, args, cli, dtype=torch.float32):
    """import -> unet sample -> export; returns the exported state_dict (or None)."""
    sd = random_state_dict(flags, seed=len(tag))
    src = {k: v.to(dtype) for k, v in sd.items()}
    pt, h5, back = (os.path.join(TMP, f"{tag}.{e}") for e in ("pt", "h5", "back.pt"))
    torch.save(src, pt)
    code, out, err = ckpt("import", pt, *args, "-o", h5)
    check(code == 0 and not err, f"{tag}: import failed: {err.strip()}")
    if code:
        return None
    check("float16" not in out if dtype == torch.float32 else f"converted {len(sd)} float16" in out,
          f"{tag}: import summary {out.strip()!r}")
    with h5py.File(h5, "r") as f:
        check(list(f.keys()) == ["model"], f"{tag}: groups {list(f.keys())}")
        for k, v in src.items():
            d = f["model"][k]
            check(d.dtype == np.float32 and np.array_equal(d[()], v.float().numpy()), f"{tag}: model/{k}")
        check(unet_ckpt.read_flags(f) == normalize_flags(flags), f"{tag}: flags {unet_ckpt.read_flags(f)}")
    # The root attributes are those `unet init` writes for the same model: names, types, values.
    ref = os.path.join(TMP, f"{tag}.init.h5")
    r = unet("init", "-o", ref, *cli)
    check(r.returncode == 0, f"{tag}: unet init with the same flags: {r.stderr.strip()}")
    if r.returncode == 0:
        with h5py.File(h5, "r") as a, h5py.File(ref, "r") as b:
            check(sorted(a.attrs) == sorted(b.attrs), f"{tag}: attributes {sorted(a.attrs)} vs {sorted(b.attrs)}")
            for k in b.attrs:
                x, y = np.asarray(a.attrs.get(k)), np.asarray(b.attrs[k])
                check(x.dtype.kind == y.dtype.kind and np.array_equal(x, y), f"{tag}: attribute {k}: {x!r} vs {y!r}")
        os.remove(ref)
    r = unet("sample", h5, "-n", "2", "--sampler", "ddim", "--steps", "2", "--device", "cpu",
             "-o", os.path.join(TMP, f"{tag}.png"))
    check(r.returncode == 0, f"{tag}: unet sample of the imported checkpoint: {r.stderr.strip()}")
    code, out, err = ckpt("export", h5, "-o", back)
    check(code == 0 and "model/" in out and "MODEL_FLAGS" in out, f"{tag}: export: {out.strip()} {err.strip()}")
    if code:
        return None
    got = torch.load(back, map_location="cpu")
    check(type(got).__name__ == "OrderedDict", f"{tag}: exported a {type(got).__name__}")
    check(list(got) == list(sd), f"{tag}: exported names/order differ from the state_dict's")
    for k, v in sd.items():
        want = src[k].float()
        check(k in got and bits_equal(got[k], want), f"{tag}: {k} is not bit-identical after the round trip")
    # and it loads strictly into the PyTorch model as guided-diffusion's scripts load it
    create_model(flags).load_state_dict(got, strict=True)
    for n in os.listdir(TMP):
        os.remove(os.path.join(TMP, n))
    return got


def test_import_export_round_trip():
    round_trip("small", SMALL, SMALL_ARGS, SMALL_CLI)
    round_trip("half", HALF, HALF_ARGS, HALF_ARGS)


def test_import_float16():
    round_trip("fp16", SMALL, SMALL_ARGS, SMALL_CLI, dtype=torch.float16)


def test_export_ema_default():
    flags = normalize_flags(SMALL)
    sd = random_state_dict(flags, 1)
    ema = random_state_dict(flags, 2)
    h5 = os.path.join(TMP, "ema.h5")
    unet_ckpt.save_checkpoint(sd, flags, h5, ema=ema)
    for args, want, word in (([], ema, "ema/"), (["--ema"], ema, "ema/"), (["--model"], sd, "model/")):
        pt = os.path.join(TMP, "ema.pt")
        code, out, err = ckpt("export", h5, "-o", pt, *args)
        check(code == 0 and out.startswith(f"{pt}: {word}"), f"export {args}: {out!r} {err!r}")
        got = torch.load(pt)
        check(all(bits_equal(got[k], v) for k, v in want.items()), f"export {args} wrote the {word} weights")
    shutil.rmtree(TMP)
    os.makedirs(TMP)


def expect_error(tag, argv, words, out=None):
    before = sorted(os.listdir(TMP))
    code, stdout, err = ckpt(*argv)
    check(code == 1, f"{tag}: exit {code}, expected 1")
    check(len(err.strip().splitlines()) == 1 and err.startswith("unet_ckpt: "), f"{tag}: stderr {err!r}")
    check(not stdout, f"{tag}: stdout {stdout!r}")
    for w in words:
        check(w in err, f"{tag}: {w!r} not in {err.strip()!r}")
    check(sorted(os.listdir(TMP)) == before, f"{tag}: files changed: {sorted(os.listdir(TMP))} vs {before}")


def test_errors():
    flags = normalize_flags(SMALL)
    sd = random_state_dict(flags, 3)
    pt, out = os.path.join(TMP, "ok.pt"), os.path.join(TMP, "out.h5")
    torch.save(sd, pt)

    def saved(name, obj):
        p = os.path.join(TMP, name)
        torch.save(obj, p)
        return p

    d = dict(sd)
    del d["out.2.bias"]
    expect_error("missing", ["import", saved("missing.pt", d), *SMALL_ARGS, "-o", out], ["1 missing (out.2.bias)"])
    d = dict(sd, **{"extra.weight": torch.zeros(3)})
    expect_error("unexpected", ["import", saved("extra.pt", d), *SMALL_ARGS, "-o", out],
                 ["1 unexpected (extra.weight)"])
    d = dict(sd, **{"label_emb.weight": torch.zeros(11, 128)})
    expect_error("misshaped", ["import", saved("shape.pt", d), *SMALL_ARGS, "-o", out],
                 ["1 misshaped (label_emb.weight (11x128, expected 10x128))"])
    d = dict(sd, **{"out.2.bias": torch.zeros(6, dtype=torch.int64)})
    expect_error("integer tensor", ["import", saved("int.pt", d), *SMALL_ARGS, "-o", out], ["out.2.bias", "float"])
    # the wrong preset: listed differences, and the preset whose shapes do match is named
    tiny = saved("tiny.pt", random_state_dict(normalize_flags(preset="tiny32"), 4))
    expect_error("wrong preset", ["import", tiny, "--preset", "seed64", "-o", out],
                 ["does not match the model of preset seed64", "missing", "match preset tiny32"])
    expect_error("wrong flag", ["import", pt, "--preset", "tiny32", "-o", out], ["unexpected (label_emb.weight"])
    junk = os.path.join(TMP, "junk.pt")
    with open(junk, "wb") as f:
        f.write(b"not a pickle at all\n" * 10)
    expect_error("unreadable", ["import", junk, *SMALL_ARGS, "-o", out], ["junk.pt", "cannot read"])
    expect_error("no such file", ["import", os.path.join(TMP, "nope.pt"), *SMALL_ARGS, "-o", out], ["no such file"])
    expect_error("not a state_dict", ["import", saved("wrapped.pt", {"model": sd, "step": 3}), *SMALL_ARGS, "-o", out],
                 ["not a plain state_dict"])
    # the input survives an output that names it
    before = open(pt, "rb").read()
    expect_error("output onto input", ["import", pt, *SMALL_ARGS, "-o", pt], ["overwrite the input"])
    check(open(pt, "rb").read() == before, "input untouched")
    expect_error("no output directory", ["import", pt, *SMALL_ARGS, "-o", os.path.join(TMP, "no", "x.h5")],
                 ["does not exist"])
    expect_error("bad flag value", ["import", pt, "--preset", "tiny32", "--class-cond", "maybe", "-o", out],
                 ["true or false"])
    expect_error("unknown preset", ["import", pt, "--preset", "imagenet1024", "-o", out], ["invalid choice"])
    expect_error("invalid flags", ["import", pt, "--preset", "tiny32", "--num-head-channels", "24", "-o", out],
                 ["invalid model flags"])
    # export
    h5 = os.path.join(TMP, "ok.h5")
    unet_ckpt.save_checkpoint(sd, flags, h5)
    expect_error("export onto input", ["export", h5, "-o", h5], ["overwrite the input"])
    expect_error("export --ema without ema", ["export", h5, "--ema", "-o", os.path.join(TMP, "e.pt")], ["no ema/"])
    expect_error("export of a .pt", ["export", pt, "-o", os.path.join(TMP, "e.pt")], ["cannot open as HDF5"])
    expect_error("export --ema --model", ["export", h5, "--ema", "--model", "-o", os.path.join(TMP, "e.pt")],
                 ["not allowed"])
    # paths the system refuses, links to nothing, special files (a traceback from torch.save or a
    # late "cannot write" before; a FIFO input was "no such file")
    name_max = os.pathconf(TMP, "PC_NAME_MAX")
    too_long, tight = "n" * (name_max + 1), "t" * (name_max - 3)  # tight + ".pt": no room for ".tmp-PID"
    expect_error("export -o a name too long", ["export", h5, "-o", os.path.join(TMP, too_long + ".pt")],
                 ["File name too long"])
    expect_error("export -o without room for the suffix", ["export", h5, "-o", os.path.join(TMP, tight + ".pt")],
                 ["file name too long", "temporary name"])
    expect_error("import -o without room for the suffix",
                 ["import", pt, *SMALL_ARGS, "-o", os.path.join(TMP, tight + ".h5")], ["temporary name"])
    expect_error("import of a name too long", ["import", os.path.join(TMP, too_long + ".pt"), *SMALL_ARGS, "-o", out],
                 ["File name too long"])
    os.symlink(os.path.join(TMP, "gone.h5"), os.path.join(TMP, "dangling.h5"))
    expect_error("export of a link to nothing", ["export", os.path.join(TMP, "dangling.h5"), "-o",
                                                 os.path.join(TMP, "e.pt")], ["broken symbolic link", "gone.h5"])
    os.mkfifo(os.path.join(TMP, "fifo"))
    expect_error("import of a FIFO", ["import", os.path.join(TMP, "fifo"), *SMALL_ARGS, "-o", out], ["is a FIFO"])
    expect_error("export onto a FIFO", ["export", h5, "-o", os.path.join(TMP, "fifo")], ["is a FIFO", "refusing"])
    # the real command line: exit status 1 and one line
    r = subprocess.run([sys.executable, os.path.join(SRC, "scripts", "unet_ckpt.py"), "import", junk, "-o", out],
                       capture_output=True, text=True)
    check(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, f"script exit {r.returncode}: {r.stderr!r}")
    check(not os.path.exists(out), "no output after errors")


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
