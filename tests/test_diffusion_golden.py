"""`unet sample` against guided-diffusion's sampling math in PyTorch (scripts/diffusion_torch.py)
driving the PyTorch UNet (scripts/unet_torch.py) in float64, on the same random weights:
- DDIM eta=0 from a --noise file (the deterministic parity path of SPEC §1 sample);
- DDIM eta>0 and DDPM (fixed-large and learned-range variance, respaced and all steps, class
  labels), where the Python side draws the very step noise `unet` draws, through its transcription
  of lib/rng.h — so these runs are deterministic too and must agree;
- x_T drawn by `unet` itself when no --noise is given.
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
import diffusion_torch as dt  # noqa: E402
from unet_ckpt import save_checkpoint  # noqa: E402
from unet_torch import create_model  # noqa: E402

require_binary()
TMP = work_dir("unet-diffusion-")  # removed at exit
SEED = int(os.environ.get("UNET_TEST_SEED", np.random.SeedSequence().entropy % (1 << 31)))
print(f"UNET_TEST_SEED={SEED}")

# CI runs the CPU engine; on the GPU machine run with UNET_TEST_DEVICE=cuda and
# UNET_TEST_PRECISION=fp32 (same 1e-4 limit) or tf32 (UNET_PARITY_TOL=3e-3: DDIM's first step from
# t = 39 multiplies the network's tf32 error by ~487; scripts/gpu_check.sh says more).
DEVICE = os.environ.get("UNET_TEST_DEVICE", "cpu")
PRECISION = os.environ.get("UNET_TEST_PRECISION", "")
TOL = float(os.environ.get("UNET_PARITY_TOL", "1e-4"))
print(f"device={DEVICE} precision={PRECISION or 'default'} tol={TOL}")


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def make_checkpoint(name, flags, seed):
    """A small UNet with random weights everywhere (the zero-initialised output layers would make
    eps == 0 and the test blind to the model)."""
    torch.manual_seed(seed)
    model = create_model(flags)
    with torch.no_grad():
        for k, p in model.state_dict().items():
            if "norm" in k and k.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    path = os.path.join(TMP, name + ".h5")
    save_checkpoint(model, flags, path)
    return model.double().eval(), path


def run_sample(ckpt, args, out):
    cmd = [BINARY, "sample", ckpt, "--device", DEVICE, "--h5", out, "-o", os.path.join(TMP, "grid.png")] + args
    if PRECISION:
        cmd += ["--precision", PRECISION]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(" ".join(cmd), "\n", r.stdout, r.stderr)
        return None
    with h5py.File(out, "r") as f:
        return f["samples"][()]


def write_noise(x):
    path = os.path.join(TMP, "noise.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("noise", data=x.astype(np.float32))
    return path


def main():
    rng = np.random.default_rng(SEED)
    base = dict(image_size=8, num_channels=32, channel_mult="1,2", num_res_blocks=1, attention_resolutions="4",
                num_head_channels=16, diffusion_steps=40)
    plain, plain_ck = make_checkpoint("plain", dict(base, noise_schedule="linear"), SEED)
    learned, learned_ck = make_checkpoint(
        "learned", dict(base, noise_schedule="cosine", learn_sigma=True, class_cond=True, num_classes=4,
                        use_scale_shift_norm=True, resblock_updown=True), SEED + 1)
    n, C, R = 3, 3, 8
    x_T = rng.standard_normal((n, C, R, R)).astype(np.float32)
    noise_file = write_noise(x_T)
    xt = torch.from_numpy(x_T).double()
    s = int(rng.integers(1 << 30))
    lab = torch.full((n,), 2, dtype=torch.long)

    # (name, model, ckpt, cli args, python reference)
    cases = [
        ("ddim eta=0, 10 steps, linear", plain_ck, ["--sampler", "ddim", "--steps", "10", "--noise", noise_file],
         lambda: dt.ddim_sample(plain, xt, 10, T=40, schedule="linear")),
        ("ddim eta=0, all steps, unclipped", plain_ck,
         ["--sampler", "ddim", "--noise", noise_file, "--no-clip"],
         lambda: dt.ddim_sample(plain, xt, 0, clip=False, T=40, schedule="linear")),
        ("ddim eta=0.6, 20 steps, learned sigma ignored, class 2", learned_ck,
         ["--sampler", "ddim", "--steps", "20", "--eta", "0.6", "--noise", noise_file, "--seed", str(s), "--class", "2"],
         lambda: dt.ddim_sample(learned, xt, 20, eta=0.6, labels=lab, T=40, schedule="cosine", learn_sigma=True,
                                step_noise=dt.unet_step_noise(s))),
        ("ddpm fixed-large, all 40 steps", plain_ck, ["--sampler", "ddpm", "--noise", noise_file, "--seed", str(s)],
         lambda: dt.ddpm_sample(plain, xt, 0, T=40, schedule="linear", step_noise=dt.unet_step_noise(s))),
        ("ddpm learned-range, 13 steps respaced, class 2", learned_ck,
         ["--sampler", "ddpm", "--steps", "13", "--noise", noise_file, "--seed", str(s), "--class", "2"],
         lambda: dt.ddpm_sample(learned, xt, 13, labels=lab, T=40, schedule="cosine", learn_sigma=True,
                                step_noise=dt.unet_step_noise(s))),
        # guided-diffusion's timestep_respacing strings: sections, and a DDIM loop over them
        ("ddpm learned-range, --timestep-respacing 3,5,2, class 2", learned_ck,
         ["--sampler", "ddpm", "--timestep-respacing", "3,5,2", "--noise", noise_file, "--seed", str(s), "--class", "2"],
         lambda: dt.Diffusion(40, "cosine", True, dt.space_timesteps(40, "3,5,2")).p_sample_loop(
             learned, xt, True, lab, dt.unet_step_noise(s))),
        ("ddim eta=0 over sections 7,3", plain_ck,
         ["--sampler", "ddim", "--timestep-respacing", "7,3", "--noise", noise_file],
         lambda: dt.Diffusion(40, "linear", False, dt.space_timesteps(40, "7,3")).ddim_loop(
             plain, xt, 0.0, True, None, None)),
        ("ddpm, x_T drawn by unet, batches of 2", plain_ck,
         ["--sampler", "ddpm", "--steps", "25", "-n", "3", "--seed", str(s + 1), "--batch-size", "2"],
         lambda: dt.ddpm_sample(plain, dt.unet_initial_noise(s + 1, 3, C, R, R).double(), 25, T=40,
                                schedule="linear", step_noise=dt.unet_step_noise(s + 1))),
    ]
    for i, (name, ck, args, ref) in enumerate(cases):
        got = run_sample(ck, args, os.path.join(TMP, f"out{i}.h5"))
        if got is None:
            check(False, f"{name}: unet sample failed")
            continue
        with torch.no_grad():
            want = ref().numpy()
        err = rel_l2(got, want)
        check(got.shape == want.shape and err < TOL, f"{name}: rel L2 {err:.2e} (shape {got.shape})")
        if "unclipped" not in name:
            check(np.abs(got).max() <= 1.0 + 1e-6, f"{name}: clipped samples stay in [-1, 1]")

    # The same DDIM run twice is bitwise identical; a zero-eps model gives a different answer, so
    # the parity above really depends on the network.
    a = run_sample(plain_ck, ["--sampler", "ddim", "--steps", "10", "--noise", noise_file], os.path.join(TMP, "a.h5"))
    b = run_sample(plain_ck, ["--sampler", "ddim", "--steps", "10", "--noise", noise_file], os.path.join(TMP, "b.h5"))
    check(a is not None and b is not None and np.array_equal(a, b), "ddim eta=0 is deterministic")
    zero = dt.ddim_sample(lambda x, t, **kw: torch.zeros_like(x), xt, 10, T=40, schedule="linear").numpy()
    check(a is not None and rel_l2(a, zero) > 1e-2, "the samples depend on the model")

    # --timestep-respacing ddimN is --steps N of ddim, bitwise; the file says what ran.
    r = run_sample(plain_ck, ["--sampler", "ddim", "--timestep-respacing", "ddim10", "--noise", noise_file],
                   os.path.join(TMP, "r.h5"))
    check(r is not None and a is not None and np.array_equal(r, a), "--timestep-respacing ddim10 = --steps 10")
    if r is not None:
        with h5py.File(os.path.join(TMP, "r.h5"), "r") as f:
            check(f.attrs.get("timestep_respacing") == "ddim10" and int(f.attrs.get("steps")) == 10,
                  f"--h5 attributes: {dict(f.attrs)}")

    # Python-side checks of the transcription itself.
    check(sorted(dt.space_timesteps(1000, "ddim50")) == list(range(0, 1000, 20)), "ddim50 stride 20")
    check(sorted(dt.space_timesteps(1000, [21]))[10] == 499, "float64 accumulation in space_timesteps")
    check(sorted(dt.space_timesteps(10, [5])) == [0, 2, 4, 7, 9], "round half to even")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # a crash is a failure, not a skip
        import traceback
        traceback.print_exc()
        failures.append("exception")
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
