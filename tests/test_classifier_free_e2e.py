"""Classifier-free guidance end to end (issue 13 item 4), through the CLI on the CPU:
- `unet init --class-dropout P` writes the null class's label_emb row and the attributes null_class /
  class_dropout (rows 0..K-1 as without it); a model without one keeps guided-diffusion's shapes;
- `unet train --class-dropout P`: the labels dropped over a run, counted by the trainer, are exactly
  those of the RNG contract transcribed in scripts/diffusion_torch.py (unet_class_dropped), and their
  number lies within binomial bounds; the null class's row learns (and stays put without dropout);
  --init of a checkpoint without a null class gains one; exact resume, bitwise, with --class-dropout
  (taken from the checkpoint quietly);
- `unet sample --guidance-scale W`: W = 1 equals `--class c` and W = 0 equals `--class K` (the null
  class), DDIM and DDPM (W = 0 with learned sigma under DDPM: null-class eps, conditional variance); guided DDPM (learned sigma: variance of the conditional half) and
  DDIM eta > 0 against diffusion_torch.classifier_free_model driving scripts/unet_torch.py in float64
  (two forward passes per step) with unet's step noise, rel 1e-4;
- scripts/unet_ckpt.py export writes label_emb with the extra row, says so, and a guided-diffusion
  UNetModel with num_classes + 1 loads it strictly;
- bad combinations are one line on stderr and exit 1.
Run by ctest with env UNET_BINARY, UNET_SOURCE_DIR, PYTHONPATH=scripts. Exit 77 = skipped.
On the GPU machine: UNET_TEST_DEVICE=cuda (UNET_TEST_PRECISION=fp32 keeps the 1e-4 limit; the
W = 0 / W = 1 checks allow UNET_CFG_BITWISE_TOL, default 1e-6: bitwise where the engine computes a sample
alike in batches of B and 2B, which the CPU engine does for the batches used here, 4 and 8).
"""

import math
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
import diffusion_torch as dt  # noqa: E402
from unet_ckpt import save_checkpoint  # noqa: E402
from unet_torch import create_model  # noqa: E402

require_binary()
DEVICE = os.environ.get("UNET_TEST_DEVICE", "cpu")
PREC = os.environ.get("UNET_TEST_PRECISION", "")
TOL = float(os.environ.get("UNET_PARITY_TOL", "1e-4"))
BITWISE_TOL = float(os.environ.get("UNET_CFG_BITWISE_TOL", "1e-6"))
TMP = work_dir("unet-cfg-")  # removed at exit
SEED = int(os.environ.get("UNET_TEST_SEED", str(int.from_bytes(os.urandom(4), "little"))))
print(f"UNET_TEST_SEED={SEED}")


ENV = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
torch.set_num_threads(1)


def unet(*args, ok=True):
    cmd = [BINARY, *[str(a) for a in args]]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if ok and r.returncode != 0:
        print("command failed:", " ".join(cmd), "\n", r.stdout, r.stderr)
    return r


def ckpt_tool(*args):
    r = subprocess.run([sys.executable, os.path.join(SRC, "scripts", "unet_ckpt.py"), *args], capture_output=True,
                       text=True, env=ENV)
    return r.returncode, r.stdout, r.stderr


def dev():
    return ["--device", DEVICE] + (["--precision", PREC] if PREC else [])


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]
        f.visititems(visit)
        out["@attrs"] = {k: np.asarray(v).tolist() for k, v in f.attrs.items()}
    return out


def one_line_error(r, what, label):
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    check(r.returncode == 1 and len(lines) == 1 and what in lines[0], f"{label}: exit {r.returncode}, {lines}")


K = 3
MODEL = ["--image-size", "8", "--num-channels", "32", "--channel-mult", "1,2", "--num-res-blocks", "1",
         "--attention-resolutions", "4", "--num-head-channels", "16", "--class-cond", "--num-classes", str(K),
         "--diffusion-steps", "50"]
FLAGS = dict(image_size=8, num_channels=32, channel_mult="1,2", num_res_blocks=1, attention_resolutions="4",
             num_head_channels=16, class_cond=True, num_classes=K, null_class=True, class_dropout=0.1)


