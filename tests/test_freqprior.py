"""Tests of iclr25_repro.freqprior: filters, FreeInit's covariance, FreqPrior's exact N(0, I), odd sizes, special
cases, the official script's covariance bound, the sampler's call counts, batch and device independence, lists of
generators, bad inputs, diffusers' AnimateDiffPipeline with FreqPriorMixin, the claims' rules on made-up measurements,
the video models and metrics, a tiny experiment run and the laptop and full presets' smoke runs."""
import dataclasses
import math

import pytest
import torch

from iclr25_repro.freqprior import experiment
from iclr25_repro.freqprior.noise import (VideoDiffusionSampler, butterworth_filter, check_shape, filter_operator,
                                          freeinit_mix, freqprior_refine, gaussian_filter, is_symmetric, make_filter,
                                          pyoco_mixed, pyoco_progressive)


def _cov_of_refine(shape, r, kind="butterworth"):
    return experiment.explicit_cov_error(shape, kind, r)


@pytest.mark.parametrize("shape", [(4, 6, 6), (2, 4, 8)])
@pytest.mark.parametrize("r", [0.0, 0.8, 1.0])
def test_freqprior_covariance_is_identity_for_even_sizes(shape, r):
    assert _cov_of_refine(shape, r) < 1e-12
    assert _cov_of_refine(shape, r, "gaussian") < 1e-12


@pytest.mark.parametrize("shape", [(3, 5, 5), (5, 4, 6)])
@pytest.mark.parametrize("r", [0.5, 0.8])
def test_odd_sizes_have_the_error_of_eq_3_and_less_than_freeinit(shape, r):
    "||Cov - I||_F = 2 rho / (1 + rho) ||R^2||_F exactly, nonzero, and below FreeInit's 2 ||A - A^2||_F."
    M = filter_operator(butterworth_filter(shape))
    rho = r * r
    predicted = 2 * rho / (1 + rho) * float(torch.linalg.matrix_norm(M.imag @ M.imag))
    err = _cov_of_refine(shape, r)
    assert predicted > 1e-6 and err == pytest.approx(predicted, rel=1e-8)
    assert err < 2 * float(torch.linalg.matrix_norm(M.real - M.real @ M.real))
    assert not is_symmetric(butterworth_filter(shape)) and is_symmetric(butterworth_filter((4, 6, 6)))


@pytest.mark.parametrize("shape", [(3, 5, 5), (4, 6, 6), (5, 4, 7)])
@pytest.mark.parametrize("kind", ["butterworth", "gaussian"])
def test_bound_equals_the_official_scripts_q_squared(shape, kind):
    """The chapter's bound ||R^2||_F equals covariance_error.py's ||Q^2||_F, Q = (A L B + B L A) / N with A + iB the
    explicit (non-unitary) DFT matrix of the whole grid (Kronecker product of 1-D DFT matrices)."""
    dft = lambda m: torch.exp(-2j * math.pi * torch.outer(torch.arange(m), torch.arange(m)).double() / m)
    F = torch.kron(torch.kron(dft(shape[0]), dft(shape[1])), dft(shape[2]))
    L = make_filter(kind, shape)
    Q = (F.real * L.flatten() @ F.imag + F.imag * L.flatten() @ F.real) / L.numel()
    P = (F.real * L.flatten() @ F.real + F.imag * L.flatten() @ F.imag) / L.numel()
    M = filter_operator(L)
    q2, r2 = float(torch.linalg.matrix_norm(Q @ Q)), float(torch.linalg.matrix_norm(M.imag @ M.imag))
    assert q2 == pytest.approx(r2, rel=1e-9, abs=1e-14)
    assert torch.allclose(P, M.real, atol=1e-12)                    # the official P is the chapter's A = Re M
    assert (r2 < 1e-12) == all(s % 2 == 0 for s in shape)


def test_refined_noise_has_unit_variance_and_flat_spectrum():
    g = torch.Generator().manual_seed(0)
    L = butterworth_filter((8, 16, 16))
    z = torch.randn(2048, 8, 16, 16, generator=g, dtype=torch.float64)
    n = freqprior_refine(z, L, 0.8, g)
    power = (torch.fft.fftn(n, dim=(-3, -2, -1), norm="ortho").abs() ** 2).mean(0)
    assert abs(float(n.var()) - 1) < 0.01
    trans = (L >= 0.1) & (L < 0.9)
    assert abs(float(power[trans].mean()) - 1) < 0.03
    fi = freeinit_mix(z, torch.randn(z.shape, generator=g, dtype=torch.float64), L)
    p_fi = (torch.fft.fftn(fi, dim=(-3, -2, -1), norm="ortho").abs() ** 2).mean(0)
    assert abs(float(p_fi[trans].mean()) - float((L**2 + (1 - L) ** 2)[trans].mean())) < 0.03


