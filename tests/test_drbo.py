"""Tests of iclr25_repro.drbo: the DAG space, the BIC and its cache, the batched surrogates, the trust region, metrics,
pruning, bad inputs, determinism, and a tiny experiment run."""
import itertools
import math

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal

from iclr25_repro.drbo import experiment
from iclr25_repro.drbo.model import (BICScorer, DrBO, NodeSurrogates, RandomDAGSearch, TrustRegion, dag2vec,
                                     dag_metrics, ges_graph, is_dag, load_sachs, prune_linear, simulate_linear_sem,
                                     space_dim, trust_region_candidates, vec2dag)


def _all_dags(d):
    off = [(i, j) for i in range(d) for j in range(d) if i != j]
    out = []
    for bits in itertools.product([0, 1], repeat=len(off)):
        A = np.zeros((d, d), bool)
        for (i, j), b in zip(off, bits):
            A[i, j] = b
        if is_dag(A):
            out.append(A)
    return out


@pytest.mark.parametrize("d,k", [(2, 1), (5, 2), (10, 8), (20, 3)])
def test_vec2dag_always_acyclic(d, k):
    Z = torch.rand(2000, space_dim(d, k), generator=torch.Generator().manual_seed(d * k)) * 2 - 1
    A = vec2dag(Z, d, k)
    assert A.shape == (2000, d, d) and A.dtype == torch.bool
    assert is_dag(A).all()
    assert not A.diagonal(dim1=-2, dim2=-1).any()


@pytest.mark.parametrize("d,count", [(3, 25), (4, 543)])
def test_every_dag_is_reachable_at_full_rank(d, count):
    dags = _all_dags(d)
    assert len(dags) == count
    for A in dags:
        assert (vec2dag(torch.as_tensor(dag2vec(A)), d, d).numpy() == A).all()


def test_is_dag_detects_cycles_and_dag2vec_rejects_them():
    cyc = np.zeros((3, 3), bool)
    cyc[0, 1] = cyc[1, 2] = cyc[2, 0] = True
    assert not is_dag(cyc).item()
    with pytest.raises(ValueError, match="cycle"):
        dag2vec(cyc)


def test_vec2dag_rejects_wrong_dimension():
    with pytest.raises(ValueError, match="d\\*\\(1\\+rank\\)"):
        vec2dag(torch.zeros(5, 17), 4, 3)


@pytest.mark.parametrize("noise", ["ev", "nv"])
def test_bic_equals_direct_gaussian_likelihood(noise):
    X, W = simulate_linear_sem(d=5, n=800, edges_per_node=1.0, seed=4)
    A = W != 0
    Xc = X - X.mean(0)
    n, d = X.shape
    What, s2 = np.zeros((d, d)), np.zeros(d)
    for j in range(d):
        pa = np.flatnonzero(A[:, j])
        if len(pa):
            What[pa, j] = np.linalg.lstsq(Xc[:, pa], Xc[:, j], rcond=None)[0]
        s2[j] = np.mean((Xc[:, j] - Xc @ What[:, j]) ** 2)
    if noise == "ev":
        s2 = np.full(d, s2.mean())
    inv = np.linalg.inv(np.eye(d) - What.T)
    loglik = multivariate_normal(np.zeros(d), inv @ np.diag(s2) @ inv.T).logpdf(Xc).sum()
    direct = 2 / (n * d) * (loglik - A.sum() / 2 * math.log(n)) + math.log(2 * math.pi) + 1
    assert abs(BICScorer(X, noise).score(A) - direct) < 1e-9


def test_cache_gives_identical_values_and_batch_matches_single():
    X, W = simulate_linear_sem(d=6, n=500, seed=1)
    sc = BICScorer(X)
    Z = torch.rand(32, space_dim(6, 3), generator=torch.Generator().manual_seed(0)) * 2 - 1
    As = vec2dag(Z, 6, 3).numpy()
    totals, local = sc.score_batch(As)
    size = len(sc.cache)
    again = [sc.score(A) for A in As]
    assert len(sc.cache) == size and np.array_equal(totals, np.array(again))
    assert sc.calls == 64 and local.shape == (32, 6)


def test_equal_variance_bic_prefers_true_direction():
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal(50_000)
    X = np.stack([x1, x1 + rng.standard_normal(50_000)], axis=1)
    fwd, bwd = np.array([[0, 1], [0, 0]], bool), np.array([[0, 0], [1, 0]], bool)
    assert BICScorer(X, "ev").score(fwd) - BICScorer(X, "ev").score(bwd) == pytest.approx(math.log(1.25), abs=0.02)
    assert abs(BICScorer(X, "nv").score(fwd) - BICScorer(X, "nv").score(bwd)) < 1e-12


def test_batched_surrogates_equal_per_node_networks():
    torch.manual_seed(0)
    A = vec2dag(torch.rand(300, space_dim(7, 4)) * 2 - 1, 7, 4).float()
    net = NodeSurrogates(7, hidden=16, dropout=0.0)
    loop = torch.cat([net.node_network(j)(A[:, :, j]) for j in range(7)], dim=1)
    assert torch.allclose(net(A), loop, atol=1e-5)


