"""Tests of iclr25_repro.usam: the optimizer's update, schedules, global norm, bad inputs, determinism, a tiny run."""
import math

import numpy as np
import pytest
import torch

from iclr25_repro.usam import experiment
from iclr25_repro.usam.optim import (UnifiedSAM, decreasing_steps, er_constants, lambda_schedule, least_squares,
                                     theory_step_sizes, unified_sam_ls)


def _quadratic_step(lam, rho=0.2, gamma=0.1, steps=1):
    H = torch.diag(torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64))
    x = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
    opt = UnifiedSAM([x], torch.optim.SGD, rho=rho, lam=lam, lr=gamma)
    def closure():
        opt.zero_grad()
        loss = 0.5 * x @ H @ x
        loss.backward()
        return loss
    for _ in range(steps):
        opt.step(closure)
    return x.detach(), H


@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0])
def test_one_step_equals_formula(lam):
    x, H = _quadratic_step(lam)
    x0 = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    g = H @ x0
    expected = x0 - 0.1 * H @ (x0 + 0.2 * (1 - lam + lam / g.norm()) * g)
    assert torch.allclose(x, expected, atol=1e-12)


def test_sam_matches_plain_two_pass_implementation():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    twin = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    twin.load_state_dict(net.state_dict())
    X, y = torch.randn(16, 4, dtype=torch.float64), torch.randn(16, 1, dtype=torch.float64)
    opt = UnifiedSAM(net.parameters(), torch.optim.SGD, rho=0.05, lam=1.0, lr=0.1)
    for _ in range(3):
        def closure():
            opt.zero_grad()
            loss = ((net(X) - y) ** 2).mean()
            loss.backward()
            return loss
        opt.step(closure)
        # plain SAM (Foret et al.): w <- w - lr * grad L(w + rho g/||g||)
        params = list(twin.parameters())
        grads = torch.autograd.grad(((twin(X) - y) ** 2).mean(), params)
        norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(0.05 * g / norm)
        grads2 = torch.autograd.grad(((twin(X) - y) ** 2).mean(), params)
        with torch.no_grad():
            for p, g, g2 in zip(params, grads, grads2):
                p.sub_(0.05 * g / norm)
                p.sub_(0.1 * g2)
    for a, b in zip(net.parameters(), twin.parameters()):
        assert torch.allclose(a, b, atol=1e-12)


def test_global_norm_spans_groups():
    a, b = torch.nn.Parameter(torch.tensor([3.0])), torch.nn.Parameter(torch.tensor([4.0]))
    opt = UnifiedSAM([{"params": [a]}, {"params": [b]}], rho=1.0, lam=1.0, lr=0.0)
    (a ** 2 / 2 + b ** 2 / 2).sum().backward()
    assert math.isclose(float(opt.grad_norm()), 5.0)
    opt.ascent()
    assert math.isclose(a.item(), 3.6, rel_tol=1e-6) and math.isclose(b.item(), 4.8, rel_tol=1e-6)


def test_schedules():
    assert [lambda_schedule("1/t")(t) for t in (1, 2, 4)] == [1.0, 0.5, 0.25]
    assert [lambda_schedule("1-1/t")(t) for t in (1, 2, 4)] == [0.0, 0.5, 0.75]
    assert lambda_schedule(lambda t: 0.3)(5) == 0.3
    with pytest.raises(ValueError, match="lam"):
        lambda_schedule(lambda t: 2.0)(1)
    # the optimizer counts steps: with '1/t' the first step is SAM, the second halfway
    p = torch.nn.Parameter(torch.tensor([2.0]))
    opt = UnifiedSAM([p], rho=1.0, lam="1/t", lr=0.0)
    p.grad = torch.tensor([2.0])
    assert opt.ascent() == 1.0
    opt.descent()
    p.grad = torch.tensor([2.0])
    assert opt.ascent() == 0.5


@pytest.mark.parametrize("kwargs, match", [(dict(rho=-0.1), "rho"), (dict(lam=1.5), "lam"), (dict(lam="sqrt"), "lam"),
                                           (dict(base_optimizer=object), "base_optimizer")])
def test_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        UnifiedSAM([torch.nn.Parameter(torch.zeros(2))], lr=0.1, **kwargs)