def random_checkpoint(name, flags, seed):
    """Random weights everywhere (zero-initialised output layers would make the test blind); label_emb
    N(0,1) so classes and the null class change the prediction visibly."""
    torch.manual_seed(seed)
    model = create_model(flags)
    with torch.no_grad():
        for k, p in model.state_dict().items():
            if k == "label_emb.weight":
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in k and k.endswith("weight") else 0.08 * torch.randn_like(p))
    path = os.path.join(TMP, name + ".h5")
    save_checkpoint(model, flags, path)
    return model.double().eval(), path


def check_init():
    a, b = os.path.join(TMP, "init_cfg.h5"), os.path.join(TMP, "init_plain.h5")
    r = unet("init", "-o", a, *MODEL, "--class-dropout", "0.2", "--seed", SEED % 1000)
    check(r.returncode == 0 and "--class-dropout" in r.stdout, f"init --class-dropout: {r.stdout.strip()} {r.stderr.strip()}")
    r = unet("init", "-o", b, *MODEL, "--seed", SEED % 1000)
    check(r.returncode == 0, "init without a null class")
    ta, tb = tensors(a), tensors(b)
    la, lb = ta["model/label_emb.weight"], tb["model/label_emb.weight"]
    check(la.shape == (K + 1, 128) and lb.shape == (K, 128), f"label_emb rows {la.shape} / {lb.shape}")
    check(np.array_equal(la[:K], lb) and np.abs(la[K]).max() > 0, "rows 0..K-1 are the plain init's; row K is drawn")
    check(ta["@attrs"].get("null_class") == 1 and ta["@attrs"].get("class_dropout") == 0.2,
          f"attributes null_class, class_dropout: {ta['@attrs'].get('null_class')}, {ta['@attrs'].get('class_dropout')}")
    check("null_class" not in tb["@attrs"] and "class_dropout" not in tb["@attrs"],
          "a model without a null class carries neither attribute")
    same = [k for k in ta if k.startswith("model/") and k != "model/label_emb.weight" and not np.array_equal(ta[k], tb[k])]
    check(not same, f"every other tensor equal: {same[:3]}")
    return a, b


def check_errors(data, cfg_ckpt, plain_ckpt, uncond_ckpt, plain_run_ckpt):
    bad = os.path.join(TMP, "bad")
    no_cc = [x for x in MODEL if x != "--class-cond"]
    cases = [
        (["init", "-o", os.path.join(TMP, "x.h5"), *no_cc, "--class-dropout", "0.1"], "--class-cond",
         "init --class-dropout without --class-cond"),
        (["init", "-o", os.path.join(TMP, "x.h5"), *MODEL, "--class-dropout", "1"], "--class-dropout",
         "init --class-dropout 1"),
        (["init", "-o", os.path.join(TMP, "x.h5"), *MODEL, "--class-dropout", "-0.1"], "--class-dropout",
         "init --class-dropout -0.1"),
        (["init", "-o", os.path.join(TMP, "x.h5"), *MODEL, "--class-dropout", "nan"], "--class-dropout",
         "init --class-dropout nan"),
        (["train", data, "-o", bad, "--steps", "1", *no_cc, "--class-dropout", "0.1"], "--class-dropout",
         "train --class-dropout without --class-cond"),
        (["train", data, "-o", bad, "--steps", "1", "--init", uncond_ckpt, "--class-dropout", "0.1"],
         "not class-conditional", "train --init of an unconditional model with --class-dropout"),
        (["train", data, "-o", bad, "--steps", "1", "--init", cfg_ckpt, "--class-dropout", "1"], "[0, 1)",
         "train --class-dropout 1"),
        (["train", data, "-o", bad, "--steps", "1", "--init", cfg_ckpt, "--class-dropout", "1.5"], "--class-dropout",
         "train --class-dropout 1.5"),
        (["train", data, "--resume", plain_run_ckpt, "--class-dropout", "0.1", "--steps", "9"], "no null class",
         "train --resume of a run without a null class with --class-dropout"),
        (["sample", plain_ckpt, "--guidance-scale", "3", "-n", "1", "-o", ""], "no null class",
         "sample --guidance-scale on a model without a null class"),
        (["sample", uncond_ckpt, "--guidance-scale", "3", "-n", "1", "-o", ""], "not class-conditional",
         "sample --guidance-scale on an unconditional model"),
        (["sample", cfg_ckpt, "--guidance-scale", "-1", "-n", "1", "-o", ""], "--guidance-scale",
         "sample --guidance-scale -1"),
        (["sample", cfg_ckpt, "--guidance-scale", "inf", "-n", "1", "-o", ""], "--guidance-scale",
         "sample --guidance-scale inf"),
        (["sample", cfg_ckpt, "--class", str(K + 1), "-n", "1", "-o", ""], "null class",
         "sample --class past the null class"),
        (["sample", plain_ckpt, "--class", str(K), "-n", "1", "-o", ""], "out of range",
         "sample --class K on a model without a null class"),
    ]
    for args, what, label in cases:
        one_line_error(unet(*args, ok=False), what, label)
    check(not os.path.exists(os.path.join(bad, "latest.h5")), "no failed train wrote a checkpoint")