def test_filters_and_special_cases():
    L = butterworth_filter((4, 8, 8))
    assert float(L[0, 0, 0]) == 1.0 and float(L.min()) >= 0 and float(L.max()) <= 1
    assert float(gaussian_filter((4, 8, 8))[0, 0, 0]) == 1.0
    g = torch.Generator().manual_seed(1)
    z = torch.randn(3, 4, 8, 8, generator=g, dtype=torch.float64)
    fresh = tuple(torch.randn(z.shape, generator=g, dtype=torch.float64) for _ in range(4))
    assert torch.allclose(freqprior_refine(z, torch.ones_like(L), 1.0, fresh=fresh), z, atol=1e-12)
    assert torch.allclose(freqprior_refine(z, torch.zeros_like(L), 0.5, fresh=fresh),
                          (fresh[2] + fresh[3]) / math.sqrt(2), atol=1e-12)
    assert torch.allclose(freeinit_mix(z, fresh[0], torch.ones_like(L)), z, atol=1e-12)


def test_pyoco_noises_have_unit_variance_and_frame_correlation():
    g = torch.Generator().manual_seed(2)
    m = pyoco_mixed((4, 8, 8), 1.0, (20000,), g)
    p = pyoco_progressive((4, 8, 8), 1.0, (20000,), g)
    assert abs(float(m.var()) - 1) < 0.02 and abs(float(p.var()) - 1) < 0.02
    corr = float((m[:, 0] * m[:, 1]).mean())
    assert abs(corr - 0.5) < 0.02


def test_batch_independence():
    g = torch.Generator().manual_seed(3)
    L = butterworth_filter((4, 8, 8))
    z = torch.randn(5, 2, 4, 8, 8, generator=g, dtype=torch.float64)
    fresh = tuple(torch.randn(z.shape, generator=g, dtype=torch.float64) for _ in range(4))
    full = freqprior_refine(z, L, 0.8, fresh=fresh)
    one = freqprior_refine(z[2, 1], L, 0.8, fresh=tuple(f[2, 1] for f in fresh))
    assert torch.allclose(full[2, 1], one, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    L = butterworth_filter((4, 8, 8))
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, 4, 8, 8, generator=g, dtype=torch.float64)
    fresh = tuple(torch.randn(z.shape, generator=g, dtype=torch.float64) for _ in range(4))
    gpu = freqprior_refine(z.cuda(), L, 0.8, fresh=tuple(f.cuda() for f in fresh)).cpu()
    assert torch.allclose(gpu, freqprior_refine(z, L, 0.8, fresh=fresh), atol=1e-10)


@pytest.mark.parametrize("iters", [1, 2, 3, 5])
def test_model_call_counts(iters):
    s = VideoDiffusionSampler(lambda x, t: torch.zeros_like(x))
    noise = torch.randn(1, 4, 8, 8, dtype=torch.float64)
    for m in ("gaussian", "freeinit", "freqprior"):
        res = s.sample(noise, m, iters=iters, generator=torch.Generator().manual_seed(0))
        assert res.calls == s.expected_calls(m, iters)
    assert s.expected_calls("freqprior", 3) == 57 and s.expected_calls("freeinit", 3) == 75


def test_bad_inputs():
    with pytest.raises(ValueError, match="shape"):
        check_shape((4, 8))
    with pytest.raises(ValueError, match="cutoffs"):
        butterworth_filter((4, 8, 8), d_s=0.0)
    with pytest.raises(ValueError, match="kind"):
        make_filter("box", (4, 8, 8))
    L = butterworth_filter((4, 8, 8))
    with pytest.raises(ValueError, match="r must be"):
        freqprior_refine(torch.zeros(4, 8, 8), L, r=1.5)
    with pytest.raises(ValueError, match="match the filter"):
        freqprior_refine(torch.zeros(4, 8, 9), L)
    s = VideoDiffusionSampler(lambda x, t: torch.zeros_like(x))
    with pytest.raises(ValueError, match="mid_step"):
        s.sample(torch.zeros(4, 8, 8), "freqprior", mid_step=300)
    with pytest.raises(ValueError, match="method"):
        s.sample(torch.zeros(4, 8, 8), "ddpm")


def test_tiny_experiment_run_and_determinism():
    cfg = experiment.Config.preset("tiny")
    a, b = experiment.run(cfg), experiment.run(cfg)
    assert [c["id"] for c in a["claims"]] == ["C1-variance", "C2-spectrum", "C3-cost", "C4-learned"]
    assert a["claims"] == b["claims"]
    kinds = {c["id"]: c["kind"] for c in a["claims"]}
    assert kinds == {"C1-variance": "check", "C2-spectrum": "claim", "C3-cost": "check", "C4-learned": "claim"}
    assert all(c["verdict"] in (("passed", "failed") if c["kind"] == "check" else
                                ("reproduced", "partial", "inconclusive", "not_reproduced", "not_run"))
               for c in a["claims"])
    assert all(c["delta"] > 0 and c["delta_reason"] for c in a["claims"] if c["kind"] == "claim")
    assert len(a["c"]) == cfg.c_seeds and len({x["seed"] for x in a["c"]}) == cfg.c_seeds   # distinct replicates
    assert len(a["b"]["replicates"]) == len(experiment.worlds(cfg)) == len(cfg.b_k0s) * len(cfg.b_schedules)
    assert {(rep[0]["k0"], rep[0]["schedule"]) for rep in a["b"]["replicates"]} == set(experiment.worlds(cfg))


