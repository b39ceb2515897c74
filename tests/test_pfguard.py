"""Tests of iclr25_repro.pfguard: partitions, the importance ratios, the SIR samplers against Monte Carlo, the accountant
values of the brief in two libraries, the sanitiser's norms and noise, FD and the distances against closed forms,
scipy and POT, Adult's fixed encoding, weighted clipping, per-sample gradients against a loop, the Adult loader, bad inputs, determinism, the claims'
rules on constructed rows, a tiny run and the full preset's smoke run."""
import dataclasses

import numpy as np
import pytest
import torch

from iclr25_repro.core import cli
from iclr25_repro.pfguard import experiment
from iclr25_repro.pfguard.model import (GSWGAN, Arm, DPMixture, FairSampler, adult_arrays, adult_encode, balanced_ratios,
                                        cell_utility, dpsgd_epsilon, duplicate_then_partition, estimate_ratios,
                                        fairness_discrepancy, frechet_distance, gswgan_epsilon, load_adult,
                                        max_partitions_per_record, mixture_nll, partition, rescale, sanitise,
                                        sir_weights, sliced_wasserstein, weighted_clip)


def test_partition_disjoint_and_covering():
    parts = partition(1003, 10, 0)
    allv = np.concatenate(parts)
    assert len(parts) == 10 and sorted(allv.tolist()) == list(range(1003))
    assert {len(p) for p in parts} <= {100, 101} and max_partitions_per_record(parts, 1003) == 1
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition(1003, 10, 0)))
    with pytest.raises(ValueError, match="must not exceed"):
        partition(5, 6, 0)
    with pytest.raises(ValueError, match="positive int"):
        partition(5, 0, 0)


def test_duplication_spreads_a_record_over_partitions():
    groups = np.r_[np.zeros(900, int), np.ones(100, int)]
    parts = duplicate_then_partition(groups, [1], 4, 50, 0)
    k = max_partitions_per_record(parts, 1000)
    assert 2 <= k <= 4
    counts = np.bincount(np.concatenate(parts), minlength=1000)
    assert (counts[:900] == 1).all() and (counts[900:] == 4).all()
    with pytest.raises(ValueError):
        duplicate_then_partition(groups, [1], 0, 5, 0)


def test_balanced_ratios_exact_and_balancing():
    x, y, z = experiment.blobs(20000, 0, 0.2)
    r = balanced_ratios(y, z)
    pz = np.array([z[y == c].mean() for c in (0, 1)])
    assert np.allclose(r[z == 1], 0.5 / pz[y[z == 1]]) and np.allclose(r[z == 0], 0.5 / (1 - pz[y[z == 0]]))
    assert abs(r[z == 1].mean() - 2.5) < 0.1 and abs(r[z == 0].mean() - 0.625) < 0.01
    for c in (0, 1):  # weighted, each class's two groups carry equal mass
        m = y == c
        assert np.isclose((r[m] * z[m]).sum(), (r[m] * (1 - z[m])).sum())
    with pytest.raises(ValueError, match="unknown sensitive group"):
        balanced_ratios(y, np.where(z == 1, 2, 0))


def test_estimated_ratios_order_the_groups():
    x, y, z = experiment.blobs(4000, 1, 0.2)
    ref = np.concatenate([np.flatnonzero((y * 2 + z) == g)[:100] for g in range(4)])
    r = estimate_ratios(np.c_[x, y], np.c_[x[ref], y[ref]])
    assert np.all(r > 0) and np.median(r[z == 1]) > 2 * np.median(r[z == 0])


def test_sir_closed_forms_and_monte_carlo():
    r = np.array([2.5, 0.625, 0.625, 0.625, 0.625])  # one minority record among four majority ones
    p_std, p_imp = sir_weights(r, improved=False), sir_weights(r, improved=True)
    assert np.isclose(p_std[0], 2.5 / 5.0)
    q = r / (r.sum() - r)
    assert np.allclose(p_imp, q / q.sum()) and p_imp[0] > p_std[0]
    assert np.array_equal(sir_weights([3.0]), [1.0])
    for improved, p in ((False, p_std), (True, p_imp)):
        g = torch.Generator().manual_seed(0)
        s = FairSampler(np.arange(10, 15), np.r_[np.ones(10), r], num_samples=200000, improved=improved, generator=g)
        freq = np.bincount(np.array(list(s)) - 10, minlength=5) / 200000
        assert np.abs(freq - p).max() < 0.005 and len(s) == 200000
    uniform = FairSampler(np.arange(4), None, num_samples=40000, generator=torch.Generator().manual_seed(1))
    assert np.abs(np.bincount(list(uniform), minlength=4) / 40000 - 0.25).max() < 0.01
    for bad in ([1.0, 0.0], [1.0, -1.0], [np.inf, 1.0], []):
        with pytest.raises(ValueError):
            sir_weights(bad)
    with pytest.raises(ValueError, match="at least one record"):
        FairSampler([], None)