def check_train(data, cfg_ckpt, plain_ckpt, labels_per_image):
    p, B, steps, seed = 0.3, 8, 40, SEED % 100000
    run = os.path.join(TMP, "drop")
    r = unet("train", data, "--init", cfg_ckpt, "-o", run, "--steps", steps, "--batch-size", B, "--class-dropout", p,
             "--lr", "1e-3", "--seed", seed, "--log-every", "20", *dev())
    check(r.returncode == 0, f"train --class-dropout {p}")
    line = [l for l in r.stdout.splitlines() if l.startswith("class dropout:")]
    check(len(line) == 1, f"the summary names the dropped labels: {line}")
    if line:
        got, total = (int(x) for x in line[0].split(":")[1].split("labels")[0].split(" of "))
        want = sum(int(dt.unet_class_dropped(seed, s, np.arange(B), p).sum()) for s in range(steps))
        check(total == B * steps and got == want,
              f"dropped {got} of {total}; the transcribed RNG contract drops {want}")
        sd = math.sqrt(total * p * (1 - p))
        check(abs(got - total * p) <= 5 * sd, f"{got} within {total * p:.0f} +- 5 x {sd:.1f} (binomial)")
    t0, t1 = tensors(cfg_ckpt), tensors(os.path.join(run, "latest.h5"))
    null0, null1 = t0["model/label_emb.weight"][K], t1["model/label_emb.weight"][K]
    check(np.abs(null1 - null0).max() > 1e-4, f"the null class's row learns (moved {np.abs(null1 - null0).max():.2e})")
    check(t1["@attrs"].get("class_dropout") == p and t1["@attrs"].get("null_class") == 1,
          f"latest.h5 records class_dropout {t1['@attrs'].get('class_dropout')}")
    # Without dropout the null row gets no gradient: AdamW leaves it exactly where it was.
    run0 = os.path.join(TMP, "nodrop")
    r = unet("train", data, "--init", cfg_ckpt, "-o", run0, "--steps", 10, "--batch-size", B, "--class-dropout", 0,
             "--lr", "1e-3", "--seed", seed, *dev())
    check(r.returncode == 0 and "class dropout:" not in r.stdout, "train --class-dropout 0 (the init's 0.2 overridden)")
    t2 = tensors(os.path.join(run0, "latest.h5"))
    check(np.array_equal(t2["model/label_emb.weight"][K], null0) and t2["@attrs"].get("class_dropout") == 0,
          "without dropout the null row stays put; class_dropout 0 recorded")
    # --init without --class-dropout takes the checkpoint's (init wrote 0.2).
    run1 = os.path.join(TMP, "default")
    r = unet("train", data, "--init", cfg_ckpt, "-o", run1, "--steps", 5, "--batch-size", B, "--seed", seed, *dev())
    check(r.returncode == 0 and "(--class-dropout 0.2)" in r.stdout, f"--init takes class_dropout 0.2: {r.stdout.splitlines()[-2:]}")
    # --init of a class-conditional checkpoint without a null class gains one.
    run2 = os.path.join(TMP, "grown")
    r = unet("train", data, "--init", plain_ckpt, "-o", run2, "--steps", 3, "--batch-size", B, "--class-dropout", 0.5,
             "--seed", seed, *dev())
    check(r.returncode == 0 and "gains row 3" in r.stdout, f"--init gains a null class: {r.stdout.splitlines()[:2]}")
    if r.returncode == 0:
        t3 = tensors(os.path.join(run2, "latest.h5"))
        check(t3["model/label_emb.weight"].shape == (K + 1, 128) and t3["@attrs"].get("null_class") == 1,
              "its checkpoints have the null class")

    # Exact resume with class dropout: 12 straight == 6 + resume to 12, bitwise.
    a, b = os.path.join(TMP, "ra"), os.path.join(TMP, "rb")
    common = ["--lr", "3e-4", "--log-every", "1", "--seed", seed + 1, "--batch-size", 4, *dev()]
    ra = unet("train", data, "--init", cfg_ckpt, "-o", a, "--steps", 12, "--class-dropout", 0.4, *common)
    rb = unet("train", data, "--init", cfg_ckpt, "-o", b, "--steps", 6, "--class-dropout", 0.4, *common)
    rc = unet("train", data, "--resume", os.path.join(b, "latest.h5"), "--steps", 12, *common)
    check(ra.returncode == 0 and rb.returncode == 0 and rc.returncode == 0, "resume: runs")
    if ra.returncode == 0 and rb.returncode == 0 and rc.returncode == 0:
        check(not rc.stderr.strip(), f"resume takes --class-dropout from the checkpoint quietly ({rc.stderr.strip()})")
        ta, tb = tensors(os.path.join(a, "latest.h5")), tensors(os.path.join(b, "latest.h5"))
        diff = [k for k in ta if k not in tb or not (ta[k] == tb[k] if k == "@attrs" else np.array_equal(ta[k], tb[k]))]
        check(ta.keys() == tb.keys() and not diff, f"12 straight == 6 + resume to 12, bitwise ({len(ta)} datasets; "
                                                   f"differing: {diff[:3]})")
        la = [l.split(",")[:3] for l in open(os.path.join(a, "metrics.csv")).read().splitlines()]
        lb = [l.split(",")[:3] for l in open(os.path.join(b, "metrics.csv")).read().splitlines()]
        check(la == lb, "metrics identical")
        # and the dropout mattered: the same run without it ends elsewhere
        c = os.path.join(TMP, "rc")
        unet("train", data, "--init", cfg_ckpt, "-o", c, "--steps", 12, "--class-dropout", 0, *common)
        tc = tensors(os.path.join(c, "latest.h5"))
        check(not np.array_equal(tc["model/out.2.weight"], ta["model/out.2.weight"]), "class dropout changes the run")
        rd = unet("train", data, "--resume", os.path.join(a, "latest.h5"), "--steps", 13, "--class-dropout", 0.1,
                  *common)
        check(rd.returncode == 0 and "--class-dropout 0.1 (checkpoint: 0.4)" in rd.stderr,
              f"overriding it on resume warns: {rd.stderr.strip()}")
    # Data-parallel (CPU ranks): each rank drops the labels of its slice of the global batch, so 2
    # ranks train the steps of 1 process (reduction-order tolerance) and report the same count. A rank
    # deciding by its local sample index would drop other samples' labels: a different run.
    if DEVICE == "cpu":
        one, two = os.path.join(TMP, "dp1"), os.path.join(TMP, "dp2")
        common = ["--init", cfg_ckpt, "--steps", 4, "--batch-size", 8, "--class-dropout", 0.5, "--lr", "1e-3",
                  "--seed", seed + 2, "--device", "cpu"]
        r1 = unet("train", data, *common, "-o", one)
        r2 = unet("train", data, *common, "--gpus", 2, "-o", two)
        check(r1.returncode == 0 and r2.returncode == 0, "class dropout with --gpus 2 --device cpu")
        if r1.returncode == 0 and r2.returncode == 0:
            c1 = [l for l in r1.stdout.splitlines() if l.startswith("class dropout:")]
            c2 = [l for l in r2.stdout.splitlines() if l.startswith("class dropout:")]
            check(c1 == c2 and len(c1) == 1, f"2 ranks count the global batch's dropped labels: {c1} vs {c2}")
            m1, m2 = tensors(os.path.join(one, "latest.h5")), tensors(os.path.join(two, "latest.h5"))
            ks = sorted(k for k in m1 if k.startswith("model/"))
            a1 = np.concatenate([m1[k].ravel() for k in ks])
            a2 = np.concatenate([m2[k].ravel() for k in ks])
            a0 = np.concatenate([t0[k].ravel() for k in ks])
            # Relative to the 4 steps' update: the reduction order alone gives ~2e-4 (AdamW's
            # normalisation magnifies tiny gradients' differences), other dropped labels ~0.5.
            e = float(np.linalg.norm(a2 - a1) / np.linalg.norm(a1 - a0))
            check(e < 1e-2, f"2 ranks vs 1 process: the weight update agrees (rel L2 of the updates {e:.1e})")
    return os.path.join(a, "latest.h5")


