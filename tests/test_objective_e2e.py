"""guided-diffusion's training objective end to end (issue 12), through the CLI on the CPU:
- `unet eval` against calc_bpd_loop of scripts/diffusion_torch.py driving scripts/unet_torch.py in
  float64 on the same weights and the same noise (unet's EvalNoise stream, transcribed): the vb term
  per timestep (t = 0: decoder NLL; t > 0: KL), x0 MSE and eps MSE per timestep, prior and total
  bits/dim -- for a learned-sigma class-conditional model, a fixed-variance model, and an x0-predicting
  model with rescaled timesteps; rel 1e-4 (float32 engine vs float64 PyTorch);
- `unet sample` honours predict_xstart and rescale_timesteps (DDPM vs the transcription, rel 1e-4);
- training with --learn-sigma on the bundled images: the variance channels of out.2 move from their
  zero init, metrics.csv has mse, vb and loss_q0..3, the log line shows mse and vb;
- exact resume, bitwise, with --schedule-sampler loss-second-moment (its history warm and saved in
  state/loss_history) and with --microbatch;
- the objective flags are root attributes; bad values are one line and exit 1.
Run by ctest with env UNET_BINARY, UNET_SOURCE_DIR, PYTHONPATH=scripts. Exit 77 = skipped.
On the GPU machine: UNET_TEST_DEVICE=cuda (UNET_TEST_PRECISION=fp32 keeps the 1e-4 limit).
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
import diffusion_torch as dt  # noqa: E402
from unet_ckpt import save_checkpoint  # noqa: E402
from unet_torch import create_model  # noqa: E402

require_binary()
DEVICE = os.environ.get("UNET_TEST_DEVICE", "cpu")
PREC = os.environ.get("UNET_TEST_PRECISION", "")
TOL = float(os.environ.get("UNET_PARITY_TOL", "1e-4"))
TMP = work_dir("unet-objective-")  # removed at exit


# Tiny models: one thread is faster than a team (and far faster on a loaded machine); results do
# not depend on the thread count.
ENV = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
torch.set_num_threads(1)


def unet(*args, ok=True):
    cmd = [BINARY, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if ok and r.returncode != 0:
        print("command failed:", " ".join(cmd), "\n", r.stdout, r.stderr)
    return r


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
    return out


def random_checkpoint(name, flags, seed):
    """Random weights everywhere (the zero-initialised output layers would make the test blind)."""
    torch.manual_seed(seed)
    model = create_model(flags)
    with torch.no_grad():
        for k, p in model.state_dict().items():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in k and k.endswith("weight") else 0.08 * torch.randn_like(p))
    path = os.path.join(TMP, name + ".h5")
    save_checkpoint(model, flags, path)
    return model.double().eval(), path


def read_csv(path):
    lines = open(path).read().splitlines()
    head = lines[0].split(",")
    return head, [dict(zip(head, l.split(","))) for l in lines[1:] if l]


def check_eval(data, x0, labels):
    base = dict(image_size=8, num_channels=32, channel_mult="1,2", num_res_blocks=1, attention_resolutions="4",
                num_head_channels=16)
    cases = [
        ("learned sigma, class-conditional, cosine",
         dict(base, learn_sigma=True, class_cond=True, num_classes=3, use_scale_shift_norm=True,
              diffusion_steps=12, noise_schedule="cosine"), ["--seed", "5"]),
        ("fixed variance, linear", dict(base, diffusion_steps=25, noise_schedule="linear"), ["--batch-size", "2"]),
        ("x0 prediction, rescaled timesteps, learned sigma, unclipped",
         dict(base, learn_sigma=True, predict_xstart=True, rescale_timesteps=True, diffusion_steps=10,
              noise_schedule="cosine"), ["--no-clip", "--seed", "9"]),
    ]
    n = x0.shape[0]
    for i, (name, flags, args) in enumerate(cases):
        model, ck = random_checkpoint(f"eval{i}", flags, 100 + i)
        csv = os.path.join(TMP, f"terms{i}.csv")
        r = unet("eval", ck, data, "-n", str(n), "--csv", csv, *args, *dev())
        check(r.returncode == 0 and "bits/dim" in r.stdout, f"{name}: unet eval runs ({r.stderr.strip()})")
        if r.returncode:
            continue
        _, rows = read_csv(csv)
        got = {k: np.array([float(x[k]) for x in rows if x["t"].isdigit()]) for k in ("vb", "x0_mse", "mse")}
        prior = float(next(x["vb"] for x in rows if x["t"] == "prior"))
        total = float(next(x["vb"] for x in rows if x["t"] == "total"))
        seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 0
        d = dt.Diffusion(flags["diffusion_steps"], flags["noise_schedule"], flags.get("learn_sigma", False),
                         predict_xstart=flags.get("predict_xstart", False),
                         rescale_timesteps=flags.get("rescale_timesteps", False))
        with torch.no_grad():
            ref = d.calc_bpd_loop(model, torch.from_numpy(x0).double(), clip="--no-clip" not in args,
                                  labels=torch.from_numpy(labels) if flags.get("class_cond") else None,
                                  noise_fn=dt.unet_eval_noise(seed))
        want = {"vb": ref["vb"].mean(0).numpy(), "x0_mse": ref["xstart_mse"].mean(0).numpy(),
                "mse": ref["mse"].mean(0).numpy()}
        # Random weights that predict x0 put the decoder's mean far from x0 in units of its tiny
        # t = 0 scale: its discretized CDF differences then cancel to nothing in float32 (and not in
        # the float64 reference), so that case compares t >= 1 only; the eps cases check t = 0.
        t0 = 1 if flags.get("predict_xstart") else 0
        for k in ("vb", "x0_mse", "mse"):
            e = rel_l2(got[k][t0:], want[k][t0:]) if got[k].shape == want[k].shape else np.inf
            check(e < TOL, f"{name}: {k} per timestep{' t >= 1' if t0 else ''}, rel L2 {e:.2e}")
        if t0:
            continue
        e0 = abs(got["vb"][0] - want["vb"][0]) / abs(want["vb"][0])
        check(e0 < TOL, f"{name}: t = 0 decoder NLL {got['vb'][0]:.5f} vs {want['vb'][0]:.5f}")
        for k, g, w in (("prior", prior, ref["prior_bpd"].mean().item()), ("total", total, ref["total_bpd"].mean().item())):
            check(abs(g - w) <= TOL * abs(w), f"{name}: {k} bits/dim {g:.6f} vs {w:.6f}")


def check_sample_flags():
    """DDPM with predict_xstart + rescale_timesteps vs the transcription (the same step noise)."""
    flags = dict(image_size=8, num_channels=32, channel_mult="1,2", num_res_blocks=1, attention_resolutions="4",
                 num_head_channels=16, learn_sigma=True, predict_xstart=True, rescale_timesteps=True,
                 diffusion_steps=20, noise_schedule="cosine")
    model, ck = random_checkpoint("xs", flags, 7)
    x_T = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    noise = os.path.join(TMP, "noise.h5")
    with h5py.File(noise, "w") as f:
        f["noise"] = x_T
    out = os.path.join(TMP, "xs_samples.h5")
    for sampler in ("ddpm", "ddim"):
        r = unet("sample", ck, "--noise", noise, "--sampler", sampler, "--steps", "7", "--seed", "3", "--h5", out,
                 "-o", "", *dev())
        if r.returncode:
            check(False, f"sample {sampler} with predict_xstart: {r.stderr.strip()}")
            continue
        got = h5py.File(out, "r")["samples"][()]
        d = dt.Diffusion(20, "cosine", True, dt.sampler_timesteps(sampler, 20, 7), predict_xstart=True,
                         rescale_timesteps=True)
        xt = torch.from_numpy(x_T).double()
        with torch.no_grad():
            want = (d.p_sample_loop(model, xt, step_noise=dt.unet_step_noise(3)) if sampler == "ddpm"
                    else d.ddim_loop(model, xt)).numpy()
        e = rel_l2(got, want)
        check(e < TOL, f"sample {sampler}: predict_xstart + rescale_timesteps vs the transcription, rel L2 {e:.2e}")


def main():
    data8 = os.path.join(TMP, "d8.h5")
    r = unet("prepare", os.path.join(SRC, "testdata", "images"), "-o", data8, "--image-size", "8",
             "--labels", "subdirs")
    check(r.returncode == 0, "prepare the bundled images at 8x8")
    with h5py.File(data8, "r") as f:
        imgs, labels = f["images"][:4], f["labels"][:4]
    x0 = (imgs.astype(np.float32) / np.float32(127.5) - np.float32(1)).transpose(0, 3, 1, 2).copy()
    check_eval(data8, x0, labels)
    check_sample_flags()

    # Training the hybrid loss moves the variance channels (zero-initialised out.2 rows 3..5).
    init = os.path.join(TMP, "ls.h5")
    model_flags = ["--image-size", "8", "--num-channels", "32", "--channel-mult", "1,2", "--num-res-blocks", "1",
                   "--attention-resolutions", "4", "--num-head-channels", "16", "--learn-sigma",
                   "--diffusion-steps", "50", "--noise-schedule", "cosine"]
    r = unet("init", "-o", init, *model_flags, "--rescale-learned-sigmas", "--seed", "1")
    check(r.returncode == 0, "init a learned-sigma model")
    with h5py.File(init, "r") as f:
        check(int(f.attrs["rescale_learned_sigmas"]) == 1 and int(f.attrs["use_kl"]) == 0
              and int(f.attrs["predict_xstart"]) == 0 and int(f.attrs["rescale_timesteps"]) == 0,
              "objective flags are root attributes")
        w0 = f["model/out.2.weight"][()]
    check(np.all(w0[3:] == 0), "out.2's variance rows start at zero")
    run = os.path.join(TMP, "hybrid")
    r = unet("train", data8, "--init", init, "-o", run, "--steps", "120", "--batch-size", "8", "--lr", "1e-3",
             "--log-every", "40", *dev())
    check(r.returncode == 0, "train the hybrid loss for 120 steps")
    check("(mse " in r.stdout and ", vb " in r.stdout and " q3 " in r.stdout,
          f"the log line shows mse, vb and the quartiles: {r.stdout.splitlines()[-3:]}")
    head, rows = read_csv(os.path.join(run, "metrics.csv"))
    check(all(c in head for c in ("mse", "vb", "loss_q0", "loss_q1", "loss_q2", "loss_q3")), f"metrics.csv columns {head}")
    if rows and "vb" in head:
        vb = [float(x["vb"]) for x in rows]
        loss, mse = float(rows[-1]["loss"]), float(rows[-1]["mse"])
        check(all(np.isfinite(vb)) and abs(loss - mse - vb[-1]) < 1e-4 * max(1, loss), f"loss = mse + vb: {rows[-1]}")
        check(vb[-1] < vb[0], f"vb fell: {vb}")
    with h5py.File(os.path.join(run, "latest.h5"), "r") as f:
        w, b = f["model/out.2.weight"][()], f["model/out.2.bias"][()]
    moved = float(np.abs(w[3:]).max())
    check(moved > 1e-3 and float(np.abs(b[3:]).max()) > 1e-4, f"the variance channels moved from zero (max |w| {moved:.2e})")
    # The learned variance is worth its bits: the bound with it beats the same weights with the
    # variance output zeroed (v = 0, the middle of the learned range).
    zeroed = os.path.join(TMP, "zeroed.h5")
    with h5py.File(os.path.join(run, "latest.h5"), "r") as src, h5py.File(zeroed, "w") as dst:
        for k, v in src.attrs.items():
            dst.attrs[k] = v
        src.copy("model", dst)
        dst["model/out.2.weight"][3:] = 0
        dst["model/out.2.bias"][3:] = 0
    bpd = {}
    for tag, path in (("trained", os.path.join(run, "latest.h5")), ("zeroed", zeroed)):
        r = unet("eval", path, data8, "-n", "8", "--no-ema", *dev())
        bpd[tag] = float(r.stdout.split(" bits/dim")[0].split()[-1]) if r.returncode == 0 else np.nan
    check(bpd["trained"] < bpd["zeroed"], f"bits/dim with the trained variance {bpd['trained']:.4f} < "
                                          f"with it zeroed {bpd['zeroed']:.4f}")

    # Exact resume with loss-second-moment (T = 8: warm within the run, ~10 steps) and with micro-batches.
    small = os.path.join(TMP, "small.h5")
    unet("init", "-o", small, "--image-size", "8", "--num-channels", "32", "--channel-mult", "1,2",
         "--num-res-blocks", "1", "--attention-resolutions", "4", "--num-head-channels", "16", "--learn-sigma",
         "--diffusion-steps", "8", "--noise-schedule", "cosine", "--seed", "2")
    for tag, extra, n1, n2 in (("lsm", ["--schedule-sampler", "loss-second-moment", "--batch-size", "8"], 15, 30),
                               ("micro", ["--microbatch", "2", "--batch-size", "4"], 3, 6)):
        a, b = os.path.join(TMP, tag + "a"), os.path.join(TMP, tag + "b")
        common = ["--lr", "3e-4", "--log-every", "1", "--seed", "4", *dev()]
        ra = unet("train", data8, "--init", small, "-o", a, "--steps", str(n2), *extra, *common)
        rb = unet("train", data8, "--init", small, "-o", b, "--steps", str(n1), *extra, *common)
        rc = unet("train", data8, "--resume", os.path.join(b, "latest.h5"), "--steps", str(n2), *common)
        check(ra.returncode == 0 and rb.returncode == 0 and rc.returncode == 0, f"{tag}: runs")
        if ra.returncode or rb.returncode or rc.returncode:
            continue
        check(not rc.stderr.strip(), f"{tag}: resume takes the sampler/microbatch from the checkpoint quietly "
                                     f"({rc.stderr.strip()})")
        ta, tb = tensors(os.path.join(a, "latest.h5")), tensors(os.path.join(b, "latest.h5"))
        diff = [k for k in ta if k not in tb or not np.array_equal(ta[k], tb[k])]
        check(ta.keys() == tb.keys() and not diff, f"{tag}: {n2} straight == {n1} + resume to {n2}, bitwise "
                                                   f"({len(ta)} datasets; differing: {diff[:3]})")
        if tag == "lsm":
            counts = ta.get("state/loss_counts")
            check(counts is not None and (counts == 10).all(), f"lsm: the history is warm and saved ({counts})")
            la = open(os.path.join(a, "metrics.csv")).read().splitlines()
            lb = open(os.path.join(b, "metrics.csv")).read().splitlines()
            check([l.split(",")[:3] for l in la] == [l.split(",")[:3] for l in lb], "lsm: metrics identical")
        with h5py.File(os.path.join(a, "latest.h5"), "r") as f:
            st = dict(f["state"].attrs)
        check((tag != "micro" or st.get("microbatch") == 2) and
              (tag != "lsm" or st.get("schedule_sampler") in ("loss-second-moment", b"loss-second-moment")),
              f"{tag}: recorded in state ({st.get('microbatch')}, {st.get('schedule_sampler')})")

    # Bad values: one line naming the flag, exit 1.
    for args, what in [(["--microbatch", "3", "--batch-size", "8"], "--microbatch"),
                       (["--schedule-sampler", "beta"], "--schedule-sampler")]:
        r = unet("train", data8, "--init", small, "-o", os.path.join(TMP, "bad"), "--steps", "1", *args, ok=False)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        check(r.returncode == 1 and len(lines) == 1 and what in lines[0], f"{what}: {lines}")
    r = unet("eval", small, data8, "-n", "1000", ok=False)
    check(r.returncode == 1 and "-n" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
          f"eval -n past the dataset: {r.stderr.strip()}")

    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is a failure, not a skip
        import traceback
        traceback.print_exc()
        sys.exit(1)
