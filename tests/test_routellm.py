"""Tests of iclr25_repro.routellm: the metrics (PGR, APGR, CPT, the optimal router), Bradley-Terry against
scikit-learn and on known strengths, tiers, every router's interface and invariants, the encoder against
sentence-transformers, the world generator, bad inputs, determinism, and a tiny run of the experiment."""
import math

import numpy as np
import pytest
import torch

from iclr25_repro.routellm import experiment
from iclr25_repro.routellm.model import (A_WINS, B_WINS, TIE, BertRouter, MFModel, MFRouter, Preferences, RandomRouter,
                                         SWRankingRouter, TextEncoder, apgr, arena_battles, arena_elo, bradley_terry,
                                         calibrate_threshold, class_battles, compute_tiers, cpt, elo, evaluate_router,
                                         make_queries, make_world, optimal_curve, pgr, route_curve, win_matrices,
                                         ARENA_MIX, CHAT_MIX, TOPICS)


# ---------------------------------------------------------------- metrics

def test_pgr_and_cpt_on_hand_made_curve():
    S, W = np.array([1, 1, 1, 1.0]), np.array([1, 1, 0, 0.0])
    assert pgr(W.mean(), S, W) == 0 and pgr(S.mean(), S, W) == 1
    share, perf = np.array([0, 0.25, 0.5, 1.0]), np.array([0.5, 0.75, 1.0, 1.0])
    assert cpt(share, perf, S, W, 0.5) == pytest.approx(0.25)
    assert cpt(share, perf, S, W, 0.75) == pytest.approx(0.375)
    # APGR = area under PGR: 0.25*0.25 + 0.25*0.75 + 0.5*1
    assert apgr(share, perf, S, W) == pytest.approx(0.25 * 0.25 + 0.25 * 0.75 + 0.5)


def test_route_curve_runs_from_all_weak_to_all_strong_and_is_monotone_in_threshold():
    rng = np.random.default_rng(0)
    S, W = rng.uniform(5, 10, 100), rng.uniform(1, 6, 100)
    share, perf = route_curve(rng.uniform(size=100), S, W)
    assert share[0] == 0 and share[-1] == 1 and np.all(np.diff(share) >= 0)
    assert perf[0] == pytest.approx(W.mean()) and perf[-1] == pytest.approx(S.mean())


def test_random_router_apgr_is_one_half_in_expectation():
    rng = np.random.default_rng(1)
    S, W = rng.integers(3, 11, 300).astype(float), rng.integers(1, 9, 300).astype(float)
    rr = RandomRouter(seed=5)
    vals = np.array([evaluate_router(rr.strong_win_rate(np.zeros((300, 2))), S, W)["apgr"] for _ in range(400)])
    assert abs(vals.mean() - 0.5) < 4 * vals.std(ddof=1) / math.sqrt(len(vals))


def test_optimal_router_is_the_ceiling_and_matches_brute_force():
    rng = np.random.default_rng(2)
    W = rng.integers(0, 2, 8).astype(float)
    S = np.maximum(W, rng.integers(0, 2, 8)).astype(float)
    S[0], W[0] = 1.0, 0.0
    shares = np.arange(9) / 8
    _, opt = optimal_curve(S, W, shares)
    import itertools
    best = np.full(9, -np.inf)
    for m in itertools.product([0, 1], repeat=8):
        m = np.array(m, bool)
        best[m.sum()] = max(best[m.sum()], np.where(m, S, W).mean())
    assert np.allclose(np.maximum.accumulate(best), opt)
    o = apgr(*optimal_curve(S, W, shares), S, W)  # exact area: the optimal curve is linear between k/n
    for k in range(50):
        assert evaluate_router(rng.uniform(size=8), S, W)["apgr"] <= o + 1e-12
    # the official 0/1 formula: weak correct + min(budget, #(weak wrong and strong right))
    gains = np.sum((W == 0) & (S == 1))
    for s in shares:
        assert optimal_curve(S, W, [s])[1][0] == pytest.approx((W.sum() + min(s * 8, gains)) / 8)


def test_calibrated_threshold_gives_the_target_share():
    ref = np.zeros((500, 3))
    for p in (0.1, 0.5, 0.9):
        a = calibrate_threshold(RandomRouter(seed=4), ref, p)
        assert abs((RandomRouter(seed=4).strong_win_rate(ref) >= a).mean() - p) <= 1 / 500


def test_metrics_equal_a_transcription_of_the_official_evaluation():
    "The official sweep: pd.qcut bin edges, >= at each edge but the last, trapezoid APGR, np.interp CPT."
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(11)
    for _ in range(5):
        n = 300
        scores, S, W = rng.uniform(size=n), rng.integers(2, 11, n).astype(float), rng.integers(1, 9, n).astype(float)
        _, edges = pd.qcut(scores, 10, retbins=True)
        pts = []
        for i, a in enumerate(edges):
            sel = scores >= a if i != len(edges) - 1 else scores > a
            pts.append((sel.mean() * 100, np.where(sel, S, W).mean()))
        pts.sort()
        x, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        auc = np.trapezoid(y, x / 100)
        wa, sa = np.trapezoid(np.full_like(x, W.mean()), x / 100), np.trapezoid(np.full_like(x, S.mean()), x / 100)
        official_apgr = (auc - wa) / (sa - wa)
        official_cpt50 = np.interp(0.5 * (S.mean() - W.mean()) + W.mean(), y, x) / 100
        ours = evaluate_router(scores, S, W)
        assert ours["apgr"] == pytest.approx(official_apgr, abs=1e-12)
        assert cpt(ours["share"], ours["perf"], S, W, 0.5, method="interp") == pytest.approx(official_cpt50, abs=1e-12)
        g = pgr(ours["perf"], S, W)                       # the first crossing: below 0.5 before it, 0.5 at it
        first = ours["cpt50"]
        assert np.all(g[ours["share"] < first - 1e-12] < 0.5)
        assert np.interp(first, ours["share"], g) == pytest.approx(0.5, abs=1e-9)


