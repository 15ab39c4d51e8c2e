"""`unet train-classifier` end to end on the bundled labelled images (3 classes, 32x32):
- the loss falls (clean images, --noised=false) and metrics.csv has exactly guided-diffusion's
  log_loss_dict columns (loss, acc1, acc5, per-quartile, val_* with --val-data), accuracies in [0, 1];
- noised training: timesteps in every quartile, validation columns filled;
- exact resume: 6 steps straight equals 3 + --resume to 6, bitwise (weights, EMA, AdamW moments) and in
  metrics.csv (validation included), with micro-batches and an EMA; on the GPU, the optimizer's updates
  during the backward (no clipping) give bitwise the weights of one stream;
- SIGINT saves a checkpoint; the checkpoint is a classifier PyTorch loads and `unet sample --classifier` uses;
- bad inputs: one line naming the file, exit 1 (unlabelled dataset, image size mismatch, a diffusion model as
  --init, labels beyond --num-classes).
CI runs it on the CPU; on the GPU machine: UNET_TEST_DEVICE=cuda [UNET_TEST_PRECISION=tf32]."""

import os
import signal
import subprocess
import sys
import time

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(77)

from e2e_common import BINARY, check, failures, require_binary, SRC, work_dir  # noqa: E402
require_binary()
DEVICE = os.environ.get("UNET_TEST_DEVICE", "cpu")
PREC = os.environ.get("UNET_TEST_PRECISION", "")
TMP = work_dir("unet-clstrain-")  # removed at exit


def unet(*args, ok=True):
    cmd = [BINARY, *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if ok and r.returncode != 0:
        print("command failed:", " ".join(cmd), "\n", r.stdout, r.stderr)
    return r


def dev():
    return ["--device", DEVICE] + (["--precision", PREC] if PREC else [])


def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]
        f.visititems(visit)
        out["@state"] = dict(f["state"].attrs) if "state" in f else {}
    return out


def metrics(run):
    lines = open(os.path.join(run, "metrics.csv")).read().splitlines()
    head = lines[0].split(",")
    return head, [dict(zip(head, l.split(","))) for l in lines[1:] if l]


TERMS = ("loss", "acc1", "acc5")


def want_columns(val):
    c = ["step", "loss", "grad_norm", "lr", "images_per_s", "ms_per_step", "acc1", "acc5"]
    c += [f"{n}_q{q}" for n in TERMS for q in range(4)]
    if val:
        c += [f"val_{n}" for n in TERMS] + [f"val_{n}_q{q}" for n in TERMS for q in range(4)]
    return c


