#include "graph_dag.h"

#include <cstdint>
#include <stdexcept>

namespace unet {

std::vector<char> alone_nodes(size_t n, const std::vector<std::pair<size_t, size_t>>& edges,
                              const std::vector<char>& counted) {
  const size_t W = (n + 63) / 64;
  std::vector<std::vector<size_t>> succ(n);
  std::vector<size_t> indeg(n, 0);
  for (const auto& [a, b] : edges) succ[a].push_back(b), ++indeg[b];
  std::vector<size_t> order;  // topological (Kahn)
  for (size_t i = 0; i < n; ++i)
    if (!indeg[i]) order.push_back(i);
  std::vector<uint64_t> anc(n * W, 0);  // row v: the nodes before v
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t v = order[k];
    for (size_t w : succ[v]) {
      for (size_t j = 0; j < W; ++j) anc[w * W + j] |= anc[v * W + j];
      anc[w * W + v / 64] |= 1ull << (v % 64);
      if (--indeg[w] == 0) order.push_back(w);
    }
  }
  if (order.size() != n) throw std::logic_error("alone_nodes: the graph has a cycle");
  std::vector<size_t> before(n, 0), after(n, 0);  // counted ancestors / descendants
  size_t total = 0;
  for (size_t v = 0; v < n; ++v) {
    total += counted[v] != 0;
    for (size_t u = 0; u < n; ++u) {
      if (!counted[u] || !(anc[v * W + u / 64] >> (u % 64) & 1)) continue;
      ++before[v];
      if (counted[v]) ++after[u];
    }
  }
  std::vector<char> alone(n, 0);
  for (size_t v = 0; v < n; ++v) alone[v] = counted[v] && before[v] + after[v] + 1 == total;
  return alone;
}

}  // namespace unet
