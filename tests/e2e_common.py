"""What the end-to-end tests (tests/test_*.py, run by ctest) share: the source tree and the unet
binary (UNET_SOURCE_DIR and UNET_BINARY, which ctest sets; else this checkout's build/bin/unet),
scripts/ on the import path, and check() with the list of failed checks. Exit status 77 tells
ctest that a test skipped."""
import atexit
import os
import shutil
import sys
import tempfile

SRC = os.environ.get("UNET_SOURCE_DIR", os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")))
BINARY = os.environ.get("UNET_BINARY", os.path.join(SRC, "build", "bin", "unet"))
sys.path.insert(0, os.path.join(SRC, "scripts"))

failures = []


def work_dir(prefix):
    """A fresh temporary directory, removed when the test process exits (nothing left in /tmp)."""
    d = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


def require_binary():
    """Skips the test (exit 77) when the unet binary has not been built."""
    if not os.path.exists(BINARY):
        print(f"skipping: no binary at {BINARY}")
        sys.exit(77)


def check(cond, msg):
    print(("ok:   " if cond else "FAIL: ") + msg, flush=True)
    if not cond:
        failures.append(msg)