def test_accountants_reproduce_the_brief():
    assert abs(gswgan_epsilon(1000, 1.07, 20000, 32) - 9.99) < 0.02          # GS-WGAN's defaults, autodp
    assert abs(gswgan_epsilon(1000, 1.07, 1000, 32) - 1.98) < 0.02
    assert abs(gswgan_epsilon(1000, 1.07, 20000, 32, copies=2) - 23.8) < 0.1  # naive duplication
    assert abs(gswgan_epsilon(1000, 1.07, 20000, 32, copies=4) - 60.6) < 0.2
    # like for like: dp-accounting, one teacher of N without replacement, replace-one neighbours (the 9.24)
    e_like = gswgan_epsilon(1000, 1.07, 20000, 32, accountant="dp_accounting")
    assert abs(e_like - 9.24) < 0.02 and e_like < 9.99
    # DP-SGD: Poisson sampling, add/remove neighbours, effective multiplier sigma / w (the brief's 4.59 / 32.8 / 363)
    for w, eps in ((1, 4.59), (2, 32.8), (4, 363)):
        assert abs(dpsgd_epsilon(0.01, 1.0, 5000, weight=w) / eps - 1) < 0.005, w
    assert abs(dpsgd_epsilon(64 / 8000, 1.0, 1000) - 1.71) < 0.01            # ci's DP-SGD events
    e_auto = dpsgd_epsilon(0.01, 1.0, 5000, accountant="autodp")             # autodp, the same Poisson model
    assert abs(e_auto / dpsgd_epsilon(0.01, 1.0, 5000) - 1) < 0.15
    # q = 1, no subsampling: autodp's RDP with the classic conversion in closed form; dp-accounting no larger
    sig, T, delta = 2.0, 100, 1e-5
    alpha = 1 + np.sqrt(2 * sig ** 2 * np.log(1 / delta) / T)
    classic = T * alpha / (2 * sig ** 2) + np.log(1 / delta) / (alpha - 1)
    assert abs(dpsgd_epsilon(1.0, sig, T, delta, accountant="autodp") / classic - 1) < 1e-4
    assert dpsgd_epsilon(1.0, sig, T, delta) <= classic
    assert np.isclose(dpsgd_epsilon(0.01, 2.0, 500, weight=2.0), dpsgd_epsilon(0.01, 1.0, 500))
    assert dpsgd_epsilon(0.01, 1.0, 500, weight=2.5) > dpsgd_epsilon(0.01, 1.0, 500)
    for bad in (dict(sigma=0.0), dict(sigma=-1.0)):
        with pytest.raises(ValueError, match="sigma"):
            gswgan_epsilon(10, steps=10, batch=2, **bad)
        with pytest.raises(ValueError, match="sigma"):
            dpsgd_epsilon(0.1, steps=10, **bad)
    with pytest.raises(ValueError, match="copies"):
        gswgan_epsilon(10, 1.0, 10, 2, copies=11)
    with pytest.raises(ValueError, match="accountant"):
        dpsgd_epsilon(0.1, 1.0, 10, accountant="opacus?")
    with pytest.raises(ValueError, match="accountant"):
        gswgan_epsilon(10, 1.0, 10, 2, accountant="opacus?")
    with pytest.raises(ValueError, match="copies"):
        gswgan_epsilon(10, 1.0, 10, 2, copies=2, accountant="dp_accounting")
    with pytest.raises(ValueError, match="q must"):
        dpsgd_epsilon(1.5, 1.0, 10)


def test_sanitiser_norms_and_noise_scale():
    g = torch.randn(3, 32, 5) * torch.logspace(-4, 2, 32).view(1, 32, 1)
    out = sanitise(g, clip=1.0, sigma=0.0)
    bound = 1.0 / 32
    assert (out.norm(dim=-1) <= bound + 1e-6).all()
    small = g.norm(dim=-1) < bound
    assert torch.allclose(out[small], g[small])                         # small gradients pass unchanged
    noise = sanitise(torch.zeros(64, 32, 50), clip=1.0, sigma=1.07, generator=torch.Generator().manual_seed(0))
    assert abs(noise.std().item() / (1.07 * 2 * bound) - 1) < 0.02      # std sigma * 2C / B per coordinate
    # GS-WGAN's non-private hook: every fake's gradient rescaled to norm exactly C / B, direction kept, no noise
    r = rescale(g, 1.0)
    assert torch.allclose(r.norm(dim=-1), torch.full((3, 32), bound), rtol=1e-4)
    assert torch.allclose(torch.nn.functional.cosine_similarity(r, g, dim=-1), torch.ones(3, 32), atol=1e-5)