def main():
    data, unlabelled, big = (os.path.join(TMP, n) for n in ("d.h5", "u.h5", "d64.h5"))
    images = os.path.join(SRC, "testdata", "images")
    r = unet("prepare", images, "-o", data, "--image-size", "32", "--labels", "subdirs")
    check(r.returncode == 0, "prepare the bundled labelled images")
    unet("prepare", images, "-o", unlabelled, "--image-size", "32")
    unet("prepare", images, "-o", big, "--image-size", "64", "--labels", "subdirs")
    net = ["--preset", "tiny32", "--num-classes", "3"]

    # The loss falls (clean images: 40 steps are enough to tell circles, squares and stripes apart).
    run = os.path.join(TMP, "clean")
    r = unet("train-classifier", data, *net, "-o", run, "--steps", "40", "--batch-size", "8", "--lr", "1e-3",
             "--log-every", "10", "--noised=false", "--seed", "5", *dev())
    check(r.returncode == 0 and "unet train-classifier" in r.stdout, "train-classifier 40 steps")
    head, rows = metrics(run)
    check(head == want_columns(False), f"metrics.csv columns: {head}")
    losses = [float(x["loss"]) for x in rows]
    check(len(rows) == 4 and all(np.isfinite(losses)), f"4 finite rows: {losses}")
    check(losses[-1] < 0.85 * losses[0], f"loss fell: {losses[0]:.4f} -> {losses[-1]:.4f}")
    acc = [float(x[k]) for x in rows for k in ("acc1", "acc5")]
    check(all(0 <= a <= 1 for a in acc) and all(float(x["acc5"]) == 1.0 for x in rows), "accuracies in [0, 1]; "
          "top-5 of 3 classes is 1")
    check(all(x["loss_q1"] == "" and x["loss_q0"] != "" for x in rows), "--noised=false: every sample at t = 0 (q0)")
    for f in ("ckpt_0000040.h5", "latest.h5"):
        check(os.path.exists(os.path.join(run, f)), f"wrote {f}")
    with h5py.File(os.path.join(run, "latest.h5"), "r") as f:
        check(f.attrs["format"] == "unet-classifier" and "ema" not in f and "optimizer" in f,
              "a classifier checkpoint with optimizer state and no EMA (--ema-rate 0)")

    # Noised training with validation; the checkpoint guides a sampler and loads in PyTorch.
    run = os.path.join(TMP, "noised")
    r = unet("train-classifier", data, *net, "-o", run, "--steps", "12", "--batch-size", "8", "--log-every", "6",
             "--val-data", data, "--eval-every", "2", "--ema-rate", "0.9", *dev())
    check(r.returncode == 0 and "val loss" in r.stdout, "noised training with --val-data")
    head, rows = metrics(run)
    check(head == want_columns(True), f"metrics.csv columns with validation: {len(head)}")
    check(all(x["val_loss"] != "" and np.isfinite(float(x["val_loss"])) for x in rows), "val_loss in every row")
    filled = {q for x in rows for q in range(4) if x[f"loss_q{q}"] != ""}
    check(len(filled) >= 3, f"noised timesteps reach the quartiles {sorted(filled)}")
    ck = os.path.join(run, "latest.h5")
    with h5py.File(ck, "r") as f:
        check("ema" in f, "--ema-rate 0.9 saves an EMA")
    m = os.path.join(TMP, "m.h5")
    unet("init", "-o", m, "--preset", "tiny32", "--diffusion-steps", "100")
    r = unet("sample", m, "--classifier", ck, "--classifier-scale", "2", "-n", "2", "--sampler", "ddim", "--steps",
             "5", "--h5", os.path.join(TMP, "g.h5"), "-o", "", *dev())
    check(r.returncode == 0, f"unet sample --classifier uses it: {r.stderr.strip()}")
    try:
        from unet_ckpt import load_classifier_checkpoint  # scripts/ is on the path (e2e_common)
        load_classifier_checkpoint(ck)
        check(True, "PyTorch loads the trained classifier strictly")
    except ImportError:
        print("(torch not available: PyTorch load skipped)")

    # Exact resume, with validation, micro-batches and an EMA.
    a, b = os.path.join(TMP, "a"), os.path.join(TMP, "b")
    common = ["--batch-size", "4", "--microbatch", "2", "--lr", "3e-4", "--log-every", "1", "--ema-rate", "0.99",
              "--grad-clip", "1.0", "--lr-warmup", "2", "--val-data", data, "--eval-every", "2", "--seed", "11", *dev()]
    unet("train-classifier", data, *net, "-o", a, "--steps", "6", *common)
    unet("train-classifier", data, *net, "-o", b, "--steps", "3", *common)
    r = unet("train-classifier", data, "--resume", os.path.join(b, "latest.h5"), "--steps", "6", *common)
    check(r.returncode == 0, "resume to step 6")
    ta, tb = tensors(os.path.join(a, "latest.h5")), tensors(os.path.join(b, "latest.h5"))
    diff = [k for k in ta if k != "@state" and (k not in tb or not np.array_equal(ta[k], tb[k]))]
    check(ta.keys() == tb.keys() and not diff, f"6 straight == 3 + resume to 6, bitwise ({len(ta)} tensors; "
          f"differing: {diff[:3]})")
    check(ta["@state"].get("noised") == 1 and ta["@state"].get("eval_every") == 2, "settings recorded in state/")
    ra, rb = metrics(a)[1], metrics(b)[1]
    keys = [k for k in want_columns(True) if k not in ("images_per_s", "ms_per_step")]
    check([[x[k] for k in keys] for x in ra] == [[x[k] for k in keys] for x in rb],
          "metrics identical (loss, accuracies, quartiles, validation)")
    r = unet("train-classifier", data, "--resume", os.path.join(b, "latest.h5"), "--steps", "7", "--noised=false",
             *common)
    check(r.returncode == 0 and "noised off (checkpoint: noised on)" in r.stderr and "not continue exactly" in r.stderr,
          f"overriding a recorded setting warns: {r.stderr.strip()}")

    # On the GPU without --grad-clip the optimizer updates each range of weights during the backward on its
    # own stream (UNET_LANES=0: one stream, updated at the end): bitwise the same weights, EMA and moments.
    if DEVICE == "cuda":
        e1, e2 = os.path.join(TMP, "e1"), os.path.join(TMP, "e2")
        ea = ["--batch-size", "4", "--steps", "4", "--log-every", "1", "--ema-rate", "0.99", "--seed", "5", *dev()]
        unet("train-classifier", data, *net, "-o", e1, *ea)
        os.environ["UNET_LANES"] = "0"
        try:
            unet("train-classifier", data, *net, "-o", e2, *ea)
        finally:
            del os.environ["UNET_LANES"]
        t1, t2 = tensors(os.path.join(e1, "latest.h5")), tensors(os.path.join(e2, "latest.h5"))
        diff = [k for k in t1 if k != "@state" and (k not in t2 or not np.array_equal(t1[k], t2[k]))]
        check(t1.keys() == t2.keys() and not diff and "ema" in str(list(t1)),
              f"updates during the backward == one stream, bitwise ({len(t1)} tensors; differing: {diff[:3]})")

    # Data-parallel (two CPU ranks, rank 0's TCP reduction): the run of one process, up to the order of
    # the gradient sum.
    if DEVICE == "cpu":
        one, two = os.path.join(TMP, "one"), os.path.join(TMP, "two")
        dp = ["--batch-size", "4", "--steps", "4", "--log-every", "1", "--val-data", data, "--eval-every", "2",
              "--seed", "3", "--device", "cpu"]
        unet("train-classifier", data, *net, "-o", one, *dp)
        r = unet("train-classifier", data, *net, "-o", two, "--gpus", "2", *dp)
        check(r.returncode == 0, f"train-classifier --gpus 2 --device cpu: {r.stderr.strip()[-200:]}")
        m1, m2 = metrics(one)[1], metrics(two)[1]
        close = len(m1) == len(m2) == 4 and all(
            abs(float(x[k]) - float(y[k])) <= 1e-4 * abs(float(x[k])) + 1e-6
            for x, y in zip(m1, m2) for k in ("loss", "acc1", "val_loss") if x[k] != "" or y[k] != "")
        check(close, "two ranks log the losses, accuracies and validation of one process")
        # (AdamW's normalised update turns the order of a near-zero gradient's sum into steps of up to lr:
        # compare the whole weights, relative L2.)
        w1, w2 = tensors(os.path.join(one, "latest.h5")), tensors(os.path.join(two, "latest.h5"))
        keys = [k for k in w1 if k.startswith("model/")]
        a1 = np.concatenate([w1[k].ravel() for k in keys]).astype(np.float64)
        a2 = np.concatenate([w2[k].ravel() for k in keys]).astype(np.float64)
        err = float(np.linalg.norm(a1 - a2) / np.linalg.norm(a1))
        check(err < 1e-4, f"and train the same weights (relative L2 {err:.1e})")

    # SIGINT saves.
    c = os.path.join(TMP, "c")
    p = subprocess.Popen([BINARY, "train-classifier", data, *net, "-o", c, "--steps", "100000", "--batch-size", "4",
                          "--log-every", "1", *dev()], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < 120:
        if p.stdout.readline().startswith("step 2 "):
            break
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    check(p.returncode == 0 and "interrupted" in out, f"SIGINT exits cleanly (rc {p.returncode})")
    st = tensors(os.path.join(c, "latest.h5"))["@state"] if os.path.exists(os.path.join(c, "latest.h5")) else {}
    check(st.get("step", 0) >= 2, f"SIGINT saved a checkpoint at step {st.get('step')}")

    # Bad inputs: one line naming the file, exit 1, nothing written.
    for args, needles, what in [
            ([unlabelled, *net], [unlabelled, "no labels"], "unlabelled dataset"),
            ([data, "--preset", "imagenet64"], [data, "32x32", "image size is 64"], "classifier image size mismatch"),
            ([data, *net, "--val-data", big], [big, "64x64"], "validation set of another image size"),
            ([data, "--init", m], [m, "not a classifier"], "a diffusion model as --init"),
            ([data, "--preset", "tiny32", "--num-classes", "2"], [data, "classes"], "labels beyond --num-classes"),
            ([data, *net, "--num-channels", "64"], ["--num-channels"], "a diffusion-model flag")]:
        out_dir = os.path.join(TMP, "x-" + what.replace(" ", "_"))
        r = unet("train-classifier", *args, "-o", out_dir, *dev(), ok=False)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        check(r.returncode == 1 and len(lines) == 1 and all(n in lines[0] for n in needles)
              and not os.path.exists(os.path.join(out_dir, "latest.h5")), f"{what}: {lines}")

    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