def test_sprite_videos_and_tiny_model():
    g = torch.Generator().manual_seed(0)
    v = experiment.sprite_videos(6, gen=g)
    assert v.shape == (6, 1, 8, 16, 16)
    moving = (v == 2.5)
    assert moving.sum(dim=(-2, -1)).min() == 9                     # one 3x3 sprite in every frame
    first = moving[:, 0, 0].float().nonzero()[:, 1:].float().mean()
    last = moving[:, 0, -1].float().nonzero()[:, 1:].float().mean()
    assert not torch.isclose(first, last)                          # it moves
    bg = torch.where(moving, torch.nan, v)
    assert torch.nanmean((bg - bg.nanmean(dim=2, keepdim=True)).abs()) < 1e-6   # the background is static
    m = experiment.TinyVideoEps(4)
    out = m(torch.randn(2, 1, 8, 16, 16, dtype=torch.float64), torch.tensor([10, 900]))
    assert out.shape == (2, 1, 8, 16, 16) and out.dtype == torch.float64


def test_small_video_unet_and_model_choice():
    torch.manual_seed(0)
    m = experiment.make_video_model("small_unet", 8, 1).eval()
    assert isinstance(m, experiment.SmallVideoUNet)
    x = torch.randn(2, 1, 8, 16, 16, dtype=torch.float64)
    out = m(x, torch.tensor([10, 900]))
    assert out.shape == x.shape and out.dtype == torch.float64
    assert not torch.allclose(out[0], m(x, torch.tensor([900, 900]))[0])      # the time step reaches the output
    # each video is denoised on its own (no mixing across the batch)
    assert torch.allclose(m(x[:1], torch.tensor([10])), out[:1], atol=1e-5)
    # every frame reaches every other frame's output (the attention and the mean over time)
    x2 = x.clone()
    x2[:, :, 0] += 1.0
    assert (m(x2, torch.tensor([10, 900])) - out)[:, :, -1].abs().max() > 1e-6
    with pytest.raises(ValueError, match="multiple of 4"):
        experiment.SmallVideoUNet(6)
    with pytest.raises(ValueError, match="c_arch"):
        experiment.make_video_model("resnet", 8, 1)


def test_learned_toy_samples_with_the_moving_average_of_the_weights():
    "c_ema = 0 samples with the trained weights, c_ema > 0 with their moving average: different samples, same data."
    cfg = experiment.Config.preset("tiny")
    a = experiment.learned_toy(dataclasses.replace(cfg, c_ema=0.0), 0, n_boot=99)
    b = experiment.learned_toy(dataclasses.replace(cfg, c_ema=0.9), 0, n_boot=99)
    assert a["rows"][0] == b["rows"][0]                                      # the data and the training losses
    assert a["rows"][1]["flicker"] != b["rows"][1]["flicker"]


def test_freeinit_matches_diffusers_freeinit_mixin():
    from diffusers.pipelines.free_init_utils import FreeInitMixin
    g = torch.Generator().manual_seed(4)
    for shape in [(4, 8, 8), (3, 7, 7)]:
        L = butterworth_filter(shape)
        z = torch.randn(2, 1, *shape, generator=g)
        eta = torch.randn(z.shape, generator=g)
        ref = FreeInitMixin()._apply_freq_filter(z, eta, torch.fft.fftshift(L).float())
        assert torch.allclose(freeinit_mix(z, eta, L), ref, atol=1e-5)


def test_sampler_replays_the_freqprior_loop():
    A = torch.tensor(0.3, dtype=torch.float64)
    model = lambda x, t: A * x * (t / 1000.0)                      # a non-trivial linear stand-in
    s = VideoDiffusionSampler(model)
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    noise = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = s.sample(noise, "freqprior", iters=2, generator=g1)
    # by hand: 16 steps, stop at 321 before calling the model, re-diffuse with the original noise, refine, full pass
    x = noise
    for t in s.timesteps[:16]:
        x = s.scheduler.step(model(x, t), t, x, eta=0.0).prev_sample
    acp = s.scheduler.alphas_cumprod.double()
    sc = acp[999] / acp[321]
    z = sc.sqrt() * x + (1 - sc).sqrt() * noise
    x = freqprior_refine(z, butterworth_filter((4, 8, 8)), 0.8, g2)
    for t in s.timesteps:
        x = s.scheduler.step(model(x, t), t, x, eta=0.0).prev_sample
    assert torch.allclose(out.x0, x, atol=1e-12) and out.calls == 16 + 25
    again = s.sample(noise, "freqprior", iters=2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.x0, out.x0)                          # deterministic for a fixed generator