def test_cpt_takes_the_first_crossing_of_a_curve_that_is_not_monotone():
    S, W = np.ones(4), np.zeros(4)                         # PGR = perf
    share = np.array([0, 0.25, 0.5, 0.75, 1.0])
    perf = np.array([0, 0.6, 0.4, 0.7, 1.0])
    assert cpt(share, perf, S, W, 0.5) == pytest.approx(0.25 * 0.5 / 0.6)
    assert cpt(share, perf, S, W, 0.65) == pytest.approx(0.5 + 0.25 * 0.25 / 0.3)
    assert cpt(share, perf, S, W, 0.0) == 0.0
    rising = np.array([0, 0.3, 0.5, 0.8, 1.0])              # on a rising curve the official reading agrees
    for x in (0.1, 0.5, 0.8, 0.95):
        assert cpt(share, rising, S, W, x) == pytest.approx(cpt(share, rising, S, W, x, method="interp"))
    assert np.isnan(cpt(share[:3], perf[:3], S, W, 0.9))    # never reached
    with pytest.raises(ValueError, match="method"):
        cpt(share, perf, S, W, 0.5, method="last")


def test_metric_bad_inputs():
    with pytest.raises(ValueError, match="equal-length"):
        pgr(0.5, np.ones(3), np.ones(2))
    with pytest.raises(ValueError, match="strong model must score higher"):
        apgr([0, 1], [0, 1], np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match="x must lie"):
        cpt([0, 1], [0, 1], np.ones(2), np.zeros(2), 1.5)
    with pytest.raises(ValueError, match="one entry per query"):
        route_curve(np.ones(2), np.ones(3), np.zeros(3))
    with pytest.raises(ValueError, match="n_bins"):
        route_curve(np.ones(3), np.ones(3), np.zeros(3), n_bins=0)
    with pytest.raises(ValueError, match="finite"):
        route_curve(np.array([0.1, np.nan, 0.3]), np.ones(3), np.zeros(3))
    with pytest.raises(ValueError, match="shares"):
        optimal_curve(np.ones(3), np.zeros(3), [-0.5, 1.5])
    with pytest.raises(ValueError, match="empty"):
        calibrate_threshold(RandomRouter(), np.zeros((0, 2)), 0.5)


# ---------------------------------------------------------------- Bradley-Terry and tiers

def _prefs(n, M=4, seed=0, ties=True):
    rng = np.random.default_rng(seed)
    a = rng.integers(M, size=n)
    b = (a + rng.integers(1, M, size=n)) % M
    y = rng.choice([A_WINS, TIE, B_WINS] if ties else [A_WINS, B_WINS], n)
    return Preferences(rng.normal(size=(n, 6)), a, b, y, tuple(f"m{i}" for i in range(M)))


def test_bradley_terry_equals_sklearn_weighted_logistic_regression():
    from sklearn.linear_model import LogisticRegression
    p = _prefs(400, seed=3)
    w = np.random.default_rng(3).uniform(10, 100, len(p))
    ours = elo(bradley_terry(win_matrices(p, w)))[0].numpy()
    n = len(p)
    X = np.zeros((2 * n, 4))
    X[np.arange(2 * n), np.tile(p.model_a, 2)] = math.log(10)
    X[np.arange(2 * n), np.tile(p.model_b, 2)] = -math.log(10)
    Y = np.concatenate([p.outcome >= 0.5, p.outcome == 1.0]).astype(float)
    ref = 400 * LogisticRegression(fit_intercept=False, C=np.inf, tol=1e-10, max_iter=2000).fit(
        X, Y, sample_weight=np.tile(w, 2)).coef_[0]
    assert np.allclose(ours - ours[0], ref - ref[0], atol=1e-3)


def test_bradley_terry_recovers_known_strengths():
    rng = np.random.default_rng(4)
    xi = np.array([1.0, 0.5, 0.0, -0.7])
    n = 30_000
    a = rng.integers(4, size=n)
    b = (a + rng.integers(1, 4, size=n)) % 4
    y = np.where(rng.uniform(size=n) < 1 / (1 + np.exp(-(xi[a] - xi[b]))), A_WINS, B_WINS)
    est = bradley_terry(win_matrices(Preferences(np.zeros((n, 1)), a, b, y, ("a", "b", "c", "d"))))[0].numpy()
    assert np.abs((est - est.mean()) - (xi - xi.mean())).max() < 0.08


def test_batched_fit_equals_one_by_one():
    p = _prefs(300, seed=5)
    W = np.random.default_rng(5).uniform(10, 100, (3, len(p)))
    batched = bradley_terry(win_matrices(p, W))
    for i in range(3):
        assert torch.allclose(batched[i], bradley_terry(win_matrices(p, W[i]))[0], atol=1e-9)


@pytest.mark.parametrize("seed", [6, 7, 8])
def test_tiers_minimise_the_sum_of_tier_variances(seed):
    r = np.random.default_rng(seed).normal(1000, 100, 9)
    t = compute_tiers(r, 3)
    assert set(t) == {0, 1, 2} and r[t == 0].min() > r[t == 1].max() and r[t == 1].min() > r[t == 2].max()
    # brute force over all contiguous splits of the sorted ratings, with the official objective (sum of np.var)
    s = np.sort(r)[::-1]
    best = min(np.var(s[:i]) + np.var(s[i:j]) + np.var(s[j:]) for i in range(1, 8) for j in range(i + 1, 9))
    assert sum(np.var(r[t == k]) for k in range(3)) == pytest.approx(best)
    with pytest.raises(ValueError, match="n_tiers"):
        compute_tiers(r, 10)