def test_generator_labels_uniform_and_gradient_is_the_hooks_output():
    """The generator's fakes carry uniform labels (GS-WGAN), and the gradient that reaches the generator is the hook's
    output: for a private arm (noise negligible) the clipped gradient of the loss, for a non-private arm the gradient
    rescaled to norm C / B (GS-WGAN's non-private hook), read off the last layer's bias (its gradient is the sum over
    the batch of the gradients w.r.t. the fakes)."""
    x, _, _ = experiment.blobs(400, 0, p_minority=0.2)
    y = np.where(np.arange(400) < 360, 0, 1)    # a 9:1 class prior: uniform labels are not the prior
    parts = partition(400, 2, 0)
    m = GSWGAN(x, y, [Arm(parts, sigma=1e-9), Arm(parts, sigma=None)], hidden=8, batch=64, seed=0)
    seen, raw = [], []
    gen_orig = m.generate
    def spy(yy, **kw):
        out = gen_orig(yy, **kw)
        if kw.get("grad"):
            seen.append(yy.clone())
            out.register_hook(lambda g: raw.append(g.clone()))   # registered first: runs first, sees the raw gradient
        return out
    m.generate = spy
    for _ in range(20):
        m.generator_step(torch.tensor([0, 2]))
        g = raw[-1]
        expected = torch.stack([sanitise(g[:1], 1.0, 0.0)[0], rescale(g[1:], 1.0)[0]])
        assert torch.allclose(m.G.biases[-1].grad, expected.sum(-2), atol=1e-6)
    share = torch.cat(seen).float().mean().item()
    assert abs(share - 0.5) < 4 * np.sqrt(0.25 / (20 * 2 * 64)), share


def test_dpsgd_batches_are_poisson():
    x, y, z = experiment.blobs(2000, 0)
    dm = DPMixture(x, y, balanced_ratios(y, z), "before", batch=64, seed=0).fit(100)
    sizes = np.array(dm.batch_sizes)
    assert abs(sizes.mean() - 64) < 4 * np.sqrt(64 / 100)       # mean q n
    assert abs(sizes.var() / (2000 * 0.032 * 0.968) - 1) < 0.5  # binomial spread, not a fixed batch


def test_fd_and_distances():
    y, z = np.repeat([0, 0, 1, 1], [40, 10, 40, 10]), np.tile(np.repeat([0, 1], [40, 10]), 2)
    assert np.isclose(fairness_discrepancy(y, z), 0.3)                 # FD([0.4, 0.1, 0.4, 0.1]) = 0.30
    assert fairness_discrepancy(np.repeat([0, 0, 1, 1], 25), np.tile(np.repeat([0, 1], 25), 2)) == 0
    assert np.isclose(fairness_discrepancy(y, z, target=[0.4, 0.1, 0.4, 0.1]), 0.0)
    with pytest.raises(ValueError, match="cells"):
        fairness_discrepancy(y, z, target=[0.5, 0.5])
    from scipy.stats import wasserstein_distance
    a, b = np.random.default_rng(0).normal(size=(300, 1)), np.random.default_rng(1).normal(1, 1, (200, 1))
    assert np.isclose(sliced_wasserstein(a, b), wasserstein_distance(a[:, 0], b[:, 0]))
    with pytest.raises(ValueError):
        sliced_wasserstein(a, np.zeros((5, 2)))
    g1, g2 = np.random.default_rng(0).normal(0, 1, (20000, 1)), np.random.default_rng(1).normal(2, 3, (20000, 1))
    closed = (g1.mean() - g2.mean()) ** 2 + (g1.std(ddof=1) - g2.std(ddof=1)) ** 2  # one dimension
    assert np.isclose(frechet_distance(g1, g2), closed) and abs(closed - 8.0) < 0.5
    from scipy.linalg import sqrtm
    rng = np.random.default_rng(2)
    p, q = rng.normal(size=(400, 4)) @ rng.normal(size=(4, 4)), rng.normal(1, 2, (300, 4))
    sp, sq = np.cov(p, rowvar=False), np.cov(q, rowvar=False)
    ref = ((p.mean(0) - q.mean(0)) ** 2).sum() + np.trace(sp + sq - 2 * sqrtm(sp @ sq).real)
    assert np.isclose(frechet_distance(p, q), ref)
    x, yy, zz = experiment.blobs(2000, 3)
    assert cell_utility(x, yy, zz, x, yy, zz) < 1e-9


def test_weighted_clip_orders():
    grads = [torch.randn(8, 3) * 5, torch.randn(8, 2, 2)]
    w = torch.rand(8) * 3 + 0.1
    s_none, _ = weighted_clip(grads, w, 1.0, "none")
    s_one, _ = weighted_clip(grads, torch.ones(8), 1.0, "before")
    assert all(torch.allclose(a, b) for a, b in zip(s_none, s_one))     # unit weights: before = no weighting
    norm = torch.sqrt(sum((g.flatten(1) ** 2).sum(1) for g in grads))
    for order, bound in (("before", torch.ones(8)), ("after", w)):
        one = [g[:1] for g in grads]
        s, _ = weighted_clip(one, w[:1], 1.0, order)
        assert torch.sqrt(sum((t ** 2).sum() for t in s)) <= bound[0] + 1e-5
    big = [torch.full((4, 2), 100.0)]
    _, share = weighted_clip(big, torch.ones(4), 1.0, "after")
    assert share == 1.0 and norm.shape == (8,)
    with pytest.raises(ValueError, match="order"):
        weighted_clip(grads, w, 1.0, "during")
    with pytest.raises(ValueError, match="positive"):
        weighted_clip(grads, -w, 1.0, "after")


