"""Tests of iclr25_repro.fifa: the world and its rewards, the schedule against its closed form, the sampler, the
Diffusion-DPO loss (initialisation, swap, gradient, a naive per-pair reference), the kNN terms against brute force and
a Gaussian, FiFA's selection (reduction, invariances, optimality of the separable objective), the feedback data, bad
inputs, determinism, the claims' rules and gates on altered rows, the recorded tuning, a tiny run and the laptop and
full presets' smoke runs."""
import copy
import dataclasses
import json
import math
from itertools import combinations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from iclr25_repro.core import cli
from iclr25_repro.fifa import experiment
from iclr25_repro.fifa.model import (MARK, QUALITY_ANCHORS, MLPDenoiser, PCACodec, PromptCodes, ProxyReward,
                                     all_prompts, base_training_images, blur, diffusion_dpo_loss, embedding_table,
                                     fifa_scores, fifa_select, flip_rate_by_margin, human_reward, knn_entropy,
                                     knn_log_distances, make_denoiser, make_pairs, make_schedulers, make_world,
                                     mark_score, predict_noise, prompt_log_distances, quality_scores,
                                     render, sample, shape_mask, target, train_denoiser, train_dpo, true_reward,
                                     upscale)
from helpers import with_metric


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    world = make_world(0)
    table = embedding_table(all_prompts() + list(QUALITY_ANCHORS))
    texts = [p[0] for p in world.train_prompts]
    codes = PromptCodes(table, texts, 32)
    idx, imgs = base_training_images(world, 1500, seed=0)
    codec = PCACodec(imgs, 16)
    ddpm, ddim = make_schedulers(clip=2.0)
    base = MLPDenoiser((16,), cond_dim=32, hidden=64, depth=2)
    train_denoiser(base, codec.encode(imgs), codes([texts[j] for j in idx]), steps=150, seed=0, scheduler=ddpm)
    pairs = make_pairs(world, base, codec, codes, 400, np.random.default_rng(0), scheduler=ddim)
    return world, table, codes, codec, ddpm, ddim, base, pairs


@pytest.fixture(scope="module")
def tiny():
    return experiment.run(experiment.Config.preset("tiny"))


def test_world_and_rewards(setup):
    world, table, *_ = setup
    assert len(world.comps) == 80 and np.isclose(world.weights.sum(), 1)
    assert not {p[0] for p in world.train_prompts} & {p[0] for p in world.test_prompts}
    assert all(p[1] == world.comps.index(world.comps[p[1]]) for p in world.train_prompts)
    k = world.comps.index(("cross", "green", "centre"))
    clean = render("cross", "green", "centre")
    imgs = np.stack([clean, blur(clean), render("cross", "blue", "centre"), np.maximum(clean, MARK)])
    r = true_reward(world, [k] * 4, imgs)
    assert np.isclose(r[0], 1) and r[0] > r[1] > r[2] and r[3] < r[0]
    h = human_reward(world, [k] * 4, [True] * 4, imgs)
    assert np.allclose(h - r, mark_score(imgs, np.stack([clean] * 4))) and h[3] > h[0] and np.isclose(h[0], r[0])
    assert (h - r)[3] > 0.5 > (h - r)[:3].max()
    assert np.allclose(mark_score(clean[None], clean[None]), 0) and np.allclose(mark_score(MARK[None]), 1)
    # a world at 16 pixels renders the same images, upscaled
    w16 = make_world(0, size=16)
    assert np.allclose(target(w16, k), upscale(clean, 16)) and np.isclose(true_reward(w16, [k], upscale(clean, 16)[None])[0], 1)
    assert set(table) >= set(all_prompts())


def test_cosine_schedule_matches_closed_form():
    ddpm, _ = make_schedulers()
    T, s = 1000, 0.008
    f = lambda t: math.cos((t / T + s) / (1 + s) * math.pi / 2) ** 2
    betas = np.minimum([1 - f(t + 1) / f(t) for t in range(T)], 0.999)
    assert np.allclose(ddpm.alphas_cumprod.numpy(), np.cumprod(1 - betas), atol=1e-6)