def test_gaussian_prior_denoiser_is_the_posterior_mean():
    prior = experiment.GaussianVideoPrior((4, 8, 8), k0=0.1)
    prior.acp = VideoDiffusionSampler(lambda x, t: x).acp
    g = torch.Generator().manual_seed(0)
    x0 = prior.sample(20000, g)
    eps = torch.randn(x0.shape, generator=g, dtype=torch.float64)
    a = prior.acp[500].double()
    xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
    pred = prior(xt, 500)
    # the optimal predictor's residual is uncorrelated with x_t (orthogonality of the conditional mean)
    assert abs(float(((eps - pred) * xt).mean())) < 0.01
    assert float(((eps - pred) ** 2).mean()) < float(((eps - 0 * pred) ** 2).mean())


def test_more_bad_inputs():
    s = VideoDiffusionSampler(lambda x, t: torch.zeros_like(x))
    with pytest.raises(ValueError, match="iters"):
        s.sample(torch.zeros(4, 8, 8), "freeinit", iters=0)
    L = butterworth_filter((4, 8, 8))
    with pytest.raises(ValueError, match="shape of z"):
        freeinit_mix(torch.zeros(2, 4, 8, 8), torch.zeros(3, 4, 8, 8), L)
    with pytest.raises(ValueError, match="order n"):
        butterworth_filter((4, 8, 8), n=0)


@pytest.mark.parametrize("shape", [(4, 8, 8), (3, 5, 7), (5, 6, 9)])
@pytest.mark.parametrize("kind", ["butterworth", "gaussian"])
def test_filters_equal_diffusers_free_init_filters_for_even_and_odd_shapes(shape, kind):
    from diffusers.pipelines.free_init_utils import FreeInitMixin
    ref = FreeInitMixin()._get_free_init_freq_filter(shape, "cpu", kind, 4, 0.25, 0.25)  # centred (fftshift) order
    ours = make_filter(kind, shape)
    assert torch.allclose(ours.float(), torch.fft.ifftshift(ref, dim=(-3, -2, -1)), atol=1e-6)


@pytest.mark.parametrize("shape", [(3, 5, 5), (2, 3, 4)])
@pytest.mark.parametrize("r", [0.5, 0.8])
def test_odd_size_covariance_equals_eq_3(shape, r):
    "Cov(n) = I + 2 rho / (1 + rho) R^2, with R the imaginary part of the filter's operator F^-1 diag(L) F."
    L = butterworth_filter(shape)
    N = L.numel()
    basis = torch.eye(N, dtype=torch.float64).reshape(N, *shape)
    R = torch.fft.ifftn(L * torch.fft.fftn(basis, dim=(-3, -2, -1)), dim=(-3, -2, -1)).imag.reshape(N, N).T
    cov = experiment.explicit_cov(shape, "butterworth", r, L)
    rho = r * r
    predicted = torch.eye(N, dtype=torch.float64) + 2 * rho / (1 + rho) * R @ R
    eye = torch.eye(N, dtype=torch.float64)
    assert float((predicted - eye).abs().max()) > 1e-8     # odd sizes: the operator is not real, Cov differs from I
    assert float((cov - predicted).abs().max()) < 1e-12


def test_pyoco_progressive_correlation_decays_geometrically():
    g = torch.Generator().manual_seed(5)
    a = 1.5
    p = pyoco_progressive((5, 4, 4), a, (40000,), g)
    c = a / math.sqrt(1 + a * a)
    for lag in (1, 2, 4):
        corr = float((p[:, 0] * p[:, lag]).mean())
        assert abs(corr - c ** lag) < 0.02, (lag, corr, c ** lag)


def test_fresh_noise_and_filter_values_are_validated():
    L = butterworth_filter((4, 8, 8))
    z = torch.zeros(3, 4, 8, 8)
    one = torch.zeros(4, 8, 8)                             # one draw that would broadcast over the batch
    with pytest.raises(ValueError, match="fresh must be four tensors"):
        freqprior_refine(z, L, fresh=(one, one, one, one))
    with pytest.raises(ValueError, match="fresh must be four tensors"):
        freqprior_refine(z, L, fresh=(z, z, z))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        freqprior_refine(z, 1.5 * L)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        freeinit_mix(z, z, L - 0.5)


class _ConstEps(torch.nn.Module):
    "eps = c everywhere, c a keyword argument (a stand-in for a conditional model); records the inputs it saw."
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x, t, c=0.0):
        self.seen.append(x.clone())
        return torch.full_like(x, c)


