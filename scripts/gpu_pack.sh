#!/usr/bin/env bash
# Packs the built binaries, stripped, into $BUILD/bin.tar.xz for the GPU machine (device `carry`
# ["build/bin.tar.xz"]: the working tree (~38 MB) and what is carried must fit in 64 MiB together);
# scripts/gpu_session.sh and gpu_multi.sh unpack it there.
#   bash scripts/gpu_pack.sh [BUILD] [binary names...]   (default: every executable in BUILD/bin)
# One xz stream at -9 with a 1 GiB dictionary (one thread): the binaries share the library, so each
# one after the first costs little while the ones before it are still in the dictionary. Measured:
# every binary of the build (unet + 32 test binaries, 1.1 GB stripped) 20.0 MB in 10 minutes, ~5
# GB of memory (2026-11-30; at -9's 64 MiB dictionary unet + 24 test binaries took 28.5 MB, as
# only the binary before each was in reach; at xz's default 8 MiB each binary packs alone, ~130 MB
# for the lot; xz's threaded mode compresses blocks apart). Unpacking takes 1 GiB of memory.
set -eu
BUILD=${1:-build}
shift || true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
if [ $# -gt 0 ]; then files=("$@"); else files=(); for f in "$BUILD"/bin/*; do [ -f "$f" ] && [ -x "$f" ] && files+=("$(basename "$f")"); done; fi
for f in "${files[@]}"; do strip -o "$tmp/bin/$f" "$BUILD/bin/$f"; done
tar -C "$tmp" -cf - bin | xz -T1 --lzma2=preset=9,dict=1GiB > "$BUILD/bin.tar.xz"
ls -l "$BUILD/bin.tar.xz"