# ---------------------------------------------------------------- routers

@pytest.fixture(scope="module")
def world_prefs():
    rng = np.random.default_rng(7)
    w = make_world(10, rng)
    q = make_queries(ARENA_MIX, 200, rng)
    pid, a, b, y = arena_battles(w, q, 6, rng)
    # embeddings: topic one-hot plus level, so routers can learn difficulty without the encoder
    E = np.concatenate([np.eye(len(TOPICS))[q["topic"]], q["level"][:, None] / 3.0, np.ones((200, 1))], 1)
    return w, Preferences(E[pid], a, b, y, w.names, prompt_id=pid), E


@pytest.mark.parametrize("make", [lambda: SWRankingRouter(n_tiers=4), lambda: MFRouter(dim=8, epochs=2, seed=0),
                                  lambda: BertRouter(n_tiers=4, epochs=30)])
def test_router_interface(world_prefs, make):
    w, pref, E = world_prefs
    r = make().fit(pref, w.names[0], w.names[6])
    p = r.strong_win_rate(E[:20])
    assert p.shape == (20,) and np.all((p >= 0) & (p <= 1))
    lo, hi = r.route(E[:20], 0.2), r.route(E[:20], 0.8)
    assert np.all(hi <= lo)  # a higher threshold never sends more queries to the strong model
    with pytest.raises(ValueError, match="threshold"):
        r.route(E[:2], 1.5)
    with pytest.raises(ValueError, match="unknown model"):
        make().fit(pref, "gpt-4", w.names[1])
    with pytest.raises(ValueError, match="no encoder"):
        r.strong_win_rate(["a text"])


def test_mf_router_is_antisymmetric_and_linear_in_the_embedding():
    torch.manual_seed(0)
    mf = MFModel(4, 6, 5)
    q = torch.randn(7, 6)
    with torch.no_grad():
        d = lambda m: mf(torch.full((7,), m), q)
        assert torch.allclose(torch.sigmoid(d(1) - d(2)) + torch.sigmoid(d(2) - d(1)), torch.ones(7))
        v = torch.nn.functional.normalize(mf.P.weight, dim=1)
        u = mf.proj.weight.T @ (mf.head.weight[0] * (v[1] - v[2]))
        assert torch.allclose(d(1) - d(2), q @ u, atol=1e-5)


def test_sw_router_reads_local_win_rates():
    rng = np.random.default_rng(8)
    n = 2000
    c = rng.integers(2, size=n)
    X = np.where(c[:, None] == 0, [1.0, 0.1], [0.1, 1.0])
    y = np.where(rng.uniform(size=n) < np.where(c == 0, 0.9, 0.2), A_WINS, B_WINS)
    r = SWRankingRouter(n_tiers=2).fit(Preferences(X, np.zeros(n, int), np.ones(n, int), y, ("s", "w")), "s", "w")
    p = r.strong_win_rate(np.array([[1.0, 0.1], [0.1, 1.0]]))
    assert p[0] > 0.7 and p[1] < 0.4
    assert torch.allclose(r.weights(torch.tensor([[1.0, 0.0]])), torch.tensor([[100.0, 10.0]]))


def test_class_battles_labels():
    p = Preferences(np.zeros((4, 1)), [0, 2, 0, 1], [2, 0, 1, 2], [A_WINS, A_WINS, TIE, B_WINS], ("s", "x", "w"))
    idx, lab = class_battles(p, [0], [2])
    assert idx.tolist() == [0, 1] and lab.tolist() == [0, 2]  # s beat w; w beat s


def test_preferences_bad_inputs():
    with pytest.raises(ValueError, match="empty"):
        Preferences(np.zeros((0, 2)), [], [], [], ("a", "b"))
    with pytest.raises(ValueError, match="outcome"):
        Preferences(np.zeros((1, 2)), [0], [1], [0.3], ("a", "b"))
    with pytest.raises(ValueError, match="outside"):
        Preferences(np.zeros((1, 2)), [0], [5], [1.0], ("a", "b"))
    with pytest.raises(ValueError, match="shape"):
        Preferences(np.zeros((2, 2)), [0], [1], [1.0], ("a", "b"))
    p = Preferences(np.zeros((1, 2)), [0], [1], [1.0], ("a", "b"))
    with pytest.raises(ValueError, match="different model lists"):
        p + Preferences(np.zeros((1, 2)), [0], [1], [1.0], ("a", "c"))
    with pytest.raises(ValueError, match="different models"):
        SWRankingRouter().fit(p, "a", "a")
    with pytest.raises(ValueError, match="queries"):
        SWRankingRouter().fit(p, "a", "b").strong_win_rate([])
    with pytest.raises(ValueError, match="not fitted"):
        MFRouter().strong_win_rate(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="batch_size"):
        MFRouter(batch_size=0)
    with pytest.raises(ValueError, match="epochs"):
        BertRouter(epochs=0)


# ---------------------------------------------------------------- encoder and world

def test_encoder_matches_sentence_transformers_and_orders_similarity():
    enc = TextEncoder()
    texts = ["How do I reverse a list in Python?", "What is the way to reverse a Python list?",
             "Compose a sonnet about the sea.", "hi"]
    E = enc(texts)
    assert E.shape == (4, 384) and np.allclose(np.linalg.norm(E, axis=1), 1, atol=1e-5)
    assert E[0] @ E[1] > E[0] @ E[2]
    st = pytest.importorskip("sentence_transformers")
    from iclr25_repro.routellm.model import minilm_path
    ref = st.SentenceTransformer(str(minilm_path()), device="cpu").encode(texts, normalize_embeddings=True)
    assert np.allclose(E, ref, atol=1e-5)
    with pytest.raises(ValueError, match="empty"):
        enc([])