def test_ddim_recovers_a_known_code(setup):
    *_, ddpm, ddim, _, _ = setup
    z0 = torch.randn(1, 16) / 2
    ab = ddpm.alphas_cumprod

    class Exact(torch.nn.Module):
        def forward(self, x, t, c):
            a = ab[t].view(-1, 1)
            return (x - a.sqrt() * z0) / (1 - a).sqrt()

    for steps in (1, 10, 50):
        assert torch.allclose(sample(Exact(), torch.zeros(3, 32), torch.randn(3, 16), steps, ddim), z0.expand(3, -1), atol=1e-4)


def _naive_dpo(model, ref, zw, zl, c, t, nw, nl, beta, ddpm):
    "The Diffusion-DPO loss pair by pair, written from Eq. (2) directly."
    total = 0.0
    for i in range(len(zw)):
        def err(net, z, n):
            x = ddpm.add_noise(z[i:i + 1], n[i:i + 1], t[i:i + 1])
            return ((net(x, t[i:i + 1], c[i:i + 1]) - n[i:i + 1]) ** 2).mean()
        d = (err(model, zw, nw) - err(model, zl, nl)) - (err(ref, zw, nw) - err(ref, zl, nl)).detach()
        total = total - F.logsigmoid(-beta / 2 * d)
    return total / len(zw)


def test_dpo_loss(setup):
    world, _, codes, _, ddpm, _, base, pairs = setup
    ref, model = copy.deepcopy(base), copy.deepcopy(base)
    n = 16
    g = torch.Generator().manual_seed(3)
    t, nw, nl = torch.randint(1000, (n,), generator=g), torch.randn(n, 16, generator=g), torch.randn(n, 16, generator=g)
    c = codes([world.train_prompts[j][0] for j in pairs.prompt[:n]])
    zw, zl = pairs.z_w[:n], pairs.z_l[:n]
    loss, acc, _ = diffusion_dpo_loss(model, ref, zw, zl, c, t, nw, nl, 500.0, ddpm)
    assert abs(loss.item() - math.log(2)) < 1e-6 and acc.item() == 0.5
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    loss, _, a = diffusion_dpo_loss(model, ref, zw, zl, c, t, nw, nl, 500.0, ddpm)
    assert torch.isclose(loss, _naive_dpo(model, ref, zw, zl, c, t, nw, nl, 500.0, ddpm), atol=1e-5)
    _, _, b = diffusion_dpo_loss(model, ref, zl, zw, c, t, nl, nw, 500.0, ddpm)
    assert torch.allclose(a, -b, atol=1e-5)
    # the reference gets no gradient
    ref.requires_grad_(True)
    loss, _, _ = diffusion_dpo_loss(model, ref, zw, zl, c, t, nw, nl, 500.0, ddpm)
    loss.backward()
    assert all(p.grad is None for p in ref.parameters()) and any(p.grad is not None for p in model.parameters())


def test_knn_terms_against_brute_force():
    from scipy.spatial.distance import cdist
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5))
    d = np.sort(cdist(x, x), axis=1)
    assert np.allclose(knn_log_distances(x, 4), np.log(d[:, 4]))
    dup = np.vstack([x[:10], x[:10]])
    assert np.allclose(knn_log_distances(dup, 1), np.log(1e-6))     # duplicates are floored
    A = rng.normal(size=(4, 4)) / 4 + np.eye(4)
    S = A @ A.T
    exact = 0.5 * np.log((2 * np.pi * np.e) ** 4 * np.linalg.det(S))
    assert abs(knn_entropy(rng.multivariate_normal(np.zeros(4), S, 4000), 5) - exact) / exact < 0.03


