"""Tests of iclr25_repro.ncf: the self-modulated field (zero distance, exactness, Taylor mode against jvp, batched jvp
against a loop), the integrator against torchdiffeq, the ensemble identity, the data generators, bad inputs,
determinism, the claims' rules, a tiny run of the experiment and the full preset's smoke run."""
import math

import numpy as np
import pytest
import torch
from torch.func import jvp

from iclr25_repro.ncf import experiment
from iclr25_repro.ncf.model import (BT_GRID, NCF, CAVIAField, CoDAField, ContextField, brusselator, brusselator_system,
                                    csm_field, generate, glycolytic_system, lotka_volterra_system, rk4, selkov_system)


@pytest.fixture(scope="module")
def lv_data():
    lv = lotka_volterra_system()
    return lv, generate(lv, "train", 2, seed=0).astype(np.float32), torch.as_tensor(lv.t, dtype=torch.float32)


def test_parameter_count_matches_the_papers_lv_architecture():
    assert sum(p.numel() for p in ContextField(2, 1024, 64).parameters()) == 308_233


@pytest.mark.parametrize("order", [0, 1, 2])
def test_zero_distance_gives_the_field(order):
    torch.manual_seed(0)
    f = ContextField(3, 5, 8).double()
    x, xi = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    assert torch.allclose(csm_field(f, x, xi, xi, order), f(x, xi), atol=1e-12)


def test_taylor_mode_equals_nested_jvp_and_the_official_form():
    torch.manual_seed(1)
    f = ContextField(2, 6, 8).double()
    x, xe, xj = (torch.randn(5, d, dtype=torch.float64) for d in (2, 6, 6))
    for k in (1, 2):
        assert torch.allclose(f.expanded(x, f.context_jet(xj, xe - xj, k), k), csm_field(f, x, xe, xj, k), atol=1e-12)
    f_of = lambda xi: f(x, xi)
    val, jd = jvp(f_of, (xj,), (xe - xj,))
    nested = jvp(lambda xi: jvp(f_of, (xi,), (xe - xi,))[1], (xj,), (xe - xj,))[1]
    assert torch.allclose(csm_field(f, x, xe, xj, 2), val + 1.5 * jd + 0.5 * nested, atol=1e-12)


def test_first_order_exact_for_affine_and_second_order_for_quadratic_fields():
    torch.manual_seed(2)
    A, Q = torch.randn(2, 4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64)
    affine = lambda x, xi: torch.sin(x) + xi @ A.T
    quad = lambda x, xi: torch.cos(x) + xi @ A.T + ((xi @ Q) * xi).sum(-1, keepdim=True)
    x, xe, xj = torch.randn(3, 2, dtype=torch.float64), 5 * torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    assert torch.allclose(csm_field(affine, x, xe, xj, 1), affine(x, xe), atol=1e-10)
    assert torch.allclose(csm_field(quad, x, xe, xj, 2), quad(x, xe), atol=1e-9)
    assert not torch.allclose(csm_field(quad, x, xe, xj, 1), quad(x, xe), atol=1e-3)


def test_batched_jvp_equals_a_per_sample_loop():
    torch.manual_seed(3)
    f = ContextField(2, 4, 8).double()
    x, xi, d = torch.randn(6, 2).double(), torch.randn(6, 4).double(), torch.randn(6, 4).double()
    batched = jvp(lambda z: f(x, z), (xi,), (d,))[1]
    loop = torch.stack([torch.autograd.functional.jvp(lambda z: f(x[i:i + 1], z), xi[i:i + 1], d[i:i + 1])[1][0]
                        for i in range(6)])
    assert torch.allclose(batched, loop, atol=1e-12)


def test_rk4_against_torchdiffeq_and_order():
    torchdiffeq = pytest.importorskip("torchdiffeq")
    F = lambda z: torch.stack([0.5 * z[..., 0] - z[..., 0] * z[..., 1], 0.75 * z[..., 0] * z[..., 1] - 0.5 * z[..., 1]], -1)
    t = torch.linspace(0, 5, 11, dtype=torch.float64)
    z0 = torch.tensor([[1.5, 1.2]], dtype=torch.float64)
    ref = torchdiffeq.odeint(lambda s, z: F(z), z0, t, method="dopri5", rtol=1e-10, atol=1e-12).transpose(0, 1)
    e1 = (rk4(F, z0, t, 1) - ref).abs().max().item()
    e2 = (rk4(F, z0, t, 2) - ref).abs().max().item()
    assert e2 < 1e-3 and 10 < e1 / e2 < 25  # halving the step divides the error by about 16
    em = (rk4(F, z0, t, 4, method="midpoint") - ref).abs().max().item()
    assert em < 1e-2
    with pytest.raises(ValueError, match="method"):
        rk4(F, z0, t, 1, method="euler")


@pytest.mark.parametrize("opts", [dict(), dict(joint=True, cosine=True)])
def test_ensemble_member_equals_a_solo_run(lv_data, opts):
    lv, tr, t = lv_data
    torch.manual_seed(4)
    m = NCF(2, 9, context_dim=3, width=8, pool=3, members=2, method="midpoint")
    start = {k: v.detach().clone() for k, v in m.state_dict().items()}
    h = m.fit(tr, t, steps=4, seed=1, **opts)
    solo = NCF(2, 9, context_dim=3, width=8, pool=3, members=1, method="midpoint")
    solo.load_state_dict({k: v[1:2] for k, v in start.items()})
    g = torch.Generator().manual_seed(1)
    pools = iter([m.draw_pools(g) for _ in range(4)])
    solo.draw_pools = lambda generator: next(pools)[1:2]
    hs = solo.fit(tr, t, steps=4, seed=1, **opts)
    assert np.allclose(h[:, 1], hs[:, 0], rtol=1e-5)
    for k, v in m.state_dict().items():
        assert torch.allclose(v[1:2], solo.state_dict()[k], atol=1e-5), k


