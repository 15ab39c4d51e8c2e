"""The demo's Python scripts, on synthetic inputs (independent of the dataset-fashion-mnist package):
- scripts/fashion_mnist_to_png.py: idx files (plain and gzipped) -> class folders in label order,
  PNGs that `unet prepare --labels subdirs` reads back to the same pixels and labels, --size 28,
  --limit-per-class, --split test, and one-line errors for bad input;
- scripts/plot_metrics.py: a PNG from metrics.csv (extra columns, nan cells), one-line errors and
  exit 1 for a missing/empty/malformed file;
- scripts/demo_grid.py: panels of per-class `unet sample --h5` files side by side;
- scripts/classifier_eval.py (classifier_demo.sh's judge): agreement of a classifier with the labels
  of `unet sample --h5` files, one-line errors (needs torch; skipped without);
- scripts/demo.sh, scripts/train_demo_model.sh and scripts/classifier_demo.sh parse (bash -n)."""

import gzip
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(77)

from e2e_common import BINARY, check, failures, SRC  # noqa: E402
SCRIPTS = os.path.join(SRC, "scripts")
TMP = tempfile.mkdtemp(prefix="unet-demo-scripts-")
CLASSES = ["00_tshirt_top", "01_trouser", "02_pullover", "03_dress", "04_coat", "05_sandal", "06_shirt",
           "07_sneaker", "08_bag", "09_ankle_boot"]


def script(name, *args):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, name), *map(str, args)],
                          capture_output=True, text=True)


def one_line_error(r, prefix, must_contain=""):
    lines = r.stderr.strip().splitlines()
    return (r.returncode == 1 and len(lines) == 1 and lines[0].startswith(prefix) and must_contain in lines[0]
            and "Traceback" not in r.stderr)


def write_idx(path, arr, gz):
    head = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    data = head + arr.astype(np.uint8).tobytes()
    with (gzip.open(path + ".gz", "wb") if gz else open(path, "wb")) as f:
        f.write(data)


def png_is_valid(path):
    with open(path, "rb") as f:
        b = f.read()
    return len(b) > 100 and b[:8] == b"\x89PNG\r\n\x1a\n"


# ---- fashion_mnist_to_png.py ------------------------------------------------------------------
rng = np.random.default_rng(0)
N = 37
train_x = rng.integers(0, 256, (N, 28, 28), dtype=np.uint8)
train_y = np.array([i % 10 for i in range(N)], np.uint8)[rng.permutation(N)]
test_x = rng.integers(0, 256, (12, 28, 28), dtype=np.uint8)
test_y = np.array([3] * 5 + [7] * 7, np.uint8)
idx = os.path.join(TMP, "idx")
os.makedirs(idx)
write_idx(os.path.join(idx, "train-images-idx3-ubyte"), train_x, gz=True)
write_idx(os.path.join(idx, "train-labels-idx1-ubyte"), train_y, gz=True)
write_idx(os.path.join(idx, "t10k-images-idx3-ubyte"), test_x, gz=False)
write_idx(os.path.join(idx, "t10k-labels-idx1-ubyte"), test_y, gz=False)

out = os.path.join(TMP, "png32")
r = script("fashion_mnist_to_png.py", idx, out)
check(r.returncode == 0, f"converter (gzipped idx, --size 32 default) exits 0 ({r.stderr.strip()})")
check(sorted(os.listdir(out)) == CLASSES, "one folder per class, sorted order = label order 0..9")
files = {c: sorted(os.listdir(os.path.join(out, c))) for c in CLASSES}
check(sum(len(v) for v in files.values()) == N, f"all {N} images written")
check(all(len(files[c]) == int((train_y == k).sum()) for k, c in enumerate(CLASSES)), "per-class counts match labels")
first = os.path.join(out, CLASSES[int(train_y[0])], files[CLASSES[int(train_y[0])]][0])
check(png_is_valid(first), "files are PNGs")

have_unet = os.path.isfile(BINARY) and os.access(BINARY, os.X_OK)
if have_unet:
    d32 = os.path.join(TMP, "d32.h5")
    p = subprocess.run([BINARY, "prepare", out, "-o", d32, "--image-size", "32", "--labels", "subdirs"],
                       capture_output=True, text=True)
    check(p.returncode == 0, f"unet prepare --labels subdirs reads the folder ({p.stderr.strip()})")
    if p.returncode == 0:
        with h5py.File(d32, "r") as f:
            imgs, labels = f["images"][()], f["labels"][()]
            names = [n.decode() if isinstance(n, bytes) else n for n in f["labels"].attrs["class_names"]]
        check(names == CLASSES, "prepare's class names are the 10 folders in order")
        # prepare lists files sorted by path: class folder, then zero-padded index = split order.
        order = sorted(range(N), key=lambda i: (int(train_y[i]), i))
        want = np.zeros((N, 32, 32), np.uint8)
        want[:, 2:30, 2:30] = train_x[order]
        check(np.array_equal(labels, train_y[order].astype(np.int64)), "labels = the idx labels")
        check(np.array_equal(imgs, np.repeat(want[..., None], 3, axis=3)),
              "pixels = the idx pixels padded 28->32 with black, gray replicated to RGB (exact)")