def test_diversity_on_distinct_prompts(setup):
    "The diversity term ranks a rare prompt (unlike the others, asked for once) above a common one, whatever the repeats."
    world, table, *_ = setup
    ordinary = [p[0] for p in world.train_prompts if not p[2]]
    for rare in (QUALITY_ANCHORS[0], [p[0] for p in world.train_prompts if p[2]][0]):
        for reps in (1, 50):
            pool = [ordinary[0]] * reps + ordinary[1:] + [rare]
            ld = prompt_log_distances(pool, table, 5)
            assert ld[-1] > ld[:-1].max()
            # every pair of one prompt gets the same value, and the repeats change nothing
            assert np.allclose(ld[:reps], ld[0]) and np.allclose(ld[reps - 1:], prompt_log_distances(ordinary + [rare], table, 5))
    # the pair-level kNN (no deduplication) would put the repeated prompt at the floor instead
    raw = knn_log_distances(np.stack([table[t] for t in [ordinary[0]] * 50 + ordinary[1:]]), 5)
    assert np.allclose(raw[:50], np.log(1e-6))
    with pytest.raises(ValueError, match="distinct prompts"):
        prompt_log_distances(["a", "a", "b"], {"a": np.zeros(2), "b": np.ones(2)}, 2)


def test_flip_rate_falls_as_the_margin_threshold_rises():
    rng = np.random.default_rng(0)
    gap = rng.normal(size=20000)
    for noise in (0.5, 1.0, 2.0):
        rates = flip_rate_by_margin(gap + noise * rng.normal(size=gap.size), gap < 0)
        assert (np.diff(rates) <= 0).all() and rates[0] > 0.45 and rates[-1] < rates[0] - 0.1
    # a margin unrelated to the gap does not clean the labels
    flat = flip_rate_by_margin(rng.normal(size=gap.size), gap < 0)
    assert np.abs(flat - 0.5).max() < 0.12
    with pytest.raises(ValueError, match="one value per pair"):
        flip_rate_by_margin(np.zeros(3), np.zeros(2, bool))


def test_dpo_loss_takes_a_diffusers_unet():
    "A diffusers UNet2DConditionModel goes into the loss as it is, and matches the same UNet behind a wrapper."
    from diffusers import UNet2DConditionModel
    ddpm, _ = make_schedulers()
    ref = make_denoiser("unet", (3, 16, 16), cond_dim=8, channels=(8, 16))
    assert isinstance(ref, UNet2DConditionModel)
    model = copy.deepcopy(ref)
    g = torch.Generator().manual_seed(0)
    xw, xl, n = (torch.randn(3, 3, 16, 16, generator=g) for _ in range(3))
    c, t = torch.randn(3, 8, generator=g), torch.tensor([5, 400, 900])
    loss, acc, _ = diffusion_dpo_loss(model, ref, xw, xl, c, t, n, n, 500.0, ddpm)
    assert abs(loss.item() - math.log(2)) < 1e-6 and acc.item() == 0.5
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))

    class Wrapped(torch.nn.Module):
        def __init__(self, unet):
            super().__init__()
            self.unet = unet

        def forward(self, x, t, cond):
            return self.unet(x, t, encoder_hidden_states=cond[:, None, :]).sample

    a, _, _ = diffusion_dpo_loss(model, ref, xw, xl, c, t, n, n, 500.0, ddpm)
    b, _, _ = diffusion_dpo_loss(Wrapped(model), Wrapped(ref), xw, xl, c, t, n, n, 500.0, ddpm)
    assert torch.isclose(a, b, atol=1e-6) and abs(a.item() - math.log(2)) > 1e-6
    assert predict_noise(model, xw, t, c[:, None, :]).shape == xw.shape     # a (B, L, D) condition passes through


def test_fifa_selection():
    rng = np.random.default_rng(1)
    m, q, e = rng.normal(size=200), rng.normal(size=200), rng.normal(size=(200, 6))
    k = 20
    assert (fifa_select(m, q, e, k, 0, 0) == np.argsort(-m, kind="stable")[:k]).all()
    assert set(fifa_select(np.tanh(m) + 5, q, e, k, 0, 0)) == set(fifa_select(m, q, e, k, 0, 0))
    ld = knn_log_distances(e, 5)
    top = lambda s: set(np.argsort(-s, kind="stable")[:k])
    assert top(fifa_scores(m, 7 * q, ld)) == top(fifa_scores(m, q, ld))
    assert top(fifa_scores(m, 7 * q, ld, standardise=False)) != top(fifa_scores(m, q, ld, standardise=False))
    assert top(fifa_scores(m, q, ld, clip=0.0)) != top(fifa_scores(m, q, ld))
    # top K maximises the separable objective (brute force on a small pool)
    m, q, e = m[:10], q[:10], e[:10]
    s = fifa_scores(m, q, knn_log_distances(e, 2))
    best = max(combinations(range(10), 3), key=lambda S: s[list(S)].sum())
    assert set(best) == set(fifa_select(m, q, e, 3, n_neighbors=2))