def test_per_sample_grads_equal_a_loop():
    x, y, z = experiment.blobs(200, 0)
    m = DPMixture(x, y, balanced_ratios(y, z), "after", seed=0)
    xb, yb = m.x[:6], m.y[:6]
    batched = m.per_sample_grads(xb, yb)
    for i in range(6):
        p = [t.detach().clone().requires_grad_(True) for t in m.params]
        mixture_nll(p, xb[i], torch.nn.functional.one_hot(yb[i], 2).float()).backward()
        assert all(torch.allclose(b[i], q.grad, atol=1e-5) for b, q in zip(batched, p))
    with pytest.raises(ValueError, match="sigma"):
        DPMixture(x, y, sigma=0.0)


def test_adult_loader():
    df = load_adult()
    assert df.shape == (32561, 15)
    x, y, z = adult_arrays(df)
    assert x.shape == (32561, 6) and y.sum() == 7841 and z.sum() == 10771
    assert np.array_equal(x[:, -1], z)


def test_gswgan_bad_inputs_and_determinism():
    x, y, z = experiment.blobs(400, 0)
    parts = partition(400, 4, 0)
    with pytest.raises(ValueError, match="sigma"):
        GSWGAN(x, y, [Arm(parts, sigma=0.0)])
    with pytest.raises(ValueError, match="same number of teachers"):
        GSWGAN(x, y, [Arm(parts, sigma=1.0), Arm(partition(400, 5, 0), sigma=1.0)])
    with pytest.raises(ValueError, match="out"):
        GSWGAN(x, y, [Arm(parts)], out="sigmoid")
    far = GSWGAN(x * 10, y, [Arm(parts)], hidden=8, out="tanh", seed=0).fit(3, 1, 1, schedule="all")
    assert np.abs(far.sample(200)[0]).max() < 1     # a tanh output stays in (-1, 1) even for data far outside it
    r = balanced_ratios(y, z)

    def fit():
        m = GSWGAN(x, y, [Arm(parts, sigma=1.07), Arm(parts, r, sigma=1.07), Arm(parts, r, sigma=None)],
                   hidden=16, seed=3)
        m.fit(5, critic_iters=1, pretrain=2, schedule="all")
        return m.sample(50, arm=1, y=np.zeros(50, int))[0]

    a, b = fit(), fit()
    assert np.array_equal(a, b) and a.shape == (50, 2) and np.isfinite(a).all()


def test_config_bad_inputs():
    for bad in (dict(n_seeds=1), dict(worlds=("mnist",)), dict(schedule="some"), dict(claim_teachers=7),
                dict(sigma=0.0)):
        with pytest.raises(ValueError):
            experiment.Config.preset("tiny", **bad)


def _rows(fd_base, fd_pf, fd_orders, utility_pf=(0.3, 0.3, 0.3), adult=None, utility_matched=(0.3, 0.3, 0.3),
          base_share=((0.2, 0.2),) * 3):
    """Rows of the blob world and the DP-SGD mixture with the given per-seed FDs and PFGuard utility distances (the
    base's 0.3); with `adult` (a dict of per-seed arrays: eo_b, eo_p, acc_b, acc_p, majority) an Adult world too.
    `base_share`: the base's generated minority share per seed and class (the data's is 0.2 in each class). Every
    other metric equal across arms."""
    rows = []
    for s, (b, p) in enumerate(zip(fd_base, fd_pf)):
        worlds = ["blobs"] + (["adult"] if adult else [])
        for world in worlds:
            for arm, fd in (("base", b), ("PFGuard", p), ("naive duplication", p), ("non-private fair", p)):
                r = dict(world=world, seed=s, arm=arm, n_teachers=10, fd=fd, data_fd=0.3,
                         share_per_class=list(base_share[s]) if arm == "base" else [0.5, 0.5],
                         data_share_per_class=[0.2, 0.2], dp_gap=0.1,
                         utility=0.3 if arm == "base" else utility_pf[s],
                         epsilon=(None if arm == "non-private fair" else 20.0 if arm == "naive duplication" else 10.0))
                if world == "adult":
                    pf = arm != "base"
                    r.update(eo_gap=adult["eo_p" if pf else "eo_b"][s], accuracy=adult["acc_p" if pf else "acc_b"][s],
                             majority_rate=adult["majority"][s])
                if world == "blobs":
                    r.update(accuracy=0.95, majority_rate=0.5)
                rows.append(r)
        fd_orders = {"after, matched": fd_orders["after"]} | dict(fd_orders)
        for order, fds in fd_orders.items():
            rows.append(dict(world="blobs, DP-SGD", seed=s, order=order, clip=10.0, fd=fds[s], clipped_share=0.5,
                             utility=utility_matched[s] if order == "after, matched" else 0.3,
                             epsilon=5.0 if order == "after" else 1.0))
            rows.append(rows[-1] | dict(clip=3.0, fd=0.9))  # a bound of the sweep: never read by the claims
    return rows