def test_sampler_guidance_combines_conditional_and_unconditional_predictions():
    z = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    guided = VideoDiffusionSampler(_ConstEps(), num_steps=5, guidance_scale=3.0)
    out = guided.sample(z, "gaussian", cond={"c": 0.2}, uncond={"c": 0.1})
    plain = VideoDiffusionSampler(_ConstEps(), num_steps=5).sample(z, "gaussian", cond={"c": 0.1 + 3.0 * 0.1})
    assert torch.allclose(out.x0, plain.x0, atol=1e-12) and out.calls == plain.calls == 5
    assert len(guided.model.seen) == 10                     # two model evaluations per step
    with pytest.raises(ValueError, match="uncond"):
        guided.sample(z, "gaussian", cond={"c": 0.2})


def test_sampler_scales_the_model_input_and_steps_with_eta():
    from diffusers import DDIMScheduler

    class Halving(DDIMScheduler):
        def scale_model_input(self, sample, timestep=None):
            return 0.5 * sample

    base = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="linear", clip_sample=False)
    model = _ConstEps()
    z = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    VideoDiffusionSampler(model, Halving(**base), num_steps=3).sample(z, "gaussian")
    assert torch.allclose(model.seen[0], 0.5 * z)
    s = VideoDiffusionSampler(_ConstEps(), DDIMScheduler(**base), num_steps=3, eta=1.0)
    a = s.sample(z, "gaussian", generator=torch.Generator().manual_seed(1)).x0
    b = s.sample(z, "gaussian", generator=torch.Generator().manual_seed(1)).x0
    d = VideoDiffusionSampler(_ConstEps(), DDIMScheduler(**base), num_steps=3).sample(z, "gaussian").x0
    assert torch.equal(a, b) and not torch.allclose(a, d)
    with pytest.raises(ValueError, match="eta"):
        VideoDiffusionSampler(model, eta=-1.0)