def test_pairs_and_quality(setup):
    world, table, codes, codec, _, ddim, base, pairs = setup
    assert (pairs.gap[~pairs.flipped] >= 0).all() and (pairs.gap[pairs.flipped] < 0).all()
    assert np.allclose(codec.decode(pairs.z_w), pairs.x_w) and np.allclose(codec.decode(pairs.z_l), pairs.x_l)
    again = make_pairs(world, base, codec, codes, 400, np.random.default_rng(0), scheduler=ddim)
    assert np.array_equal(again.prompt, pairs.prompt) and torch.equal(again.z_w, pairs.z_w)
    q = quality_scores([p[0] for p in world.train_prompts], table)
    harm = np.array([p[2] for p in world.train_prompts])
    from sklearn.metrics import roc_auc_score
    assert roc_auc_score(~harm, q) > 0.95
    # with no flips and a near-zero temperature every label follows the annotators' reward
    exact = make_pairs(world, base, codec, codes, 200, np.random.default_rng(1), scheduler=ddim, temperature=1e-6, flip=0.0)
    assert (human_reward(world, exact.comp, exact.harmful, exact.x_w)
            >= human_reward(world, exact.comp, exact.harmful, exact.x_l) - 1e-9).all()


def test_proxy_reward_learns_preferences(setup):
    world, _, codes, _, _, _, _, pairs = setup
    x = lambda a: torch.as_tensor(a, dtype=torch.float32).flatten(1)
    c = codes([world.train_prompts[j][0] for j in pairs.prompt])
    w = torch.as_tensor(~pairs.flipped)[:, None]
    xw, xl = torch.where(w, x(pairs.x_w), x(pairs.x_l)), torch.where(w, x(pairs.x_l), x(pairs.x_w))
    for arch in ("mlp", "cnn"):
        proxy = ProxyReward(192, 32, arch=arch).fit(xw[:300], xl[:300], c[:300], steps=300)
        assert np.mean(proxy.margin(xw[300:], xl[300:], c[300:]) > 0) > 0.6, arch
    with pytest.raises(ValueError, match="arch"):
        ProxyReward(192, 32, arch="vit")


def test_bad_inputs(setup):
    *_, ddpm, _, base, pairs = setup
    z, c, t = pairs.z_w[:4], torch.zeros(4, 32), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="beta"):
        diffusion_dpo_loss(base, base, z, z, c, t, z, z, 0.0, ddpm)
    with pytest.raises(ValueError, match="same pairs"):
        diffusion_dpo_loss(base, base, z, z[:3], c, t, z, z, 1.0, ddpm)
    with pytest.raises(ValueError, match="k must be"):
        fifa_select(np.zeros(5), np.zeros(5), np.zeros((5, 2)), 6)
    with pytest.raises(ValueError, match="k must be"):
        fifa_select(np.zeros(5), np.zeros(5), np.zeros((5, 2)), 2.5)
    with pytest.raises(ValueError, match="noise"):
        diffusion_dpo_loss(base, base, z, z, c, t, z[:, :3], z, 1.0, ddpm)
    with pytest.raises(ValueError, match="share parameters"):
        train_dpo(base, base, z, z, c, 1, 1.0)
    with pytest.raises(ValueError, match="eval_every"):
        experiment.Config(steps=200, eval_every=30)
    with pytest.raises(ValueError, match="one value per pair"):
        fifa_scores(np.zeros(5), np.zeros(4), np.zeros(5))
    with pytest.raises(ValueError, match="denoiser"):
        make_denoiser("vit", (16,))
    with pytest.raises(ValueError, match="x must be"):
        base(torch.zeros(2, 12), torch.zeros(2, dtype=torch.long), torch.zeros(2, 32))
    with pytest.raises(ValueError, match="steps"):
        sample(base, c, z, steps=0)
    with pytest.raises(ValueError, match="shape"):
        shape_mask("star")
    with pytest.raises(ValueError, match="multiple of 8"):
        upscale(MARK, 10)
    with pytest.raises(ValueError, match="k_frac"):
        experiment.Config(k_frac=0.0)
    with pytest.raises(ValueError, match="n_seeds"):
        experiment.Config(n_seeds=1)
    with pytest.raises(ValueError, match="beta"):
        experiment.Config(beta=-1.0)