def _claims(*args, **kwargs):
    worlds = ("blobs", "adult") if kwargs.get("adult") else ("blobs",)
    cfg = experiment.Config.preset("tiny", worlds=worlds)
    return {c["id"]: c for c in experiment.make_claims(_rows(*args, **kwargs), [0, 1, 2], cfg)}


EFFECTS = [((1.2, 1.3, 1.4), "reproduced"),          # above 0 and past delta
           ((0.3, 0.35, 0.4), "partial"),            # above 0, short of delta
           ((-1.0, 1.0, 3.0), "inconclusive"),       # reaches both 0 and delta
           ((-0.5, -0.4, -0.6), "not_reproduced")]   # reaches 0, short of delta


@pytest.mark.parametrize("m, verdict", EFFECTS)
def test_claim_rules_follow_the_effect_against_delta(m, verdict):
    "C1, C3 and C2-eo: the effect is each claim's delta times m[seed]; the verdict follows the 2x2 table."
    m = np.array(m)
    d1, d3, de = (experiment.DELTAS[k][0] for k in ("C1-blobs", "C3-clipping", "C2-eo-adult"))
    before = 0.05 + d3 * m   # gain lost = before - after; none = before, so nothing is kept
    orders = dict(none=before, before=before, after=np.full(3, 0.05))
    adult = dict(eo_b=np.full(3, 0.3), eo_p=0.3 - de * m, acc_b=np.full(3, 0.8), acc_p=np.full(3, 0.8),
                 majority=np.full(3, 0.76))
    c = _claims(np.full(3, 0.3), 0.3 - d1 * m, orders, adult=adult)
    for k in ("C1-blobs", "C3-clipping", "C2-eo-adult"):
        assert c[k]["verdict"] == verdict, (k, c[k]["interval"])
        assert c[k]["delta"] == experiment.DELTAS[k][0] and c[k]["better"] == "higher"
        assert f"delta = {c[k]['delta']}" in c[k]["rule"]
    assert c["C1-adult"]["delta"] == experiment.DELTAS["C1-adult"][0]
    assert c["K1-epsilon-blobs"]["verdict"] == "passed" and c["K2-naive-blobs"]["verdict"] == "passed"


def test_clipping_claim_takes_the_weaker_part():
    "C3 needs the gain lost to matter and to exceed the gain kept: a real loss that keeps more than it loses fails."
    fair, unfair = [0.05, 0.06, 0.04], [0.3, 0.32, 0.28]
    truncated = dict(none=[0.30, 0.31, 0.29], before=[0.29, 0.30, 0.28], after=[0.05, 0.07, 0.06])
    assert _claims(unfair, fair, truncated)["C3-clipping"]["verdict"] == "reproduced"
    most_kept = dict(none=[0.60, 0.61, 0.59], before=[0.25, 0.26, 0.24], after=[0.05, 0.07, 0.06])
    c3 = _claims(unfair, fair, most_kept)["C3-clipping"]
    assert c3["interval"]["lo"] > c3["delta"]   # the gain lost alone would reproduce ...
    assert c3["verdict"] == "not_reproduced"    # ... but weighting before clipping keeps more than it loses


@pytest.mark.parametrize("log_ratio, verdict", [((0.0, 0.05, 0.1), "reproduced"),
                                                ((-0.2, 0.2, 0.6), "inconclusive"),
                                                ((0.5, 0.55, 0.6), "not_reproduced")])
def test_utility_band(log_ratio, verdict):
    fd = [0.3, 0.3, 0.3]
    c = _claims(fd, fd, dict(none=fd, before=fd, after=fd), utility_pf=0.3 * np.exp(log_ratio))["C2-utility-blobs"]
    assert c["verdict"] == verdict and c["band"] == [None, pytest.approx(np.log(experiment.UTILITY_TOLERANCE))]
    assert c["delta"] == pytest.approx(np.log(1.25))


@pytest.mark.parametrize("diff, verdict", [((0.0, 0.002, -0.002), "reproduced"),
                                           ((-0.05, 0.0, 0.05), "inconclusive"),
                                           ((-0.1, -0.11, -0.09), "not_reproduced")])
def test_accuracy_band(diff, verdict):
    fd = [0.3, 0.3, 0.3]
    adult = dict(eo_b=np.full(3, 0.3), eo_p=np.full(3, 0.3), acc_b=np.full(3, 0.8), acc_p=0.8 + np.array(diff),
                 majority=np.full(3, 0.76))
    c = _claims(fd, fd, dict(none=fd, before=fd, after=fd), adult=adult)["C2-accuracy-adult"]
    assert c["verdict"] == verdict and c["band"] == [-experiment.ACCURACY_TOLERANCE, None]