def test_freqprior_mixin_in_an_animatediff_style_loop_reproduces_the_sampler():
    from diffusers.pipelines.free_init_utils import FreeInitMixin

    from iclr25_repro.freqprior.noise import FreqPriorMixin, animatediff_ddim_scheduler

    class LoopPipe(FreqPriorMixin, FreeInitMixin):
        "The rounds and denoising loop of diffusers' AnimateDiffPipeline.__call__, without the networks around them."
        def __init__(self, model):
            self.model, self.scheduler = model, animatediff_ddim_scheduler()

        def __call__(self, latents, num_inference_steps, generator):
            rounds = self._free_init_num_iters if self.free_init_enabled else 1
            for k in range(rounds):
                if self.free_init_enabled:
                    latents, timesteps = self._apply_free_init(latents, k, num_inference_steps, latents.device,
                                                               latents.dtype, generator)
                else:
                    self.scheduler.set_timesteps(num_inference_steps)
                    timesteps = self.scheduler.timesteps
                for t in timesteps:
                    eps = self.model(self.scheduler.scale_model_input(latents, t), t)
                    latents = self.scheduler.step(eps, t, latents).prev_sample
            return latents

    model = lambda x, t: 0.3 * x + 0.1 * torch.roll(x, 1, dims=-1)  # a fixed linear eps-model
    z = torch.randn(2, 1, 8, 16, 16, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    pipe = LoopPipe(model)
    pipe.enable_freqprior(num_iters=3, mid_step=321, r=0.8)
    ours = pipe(z.clone(), 25, torch.Generator().manual_seed(9))
    ref = VideoDiffusionSampler(model, num_steps=25).sample(z.clone(), "freqprior", iters=3, mid_step=321, r=0.8,
                                                              generator=torch.Generator().manual_seed(9))
    assert torch.allclose(ours, ref.x0, atol=1e-10)
    pipe.disable_freqprior()
    assert not pipe.free_init_enabled
    plain = pipe(z.clone(), 25, None)
    assert torch.allclose(plain, VideoDiffusionSampler(model, num_steps=25).sample(z.clone()).x0, atol=1e-10)
    with pytest.raises(ValueError, match="mid_step"):
        pipe.enable_freqprior(mid_step=300)
        pipe(z.clone(), 25, None)
    with pytest.raises(TypeError, match="FreeInitMixin"):
        type("NoFreeInit", (FreqPriorMixin,), {})().enable_freqprior()


def _c_results(flicker: dict, hf: dict, seeds: int = 3, data_flicker: float = 0.06, speed: float = 1.2) -> list[dict]:
    "Made-up Part C results: per method, one flicker and HF ratio per seed (lists); Gaussian's speed ratio `speed`."
    return [dict(seed=k, rows=[dict(method="data", flicker=data_flicker, hf_ratio=1.0, speed_ratio=1.0)] + [
        dict(method=m, flicker=flicker[m][k], hf_ratio=hf[m][k], speed_ratio=speed if m == "gaussian" else 1.0)
        for m in ("gaussian", "freeinit", "freqprior")]) for k in range(seeds)]


def test_c4_rule_moves_with_the_numbers_and_its_gates():
    "C4: log flicker ratio (lower) and HF retention difference (higher), each against delta 0.1; the weaker decides."
    good_hf = {"gaussian": [1.2, 1.3, 1.1], "freeinit": [0.6, 0.55, 0.62], "freqprior": [1.05, 0.97, 1.1]}
    less = {"gaussian": [0.10, 0.12, 0.11], "freeinit": [0.05, 0.06, 0.05], "freqprior": [0.07, 0.08, 0.075]}
    more = {"gaussian": [0.07, 0.08, 0.075], "freeinit": [0.05, 0.06, 0.05], "freqprior": [0.10, 0.12, 0.11]}
    v = lambda fl, hf, **kw: experiment._c4_claim(_c_results(fl, hf, **kw))["verdict"]
    c = experiment._c4_claim(_c_results(less, good_hf))
    assert c["verdict"] == "reproduced" and c["interval"]["hi"] < 0 and c["replicates"] == 3
    assert c["delta"] == 0.1 and c["better"] == "lower" and len(c["gates"]) == 3 and all(g["passed"] for g in c["gates"])
    slightly = {"gaussian": [0.10, 0.12, 0.11], "freqprior": [0.097, 0.1165, 0.1068], "freeinit": [0.05] * 3}
    assert v(slightly, good_hf) == "partial"                              # about 3% less flicker: real, below delta
    across = {"gaussian": [0.10, 0.12, 0.11], "freqprior": [0.11, 0.06, 0.09], "freeinit": [0.05] * 3}
    assert v(across, good_hf) == "inconclusive"                           # wide, across 0
    assert v(more, good_hf) == "not_reproduced"                           # HF kept, flicker worse: the weaker decides
    assert v(less, good_hf | {"freeinit": [1.0, 1.01, 0.99], "freqprior": [0.5, 0.55, 0.6]}) == "not_reproduced"
    noisy = experiment._c4_claim(_c_results(less, {m: [5.0, 6.0, 5.5] for m in good_hf}))   # HF far above the data's
    assert noisy["verdict"] == "not_run" and not noisy["gates"][0]["passed"] and noisy["gates"][0]["value"] > 2
    assert noisy["ours"] is not None and "not run" in noisy["note"]       # the numbers are recorded anyway
    flick = experiment._c4_claim(_c_results(less, good_hf, data_flicker=0.03))   # Gaussian's flicker > 2x the data's
    assert flick["verdict"] == "not_run" and [g["passed"] for g in flick["gates"]] == [True, False, True]
    jitter = experiment._c4_claim(_c_results(less, good_hf, speed=2.7))          # the sprite moves 2.7x the data's
    assert jitter["verdict"] == "not_run" and [g["passed"] for g in jitter["gates"]] == [True, True, False]
    frozen = experiment._c4_claim(_c_results(less, good_hf, speed=0.3))          # or 0.3x: a factor 3.3 from it
    assert frozen["verdict"] == "not_run" and frozen["gates"][2]["value"] == pytest.approx(1 / 0.3)


def test_c2_rule_uses_intervals_over_groups():
    "C2: transition-band gain over FreeInit against delta 0.2 and low-frequency error (lower) against 0.1, over worlds."
    def reps(fp_transition, fp_low, spread=0.01):
        w = dict(k0=0.03, schedule="linear")
        return [[dict(method="gaussian", calls=25, zero=0.2, stop=0.5, low_error=0.9, transition=0.9, **{"pass": 0.9}, **w),
                 dict(method="freeinit", calls=75, zero=0.8, stop=0.5, low_error=0.2, transition=0.55, **{"pass": 1.2}, **w),
                 dict(method="freqprior", calls=57, zero=0.7, stop=0.5, low_error=fp_low + spread * k,
                      transition=fp_transition + spread * k, **{"pass": 1.1}, **w)] for k in range(4)]
    c = experiment._c2_claim(reps(0.9, 0.3))
    assert c["verdict"] == "reproduced" and c["delta"] == 0.2 and c["better"] == "higher"
    assert experiment._c2_claim(reps(0.6, 0.3))["verdict"] == "partial"          # transition gain about 0.06 < 0.2
    assert experiment._c2_claim(reps(0.9, 0.85))["verdict"] == "partial"         # low error 0.03 lower: below 0.1
    assert experiment._c2_claim(reps(0.5, 0.3, spread=0.1))["verdict"] == "inconclusive"   # gain across 0
    assert experiment._c2_claim(reps(0.9, 1.2))["verdict"] == "not_reproduced"   # the low-frequency gap wider


def test_rgb_sprites_labels_and_sprite_speed():
    g = torch.Generator().manual_seed(1)
    v, cls = experiment.sprite_videos(5, 8, 20, 20, g, sprite=4, rgb=True, labels=True)
    assert v.shape == (5, 3, 8, 20, 20) and cls.shape == (5,) and int(cls.max()) < len(experiment.PALETTE)
    v1 = experiment.sprite_videos(16, gen=torch.Generator().manual_seed(2))
    mask = (v1[:, 0] == 2.5).float()                                            # the sprite's pixels per frame
    ys, xs = torch.arange(16.0)[:, None], torch.arange(16.0)[None, :]
    cy = (mask * ys).sum((-2, -1)) / mask.sum((-2, -1))
    cx = (mask * xs).sum((-2, -1)) / mask.sum((-2, -1))
    truth = torch.sqrt(cy.diff(dim=1) ** 2 + cx.diff(dim=1) ** 2).mean(1).numpy()
    speed = experiment.sprite_speed(v1)
    assert (abs(speed - truth) < 1e-6).mean() >= 0.9, (speed, truth)           # exact on (almost) every video
    frozen = v1[:, :, :1].expand_as(v1).clone()
    assert experiment.sprite_speed(frozen).max() == 0                          # a still video does not move


def test_unet3d_model_is_class_conditional():
    torch.manual_seed(0)
    m = experiment.UNet3DEps(3, 16).eval()
    x = torch.randn(2, 3, 4, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        a = m(x, 500, label=torch.tensor([0, 1]))
        b = m(x, 500, label=torch.tensor([2, 3]))
        null = m(x, 500)
    assert a.shape == x.shape and a.dtype == torch.float64
    assert not torch.allclose(a, b)                                             # the label reaches the output
    assert torch.allclose(null, m(x, 500, label=torch.full((2,), m.null)))      # no label is the null label


def test_full_preset_plan_and_smoke(tmp_root):
    from iclr25_repro.core import cli
    full = experiment.Config.preset("full")
    phases = experiment.plan(full)
    assert len(phases) == 3 + full.c_seeds == len(experiment.jobs_for(full)) + 2
    unet = [p for p in phases if p.get("model") == "unet3d"]
    assert len(unet) == 3 and all(p["video"] == (3, 16, 32, 32) and p["samples_per_method"] == 1024 for p in unet)
    assert unet[0]["model_evaluations"] == 1024 * (25 + 75 + 57) * (2 if full.c_guidance != 1 else 1)
    assert 1 < unet[0]["gflop_per_video_evaluation"] < 100 and unet[0]["sampling_pflop"] > 0
    est = cli.estimate_wall("freqprior", "full")
    assert est["seconds"] == pytest.approx(cli.plan_units(phases) / experiment.GPU_UNITS_PER_S)
    assert est["seconds"] <= cli.BUDGET_S["full"]                       # the full dry run fits 10 minutes on one GPU
    doc = cli.run_experiment("freqprior", "full", "cpu", 0, smoke=True)
    assert doc["scale"] == "full" and doc["config"]["smoke"] is True and doc["config"]["c_arch"] == "unet3d"
    assert [c["id"] for c in doc["claims"]] == ["C1-variance", "C2-spectrum", "C3-cost", "C4-learned"]
    assert not (tmp_root / "book" / "results").exists()


def test_laptop_preset_smoke_and_dry_run(tmp_root):
    "The laptop preset: the ci code path with larger numbers; its smoke run and its dry run, within 20 minutes."
    from iclr25_repro.core import cli
    lap, ci = experiment.Config.preset("laptop"), experiment.Config.preset("ci")
    assert lap.c_arch == ci.c_arch == "small_unet" and lap.c_steps >= 1000 and lap.c_seeds >= 3
    assert len(experiment.worlds(lap)) >= 3 * len(experiment.worlds(ci)) and set(lap.b_schedules) == {"linear", "scaled_linear"}
    doc = cli.run_experiment("freqprior", "laptop", "cpu", 0, smoke=True)
    assert doc["scale"] == "laptop" and doc["config"]["smoke"] is True
    assert [c["id"] for c in doc["claims"]] == ["C1-variance", "C2-spectrum", "C3-cost", "C4-learned"]
    assert not (tmp_root / "book" / "results").exists()
    text = cli.dry_run("freqprior", "laptop", "cpu", 0)
    assert "estimated wall time" in text        # scaled from the timed smoke run (a loaded machine inflates it)
    # at the rate the units are defined by (about 8 GFLOP/s of the tiny network per core, two workers), the laptop
    # preset fits its 20 minutes with room: about 16 minutes (a committed laptop run measured a faster rate)
    assert cli.plan_units(experiment.plan(lap)) / 8.0 <= 0.8 * cli.BUDGET_S["laptop"]


def test_vparam_turns_a_v_prediction_into_the_epsilon_prediction():
    acp = VideoDiffusionSampler(lambda x, t: x).acp
    g = torch.Generator().manual_seed(3)
    x0, eps = torch.randn(4, 1, 2, 4, 4, generator=g), torch.randn(4, 1, 2, 4, 4, generator=g)
    t = torch.tensor([1, 200, 600, 999])
    a = acp.float()[t][:, None, None, None, None]
    xt = a.sqrt() * x0 + (1 - a).sqrt() * eps

    class Oracle(torch.nn.Module):                          # returns the true v of this batch
        def forward(self, x, t, label=None):
            return a.sqrt() * eps - (1 - a).sqrt() * x0
    m = experiment.VParam(Oracle(), acp)
    assert torch.allclose(m(xt, t), eps, atol=1e-5)
    assert m(xt, 500).shape == xt.shape                     # a scalar timestep broadcasts over the batch


def test_a_list_of_generators_draws_each_item_from_its_own():
    "As diffusers' pipelines take them: item i's fresh noise comes from generator i alone."
    L = butterworth_filter((4, 8, 8))
    z = torch.randn(3, 2, 4, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    batch = freqprior_refine(z, L, 0.8, [torch.Generator().manual_seed(10 + i) for i in range(3)])
    for i in range(3):
        one = freqprior_refine(z[i:i + 1], L, 0.8, torch.Generator().manual_seed(10 + i))
        assert torch.allclose(batch[i:i + 1], one, atol=1e-12)
    assert not torch.allclose(batch[0], batch[1])
    with pytest.raises(ValueError, match="one generator per item"):
        freqprior_refine(z, L, 0.8, [torch.Generator().manual_seed(0)] * 2)
    s = VideoDiffusionSampler(lambda x, t: 0.1 * x, num_steps=5)
    out = s.sample(z, "freqprior", iters=2, mid_step=401, generator=[torch.Generator().manual_seed(i) for i in range(3)])
    assert out.x0.shape == z.shape and out.calls == s.expected_calls("freqprior", 2, 401)


def test_freqprior_mixin_in_diffusers_animatediff_pipeline():
    """diffusers' own AnimateDiffPipeline, built from tiny configs on the CPU (no text encoder or tokenizer: the prompt
    is given as embeddings), with FreqPrior, classifier-free guidance and a list of generators, equals the sampler."""
    from diffusers import AnimateDiffPipeline, MotionAdapter, UNet2DConditionModel

    from iclr25_repro.core.runtime import one_thread
    from iclr25_repro.freqprior.noise import FreqPriorMixin, animatediff_ddim_scheduler

    class Pipe(FreqPriorMixin, AnimateDiffPipeline):
        pass

    with one_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4,
                                    out_channels=4, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                                    norm_num_groups=2, attention_head_dim=4)
        adapter = MotionAdapter(block_out_channels=(8, 16), motion_layers_per_block=1, motion_norm_num_groups=2,
                                motion_num_attention_heads=2)
        pipe = Pipe(vae=None, text_encoder=None, tokenizer=None, unet=unet, motion_adapter=adapter,
                    scheduler=animatediff_ddim_scheduler())
        pipe.set_progress_bar_config(disable=True)
        B, F = 2, 8
        emb, neg = torch.randn(B, 3, 16), torch.randn(B, 3, 16)
        latents = torch.randn(B, 4, F, 4, 4, generator=torch.Generator().manual_seed(1))
        gens = lambda: [torch.Generator().manual_seed(10 + i) for i in range(B)]
        kw = dict(prompt_embeds=emb, negative_prompt_embeds=neg, num_frames=F, height=32, width=32,
                  num_inference_steps=10, guidance_scale=2.0, output_type="latent")
        pipe.enable_freqprior(num_iters=3, mid_step=301, r=0.8)
        ours = pipe(latents=latents.clone(), generator=gens(), **kw).frames
        model = lambda x, t, e: pipe.unet(x, t, encoder_hidden_states=e.repeat_interleave(F, 0)).sample
        sampler = VideoDiffusionSampler(model, animatediff_ddim_scheduler(), num_steps=10, guidance_scale=2.0)
        with torch.no_grad():
            ref = sampler.sample(latents.clone(), "freqprior", iters=3, mid_step=301, r=0.8, generator=gens(),
                                 cond=dict(e=emb), uncond=dict(e=neg))
        assert ours.shape == (B, 4, F, 4, 4) and ref.calls == 6 + 6 + 10
        assert torch.allclose(ours, ref.x0, atol=1e-4)
        pipe.disable_freqprior()
        plain = pipe(latents=latents.clone(), generator=gens(), **kw).frames
        assert not torch.allclose(plain, ours, atol=1e-3)                  # FreqPrior changed the samples


def test_jumps_are_steps_the_data_cannot_make():
    "The data's sprite never moves more than MAX_STEP in a frame; a sprite that teleports does."
    v = experiment.sprite_videos(512, gen=torch.Generator().manual_seed(3))
    m = experiment.video_metrics(v)
    assert m["jumps"].max() == 0 and m["speed"].mean() > 1.5
    steps = experiment.sprite_steps(v)
    assert steps.shape == (512, 7) and float(steps.max()) == pytest.approx(experiment.MAX_STEP)
    teleport = v.clone()
    teleport[:, :, 1::2] = v[:, :, 1::2].flip(-1).flip(-2)                     # odd frames: sprite mirrored far away
    assert experiment.video_metrics(teleport)["jumps"].mean() > 0.3
