#!/usr/bin/env bash
# Packs the built binaries, stripped, into $BUILD/bin.tar.xz for the GPU machine (device `carry`
# ["build/bin.tar.xz"]: the working tree and what is carried must fit in 64 MiB together);
# scripts/gpu_session.sh and gpu_multi.sh unpack it there.
#   bash scripts/gpu_pack.sh [BUILD] [binary names...]   (default: every executable in BUILD/bin)
set -eu
BUILD=${1:-build}
shift || true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
if [ $# -gt 0 ]; then files=("$@"); else files=(); for f in "$BUILD"/bin/*; do [ -f "$f" ] && [ -x "$f" ] && files+=("$(basename "$f")"); done; fi
for f in "${files[@]}"; do strip -o "$tmp/bin/$f" "$BUILD/bin/$f"; done
tar -C "$tmp" -cJf "$BUILD/bin.tar.xz" bin
ls -l "$BUILD/bin.tar.xz"