def test_adult_gate_gives_not_run():
    "The base's downstream accuracy below the majority rate in one seed: Adult's downstream and utility claims not run."
    fd = [0.3, 0.3, 0.3]
    adult = dict(eo_b=np.full(3, 0.3), eo_p=np.full(3, 0.0), acc_b=np.array([0.8, 0.7, 0.8]), acc_p=np.full(3, 0.8),
                 majority=np.full(3, 0.76))
    c = _claims(fd, [0.0, 0.0, 0.0], dict(none=fd, before=fd, after=fd), adult=adult)
    for k in ("C2-eo-adult", "C2-accuracy-adult", "C2-utility-adult"):
        assert c[k]["verdict"] == "not_run", k
        (g,) = c[k]["gates"]
        assert not g["passed"] and g["value"] == pytest.approx(-0.06) and g["threshold"] == 0.0
    (g,) = c["C2-utility-blobs"]["gates"]                  # the blob world's own gate passes
    assert g["passed"] and c["C2-utility-blobs"]["verdict"] == "reproduced"
    assert c["C1-adult"]["verdict"] == "reproduced"   # FD needs no downstream classifier
    adult["acc_b"] = np.full(3, 0.8)
    c = _claims(fd, [0.0, 0.0, 0.0], dict(none=fd, before=fd, after=fd), adult=adult)
    assert c["C2-eo-adult"]["verdict"] == "reproduced" and c["C2-eo-adult"]["gates"][0]["passed"]


@pytest.mark.parametrize("log_ratio, verdict", [((0.5, 0.55, 0.6), "reproduced"),
                                                ((0.1, 0.11, 0.12), "partial"),
                                                ((-0.5, 0.5, 1.5), "inconclusive"),
                                                ((-0.02, 0.0, 0.02), "not_reproduced")])
def test_matched_clipping_claim(log_ratio, verdict):
    "C3-matched: the quality cost of weighting after clipping at the same epsilon, against delta = log(1.25)."
    fd = [0.3, 0.3, 0.3]
    c = _claims(fd, fd, dict(none=fd, before=fd, after=fd), utility_matched=0.3 * np.exp(log_ratio))
    assert c["C3-matched"]["verdict"] == verdict, c["C3-matched"]["interval"]
    assert c["C3-matched"]["delta"] == pytest.approx(np.log(1.25))
    assert c["C3-clipping"]["verdict"] == "not_reproduced"   # read at the claims' bound only, not the sweep's 0.9
    assert c["K4-matched-epsilon"]["verdict"] == "passed"


def test_utility_gate_on_every_world():
    "C2-utility is gated on each world's own base: below the majority rate on the blobs, that claim is not run."
    fd = [0.3, 0.3, 0.3]
    rows = _rows(fd, fd, dict(none=fd, before=fd, after=fd))
    for r in rows:
        if r["world"] == "blobs" and r["arm"] == "base" and r["seed"] == 1:
            r["accuracy"] = 0.45
    cfg = experiment.Config.preset("tiny", worlds=("blobs",))
    c = {c["id"]: c for c in experiment.make_claims(rows, [0, 1, 2], cfg)}
    assert c["C2-utility-blobs"]["verdict"] == "not_run"
    assert c["C2-utility-blobs"]["gates"][0]["value"] == pytest.approx(-0.05)
    assert c["C1-blobs"]["verdict"] != "not_run"


def test_tiny_run():
    cfg = experiment.Config.preset("tiny")
    out = experiment.run(cfg)
    ids = {c["id"] for c in out["claims"]}
    assert {"C1-blobs", "C1-adult", "C2-utility-blobs", "C2-eo-adult", "C3-clipping", "K1-epsilon-adult",
            "K3-after-clipping-epsilon"} <= ids
    checks = [c for c in out["claims"] if c["id"].startswith("K")]
    assert all(c["verdict"] == "passed" for c in checks)
    world_rows = [r for r in out["rows"] if r["world"] != "blobs, DP-SGD"]
    assert {r["arm"] for r in world_rows} == set(experiment.ARMS)
    assert all(0 <= r["fd"] <= 1 for r in out["rows"])
    assert all(np.isfinite(r["dp_gap"]) or np.isnan(r["accuracy"]) for r in world_rows)
    assert all(len(r["data_share_per_class"]) == 2 for r in world_rows)
    assert all(len(c["gates"]) == 1 for c in out["claims"] if c["id"].startswith("C1-"))


