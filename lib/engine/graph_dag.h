// Reachability in a captured CUDA graph's dependency DAG, kept free of CUDA so the CPU tests
// cover it (kernels/device/cuda_engine.cu maps the graph's nodes to indices).
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

namespace unet {

// For a DAG of n nodes with edges (from, to): whether each counted node is "alone", i.e. every
// other counted node is an ancestor or a descendant of it (nothing counted can run beside it).
// Uncounted nodes are never alone. Throws std::logic_error on a cycle.
std::vector<char> alone_nodes(size_t n, const std::vector<std::pair<size_t, size_t>>& edges,
                              const std::vector<char>& counted);

}  // namespace unet
