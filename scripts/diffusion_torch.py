"""guided-diffusion's sampling math (SPEC §4) in numpy/PyTorch, for golden files and parity checks.

Mirrors guided-diffusion's GaussianDiffusion / SpacedDiffusion for the configurations `unet` uses
(epsilon prediction; FIXED_LARGE variance, or LEARNED_RANGE with learn_sigma; no timestep
rescaling): float64 coefficient arrays, looked up per timestep and cast to float32 before they
touch a tensor, exactly as guided-diffusion's _extract_into_tensor does, and the same operation
order in every step. The network is called with the ORIGINAL timestep of each kept step.

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


def _extract(arr, t, shape):
    """arr[t] as float32, broadcast to `shape` (guided-diffusion's _extract_into_tensor)."""
    res = torch.from_numpy(arr).to(device=t.device)[t].float()
    while len(res.shape) < len(shape):
        res = res[..., None]
    return res.expand(shape)


class Diffusion:
    """A (possibly respaced) Gaussian diffusion. `use_timesteps` None = the base process; else the
    kept original timesteps, with betas recomputed as 1 - abar_t/abar_prev (SpacedDiffusion)."""

    def __init__(self, T=1000, schedule="linear", learn_sigma=False, use_timesteps=None):
        base = get_named_beta_schedule(schedule, T)
        self.learn_sigma = learn_sigma
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
        return model(x, t_orig.float(), **kwargs)

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
        pred_xstart = self.predict_xstart_from_eps(x, t, out)
        if clip:
            pred_xstart = pred_xstart.clamp(-1, 1)
        mean = self.q_posterior_mean(pred_xstart, x, t)
        return {"mean": mean, "log_variance": log_variance, "pred_xstart": pred_xstart, "eps": out}

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
# unet's counter-based RNG (lib/rng.h), vectorised over indices with wrapping uint64 arithmetic

STREAMS = dict(TrainNoise=1, TrainTimestep=2, TrainFlip=3, Shuffle=4, Dropout=5, SampleInit=6,
               SampleStep=7, SampleLabel=8)
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
