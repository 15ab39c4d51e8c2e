// Fresh model weights as `unet init` makes them (SPEC §3 Init): PyTorch's default initialisation,
// deterministic in the seed and identical on every machine.
#pragma once
#include <cstdint>
#include <vector>

#include "params.h"

namespace unet {

// The flat parameter arena (t.total floats, engine layout, alignment padding zero) filled per
// each tensor's InitRule: Uniform U(-1/sqrt(fan_in), 1/sqrt(fan_in)), Ones, Zeros, Normal N(0, std^2).
// Element i of a tensor in PyTorch order depends only on (seed, tensor name, i): a counter-based
// generator (splitmix64), uniforms from 53-bit integers, normals by Box-Muller — no <random>
// distributions, whose output differs between standard libraries. Runs in parallel (OpenMP);
// the result does not depend on the thread count.
std::vector<float> init_params(const ParamTable& t, uint64_t seed);
void init_params(const ParamTable& t, uint64_t seed, float* arena);  // arena: t.total floats
// One tensor's values in PyTorch order (p.numel floats), as init_params draws them.
void init_tensor(const ParamInfo& p, uint64_t seed, float* torch_order);

}  // namespace unet