def test_tiny_run(tiny):
    again = experiment.run(experiment.Config.preset("tiny"))
    key = lambda out: [(r["seed"], r.get("arm"), r.get("step"), r.get("reward"), r.get("flip")) for r in out["rows"]]
    assert key(tiny) == key(again)
    ids = {c["id"]: c for c in tiny["claims"]}
    assert {"C1-budget", "C1-speed", "C1-random", "C2-flips", "C3-margin", "C3-quality", "C3-harm",
            "C3-diversity"} <= set(ids)
    assert tiny["seeds"] == [10, 11]
    for k in [k for k in ids if k.startswith("K")]:
        assert ids[k]["verdict"] == "passed", k
    arms = [r for r in tiny["rows"] if r["kind"] == "arm"]
    assert {r["n_pairs"] for r in arms if r["arm"] != "full"} == {40}


def _set(rows, metric, arm, by_seed):
    return with_metric(rows, metric, by_seed, kind="arm", arm=arm)


def test_claim_rules_follow_the_rows(tiny, monkeypatch):
    "Each claim's verdict follows its interval against its delta (or its band): every verdict the rules can give."
    cfg = experiment.Config.preset("tiny")
    seeds = tiny["seeds"]
    s0, s1 = seeds
    verdicts = lambda rows: {c["id"]: c["verdict"] for c in experiment.make_claims(rows, seeds, cfg)}
    # two seeds fail the replicate gate: every claim is not run, whatever its rows say
    claims = [c for c in experiment.make_claims(tiny["rows"], seeds, cfg) if c["kind"] == "claim"]
    assert claims and {c["verdict"] for c in claims} == {"not_run"}
    monkeypatch.setattr(experiment, "MIN_SEEDS", 2)      # the interval rules below, on the tiny run's two seeds
    d = experiment.DELTAS["reward"][0]
    # every gate passes on these rows, so the verdicts are the rules'
    base = tiny["rows"]
    for metric, value in (("base_reward", 0.3), ("proxy_agreement", 0.9), ("quality_auroc", 0.99),
                          ("base_harmful_mark", 0.5)):
        base = with_metric(base, metric, {s0: value, s1: value}, kind="seed")
    rows = _set(_set(base, "reward", "FiFA", {s0: 0.8, s1: 0.81}), "reward", "full", {s0: 0.6, s1: 0.6})
    rows = _set(rows, "final_reward", "full", {s0: 0.9, s1: 0.9})
    v = verdicts(rows)
    assert v["C1-budget"] == "reproduced" and v["C1-speed"] == "not_reproduced"
    # C1-speed is non-inferiority: FiFA slightly below the longer full run, within the margin, reproduces; an
    # interval across the margin's edge is inconclusive
    near = _set(rows, "final_reward", "full", {s0: 0.805, s1: 0.815})
    assert verdicts(near)["C1-speed"] == "reproduced"
    across = _set(rows, "final_reward", "full", {s0: 0.85, s1: 0.76})
    assert verdicts(across)["C1-speed"] == "inconclusive"
    # C1-budget: a real gain below delta is partial; seeds that disagree are inconclusive; a loss is not reproduced
    small = _set(rows, "reward", "FiFA", {s0: 0.6 + d / 4, s1: 0.6 + d * 0.255})
    assert verdicts(small)["C1-budget"] == "partial"
    noisy = _set(rows, "reward", "FiFA", {s0: 0.9, s1: 0.4})
    assert verdicts(noisy)["C1-budget"] == "inconclusive"
    worse = _set(rows, "reward", "FiFA", {s0: 0.59, s1: 0.591})
    assert verdicts(worse)["C1-budget"] == "not_reproduced"
    # C2 and C3-quality are "lower is better": the interval is baseline - FiFA
    r2 = _set(_set(base, "flip_ordinary", "FiFA", {s0: 0.1, s1: 0.11}), "flip_ordinary", "full", {s0: 0.3, s1: 0.3})
    r2 = _set(_set(r2, "harmful_mark", "FiFA", {s0: 0.3, s1: 0.31}), "harmful_mark", "FiFA, no quality", {s0: 0.1, s1: 0.1})
    v = verdicts(r2)
    assert v["C2-flips"] == "reproduced" and v["C3-quality"] == "not_reproduced"
    assert verdicts(_set(r2, "flip_ordinary", "FiFA", {s0: 0.1, s1: 0.35}))["C2-flips"] == "inconclusive"
    dq = experiment.DELTAS["C3-quality"][0]
    assert verdicts(_set(r2, "harmful_mark", "FiFA", {s0: 0.1 - dq / 2, s1: 0.1 - dq * 0.49}))["C3-quality"] == "partial"
    cl = experiment.make_claims(r2, seeds, cfg)
    assert all(c["delta"] for c in cl if c["kind"] == "claim")
    assert {c["id"]: c for c in cl}["C1-speed"]["band"] == [-experiment.SPEED_MARGIN, None]
    # C3-harm: FiFA's mark against the base model's and random K's, both must hold (the weaker verdict)
    r3 = with_metric(r2, "base_harmful_mark", {s0: 0.5, s1: 0.5}, kind="seed")
    r3 = _set(_set(r3, "harmful_mark", "FiFA", {s0: 0.1, s1: 0.11}), "harmful_mark", "random", {s0: 0.4, s1: 0.4})
    assert verdicts(r3)["C3-harm"] == "reproduced"
    assert verdicts(_set(r3, "harmful_mark", "random", {s0: 0.1 + dq / 2, s1: 0.11 + dq / 2.01}))["C3-harm"] == "partial"
    assert verdicts(_set(r3, "harmful_mark", "random", {s0: 0.1, s1: 0.11}))["C3-harm"] == "not_reproduced"
    assert verdicts(_set(r3, "harmful_mark", "random", {s0: 0.6, s1: 0.0}))["C3-harm"] == "inconclusive"
    # a failed gate makes its claims not_run, whatever the intervals say
    g = with_metric(rows, "proxy_agreement", {s0: 0.5, s1: 0.5}, kind="seed")
    assert verdicts(g)["C2-flips"] == "not_run" and verdicts(g)["C1-budget"] == "reproduced"
    g = with_metric(rows, "base_reward", {s0: 0.89, s1: 0.89}, kind="seed")     # DPO moved nothing
    v = verdicts(g)
    assert all(v[k] == "not_run" for k in ("C1-budget", "C1-speed", "C1-random", "C3-margin", "C3-diversity"))
    g = with_metric(r3, "quality_auroc", {s0: 0.6, s1: 0.6}, kind="seed")
    assert verdicts(g)["C3-harm"] == verdicts(g)["C3-quality"] == "not_run"
    g = with_metric(r3, "base_harmful_mark", {s0: 0.01, s1: 0.01}, kind="seed")
    assert verdicts(g)["C3-harm"] == "not_run"