else:
    print(f"note: {BINARY} not built; skipping the prepare round trip")

out28 = os.path.join(TMP, "png28")
r = script("fashion_mnist_to_png.py", idx, out28, "--split", "test", "--size", "28", "--limit-per-class", "4")
check(r.returncode == 0, f"--split test (plain idx) --size 28 --limit-per-class 4 exits 0 ({r.stderr.strip()})")
counts = {c: len(os.listdir(os.path.join(out28, c))) for c in CLASSES}
check(counts["03_dress"] == 4 and counts["07_sneaker"] == 4 and sum(counts.values()) == 8,
      f"--limit-per-class keeps the first N of each class ({counts})")
if have_unet:
    d28 = os.path.join(TMP, "d28.h5")
    p = subprocess.run([BINARY, "prepare", out28, "-o", d28, "--image-size", "28", "--labels", "subdirs"],
                       capture_output=True, text=True)
    with h5py.File(d28, "r") as f:
        imgs = f["images"][()]
    check(p.returncode == 0 and np.array_equal(imgs[:4, :, :, 0], test_x[:4]), "--size 28 keeps 28x28 pixels")

r = script("fashion_mnist_to_png.py", os.path.join(TMP, "nope"), os.path.join(TMP, "o1"))
check(one_line_error(r, "fashion_mnist_to_png:", "not found"), "missing idx dir: one line, exit 1")
bad = os.path.join(TMP, "badidx")
os.makedirs(bad)
with open(os.path.join(bad, "train-images-idx3-ubyte"), "wb") as f:
    f.write(b"GIF89a not an idx file at all")
write_idx(os.path.join(bad, "train-labels-idx1-ubyte"), train_y, gz=False)
r = script("fashion_mnist_to_png.py", bad, os.path.join(TMP, "o2"))
check(one_line_error(r, "fashion_mnist_to_png:", "magic"), "bad magic: one line, exit 1")
write_idx(os.path.join(bad, "train-images-idx3-ubyte"), train_x[:5], gz=False)
r = script("fashion_mnist_to_png.py", bad, os.path.join(TMP, "o3"))
check(one_line_error(r, "fashion_mnist_to_png:", "do not match"), "image/label count mismatch: one line, exit 1")
r = script("fashion_mnist_to_png.py", idx, os.path.join(TMP, "o4"), "--size", "20")
check(one_line_error(r, "fashion_mnist_to_png:", "--size"), "--size below 28: one line, exit 1")

# ---- plot_metrics.py --------------------------------------------------------------------------
try:
    import matplotlib  # noqa: F401
    have_mpl = True
except ImportError:
    have_mpl = False
    print("note: matplotlib missing (Debian python3-matplotlib); skipping the plot checks")

if have_mpl:
    run = os.path.join(TMP, "run")
    os.makedirs(run)
    with open(os.path.join(run, "metrics.csv"), "w") as f:
        f.write("step,loss,grad_norm,lr,images_per_s,ms_per_step\n")
        for s in range(10, 210, 10):
            f.write(f"{s},{1.0 / (1 + s / 50):.6f},{1.5 - s / 400:.5f},0.0003,{48 + s % 7},{330 + s % 11}\n")
    r = script("plot_metrics.py", run)
    png = os.path.join(run, "metrics.png")
    check(r.returncode == 0 and os.path.isfile(png) and png_is_valid(png) and os.path.getsize(png) > 5000,
          f"metrics.csv -> RUNDIR/metrics.png, non-empty PNG ({r.stderr.strip()})")
    check(not [n for n in os.listdir(run) if "tmp" in n], "no temporary file left behind")

    run2 = os.path.join(TMP, "run2")
    os.makedirs(run2)
    with open(os.path.join(run2, "metrics.csv"), "w") as f:
        f.write("step,loss,grad_norm,lr,images_per_s,ms_per_step,mse,vb\n")
        f.write("1,0.9,1.2,1e-4,50,320,0.8,0.1\n2,nan,1.1,1e-4,,321,0.7,inf\n3,0.7,1.0,1e-4,52,322,0.6,0.1\n")
    other = os.path.join(TMP, "other.png")
    r = script("plot_metrics.py", run2, "-o", other)
    check(r.returncode == 0 and png_is_valid(other), f"extra columns (mse, vb), nan/inf/empty cells, -o ({r.stderr.strip()})")

    empty = os.path.join(TMP, "empty")
    os.makedirs(empty)
    r = script("plot_metrics.py", os.path.join(TMP, "no-such-run"))
    check(one_line_error(r, "plot_metrics:", "not found"), "missing metrics.csv: one line, exit 1")
    open(os.path.join(empty, "metrics.csv"), "w").close()
    r = script("plot_metrics.py", empty)
    check(one_line_error(r, "plot_metrics:", "empty"), "empty metrics.csv: one line, exit 1")
    for name, body, what in [
        ("header", "step,loss,grad_norm,lr,images_per_s,ms_per_step\n", "header only"),
        ("text", "step,loss\n1,0.5\n2,abc\n", "a non-number"),
        ("fields", "step,loss,lr\n1,0.5,1e-4\n2,0.4\n", "a short row"),
        ("nostep", "loss,lr\n0.5,1e-4\n", "no step column"),
        ("binary", "\x00\x01\x02garbage\n", "garbage"),
    ]:
        d = os.path.join(TMP, "bad_" + name)
        os.makedirs(d)
        with open(os.path.join(d, "metrics.csv"), "w") as f:
            f.write(body)
        r = script("plot_metrics.py", d)
        check(one_line_error(r, "plot_metrics:") and not os.path.exists(os.path.join(d, "metrics.png")),
              f"malformed metrics.csv ({what}): one line, exit 1, no PNG ({r.stderr.strip()})")