def sample(ck, noise, out, *args):
    r = unet("sample", ck, "--noise", noise, "--h5", out, "-o", "", *args, *dev())
    if r.returncode:
        return None, r
    with h5py.File(out, "r") as f:
        return f["samples"][()], r


def check_sampling():
    for ls in (False, True):
        flags = dict(FLAGS, learn_sigma=ls, use_scale_shift_norm=ls, diffusion_steps=40,
                     noise_schedule="cosine" if ls else "linear")
        model, ck = random_checkpoint(f"rand{int(ls)}", flags, SEED % 1000 + ls)
        n = 4
        x_T = np.random.default_rng(SEED + ls).standard_normal((n, 3, 8, 8)).astype(np.float32)
        noise = os.path.join(TMP, f"noise{int(ls)}.h5")
        with h5py.File(noise, "w") as f:
            f["noise"] = x_T
        o = os.path.join(TMP, "s.h5")
        c = SEED % K
        for sampler in ("ddim", "ddpm"):
            common = ["--sampler", sampler, "--steps", "6", "--eta", "0.5", "--seed", "11", "--batch-size", "4"]
            tag = f"{sampler}, learn_sigma={ls}"
            cond, _ = sample(ck, noise, o, *common, "--class", c)
            null, _ = sample(ck, noise, o, *common, "--class", K)
            w1, r1 = sample(ck, noise, o, *common, "--class", c, "--guidance-scale", "1")
            w0, _ = sample(ck, noise, o, *common, "--class", c, "--guidance-scale", "0")
            w4, r4 = sample(ck, noise, o, *common, "--class", c, "--guidance-scale", "4")
            if any(v is None for v in (cond, null, w1, w0, w4)):
                check(False, f"{tag}: sampling runs")
                continue
            check("guidance scale 1" in r1.stdout and "planned for batch 8: conditional and unconditional" in r1.stdout,
                  f"{tag}: the run says guided, memory planned for 2B: {r1.stdout.splitlines()}")
            with h5py.File(o, "r") as f:
                check(float(f.attrs["guidance_scale"]) == 4.0, f"{tag}: --h5 records guidance_scale")
            d1, d0 = np.abs(w1 - cond).max(), np.abs(w0 - null).max()
            check(d1 <= BITWISE_TOL, f"{tag}: W = 1 equals --class {c} (max diff {d1:.1e})")
            if ls and sampler == "ddpm":  # the variance is the conditional half's
                check(d0 > 1e-3, f"{tag}: W = 0 keeps the conditional variance, unlike --class {K} (max diff {d0:.1e})")
            else:
                check(d0 <= BITWISE_TOL, f"{tag}: W = 0 equals --class {K}, the null class (max diff {d0:.1e})")
            check(rel_l2(cond, null) > 1e-3 and rel_l2(w4, cond) > 1e-3, f"{tag}: the labels and the scale matter")
            # The PyTorch reference: the model called twice per step, GLIDE/diffusers' mix.
            d = dt.Diffusion(40, flags["noise_schedule"], ls, dt.sampler_timesteps(sampler, 40, 6))
            guided = dt.classifier_free_model(model, 4.0, K, 3)
            y = torch.full((n,), c, dtype=torch.long)
            xt = torch.from_numpy(x_T).double()
            with torch.no_grad():
                want = (d.p_sample_loop(guided, xt, labels=y, step_noise=dt.unet_step_noise(11)) if sampler == "ddpm"
                        else d.ddim_loop(guided, xt, eta=0.5, labels=y, step_noise=dt.unet_step_noise(11))).numpy()
            e = rel_l2(w4, want)
            check(e < TOL, f"{tag}: W = 4 vs the PyTorch reference (two passes per step), rel L2 {e:.2e}")
    return ck