def test_surrogate_dropout_is_seeded_and_local():
    A = vec2dag(torch.rand(64, space_dim(5, 2), generator=torch.Generator().manual_seed(1)) * 2 - 1, 5, 2).float()
    a = NodeSurrogates(5, generator=torch.Generator().manual_seed(3))(A)
    b = NodeSurrogates(5, generator=torch.Generator().manual_seed(3))(A)
    assert torch.equal(a, b)
    net = NodeSurrogates(5, dropout=0.0)
    A2 = A.clone()
    A2[0, :, 2] = 1 - A2[0, :, 2]
    A2[0, 2, 2] = 0
    diff = (net(A2) - net(A)).abs().amax(0)
    assert diff[2] > 0 and diff[[0, 1, 3, 4]].max() == 0


def test_surrogate_rejects_wrong_shape_and_dropout():
    with pytest.raises(ValueError, match="shape"):
        NodeSurrogates(4)(torch.zeros(8, 3, 3))
    with pytest.raises(ValueError, match="dropout"):
        NodeSurrogates(4, dropout=1.0)


def test_trust_region_rule():
    tr = TrustRegion()
    seq = [tr.update(x) for x in [True, True, True, False, False, False, False, False]]
    assert seq == [1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0]
    tr = TrustRegion(length=0.015)
    assert [tr.update(False) for _ in range(5)][-1] == 2.0     # 0.0075 < 0.01 restarts at the maximum
    c = trust_region_candidates(np.zeros(40), 0.2, 500, np.random.default_rng(0))
    assert c.shape == (500, 40) and np.abs(c).max() <= 0.2 + 1e-12 and (c != 0).any(axis=1).all()


def test_shd_on_known_pairs():
    true = np.zeros((4, 4), bool)
    true[0, 1] = true[1, 2] = true[2, 3] = True
    assert dag_metrics(true, true)["shd"] == 0
    est = true.copy()
    est[1, 2], est[2, 1] = False, True        # reversed
    est[0, 3] = True                          # extra
    est[2, 3] = False                         # missing
    m = dag_metrics(est, true)
    assert (m["shd"], m["reversed"], m["extra"], m["missing"]) == (3, 1, 1, 1)
    assert m["tpr"] == pytest.approx(1 / 3) and m["fdr"] == pytest.approx(2 / 3)
    und = true | true.T
    assert dag_metrics(und, true)["shd"] == 0 and dag_metrics(und, true)["tpr"] == 1.0
    und_extra = true.copy()
    und_extra[0, 3] = und_extra[3, 0] = True  # an undirected edge where the truth has none
    m = dag_metrics(und_extra, true)
    assert (m["shd"], m["extra"], m["n_edges"]) == (1, 1, 4) and m["fdr"] == pytest.approx(0.25)


def test_prune_linear_drops_weak_edges():
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(5000)
    x1 = rng.standard_normal(5000)
    x2 = 1.0 * x0 + 0.05 * x1 + rng.standard_normal(5000)
    A = np.zeros((3, 3), bool)
    A[0, 2] = A[1, 2] = True
    P = prune_linear(np.stack([x0, x1, x2], 1), A)
    assert P[0, 2] and not P[1, 2] and P.sum() == 1


@pytest.mark.parametrize("X,match", [
    (np.ones((10,)), "2-D"),
    (np.ones((10, 3)), "constant"),
    (np.ones((4, 6)), "more samples"),
    (np.array([[0.0, np.inf]] * 10), "non-finite"),
])
def test_bad_data(X, match):
    with pytest.raises(ValueError, match=match):
        DrBO(max_evals=64).fit(X)


def test_bad_settings():
    X, _ = simulate_linear_sem(d=4, n=100, edges_per_node=1.0)
    with pytest.raises(ValueError, match="at least one batch"):
        DrBO(max_evals=10, batch_size=64).fit(X)
    with pytest.raises(ValueError, match="n_candidates"):
        DrBO(max_evals=64, n_candidates=10).fit(X)
    with pytest.raises(ValueError, match="noise"):
        BICScorer(X, noise="gp")
    with pytest.raises(ValueError, match="same shape"):
        dag_metrics(np.zeros((3, 3)), np.zeros((4, 4)))
    with pytest.raises(ValueError, match="n_grad_steps"):
        DrBO(max_evals=64, n_grad_steps=0).fit(X)
    with pytest.raises(ValueError, match="clip_local"):
        DrBO(max_evals=64, clip_local=(6.0, -12.0)).fit(X)


@pytest.mark.parametrize("noise", ["ev", "nv"])
def test_aggregate_numpy_and_torch_agree(noise):
    X, _ = simulate_linear_sem(d=4, n=100, edges_per_node=1.0)
    sc = BICScorer(X, noise)
    local = np.random.default_rng(0).normal(size=(7, 4))
    edges = np.arange(7)
    a = sc.aggregate(edges, local)
    b = sc.aggregate(torch.as_tensor(edges), torch.as_tensor(local)).numpy()
    assert np.allclose(a, b, rtol=0, atol=1e-12)


