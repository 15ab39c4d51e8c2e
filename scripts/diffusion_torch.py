"""guided-diffusion's diffusion math (SPEC §4) in numpy/PyTorch, for golden files and parity checks.

Mirrors guided-diffusion's GaussianDiffusion / SpacedDiffusion for the configurations `unet` uses
(eps or x0 prediction; FIXED_LARGE variance, or LEARNED_RANGE with learn_sigma; optional timestep
rescaling): float64 coefficient arrays, looked up per timestep and cast to float32 before they
touch a tensor, exactly as guided-diffusion's _extract_into_tensor does, and the same operation
order in every step. The network is called with the ORIGINAL timestep of each kept step.

The training objective and the bound (losses.py and gaussian_diffusion.py): normal_kl,
approx_standard_normal_cdf, discretized_gaussian_log_likelihood, Diffusion.vb_terms_bpd,
Diffusion.training_losses (MSE, hybrid with the stop-gradient on the mean, RESCALED_MSE,
RESCALED_KL), Diffusion.prior_bpd and Diffusion.calc_bpd_loop; resample.py's
LossSecondMomentResampler.

    import torch, unet_torch, diffusion_torch
    model = unet_torch.create_model(...)            # helper B's guided-diffusion UNet
    x0 = diffusion_torch.ddim_sample(model, noise, steps=50)   # noise [N,C,H,W] -> x_0 [N,C,H,W]

It also reproduces `unet`'s counter-based RNG (lib/rng.h): `unet_normal(seed, stream, index)` and
`unet_step_noise(...)`, so a DDPM or eta>0 DDIM run can use the very noise `unet sample` draws.
"""

import math

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------
# schedules and respacing


def get_named_beta_schedule(schedule_name, num_diffusion_timesteps):
    """float64 betas: "linear" (Ho et al., scaled by 1000/T) or "cosine" (Nichol & Dhariwal)."""
    T = num_diffusion_timesteps
    if schedule_name == "linear":
        scale = 1000 / T
        return np.linspace(scale * 0.0001, scale * 0.02, T, dtype=np.float64)
    if schedule_name == "cosine":
        def alpha_bar(s):
            return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2
        return np.array([min(1 - alpha_bar((i + 1) / T) / alpha_bar(i / T), 0.999) for i in range(T)])
    raise ValueError(f"unknown beta schedule: {schedule_name}")


def space_timesteps(num_timesteps, section_counts):
    """The kept timesteps (a set), as guided-diffusion: "ddimN" = smallest integer stride giving
    exactly N steps; a list/comma string of counts = equal sections, each taking round(x_i),
    x_{i+1} = x_i + (size-1)/(count-1) accumulated in float64 (Python round: half to even)."""
    if isinstance(section_counts, str):
        if section_counts.startswith("ddim"):
            want = int(section_counts[len("ddim"):])
            for stride in range(1, num_timesteps):
                if len(range(0, num_timesteps, stride)) == want:
                    return set(range(0, num_timesteps, stride))
            raise ValueError(f"cannot create exactly {want} steps with an integer stride")
        section_counts = [int(x) for x in section_counts.split(",")]
    size_per, extra = divmod(num_timesteps, len(section_counts))
    start, kept = 0, []
    for i, count in enumerate(section_counts):
        size = size_per + (1 if i < extra else 0)
        if size < count:
            raise ValueError(f"cannot divide section of {size} steps into {count}")
        frac_stride = 1 if count <= 1 else (size - 1) / (count - 1)
        cur = 0.0
        for _ in range(count):
            kept.append(start + round(cur))
            cur += frac_stride
        start += size
    return set(kept)


def sampler_timesteps(sampler, T, steps):
    """`unet sample`'s choice: steps 0 = all T; ddim -> "ddimN", ddpm -> one section of N."""
    n = T if steps == 0 else steps
    if sampler == "ddim":
        return space_timesteps(T, f"ddim{n}")
    if sampler == "ddpm":
        return space_timesteps(T, [n])
    raise ValueError(sampler)


# ---------------------------------------------------------------------------------------------
# losses.py


def normal_kl(mean1, logvar1, mean2, logvar2):
    """KL(N(mean1, exp(logvar1)) || N(mean2, exp(logvar2))), elementwise, in nats."""
    tensor = next(o for o in (mean1, logvar1, mean2, logvar2) if isinstance(o, torch.Tensor))
    logvar1, logvar2 = [x if isinstance(x, torch.Tensor) else torch.tensor(x).to(tensor) for x in (logvar1, logvar2)]
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2)
                  + ((mean1 - mean2) ** 2) * torch.exp(-logvar2))