def check_export(ck):
    pt = os.path.join(TMP, "cfg.pt")
    code, out, err = ckpt_tool("export", ck, "-o", pt)
    check(code == 0 and f"has {K + 1} rows" in out and f"num_classes={K + 1}" in out,
          f"export says label_emb has the null class's row: {out.strip()} {err.strip()}")
    if code:
        return
    sd = torch.load(pt, map_location="cpu", weights_only=True)
    check(tuple(sd["label_emb.weight"].shape) == (K + 1, 128), f"exported label_emb {tuple(sd['label_emb.weight'].shape)}")
    # guided-diffusion's UNetModel with num_classes + 1 (no null-class notion of its own) loads it.
    gd_flags = dict(FLAGS, null_class=False, class_dropout=0.0, num_classes=K + 1, learn_sigma=True,
                    use_scale_shift_norm=True, diffusion_steps=40, noise_schedule="cosine")
    m = create_model(gd_flags)
    try:
        m.load_state_dict(sd, strict=True)
        check(True, f"a guided-diffusion UNetModel with num_classes={K + 1} loads it strictly")
    except RuntimeError as e:
        check(False, f"strict load into num_classes={K + 1}: {str(e).splitlines()[0]}")


def main():
    data = os.path.join(TMP, "d8.h5")
    r = unet("prepare", os.path.join(SRC, "testdata", "images"), "-o", data, "--image-size", "8", "--labels", "subdirs")
    check(r.returncode == 0, "prepare the bundled images at 8x8 with labels")
    with h5py.File(data, "r") as f:
        labels = f["labels"][()]
    cfg_ckpt, plain_ckpt = check_init()
    uncond = os.path.join(TMP, "uncond.h5")
    unet("init", "-o", uncond, *[x for x in MODEL if x != "--class-cond"])
    plain_run = os.path.join(TMP, "plainrun")
    unet("train", data, "--init", plain_ckpt, "-o", plain_run, "--steps", "2", "--batch-size", "2", *dev())
    check_errors(data, cfg_ckpt, plain_ckpt, uncond, os.path.join(plain_run, "latest.h5"))
    check_train(data, cfg_ckpt, plain_ckpt, labels)
    ck = check_sampling()
    check_export(ck)
    # .h5 -> .pt -> .h5 through export and import --null-class --class-dropout: init's file, attributes included.
    pt, back = os.path.join(TMP, "init_cfg.pt"), os.path.join(TMP, "init_back.h5")
    code, _, err = ckpt_tool("export", cfg_ckpt, "-o", pt)
    code2, _, err2 = ckpt_tool("import", pt, "--preset", "seed64", *MODEL, "--null-class", "--class-dropout", "0.2",
                               "-o", back)
    check(code == 0 and code2 == 0, f"export, import --null-class: {err.strip()} {err2.strip()}")
    if code == 0 and code2 == 0:
        ta, tb = tensors(cfg_ckpt), tensors(back)
        check(ta["@attrs"] == tb["@attrs"] and all(np.array_equal(ta[k], tb[k]) for k in ta if k != "@attrs"),
              "the round trip gives init's checkpoint back (attributes and tensors)")
    # A model without a null class exports as before: no note.
    code, out, _ = ckpt_tool("export", plain_ckpt, "-o", os.path.join(TMP, "plain.pt"))
    check(code == 0 and "null class" not in out and "rows" not in out, f"plain export unchanged: {out.strip()}")
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is a failure, not a skip
        import traceback
        traceback.print_exc()
        sys.exit(1)
