// Classifier-free guidance (Ho & Salimans 2022): training drops labels to a null class, sampling
// mixes the conditional and the unconditional prediction.
//
// Training: with --class-dropout P each sample's label is replaced by the null class (label
// num_classes, the extra row of label_emb) with probability P, decided by
// uniform01_f64(rng_key(seed, ClassDropout, step), ClassDropout, b) < P for sample b of the step's
// (global) batch: a pure function of (seed, step, b), like every other draw of a step, so --resume
// stays bitwise exact and the decision does not depend on threads or prefetch.
//
// Sampling: eps = eps_u + W (eps_c - eps_u), computed as W eps_c + (1 - W) eps_u (so W = 1 gives
// eps_c and W = 0 gives eps_u exactly), with both halves from ONE forward pass of batch 2B:
// [x; x] at [t; t] with labels [y; null]. With learned sigma the mean channels (eps, or x0 with
// predict_xstart: the guidance is the same linear mix) are guided and the variance channels come
// from the conditional half (GLIDE's and diffusers' convention). The guided net is an ordinary
// SamplerNet, so DDPM and DDIM (and every step rule of the sampler) use it unchanged.
#pragma once
#include <cstdint>

#include "checkpoint.h"
#include "engine.h"
#include "sampler.h"

namespace unet {

// Whether sample b of `step` has its label dropped (replaced by the null class) at rate p.
bool class_dropped(uint64_t seed, int64_t step, int64_t b, double p);

// Replaces labels[i] (sample first + i of the step's global batch: a data-parallel rank passes the
// offset of its slice) by null_label where class_dropped(seed, step, first + i, p), i = 0..n-1;
// returns how many were replaced. p = 0 changes nothing.
int apply_class_dropout(uint64_t seed, int64_t step, int64_t first, int n, double p, int32_t null_label,
                        int32_t* labels);

// Gives a class-conditional checkpoint without a null class one: label_emb gains row num_classes,
// drawn N(0,1) as `unet init --seed seed` draws a fresh null-class model's (so a model made by
// init without the row, then given it here, equals one made with it). Only `model` is kept (the
// EMA and optimizer state, which a new run does not continue, are dropped).
void add_null_class(Checkpoint& ck, uint64_t seed);

// The guided net: `cond` is the class-conditional net (its denoise planned for batches of up to
// 2 * max_batch), null_label its null class, w the guidance scale. The result takes batches of up
// to max_batch and holds its own engine buffers for 2 * max_batch samples.
SamplerNet classifier_free_guidance(Engine& eng, SamplerNet cond, int max_batch, float w, int32_t null_label);

}  // namespace unet