def test_world_generator():
    rng = np.random.default_rng(9)
    q = make_queries({"law": 1, "coding": 1}, 200, rng, "test")
    assert set(q["topic"]) <= {TOPICS.index("law"), TOPICS.index("coding")}
    assert np.all((q["d"] >= q["level"] / 4) & (q["d"] < (q["level"] + 1) / 4))
    tr = make_queries({"law": 1}, 200, rng, "train")["text"]
    te = make_queries({"law": 1}, 200, rng, "test")["text"]
    from iclr25_repro.routellm.model import _CONTEXTS, _SUBJECTS
    combos = [f"{x}, {c}" for level in _SUBJECTS["law"] for x in level for c in _CONTEXTS["knowledge"]]
    used = lambda texts: {x for t in texts for x in combos if x.lower() in t.lower()}
    assert used(tr) and used(te) and not used(tr) & used(te)  # train and test questions are disjoint
    subject = lambda texts: {x for t in texts for level in _SUBJECTS["law"] for x in level if x.lower() in t.lower()}
    assert subject(te) <= subject(tr)                          # every benchmark subject is asked in training
    assert len(used(tr)) > 2 * len(subject(tr))                # in several settings each
    w = make_world(12, rng)
    p = w.quality(q)
    assert p.shape == (12, 200) and np.all((p > 0) & (p < 1))
    assert w.quality(q, [w.names[0]]).mean() > w.quality(q, [w.names[-1]]).mean()
    with pytest.raises(ValueError, match="unknown topics"):
        make_queries({"cooking": 1}, 3, rng)
    with pytest.raises(ValueError, match="n_models"):
        make_world(3, rng)


# ---------------------------------------------------------------- experiment

@pytest.fixture(scope="module")
def tiny_run():
    cfg = experiment.Config.preset("tiny")
    return cfg, experiment.run(cfg)


def test_tiny_run_has_claims_and_valid_numbers(tiny_run):
    cfg, out = tiny_run
    assert [c["id"].split("-")[0] for c in out["claims"]] == ["C1", "C2", "C3", "C4", "C5", "K1", "K2"]
    assert [c["kind"] for c in out["claims"]] == ["claim"] * 5 + ["check"] * 2
    for c in out["claims"][:5]:
        assert c["verdict"] in ("reproduced", "partial", "inconclusive", "not_reproduced")
        assert c["delta"] == experiment.DELTAS[c["id"]][0] and c["better"] == "higher" and c["delta_reason"]
        assert c["replicates"] == len(cfg.repeats) and c["interval"]["lo"] <= c["interval"]["hi"]
    for key, v in out["summary"].items():
        assert math.isfinite(v["apgr"]), key
    assert out["routers"] == ("SW ranking", "MF", "MiniLM + linear head")
    assert set(out["throughput"]) == {"encoder only", *out["routers"]}
    assert all(abs(i["judge_share"] - cfg.n_judge * cfg.judge_repeats / (i["n_arena"] + i["n_judge"])) < 1e-12
               for i in out["info"])


def test_tiny_run_is_deterministic(tiny_run):
    cfg, out = tiny_run
    again = experiment.run(cfg)
    a = {k: v["apgr"] for k, v in out["summary"].items()}
    b = {k: v["apgr"] for k, v in again["summary"].items()}
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-9 for k in a)


def test_config_rejects_too_few_tiers():
    with pytest.raises(ValueError, match="n_tiers"):
        experiment.run(experiment.Config.preset("tiny", n_tiers=1))