def test_step_without_closure():
    opt = UnifiedSAM([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(ValueError, match="closure"):
        opt.step()


def test_determinism():
    a, _ = _quadratic_step("1-1/t", steps=5)
    b, _ = _quadratic_step("1-1/t", steps=5)
    assert torch.equal(a, b)
    p = least_squares(10, 3, rng=0)
    g1 = unified_sam_ls(p, 0.5, 0.01, 0.01, 5, batch="single", rng=1)
    g2 = unified_sam_ls(p, 0.5, 0.01, 0.01, 5, batch="single", rng=1)
    assert np.array_equal(g1, g2)


def test_step_sizes_and_constants():
    assert er_constants(100, 100, 10.0) == (0.0, 1.0, 10.0)
    A, B, L = er_constants(100, 1, 8.0)
    assert (A, B, L) == (8.0, 0.0, 8.0)
    assert er_constants(10, 1, 8.0, "importance", L_avg=3.0) == (3.0, 0.0, 3.0)
    assert np.allclose(theory_step_sizes(0.1, 10.0, 0.0, 1.0, 0.0), (0.0125, 0.0125))
    assert np.allclose(theory_step_sizes(0.1, 10.0, 0.0, 1.0, 1.0), (0.025, 0.0125))
    assert decreasing_steps(1, 1.0, 1.0, 0.5) == (1 / 3, 1.0)
    with pytest.raises(ValueError, match="tau"):
        er_constants(10, 11, 1.0)


def test_usam_full_batch_converges_exactly_on_consistent_least_squares():
    p = least_squares(20, 5, cond=3.0, consistent=True, row_spread=0.2, rng=3)
    A, B, L = er_constants(20, 20, p["L"])
    rho, gamma = theory_step_sizes(p["mu"], L, A, B, 0.0)
    gaps = unified_sam_ls(p, 0.0, gamma, rho, 1500)
    assert gaps[-1] < 1e-12 and np.all(np.diff(np.log(gaps[gaps > 1e-25])) < 1e-9)


def test_tiny_experiment():
    cfg = experiment.Config.preset("tiny")
    out = experiment.run(cfg)
    ids = [c["id"] for c in out["claims"]]
    assert ids == ["C1-linear", "C2-decreasing", "C3-network", "C4-importance"]
    assert len(out["rows"]) == len(cfg.methods) * len(cfg.seeds)
    assert all(0 <= r["test_acc"] <= 100 for r in out["rows"])
    imp, runs = out["part_a"]["imp_problem"], out["part_a"]["imp"][1.0]
    assert math.isclose(runs["importance"]["gamma"] / runs["uniform"]["gamma"], (imp["L_max"] / imp["L_avg"]) ** 2,
                        rel_tol=1e-9)
    c4 = out["claims"][3]
    assert math.isclose(c4["ours"], min(out["part_a"]["imp"][l]["uniform"]["final"] / out["part_a"]["imp"][l]["importance"]["final"]
                                        for l in experiment.LAMBDAS_A))
    from iclr25_repro.core.results import make_results
    make_results("usam", experiment.PAPER, cfg, out["claims"], 1.0, details=out["rows"], root="/tmp")


def test_closure_without_zero_grad_gives_the_same_step():
    H = torch.diag(torch.tensor([1.0, 4.0], dtype=torch.float64))
    def run(zero):
        x = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
        opt = UnifiedSAM([x], rho=0.2, lam=0.0, lr=0.1)
        def closure():
            if zero:
                opt.zero_grad()
            loss = 0.5 * x @ H @ x
            loss.backward()
            return loss
        for _ in range(3):
            opt.step(closure)
        return x.detach()
    assert torch.allclose(run(True), run(False), atol=1e-15)


def test_state_dict_round_trip_keeps_momentum_and_schedule():
    torch.manual_seed(0)
    def make():
        net = torch.nn.Linear(3, 1).double()
        return net, UnifiedSAM(net.parameters(), torch.optim.SGD, rho=0.1, lam="1-1/t", lr=0.05, momentum=0.9)
    X, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64)
    def train(net, opt, steps):
        for _ in range(steps):
            opt.step(lambda: (((net(X) - y) ** 2).mean()).backward())
    net_a, opt_a = make()
    net_b, opt_b = make()
    net_b.load_state_dict(net_a.state_dict())
    train(net_a, opt_a, 5)                                   # 5 steps straight
    train(net_b, opt_b, 2)                                   # 2 steps, save, resume in a fresh optimizer, 3 more
    net_c, opt_c = make()
    net_c.load_state_dict(net_b.state_dict())
    opt_c.load_state_dict(opt_b.state_dict())
    assert opt_c.steps == 2 and opt_c.param_groups is opt_c.base_optimizer.param_groups
    train(net_c, opt_c, 3)
    for p, q in zip(net_a.parameters(), net_c.parameters()):
        assert torch.allclose(p, q, atol=1e-14)


def test_schedule_inside_step_matches_formula():
    H = torch.diag(torch.tensor([2.0, 5.0], dtype=torch.float64))
    x = torch.nn.Parameter(torch.tensor([1.0, 1.0], dtype=torch.float64))
    opt = UnifiedSAM([x], rho=0.1, lam="1-1/t", lr=0.05)
    ref = x.detach().clone()
    for t in range(1, 4):
        opt.step(lambda: (0.5 * x @ H @ x).backward())
        g, lam = H @ ref, 1 - 1 / t
        ref = ref - 0.05 * H @ (ref + 0.1 * (1 - lam + lam / g.norm()) * g)
    assert torch.allclose(x.detach(), ref, atol=1e-13)


def test_per_group_rho():
    a, b = torch.nn.Parameter(torch.tensor([3.0])), torch.nn.Parameter(torch.tensor([4.0]))
    opt = UnifiedSAM([{"params": [a]}, {"params": [b], "rho": 0.5}], rho=1.0, lam=0.0, lr=0.0)
    (a ** 2 / 2 + b ** 2 / 2).sum().backward()
    opt.ascent()
    assert math.isclose(a.item(), 6.0) and math.isclose(b.item(), 6.0)   # 3 + 1*3, 4 + 0.5*4


def test_importance_and_decreasing_paths():
    p = least_squares(20, 3, cond=3.0, consistent=True, row_spread=1.0, rng=1)
    A, B, L = er_constants(20, 1, p["L_max"], "importance", p["L_avg"])
    rho, gamma = theory_step_sizes(p["mu"], L, A, B, 1.0)
    gaps = unified_sam_ls(p, 1.0, gamma, rho, 30, batch="single", sampling="importance", rng=0)
    assert gaps[-1] < 1e-2                                    # consistent problem: the weighted method converges
    d1 = unified_sam_ls(p, 0.0, 0.01, 0.01, 3, batch="single", decreasing=True, rng=0)
    d0 = unified_sam_ls(p, 0.0, 0.01, 0.01, 3, batch="single", decreasing=False, rng=0)
    assert not np.array_equal(d1, d0)                         # rho_k = min(rho, 1/(2k+1)) differs from k = 0 on


def test_make_claims_verdicts():
    def det(final, slope=-0.1, r2=0.99):
        return dict(slope=slope, r2=r2, final=final)
    a = {"det": {0.0: det(1e-20), 0.5: det(1e-4), 1.0: det(1e-3, r2=0.5)},
         "dec": {l: dict(plateau=1e-3, final_dec=1e-4 if l == 1.0 else 8e-4) for l in experiment.LAMBDAS_A},
         "imp": {l: {"uniform": dict(gamma=1.0, final=0.5), "importance": dict(gamma=4.0, final=0.1)} for l in experiment.LAMBDAS_A}}
    rows = ([dict(method="SGD", seed=s, test_acc=70 + s) for s in range(3)]
            + [dict(method="lam=1.0", seed=s, test_acc=90 + s) for s in range(3)]
            + [dict(method="lam=0.0", seed=s, test_acc=95 + s) for s in range(3)])
    c = {x["id"]: x for x in experiment.make_claims(a, rows)}
    assert c["C1-linear"]["verdict"] == "partial"             # one lambda's descent is not a clean line
    assert c["C2-decreasing"]["verdict"] == "partial"         # ratio 10 for lambda = 1 only
    assert c["C3-network"]["verdict"] == "partial"            # beats SGD, but USAM is the best here
    assert c["C4-importance"]["verdict"] == "reproduced" and c["C4-importance"]["ours"] == 5.0
