#include "diffusion.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "util.h"

namespace unet {

std::vector<double> linear_betas(int T) {
  if (T < 1) throw UserError("diffusion: diffusion_steps must be >= 1, got " + std::to_string(T));
  // Same operation order as guided-diffusion + numpy.linspace: start + i*step, last = stop.
  const double scale = 1000.0 / T;
  const double start = scale * 0.0001, stop = scale * 0.02;
  std::vector<double> b(T);
  if (T == 1) {
    b[0] = start;
    return b;
  }
  const double step = (stop - start) / (T - 1);
  for (int i = 0; i < T; ++i) b[i] = static_cast<double>(i) * step + start;
  b[T - 1] = stop;
  return b;
}

std::vector<double> cosine_betas(int T) {
  if (T < 1) throw UserError("diffusion: diffusion_steps must be >= 1, got " + std::to_string(T));
  auto abar = [](double s) {
    const double c = std::cos((s + 0.008) / 1.008 * M_PI / 2);
    return c * c;
  };
  std::vector<double> b(T);
  for (int i = 0; i < T; ++i) {
    const double t1 = static_cast<double>(i) / T, t2 = static_cast<double>(i + 1) / T;
    b[i] = std::min(1 - abar(t2) / abar(t1), 0.999);
  }
  return b;
}

std::vector<double> named_betas(const std::string& schedule, int T) {
  if (schedule == "linear") return linear_betas(T);
  if (schedule == "cosine") return cosine_betas(T);
  throw UserError("diffusion: unknown noise schedule '" + schedule + "' (use linear or cosine)");
}

std::vector<int> space_timesteps_ddim(int T, int N) {
  if (N < 1 || N > T)
    throw UserError("ddim: cannot take " + std::to_string(N) + " steps of a " + std::to_string(T) +
                    "-step diffusion");
  for (int s = 1; s <= T; ++s) {
    if ((T + s - 1) / s == N) {  // len(range(0, T, s))
      std::vector<int> v;
      for (int t = 0; t < T; t += s) v.push_back(t);
      return v;
    }
  }
  throw UserError("ddim: cannot create exactly " + std::to_string(N) + " steps of " + std::to_string(T) +
                  " with an integer stride");
}

// Python's round(): nearest integer, ties to even.
static int round_half_even(double x) {
  const double f = std::floor(x);
  const double d = x - f;
  if (d > 0.5) return static_cast<int>(f) + 1;
  if (d < 0.5) return static_cast<int>(f);
  const int fi = static_cast<int>(f);
  return (fi % 2 == 0) ? fi : fi + 1;
}

std::vector<int> space_timesteps_ddpm(int T, int N) {
  if (N < 1 || N > T)
    throw UserError("ddpm: cannot take " + std::to_string(N) + " steps of a " + std::to_string(T) +
                    "-step diffusion");
  const double frac = N <= 1 ? 1.0 : static_cast<double>(T - 1) / (N - 1);
  double cur = 0.0;
  std::set<int> kept;  // guided-diffusion returns a set; duplicates cannot occur for N <= T
  for (int i = 0; i < N; ++i) {
    kept.insert(round_half_even(cur));
    cur += frac;
  }
  return std::vector<int>(kept.begin(), kept.end());
}

std::vector<int> sampler_timesteps(const std::string& sampler, int T, int steps) {
  if (steps < 0) throw UserError("sample: --steps must be >= 0, got " + std::to_string(steps));
  const int N = steps == 0 ? T : steps;
  if (sampler == "ddim") return space_timesteps_ddim(T, N);
  if (sampler == "ddpm") return space_timesteps_ddpm(T, N);
  throw UserError("sample: unknown sampler '" + sampler + "' (use ddpm or ddim)");
}

std::vector<int> space_timesteps(int T, const std::string& spec) {
  auto bad = [&](const std::string& why) {  // (a long spec shown by its start)
    return UserError("--timestep-respacing '" + (spec.size() > 48 ? spec.substr(0, 40) + "..." : spec) +
                     "': " + why);
  };
  // A count as Python's int() reads one: optional blanks around decimal digits.
  auto count = [&](const std::string& s) {
    size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    if (a == std::string::npos) throw bad("an empty count");
    const std::string d = s.substr(a, b - a + 1);
    if (d.size() > 9 || d.find_first_not_of("0123456789") != std::string::npos)
      throw bad("'" + d + "' is not a step count (use N, N1,N2,... or ddimN)");
    return std::stoi(d);
  };
  if (T < 1) throw bad("the model has no diffusion steps");
  if (spec.rfind("ddim", 0) == 0) {
    const int n = count(spec.substr(4));
    const std::string of = " of the model's " + std::to_string(T) + " diffusion steps";
    if (n < 1 || n > T) throw bad("cannot take " + std::to_string(n) + " DDIM steps" + of);
    try {
      return space_timesteps_ddim(T, n);
    } catch (const UserError&) {
      throw bad("no integer stride takes exactly " + std::to_string(n) + " steps" + of);
    }
  }
  std::vector<int> counts;
  for (size_t a = 0;;) {
    const size_t c = spec.find(',', a);
    counts.push_back(count(spec.substr(a, c == std::string::npos ? std::string::npos : c - a)));
    if (c == std::string::npos) break;
    a = c + 1;
  }
  const int k = (int)counts.size(), per = T / k, extra = T % k;
  std::vector<int> kept;
  for (int i = 0, start = 0; i < k; ++i) {
    const int size = per + (i < extra ? 1 : 0);
    if (counts[i] > size)
      throw bad(k == 1 ? "cannot take " + std::to_string(counts[i]) + " steps of the model's " + std::to_string(T) +
                             " diffusion steps"
                       : "section " + std::to_string(i + 1) + " of " + std::to_string(k) + " has " +
                             std::to_string(size) + " of the model's " + std::to_string(T) +
                             " diffusion steps, fewer than its count " + std::to_string(counts[i]));
    if (counts[i] > 0)
      for (int t : space_timesteps_ddpm(size, counts[i])) kept.push_back(start + t);
    start += size;
  }
  if (kept.empty()) throw bad("keeps no timestep");
  return kept;  // ascending: sections in order, each ascending
}

static std::vector<int> identity_map(int T) {
  std::vector<int> m(std::max(T, 0));
  for (int i = 0; i < T; ++i) m[i] = i;
  return m;
}

Diffusion::Diffusion(int T, const std::string& schedule, bool learn_sigma)
    : Diffusion(named_betas(schedule, T), identity_map(T), learn_sigma) {}

Diffusion::Diffusion(std::vector<double> b, std::vector<int> map, bool learn_sigma)
    : betas(std::move(b)), timestep_map(std::move(map)), learn_sigma_(learn_sigma) {
  if (betas.empty() || betas.size() != timestep_map.size())
    throw UserError("diffusion: betas and timestep map must be non-empty and of equal length");
  // guided-diffusion asserts the same; e.g. the linear schedule with T < 50 has betas > 1.
  for (size_t i = 0; i < betas.size(); ++i)
    if (!(betas[i] > 0 && betas[i] <= 1))
      throw UserError("diffusion: beta[" + std::to_string(i) + "] = " + std::to_string(betas[i]) +
                      " is outside (0, 1] (too few diffusion steps for this schedule?)");
  compute_coefficients();
}

void Diffusion::compute_coefficients() {
  const size_t T = betas.size();
  alphas_cumprod.resize(T);
  double p = 1.0;
  for (size_t i = 0; i < T; ++i) alphas_cumprod[i] = p = p * (1.0 - betas[i]);
  alphas_cumprod_prev.resize(T);
  alphas_cumprod_next.resize(T);
  for (size_t i = 0; i < T; ++i) {
    alphas_cumprod_prev[i] = i == 0 ? 1.0 : alphas_cumprod[i - 1];
    alphas_cumprod_next[i] = i + 1 < T ? alphas_cumprod[i + 1] : 0.0;
  }
  sqrt_alphas_cumprod.resize(T);
  sqrt_one_minus_alphas_cumprod.resize(T);
  log_one_minus_alphas_cumprod.resize(T);
  sqrt_recip_alphas_cumprod.resize(T);
  sqrt_recipm1_alphas_cumprod.resize(T);
  posterior_variance.resize(T);
  posterior_log_variance_clipped.resize(T);
  posterior_mean_coef1.resize(T);
  posterior_mean_coef2.resize(T);
  for (size_t i = 0; i < T; ++i) {
    const double ab = alphas_cumprod[i], abp = alphas_cumprod_prev[i], b = betas[i];
    sqrt_alphas_cumprod[i] = std::sqrt(ab);
    sqrt_one_minus_alphas_cumprod[i] = std::sqrt(1.0 - ab);
    log_one_minus_alphas_cumprod[i] = std::log(1.0 - ab);
    sqrt_recip_alphas_cumprod[i] = std::sqrt(1.0 / ab);
    sqrt_recipm1_alphas_cumprod[i] = std::sqrt(1.0 / ab - 1);
    posterior_variance[i] = b * (1.0 - abp) / (1.0 - ab);
    posterior_mean_coef1[i] = b * std::sqrt(abp) / (1.0 - ab);
    posterior_mean_coef2[i] = (1.0 - abp) * std::sqrt(1.0 - b) / (1.0 - ab);
  }
  for (size_t i = 0; i < T; ++i) {
    const double v = T == 1 ? betas[0] : (i == 0 ? posterior_variance[1] : posterior_variance[i]);
    posterior_log_variance_clipped[i] = std::log(v);
  }
}

Diffusion Diffusion::respaced(const std::vector<int>& keep) const {
  std::vector<int> k(keep);
  std::sort(k.begin(), k.end());
  if (k.empty() || std::adjacent_find(k.begin(), k.end()) != k.end() || k.front() < 0 ||
      k.back() >= num_timesteps())
    throw UserError("diffusion: respacing needs distinct timesteps in [0, " +
                    std::to_string(num_timesteps()) + ")");
  std::vector<double> nb;
  std::vector<int> map;
  double last = 1.0;
  for (int t : k) {
    nb.push_back(1 - alphas_cumprod[t] / last);
    last = alphas_cumprod[t];
    map.push_back(timestep_map[t]);
  }
  Diffusion d(std::move(nb), std::move(map), learn_sigma_);
  d.predict_xstart = predict_xstart;
  return d;
}

void Diffusion::q_sample_coeffs(const float* t, int B, float* sqrt_ab, float* sqrt_1mab) const {
  for (int b = 0; b < B; ++b) {
    const int k = static_cast<int>(t[b]);
    sqrt_ab[b] = static_cast<float>(sqrt_alphas_cumprod.at(k));
    sqrt_1mab[b] = static_cast<float>(sqrt_one_minus_alphas_cumprod.at(k));
  }
}

Diffusion::DdpmCoeffs Diffusion::ddpm_coeffs(int k) const {
  DdpmCoeffs c;
  c.x0_from_xt = sqrt_recip_alphas_cumprod.at(k);
  c.x0_from_eps = sqrt_recipm1_alphas_cumprod[k];
  c.mean_x0 = posterior_mean_coef1[k];
  c.mean_xt = posterior_mean_coef2[k];
  // FIXED_LARGE of the (respaced) process: [posterior_variance[1], betas[1:]].
  c.fixed_large_log_var =
      std::log(k == 0 ? (num_timesteps() > 1 ? posterior_variance[1] : betas[0]) : betas[k]);
  c.min_log = posterior_log_variance_clipped[k];
  c.max_log = std::log(betas[k]);
  c.noise = k != 0;
  return c;
}

Diffusion::DdimCoeffs Diffusion::ddim_coeffs(int k, double eta) const {
  DdimCoeffs c;
  c.x0_from_xt = sqrt_recip_alphas_cumprod.at(k);
  c.x0_from_eps = sqrt_recipm1_alphas_cumprod[k];
  c.abar = alphas_cumprod[k];
  c.abar_prev = alphas_cumprod_prev[k];
  c.sigma = eta * std::sqrt((1 - c.abar_prev) / (1 - c.abar)) * std::sqrt(1 - c.abar / c.abar_prev);
  // For 0 <= eta <= 1 the radicand is >= 0 in exact arithmetic; max() only absorbs rounding.
  c.eps_coef = std::sqrt(std::max(0.0, 1 - c.abar_prev - c.sigma * c.sigma));
  c.out_x0 = std::sqrt(c.abar_prev) - c.eps_coef / c.x0_from_eps;
  c.out_xt = c.eps_coef * c.x0_from_xt / c.x0_from_eps;
  c.noise = k != 0 && c.sigma != 0;
  return c;
}

void Diffusion::predict_x0(Ops& ops, int k, const Tensor& x, const Tensor& eps, const Tensor& x0,
                           bool clip) const {
  const double a = sqrt_recip_alphas_cumprod.at(k), b = sqrt_recipm1_alphas_cumprod[k];
  if (predict_xstart) {
    ops.run(Copy{eps, x0});
  } else {
    ops.run(Copy{x, x0});
    ops.run(Axpbypcz{eps, x0, {}, static_cast<float>(-b), static_cast<float>(a), 0.0f});
  }
  if (clip) ops.run(Clamp{x0, -1.0f, 1.0f});
}

void Diffusion::ddpm_step(Ops& ops, int k, const Tensor& x, const Tensor& eps, const Tensor& x0,
                          const Tensor& noise, float noise_scale, bool clip, const Tensor& guide,
                          float guide_scale) const {
  const DdpmCoeffs c = ddpm_coeffs(k);
  predict_x0(ops, k, x, eps, x0, clip);
  if (guide.defined()) {  // mean = posterior mean + variance * grad, then the noise
    ops.run(
        Axpbypcz{x0, x, guide, static_cast<float>(c.mean_x0), static_cast<float>(c.mean_xt), guide_scale});
    if (c.noise && noise.defined()) ops.run(Axpbypcz{noise, x, {}, noise_scale, 1.0f, 0.0f});
    return;
  }
  const bool add = c.noise && noise.defined();
  ops.run(Axpbypcz{x0, x, add ? noise : Tensor{}, static_cast<float>(c.mean_x0),
                   static_cast<float>(c.mean_xt), add ? noise_scale : 0.0f});
}

void Diffusion::sample_step_coefs(int k, bool ddim, double eta, float* c) const {
  // predict_x0's Axpbypcz{eps, x0 = x, -b, a}
  c[0] = static_cast<float>(sqrt_recip_alphas_cumprod.at(k));
  c[1] = static_cast<float>(-sqrt_recipm1_alphas_cumprod[k]);
  c[5] = c[6] = 0.0f;
  if (ddim) {
    const DdimCoeffs d = ddim_coeffs(k, eta);
    c[2] = static_cast<float>(d.out_x0), c[3] = static_cast<float>(d.out_xt);
    c[4] = d.noise ? static_cast<float>(d.sigma) : 0.0f;
    return;
  }
  const DdpmCoeffs d = ddpm_coeffs(k);
  c[2] = static_cast<float>(d.mean_x0), c[3] = static_cast<float>(d.mean_xt);
  c[4] = !d.noise ? 0.0f : learn_sigma_ ? 1.0f : static_cast<float>(fixed_large_std(k));
  if (learn_sigma_) {
    const LogRange r = learned_range_bounds(k);
    c[5] = r.min_log, c[6] = r.max_log;
  }
}

double Diffusion::fixed_large_variance(int k) const { return std::exp(ddpm_coeffs(k).fixed_large_log_var); }

void Diffusion::ddim_step(Ops& ops, int k, double eta, const Tensor& x, const Tensor& eps, const Tensor& x0,
                          const Tensor& z, bool clip, const Tensor& guide_grad) const {
  const DdimCoeffs c = ddim_coeffs(k, eta);
  predict_x0(ops, k, x, eps, x0, clip);
  if (guide_grad.defined())
    ops.run(Axpbypcz{guide_grad,
                     x0,
                     {},
                     static_cast<float>(c.x0_from_eps * std::sqrt(1.0 - alphas_cumprod[k])),
                     1.0f,
                     0.0f});
  const bool add = c.noise && z.defined();
  ops.run(Axpbypcz{x0, x, add ? z : Tensor{}, static_cast<float>(c.out_x0), static_cast<float>(c.out_xt),
                   add ? static_cast<float>(c.sigma) : 0.0f});
}

double Diffusion::fixed_large_std(int k) const { return std::exp(0.5 * ddpm_coeffs(k).fixed_large_log_var); }

Diffusion::LogRange Diffusion::learned_range_bounds(int k) const {
  return {static_cast<float>(posterior_log_variance_clipped.at(k)), static_cast<float>(std::log(betas[k]))};
}

}  // namespace unet