def test_collinear_parents_do_not_crash():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(200)
    X = np.stack([x, 2 * x, x + rng.standard_normal(200)], axis=1)
    assert np.isfinite(BICScorer(X).local_score(2, [0, 1]))


def test_random_state_none_and_budget_counter():
    X, _ = simulate_linear_sem(d=4, n=200, edges_per_node=1.0)
    m = DrBO(max_evals=128, n_candidates=500, random_state=None).fit(X)
    assert m.n_evals_ == 128 and m.scorer_.calls == 128


def test_fit_is_deterministic_and_budget_rounds_up():
    X, W = simulate_linear_sem(d=5, n=300, edges_per_node=1.0, seed=2)
    a = DrBO(max_evals=200, batch_size=64, n_candidates=800, random_state=7).fit(X)
    b = DrBO(max_evals=200, batch_size=64, n_candidates=800, random_state=7).fit(X)
    assert a.n_evals_ == 256 and len(a.history_) == 4
    assert np.array_equal(a.raw_adjacency_, b.raw_adjacency_) and a.score_ == b.score_
    assert [h["best_score"] for h in a.history_] == [h["best_score"] for h in b.history_]
    assert np.all(np.diff(a.best_scores_) >= 0) and is_dag(a.adjacency_)
    assert a.get_params()["random_state"] == 7


def test_drbo_beats_random_search_on_a_small_problem():
    X, W = simulate_linear_sem(d=8, n=1000, edges_per_node=1.5, seed=0)
    bo = DrBO(max_evals=640, n_candidates=3000, random_state=0).fit(X)
    rs = RandomDAGSearch(max_evals=640, random_state=0).fit(X)
    assert bo.score_ > rs.score_
    assert dag_metrics(bo.adjacency_, W != 0)["shd"] <= dag_metrics(rs.adjacency_, W != 0)["shd"]


def test_sachs_and_ges():
    X, A, names = load_sachs()
    assert X.shape == (853, 11) and A.sum() == 18 and "PKA" in names
    Xs, W = simulate_linear_sem(d=5, n=500, edges_per_node=1.0, seed=0)
    G = ges_graph(Xs)
    assert G.shape == (5, 5) and G.dtype == bool


def _fake_rows(bo_curve, rs_curve, rs_best_eval, shd_bo, shd_dagma, sachs_bo, sachs_ges):
    evals = [64 * (i + 1) for i in range(len(bo_curve))]
    rows = [dict(dataset="synthetic", seed=0, method="true DAG", shd=0, score=0.0),
            dict(dataset="synthetic", seed=0, method="DrBO", shd=shd_bo, evals=evals, curve=bo_curve),
            dict(dataset="synthetic", seed=0, method="random search", shd=10, evals=evals, curve=rs_curve,
                 best_eval=rs_best_eval, n_evals=evals[-1]),
            dict(dataset="synthetic", seed=0, method="DAGMA", shd=shd_dagma),
            dict(dataset="sachs", seed=0, method="DrBO", shd=sachs_bo),
            dict(dataset="sachs", seed=0, method="GES", shd=sachs_ges)]
    return experiment.make_claims(rows, ("DAGMA",), ("GES",))


def test_make_claims_rules():
    good = _fake_rows([-1, -0.5, -0.1, -0.05], [-1, -0.9, -0.8, -0.8], 256, 0, 1, 10, 12)
    assert [c["verdict"] for c in good] == ["reproduced", "reproduced", "reproduced"]
    assert good[0]["ours"] == pytest.approx(256 / 128)  # random found -0.8 at 256, DrBO passed it at 128
    slow = _fake_rows([-1, -0.5, -0.1, -0.05], [-1, -0.9, -0.8, -0.8], 192, 0, 1, 10, 12)
    assert slow[0]["verdict"] == "partial"              # higher final score, but a speed-up of 1.5 < 2
    bad = _fake_rows([-1, -0.95, -0.9, -0.85], [-1, -0.9, -0.8, -0.8], 192, 3, 0, 20, 12)
    assert [c["verdict"] for c in bad] == ["not_reproduced", "not_reproduced", "not_reproduced"]
    mid = _fake_rows([-1, -0.2, -0.1, -0.05], [-1, -0.9, -0.8, -0.8], 256, 2, 1, 14, 12)
    assert [c["verdict"] for c in mid] == ["reproduced", "partial", "partial"]


def test_tiny_experiment_run():
    cfg = experiment.Config.preset("tiny")
    out = experiment.run(cfg)
    ids = [c["id"] for c in out["claims"]]
    assert ids == ["C1-efficiency", "C2-accuracy", "C3-sachs"]
    assert all(c["verdict"] in ("reproduced", "partial", "not_reproduced") for c in out["claims"])
    assert {r["method"] for r in out["rows"]} >= {"DrBO", "random search", "GES", "true DAG"}
    assert experiment.Config.preset("full").d == 30
