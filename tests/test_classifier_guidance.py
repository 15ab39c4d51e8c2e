"""`unet sample --classifier` against guided-diffusion's classifier guidance transcribed in PyTorch
(scripts/classifier_torch.py: cond_fn, condition_mean for DDPM, condition_score for DDIM, on
scripts/diffusion_torch.py's respaced process), driving the PyTorch UNet and classifier in float64
on the same random weights:
- DDIM eta=0 from a --noise file, a given --class, unconditional and class-conditional models;
- DDPM (fixed-large and learned-range variance: the mean gains variance * grad) with the step noise
  `unet` draws (its RNG transcribed in diffusion_torch.py), so it is deterministic too;
- random classes when --class is not given: the --h5 output's `labels` are the classes guided towards;
- scale 0 equals the unguided sampler bitwise, and the guidance changes the samples;
- the classifier sees the model's (original, rescaled) timestep: a --rescale-timesteps model;
- a model with a null class (trained with --class-dropout): classifier guidance alone, and on top of
  classifier-free guidance (--guidance-scale W: the classifier conditions the step of the
  W-guided prediction) vs guided-diffusion's cond_fn around the two-pass CFG mix; the null class
  is refused as a class to guide towards.
Run by ctest with env UNET_BINARY, UNET_SOURCE_DIR, PYTHONPATH=scripts. Exit 77 = skipped.
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
import diffusion_torch as dt  # noqa: E402
from unet_ckpt import save_checkpoint, save_classifier_checkpoint  # noqa: E402
from unet_torch import create_model  # noqa: E402

require_binary()
TMP = work_dir("unet-guidance-")  # removed at exit
SEED = int(os.environ.get("UNET_TEST_SEED", np.random.SeedSequence().entropy % (1 << 31)))
print(f"UNET_TEST_SEED={SEED}")
DEVICE = os.environ.get("UNET_TEST_DEVICE", "cpu")
PRECISION = os.environ.get("UNET_TEST_PRECISION", "")
# Relative L2 of the final samples. The guided step adds a float32 classifier gradient (itself
# ~1e-6 of the float64 one) to every step; measured ~1e-6 on the CPU.
TOL = float(os.environ.get("UNET_PARITY_TOL", "1e-4"))
print(f"device={DEVICE} precision={PRECISION or 'default'} tol={TOL}")


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def randomize(module, seed, scale=0.08):
    torch.manual_seed(seed)
    with torch.no_grad():
        for k, p in module.state_dict().items():
            if ("norm" in k or k.startswith("out.0")) and k.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))


def make_model(name, flags, seed):
    model = create_model(flags)
    randomize(model, seed)
    path = os.path.join(TMP, name + ".h5")
    save_checkpoint(model, flags, path)
    return model.double().eval(), path


def make_classifier(name, flags, seed):
    clf = ct.create_classifier(flags)
    randomize(clf, seed, scale=0.2)  # sizeable gradients: the guidance must move the samples
    path = os.path.join(TMP, name + ".h5")
    save_classifier_checkpoint(clf, flags, path)
    return clf.double().eval(), path


def run_sample(ckpt, args, out):
    cmd = [BINARY, "sample", ckpt, "--device", DEVICE, "--h5", out, "-o", ""] + args
    if PRECISION:
        cmd += ["--precision", PRECISION]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(" ".join(cmd), "\n", r.stdout, r.stderr)
        return None, None
    with h5py.File(out, "r") as f:
        return f["samples"][()], (f["labels"][()] if "labels" in f else None)


def main():
    rng = np.random.default_rng(SEED)
    T = 40
    base = dict(image_size=8, num_channels=32, channel_mult="1,2", num_res_blocks=1, attention_resolutions="4",
                num_head_channels=16, diffusion_steps=T)
    plain, plain_ck = make_model("plain", dict(base, noise_schedule="linear"), SEED)
    learned, learned_ck = make_model(
        "learned", dict(base, noise_schedule="cosine", learn_sigma=True, class_cond=True, num_classes=5,
                        use_scale_shift_norm=True, resblock_updown=True), SEED + 1)
    rescaled, rescaled_ck = make_model("rescaled", dict(base, noise_schedule="linear", rescale_timesteps=True),
                                       SEED + 2)
    nulled, nulled_ck = make_model("nulled", dict(base, noise_schedule="linear", class_cond=True, num_classes=5,
                                                  null_class=True, class_dropout=0.1), SEED + 5)
    cflags = dict(image_size=8, classifier_width=64, classifier_depth=1, classifier_channel_mult="1,2",
                  classifier_attention_resolutions="4", classifier_num_head_channels=32, num_classes=5,
                  diffusion_steps=T)
    clf, clf_ck = make_classifier("clf", cflags, SEED + 3)
    n, C, R = 3, 3, 8
    x_T = rng.standard_normal((n, C, R, R)).astype(np.float32)
    noise_file = os.path.join(TMP, "noise.h5")
    with h5py.File(noise_file, "w") as f:
        f.create_dataset("noise", data=x_T)
    xt = torch.from_numpy(x_T).double()
    s = int(rng.integers(1 << 30))
    scale = float(rng.uniform(2.0, 6.0))
    cls = int(rng.integers(5))
    y = torch.full((n,), cls, dtype=torch.long)
    g = ["--classifier", clf_ck, "--classifier-scale", f"{scale!r}"]

    def ref(model, sampler, steps, labels=None, y=y, **kw):
        return lambda: ct.guided_sample(model, clf, scale, xt, y, sampler=sampler, steps=steps, labels=labels, T=T,
                                        **kw)

    cases = [
        ("ddim eta=0, 10 steps, unconditional model, class %d" % cls, plain_ck,
         ["--sampler", "ddim", "--steps", "10", "--noise", noise_file, "--class", str(cls)] + g,
         ref(plain, "ddim", 10, schedule="linear")),
        ("ddim eta=0, all steps, class-conditional learned-sigma model", learned_ck,
         ["--sampler", "ddim", "--noise", noise_file, "--class", str(cls)] + g,
         ref(learned, "ddim", 0, labels=y, schedule="cosine", learn_sigma=True)),
        ("ddim eta=0.5, 20 steps", plain_ck,
         ["--sampler", "ddim", "--steps", "20", "--eta", "0.5", "--noise", noise_file, "--seed", str(s), "--class",
          str(cls)] + g,
         ref(plain, "ddim", 20, eta=0.5, schedule="linear", step_noise=dt.unet_step_noise(s))),
        ("ddpm fixed-large, all 40 steps (condition_mean)", plain_ck,
         ["--sampler", "ddpm", "--noise", noise_file, "--seed", str(s), "--class", str(cls)] + g,
         ref(plain, "ddpm", 0, schedule="linear", step_noise=dt.unet_step_noise(s))),
        ("ddpm learned-range, 13 steps respaced, class-conditional", learned_ck,
         ["--sampler", "ddpm", "--steps", "13", "--noise", noise_file, "--seed", str(s), "--class", str(cls)] + g,
         ref(learned, "ddpm", 13, labels=y, schedule="cosine", learn_sigma=True, step_noise=dt.unet_step_noise(s))),
        ("ddim eta=0, 10 steps, rescale_timesteps model (classifier sees t*1000/T)", rescaled_ck,
         ["--sampler", "ddim", "--steps", "10", "--noise", noise_file, "--class", str(cls)] + g,
         ref(rescaled, "ddim", 10, schedule="linear", rescale_timesteps=True)),
    ]
    # Classifier-free guidance underneath: the classifier's gradient conditions the step of the mix.
    w = float(rng.uniform(1.5, 4.0))
    cfg = dt.classifier_free_model(nulled, w, 5, 3)
    cases += [
        ("ddim eta=0, 10 steps, null-class model, no --guidance-scale", nulled_ck,
         ["--sampler", "ddim", "--steps", "10", "--noise", noise_file, "--class", str(cls)] + g,
         ref(nulled, "ddim", 10, labels=y, schedule="linear")),
        ("ddim eta=0, 10 steps, --guidance-scale %.2f and classifier guidance" % w, nulled_ck,
         ["--sampler", "ddim", "--steps", "10", "--noise", noise_file, "--class", str(cls), "--guidance-scale",
          f"{w!r}"] + g,
         ref(cfg, "ddim", 10, labels=y, schedule="linear")),
        ("ddpm, 8 steps respaced, --guidance-scale %.2f and classifier guidance" % w, nulled_ck,
         ["--sampler", "ddpm", "--steps", "8", "--noise", noise_file, "--seed", str(s), "--class", str(cls),
          "--guidance-scale", f"{w!r}"] + g,
         ref(cfg, "ddpm", 8, labels=y, schedule="linear", step_noise=dt.unet_step_noise(s))),
    ]
    for i, (name, ck, args, want_fn) in enumerate(cases):
        got, labels = run_sample(ck, args, os.path.join(TMP, f"out{i}.h5"))
        if got is None:
            check(False, f"{name}: unet sample failed")
            continue
        with torch.no_grad():
            want = want_fn().numpy()
        err = rel_l2(got, want)
        check(got.shape == want.shape and err < TOL, f"{name}: rel L2 {err:.2e}")
        check(labels is not None and (labels == cls).all(), f"{name}: --h5 labels are the guided class")

    # Random classes (no --class): the labels written are the ones guided towards.
    got, labels = run_sample(plain_ck, ["--sampler", "ddim", "--steps", "8", "--noise", noise_file, "--seed", str(s)]
                             + g, os.path.join(TMP, "rand.h5"))
    ok = got is not None and labels is not None and labels.shape == (n,) and labels.min() >= 0 and labels.max() < 5
    check(ok, f"random classes written as labels: {labels}")
    if ok:
        with torch.no_grad():
            want = ct.guided_sample(plain, clf, scale, xt, torch.from_numpy(labels).long(), sampler="ddim", steps=8,
                                    T=T).numpy()
        check(rel_l2(got, want) < TOL, f"random classes: rel L2 {rel_l2(got, want):.2e}")

    # Scale 0 is the unguided sampler, bitwise; a nonzero scale changes the samples.
    a, _ = run_sample(plain_ck, ["--sampler", "ddim", "--steps", "10", "--noise", noise_file, "--class", "1",
                                 "--classifier", clf_ck, "--classifier-scale", "0"], os.path.join(TMP, "s0.h5"))
    b, _ = run_sample(plain_ck, ["--sampler", "ddim", "--steps", "10", "--noise", noise_file],
                      os.path.join(TMP, "unguided.h5"))
    c, _ = run_sample(plain_ck, ["--sampler", "ddim", "--steps", "10", "--noise", noise_file, "--class", "1"] + g,
                      os.path.join(TMP, "guided.h5"))
    check(a is not None and b is not None and np.array_equal(a, b), "scale 0 equals unguided sampling bitwise")
    check(b is not None and c is not None and rel_l2(c, b) > 1e-3,
          f"guidance changes the samples (rel {rel_l2(c, b) if b is not None and c is not None else 0:.2e})")

    # Bad inputs: one line naming the file and the problem, exit 1.
    other = dict(cflags, image_size=16, classifier_channel_mult="1,2", classifier_attention_resolutions="8")
    _, big_ck = make_classifier("clf16", other, SEED + 4)
    r = subprocess.run([BINARY, "sample", plain_ck, "--device", DEVICE, "--classifier", big_ck, "-o", ""],
                       capture_output=True, text=True)
    check(r.returncode == 1 and big_ck in r.stderr and "16x16" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
          f"classifier image size mismatch: {r.stderr.strip()}")
    r = subprocess.run([BINARY, "sample", plain_ck, "--device", DEVICE, "--classifier", plain_ck, "-o", ""],
                       capture_output=True, text=True)
    check(r.returncode == 1 and "not a classifier" in r.stderr, f"a model as --classifier: {r.stderr.strip()}")
    r = subprocess.run([BINARY, "sample", plain_ck, "--device", DEVICE, "--class", "7", "--classifier", clf_ck, "-o",
                        ""], capture_output=True, text=True)
    check(r.returncode == 1 and "out of range" in r.stderr, f"--class beyond the classifier: {r.stderr.strip()}")
    for extra in ([], ["--guidance-scale", "2"]):
        r = subprocess.run([BINARY, "sample", nulled_ck, "--device", DEVICE, "--class", "5", "--classifier", clf_ck,
                            "-o", ""] + extra, capture_output=True, text=True)
        check(r.returncode == 1 and "null class" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
              f"--class 5 (the null class) with a classifier {extra}: {r.stderr.strip()}")
    # A classifier trained under another noise process than the model's: a warning (one line on
    # stderr, naming both), and the sampling goes on.
    r = subprocess.run([BINARY, "sample", learned_ck, "--device", DEVICE, "-n", "1", "--steps", "2", "--sampler",
                        "ddim", "-o", "", "--classifier", clf_ck], capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 0 and len(lines) == 1 and "warning" in lines[0] and "cosine" in lines[0] and
          "linear" in lines[0] and clf_ck in lines[0], f"cosine model, linear classifier: a warning: {lines}")
    r = subprocess.run([BINARY, "sample", plain_ck, "--device", DEVICE, "-n", "1", "--steps", "2", "--sampler",
                        "ddim", "-o", "", "--classifier", clf_ck], capture_output=True, text=True)
    check(r.returncode == 0 and r.stderr == "", f"the same noise process: nothing on stderr ({r.stderr.strip()})")
    # Random classes of a null-class model guided by a classifier: never the null class.
    got, labels = run_sample(nulled_ck, ["--sampler", "ddim", "--steps", "3", "-n", "12", "--seed", str(s),
                                         "--guidance-scale", "2"] + g, os.path.join(TMP, "nulled_rand.h5"))
    check(labels is not None and labels.min() >= 0 and labels.max() < 5,
          f"null-class model, random classes guided towards: {labels}")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # a crash is a failure, not a skip
        import traceback
        traceback.print_exc()
        failures.append("exception")
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