def test_every_arm_gets_the_same_sweep():
    cfg = experiment.Config.preset("tiny", tune_grid=((3.0, 1e-4), (30.0, 3e-4)))
    rows = experiment.tune_job(cfg.seed + 100, cfg.to_dict(), cfg.tune_grid)
    assert sorted((r["arm"], r["beta"], r["lr"]) for r in rows) == sorted(
        (a, b, lr) for a in cfg.arms for b, lr in cfg.tune_grid)
    best = experiment.best_hparams(rows)
    for arm, b, lr in best:
        mine = [r for r in rows if r["arm"] == arm]
        assert (b, lr) == next((r["beta"], r["lr"]) for r in sorted(mine, key=lambda r: -r["reward"]))
    out = experiment.run(cfg)
    assert out["hparams"] == best and [r for r in out["rows"] if r["kind"] == "tune"] == rows
    used = {r["arm"]: (r["beta"], r["lr"]) for r in out["rows"] if r["kind"] == "arm"}
    own = {a: (b, lr) for a, b, lr in best}
    # the baselines and FiFA at their own best; the ablations at FiFA's, so each removes a term and nothing else
    assert all(used[a] == own[a] for a in (*experiment.BASELINES, "FiFA"))
    assert all(used[a] == own["FiFA"] for a in experiment.ABLATIONS)
    # the second view: each ablation whose own best differs from FiFA's runs again at it
    second = experiment.arms_to_run(dataclasses.replace(cfg, hparams=best, own_best=True))
    assert {a[:-len(experiment.OWN_BEST)] for a in second if a.endswith(experiment.OWN_BEST)} == {
        a for a in experiment.ABLATIONS if own[a] != own["FiFA"]}
    assert experiment.arm_hparams(dataclasses.replace(cfg, hparams=best), "margin" + experiment.OWN_BEST) == own["margin"]


