"""Data-parallel training end to end, on the CPU (what CI can run):
- `unet train --gpus 2 --device cpu` and `mpirun -np 2 unet train --device cpu` compute the steps
  of one process (global batch): weights within fp32 reduction-order tolerance, same losses;
- a checkpoint saved by 2 ranks resumes on 1 and on 2 ranks to the same weights;
- a killed rank stops the other within seconds, with one line naming it; a frozen one too
  (--dist-timeout); Ctrl-C on the launcher stops every rank at one step and saves;
- inconsistent launcher environments and batch sizes: one line naming the variable or flag;
- streaming: training on a dataset of more than 2 GB of images keeps the peak RSS well under 1 GB.
Runs in about a minute on 2 cores."""

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(77)

from e2e_common import BINARY, check, failures, SRC  # noqa: E402
TMP = tempfile.mkdtemp(prefix="unet-dist-")
# Launcher variables of an enclosing job must not leak into the runs below.
ENV = {k: v for k, v in os.environ.items()
       if not k.startswith(("OMPI_", "PMIX_", "SLURM_")) and k not in
       ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
ENV["OMP_NUM_THREADS"] = "1"


def P(*a):
    return os.path.join(TMP, *a)


def run(args, env=None, timeout=300, prefix=(), fails=False):
    cmd = [*prefix, BINARY, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env or ENV, timeout=timeout)
    if r.returncode != 0 and not fails:
        print("exit", r.returncode, ":", " ".join(cmd), "\n", r.stdout[-2000:], r.stderr[-2000:], flush=True)
    return r


def arenas(path):
    """The model, EMA and AdamW arenas of a checkpoint, each flattened (sorted by tensor name)."""
    out = {}
    with h5py.File(path, "r") as f:
        for g in ("model", "ema", "optimizer/m", "optimizer/v"):
            out[g] = np.concatenate([f[g][k][()].ravel() for k in sorted(f[g].keys())])
        out["step"] = int(f["state"].attrs["step"])
    return out


def close(a, b, what, tol=1e-5):
    A, B = arenas(a), arenas(b)
    check(A["step"] == B["step"], f"{what}: same step ({A['step']}, {B['step']})")
    for g in ("model", "ema", "optimizer/m"):
        rel = float(np.linalg.norm(A[g] - B[g]) / max(np.linalg.norm(A[g]), 1e-30))
        check(rel < tol, f"{what}: {g} relative L2 difference {rel:.2e} < {tol:g}")


def losses(rundir):
    with open(os.path.join(rundir, "metrics.csv")) as f:
        rows = [l.split(",") for l in f.read().splitlines()[1:]]
    return [float(r[1]) for r in rows]


def children(pid):
    """{rank: pid} of the ranks a `--gpus` launcher started."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != pid:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            out[int(env[b"RANK"])] = int(d)
        except (OSError, ValueError, KeyError, IndexError):
            pass
    return out


def wait_for(cond, timeout, proc):
    t0 = time.time()
    while time.time() - t0 < timeout and proc.poll() is None:
        if cond():
            return True
        time.sleep(0.1)
    return False


def start(args):
    return subprocess.Popen([BINARY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def unet_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("unet:")]


def main():
    data = P("d.h5")
    r = run(["prepare", os.path.join(SRC, "testdata", "images"), "-o", data, "--image-size", "32", "--labels", "subdirs"])
    check(r.returncode == 0, "prepare the bundled images")
    base = ["--preset", "tiny32", "--class-cond", "--num-classes", "3", "--device", "cpu", "--batch-size", "4",
            "--seed", "3", "--log-every", "1"]
    common = base + ["--save-every", "2", "--steps", "4"]

    # ---- N ranks compute the steps of one process ----
    r1 = run(["train", data, *common, "-o", P("one")])
    check(r1.returncode == 0, "1 process, batch 4, 4 steps")
    r2 = run(["train", data, *common, "--gpus", "2", "-o", P("two")])
    check(r2.returncode == 0, "--gpus 2 --device cpu, batch 4, 4 steps")
    out = r2.stdout.splitlines()
    check(sum(l.startswith("distributed: 2 ranks, 2 per node on 1 node, started by unet --gpus, tcp") for l in out) == 1
          and sum(l.startswith("unet train:") for l in out) == 1 and "(2 per rank)" in r2.stdout,
          "one start line from rank 0: world size, ranks per node, where each rank runs")
    close(P("one", "latest.h5"), P("two", "latest.h5"), "2 ranks vs 1 process")
    l1, l2 = losses(P("one")), losses(P("two"))
    check(len(l1) == 4 and len(l2) == 4 and max(abs(a - b) / a for a, b in zip(l1, l2)) < 1e-5,
          f"losses of the global batch (rank average) equal 1 process: {l1} vs {l2}")
    check(sorted(os.listdir(P("two"))) == sorted(os.listdir(P("one"))), "rank 0 alone writes the run directory")

    mpirun = shutil.which("mpirun")
    if mpirun:
        args = ["--allow-run-as-root", "--oversubscribe"] if os.geteuid() == 0 else ["--oversubscribe"]
        rm = run(["train", data, *common, "-o", P("mpi")], prefix=(mpirun, *args, "-np", "2"), timeout=300)
        check(rm.returncode == 0 and "started by mpirun, mpi" in rm.stdout, "mpirun -np 2 unet train --device cpu")
        if rm.returncode == 0:
            close(P("one", "latest.h5"), P("mpi", "latest.h5"), "mpirun -np 2 vs 1 process")
    else:
        print("skip: no mpirun (Debian: openmpi-bin)")

    # ---- save on 2 ranks, resume on 1 and on 2 ----
    for n, tag in ((1, "res1"), (2, "res2")):
        r = run(["train", data, "--resume", P("two", "ckpt_0000002.h5"), "-o", P(tag), "--device", "cpu",
                 *(["--gpus", "2"] if n == 2 else [])])
        check(r.returncode == 0 and "resuming at step 2" in r.stdout, f"resume a 2-rank checkpoint on {n} rank(s)")
        close(P("one", "latest.h5"), P(tag, "latest.h5"), f"2 ranks to step 2, {n} rank(s) to step 4 vs 1 process")

    # ---- bad environments: one line naming the variable or flag, exit 1 ----
    bad = [({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, [], "MASTER_ADDR"),
           ({"RANK": "3", "WORLD_SIZE": "2"}, [], "RANK=3"),
           ({"OMPI_COMM_WORLD_RANK": "0"}, [], "OMPI_COMM_WORLD_SIZE"),
           ({}, ["--gpus", "3"], "--batch-size 4"),
           ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": "29999"}, ["--gpus", "2"], "--gpus")]
    for env, extra, needle in bad:
        r = run(["train", data, *common, "-o", P("bad"), *extra], env={**ENV, **env}, timeout=60, fails=True)
        lines = unet_lines(r.stderr)
        check(r.returncode == 1 and len(lines) == 1 and needle in lines[0], f"{env} {extra}: {lines}")
    check(not os.path.exists(P("bad")), "nothing written by the refused runs")

    # ---- a killed rank stops the other, with one line naming it; the checkpoint stays ----
    long = base + ["--steps", "100000"]
    p = start(["train", data, *long, "--save-every", "1", "--gpus", "2", "-o", P("kill")])
    ok = wait_for(lambda: os.path.exists(P("kill", "ckpt_0000002.h5")), 120, p)
    ranks = children(p.pid)
    check(ok and set(ranks) == {0, 1}, f"2 ranks running and saving ({ranks})")
    t0 = time.time()
    if 1 in ranks:
        os.kill(ranks[1], signal.SIGKILL)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    lines = unet_lines(err)
    check(p.returncode not in (0, None) and time.time() - t0 < 30, f"killed rank 1: the run stops ({time.time() - t0:.1f} s)")
    check(len(lines) == 1 and "rank 1" in lines[0] and "killed" in lines[0], f"one line naming rank 1: {lines}")
    try:
        step = arenas(P("kill", "latest.h5"))["step"]
        check(step >= 1, f"latest.h5 intact after the kill (step {step})")
    except Exception as e:  # noqa: BLE001
        check(False, f"latest.h5 intact after the kill: {e}")

    # ---- a frozen rank (SIGSTOP): found by the heartbeat timeout ----
    p = start(["train", data, *long, "--save-every", "0", "--gpus", "2", "--dist-timeout", "2", "-o", P("hang")])
    ok = wait_for(lambda: os.path.exists(P("hang", "metrics.csv")) and len(losses(P("hang"))) >= 1, 120, p)
    ranks = children(p.pid)
    t0 = time.time()
    if ok and 1 in ranks:
        os.kill(ranks[1], signal.SIGSTOP)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    if 1 in ranks:
        try:
            os.kill(ranks[1], signal.SIGKILL)
        except OSError:
            pass
    lines = unet_lines(err)
    check(p.returncode not in (0, None) and time.time() - t0 < 30, f"frozen rank 1: the run stops ({time.time() - t0:.1f} s)")
    check(any("rank 1" in l and "responding" in l for l in lines), f"a line naming the frozen rank 1: {lines}")

    # ---- Ctrl-C on the launcher: every rank stops at one step, rank 0 saves (on the way out, or
    # at that step's regular save: the ranks must agree which) ----
    for every in ("0", "1"):
        tag = "int" + every
        p = start(["train", data, *long, "--save-every", every, "--gpus", "2", "-o", P(tag)])
        ok = wait_for(lambda: os.path.exists(P(tag, "metrics.csv")) and len(losses(P(tag))) >= 2, 120, p)
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        check(ok and p.returncode == 0 and "interrupted at step" in out,
              f"SIGINT to the launcher (--save-every {every}): exit 0 ({p.returncode}, {err[-300:]})")
        if "interrupted at step" in out:
            at = int(out.split("interrupted at step ")[1].split(";")[0].split()[0])
            check(arenas(P(tag, "latest.h5"))["step"] == at, f"checkpoint of step {at} saved")

    # ---- streaming: > 2 GB of images, bounded memory ----
    big = P("big.h5")
    n_big = 720_000  # 32x32x3 bytes each: 2.2 GB of pixels; unwritten chunks cost no disk
    with h5py.File(data, "r") as src, h5py.File(big, "w") as f:
        f.attrs.update({"format": "unet-dataset", "version": 1, "image_size": 32, "count": n_big})
        d = f.create_dataset("images", shape=(n_big, 32, 32, 3), dtype="u1", chunks=(1, 32, 32, 3), compression="gzip")
        d[:60] = src["images"][:60]
        d[n_big - 60:] = src["images"][:60]
    r = run(["train", big, "--preset", "tiny32", "--device", "cpu", "--batch-size", "4", "--steps", "3",
             "--log-every", "1", "-o", P("bigrun")])
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    check(r.returncode == 0 and "streamed" in r.stdout, f"trains on a 2.2 GB dataset, streamed ({r.stdout[-300:]})")
    check(peak_mb < 1024, f"peak RSS {peak_mb:.0f} MB < 1 GB (the images are 2.2 GB)")

    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        code = main()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(code)
