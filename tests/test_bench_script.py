"""scripts/bench.py's parsing of `unet profile` and its tables, on CPU (the benchmark itself needs
the GPU machine): the CUDA events without the profiler are preferred over the profiled ones, the
profiled ones are the fallback, a missing graph line is an error, and the tables rendered from a
partial run (what a run stopped by a time limit saves) have only the measured rows, with "-" where
the torch.compile tf32 baseline is missing; the cuDNN unet reports loading is kept for the heading;
the rows saved for --resume come back as saved (NaN included) on the same GPU model, and another
GPU's or a damaged bench.json is refused."""

import json
import math
import os
import sys
import tempfile

from e2e_common import check, failures

try:
    import bench
except ImportError as e:  # pragma: no cover (numpy missing)
    print(f"skipping: {e}")
    sys.exit(77)

PROFILED = """Device memory held: 1.79 GB (planned buffers, weights, workspaces)
CUDA-graph replays: kernel sum 11.470 ms/iter (incl. 0.081 ms memcpy/memset), CUDA events 9.170 ms/iter (-25.1% difference)
"""
PLAIN = "kernels overlap (several streams): the step's GPU time is the CUDA-event time without the profiler " \
        "attached (graph replays): CUDA events 8.985 ms/iter\n"

ks, ev, mem = bench.parse_profile(PROFILED + PLAIN)
check(ks == 11.47 and ev == 8.985 and mem == 1.79, f"the plain CUDA events are taken: {(ks, ev, mem)}")
ks, ev, mem = bench.parse_profile(PROFILED)
check(ks == 11.47 and ev == 9.17, f"without a plain timing, the profiled events: {(ks, ev, mem)}")
check("cudnn" not in bench.FOUND, f"no library line, nothing found: {bench.FOUND}")
LIB = "cuDNN 9.14.0 (/usr/lib/x86_64-linux-gnu/libcudnn.so.9)"
bench.parse_profile("GPU: NVIDIA H200 | precision tf32\nConvolution library: " + LIB + "\n" + PROFILED)
check(bench.FOUND.get("cudnn") == LIB, f"the cuDNN unet loaded is kept for the heading: {bench.FOUND}")
try:
    bench.parse_profile("Device memory held: 1.79 GB\n")
    check(False, "a profile without its graph line is refused")
except SystemExit as e:
    check("no CUDA-graph line" in str(e), f"a profile without its graph line is refused: {e}")

nan = float("nan")
train = [("unet tf32", 15.07, 21.43, 15.16, 2.93), ("unet bf16", 8.86, 11.54, 8.92, 1.79)]
samp = [("unet bf16", 5.20, 4.71)]
partial = bench.render("head", 32, 64, train, samp)
rows = [ln for ln in partial.splitlines() if ln.startswith("| unet")]
check(len(rows) == 3, f"a partial run's tables have its 3 rows: {rows}")
check(all(r.endswith("| - |") for r in rows), f"no baseline, no ratio: {rows}")
check("| unet bf16 | 8.86 | 11.54 | 8.92 | 1.79 | - |" in partial, "the training row's columns")

train.append(("torch compile tf32", 57.27, 24.17, nan, 2.84))
samp.append(("torch compile tf32", 19.28, 11.51))
full = bench.render("head", 32, 64, train, samp)
check("| unet bf16 | 8.86 | 11.54 | 8.92 | 1.79 | 2.71x |" in full,
      "unet's ratio: the baseline's kernel sum over unet's CUDA events (24.17 / 8.92)")
check("| torch compile tf32 | 57.27 | 24.17 | - | 2.84 | 1.00x |" in full, "the baseline's own row")
check("| unet bf16 | 5.20 | 4.71 | 3.71x |" in full, "sampling: wall over wall (19.28 / 5.20)")