def approx_standard_normal_cdf(x):
    return 0.5 * (1.0 + torch.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * torch.pow(x, 3))))


def discretized_gaussian_log_likelihood(x, *, means, log_scales):
    """log-likelihood (nats) of uint8 images rescaled to [-1, 1] under a Gaussian discretized to
    their 256 bins (the edge bins open-ended)."""
    assert x.shape == means.shape == log_scales.shape
    centered_x = x - means
    inv_stdv = torch.exp(-log_scales)
    plus_in = inv_stdv * (centered_x + 1.0 / 255.0)
    cdf_plus = approx_standard_normal_cdf(plus_in)
    min_in = inv_stdv * (centered_x - 1.0 / 255.0)
    cdf_min = approx_standard_normal_cdf(min_in)
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    cdf_delta = cdf_plus - cdf_min
    return torch.where(x < -0.999, log_cdf_plus,
                       torch.where(x > 0.999, log_one_minus_cdf_min, torch.log(cdf_delta.clamp(min=1e-12))))


def mean_flat(t):
    return t.mean(dim=list(range(1, len(t.shape))))


# None: coefficients stay float32 tensors, as guided-diffusion's. The float64 reference runs
# (_objective) set torch.float64: the same float32-rounded values, but no float32 arithmetic where
# two coefficients meet (e.g. normal_kl's logvar2 - logvar1 with a fixed variance).
_EXTRACT_DTYPE = None


def _extract(arr, t, shape):
    """arr[t] as float32, broadcast to `shape` (guided-diffusion's _extract_into_tensor)."""
    res = torch.from_numpy(arr).to(device=t.device)[t].float()
    if _EXTRACT_DTYPE is not None:
        res = res.to(_EXTRACT_DTYPE)
    while len(res.shape) < len(shape):
        res = res[..., None]
    return res.expand(shape)


