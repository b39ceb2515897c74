"""Tests of iclr25_repro.ermbounds: the box class, the k-copy identity, the batched ERM trainer against a loop, the
distributions, the bounds against hand computations, bad inputs, a tiny run and the full preset's smoke run."""
import math

import numpy as np
import pytest
import torch

from iclr25_repro.core import cli
from iclr25_repro.ermbounds import experiment
from iclr25_repro.ermbounds.model import (ENGINES, BoxReLUNet, Clusters, Teacher, accuracy, best_of, check_inputs, check_labels,
                                          coverage_accuracy, empirical_risk, erm_bound, fit_erm, fixed_margin_bound,
                                          k_copy, margin_bound, margins, rademacher_bound, rademacher_mc,
                                          pgd, robust_accuracy, vc_bound)


def _data(N=60, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(N, n, generator=g, dtype=torch.float64)
    y = torch.where(X[:, 0] + 0.5 * X[:, 1] > 0.75, 1.0, -1.0).double()
    return X, y


def test_box_projection_and_parameters():
    net = BoxReLUNet(3, 7, generator=torch.Generator().manual_seed(0))
    assert net.max_abs() <= 1.0 and net(torch.rand(5, 3)).shape == (5,)
    with torch.no_grad():
        net.a.mul_(50)
    assert net.max_abs() > 1.0 and net.project_().max_abs() == 1.0
    with pytest.raises(ValueError, match="box"):
        BoxReLUNet.from_params(torch.ones(2, 3) * 1.01, torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="shapes"):
        BoxReLUNet.from_params(torch.ones(2, 3), torch.zeros(3), torch.zeros(2))
    for bad in [dict(n=0, width=3), dict(n=2, width=0), dict(n=2, width=True), dict(n=2.5, width=3)]:
        with pytest.raises(ValueError):
            BoxReLUNet(**bad)


def test_k_copy_identity():
    X, y = _data()
    net = BoxReLUNet(3, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for k in (1, 3, 10):
        big = k_copy(net, k)
        assert big.width == 5 * k and big.max_abs() <= 1.0
        assert torch.allclose(big(X), k * net(X), atol=1e-12, rtol=0)
        assert torch.allclose(margins(big, X, y), k * margins(net, X, y), atol=1e-12)
    with pytest.raises(ValueError, match="k"):
        k_copy(net, 0)


@pytest.mark.parametrize("engine", ENGINES)
def test_batched_trainer_equals_a_loop_over_single_networks(engine):
    "Adam is elementwise and the summed objective separates: each net follows its own trajectory (float64)."
    X, y = _data(60)
    X2, y2 = _data(25, seed=1)
    make = lambda: [BoxReLUNet(3, w, generator=torch.Generator().manual_seed(w), dtype=torch.float64) for w in (2, 9, 4)]
    datasets = [(X, y), (X2, y2), (X[:40], y[:40])]
    together = make()
    risks = fit_erm(together, [d[0] for d in datasets], [d[1] for d in datasets], steps=60, lr=0.05,
                    box=[True, False, True], loss="logistic", engine=engine)
    alone = make()
    for net, (Xi, yi), box in zip(alone, datasets, [True, False, True]):
        fit_erm([net], [Xi], [yi], steps=60, lr=0.05, box=box, engine=engine)
    for a, b, (Xi, yi), r in zip(together, alone, datasets, risks):
        for p, q in zip(a.parameters(), b.parameters()):
            assert torch.allclose(p, q, atol=1e-10, rtol=0)
        assert abs(r - empirical_risk(a, Xi, yi)) < 1e-12
    assert together[0].max_abs() <= 1.0 and together[2].max_abs() <= 1.0


def test_vmap_engine_equals_the_hand_batched_engine():
    "stack_module_state + vmap(functional_call) and the hand-written baddbmm: the same parameters and risks."
    X, y = _data(50)
    make = lambda: [BoxReLUNet(3, w, generator=torch.Generator().manual_seed(10 + w), dtype=torch.float64) for w in (1, 7, 7, 12)]
    fits = {}
    for engine in ENGINES:
        nets = make()
        risks = fit_erm(nets, [X, X[:30], X, X[:45]], [y, y[:30], y, y[:45]], steps=40, lr=0.05,
                        box=[True, True, False, False], engine=engine)
        fits[engine] = nets, risks
    (a, ra), (b, rb) = fits["vmap"], fits["bmm"]
    assert ra == pytest.approx(rb, abs=1e-12)
    for p, q in zip(a, b):
        for u, v in zip(p.parameters(), q.parameters()):
            assert torch.allclose(u, v, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="engine"):
        fit_erm(make()[:1], [X], [y], engine="loop")


def test_trainer_without_box_leaves_it_and_reference_loop_matches_hand_adam():
    "A plain-PyTorch reference: one net, nn.Module + torch.optim.Adam + clamp, the same numbers as fit_erm."
    X, y = _data(40)
    ref = BoxReLUNet(3, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    net = BoxReLUNet(3, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    opt = torch.optim.Adam(ref.parameters(), lr=0.05)
    for _ in range(30):
        opt.zero_grad()
        torch.nn.functional.softplus(-y * ref(X)).mean().backward()
        opt.step()
        ref.project_()
    fit_erm([net], [X], [y], steps=30, lr=0.05)
    for p, q in zip(ref.parameters(), net.parameters()):
        assert torch.allclose(p, q, atol=1e-10, rtol=0)
    free = BoxReLUNet(3, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    fit_erm([free], [X], [y], steps=400, lr=0.2, box=False)
    assert free.max_abs() > 1.0                      # nothing holds an unconstrained net in the box


def test_losses_and_best_of():
    X, y = _data(50)
    nets = [BoxReLUNet(3, 8, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in range(3)]
    for loss in ("logistic", "hinge", "square"):
        fit_erm(nets, [X] * 3, [y] * 3, steps=50, lr=0.05, loss=loss)
    best, risk = best_of(nets, X, y)
    assert risk == min(empirical_risk(t, X, y) for t in nets) and best in nets
    with pytest.raises(ValueError, match="loss"):
        fit_erm(nets, [X] * 3, [y] * 3, loss="zero-one")
    m = torch.tensor([-1.0, 0.0, 0.5, 1.0, 3.0])
    from iclr25_repro.ermbounds.model import hinge_loss, logistic_loss, square_loss
    assert torch.allclose(hinge_loss(m), torch.tensor([2.0, 1.0, 0.5, 0.0, 0.0]))
    assert torch.allclose(square_loss(m), torch.tensor([4.0, 1.0, 0.25, 0.0, 4.0]))
    assert torch.allclose(logistic_loss(m), torch.log1p(torch.exp(-m)))


def test_bad_inputs():
    X, y = _data(10)
    net = BoxReLUNet(3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        check_inputs(X + 1.0)
    with pytest.raises(ValueError, match="shape"):
        check_inputs(torch.rand(5))
    with pytest.raises(ValueError, match="-1 and \\+1"):
        check_labels(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="labels for"):
        accuracy(net, X, y[:5])
    with pytest.raises(ValueError, match="same length"):
        fit_erm([net], [X, X], [y])
    with pytest.raises(ValueError, match="steps"):
        fit_erm([net], [X], [y], steps=0)
    with pytest.raises(ValueError, match="dimension"):
        fit_erm([net], [torch.rand(10, 2).double()], [y])
    for bad in [dict(n=0, width=4), dict(n=2, width=1), dict(n=2, width=4, quantile=1.5)]:
        with pytest.raises(ValueError):
            Teacher(**bad)
    with pytest.raises(ValueError, match="could not place"):
        Clusters(1, 50, radius=0.2)
    with pytest.raises(ValueError, match="W"):
        erm_bound(4, 8, 0.1, 4, 100)
    with pytest.raises(ValueError, match="delta"):
        erm_bound(4, 4, 0.1, 8, 100, delta=1.5)
    with pytest.raises(ValueError, match="eps"):
        robust_accuracy(net, X, y, eps=-0.1)


def test_teacher_is_expressed_by_its_network_and_deterministic():
    T = Teacher(4, 4, quantile=0.3, seed=2)
    X, y = T.sample(3000, np.random.default_rng(0))
    assert T.net.max_abs() <= 1.0 and float(margins(T.net, X, y).min()) >= T.c > 0
    assert 0.3 < float((y > 0).double().mean()) < 0.7                     # the constant unit balances the labels
    U = Teacher(4, 4, quantile=0.3, seed=2)
    assert U.c == T.c and torch.equal(U.sample(50, np.random.default_rng(1))[0], T.sample(50, np.random.default_rng(1))[0])


def test_clusters_are_separated_and_coverage_formula_matches_simulation():
    D = Clusters(5, 20, radius=0.05, seed=1)
    X, y, cell = D.sample(2000, np.random.default_rng(0))
    assert np.all(np.abs(X.numpy() - D.centres[cell]).max(1) <= D.radius + 1e-12)
    assert np.all(y.numpy() == D.labels[cell])
    rng = np.random.default_rng(3)
    for N in (5, 20, 80):
        sim = np.mean([0.5 + 0.5 * len(set(rng.integers(0, 20, N).tolist())) / 20 for _ in range(4000)])
        assert abs(sim - coverage_accuracy(20, N)) < 0.005
    assert coverage_accuracy(20, 0) == 0.5


def test_bounds_against_hand_computations():
    assert rademacher_bound(4, 10, 100) == pytest.approx(2 * 10 * 5 / 10)
    e = erm_bound(n=3, W0=5, c=0.4, W=52, N=10_000, delta=0.01)           # k = 10 (W is not a multiple of W0)
    l = lambda t: math.log1p(math.exp(-t))
    assert e["k"] == 10 and e["gamma"] == pytest.approx(2.0)
    assert e["margin"] == pytest.approx(l(4.0) / l(2.0))
    assert e["complexity"] == pytest.approx(2 / 2.0 * 2 * 52 * 4 / 100)
    assert e["confidence"] == pytest.approx(math.sqrt(math.log(100) / 20_000))
    assert e["bound"] == pytest.approx(1 - e["margin"] - e["complexity"] - e["confidence"])
    assert margin_bound(0.1, 3, 52, 10_000, 2.0, 0.01) == pytest.approx(1 - 0.1 / l(2.0) - e["complexity"] - e["confidence"])
    P = 7 * 6
    d = P * math.log2(P)
    assert vc_bound(4, 7, 10**6, 0.05) == pytest.approx(1 - 2 / 10**6 * (d * math.log2(2 * math.e * 10**6 / d)
                                                                          + math.log2(40)))   # realisable form
    assert vc_bound(4, 7, 10, 0.05) == -math.inf                          # fewer samples than the VC dimension
    assert fixed_margin_bound(4, 7, 10**4) > fixed_margin_bound(4, 70, 10**4)
    # width cancels: at exact multiples of W0 the complexity term of our bound is the same for every width
    terms = [erm_bound(3, 5, 0.4, 5 * k, 10_000)["complexity"] for k in (1, 4, 16)]
    assert max(terms) - min(terms) < 1e-12


def test_rademacher_estimate_factorises_and_stays_below_the_bound():
    X, _ = _data(80, n=2)
    one, se = rademacher_mc(X, W=1, n_sigma=8, restarts=4, steps=80)
    five, _ = rademacher_mc(X, W=5, n_sigma=8, restarts=4, steps=80)
    assert five == pytest.approx(5 * one, rel=1e-12) and 0 < one <= rademacher_bound(2, 1, 80) and se > 0


def test_robust_accuracy_is_at_most_clean_accuracy():
    T = Teacher(3, 4, seed=0)
    X, y = T.sample(500, np.random.default_rng(0))
    assert robust_accuracy(T.net, X, y, 0.0) == accuracy(T.net, X, y) == 1.0
    assert robust_accuracy(T.net, X, y, 0.1) <= robust_accuracy(T.net, X, y, 0.02) <= 1.0


@pytest.fixture(scope="module")
def tiny():
    cfg = experiment.Config.preset("tiny")
    return cfg, experiment.run(cfg)


def test_expressing_width_and_its_ladder():
    assert experiment.express_ladder(64) == [8, 16, 32, 64] and experiment.express_ladder(4) == [1, 2, 4]
    acc = experiment.EXPRESS_ACC
    rows = [dict(W=8, test_acc=0.7), dict(W=16, test_acc=acc), dict(W=32, test_acc=acc - 0.01), dict(W=64, test_acc=1.0)]
    assert experiment.expressing_width(rows) == 16
    assert experiment.expressing_width([dict(W=8, test_acc=0.5)]) is None


IDS = ["C1-rate", "C1-W0c", "C2-width", "C5-undersized", "C4-loss", "K8-hit-cubes", "K9-expressing-width", "K1-box",
       "K2-plateau",
       "K3-zero-error", "K4-approx-erm", "K5-bound-holds", "K6-missed-cubes", "K7-rademacher"]
CLAIMS = ["C1-rate", "C1-W0c", "C2-width", "C5-undersized", "C4-loss"]


def test_tiny_run(tiny):
    cfg, out = tiny
    assert [c["id"] for c in out["claims"]] == IDS
    for c in out["claims"]:
        if c["kind"] == "claim":
            assert c["interval"]["n"] == len(cfg.seeds) == c["replicates"]
            assert c["verdict"] == "not_run"        # three seeds: the replicate gate holds every claim back
            assert any(g["name"] == "replicates (seeds)" and not g["passed"] for g in c["gates"])
    parts = {r["part"] for r in out["rows"]}
    assert parts == {"teacher", "svc", "clusters", "express", "losses", "rademacher"}
    assert sorted({r["W"] for r in out["rows"] if r["part"] == "express"}) == experiment.express_ladder(cfg.cl_width)
    assert {r["mult"] for r in out["rows"] if r["part"] == "teacher"} == {cfg.under, *cfg.width_mults}
    assert all(r["max_abs"] <= 1.0 for r in out["rows"] if r["part"] in ("clusters", "express", "losses"))
    assert all(r["max_abs"] <= 1.0 for r in out["rows"] if r["part"] == "teacher" and r["box"])


def test_tiny_run_is_deterministic(tiny):
    cfg, out = tiny
    again = experiment.run(cfg)
    assert again["claims"] == out["claims"]


def _sign(s):
    return 1.0 if s % 2 else -1.0


def _rows(cfg, base=0.9, rise=0.04, rise_spread=0.0, gap=0.0, gap_spread=0.0, fam_gap=0.03, fam_spread=0.0,
          under_gap=0.1, under_spread=0.0, hit=1.0, loss_gap=0.03, loss_spread=0.0, loss_train=1.0, plateau=0.0,
          train_acc=1.0, c=(0.01, 0.01), families=None, express_at=1):
    """Synthetic rows for make_claims: accuracies set by the arguments (`base` at every N but the largest, `base + rise`
    there; the wider widths `gap` above W0; the first family `fam_gap` above the second; the under-sized arm
    `under_gap` below), a small spread across seeds that cancels in paired differences unless a `*_spread` is given
    (alternating in sign over seeds)."""
    out = []
    fams = families or cfg.teachers
    for fi, (n, W0) in enumerate(fams):
        for s in cfg.seeds:
            e = 0.001 * _sign(s)
            for m in (cfg.under, *cfg.width_mults):
                for N in cfg.Ns:
                    acc = (base + (rise + rise_spread * _sign(s) if N == max(cfg.Ns) else 0.0)
                           + (gap + gap_spread * _sign(s) if m > 1 else 0.0)
                           + (fam_gap + fam_spread * _sign(s) if fi == 0 else 0.0)
                           - (under_gap + under_spread * _sign(s) if m < 1 else 0.0) + e)
                    out.append(dict(part="teacher", n=n, W0=W0, c=c[fi % 2], seed=s, N=N, W=max(1, int(m * W0)),
                                    mult=m, box=True, train_acc=train_acc if m >= 1 else 0.8, test_acc=acc, risk=0.1,
                                    kcopy_risk=0.2 if m >= 1 else None, max_abs=1.0, own_bound=-5.0, plateau=plateau))
            for N in cfg.loss_Ns:
                for loss in cfg.losses:
                    out.append(dict(part="losses", n=n, W0=W0, seed=s, N=N, loss=loss,
                                    train_acc=loss_train if loss in ("logistic", "hinge") else 0.3,
                                    margin_median=1.0, max_abs=1.0,
                                    test_acc=0.9 + (loss_gap + loss_spread * _sign(s) if loss == "logistic" else 0.0) + e))
    for s in cfg.seeds:
        for N in cfg.cl_Ns:
            out.append(dict(part="clusters", seed=s, N=N, train_acc=1.0, test_acc=0.7, hit_acc=hit + 0.001 * _sign(s),
                            miss_acc=0.5 + 0.01 * _sign(s), predicted=0.7, max_abs=1.0))
        for W in experiment.express_ladder(cfg.cl_width):
            out.append(dict(part="express", seed=s, W=W, K=cfg.cl_K, covered=1.0, train_acc=1.0, max_abs=1.0,
                            test_acc=1.0 if W >= express_at else 0.8))
    out += [dict(part="rademacher", N=N, estimate_per_unit=1 / math.sqrt(N), bound_per_unit=2 / math.sqrt(N))
            for N in (20, 80)]
    return out


def _cfg(**kw):
    return experiment.Config.preset("tiny", teachers=((4, 4), (4, 16)), seeds=tuple(range(12)), **kw)


def _claims(cfg=None, **kw):
    cfg = cfg or _cfg()
    return {c["id"]: c for c in experiment.make_claims(_rows(cfg, **kw), cfg)}


def _verdicts(**kw):
    return {k: c["verdict"] for k, c in _claims(**kw).items()}


def test_make_claims_rules_against_delta():
    "Each claim at each verdict its rule can give: the 2x2 table for differences, the band for C2."
    good = _claims()
    for k in CLAIMS:
        assert good[k]["verdict"] == "reproduced", k
        assert good[k]["delta"] == experiment.DELTAS[k][0] and good[k]["delta_reason"]
        assert all(g["passed"] for g in good[k]["gates"]), k
    assert good["C2-width"]["band"] == [-0.02, None]
    # C1-rate: the widest network's rise against delta = 0.02
    assert _verdicts(rise=0.01)["C1-rate"] == "partial"                                # real rise, short of delta
    assert _verdicts(rise=0.01, rise_spread=0.03)["C1-rate"] == "inconclusive"         # reaches 0 and delta
    assert _verdicts(rise=0.0)["C1-rate"] == "not_reproduced"
    # C1-W0c: the family with the smaller W0/c ahead of the other, averaged over N, against delta = 0.02
    assert _verdicts(fam_gap=0.01)["C1-W0c"] == "partial"
    assert _verdicts(fam_gap=0.01, fam_spread=0.03)["C1-W0c"] == "inconclusive"
    assert _verdicts(fam_gap=0.0)["C1-W0c"] == "not_reproduced"
    assert _verdicts(fam_gap=-0.05)["C1-W0c"] == "not_reproduced"
    # the family with the larger W0/c is found from the data, not from the order of the families
    assert _verdicts(fam_gap=-0.05, c=(0.001, 0.01))["C1-W0c"] == "reproduced"
    # C2: accuracy(W) - accuracy(W0) within [-0.02, inf)
    assert _verdicts(gap=-0.02, gap_spread=0.01)["C2-width"] == "inconclusive"
    assert _verdicts(gap=-0.05)["C2-width"] == "not_reproduced"
    # C5: widest - under-sized at the largest N against delta = 0.05
    assert _verdicts(under_gap=0.03)["C5-undersized"] == "partial"
    assert _verdicts(under_gap=0.03, under_spread=0.06)["C5-undersized"] == "inconclusive"
    assert _verdicts(under_gap=0.0)["C5-undersized"] == "not_reproduced"
    # C4: logistic - hinge against delta = 0.02
    assert _verdicts(loss_gap=0.01)["C4-loss"] == "partial"
    assert _verdicts(loss_gap=0.01, loss_spread=0.03)["C4-loss"] == "inconclusive"
    assert _verdicts(loss_gap=-0.01)["C4-loss"] == "not_reproduced"
    cfg = _cfg()
    checks = {c["id"]: c["verdict"] for c in experiment.make_claims(_rows(cfg), cfg) if c["kind"] == "check"}
    assert set(checks.values()) == {"passed"}
    assert _claims(hit=0.9)["K8-hit-cubes"]["verdict"] == "failed"
    W = cfg.cl_width
    k9 = _claims(express_at=W)["K9-expressing-width"]
    assert k9["verdict"] == "passed" and k9["ours"] == W             # only the full width expresses: still passes
    assert _claims(express_at=2 * W)["K9-expressing-width"]["verdict"] == "failed"   # no width of the ladder does


@pytest.mark.parametrize("kw, failed, claims", [
    (dict(base=0.97, fam_gap=0.0, fam_spread=0.0), "unsaturated", ("C1-rate",)),   # no room for a rise of 2 delta
    (dict(train_acc=0.95), "training accuracy", ("C1-rate", "C1-W0c", "C2-width", "C5-undersized")),
    (dict(loss_train=0.95), "training accuracy", ("C4-loss",)),
    (dict(c=(0.01, 0.03)), "W0/c", ("C1-W0c",)),                        # W0/c differ 1.3-fold, not twofold
])
def test_gates_give_not_run(kw, failed, claims):
    c = _claims(**kw)
    for k in CLAIMS:
        if k in claims:
            assert c[k]["verdict"] == "not_run", k
            assert [g["name"] for g in c[k]["gates"] if not g["passed"]] == \
                [g["name"] for g in c[k]["gates"] if failed in g["name"]], k
        elif k != "C1-W0c" or "fam_gap" not in kw:
            assert c[k]["verdict"] == "reproduced", k


def test_replicate_gate():
    c = _claims(cfg=experiment.Config.preset("tiny", teachers=((4, 4), (4, 16)), seeds=tuple(range(11))))
    assert all(c[k]["verdict"] == "not_run" for k in CLAIMS)
    assert experiment.MIN_REPLICATES <= len(experiment.Config.preset("laptop").seeds)


def test_make_claims_keeps_teacher_families_apart():
    "Two families that disagree: the claims must see both, and a family's failure decides."
    cfg = _cfg()
    rows = _rows(cfg)
    rows = [r for r in rows if not (r["part"] == "losses" and r["W0"] == 16)] + [
        r for r in _rows(cfg, loss_gap=-0.02) if r["part"] == "losses" and r["W0"] == 16]
    v = {c["id"]: c for c in experiment.make_claims(rows, cfg)}
    assert v["C1-rate"]["verdict"] == "reproduced"
    assert v["C4-loss"]["verdict"] == "not_reproduced"        # the second family's logistic loss is behind
    assert "(4, 16)" in v["C4-loss"]["note"] and "(4, 4)" in v["C4-loss"]["note"]


def test_teacher_separation_guarantee():
    "Opposite labels are at least 2c / (W0 sqrt(n)) apart in l2: F0 is (W0 sqrt(n))-Lipschitz and |F0| >= c on the support."
    for n, W0, q in ((2, 4, 0.1), (8, 8, 0.02), (3, 32, 0.05)):
        T = Teacher(n, W0, quantile=q, seed=1)
        X, y = T.sample(3000, np.random.default_rng(0))
        gap = float(torch.cdist(X[y > 0], X[y < 0]).min())
        assert gap >= 2 * T.c / (W0 * math.sqrt(n)), (n, W0)
    # without the filter (a tiny quantile) the closest opposite pair comes closer
    T, U = Teacher(2, 4, quantile=0.1, seed=1), Teacher(2, 4, quantile=1e-4, seed=1)
    close = lambda T: float((lambda X, y: torch.cdist(X[y > 0], X[y < 0]).min())(*T.sample(3000, np.random.default_rng(0))))
    assert close(U) < close(T)


def test_rademacher_estimate_in_several_dimensions():
    "n = 3 and 5: the estimate (an ascent for the sup) is at least random search over the box with the same signs, and below the bound."
    for n in (3, 5):
        g = torch.Generator().manual_seed(n)
        X = torch.rand(60, n, generator=g, dtype=torch.float64)
        sigma = torch.where(torch.rand(5, 60, generator=g) < 0.5, -1.0, 1.0).double()
        est, _ = rademacher_mc(X, W=2, sigma=sigma, restarts=8, steps=200)
        w = 2 * torch.rand(20_000, n, generator=g, dtype=torch.float64) - 1
        b = 2 * torch.rand(20_000, generator=g, dtype=torch.float64) - 1
        h = torch.relu(X @ w.T + b)                                               # (N, M)
        rand_sup = torch.stack([(s[:, None] * h).mean(0).abs().max() for s in sigma])
        assert est >= 2 * float(rand_sup.mean()) * (1 - 1e-3), n
        assert est <= rademacher_bound(n, 2, 60), n


def test_laptop_preset_smoke(tmp_root):
    doc = cli.run_experiment("ermbounds", "laptop", "cpu", 0, smoke=True)
    assert doc["config"]["smoke"] and doc["config"]["width_mults"] == [1, 4, 16]
    assert [c["id"] for c in doc["claims"]] == IDS and not (tmp_root / "book" / "results").exists()
    assert len(experiment.Config.preset("laptop").seeds) >= experiment.MIN_REPLICATES


def test_full_preset_smoke(tmp_root):
    doc = cli.run_experiment("ermbounds", "full", "cpu", 0, smoke=True)
    assert doc["config"]["smoke"] and doc["config"]["teachers"] == [[8, 8], [8, 32], [16, 8], [16, 32]]
    assert doc["config"]["width_mults"] == [1, 8, 32] and not (tmp_root / "book" / "results").exists()
    plan = experiment.plan(experiment.Config.preset("full"))
    assert [p["phase"] for p in plan][:3] == ["worker start-up", "teacher-student grid", "SVC (rbf) reference"]
    assert cli.plan_units(plan) / experiment.GPU_UNITS_PER_S <= 600


def test_rademacher_estimate_against_a_grid_for_one_input():
    "n = 1: the inner supremum over (w, b) in [-1, 1]^2 by a fine grid, with the same signs."
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 1, generator=g, dtype=torch.float64)
    sigma = torch.where(torch.rand(6, 40, generator=g) < 0.5, -1.0, 1.0).double()
    est, _ = rademacher_mc(X, W=3, sigma=sigma, restarts=16, steps=300)
    grid = torch.linspace(-1, 1, 801, dtype=torch.float64)
    w, b = torch.meshgrid(grid, grid, indexing="ij")
    h = torch.relu(w[..., None] * X[:, 0] + b[..., None])                          # (801, 801, N)
    sup = torch.stack([(h * s).mean(-1).abs().amax() for s in sigma])
    assert est == pytest.approx(3 * float(sup.mean()), rel=2e-3)
    with pytest.raises(ValueError, match="sigma"):
        rademacher_mc(X, W=1, sigma=torch.zeros(2, 40))


def test_pgd_equals_torchattacks_pgd():
    "The same eps, alpha = eps/4, steps, no random start: torchattacks.PGD on the logits (0, F) gives the same points."
    import torchattacks

    class TwoLogits(torch.nn.Module):
        def __init__(self, f):
            super().__init__()
            self.f = f

        def forward(self, x):
            F = self.f(x)
            return torch.stack([torch.zeros_like(F), F], 1)

    T = Teacher(3, 6, seed=2)
    T.net.double()
    X, y = T.sample(400, np.random.default_rng(4))
    X, y = X.double(), y.double()
    net = BoxReLUNet(3, 10, generator=torch.Generator().manual_seed(5), dtype=torch.float64)   # an imperfect net too
    for f in (T.net, net):
        for eps, steps in ((0.02, 10), (0.1, 5)):
            ours = pgd(f, X, y, eps, steps=steps)
            theirs = torchattacks.PGD(TwoLogits(f), eps=eps, alpha=eps / 4, steps=steps, random_start=False)(
                X, (y > 0).long())
            assert torch.equal(ours, theirs)
            assert (ours - X).abs().max() <= eps + 1e-12 and ours.min() >= 0 and ours.max() <= 1


def test_robust_accuracy_against_the_closed_form_of_a_linear_network():
    "relu(z) - relu(-z) = z: a width-2 network computes w.x + b, robust at x iff y (w.x + b) > eps ||w||_1."
    w = torch.tensor([[0.6, -0.3, 0.2]], dtype=torch.float64)
    net = BoxReLUNet.from_params(torch.cat([w, -w]), torch.tensor([-0.1, 0.1], dtype=torch.float64),
                                 torch.tensor([1.0, -1.0], dtype=torch.float64))
    g = torch.Generator().manual_seed(1)
    X = 0.1 + 0.8 * torch.rand(2000, 3, generator=g, dtype=torch.float64)      # inside, so the clip never binds
    y = torch.where(torch.rand(2000, generator=g) < 0.5, -1.0, 1.0).double()
    for eps in (0.02, 0.05):
        exact = float((y * (X @ w[0] - 0.1) > eps * w.abs().sum()).double().mean())
        assert robust_accuracy(net, X, y, eps, steps=10) == pytest.approx(exact, abs=1e-12)