def test_members_with_their_own_data_equal_solo_runs_on_it(lv_data):
    lv, tr, t = lv_data
    other = generate(lv, "train", 2, seed=1).astype(np.float32)
    torch.manual_seed(4)
    m = NCF(2, 9, context_dim=3, width=8, pool=3, members=2, method="midpoint")
    start = {k: v.detach().clone() for k, v in m.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    drawn = [m.draw_pools(g) for _ in range(3)]
    h = m.fit(np.stack([tr, other]), t, steps=3, seed=1)
    for k, data in enumerate((tr, other)):  # member k trained alone on its own data, with the same pools
        solo = NCF(2, 9, context_dim=3, width=8, pool=3, members=1, method="midpoint")
        solo.load_state_dict({n: v[k:k + 1] for n, v in start.items()})
        pools = iter(drawn)
        solo.draw_pools = lambda generator, k=k: next(pools)[k:k + 1]
        hs = solo.fit(data, t, steps=3, seed=1)
        assert np.allclose(h[:, k], hs[:, 0], rtol=1e-5)
        for n, v in m.state_dict().items():
            assert torch.allclose(v[k:k + 1], solo.state_dict()[n], atol=1e-5), n
    with pytest.raises(ValueError, match="member axis"):
        m.fit(np.stack([tr, other, tr]), t, steps=1)


def test_adapt_leaves_the_weights_alone_and_the_loss_reaches_the_pool(lv_data):
    lv, tr, t = lv_data
    torch.manual_seed(7)
    m = NCF(2, 9, context_dim=3, width=8, pool=3)
    with torch.no_grad():
        m.contexts.normal_()
    before = {k: v.clone() for k, v in m.field.state_dict().items()}
    m.adapt(tr[:2, :1], t, steps=3)
    assert all(torch.equal(before[k], v) for k, v in m.field.state_dict().items())
    assert all(p.requires_grad for p in m.field.parameters())
    pools = torch.tensor([[[(e + 1) % 9, (e + 2) % 9, (e + 3) % 9] for e in range(9)]])
    tr4 = torch.as_tensor(tr)
    total, _ = m.loss(tr4[:, :, :5], t[:5], pools)
    total.backward()
    # every environment appears in some other environment's pool, so every context gets a gradient from the data
    assert (m.contexts.grad.abs().sum(-1) > 0).all()


def test_fit_adapt_predict_shapes_and_determinism(lv_data):
    lv, tr, t = lv_data
    def once():
        torch.manual_seed(5)
        m = NCF(2, 9, context_dim=3, width=8, members=2)
        h = m.fit(tr, t, steps=3, seed=0, joint=True, cosine=True)
        c = m.adapt(tr[:2, :1], t, steps=3, seed=0)
        return h, c, m.predict(tr[:2, :, 0], t, c), m.candidates(tr[:2, :, 0], t, c)
    a, b = once(), once()
    assert a[0].shape == (3, 2) and a[1].shape == (2, 2, 3) and a[2].shape == (2, 2, 2, 20, 2)
    assert a[3].shape == (2, 2, 9, 2, 20, 2)
    for u, v in zip(a, b):
        assert np.allclose(np.asarray(u), np.asarray(v))


def test_proximal_training_lowers_the_loss_and_one_for_all_ignores_the_environment(lv_data):
    lv, tr, t = lv_data
    torch.manual_seed(6)
    m = NCF(2, 9, context_dim=3, width=8, method="midpoint")
    h = m.fit(tr, t, steps=40, mode="t2", inner=5, prox=10.0, lr=1e-2)
    assert h.shape == (20, 1) and h[-1, 0] < 0.7 * h[0, 0]           # 4 outer steps of 5 weight steps: it learns
    assert m.contexts.abs().max() > 0                                   # and the context blocks moved the contexts
    torch.manual_seed(6)
    ofa = NCF(2, 9, context_dim=0, order=0, pool=1, self_pool=True, width=8, method="midpoint")
    h = ofa.fit(tr, t, steps=10, lr=1e-2)
    assert h[-1, 0] < h[0, 0]
    assert ofa.adapt(tr[:1, :1], t, steps=2).shape == (1, 1, 0)        # nothing to adapt
    # no context: two environments started from the same states get the same trajectories
    x0 = np.repeat(tr[:1, :, 0], 2, axis=0)
    pred = ofa.predict(x0, t, torch.zeros(1, 2, 0))
    assert torch.equal(pred[0, 0], pred[0, 1])


def test_prox_zero_with_one_inner_step_equals_plain_alternation(lv_data):
    lv, tr, t = lv_data
    def trained(mode, steps, prox, inner=1):
        torch.manual_seed(3)
        m = NCF(2, 9, context_dim=3, width=8, order=0, pool=1, self_pool=True, method="midpoint")
        return m, m.fit(tr, t, steps=steps, mode=mode, inner=inner, prox=prox, lr=1e-2)
    (a, ha), (b, hb) = trained("t1", 4, 0.0), trained("t2", 8, 0.0)
    assert np.array_equal(ha, hb)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    # two inner steps per block change the order of the updates: the comparison can see a difference
    c, _ = trained("t2", 8, 0.0, inner=2)
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_candidates_equal_a_loop_over_training_contexts(lv_data):
    lv, tr, t = lv_data
    torch.manual_seed(4)
    m = NCF(2, 9, context_dim=3, width=8, members=2, method="midpoint")
    with torch.no_grad():
        m.contexts.normal_()
    new = torch.randn(2, 2, 3)
    x0 = torch.as_tensor(tr[:2, :, 0])
    for order in (1, 2):
        cand = m.candidates(x0, t, new, order=order)
        for k in range(2):
            one = ContextField(2, 3, 8)
            one.load_state_dict({n: p[k:k + 1] for n, p in m.field.state_dict().items()})
            for e in range(2):
                for j in range(9):
                    xe, xj = new[k, e].expand(2, -1).clone(), m.contexts[k, j].detach().expand(2, -1).clone()
                    ref = rk4(lambda x: csm_field(one, x, xe, xj, order), x0[e], t, method="midpoint")
                    assert torch.allclose(cand[k, e, j], ref, atol=1e-5), (order, k, e, j)


def test_coda_field_rows_equal_the_mlp_with_their_own_weights_and_it_trains(lv_data):
    lv, tr, t = lv_data
    torch.manual_seed(0)
    f = CoDAField(2, 3, width=8, members=2).double()
    x, xi = torch.randn(2, 5, 2, dtype=torch.float64), torch.randn(2, 5, 3, dtype=torch.float64)
    out = f(x, xi)
    for k in range(2):
        for r in range(5):  # row r of member k: the plain MLP with the weights theta + W xi
            a = x[k, r]
            for l, (o, i) in enumerate(f.shapes):
                W = f.base.weights[l][k] + f.hyper_w[l][k].view(o, i, 3) @ xi[k, r]
                a = W @ a + f.base.biases[l][k, 0] + f.hyper_b[l][k] @ xi[k, r]
                a = a * torch.sigmoid(f.base.betas[l][k, 0] * a) if l < len(f.shapes) - 1 else a
            assert torch.allclose(out[k, r], a, atol=1e-12)
    assert not torch.allclose(out[:, :1], f(x[:, :1], xi[:, 1:2]))     # the context changes the field
    with pytest.raises(ValueError, match="share their batch"):
        f(x, xi[:, :2])
    with pytest.raises(ValueError, match="context_dim"):
        CoDAField(2, 0)
    torch.manual_seed(0)
    m = experiment.build("CoDA-lite", 2, 9, experiment.Config.preset("tiny"))
    assert isinstance(m.field, CoDAField) and m.field.members == 2
    h = m.fit(tr, t, steps=8, lr=1e-2, joint=True)
    assert np.all(h[-1] < h[0]) and m.contexts.abs().max() > 0
    cd = experiment.Config.preset("tiny").coda_context_dim
    assert m.context_dim == cd and m.adapt(tr[:1, :1], t, steps=2).shape == (2, 1, cd)


def test_a_huge_proximal_weight_holds_the_weights_near_their_anchor(lv_data):
    lv, tr, t = lv_data
    def drift(prox):
        torch.manual_seed(6)
        m = NCF(2, 9, context_dim=3, width=8, method="midpoint")
        start = [p.detach().clone() for p in m.field.parameters()]
        m.fit(tr, t, steps=20, mode="t2", inner=10, prox=prox, lr=1e-2)  # one outer step: 10 weight steps
        return max((p.detach() - q).abs().max().item() for p, q in zip(m.field.parameters(), start))
    free, held = drift(0.0), drift(1e8)
    # Adam moves each weight by about lr per step: ten free steps drift far, the proximal term pulls every step back,
    # so no weight ends more than about one step from its anchor
    assert held <= 2 * 1e-2 < 0.3 * free, (held, free)


def test_batched_loss_equals_a_naive_loop_over_environments_and_pool_members(lv_data):
    lv, tr, t = lv_data
    torch.manual_seed(2)
    m = NCF(2, 9, context_dim=4, width=8, pool=3, order=1, method="rk4")
    with torch.no_grad():
        m.contexts.normal_()
    pools = m.draw_pools(torch.Generator().manual_seed(0))
    data = torch.as_tensor(tr)
    _, batched = m.loss(data, t, pools)
    single = m.field  # one member: (batch, d) inputs
    sq = []
    for e in range(9):
        x0 = data[e, :, 0]
        for j in pools[0, e].tolist():
            xi_e = m.contexts[0, e].expand(len(x0), -1).clone()
            xi_j = m.contexts[0, j].expand(len(x0), -1).clone()
            pred = rk4(lambda x: csm_field(single, x, xi_e, xi_j, 1), x0, t)
            sq.append(((pred - data[e]) ** 2).mean())
    assert batched.item() == pytest.approx(torch.stack(sq).mean().item(), rel=1e-5)


def test_re_adapting_a_training_environment_recovers_its_in_domain_error(lv_data):
    lv, tr, t = lv_data
    torch.manual_seed(0)
    m = NCF(2, 9, context_dim=3, width=8, pool=2, method="midpoint")
    m.fit(tr[:, :1], t, steps=200, lr=2e-2, ctx_lr=5e-2, joint=True, cosine=True, seed=0)
    test = torch.as_tensor(generate(lv, "train", 4, seed=50).astype(np.float32)[:1])  # environment 0, fresh states
    err = lambda ctx: ((m.predict(test[:, :, 0], t, ctx) - test) ** 2).mean().item()
    learned = err(m.contexts.detach()[:, :1])
    start = err(m.adapt(tr[:1, :1], t, steps=0, seed=0))      # the adaptation's random start
    adapted = err(m.adapt(tr[:1, :1], t, steps=200, lr=3e-2, seed=0))
    # a context fitted afresh to environment 0's data does about as well as the one learned in training, and the
    # random start it comes from does measurably worse (so the test would catch an adaptation that does nothing)
    assert adapted < 1.25 * learned < 1.25 * start / 1.5, (adapted, learned, start)


def test_generators_follow_the_recipes():
    lv = lotka_volterra_system()
    assert [(p["beta"], p["delta"]) for p in lv.train_envs][:3] == [(0.5, 0.5), (0.5, 0.75), (0.5, 1.0)]
    assert len(lv.train_envs) == 9 and len(lv.adapt_envs) == 4 and len(lv.t) == 20 and lv.t[1] == 0.5
    data = generate(lv, "adapt", 2, seed=3)
    assert data.shape == (4, 2, 20, 2)
    assert np.allclose(data[:, :, 0], data[0, :, 0])  # the same initial states in every environment
    V = lambda z, q: q["delta"] * z[..., 0] - q["gamma"] * np.log(z[..., 0]) + q["beta"] * z[..., 1] - q["alpha"] * np.log(z[..., 1])
    for e, q in enumerate(lv.adapt_envs):
        v = V(data[e], q)
        assert np.abs(v / v[:, :1] - 1).max() < 1e-6
    go = glycolytic_system()
    g = generate(go, "train", 1, seed=0)
    assert g.shape == (9, 1, 20, 7) and np.isfinite(g).all()
    assert {p["k1"] for p in go.adapt_envs} == {85.0, 95.0}


def test_bad_inputs(lv_data):
    lv, tr, t = lv_data
    m = NCF(2, 9, context_dim=3, width=8)
    with pytest.raises(ValueError, match="environments"):
        m.fit(tr[:4], t, steps=1)
    with pytest.raises(ValueError, match="shape"):
        m.fit(tr[..., :1], t, steps=1)
    with pytest.raises(ValueError, match="no environments"):
        m.fit(tr[:, :0], t, steps=1)
    with pytest.raises(ValueError, match="one time per sample"):
        m.fit(tr, t[:3], steps=1)
    with pytest.raises(ValueError, match="pool"):
        NCF(2, 9, pool=0)
    with pytest.raises(ValueError, match="order"):
        NCF(2, 9, order=3)
    with pytest.raises(ValueError, match="mode"):
        m.fit(tr, t, steps=1, mode="t3")
    with pytest.raises(ValueError, match="split"):
        generate(lv, "test", 1)
    with pytest.raises(ValueError, match="unknown system"):
        experiment.make_data("pendulum", 1, 1)
    with pytest.raises(ValueError, match="candidates need order"):
        m.candidates(tr[:1, :, 0], t, m.contexts.detach()[:, :1], order=0)
    with pytest.raises(ValueError, match="contexts must have shape"):
        m.candidates(tr[:1, :, 0], t, m.contexts.detach()[:, :2])
    with pytest.raises(ValueError, match="method"):
        NCF(2, 9, method="euler")
    with pytest.raises(ValueError, match="pool=1"):
        NCF(2, 9, pool=3, self_pool=True)


def test_loo_r2_recovers_a_linear_relation():
    rng = np.random.default_rng(0)
    y = rng.uniform(size=9)
    X = np.c_[y, 2 * y, -y] + 0.01 * rng.normal(size=(9, 3))
    assert experiment.loo_r2(X, y) > 0.99
    assert experiment.loo_r2(rng.normal(size=(9, 3)), y) < 0.5


def test_loo_r2_equals_a_hand_written_leave_one_out():
    def reference(X, y, k=2):  # PCA by SVD and least squares, refitted without each point in turn
        preds = np.zeros(len(X))
        for i in range(len(X)):
            m = np.arange(len(X)) != i
            mu = X[m].mean(0)
            P = np.linalg.svd(X[m] - mu, full_matrices=False)[2][:k].T
            w = np.linalg.lstsq(np.c_[(X[m] - mu) @ P, np.ones(m.sum())], y[m], rcond=None)[0]
            preds[i] = np.r_[(X[i] - mu) @ P, 1.0] @ w
        return 1 - ((y - preds) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    rng = np.random.default_rng(3)
    for _ in range(3):
        X, y = rng.normal(size=(9, 8)), rng.normal(size=9)
        assert abs(experiment.loo_r2(X, y) - reference(X, y)) < 1e-10


class _UserField(torch.nn.Module):
    "A field a user might bring: one MLP on the concatenated state and context."
    def __init__(self, d=2, c=3, width=16):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(d + c, width), torch.nn.Tanh(), torch.nn.Linear(width, d))

    def forward(self, x, xi):
        return self.net(torch.cat([x, xi], dim=-1))


def test_stacked_field_members_equal_each_member_alone():
    import copy
    from iclr25_repro.ncf.model import StackedField
    torch.manual_seed(0)
    sf = StackedField(lambda: _UserField().double(), members=3)
    xs, xe, xj = (torch.randn(3, 5, k, dtype=torch.float64) for k in (2, 3, 3))
    for order in (0, 1, 2):
        together = csm_field(sf, xs, xe, xj, order=order)
        for k in range(3):
            solo = copy.deepcopy(sf._base).to_empty(device="cpu")
            solo.load_state_dict({n: p[k] for n, p in zip(sf.names, sf.stacked)})
            assert torch.allclose(together[k], csm_field(solo, xs[k], xe[k], xj[k], order=order), atol=1e-12)
    assert not torch.equal(sf.stacked[0][0], sf.stacked[0][1])  # independent initialisations
    with pytest.raises(TypeError, match="nn.Module"):
        StackedField(lambda: (lambda x, xi: x), members=1)
    with pytest.raises(ValueError, match="buffers"):
        StackedField(lambda: torch.nn.BatchNorm1d(2), members=1)


def test_a_user_supplied_field_trains(lv_data):
    _, tr, t = lv_data
    m = NCF(2, tr.shape[0], context_dim=3, pool=2, members=2, method="midpoint", field=lambda: _UserField(2, 3, 16))
    hist = m.fit(tr, t, steps=12, lr=1e-2, seed=0)
    assert hist.shape == (12, 2) and np.all(hist[-1] < 0.5 * hist[0])
    ctx = m.adapt(tr[:1], t, steps=3)
    assert m.predict(tr[:1, :, 0], t, ctx).shape == (2, 1, 2, len(t), 2)
    assert m.candidates(tr[:1, :, 0], t, ctx).shape == (2, 1, tr.shape[0], 2, len(t), 2)


def _results(ofa_id, ncf_id, ncf_ood, ctx_ood, r2, ncf_sharp, ctx_sharp, ncf="NCF-joint", system="lotka-volterra",
             coda_ood=None, coda_id=None, meta="CoDA-lite"):
    "Synthetic per-seed results: one row per (model, seed); rows of the meta-learning baseline `meta` where `coda_ood` is given."
    out = []
    for k in range(len(ncf_ood)):
        if coda_ood is not None:
            out.append(dict(system=system, member=k, history=[1.0, 0.5], model=meta, ood_mse=coda_ood[k],
                            id_mse=(coda_id or ncf_id)[k], contexts=[[1.0]] * 9, context_r2={"a": 0.5, "b": 0.5}))
        common = dict(system=system, member=k, history=[1.0, 0.5])
        out.append(dict(common, model="one-for-all", id_mse=ofa_id[k], ood_mse=0.1))
        out.append(dict(common, model="context, no CSM", id_mse=ncf_id[k], ood_mse=ctx_ood[k], contexts=[[1.0]] * 9,
                        context_r2={"a": 0.9, "b": 0.9}, coverage=0.95, sharpness=ctx_sharp[k],
                        spread_error_spearman=0.0))
        out.append(dict(common, model=ncf, id_mse=ncf_id[k], ood_mse=ncf_ood[k], contexts=[[1.0]] * 9,
                        context_r2={"a": r2[k], "b": 1.0}, coverage=0.5, sharpness=ncf_sharp[k],
                        spread_error_spearman=0.3))
    return out


def _verdicts(*a, **kw):
    return {c["id"]: c["verdict"] for c in experiment.make_claims(_results(*a, **kw), ("lotka-volterra",),
                                                                  {"lotka-volterra": 1e-8})}

CLAIMS = ("C1-contexts", "C2-csm-ood", "C3-interpretable", "C4-uncertainty")


def test_make_claims_rules_decide_on_the_paired_intervals():
    n = [0.001, 0.002, 0.004]
    # clear wins on every rule: one-for-all 10x worse, NCF 2x better OOD, R^2 high, a spread sharper than a constant
    # band and than the context model's, every interval above 0 and reaching its delta
    v = _verdicts([0.01, 0.02, 0.04], n, [1, 2, 4], [2.1, 3.9, 8.2], [0.9, 0.92, 0.91], [0.5, 0.55, 0.6], [0.9, 1.1, 1])
    assert [v[k] for k in CLAIMS] == ["reproduced"] * 4
    assert {v[k] for k in ("K1-training", "K2-contexts", "K3-integrator")} == {"passed"}
    # real but smaller than delta: one-for-all about 2x worse (< 3x), NCF about 10% better OOD (< 20%), R^2 about
    # 0.25 (< 0.5), sharpness about 0.96 (less than 10% narrower): partial
    v = _verdicts([0.002, 0.0042, 0.0088], n, [0.9, 0.91, 0.92], [1, 1, 1], [0.2, 0.25, 0.3], [0.95, 0.96, 0.97],
                  [1, 1, 1])
    assert [v[k] for k in CLAIMS] == ["partial"] * 4
    # better on average but inside the spread between seeds, and the intervals reach delta: inconclusive
    v = _verdicts([0.006, 0.004, 0.03], n, [0.5, 2, 4], [2, 1.5, 4.5], [0.9, 0.3, 0.95], [0.5, 1.2, 0.8], [1, 1.1, 1])
    assert [v[k] for k in CLAIMS] == ["inconclusive"] * 4
    # no better, and the intervals stay below delta: not reproduced
    v = _verdicts(n, n, [2, 4, 8], [1, 2, 4], [-0.1, 0.0, 0.1], [1.2, 1.3, 1.1], [1, 1, 1])
    assert [v[k] for k in CLAIMS] == ["not_reproduced"] * 4
    # sharper than the context model but no sharper than a constant band: C4 takes the weaker part, not reproduced
    v = _verdicts([0.01, 0.02, 0.04], n, [1, 2, 4], [2.1, 3.9, 8.2], [0.9] * 3, [1.2, 1.3, 1.25], [2, 2.2, 2.1])
    assert v["C4-uncertainty"] == "not_reproduced"
    # sharper than a constant band but only as sharp as the context model, within seed noise: inconclusive
    v = _verdicts([0.01, 0.02, 0.04], n, [1, 2, 4], [2.1, 3.9, 8.2], [0.9] * 3, [0.5, 0.55, 0.6], [0.3, 0.8, 0.7])
    assert v["C4-uncertainty"] == "inconclusive"


def test_claims_carry_their_delta_reason_and_direction():
    n = [0.001, 0.002, 0.004]
    claims = experiment.make_claims(_results([0.01, 0.02, 0.04], n, [1, 2, 4], [2.1, 3.9, 8.2], [0.9] * 3,
                                             [0.5, 0.55, 0.6], [0.9, 1.1, 1]), ("lotka-volterra",),
                                    {"lotka-volterra": 1e-8})
    c = {r["id"]: r for r in claims}
    for cid, better in zip(CLAIMS, ("higher", "lower", "higher", "lower")):
        assert c[cid]["delta"] == pytest.approx(experiment.DELTAS[cid][0]) and c[cid]["better"] == better
        assert c[cid]["delta_reason"] == experiment.DELTAS[cid][1] and "delta" in c[cid]["rule"]
    assert c["C1-contexts"]["delta"] == pytest.approx(math.log(3))
    assert [len(c[k]["gates"]) for k in CLAIMS] == [5, 5, 0, 5]   # fit x 2, finite adaptation x 2, seeds


def test_the_fit_gate_leaves_c1_c2_and_c4_undecided():
    def claims(n):
        return {c["id"]: c for c in experiment.make_claims(
            _results([0.2, 0.3, 0.4], n, [1, 2, 4], [2.1, 3.9, 8.2], [0.9] * 3, [0.5, 0.55, 0.6], [0.9, 1.1, 1]),
            ("lotka-volterra",), {"lotka-volterra": 1e-8})}
    v = claims([0.02, 0.03, 0.02])  # fields that miss their own training environments
    assert v["C1-contexts"]["verdict"] == v["C2-csm-ood"]["verdict"] == v["C4-uncertainty"]["verdict"] == "not_run"
    g = v["C2-csm-ood"]["gates"]
    assert [x["passed"] for x in g] == [False, False, True, True, True] and g[0]["value"] == pytest.approx(0.07 / 3)
    assert g[0]["threshold"] == experiment.FIT_GATE and g[0]["better"] == "lower"
    assert v["C2-csm-ood"]["interval"] is not None and v["C2-csm-ood"]["ours"] is not None  # measured anyway
    assert v["C3-interpretable"]["verdict"] == "reproduced" and v["C3-interpretable"]["gates"] == []
    v = claims([0.0099, 0.0099, 0.0099])  # just inside the gate: decided
    assert {v[k]["verdict"] for k in ("C1-contexts", "C2-csm-ood", "C4-uncertainty")} == {"reproduced"}
    from iclr25_repro.core.results import CLAIM_SCHEMA
    import jsonschema
    for c in v.values():
        if c["kind"] == "claim":
            jsonschema.validate(c, CLAIM_SCHEMA)


@pytest.mark.parametrize("meta, cid", [("CoDA-lite", "C5-coda"), ("CAVIA-FiLM", "C6-cavia")])
def test_c5_c6_against_a_meta_learning_baseline_give_every_verdict_and_are_gated_on_its_fit(meta, cid):
    n, base = [0.001, 0.002, 0.004], ([0.01, 0.02, 0.04], [0.001, 0.002, 0.004], [1, 2, 4], [2, 4, 8], [0.9] * 3,
                                      [0.5] * 3, [1] * 3)
    def c5(ncf_ood, coda_ood, coda_id=None, k=3):
        a = [x[:k] for x in base]
        a[2] = ncf_ood
        rs = _results(*a, coda_ood=coda_ood, coda_id=coda_id, meta=meta)
        claims = experiment.make_claims(rs, ("lotka-volterra",), {"lotka-volterra": 1e-8})
        assert {"C5-coda", "C6-cavia"} - {c["id"] for c in claims} == {"C5-coda", "C6-cavia"} - {cid}
        return next(c for c in claims if c["id"] == cid)
    assert c5([1, 2, 4], [2.1, 3.9, 8.2])["verdict"] == "reproduced"
    assert c5([1, 2, 4], [1.1, 2.2, 4.5])["verdict"] == "partial"
    assert c5([1, 2, 4], [0.5, 4, 9])["verdict"] == "inconclusive"
    assert c5([1, 2, 4], [1, 2, 4.1])["verdict"] == "not_reproduced"
    gated = c5([1, 2, 4], [2.1, 3.9, 8.2], coda_id=[0.05, 0.02, 0.03])   # CoDA-lite misses the fit gate
    assert gated["verdict"] == "not_run" and [g["passed"] for g in gated["gates"]] == [False, True, True, True, True]
    diverged = c5([1, 2, 4], [2.1, float("nan"), 8.2])               # CoDA-lite's adaptation diverged in one seed
    assert diverged["verdict"] == "not_run" and diverged["interval"] is None and diverged["ours"] is None
    assert [g["passed"] for g in diverged["gates"]] == [True, True, False, True, True]
    assert diverged["gates"][2]["value"] == pytest.approx(2 / 3)
    assert c5([1, 2, 4], [2.1, float("inf"), 8.2])["verdict"] == "not_run"
    assert gated["delta"] == pytest.approx(math.log(1.25)) and gated["better"] == "lower"
    two = c5([1, 2], [2.1, 3.9], k=2)                                  # two seeds decide nothing
    assert two["verdict"] == "not_run" and two["gates"][-1]["value"] == 2


def test_make_claims_uses_t1_where_it_ran_and_claims_c2_per_system_and_variant():
    args = ([0.01] * 3, [0.001] * 3, [1, 2, 4], [2, 4, 8], [0.9] * 3, [0.5] * 3, [1] * 3)
    rs = _results(*args, ncf="NCF-t1") + _results(*args, ncf="NCF-t1", system="selkov")
    rs += [dict(r, model="NCF-t2") for r in rs if r["model"] == "NCF-t1"]
    claims = experiment.make_claims(rs, ("lotka-volterra", "selkov"), {"lotka-volterra": 1e-8, "selkov": 1e-8})
    ids = [c["id"] for c in claims]
    assert {"C2-csm-ood", "C2-csm-ood-t2", "C2-csm-ood-selkov", "C2-csm-ood-selkov-t2", "K3-integrator-selkov"} <= set(ids)
    assert all("NCF-t1" in c["metric"] for c in claims if c["id"].startswith("C") and not c["id"].endswith("t2"))


def test_k3_fails_when_the_integrator_error_is_the_size_of_the_models_errors():
    rs = _results([0.01] * 3, [0.001] * 3, [1] * 3, [2] * 3, [0.9] * 3, [1] * 3, [2] * 3)
    k3 = lambda floor: next(c for c in experiment.make_claims(rs, ("lotka-volterra",), {"lotka-volterra": floor})
                            if c["id"] == "K3-integrator")["verdict"]
    assert k3(1e-6) == "passed" and k3(1e-4) == "failed"


def test_calibrated_width_of_a_gaussian_band():
    g = torch.Generator().manual_seed(0)
    truth, mu = torch.randn(200_000, generator=g), torch.zeros(200_000)
    assert experiment.calibrated_width(truth, mu, torch.ones(200_000)) == pytest.approx(1.645, abs=0.02)
    # an informative spread (sd proportional to the actual error scale) gives a narrower band at equal coverage
    scale = torch.rand(200_000, generator=g) * 2 + 0.1
    informative = experiment.calibrated_width(truth * scale, mu, scale)
    constant = experiment.calibrated_width(truth * scale, mu, torch.full_like(scale, scale.mean()))
    assert informative < 0.9 * constant


def test_true_field_floor_separates_rk4_from_the_midpoint_rule():
    cfg = experiment.Config.preset("ci", members=1, n_test_traj=4)
    data = experiment.member_data("lotka-volterra", cfg)
    rk, mid = (experiment.true_field_mse(data, cfg, "lotka-volterra", m) for m in ("rk4", "midpoint"))
    assert rk < 1e-6 < 1e-4 < mid


def test_member_data_draws_each_seed_its_own_trajectories():
    cfg = experiment.Config.preset("ci", n_test_traj=2)
    d = experiment.member_data("lotka-volterra", cfg)
    assert d["train"].shape == (3, 9, 4, 20, 2) and d["adapt"].shape == (3, 4, 1, 20, 2)
    assert not np.allclose(d["train"][0], d["train"][1])
    assert np.array_equal(d["train"][2], experiment.make_data("lotka-volterra", 4, 2, seed=2)["train"])


def test_vectorised_generation_equals_one_solve_per_trajectory():
    from scipy.integrate import solve_ivp
    for sysm in (lotka_volterra_system(), selkov_system()):
        data = generate(sysm, "adapt", 3, seed=5)
        x0s = data[0, :, 0]
        for e, p in enumerate(sysm.adapt_envs[:2]):
            for j, x0 in enumerate(x0s):
                sol = solve_ivp(sysm.rhs, (sysm.t[0], sysm.t[-1]), x0, t_eval=sysm.t, args=tuple(p.values()),
                                rtol=1e-9, atol=1e-10)
                assert np.abs(sol.y.T - data[e, j]).max() < 1e-6


def test_selkov_follows_its_recipe():
    sm = selkov_system()
    assert len(sm.train_envs) == 21 and len(sm.adapt_envs) == 6 and len(sm.t) == 11 and sm.t[-1] == 40
    assert sm.train_envs[0] == {"a": 0.1, "b": -1.0} and sm.train_envs[10]["b"] == pytest.approx(0.0)
    d = generate(sm, "train", 2, seed=0)
    assert d.shape == (21, 2, 11, 2) and np.isfinite(d).all()


def test_adapt_and_predict_take_one_data_set_per_member(lv_data):
    lv, tr, t = lv_data
    other = generate(lv, "train", 2, seed=7).astype(np.float32)
    torch.manual_seed(0)
    pair = NCF(2, 9, context_dim=3, width=8, members=2, method="midpoint")
    both = np.stack([tr[:2], other[:2]])
    ctx = pair.adapt(both, t, steps=3, seed=1)
    pred = pair.predict(both[:, :, :, 0], t, ctx)
    for k, d in enumerate((tr[:2], other[:2])):
        c = pair.adapt(d, t, steps=3, seed=1)
        assert torch.allclose(c[k], ctx[k], atol=1e-6)
        assert torch.allclose(pair.predict(d[:, :, 0], t, ctx)[k], pred[k], atol=1e-6)
    cand = pair.candidates(both[:, :, :, 0], t, ctx)
    assert torch.allclose(cand[1], pair.candidates(other[:2, :, 0], t, ctx)[1], atol=1e-6)


def test_full_preset_plan_and_smoke(tmp_root):
    from iclr25_repro.core import cli
    full = experiment.Config.preset("full")
    phases = experiment.plan(full)
    assert len(phases) == len(experiment.jobs_for(full)) == 18  # 3 systems x 6 models
    from iclr25_repro.core.cli import estimate_wall
    est = estimate_wall("ncf", "full", measure=False)
    assert est["seconds"] <= 600, est  # the full preset's dry-run estimate fits 10 minutes on one GPU
    lv_t1 = next(p for p in phases if p["phase"] == "lotka-volterra, NCF-t1")
    assert lv_t1["context_dim"] == 1024 and lv_t1["pool"] == 6 and lv_t1["loss_evaluations"] == 2 * full.steps
    doc = cli.run_experiment("ncf", "full", "cpu", 0, smoke=True)
    assert doc["scale"] == "full" and doc["config"]["smoke"] is True
    ids = {c["id"] for c in doc["claims"]}
    assert {"C2-csm-ood", "C2-csm-ood-glycolytic", "C5-coda", "C5-coda-glycolytic", "C2-csm-ood-t2", "K3-integrator",
            "K3-integrator-glycolytic", "C6-cavia", "C6-cavia-brusselator", "C2-csm-ood-brusselator",
            "K3-integrator-brusselator"} <= ids
    assert all(("NCF-t2" if c["id"].endswith("-t2") else "NCF-t1") in c["metric"] for c in doc["claims"]
               if c["id"].startswith("C"))
    assert not (tmp_root / "book" / "results").exists()


@pytest.fixture(scope="module")
def tiny_run():
    cfg = experiment.Config.preset("tiny")
    return cfg, experiment.run(cfg)


def test_tiny_run(tiny_run):
    cfg, out = tiny_run
    assert [c["id"].split("-")[0] for c in out["claims"]] == ["C1", "C2", "C5", "C6", "C3", "C4", "K1", "K2", "K3"]
    assert len(out["rows"]) == len(cfg.models) * cfg.members
    for r in out["rows"]:
        assert math.isfinite(r["id_mse"]) and math.isfinite(r["ood_mse"])


def test_tiny_run_is_deterministic(tiny_run):
    cfg, out = tiny_run
    again = experiment.run(cfg)
    assert [r["ood_mse"] for r in out["rows"]] == pytest.approx([r["ood_mse"] for r in again["rows"]], rel=1e-5)


def test_laptop_preset_plan_dry_run_and_smoke(tmp_root):
    from iclr25_repro.core import cli
    laptop, ci = experiment.Config.preset("laptop"), experiment.Config.preset("ci")
    # the same design as ci, only numbers differ
    assert laptop.models == ci.models and laptop.systems == ci.systems and laptop.method == ci.method
    assert laptop.members >= 10 and laptop.steps > ci.steps and set(experiment.data_seeds(laptop)).isdisjoint(
        experiment.data_seeds(ci))
    assert sum(p["units"] for p in experiment.plan(laptop)) > 5 * sum(p["units"] for p in experiment.plan(ci))
    text = cli.dry_run("ncf", "laptop", measure=False)
    assert "CoDA-lite" in text and "CAVIA-FiLM" in text and "members" in text
    doc = cli.run_experiment("ncf", "laptop", "cpu", 0, smoke=True)
    assert doc["scale"] == "laptop" and doc["config"]["smoke"] is True
    assert {"C1-contexts", "C2-csm-ood", "C5-coda", "C6-cavia", "C3-interpretable", "C4-uncertainty"} <= {
        c["id"] for c in doc["claims"]}
    assert not (tmp_root / "book" / "results").exists()


def test_rk4_and_midpoint_against_torchdiffeqs_fixed_step_solvers():
    torchdiffeq = pytest.importorskip("torchdiffeq")
    F = lambda z: torch.stack([0.5 * z[..., 0] - z[..., 0] * z[..., 1], 0.75 * z[..., 0] * z[..., 1] - 0.5 * z[..., 1]], -1)
    t = torch.linspace(0, 5, 11, dtype=torch.float64)
    z0 = torch.tensor([[1.5, 1.2], [0.8, 1.9]], dtype=torch.float64)
    fixed = lambda method, h: torchdiffeq.odeint(lambda s, z: F(z), z0, t, method=method,
                                                 options={"step_size": h}).transpose(0, 1)
    # the explicit midpoint rule is the same method: equal to rounding
    assert (rk4(F, z0, t, 2, method="midpoint") - fixed("midpoint", 0.25)).abs().max() < 1e-12
    # torchdiffeq's rk4 is the 3/8 rule, another fourth-order method: the gap shrinks like h^4 with ours
    g1 = (rk4(F, z0, t, 1) - fixed("rk4", 0.5)).abs().max().item()
    g2 = (rk4(F, z0, t, 2) - fixed("rk4", 0.25)).abs().max().item()
    assert g2 < 1e-4 and 8 < g1 / g2 < 40, (g1, g2)


def test_coda_adaptation_starts_from_the_shared_weights(lv_data):
    "CoDA's code starts a new context at 0 (the shared weights theta); NCF's at a N(0, 1) draw."
    lv, tr, t = lv_data
    make = lambda init: NCF(2, 9, context_dim=3, order=0, pool=1, self_pool=True, width=8, adapt_init=init,
                            field=lambda: CoDAField(2, 3, width=8))
    assert torch.equal(make("zeros").adapt(tr[:2, :1], t, steps=0, seed=0), torch.zeros(1, 2, 3))
    assert make("normal").adapt(tr[:2, :1], t, steps=0, seed=0).abs().sum() > 0
    moved = make("zeros").adapt(tr[:2, :1], t, steps=3, seed=0)
    assert moved.abs().sum() > 0  # W is random, not zero, so a context at 0 still gets a gradient
    with pytest.raises(ValueError, match="adapt_init"):
        make("uniform")
    assert experiment.build("CoDA-lite", 2, 9, experiment.Config.preset("ci")).adapt_init == "zeros"


def test_cavia_field_rows_equal_the_film_modulated_mlp_and_zero_context_gives_the_shared_network():
    torch.manual_seed(0)
    f = CAVIAField(2, 3, width=8, members=2).double()
    x, xi = torch.randn(2, 5, 2, dtype=torch.float64), torch.randn(2, 5, 3, dtype=torch.float64)
    out = f(x, xi)
    for m in range(2):
        for r in range(5):
            a = x[m, r]
            for l in range(4):
                z = f.base.weights[l][m] @ a + f.base.biases[l][m, 0]
                if l < 3:
                    g = xi[m, r] @ f.film[l][m]
                    z = (1 + g[:8]) * z + g[8:]
                    z = z * torch.sigmoid(f.base.betas[l][m, 0] * z)
                a = z
            assert torch.allclose(out[m, r], a, atol=1e-12)
    assert torch.allclose(f(x, torch.zeros_like(xi)), f.base(x))
    with pytest.raises(ValueError):
        CAVIAField(2, 0)
    with pytest.raises(ValueError):
        f(x, xi[..., :2])
    m = experiment.build("CAVIA-FiLM", 2, 9, experiment.Config.preset("tiny"))
    assert isinstance(m.field, CAVIAField) and m.adapt_init == "zeros" and m.self_pool
    assert experiment._fit_mode("CAVIA-FiLM", experiment.Config())["mode"] == "cavia"


def _cavia_model(members=1, dtype=torch.float32):
    torch.manual_seed(0)
    m = NCF(2, 9, context_dim=3, order=0, pool=1, self_pool=True, width=8, members=members, method="midpoint",
            adapt_init="zeros", field=lambda: CAVIAField(2, 3, width=8, members=members))
    return m.to(dtype)


def test_cavia_inner_loop_adapts_only_the_contexts(lv_data):
    lv, tr, t = lv_data
    m = _cavia_model()
    weights = [p.detach().clone() for p in m.field.parameters()]
    kept = m.contexts.detach().clone()
    data, pools = torch.as_tensor(tr), m.draw_pools(torch.Generator())
    ctx = m.cavia_inner(data, t, pools, steps=3, lr=0.3, create_graph=False)
    assert all(torch.equal(p, w) for p, w in zip(m.field.parameters(), weights))  # theta untouched
    assert torch.equal(m.contexts, kept) and ctx.abs().sum() > 0                   # fresh contexts from zero
    with torch.no_grad():
        before = m.data_term(data, t, pools, torch.zeros_like(ctx)).item()
        after = m.data_term(data, t, pools, ctx).item()
    assert after < before
    # one inner step by hand: xi = 0 - lr * grad of each environment's own MSE
    z = torch.zeros_like(m.contexts, requires_grad=True)
    per_env = [m.data_term(data[e:e + 1].expand(9, *data.shape[1:]), t, pools, z[:, e:e + 1].expand(1, 9, 3))
               for e in range(9)]
    grads = torch.stack([torch.autograd.grad(pe.sum(), z)[0][0, e] for e, pe in enumerate(per_env)])
    one = m.cavia_inner(data, t, pools, steps=1, lr=0.3, create_graph=False)
    assert torch.allclose(one[0], -0.3 * grads, atol=1e-6)


def test_cavia_outer_gradient_flows_through_the_inner_steps(lv_data):
    lv, tr, t = lv_data
    m = _cavia_model(dtype=torch.float64)
    data, t64, pools = torch.as_tensor(tr[:, :, :8], dtype=torch.float64), t[:8].double(), m.draw_pools(torch.Generator())
    params = list(m.field.parameters())
    outer = lambda cg: m.data_term(data, t64, pools, m.cavia_inner(data, t64, pools, 2, 0.5, create_graph=cg)).sum()
    second = torch.autograd.grad(outer(True), params)
    first = torch.autograd.grad(outer(False), params)
    v = [torch.randn_like(p) for p in params]
    eps = 1e-5
    def shifted(sign):
        with torch.no_grad():
            for p, d in zip(params, v):
                p.add_(sign * eps * d)
        val = outer(False).item()
        with torch.no_grad():
            for p, d in zip(params, v):
                p.sub_(sign * eps * d)
        return val
    fd = (shifted(1) - shifted(-1)) / (2 * eps)      # the derivative of the whole bilevel loss along v
    dot = lambda g: sum((a * b).sum() for a, b in zip(g, v)).item()
    assert dot(second) == pytest.approx(fd, rel=1e-5)                 # second order: the true gradient
    assert abs(dot(first) - fd) > 1e-3 * abs(fd)                       # first order drops the inner steps' part


def test_cavia_fits_a_trained_environment(lv_data):
    lv, tr, t = lv_data
    m = _cavia_model()
    hist = m.fit(tr, t, steps=60, mode="cavia", lr=2e-2, cavia_steps=2, cavia_lr=1.0, cosine=True, seed=0)
    data, pools = torch.as_tensor(tr), m.draw_pools(torch.Generator())
    with torch.no_grad():
        kept = m.data_term(data, t, pools, m.contexts).item()
        zero = m.data_term(data, t, pools, torch.zeros_like(m.contexts)).item()
    assert hist[-1, 0] < hist[0, 0] / 3 and kept < zero      # it learned, and the contexts carry the environments
    assert kept == pytest.approx(hist[-1, 0], rel=0.3)       # the kept contexts are the inner loop's on the trained weights
    with pytest.raises(ValueError):
        NCF(2, 9, context_dim=3, pool=3).fit(tr, t, steps=1, mode="cavia")  # CAVIA needs self_pool


def test_brusselator_physics_and_data():
    from scipy.ndimage import laplace
    from iclr25_repro.ncf.model import _laplacian
    u = np.random.default_rng(0).normal(size=(BT_GRID, BT_GRID, 2))
    assert np.allclose(_laplacian(u, BT_GRID), np.stack([laplace(u[..., k], mode="wrap") for k in range(2)], -1))
    bt = brusselator_system()
    assert len(bt.train_envs) == 9 and len(bt.adapt_envs) == 4 and all(p["b"] > 1 + p["a"] ** 2 for p in bt.train_envs)
    p = bt.train_envs[0]
    y_star = np.concatenate([np.full(BT_GRID ** 2, p["a"]), np.full(BT_GRID ** 2, p["b"] / p["a"])])[:, None]
    assert np.abs(np.asarray(brusselator(0.0, y_star, *p.values()))).max() < 1e-12  # the uniform fixed point
    y = np.random.default_rng(1).uniform(0.5, 2, size=(2 * BT_GRID ** 2, 3))
    # diffusion conserves each species' total: the reaction terms alone change it
    rates = np.asarray(brusselator(0.0, y, *p.values()))
    uu, vv = y[:BT_GRID ** 2], y[BT_GRID ** 2:]
    assert np.allclose(rates[:BT_GRID ** 2].sum(0), (p["a"] - (p["b"] + 1) * uu + uu * uu * vv).sum(0))
    assert np.allclose(rates, torch.stack(brusselator(0.0, torch.as_tensor(y), *p.values())).numpy())
    d = generate(bt, "adapt", 1, seed=0)
    assert d.shape == (4, 1, 10, 2 * BT_GRID ** 2) and np.isfinite(d).all() and (d > 0).all()
    data = {"system": bt, "test": generate(bt, "train", 2, seed=3)[None].astype(np.float32), "t": bt.t}
    cfg = experiment.Config.preset("full")
    assert experiment.true_field_mse(data, cfg, "brusselator") < 1e-5   # the full preset's 4 RK4 substeps suffice