def test_tuned_hparams_are_the_recorded_sweep():
    "Config.hparams (TUNED) is each arm's best point of the committed sweep, at the sizes of the laptop preset."
    from iclr25_repro.core.results import repo_root
    rec = json.loads((repo_root() / experiment.TUNING_RECORD).read_text())
    rows = rec["rows"]
    assert sorted((r["arm"], r["beta"], r["lr"]) for r in rows) == sorted(
        (a, b, lr) for a in experiment.ARMS for b, lr in experiment.TUNE_GRID)
    assert {r["seed"] for r in rows} == {100}
    assert experiment.best_hparams(rows) == experiment.Config().hparams == experiment.TUNED
    lap = experiment.Config.preset("laptop").to_dict()
    for k in ("n_pairs", "n_base_images", "base_steps", "steps", "batch", "k_frac", "alpha", "gamma"):
        assert rec["config"][k] == lap[k], k


def test_laptop_smoke(tmp_path):
    lap, smoke = experiment.Config.preset("laptop"), experiment.Config.preset("laptop", smoke=True)
    for f in dataclasses.fields(lap):
        if f.name not in experiment.Config.SMOKE and f.name not in ("device", "smoke"):
            assert getattr(smoke, f.name) == getattr(lap, f.name), f.name
    assert lap.n_seeds >= 3 and lap.seed_offset not in (0, 10, 100)     # fresh seeds, not the pilots' or ci's
    doc = cli.run_experiment("fifa", "laptop", "cpu", 0, root=tmp_path, smoke=True)
    ids = {c["id"] for c in doc["claims"]}
    assert {"C1-budget", "C2-flips", "C3-harm", "C3-diversity", "K3-dedup"} <= ids
    assert any(r.get("arm", "").endswith(experiment.OWN_BEST) for r in doc["details"]) or not any(
        experiment.arm_hparams(lap, a) != experiment.arm_hparams(lap, a + experiment.OWN_BEST) for a in experiment.ABLATIONS)
    assert not (tmp_path / "book").exists()
    est = cli.estimate_wall("fifa", "full", measure=False)
    assert est["seconds"] is not None and est["seconds"] <= cli.BUDGET_S["full"]


def test_full_smoke(tmp_path):
    full, smoke = experiment.Config.preset("full"), experiment.Config.preset("full", smoke=True)
    for f in dataclasses.fields(full):
        if f.name not in experiment.Config.SMOKE and f.name not in ("device", "smoke"):
            assert getattr(smoke, f.name) == getattr(full, f.name), f.name
    doc = cli.run_experiment("fifa", "full", "cpu", 0, root=tmp_path, smoke=True)
    ids = {c["id"] for c in doc["claims"]}
    assert {"C1-budget", "C2-flips", "C3-diversity", "K1-init"} <= ids
    assert not (tmp_path / "book").exists()