# --resume: bench.json round trip
with tempfile.TemporaryDirectory() as d:
    check(bench.load_rows(d, "GPU A") == ([], [], None), "no bench.json: nothing to resume")
    bench.FOUND.clear()
    bench.FOUND["cudnn"] = LIB
    bench.save_rows(d, "GPU A", "the heading", train, samp)
    bench.FOUND.clear()
    t2, s2, base = bench.load_rows(d, "GPU A")
    check(base == "the heading" and bench.FOUND.get("cudnn") == LIB, f"heading and library back: {base} {bench.FOUND}")
    check(len(t2) == len(train) and all(a[0] == b[0] for a, b in zip(t2, train)), f"training rows in order: {t2}")
    check(math.isnan(t2[-1][3]) and t2[0] == train[0], f"values as saved, NaN included: {t2}")
    check(s2 == samp, f"sampling rows as saved: {s2}")
    check(bench.render("head", 32, 64, t2, s2) == full, "the resumed rows render the same tables")
    check(not os.path.exists(os.path.join(d, "bench.json.tmp")), "no temporary file left")
    for gpu, text, want in (("GPU B", None, "measured on GPU A"), ("GPU A", "{\"train\": [", "not a bench.py result"),
                            ("GPU A", json.dumps({"gpu": "GPU A"}), "not a bench.py result")):
        if text is not None:
            open(os.path.join(d, "bench.json"), "w").write(text)
        try:
            bench.load_rows(d, gpu)
            check(False, f"refused: {want}")
        except SystemExit as e:
            check(want in str(e) and "bench.json" in str(e), f"refused in one line naming the file: {e}")

# --resume end to end, the measurements faked: a run stopped after its third row, then a resumed
# one measures only the rest, and the table holds every row once, in the order of one whole run.
try:
    import torch
except ImportError:  # pragma: no cover
    torch = None
if torch is not None:
    measured = []
    stop_after = [3]

    def fake(name, value):
        measured.append(name)
        if len(measured) > stop_after[0]:
            raise KeyboardInterrupt  # the machine's time limit
        return value

    real = {k: getattr(bench, k) for k in ("unet_profile", "unet_train_wall", "unet_sample_wall", "bench_torch_train",
                                           "bench_torch_sample", "run", "make_dataset")}
    real_gpu = torch.cuda.get_device_name
    bench.unet_profile = lambda unet, prec, batch, pass_="step": (10.0, 5.0, 1.0)
    bench.unet_train_wall = lambda unet, data, prec, steps, batch, tmp: fake(f"unet {prec}", 6.0)
    bench.unet_sample_wall = lambda unet, ckpt, prec, n: fake(f"unet sample {prec}", 3.0)
    bench.bench_torch_train = lambda mode, batch: fake(f"torch {mode}", (40.0, 20.0, 2.0))
    bench.bench_torch_sample = lambda mode, n: fake(f"torch sample {mode}", (12.0, 8.0, 1.0))
    bench.run = lambda cmd: measured.append("init " + cmd[cmd.index("-o") + 1].rsplit("/", 1)[-1]) or ""
    bench.make_dataset = lambda path: None
    torch.cuda.get_device_name = lambda i=0: "GPU A"
    try:
        with tempfile.TemporaryDirectory() as d:
            sys.argv = ["bench.py", "--unet", "unet", "--out", d, "--skip-fp32"]
            try:
                bench.main()
                check(False, "the first run stops at its fourth row")
            except KeyboardInterrupt:
                pass
            j = json.load(open(os.path.join(d, "bench.json")))
            check([r[0] for r in j["train"]] == ["unet tf32", "unet bf16"] and j["gpu"] == "GPU A",
                  f"the stopped run saved its rows: {j['train']} {j['samp']}")
            first = list(measured)
            measured.clear()
            stop_after[0] = 100
            sys.argv += ["--resume"]
            bench.main()
            check(first == ["unet tf32", "unet bf16", "init init.h5", "unet sample tf32"],
                  f"the first run's measurements: {first}")
            check(measured[:3] == ["init init.h5", "unet sample tf32", "unet sample bf16"] and "unet tf32" not in
                  measured and len(measured) == 3 + 3 + 4, f"the resumed run measures only what is missing: {measured}")
            md = open(os.path.join(d, "bench.md")).read()
            names = [ln.split("|")[1].strip() for ln in md.splitlines() if ln.startswith("| unet") or
                     ln.startswith("| torch")]
            check(names == ["unet tf32", "unet bf16", "torch eager tf32", "torch compile tf32", "torch compile bf16",
                            "unet tf32", "unet bf16", "torch eager tf32", "torch eager bf16", "torch compile tf32",
                            "torch compile bf16"], f"every row once, in a whole run's order: {names}")
            sys.argv = ["bench.py", "--unet", "unet", "--out", d, "--resume"]
            torch.cuda.get_device_name = lambda i=0: "GPU B"
            try:
                bench.main()
                check(False, "another GPU's rows are not resumed")
            except SystemExit as e:
                check("measured on GPU A, this GPU is GPU B" in str(e), f"another GPU's rows refused: {e}")
    finally:
        for k, v in real.items():
            setattr(bench, k, v)
        torch.cuda.get_device_name = real_gpu

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
