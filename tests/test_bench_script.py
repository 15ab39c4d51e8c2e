"""scripts/bench.py's parsing of `unet profile` and its tables, on CPU (the benchmark itself needs
the GPU machine): the CUDA events without the profiler are preferred over the profiled ones, the
profiled ones are the fallback, a missing graph line is an error, and the tables rendered from a
partial run (what a run stopped by a time limit saves) have only the measured rows, with "-" where
the torch.compile tf32 baseline is missing; the cuDNN unet reports loading is kept for the heading."""

import sys

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

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
