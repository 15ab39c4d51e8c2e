"""End-to-end `unet` CLI: prepare -> init -> train -> sample on the bundled images, with
- the loss going down,
- exact resume: N steps, then --resume to 2N, equals 2N straight, bitwise (model, EMA, AdamW moments),
- SIGINT saving a checkpoint and exiting cleanly,
- a NaN loss stopping training with a message while keeping the last good checkpoint,
- bad input: one line naming the file, exit 1, nothing written.
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

from e2e_common import BINARY, check, failures, SRC, work_dir  # noqa: E402
DEVICE = os.environ.get("UNET_TEST_DEVICE", "cpu")
PREC = os.environ.get("UNET_TEST_PRECISION", "")
# Dropout > 0 exercises the dropout RNG; 0 lets the GPU trainer use CUDA graphs (both are run there).
DROPOUT = os.environ.get("UNET_TEST_DROPOUT", "0.1")
TMP = work_dir("unet-e2e-")  # removed at exit


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


def main():
    data = os.path.join(TMP, "d.h5")
    init = os.path.join(TMP, "init.h5")
    r = unet("prepare", os.path.join(SRC, "testdata", "images"), "-o", data, "--image-size", "32", "--labels", "subdirs")
    check(r.returncode == 0, "prepare the bundled images")
    # A small class-conditional model with dropout so that labels and dropout RNG are exercised.
    r = unet("init", "-o", init, "--preset", "tiny32", "--class-cond", "--num-classes", "3", "--dropout", DROPOUT,
             "--seed", "3")
    check(r.returncode == 0, "init tiny32 class-conditional")

    # Loss goes down.
    run = os.path.join(TMP, "run")
    r = unet("train", data, "--init", init, "-o", run, "--steps", "60", "--batch-size", "8", "--lr", "1e-3",
             "--log-every", "10", "--save-every", "30", *dev())
    check(r.returncode == 0, "train 60 steps")
    rows = [l.split(",") for l in open(os.path.join(run, "metrics.csv")).read().split("\n")[1:] if l]
    losses = [float(x[1]) for x in rows]
    check(len(rows) == 6 and all(np.isfinite(losses)), f"metrics.csv has 6 finite rows: {losses}")
    check(losses[-1] < 0.8 * losses[0], f"loss went down: {losses[0]:.4f} -> {losses[-1]:.4f}")
    for f in ("ckpt_0000030.h5", "ckpt_0000060.h5", "latest.h5"):
        check(os.path.exists(os.path.join(run, f)), f"wrote {f}")
    grid = os.path.join(TMP, "s.png")
    r = unet("sample", os.path.join(run, "latest.h5"), "-n", "4", "--sampler", "ddim", "--steps", "10", "-o", grid,
             "--class", "1", *dev())
    check(r.returncode == 0 and open(grid, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "sample a PNG grid")

    # Exact resume: 6 straight vs 3 + resume to 6.
    a, b = os.path.join(TMP, "a"), os.path.join(TMP, "b")
    common = ["--batch-size", "4", "--lr", "3e-4", "--log-every", "1", "--grad-clip", "1.0", "--lr-warmup", "4",
              "--seed", "11", *dev()]
    unet("train", data, "--init", init, "-o", a, "--steps", "6", *common)
    unet("train", data, "--init", init, "-o", b, "--steps", "3", *common)
    r = unet("train", data, "--resume", os.path.join(b, "latest.h5"), "--steps", "6", *common)
    check(r.returncode == 0, "resume to step 6")
    ta, tb = tensors(os.path.join(a, "latest.h5")), tensors(os.path.join(b, "latest.h5"))
    same = ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta if k != "@state")
    diff = [k for k in ta if k != "@state" and k in tb and not np.array_equal(ta[k], tb[k])]
    check(same, f"6 straight == 3 + resume to 6, bitwise ({len(ta)} tensors; differing: {diff[:3]})")
    check(ta["@state"].get("step") == 6 and tb["@state"].get("step") == 6, "state/step is 6 in both")
    ra = open(os.path.join(a, "metrics.csv")).read().splitlines()
    rb = open(os.path.join(b, "metrics.csv")).read().splitlines()
    check([l.split(",")[:3] for l in ra] == [l.split(",")[:3] for l in rb], "metrics (loss, grad norm) identical")

    # --lr-anneal-steps (guided-diffusion's lr_anneal_steps): update s (0-based) at lr (1 - s / N), the
    # run ends at N without --steps; 3 + resume without flags (the checkpoint's N) == 6 straight.
    c, e = os.path.join(TMP, "anneal"), os.path.join(TMP, "anneal3")
    an = ["--batch-size", "4", "--lr", "3e-4", "--log-every", "1", "--seed", "5", *dev()]
    r = unet("train", data, "--init", init, "-o", c, "--lr-anneal-steps", "6", *an)
    check(r.returncode == 0, "train with --lr-anneal-steps 6, no --steps")
    rows = [l.split(",") for l in open(os.path.join(c, "metrics.csv")).read().splitlines()[1:] if l]
    lrs = [float(x[3]) for x in rows]
    want = [3e-4 * (1 - s / 6) for s in range(6)]
    check([int(x[0]) for x in rows] == [1, 2, 3, 4, 5, 6] and np.allclose(lrs, want, rtol=1e-5, atol=0),
          f"ends at step 6, lr (1 - s/6): {lrs}")
    unet("train", data, "--init", init, "-o", e, "--lr-anneal-steps", "6", "--steps", "3", *an)
    r = unet("train", data, "--resume", os.path.join(e, "latest.h5"), *dev())
    check(r.returncode == 0, "resume an annealed run without flags")
    tc, te = tensors(os.path.join(c, "latest.h5")), tensors(os.path.join(e, "latest.h5"))
    diff = [k for k in tc if k != "@state" and (k not in te or not np.array_equal(tc[k], te[k]))]
    check(tc.keys() == te.keys() and not diff and te["@state"].get("step") == 6,
          f"annealed: 6 straight == 3 + resume to the anneal's end, bitwise (differing: {diff[:3]})")
    for args, what, words in [
            (["--init", init, "-o", os.path.join(TMP, "anneal8"), "--lr-anneal-steps", "6", "--steps", "8", *an],
             "--steps past --lr-anneal-steps", ["--steps 8", "--lr-anneal-steps 6"]),
            (["--resume", os.path.join(c, "latest.h5"), *dev()], "resuming a run its anneal has ended",
             ["step 6", "--lr-anneal-steps 6"])]:
        r = unet("train", data, *args, ok=False)
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and all(w in lines[0] for w in words), f"{what}: refused, {lines}")

    # Previews in between (--sample-every: the EMA's weights swapped in and back for a DDIM grid) leave
    # the training as it was: the same 6 steps as run `a`, bitwise (in bf16 the optimizer keeps the
    # weights' bf16 copy, which the preview's sampler overwrites and the trainer remakes).
    pv = os.path.join(TMP, "preview")
    r = unet("train", data, "--init", init, "-o", pv, "--steps", "6", "--sample-every", "4", *common)
    check(r.returncode == 0 and os.path.exists(os.path.join(pv, "samples_0000004.png")), "train with previews")
    tp = tensors(os.path.join(pv, "latest.h5")) if r.returncode == 0 else {}
    diff = [k for k in ta if k != "@state" and not (k in tp and np.array_equal(ta[k], tp[k]))]
    check(tp.keys() == ta.keys() and not diff, f"previews leave the training bitwise unchanged (differing: {diff[:3]})")

    # Without --grad-clip the GPU updates each range of weights during the backward on the optimizer's own
    # stream: 4 straight == 2 + resume to 4 == 4 on one stream (UNET_LANES=0, updated at the end), bitwise.
    if DEVICE == "cuda":
        nc = [x for x in common if x not in ("--grad-clip", "1.0")]
        e1, e2, e3 = (os.path.join(TMP, n) for n in ("early1", "early2", "early3"))
        unet("train", data, "--init", init, "-o", e1, "--steps", "4", *nc)
        unet("train", data, "--init", init, "-o", e2, "--steps", "2", *nc)
        r = unet("train", data, "--resume", os.path.join(e2, "latest.h5"), "--steps", "4", *nc)
        r3 = subprocess.run([BINARY, "train", data, "--init", init, "-o", e3, "--steps", "4", *nc],
                            capture_output=True, text=True, env=dict(os.environ, UNET_LANES="0"))
        check(r.returncode == 0 and r3.returncode == 0, "no clipping: runs, resume, one stream")
        t1, t2, t3 = (tensors(os.path.join(e, "latest.h5")) for e in (e1, e2, e3))
        diff = [k for k in t1 if k != "@state" and not (k in t2 and k in t3 and np.array_equal(t1[k], t2[k])
                                                        and np.array_equal(t1[k], t3[k]))]
        check(t1.keys() == t2.keys() == t3.keys() and not diff,
              f"updates during the backward: resume and one stream bitwise ({len(t1)} tensors; differing: {diff[:3]})")

    # UNET_RECOMPUTE=1 (what the plan falls back to when the kept activations do not fit): the memory
    # line says so and the 6 steps give the same weights as run `a`, which kept them (bitwise here:
    # the same kernels over the same saved statistics).
    rc_dir = os.path.join(TMP, "recompute")
    r = subprocess.run([BINARY, "train", data, "--init", init, "-o", rc_dir, "--steps", "6", *common],
                       capture_output=True, text=True, env=dict(os.environ, UNET_RECOMPUTE="1"))
    check(r.returncode == 0 and "recomputes the normalized activations" in r.stdout,
          "UNET_RECOMPUTE=1: the memory line says backward recomputes")
    check("recomputes" not in unet("train", data, "--init", init, "-o", os.path.join(TMP, "keep1"), "--steps",
                                   "1", *common).stdout, "by default the normalized activations are kept")
    tc = tensors(os.path.join(rc_dir, "latest.h5")) if r.returncode == 0 else {}
    check(tc.keys() == ta.keys() and all(np.array_equal(ta[k], tc[k]) for k in ta if k != "@state"),
          "recomputed and kept activations train to the same weights, bitwise")
    r = unet("train", data, "--resume", os.path.join(b, "latest.h5"), "--steps", "5", *common, ok=False)
    check(r.returncode == 1 and "--steps" in r.stderr, "resume with --steps not past the checkpoint is refused")

    # SIGINT: saves and exits cleanly.
    c = os.path.join(TMP, "c")
    p = subprocess.Popen([BINARY, "train", data, "--init", init, "-o", c, "--steps", "100000", "--batch-size", "4",
                          "--log-every", "1", *dev()], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    line = ""
    while time.time() - t0 < 120:
        line = p.stdout.readline()
        if line.startswith("step 2 "):
            break
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    check(p.returncode == 0 and "interrupted" in out, f"SIGINT exits cleanly (rc {p.returncode})")
    st = tensors(os.path.join(c, "latest.h5"))["@state"] if os.path.exists(os.path.join(c, "latest.h5")) else {}
    check(st.get("step", 0) >= 2, f"SIGINT saved a checkpoint at step {st.get('step')}")

    # NaN: two good steps, then resume with an absurd learning rate that blows the weights up;
    # training stops with a message and latest.h5 stays the good step-2 checkpoint.
    d = os.path.join(TMP, "nan")
    unet("train", data, "--init", init, "-o", d, "--steps", "2", "--batch-size", "4", *dev())
    r = unet("train", data, "--resume", os.path.join(d, "latest.h5"), "--steps", "20", "--batch-size", "4",
             "--lr", "1e38", "--log-every", "1", "--save-every", "1", *dev(), ok=False)
    check(r.returncode == 1 and ("NaN" in r.stderr or "Inf" in r.stderr), f"NaN stops training (rc {r.returncode})")
    t = tensors(os.path.join(d, "latest.h5"))
    check(t["@state"].get("step") == 2 and all(np.isfinite(v).all() for k, v in t.items() if k.startswith("model/")),
          f"latest.h5 is still the good step-2 checkpoint (step {t['@state'].get('step')})")

    # Bad input: one line, exit 1, nothing written.
    bad = os.path.join(TMP, "bad.h5")
    open(bad, "wb").write(b"not hdf5 at all")
    for args, what in [(["train", bad, "-o", os.path.join(TMP, "x1"), *dev()], "train on a non-HDF5 file"),
                       (["train", data, "--init", bad, "-o", os.path.join(TMP, "x2")], "train --init corrupt"),
                       (["sample", bad, "-o", os.path.join(TMP, "x.png")], "sample a corrupt checkpoint"),
                       (["sample", init, "--noise", bad, "-o", os.path.join(TMP, "y.png")], "sample --noise corrupt"),
                       (["train", data, "--preset", "seed64", "-o", os.path.join(TMP, "x3")], "image size mismatch")]:
        r = unet(*args, ok=False)
        lines = [l for l in r.stderr.splitlines() if l.startswith("unet:") and "device" not in l and "GPU" not in l]
        check(r.returncode == 1 and len(lines) == 1 and "HDF5-DIAG" not in r.stderr, f"{what}: {lines}")
    check(not os.path.exists(os.path.join(TMP, "x.png")) and not os.path.exists(os.path.join(TMP, "y.png")),
          "no output written for failed runs")

    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
