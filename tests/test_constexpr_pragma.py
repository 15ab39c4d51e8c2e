"""Guards the CUDA sources against an nvcc 13.0 front-end miscompile: when a branch of an
`if constexpr` is discarded, is not a braced block, and holds a `#pragma` (e.g. a `for` whose
body has a `#pragma unroll` loop), the `#pragma`'d statement right after the whole if-statement
is dropped from that instance too. Found on 2026-11-30 in an experimental stats_rows_kernel
(`if constexpr (D > 0) {...} else if (j < Cv) for (...) {... #pragma unroll ...}` followed by
`#pragma unroll for (...) red[...] = ...;`): its PTX had no store to `red`, so the block summed
whatever shared memory held (wrong statistics, different between runs, sanitizers silent).
Reproduced alone (nvcc V13.0.88, -O3, sm_90):

    template <int D> __global__ void k(float* out, int n) {
      __shared__ float red[256];
      float s = out[threadIdx.x];
      if constexpr (D == 0)
        for (int i = 0; i < n; ++i) {
    #pragma unroll
          for (int u = 0; u < 4; ++u) s += out[i + u];
        }
    #pragma unroll
      for (int q = 0; q < 2; ++q) red[threadIdx.x + q] = s + q;   // gone from k<1>'s PTX
      __syncthreads();
      out[threadIdx.x] = red[(threadIdx.x + 1) % 256];
    }

Braces around the branch, or no `#pragma` in it, or none on the statement after, and the stores
are there. The rule checked here, over every .cu/.cuh/.h under kernels/ and lib/: a branch of an
`if constexpr` that holds a `#pragma` is a braced block. The checker is tested on snippets first."""

import os
import re
import sys

from e2e_common import SRC, check, failures

TOKEN = re.compile(r'(#pragma[^\n]*)|(//[^\n]*)|(/\*.*?\*/)|("(?:\\.|[^"\\\n])*")|'
                   r"('(?:\\.|[^'\\\n])*')|(#[^\n]*)|(\w+)|(\S)", re.S)


def tokens(src):
    """(text, line) of each token; comments and preprocessor lines other than #pragma dropped."""
    out = []
    for m in TOKEN.finditer(src):
        if m.group(2) or m.group(3) or m.group(6):
            continue
        out.append((m.group(0), src.count("\n", 0, m.start()) + 1))
    return out


def balanced(T, i, o, c):
    """Index after the bracket group opening at T[i] (o ... c)."""
    d = 0
    while i < len(T):
        if T[i][0] == o:
            d += 1
        elif T[i][0] == c:
            d -= 1
            if d == 0:
                return i + 1
        i += 1
    return i


def statement(T, i, found):
    """Index after the statement at T[i] and whether it holds a #pragma; `found` collects the
    (line, what) of each if constexpr branch that breaks the rule."""
    pragma = False
    while i < len(T) and T[i][0].startswith("#pragma"):
        pragma, i = True, i + 1
    if i >= len(T):
        return i, pragma
    t = T[i][0]
    if t == "{":
        j, inner = i + 1, False
        while j < len(T) and T[j][0] != "}":
            j, p = statement(T, j, found)
            inner |= p
        return j + 1, pragma or inner
    if t == "if":
        constexpr = i + 1 < len(T) and T[i + 1][0] == "constexpr"
        b = balanced(T, i + 1 + constexpr, "(", ")")
        j, p = statement(T, b, found)
        branches = [(b, p)]  # (first token, holds a #pragma)
        if j < len(T) and T[j][0] == "else":
            e = j + 1
            j, p = statement(T, e, found)
            branches.append((e, p))
        pragma |= any(p for _, p in branches)
        if constexpr:
            for b, p in branches:
                if p and T[b][0] != "{":
                    found.append((T[b][1], "an unbraced branch of the if constexpr at line %d holds a #pragma"
                                  % T[i][1]))
        return j, pragma
    if t in ("for", "while", "switch"):
        j, p = statement(T, balanced(T, i + 1, "(", ")"), found)
        return j, pragma or p
    if t == "do":
        j, p = statement(T, i + 1, found)
        return balanced(T, j + 1, "(", ")") + 1, pragma or p
    d = 0  # an expression or declaration up to its ';' (lambdas' and initialisers' braces inside)
    while i < len(T):
        x = T[i][0]
        if x in "([{":
            d += 1
        elif x in ")]}":
            if d == 0:
                return i, pragma  # the end of an enclosing block without a ';' (e.g. `};` forms)
            d -= 1
        elif x == ";" and d == 0:
            return i + 1, pragma
        elif x.startswith("#pragma"):
            pragma = True
        i += 1
    return i, pragma


def violations(src):
    """Breaches of the rule in a source text: (line, what). Every braced block that follows a ')'
    (or a ')' then qualifiers) is parsed as a statement: function and lambda bodies, and the
    blocks of control statements again (breaches found twice count once)."""
    T, found = tokens(src), []
    for i in range(1, len(T)):
        if T[i][0] == "{":
            j = i - 1
            while j > 0 and T[j][0] in ("const", "noexcept", "override", "mutable"):
                j -= 1
            if T[j][0] == ")":
                statement(T[i:balanced(T, i, "{", "}")], 0, found)
    return sorted(set(found))


BAD_ELSE = """
template <int D> __global__ void k(float* p, int n) {
  float s = 0;
  if constexpr (D > 0) {
    s = 1;
  } else if (n > 0)
    for (int i = 0; i < n; ++i) {
#pragma unroll
      for (int u = 0; u < 4; ++u) s += p[i + u];
    }
#pragma unroll
  for (int q = 0; q < 2; ++q) p[q] = s;
}
"""
BAD_THEN = """
template <int D> __global__ void k(float* p, int n) {
  float s = 0;
  if constexpr (D == 0)
    for (int i = 0; i < n; ++i) {
#pragma unroll
      for (int u = 0; u < 4; ++u) s += p[i + u];
    }
  p[0] = s;
}
"""
GOOD = """
template <int D> __global__ void k(float* p, int n) {
  float s = 0;
  auto f = [&](int i) { if (i) s += 1; };
  if constexpr (D > 0) {
    s = 1;
  } else {
    if (n > 0)
      for (int i = 0; i < n; ++i) {
#pragma unroll
        for (int u = 0; u < 4; ++u) s += p[i + u];
      }
  }
  if constexpr (D == 1)
    s += 2;
  else
    for (int i = 0; i < n; ++i) f(i);
#pragma unroll
  for (int q = 0; q < 2; ++q) p[q] = s;
}
"""

check([l for l, _ in violations(BAD_ELSE)] == [6], "flags an unbraced else-if holding a #pragma (%s)"
      % violations(BAD_ELSE))
check([l for l, _ in violations(BAD_THEN)] == [5], "flags an unbraced then-branch holding a #pragma (%s)"
      % violations(BAD_THEN))
check(violations(GOOD) == [], "passes braced branches and unbraced ones without a #pragma (%s)"
      % violations(GOOD))

scanned, breaches = 0, []
for top in ("kernels", "lib"):
    for root, _, names in os.walk(os.path.join(SRC, top)):
        for name in sorted(names):
            if name.endswith((".cu", ".cuh", ".h")):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                scanned += 1
                breaches += ["%s:%d: %s" % (os.path.relpath(path, SRC), line, what)
                             for line, what in violations(text)]
check(scanned > 20, "scanned the CUDA sources (%d files)" % scanned)
for b in breaches:
    print(b)
check(not breaches, "every #pragma inside an if constexpr branch sits in a braced block (%d breaches)"
      % len(breaches))
sys.exit(1 if failures else 0)
