#!/usr/bin/env bash
# Packs the built binaries, stripped, into $BUILD/bin.tar.xz for the GPU machine (device `carry`
# ["build/bin.tar.xz"]: the working tree (~38 MB) and what is carried must fit in 64 MiB together);
# scripts/gpu_session.sh and gpu_multi.sh unpack it there.
#   bash scripts/gpu_pack.sh [BUILD] [binary names...]   (default: every executable in BUILD/bin)
# One xz stream at -9 (a 64 MiB dictionary, one thread): the binaries share the library, so each
# one after the first costs little when its predecessor is still in the dictionary. Measured
# (2026-11-28): unet + 23 CUDA test binaries (~790 MB stripped) 19.2 MB in 7 minutes; xz's default
# level (8 MiB dictionary) packs each binary alone (unet 7.1 MB, a test binary ~5.4 MB: ~130 MB for
# the lot), and its threaded mode compresses blocks of 192 MiB apart.
set -eu
BUILD=${1:-build}
shift || true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
if [ $# -gt 0 ]; then files=("$@"); else files=(); for f in "$BUILD"/bin/*; do [ -f "$f" ] && [ -x "$f" ] && files+=("$(basename "$f")"); done; fi
for f in "${files[@]}"; do strip -o "$tmp/bin/$f" "$BUILD/bin/$f"; done
tar -C "$tmp" -cf - bin | xz -T1 -9 > "$BUILD/bin.tar.xz"
ls -l "$BUILD/bin.tar.xz"