# ---- demo_grid.py -----------------------------------------------------------------------------
if have_mpl and have_unet:
    panel = os.path.join(TMP, "panel")
    os.makedirs(panel)
    for k in range(10):
        with h5py.File(os.path.join(panel, f"class_{k:02d}.h5"), "w") as f:
            f["images"] = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    grid = os.path.join(TMP, "grid.png")
    r = script("demo_grid.py", "-o", grid, "--data", os.path.join(TMP, "d32.h5"), "--panel", "a", panel,
               "--panel", "b", panel, "--title", "t")
    check(r.returncode == 0 and png_is_valid(grid), f"demo_grid: data + two panels -> PNG ({r.stderr.strip()})")
    r = script("demo_grid.py", "-o", grid, "--panel", "a", os.path.join(TMP, "no-panel"))
    check(one_line_error(r, "demo_grid:", "no sample files"), "demo_grid: missing panel dir: one line, exit 1")

# ---- scripts/classifier_eval.py (scripts/classifier_demo.sh's judge), with torch ------------------
try:
    import torch
except ImportError:
    torch = None
if torch is None:
    print("classifier_eval.py: skipped (no torch)")
else:
    sys.path.insert(0, SCRIPTS)
    import classifier_torch as ct
    from unet_ckpt import save_classifier_checkpoint
    cflags = dict(image_size=8, classifier_width=32, classifier_depth=1, classifier_channel_mult="1,1",
                  classifier_attention_resolutions="", classifier_num_head_channels=32, num_classes=3)
    torch.manual_seed(5)
    clf = ct.create_classifier(cflags)
    with torch.no_grad():
        for p in clf.parameters():
            p.copy_(0.3 * torch.randn_like(p))
    judge = os.path.join(TMP, "judge.h5")
    save_classifier_checkpoint(clf, cflags, judge)
    x = np.random.default_rng(5).uniform(-1, 1, (6, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():
        pred = clf.double()(torch.from_numpy(x).double(), torch.zeros(6, dtype=torch.float64)).argmax(-1).numpy()
    sdir = os.path.join(TMP, "samples")
    os.makedirs(sdir)
    for name, labels in (("class_00.h5", pred), ("class_01.h5", (pred + 1) % 3)):
        with h5py.File(os.path.join(sdir, name), "w") as f:
            f["samples"], f["labels"] = x, labels.astype(np.int64)
    r = script("classifier_eval.py", judge, sdir, os.path.join(sdir, "class_01.h5"))
    lines = r.stdout.strip().splitlines()
    check(r.returncode == 0 and len(lines) == 2 and "6/12 = 50.0%" in lines[0] and "0/6 = 0.0%" in lines[1],
          f"classifier_eval: agreement of a folder and a file ({lines}, {r.stderr.strip()[-200:]})")
    with h5py.File(os.path.join(TMP, "nolabels.h5"), "w") as f:
        f["samples"] = x
    with h5py.File(os.path.join(TMP, "big.h5"), "w") as f:
        f["samples"], f["labels"] = np.zeros((2, 3, 16, 16), np.float32), np.zeros(2, np.int64)
    for args, needle, what in [((judge, os.path.join(TMP, "nope")), "no such file", "a missing input"),
                               ((judge, os.path.join(TMP, "nolabels.h5")), "labels", "samples without labels"),
                               ((judge, os.path.join(TMP, "big.h5")), "do not fit", "16x16 samples, 8x8 judge"),
                               ((os.path.join(TMP, "nolabels.h5"), sdir), "nolabels.h5", "a judge that is not one")]:
        r = script("classifier_eval.py", *args)
        check(one_line_error(r, "classifier_eval:", needle), f"classifier_eval: {what}: one line, exit 1 "
                                                             f"({r.stderr.strip()[-200:]})")

# ---- the shell scripts parse (make demo runs them; too slow for the tests) ------------------------
for sh in ("demo.sh", "train_demo_model.sh", "classifier_demo.sh"):
    r = subprocess.run(["bash", "-n", os.path.join(SCRIPTS, sh)], capture_output=True, text=True)
    check(r.returncode == 0, f"bash -n scripts/{sh} ({r.stderr.strip()})")

print(f"{len(failures)} failure(s); files kept in {TMP}" if failures else "all demo script checks passed")
if not failures:
    shutil.rmtree(TMP, ignore_errors=True)
sys.exit(1 if failures else 0)