class Diffusion:
    """A (possibly respaced) Gaussian diffusion. `use_timesteps` None = the base process; else the
    kept original timesteps, with betas recomputed as 1 - abar_t/abar_prev (SpacedDiffusion)."""

    def __init__(self, T=1000, schedule="linear", learn_sigma=False, use_timesteps=None, predict_xstart=False,
                 rescale_timesteps=False, use_kl=False, rescale_learned_sigmas=False):
        base = get_named_beta_schedule(schedule, T)
        self.learn_sigma = learn_sigma
        self.predict_xstart = predict_xstart
        self.rescale_timesteps = rescale_timesteps
        # create_gaussian_diffusion's loss type
        self.loss_type = "rescaled_kl" if use_kl else "rescaled_mse" if rescale_learned_sigmas else "mse"
        self.original_num_steps = T
        if use_timesteps is None:
            betas, self.timestep_map = base, list(range(T))
        else:
            keep = set(use_timesteps)
            base_abar = np.cumprod(1.0 - base, axis=0)
            last, nb, self.timestep_map = 1.0, [], []
            for i, ab in enumerate(base_abar):
                if i in keep:
                    nb.append(1 - ab / last)
                    last = ab
                    self.timestep_map.append(i)
            betas = np.array(nb)
        betas = np.array(betas, dtype=np.float64)
        assert (betas > 0).all() and (betas <= 1).all()
        self.betas = betas
        self.num_timesteps = len(betas)
        alphas = 1.0 - betas
        self.alphas_cumprod = np.cumprod(alphas, axis=0)
        self.alphas_cumprod_prev = np.append(1.0, self.alphas_cumprod[:-1])
        self.alphas_cumprod_next = np.append(self.alphas_cumprod[1:], 0.0)
        self.sqrt_alphas_cumprod = np.sqrt(self.alphas_cumprod)
        self.sqrt_one_minus_alphas_cumprod = np.sqrt(1.0 - self.alphas_cumprod)
        self.log_one_minus_alphas_cumprod = np.log(1.0 - self.alphas_cumprod)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod - 1)
        self.posterior_variance = betas * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        if self.num_timesteps > 1:
            self.posterior_log_variance_clipped = np.log(
                np.append(self.posterior_variance[1], self.posterior_variance[1:]))
            fixed_large = np.append(self.posterior_variance[1], self.betas[1:])
        else:  # guided-diffusion fails here; the values are unused (no noise at the last step)
            self.posterior_log_variance_clipped = np.log(self.betas.copy())
            fixed_large = self.betas.copy()
        self.fixed_large_variance = fixed_large
        self.fixed_large_log_variance = np.log(fixed_large)
        self.posterior_mean_coef1 = betas * np.sqrt(self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_mean_coef2 = ((1.0 - self.alphas_cumprod_prev) * np.sqrt(alphas)
                                     / (1.0 - self.alphas_cumprod))

    # -- training ------------------------------------------------------------------------------
    def q_sample(self, x_start, t, noise):
        return (_extract(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
                + _extract(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise)

    # -- model output -> mean / variance / x0 ----------------------------------------------------
    def _call(self, model, x, t, labels):
        t_orig = torch.tensor(self.timestep_map, device=t.device, dtype=t.dtype)[t]
        kwargs = {} if labels is None else {"y": labels}
        t_model = t_orig.float()
        if self.rescale_timesteps:  # _WrappedModel: new_ts.float() * (1000.0 / original_num_steps)
            t_model = t_model * (1000.0 / self.original_num_steps)
        return model(x, t_model, **kwargs)

    def predict_xstart_from_eps(self, x_t, t, eps):
        return (_extract(self.sqrt_recip_alphas_cumprod, t, x_t.shape) * x_t
                - _extract(self.sqrt_recipm1_alphas_cumprod, t, x_t.shape) * eps)

    def predict_eps_from_xstart(self, x_t, t, pred_xstart):
        return ((_extract(self.sqrt_recip_alphas_cumprod, t, x_t.shape) * x_t - pred_xstart)
                / _extract(self.sqrt_recipm1_alphas_cumprod, t, x_t.shape))

    def q_posterior_mean(self, x_start, x_t, t):
        return (_extract(self.posterior_mean_coef1, t, x_t.shape) * x_start
                + _extract(self.posterior_mean_coef2, t, x_t.shape) * x_t)

    def p_mean_variance(self, model, x, t, clip=True, labels=None, model_output=None):
        B, C = x.shape[:2]
        out = self._call(model, x, t, labels) if model_output is None else model_output
        if self.learn_sigma:
            assert out.shape == (B, 2 * C, *x.shape[2:])
            out, var_values = torch.split(out, C, dim=1)
            min_log = _extract(self.posterior_log_variance_clipped, t, x.shape)
            max_log = _extract(np.log(self.betas), t, x.shape)
            frac = (var_values + 1) / 2  # [-1, 1] -> [min_var, max_var]
            log_variance = frac * max_log + (1 - frac) * min_log
        else:
            log_variance = _extract(self.fixed_large_log_variance, t, x.shape)
        pred_xstart = out if self.predict_xstart else self.predict_xstart_from_eps(x, t, out)
        if clip:
            pred_xstart = pred_xstart.clamp(-1, 1)
        mean = self.q_posterior_mean(pred_xstart, x, t)
        return {"mean": mean, "log_variance": log_variance, "pred_xstart": pred_xstart, "eps": out}

    def q_posterior_mean_variance(self, x_start, x_t, t):
        mean = self.q_posterior_mean(x_start, x_t, t)
        return mean, _extract(self.posterior_variance, t, x_t.shape), \
            _extract(self.posterior_log_variance_clipped, t, x_t.shape)

    # -- the objective and the bound (gaussian_diffusion.py) ---------------------------------------
    def vb_terms_bpd(self, model, x_start, x_t, t, clip=True, labels=None, model_output=None):
        """_vb_terms_bpd: {"output": [N] bits (KL, or the decoder NLL where t == 0), "pred_xstart"}."""
        true_mean, _, true_log_variance_clipped = self.q_posterior_mean_variance(x_start, x_t, t)
        out = self.p_mean_variance(model, x_t, t, clip, labels, model_output=model_output)
        kl = normal_kl(true_mean, true_log_variance_clipped, out["mean"], out["log_variance"])
        kl = mean_flat(kl) / np.log(2.0)
        decoder_nll = -discretized_gaussian_log_likelihood(x_start, means=out["mean"],
                                                            log_scales=0.5 * out["log_variance"])
        decoder_nll = mean_flat(decoder_nll) / np.log(2.0)
        return {"output": torch.where((t == 0), decoder_nll, kl), "pred_xstart": out["pred_xstart"]}

    def training_losses(self, model_output, x_start, t, noise):
        """training_losses for a given model output (the model's call on q_sample(x_start, t, noise)
        with the timesteps _call gives it): {"loss", "mse", "vb"} each [N]."""
        x_t = self.q_sample(x_start, t, noise)
        terms = {}
        if self.loss_type == "rescaled_kl":
            terms["loss"] = self.vb_terms_bpd(None, x_start, x_t, t, clip=False, model_output=model_output)["output"]
            terms["loss"] = terms["loss"] * self.num_timesteps
            return terms
        C = x_start.shape[1]
        if self.learn_sigma:
            mean_out, var_values = torch.split(model_output, C, dim=1)
            # Learn the variance using the variational bound, but don't let it affect the mean.
            frozen_out = torch.cat([mean_out.detach(), var_values], dim=1)
            terms["vb"] = self.vb_terms_bpd(None, x_start, x_t, t, clip=False, model_output=frozen_out)["output"]
            if self.loss_type == "rescaled_mse":
                terms["vb"] = terms["vb"] * (self.num_timesteps / 1000.0)
        else:
            mean_out = model_output
        target = x_start if self.predict_xstart else noise
        terms["mse"] = mean_flat((target - mean_out) ** 2)
        terms["loss"] = terms["mse"] + terms["vb"] if "vb" in terms else terms["mse"]
        return terms

    def prior_bpd(self, x_start):
        t = torch.full((x_start.shape[0],), self.num_timesteps - 1, dtype=torch.long)
        qt_mean = _extract(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
        qt_log_variance = _extract(self.log_one_minus_alphas_cumprod, t, x_start.shape)
        return mean_flat(normal_kl(qt_mean, qt_log_variance, 0.0, 0.0)) / np.log(2.0)

    def calc_bpd_loop(self, model, x_start, clip=True, labels=None, noise_fn=None):
        """The whole bound: {"total_bpd", "prior_bpd", "vb", "xstart_mse", "mse"} ([N] or [N, T]);
        noise_fn(t, shape) gives the q_sample noise of timestep t (default torch.randn)."""
        vb, xstart_mse, mse = [], [], []
        for k in list(range(self.num_timesteps))[::-1]:
            t = torch.full((x_start.shape[0],), k, dtype=torch.long)
            noise = torch.randn_like(x_start) if noise_fn is None else noise_fn(k, tuple(x_start.shape)).to(x_start)
            x_t = self.q_sample(x_start, t, noise)
            with torch.no_grad():
                out = self.vb_terms_bpd(model, x_start, x_t, t, clip=clip, labels=labels)
            vb.append(out["output"])
            xstart_mse.append(mean_flat((out["pred_xstart"] - x_start) ** 2))
            eps = self.predict_eps_from_xstart(x_t, t, out["pred_xstart"])
            mse.append(mean_flat((eps - noise) ** 2))
        vb, xstart_mse, mse = (torch.stack(v[::-1], dim=1) for v in (vb, xstart_mse, mse))  # column t = timestep t
        prior = self.prior_bpd(x_start)
        return {"total_bpd": vb.sum(dim=1) + prior, "prior_bpd": prior, "vb": vb, "xstart_mse": xstart_mse,
                "mse": mse}

    # -- steps -----------------------------------------------------------------------------------
    def p_sample(self, model, x, t, z, clip=True, labels=None):
        """One ancestral step; z is the N(0,1) noise (unused where t == 0)."""
        out = self.p_mean_variance(model, x, t, clip, labels)
        nonzero = (t != 0).float().view(-1, *([1] * (x.dim() - 1)))
        return out["mean"] + nonzero * torch.exp(0.5 * out["log_variance"]) * z

    def ddim_step(self, model, x, t, z, eta=0.0, clip=True, labels=None):
        """One DDIM step (eq. 12); eps re-derived from the (clipped) x0; z used only for eta > 0."""
        out = self.p_mean_variance(model, x, t, clip, labels)
        eps = self.predict_eps_from_xstart(x, t, out["pred_xstart"])
        alpha_bar = _extract(self.alphas_cumprod, t, x.shape)
        alpha_bar_prev = _extract(self.alphas_cumprod_prev, t, x.shape)
        sigma = (eta * torch.sqrt((1 - alpha_bar_prev) / (1 - alpha_bar))
                 * torch.sqrt(1 - alpha_bar / alpha_bar_prev))
        mean_pred = out["pred_xstart"] * torch.sqrt(alpha_bar_prev) + torch.sqrt(1 - alpha_bar_prev - sigma ** 2) * eps
        nonzero = (t != 0).float().view(-1, *([1] * (x.dim() - 1)))
        if z is None:
            z = torch.zeros_like(x)
        return mean_pred + nonzero * sigma * z

    # -- loops -----------------------------------------------------------------------------------
    def ddim_loop(self, model, noise, eta=0.0, clip=True, labels=None, step_noise=None):
        x = noise
        for k in reversed(range(self.num_timesteps)):
            t = torch.full((x.shape[0],), k, device=x.device, dtype=torch.long)
            z = None if eta == 0 else _noise(step_noise, k, self.timestep_map[k], x)
            with torch.no_grad():
                x = self.ddim_step(model, x, t, z, eta, clip, labels)
        return x

    def p_sample_loop(self, model, noise, clip=True, labels=None, step_noise=None):
        x = noise
        for k in reversed(range(self.num_timesteps)):
            t = torch.full((x.shape[0],), k, device=x.device, dtype=torch.long)
            z = _noise(step_noise, k, self.timestep_map[k], x)
            with torch.no_grad():
                x = self.p_sample(model, x, t, z, clip, labels)
        return x


def _noise(step_noise, k, t_orig, x):
    if step_noise is None:
        return torch.randn_like(x)
    return step_noise(k, t_orig, tuple(x.shape)).to(device=x.device, dtype=x.dtype)


def classifier_free_model(model, scale, null_label, channels):
    """Classifier-free guidance (Ho & Salimans; GLIDE's and diffusers' convention) around a
    class-conditional `model(x, t, y=labels)`: two forward passes, one with the labels and one with
    the null label; the first `channels` output channels (eps, or x0 with predict_xstart) become
    eps_u + scale * (eps_c - eps_u), the rest (the learned variance) are the conditional pass's."""
    def fn(x, t, y=None):
        c = model(x, t, y=y)
        u = model(x, t, y=torch.full_like(y, null_label))
        eps = u[:, :channels] + scale * (c[:, :channels] - u[:, :channels])
        return torch.cat([eps, c[:, channels:]], dim=1)
    return fn


def ddim_sample(model, noise, steps, eta=0.0, clip=True, labels=None, T=1000, schedule="linear",
                learn_sigma=False, step_noise=None):
    """DDIM from x_T = noise [N,C,H,W] with `steps` steps (0 = all T); returns x_0 [N,C,H,W].
    step_noise(k, t_orig, shape) supplies z for eta > 0 (default torch.randn)."""
    d = Diffusion(T, schedule, learn_sigma, sampler_timesteps("ddim", T, steps))
    return d.ddim_loop(model, noise, eta, clip, labels, step_noise)


def ddpm_sample(model, noise, steps=0, clip=True, labels=None, T=1000, schedule="linear",
                learn_sigma=False, step_noise=None):
    """Ancestral sampling from x_T = noise, respaced to `steps` (0 = all T); returns x_0."""
    d = Diffusion(T, schedule, learn_sigma, sampler_timesteps("ddpm", T, steps))
    return d.p_sample_loop(model, noise, clip, labels, step_noise)


# ---------------------------------------------------------------------------------------------
# resample.py


class LossSecondMomentResampler:
    def __init__(self, num_timesteps, history_per_term=10, uniform_prob=0.001):
        self.num_timesteps = num_timesteps
        self.history_per_term = history_per_term
        self.uniform_prob = uniform_prob
        self._loss_history = np.zeros([num_timesteps, history_per_term], dtype=np.float64)
        self._loss_counts = np.zeros([num_timesteps], dtype=np.int64)

    def weights(self):
        if not self._warmed_up():
            return np.ones([self.num_timesteps], dtype=np.float64)
        weights = np.sqrt(np.mean(self._loss_history ** 2, axis=-1))
        weights /= np.sum(weights)
        weights *= 1 - self.uniform_prob
        weights += self.uniform_prob / len(weights)
        return weights

    def update_with_all_losses(self, ts, losses):
        for t, loss in zip(ts, losses):
            if self._loss_counts[t] == self.history_per_term:
                self._loss_history[t, :-1] = self._loss_history[t, 1:]
                self._loss_history[t, -1] = loss
            else:
                self._loss_history[t, self._loss_counts[t]] = loss
                self._loss_counts[t] += 1

    def _warmed_up(self):
        return (self._loss_counts == self.history_per_term).all()

    def sample_with(self, u):
        """ScheduleSampler.sample with the uniform draws u given (np.random.choice's inverse CDF):
        (timesteps, importance weights as float32)."""
        w = self.weights()
        p = w / np.sum(w)
        cdf = p.cumsum()
        cdf /= cdf[-1]
        idx = cdf.searchsorted(u, side="right")
        return idx, (1 / (len(p) * p[idx])).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# unet's counter-based RNG (lib/rng.h), vectorised over indices with wrapping uint64 arithmetic

STREAMS = dict(TrainNoise=1, TrainTimestep=2, TrainFlip=3, Shuffle=4, Dropout=5, SampleInit=6,
               SampleStep=7, SampleLabel=8, TrainTimestepIS=9, EvalNoise=10, ClassDropout=11)
_M = (1 << 64) - 1


def _u64(x):
    return np.asarray(x, dtype=np.uint64)


def _mix64(z):
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def hash64(seed, a, b=0):
    with np.errstate(over="ignore"):
        h = _mix64(_u64(seed) + np.uint64(0x9E3779B97F4A7C15))
        h = _mix64(h ^ (_u64(a) * np.uint64(0xD1B54A32D192ED03) + np.uint64(0x8CB92BA72F3D8DD7)))
        return _mix64(h ^ (_u64(b) * np.uint64(0xAEF17502108EF2D9) + np.uint64(0x632BE59BD9B4E019)))


def rng_key(seed, stream, key):
    return hash64(_u64(seed) ^ np.uint64(0x5851F42D4C957F2D), STREAMS[stream], key)


def unet_normal(seed, stream, index):
    """float32 N(0,1) draws normal(seed, stream, index) of lib/rng.h for an array of indices."""
    index = _u64(index)
    bits = hash64(seed, STREAMS[stream], index >> np.uint64(1))
    u1 = ((bits >> np.uint64(32)).astype(np.float64) + 1.0) * (1.0 / 4294967296.0)
    u2 = (bits & np.uint64(0xFFFFFFFF)).astype(np.float64) * (1.0 / 4294967296.0)
    r = np.sqrt(-2.0 * np.log(u1))
    th = 6.283185307179586476925286766559 * u2
    return np.where((index & np.uint64(1)) == 1, r * np.sin(th), r * np.cos(th)).astype(np.float32)


def unet_initial_noise(seed, n, C, H, W):
    """x_T of `unet sample --seed` without --noise, as NCHW float32 (drawn in NHWC order)."""
    idx = np.arange(n * H * W * C, dtype=np.uint64)
    return torch.from_numpy(unet_normal(seed, "SampleInit", idx).reshape(n, H, W, C).transpose(0, 3, 1, 2).copy())


def unet_step_noise(seed, first=0):
    """A step_noise callable giving the z that `unet sample` draws at original timestep t for
    samples first, first+1, ... (NCHW)."""
    def fn(k, t_orig, shape):
        n, C, H, W = shape
        idx = np.arange(first * H * W * C, (first + n) * H * W * C, dtype=np.uint64)
        z = unet_normal(rng_key(seed, "SampleStep", t_orig), "SampleStep", idx)
        return torch.from_numpy(z.reshape(n, H, W, C).transpose(0, 3, 1, 2).copy())
    return fn


def unet_uniform01_f64(seed, stream, index):
    """uniform01_f64 of lib/rng.h: the top 53 bits of the hash, as float64 in [0, 1)."""
    bits = hash64(seed, STREAMS[stream], _u64(index))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def unet_class_dropped(seed, step, b, p):
    """Whether `unet train --class-dropout p --seed seed` replaces the label of sample b (of the global
    batch) of `step` by the null class (classifier_free.h): uniform01_f64(rng_key(seed, ClassDropout,
    step), ClassDropout, b) < p. b may be an array."""
    if not p > 0:
        return np.zeros(np.shape(b), dtype=bool)
    return unet_uniform01_f64(rng_key(seed, "ClassDropout", step), "ClassDropout", b) < p


def unet_eval_noise(seed, first=0):
    """A noise_fn for calc_bpd_loop giving the q_sample noise `unet eval --seed` draws at timestep t for
    dataset images first, first+1, ... (NCHW)."""
    def fn(t, shape):
        n, C, H, W = shape
        idx = np.arange(first * H * W * C, (first + n) * H * W * C, dtype=np.uint64)
        z = unet_normal(rng_key(seed, "EvalNoise", t), "EvalNoise", idx)
        return torch.from_numpy(z.reshape(n, H, W, C).transpose(0, 3, 1, 2).copy())
    return fn


# ---------------------------------------------------------------------------------------------
# Reference values for unet's C++ tests (tests/test_objective.cpp):
#   python3 diffusion_torch.py objective IN.h5 OUT.h5
#     IN: attrs T, schedule, learn_sigma, predict_xstart, use_kl, rescale_learned_sigmas; datasets
#         out [B,Co,H,W], x0 / noise [B,C,H,W] (float64), t int64 [B], w float64 [B].
#     OUT: loss, mse, vb [B] (training_losses; absent terms are 0), grad [B,Co,H,W] =
#         d (loss * w).mean() / d out (autograd), and the bound's terms of the same output with the
#         predicted x0 clipped (calc_bpd_loop): eval_vb, eval_x0_mse, eval_mse [B].
#   python3 diffusion_torch.py resampler IN.h5 OUT.h5
#     IN: attrs T, seed; datasets ts int64 [S, B], losses float64 [S, B] (per step, in order).
#     OUT: weights float64 [S, T] (before each step's update), t int64 [S, B] and w float32 [S, B]
#         drawn at each step with unet's uniforms (LossSecondMomentResampler.sample_with).


def _objective(fin, fout):
    import h5py
    global _EXTRACT_DTYPE
    _EXTRACT_DTYPE = torch.float64
    with h5py.File(fin, "r") as f:
        a = {k: f.attrs[k] for k in f.attrs}
        out = torch.from_numpy(f["out"][()]).requires_grad_(True)
        x0, noise = torch.from_numpy(f["x0"][()]), torch.from_numpy(f["noise"][()])
        t, w = torch.from_numpy(f["t"][()]), torch.from_numpy(f["w"][()])
    d = Diffusion(int(a["T"]), str(a["schedule"]), bool(a["learn_sigma"]), predict_xstart=bool(a["predict_xstart"]),
                  use_kl=bool(a["use_kl"]), rescale_learned_sigmas=bool(a["rescale_learned_sigmas"]))
    terms = d.training_losses(out, x0, t, noise)
    (terms["loss"] * w).mean().backward()
    x_t = d.q_sample(x0, t, noise)
    with torch.no_grad():
        ev = d.vb_terms_bpd(None, x0, x_t, t, clip=True, model_output=out.detach())
        eps = d.predict_eps_from_xstart(x_t, t, ev["pred_xstart"])
    zero = torch.zeros_like(terms["loss"])
    with h5py.File(fout, "w") as f:
        for k in ("loss", "mse", "vb"):
            f[k] = terms.get(k, zero).detach().numpy()
        f["grad"] = out.grad.numpy()
        f["eval_vb"] = ev["output"].numpy()
        f["eval_x0_mse"] = mean_flat((ev["pred_xstart"] - x0) ** 2).numpy()
        f["eval_mse"] = mean_flat((eps - noise) ** 2).numpy()


def _resampler(fin, fout):
    import h5py
    with h5py.File(fin, "r") as f:
        T, seed = int(f.attrs["T"]), int(f.attrs["seed"])
        ts, losses = f["ts"][()], f["losses"][()]
    r = LossSecondMomentResampler(T)
    W, Ts, Ws = [], [], []
    for s in range(ts.shape[0]):
        W.append(r.weights())
        u = unet_uniform01_f64(rng_key(seed, "TrainTimestepIS", s), "TrainTimestepIS", np.arange(ts.shape[1]))
        t, w = r.sample_with(u)
        Ts.append(t), Ws.append(w)
        r.update_with_all_losses(ts[s].tolist(), losses[s].tolist())
    with h5py.File(fout, "w") as f:
        f["weights"], f["t"], f["w"] = np.array(W), np.array(Ts, dtype=np.int64), np.array(Ws, dtype=np.float32)


if __name__ == "__main__":
    import sys
    {"objective": _objective, "resampler": _resampler}[sys.argv[1]](sys.argv[2], sys.argv[3])