def test_bert_router_fine_tunes_the_encoder_and_then_needs_texts(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    texts = [f"Question {i}: {'prove a hard theorem' if i % 2 else 'say hello'}" for i in range(40)]
    enc = TextEncoder()
    y = np.where(np.arange(40) % 2 == 1, A_WINS, B_WINS)  # the strong model "s" wins the hard questions
    p = Preferences(enc(texts), np.zeros(40, int), np.ones(40, int), y, ("s", "w"))
    r = BertRouter(encoder=enc, n_tiers=2, finetune_steps=30, finetune_batch=16, finetune_lr=5e-5).fit(p, "s", "w",
                                                                                                       texts=texts)
    assert len(r.train_losses_) == 30 and np.mean(r.train_losses_[-5:]) < np.mean(r.train_losses_[:5])
    out = r.strong_win_rate(texts)
    assert out.shape == (40,) and np.all((out > 0) & (out < 1))
    assert out[1::2].mean() - out[::2].mean() > 0.3  # it learned which prompts the strong model wins
    # a transformers checkpoint: loaded as the official BERTRouter loads it, scored as it scores (1 - p(tie) - p(weak))
    r.save_pretrained(tmp_path)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    tok = AutoTokenizer.from_pretrained(tmp_path)
    with torch.no_grad():
        logits = model(**tok(texts[1], return_tensors="pt", truncation=True)).logits.numpy()[0]
    sm = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert abs((1 - sm[-2:].sum()) - r.calculate_strong_win_rate(texts[1])) < 1e-5
    with pytest.raises(ValueError, match="pass texts"):
        r.strong_win_rate(p.X[:4])
    with pytest.raises(ValueError, match="texts=..."):
        BertRouter(encoder=enc, n_tiers=2, finetune_steps=1).fit(p, "s", "w")
    with pytest.raises(ValueError, match="fine-tuned router"):
        BertRouter(n_tiers=2).fit(p, "s", "w").save_pretrained(tmp_path)


def test_sw_router_equals_a_per_query_weighted_sklearn_fit_over_tiers():
    from sklearn.linear_model import LogisticRegression
    p = _prefs(300, M=6, seed=21, ties=True)
    r = SWRankingRouter(n_tiers=3, gamma=10.0).fit(p, "m0", "m5")
    assert r.tiers_[r.strong_] != r.tiers_[r.weak_]
    Q = np.random.default_rng(21).normal(size=(3, p.X.shape[1]))
    ours = r.strong_win_rate(Q)
    Xn = p.X / np.linalg.norm(p.X, axis=1, keepdims=True)
    ta, tb, K, n = r.tiers_[p.model_a], r.tiers_[p.model_b], int(r.tiers_.max()) + 1, len(p)
    D = np.zeros((2 * n, K))
    np.add.at(D, (np.arange(2 * n), np.tile(ta, 2)), 1.0)
    np.add.at(D, (np.arange(2 * n), np.tile(tb, 2)), -1.0)  # a battle inside one tier: a zero row, no information
    Y = np.concatenate([p.outcome >= 0.5, p.outcome == 1.0]).astype(float)  # a tie: one win and one loss
    for q, got in zip(Q, ours):
        s = Xn @ (q / np.linalg.norm(q))
        w = 10.0 ** (1 + s / s.max())  # Eq. (4), written here from the paper
        coef = LogisticRegression(fit_intercept=False, C=np.inf, tol=1e-10, max_iter=5000).fit(
            D, Y, sample_weight=np.tile(w, 2)).coef_[0]
        ref = 1 / (1 + np.exp(-(coef[r.tiers_[r.strong_]] - coef[r.tiers_[r.weak_]])))
        assert abs(got - ref) < 1e-4, (got, ref)


# ---------------------------------------------------------------- experiment pieces

def test_gold_and_judge_labels():
    assert experiment.gold_labels(np.array([1, 0, 1, 0.]), np.array([0, 1, 1, 0.])).tolist() == [A_WINS, B_WINS, TIE, TIE]
    rng = np.random.default_rng(13)
    y = rng.choice([A_WINS, TIE, B_WINS], 20_000)
    j = experiment.judge_labels(y, 0.1, rng)
    assert abs((j != y).mean() - 0.1) < 0.01
    assert np.array_equal(experiment.judge_labels(y, 0.0, rng), y)
    assert np.all(experiment.judge_labels(y, 1.0, rng) != y)
    with pytest.raises(ValueError, match="judge error"):
        experiment.judge_labels(y, 1.5, rng)


def test_routed_pairs_pick_the_weak_model_by_the_papers_score_gap():
    rng = np.random.default_rng(14)
    w = make_world(16, rng)
    texts = {"arena": make_queries(ARENA_MIX, 300, rng), "gold": make_queries(experiment.KNOWLEDGE_MIX, 100, rng),
             "judge": make_queries(experiment.JUDGE_MIX, 200, rng)}
    pid, a, b, y = arena_battles(w, texts["arena"], 10, rng)
    pref = Preferences(np.zeros((len(pid), 1)), a, b, y, w.names)
    pairs = experiment.routed_pairs(w, pref, 5, texts)
    ex = experiment.expected_scores(w, texts)
    s, wk = (w.names.index(m) for m in pairs["routed"])
    assert s == int(np.argmax(pairs["ratings"]))
    ok = [c for c in range(16) if c != s and ex["knowledge"][s] - ex["knowledge"][c] >= experiment.MIN_ACCURACY_GAP
          and ex["arithmetic"][s] - ex["arithmetic"][c] >= experiment.MIN_ACCURACY_GAP and ex["chat"][s] > ex["chat"][c]]
    gaps = {c: abs(ex["chat"][s] - ex["chat"][c] - experiment.PAPER_SCORE_GAP) for c in ok}
    assert wk in ok and gaps[wk] == min(gaps.values())      # the closest to the paper's gap among the admissible
    assert not set(pairs["routed"]) & set(pairs["transfer"])
    s2, w2 = (w.names.index(m) for m in pairs["transfer"])
    assert ex["chat"][s2] > ex["chat"][w2]


def test_route_curve_with_tied_scores():
    S, W = np.array([1, 1, 1, 1, 1.0, 1]), np.array([0, 0, 0, 1, 1, 1.0])
    share, perf = route_curve(np.full(6, 0.5), S, W)   # one score for all: every edge sends all or nothing
    assert set(np.round(share, 12)) <= {0.0, 1.0} and perf[share == 1].min() == 1 and perf[share == 0].max() == 0.5
    share, perf = route_curve([0.9, 0.9, 0.9, 0.1, 0.1, 0.1], S, W)   # two tied blocks: the good block goes first
    assert set(np.round(share, 12)) <= {0.0, 0.5, 1.0} and np.all(np.diff(share) >= 0)
    assert perf[np.isclose(share, 0.5)].min() == 1.0
    assert apgr(share, perf, S, W) > apgr(*route_curve([0.1, 0.1, 0.1, 0.9, 0.9, 0.9], S, W), S, W)


def test_mf_recovers_a_planted_preference():
    rng = np.random.default_rng(3)
    n = 1500
    X = rng.normal(size=(n, 4)).astype(np.float32)
    a = rng.integers(3, size=n)
    b = (a + rng.integers(1, 3, size=n)) % 3
    # model 0 wins where x0 > 0, model 1 where x0 < 0, model 2 always loses to both
    score = np.stack([X[:, 0], -X[:, 0], np.full(n, -2.0)], 1)
    y = np.where(score[np.arange(n), a] > score[np.arange(n), b], A_WINS, B_WINS)
    pref = Preferences(X, a, b, y, ("m0", "m1", "m2"))
    mf = MFRouter(dim=8, epochs=30, batch_size=64, lr=3e-3, noise=0.0, seed=0).fit(pref, "m0", "m1")
    q = np.zeros((2, 4), np.float32)
    q[0, 0], q[1, 0] = 2.0, -2.0
    p = mf.strong_win_rate(q)
    assert p[0] > 0.8 and p[1] < 0.2, p
    flip = MFRouter(dim=8, epochs=30, batch_size=64, lr=3e-3, noise=0.0, seed=0).fit(pref, "m1", "m0")
    assert np.allclose(flip.strong_win_rate(q) + p, 1, atol=1e-5)   # antisymmetry


def test_decontamination_with_a_fake_encoder():
    texts = {k: {"text": [f"{k} {i}" for i in range(4)], "topic": np.zeros(4, int), "level": np.zeros(4, int),
                 "d": np.zeros(4)} for k in ("arena", "gold", "judge", "chat", "knowledge", "arithmetic")}
    near = {"arena 0": [1, 0, 0], "chat 0": [1, 0, 0], "chat 1": [0.96, 0.28, 0]}  # chat 0, 1: copies of arena 0

    def enc(ts):
        bench = ("chat", "knowledge", "arithmetic")
        return np.array([near[t] if t in near else [0, 1, 0] if t.startswith(bench) else [0, 0, 1] for t in ts], float)

    t2, emb, stats = experiment.embed_and_decontaminate(texts, enc, 0.95)
    assert (stats["chat"]["kept"], stats["chat"]["total"]) == (2, 4) and stats["knowledge"]["kept"] == 4
    assert t2["chat"]["text"] == ["chat 2", "chat 3"] and len(emb["chat"]) == 2


NAMES = ("SW ranking", "MF", "MiniLM + linear head")


def fake_summary(chat=0.7, judge_lift=0.2, knowledge=(0.5, 0.6), arithmetic=(0.5, 0.6), transfer=0.7,
                 spread=0.01):
    """A summary with 3 worlds in which every (benchmark, training set, router) has the given mean, with per-world
    deviations (-spread, 0, +spread) shared by every entry except the random router's, which has none."""
    dev = np.array([-spread, 0.0, spread])
    s = {}
    def put(key, mean, d=dev):
        b, t, r = key.split("|")
        s[key] = {"benchmark": b, "train": t, "router": r, "apgr": float(mean), "apgr_sd": 0.01, "n": 3,
                  "apgr_worlds": list(mean + d), "cpt50": 0.4, "cpt80": 0.7}
    for b in ("chat", "knowledge", "arithmetic", "transfer"):
        put(f"{b}|-|random", 0.5, np.zeros(3))
        put(f"{b}|-|optimal", 0.9, np.zeros(3))
        put(f"{b}|-|text oracle", 0.85, np.zeros(3))   # room for the routers: the C1/C5 competence gate passes
    for r in NAMES:
        put(f"chat|arena+judge|{r}", chat)
        put(f"chat|arena|{r}", chat - judge_lift, dev[::-1])   # the lift varies over worlds by 2 * dev
        put(f"transfer|arena+judge|{r}", transfer)
        put(f"transfer|arena|{r}", transfer)
        for b, aug, (base, up) in (("knowledge", "arena+gold", knowledge), ("arithmetic", "arena+judge", arithmetic)):
            put(f"{b}|arena|{r}", base)
            put(f"{b}|{aug}|{r}", up, dev[::-1])
    return s


def verdicts(s):
    return {c["id"].split("-")[0]: c["verdict"] for c in experiment.make_claims(s, NAMES)}


def test_make_claims_verdicts_at_the_boundaries():
    t = lambda: float(__import__("scipy").stats.t.ppf(0.975, 2))
    half = lambda spread: t() * spread / math.sqrt(3)          # the t half-width of deviations (-spread, 0, spread)
    D = {k.split("-")[0]: v[0] for k, v in experiment.DELTAS.items()}
    v = verdicts(fake_summary())
    assert v == {"C1": "reproduced", "C2": "reproduced", "C3": "reproduced", "C4": "reproduced", "C5": "reproduced",
                 "K1": "passed", "K2": "passed"}
    claims = experiment.make_claims(fake_summary(), NAMES)
    assert all(c["delta"] > 0 and c["delta_reason"] and c["better"] == "higher" for c in claims if c["kind"] == "claim")
    # C1 / C5: each router's excess over random against its half-width h (the lower edge) and against delta (the upper)
    h = half(0.01)
    assert verdicts(fake_summary(chat=0.5 + D["C1"] - 0.99 * h))["C1"] == "reproduced"
    assert verdicts(fake_summary(chat=0.5 + D["C1"] - 1.01 * h))["C1"] == "partial"       # real, below delta
    assert verdicts(fake_summary(chat=0.5 + 1.01 * h))["C1"] == "partial"
    assert verdicts(fake_summary(chat=0.5 + 0.99 * h))["C1"] == "not_reproduced"          # 0 inside, delta out
    assert verdicts(fake_summary(chat=0.6, spread=0.1))["C1"] == "inconclusive"           # 0 and delta both inside
    # every router must hold: one router below delta makes the claim partial, and the interval recorded is its own
    no_room = fake_summary()                                   # an oracle within delta of random: C1 not run
    no_room["chat|-|text oracle"]["apgr_worlds"] = [0.5 + D["C1"] / 2] * 3
    assert verdicts(no_room)["C1"] == "not_run"
    one_low = fake_summary()
    one_low["transfer|arena+judge|MF"]["apgr_worlds"] = [0.55, 0.56, 0.57]
    c5 = next(c for c in experiment.make_claims(one_low, NAMES) if c["id"].startswith("C5"))
    assert c5["verdict"] == "partial" and abs(c5["interval"]["estimate"] - 0.06) < 1e-9 and "MF" in c5["interval"]["of"]
    one_low["transfer|arena+judge|SW ranking"]["apgr_worlds"] = [0.4, 0.5, 0.6]
    assert verdicts(one_low)["C5"] == "inconclusive"                                      # the weakest part decides
    one_low["transfer|arena+judge|SW ranking"]["apgr_worlds"] = [0.49, 0.5, 0.51]
    assert verdicts(one_low)["C5"] == "not_reproduced"
    # C2, the judge lift: deviations of the lift are (-2 spread, 0, 2 spread), half-width h2; delta = 0.111
    h2 = half(0.02)
    assert verdicts(fake_summary(judge_lift=D["C2"] - 0.99 * h2))["C2"] == "reproduced"
    assert verdicts(fake_summary(judge_lift=D["C2"] - 1.01 * h2))["C2"] == "partial"
    assert verdicts(fake_summary(judge_lift=1.01 * h2))["C2"] == "partial"
    assert verdicts(fake_summary(judge_lift=0.99 * h2))["C2"] == "not_reproduced"
    assert verdicts(fake_summary(judge_lift=-0.01))["C2"] == "not_reproduced"
    assert verdicts(fake_summary(judge_lift=0.1, spread=0.1))["C2"] == "inconclusive"
    # C3 / C4, part one: the lift against 0 and delta (at spread 0.005 the lift's half-width is h)
    assert verdicts(fake_summary(arithmetic=(0.5, 0.5 + 0.99 * h), spread=0.005))["C4"] == "not_reproduced"
    assert verdicts(fake_summary(arithmetic=(0.5, 0.5 + 1.01 * h), spread=0.005))["C4"] == "partial"
    assert verdicts(fake_summary(arithmetic=(0.5, 0.5 + D["C4"] - 1.01 * h), spread=0.005))["C4"] == "partial"
    assert verdicts(fake_summary(arithmetic=(0.5, 0.5 + D["C4"] - 0.99 * h), spread=0.005))["C4"] == "reproduced"
    assert verdicts(fake_summary(knowledge=(0.5, 0.53), spread=0.001))["C3"] == "partial"  # real, below 0.0445
    assert verdicts(fake_summary(arithmetic=(0.5, 0.55), spread=0.1))["C4"] == "inconclusive"
    # C3 / C4, part two: near random is the Arena-only excess's interval (half-width h) inside +-0.05
    assert verdicts(fake_summary(knowledge=(0.55 - 1.01 * h, 0.65)))["C3"] == "reproduced"
    assert verdicts(fake_summary(knowledge=(0.55 - 0.99 * h, 0.65)))["C3"] == "inconclusive"   # across the edge
    assert verdicts(fake_summary(knowledge=(0.45 + 1.01 * h, 0.55)))["C3"] == "reproduced"     # the lower edge, inside
    assert verdicts(fake_summary(knowledge=(0.45 + 0.99 * h, 0.55)))["C3"] == "inconclusive"
    assert verdicts(fake_summary(knowledge=(0.6, 0.7)))["C3"] == "not_reproduced"              # wholly outside
    assert verdicts(fake_summary(knowledge=(0.4, 0.5)))["C3"] == "not_reproduced"              # worse than random
    # the checks: a router above the optimal one fails K2; a random router far from 1/2 fails K1
    bad = fake_summary()
    bad["chat|arena+judge|MF"]["apgr"] = 0.95
    assert verdicts(bad)["K2"] == "failed"
    bad = fake_summary()
    bad["knowledge|-|random"]["apgr"] = 0.55   # 0.05 from 1/2 with sd 0.01 over 3 runs: 8.7 standard errors, t(0.9995, 2) = 31.6
    bad["knowledge|-|random"]["n"] = 30        # with 30 runs: 27 standard errors against t(0.9995, 29) = 3.7
    assert verdicts(bad)["K1"] == "failed"


def test_learned_routers_beat_random_on_a_fixture_world(world_prefs):
    "Trained on the fixture's Arena (features: topic, level), every learned router beats random on fresh queries."
    w, pref, E = world_prefs
    rng = np.random.default_rng(21)
    q = make_queries(ARENA_MIX, 400, rng, "test")
    Eq = np.concatenate([np.eye(len(TOPICS))[q["topic"]], q["level"][:, None] / 3.0, np.ones((400, 1))], 1)
    S, W = w.names[0], w.names[6]
    s, wk = w.chat_scores(q, [S, W], rng)
    rnd = np.mean([evaluate_router(RandomRouter(seed=k).strong_win_rate(Eq), s, wk)["apgr"] for k in range(50)])
    for router in (SWRankingRouter(n_tiers=4), MFRouter(dim=8, epochs=20, batch_size=64, lr=3e-3, seed=0),
                   BertRouter(n_tiers=4, epochs=300)):
        a = evaluate_router(router.fit(pref, S, W).strong_win_rate(Eq), s, wk)["apgr"]
        assert a > rnd + 0.05, (router.name, a, rnd)


def test_transfer_fails_where_the_pairs_disagree():
    """A world in which the two pairs differ only in the style 'brevity', with opposite signs: the routed pair's
    weak model is the better one at brief answers, the new pair's strong model is. A router that learned its pair
    perfectly routes the new pair worse than random, so the transfer claim can fail."""
    from iclr25_repro.routellm.model import World
    skills = np.array([[0.9] * len(TOPICS), [0.5] * len(TOPICS), [0.9] * len(TOPICS), [0.5] * len(TOPICS)])
    u = np.zeros((4, 3))
    u[1, 0], u[2, 0] = 1.0, 1.0   # pair (0, 1): its weak model is better at brevity; pair (2, 3): its strong one is
    w = World(skills, ("s", "w", "s2", "w2"), facet_skills=u)
    rng = np.random.default_rng(22)
    q = make_queries(CHAT_MIX, 2000, rng, "test")
    routed = experiment.text_gap(w, q, ("s", "w"))
    s2, w2 = w.chat_scores(q, ["s2", "w2"], rng)
    assert evaluate_router(routed, s2, w2)["apgr"] < 0.47   # random: 0.5, sd about 0.01 here
    assert evaluate_router(experiment.text_gap(w, q, ("s2", "w2")), s2, w2)["apgr"] > 0.55
    with pytest.raises(ValueError, match="facets"):
        w.quality({"topic": q["topic"], "d": q["d"]})


def test_text_gap_averages_the_hidden_difficulty():
    rng = np.random.default_rng(23)
    w = make_world(8, rng)
    q = make_queries(ARENA_MIX, 50, rng)
    pair = (w.names[0], w.names[5])
    draws = np.mean([np.subtract(*w.quality(q | {"d": (q["level"] + rng.uniform(size=50)) / 4}, list(pair)))
                     for _ in range(4000)], 0)
    assert np.abs(experiment.text_gap(w, q, pair, n_u=64) - draws).max() < 0.01


def test_mf_takes_about_the_same_steps_on_every_training_set(tiny_run):
    cfg, out = tiny_run
    small, big = (experiment._routers(cfg, 0, "cpu", epoch_scale=x)[1] for x in (3.0, 1.0))
    assert small.epochs == 3 * big.epochs == 3 * cfg.mf_epochs
    for info in out["info"]:
        most = max(m["decided_battles"] for m in info["mf"].values())
        for m in info["mf"].values():   # whole epochs: the same steps as the largest set's, up to rounding the epochs
            assert abs(m["epochs"] - cfg.mf_epochs * most / m["decided_battles"]) <= 0.5, info["mf"]
        assert info["mf"]["arena"]["epochs"] > info["mf"]["arena+judge"]["epochs"]


def test_smoke_caps_loops_and_leaves_the_rest(tiny_run):
    ci, smoke = experiment.Config.preset("ci"), experiment.Config.preset("ci", smoke=True)
    assert smoke.bert_finetune_steps == ci.bert_finetune_steps == 0 and smoke.n_bench <= ci.n_bench
    assert smoke.repeats == ci.repeats[:2] and smoke.facet_spread == ci.facet_spread
    cfg, out = tiny_run   # the sensitivity of C5: one block per spread, each with every router and the references
    assert [b["facet_spread"] for b in out["sensitivity"]] == sorted({*cfg.sensitivity_spreads, cfg.facet_spread})
    for block in out["sensitivity"]:
        assert {"transfer|-|random", "transfer|-|routed-pair text oracle", "transfer|arena+judge|MF"} <= set(block["summary"])


def test_full_preset_plan_and_smoke():
    from iclr25_repro.core import cli
    full = experiment.Config.preset("full")
    phases = experiment.plan(full)
    worlds = [p for p in phases if p["phase"].startswith("world")]
    assert len(worlds) == 8 and worlds[0]["models"] == 64 and worlds[0]["arena_battles"] == 32_000
    est = cli.estimate_wall("routellm", "full", measure=False)
    assert est["seconds"] <= 600, est
    assert abs(worlds[0]["judge_share"] - 0.65) < 0.01 and "MiniLM fine-tuned" in worlds[0]["routers"]
    doc = cli.run_experiment("routellm", "full", "cpu", 0, smoke=True)
    assert doc["config"]["smoke"] is True and doc["config"]["n_models"] == 64
    assert [c["id"].split("-")[0] for c in doc["claims"]] == ["C1", "C2", "C3", "C4", "C5", "K1", "K2"]


def test_summarise_means_and_spreads():
    rows = [dict(repeat=r, benchmark="chat", train="arena", router="MF", apgr=a, cpt50=0.3, cpt80=0.6)
            for r, a in ((0, 0.6), (1, 0.7))]
    s = experiment.summarise(rows)["chat|arena|MF"]
    assert s["apgr"] == pytest.approx(0.65) and s["apgr_sd"] == pytest.approx(np.std([0.6, 0.7], ddof=1))
    assert s["apgr_worlds"] == [0.6, 0.7] and s["n"] == 2


def test_routers_are_sklearn_estimators_with_the_official_method(world_prefs):
    from sklearn.base import clone
    w, pref, E = world_prefs
    mf = MFRouter(dim=8, epochs=2, seed=0)
    assert mf.get_params()["dim"] == 8 and mf.set_params(epochs=3) is mf and mf.epochs == 3
    fitted = mf.fit(pref, w.names[0], w.names[6])
    twin = clone(fitted)
    assert twin.get_params() == fitted.get_params() and not hasattr(twin, "strong_")   # clone is unfitted
    twin.fit(pref, w.names[0], w.names[6])
    assert np.allclose(twin.strong_win_rate(E[:5]), fitted.strong_win_rate(E[:5]))     # same params, same router
    assert fitted.calculate_strong_win_rate(E[3]) == pytest.approx(float(fitted.strong_win_rate(E[3:4])[0]))
    assert set(SWRankingRouter().get_params()) == {"encoder", "gamma", "n_tiers", "chunk"}
    rr = RandomRouter(seed=3)
    first = rr.strong_win_rate(E[:4])
    assert not np.allclose(rr.strong_win_rate(E[:4]), first)                            # one stream of draws
    assert np.allclose(RandomRouter(seed=3).strong_win_rate(E[:4]), first)
    assert np.allclose(clone(rr).strong_win_rate(E[:4]), first)
    rr.set_params(seed=9)
    assert np.allclose(rr.strong_win_rate(E[:4]), RandomRouter(seed=9).strong_win_rate(E[:4]))
