// The CPU reference engine's kernels: every op of lib/backend.h as a function template on the
// scalar type, one header per op family. CpuBackend (lib/ops/<family>.cpp) calls the float
// instantiations; the tests instantiate double for finite-difference gradient checks.
#pragma once
#include "attention.h"
#include "concat.h"
#include "conv.h"
#include "diffusion_ops.h"
#include "dropout.h"
#include "elementwise.h"
#include "embedding.h"
#include "gemm.h"
#include "groupnorm.h"
#include "linear.h"
#include "loss.h"
#include "optimizer.h"
#include "pool.h"
#include "reduce.h"
#include "resample.h"