def test_adult_encoding():
    "Adult's encoding: every column linear onto [-1, 1] between public bounds; the sex column's sign is the group."
    d = experiment.adult_world(0, 2000, 500)
    assert d["x"].shape == (2000, 6) and d["x_test"].shape == (500, 6) and d["x"].dtype == np.float32
    assert set(np.unique(d["x"][:, 4:])) == {-1.0, 1.0}
    assert np.array_equal(d["x"][:, 5] > d["sex_cut"], d["z"] == 1)
    assert np.array_equal(d["x_test"][:, 5] > d["sex_cut"], d["z_test"] == 1)
    assert np.abs(d["x"]).max() <= 1 and np.abs(d["x_test"]).max() <= 1
    # a fixed map, not fitted on the split: the same raw record encodes the same way in every split
    raw = np.array([[17, 1, 1, 0, 0, 0], [90, 16, 99, np.log1p(99999), 1, 1], [53.5, 8.5, 50, np.log1p(99999) / 2, 1, 0]])
    assert np.allclose(adult_encode(raw), [[-1] * 6, [1] * 6, [0, 0, 0, 0, 1, -1]], atol=1e-6)
    assert np.array_equal(adult_encode([[200, 30, 150, 20, 2, 2]]), np.ones((1, 6), np.float32))   # clipped
    with pytest.raises(ValueError, match="shape"):
        adult_encode(np.zeros((3, 5)))
    assert np.array_equal(experiment.adult_world(0, 2000, 500)["x"], d["x"])   # deterministic


def test_dpsgd_job_matched_epsilon_and_sweep():
    "The DP-SGD job: the matched arm's noise times max(w) gives the nominal epsilon; every bound of the sweep is run."
    cfg = experiment.Config.preset("tiny", dp_steps=5, dp_clips=(1.0, 10.0))
    rows = experiment.dpsgd_job(0, {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})["rows"]
    at = {(r["clip"], r["order"]): r for r in rows}
    assert set(at) == {(10.0, o) for o in experiment.DP_ORDERS} | {(1.0, o) for o in ("none", "before", "after, matched")}
    assert at[(10.0, "after, matched")]["epsilon"] == pytest.approx(at[(10.0, "before")]["epsilon"])
    assert at[(10.0, "after")]["epsilon"] > at[(10.0, "before")]["epsilon"]


def test_laptop_preset_privacy_and_plan():
    "The laptop preset reaches the paper's regime by the accountant (epsilon <= 10); every phase counts its work."
    lap, ci = experiment.Config.preset("laptop"), experiment.Config.preset("ci")
    assert gswgan_epsilon(lap.claim_teachers, lap.sigma, lap.steps, lap.batch, lap.delta) <= 10
    assert gswgan_epsilon(ci.claim_teachers, ci.sigma, ci.steps, ci.batch, ci.delta) > 100
    assert lap.n_seeds >= 5 and lap.n_blobs // lap.claim_teachers >= 40   # every teacher holds minority records
    full = experiment.Config.preset("full")
    assert gswgan_epsilon(full.claim_teachers, full.sigma, full.steps, full.batch, full.delta) <= 10.5
    for cfg in (lap, ci, full):
        assert all(p["units"] > 0 for p in experiment.plan(cfg))
    assert cli.plan_units(experiment.plan(full)) / experiment.GPU_UNITS_PER_S < 600


def test_laptop_smoke(tmp_path):
    lap, smoke = experiment.Config.preset("laptop"), experiment.Config.preset("laptop", smoke=True)
    for f in dataclasses.fields(lap):
        if f.name not in experiment.Config.SMOKE and f.name not in ("device", "smoke"):
            assert getattr(smoke, f.name) == getattr(lap, f.name), f.name
    doc = cli.run_experiment("pfguard", "laptop", "cpu", 0, root=tmp_path, smoke=True)
    ids = {c["id"] for c in doc["claims"]}
    assert {"C1-blobs", "C1-adult", "C3-clipping", "C3-matched", "K4-matched-epsilon"} <= ids
    assert not (tmp_path / "book").exists()


def test_full_smoke(tmp_path):
    full, smoke = experiment.Config.preset("full"), experiment.Config.preset("full", smoke=True)
    for f in dataclasses.fields(full):
        if f.name not in experiment.Config.SMOKE and f.name not in ("device", "smoke"):
            assert getattr(smoke, f.name) == getattr(full, f.name), f.name
    doc = cli.run_experiment("pfguard", "full", "cpu", 0, root=tmp_path, smoke=True)
    ids = {c["id"] for c in doc["claims"]}
    assert {"C1-blobs", "C2-utility-blobs", "C1-adult", "C3-clipping", "C3-matched"} <= ids
    assert not (tmp_path / "book").exists()


def test_critic_step_draws_the_sir_minority_share():
    "A PFGuard teacher's minibatches in critic_step: its minority share matches the improved SIR probabilities."
    x, y, z = experiment.blobs(400, 0)
    r = balanced_ratios(y, z)
    parts = partition(400, 2, 0)
    model = GSWGAN(x, y, [Arm(parts, r, sigma=1.0)], hidden=8, batch=64, seed=0)
    p = sir_weights(r[parts[0]])
    expected = float(p[z[parts[0]] == 1].sum())
    assert abs(expected - 0.5) < 0.1 and z[parts[0]].mean() < 0.3          # SIR balances a 20% minority
    drawn = []
    for _ in range(100):
        model.critic_step(torch.tensor([0]))
        drawn.append(model.last_records[0].numpy())
    drawn = np.concatenate(drawn)
    assert set(drawn) <= set(parts[0].tolist())                             # only the teacher's own partition
    assert abs(z[drawn].mean() - expected) < 4 * np.sqrt(expected * (1 - expected) / len(drawn))


def test_make_arms_copies_and_epsilons():
    "make_arms: PFGuard and the base share one partition (one copy per record); naive duplication copies minorities."
    cfg = experiment.Config.preset("tiny")
    rng = np.random.default_rng(0)
    x, y, z = experiment.blobs(2000, rng)
    arms, names, spread = experiment.make_arms(dict(x=x, y=y, z=z), 20, cfg, rng)
    assert names == list(experiment.ARMS)
    base, pf, naive, nonpriv = arms
    assert pf.parts is base.parts and nonpriv.parts is base.parts and spread[:2] == [1, 1]
    assert pf.weights is not None and base.weights is None and nonpriv.sigma is None and pf.sigma == cfg.sigma
    counts = np.bincount(np.concatenate(naive.parts), minlength=2000)
    r = balanced_ratios(y, z)
    assert np.array_equal(counts, np.rint(r / r[z == 0].min()).astype(int))  # minority copied about 4 times
    assert spread[2] == max_partitions_per_record(naive.parts, 2000) > 1
    assert gswgan_epsilon(20, cfg.sigma, 100, 32, copies=spread[2]) > gswgan_epsilon(20, cfg.sigma, 100, 32)


def test_c1_coverage_gate():
    "C1 is not run when the base collapses onto the majority group in one (seed, class); a base at half the share runs."
    fd = [0.3, 0.3, 0.3]
    collapsed = ((0.2, 0.2), (0.2, 0.0), (0.2, 0.2))
    c = _claims([0.5, 0.5, 0.5], [0.05, 0.05, 0.05], dict(none=fd, before=fd, after=fd), base_share=collapsed)
    assert c["C1-blobs"]["verdict"] == "not_run"
    (g,) = c["C1-blobs"]["gates"]
    assert not g["passed"] and g["value"] == 0.0 and g["threshold"] == experiment.COVERAGE_FLOOR
    c = _claims([0.5, 0.5, 0.5], [0.05, 0.06, 0.04], dict(none=fd, before=fd, after=fd),
                base_share=((0.1, 0.2), (0.2, 0.3), (0.2, 0.2)))
    assert c["C1-blobs"]["verdict"] == "reproduced" and c["C1-blobs"]["gates"][0]["value"] == pytest.approx(0.5)


def test_downstream_gaps_match_their_definitions():
    "fairlearn's demographic-parity and equalized-odds gaps of the downstream classifier, against the definitions."
    rng = np.random.default_rng(0)
    x, y, z = experiment.blobs(600, rng)
    xt, yt, zt = experiment.blobs(800, rng)
    feat = lambda x, z: np.c_[x[:, 0] + rng.normal(0, 1.0, len(x)) + 0.8 * z]  # noisy class signal, shifted by group
    f_syn, f_test = feat(x, z), feat(xt, zt)
    out = experiment.downstream(f_syn, y, f_test, yt, zt)
    from sklearn.linear_model import LogisticRegression
    pred = LogisticRegression(max_iter=2000).fit(f_syn, y).predict(f_test)
    rate = lambda m: pred[m].mean()
    assert out["dp_gap"] == pytest.approx(abs(rate(zt == 0) - rate(zt == 1)))
    eo = max(abs(rate((zt == 0) & (yt == c)) - rate((zt == 1) & (yt == c))) for c in (0, 1))
    assert out["eo_gap"] == pytest.approx(eo)
    assert out["accuracy"] == pytest.approx((pred == yt).mean()) and out["majority_rate"] == max(yt.mean(), 1 - yt.mean())
    assert out["dp_gap"] > 0.1 and out["eo_gap"] > 0.1          # the group shift shows in both gaps
    assert np.isnan(experiment.downstream(x, np.zeros_like(y), xt, yt, zt)["dp_gap"])


def test_sliced_wasserstein_closed_form_and_pot():
    """Two unit Gaussians a shift m apart: on direction u the projections are N(0, 1) and N(u.m, 1), W1 = |u.m|, so the
    sliced W1 over uniform directions is |m| E|u_1| = |m| Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)); and POT agrees."""
    from scipy.special import gamma
    rng = np.random.default_rng(0)
    for d in (2, 5):
        m = np.r_[1.5, np.zeros(d - 1)]
        a, b = rng.normal(size=(4000, d)), rng.normal(size=(4000, d)) + m
        exact = 1.5 * gamma(d / 2) / (np.sqrt(np.pi) * gamma((d + 1) / 2))
        assert sliced_wasserstein(a, b, n_proj=400) == pytest.approx(exact, rel=0.05), d
    import ot   # POT, a dependency: the library twin of the sliced distance
    a, b = rng.normal(size=(2000, 4)), rng.normal(1.0, 2.0, (2000, 4))
    ours = sliced_wasserstein(a, b, n_proj=400)
    theirs = ot.sliced_wasserstein_distance(a, b, n_projections=400, p=1, seed=0)
    assert ours == pytest.approx(theirs, rel=0.05)
