"""Tests of iclr25_repro.genc: the circuit against PySDD and brute force, its sampler's frequencies, the constraints
(Sudoku, word avoidance with multi-token sequences, the look-ahead table), the local distribution against brute
force, Gen-C's exactness on a factorised model and its proposal against enumeration, the baselines, transformers'
word ban against the circuit's mask, bad inputs, determinism, the claims' rules, a tiny run and the full preset's
smoke run."""
import dataclasses
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from iclr25_repro.core import cli
from iclr25_repro.genc import experiment
from iclr25_repro.genc.model import (CausalLM, Circuit, Constraint, PairwiseAR, SequenceModel, TopicGrammar,
                                     all_solutions, avoid_constraint, banned_spellings, clash_mask, genc_candidates,
                                     genc_generate, genc_sample, indicator,
                                     local_distribution, masked_sample, neighbourhood_size, random_sudoku_grids,
                                     rejection_sample, shidoku_model, sudoku_constraint, sudoku_puzzles, sudoku_valid,
                                     train_gpt2, unit_propagate)


def _chi_pvalue(observed, expected_counts):
    "Chi-square p-value, cells with fewer than five expected counts pooled into one (dropped when it is empty)."
    big = expected_counts >= 5
    obs, exp = list(observed[big]), list(expected_counts[big])
    if expected_counts[~big].sum() > 0:
        obs.append(observed[~big].sum())
        exp.append(expected_counts[~big].sum())
    return chisquare(np.array(obs), np.array(exp)).pvalue


def _brute_wmc(clauses, n, wp, wn):
    total = 0.0
    for x in itertools.product([0, 1], repeat=n):
        if all(any((x[abs(l) - 1] == 1) == (l > 0) for l in c) for c in clauses):
            total += float(np.prod(np.where(np.array(x) == 1, wp, wn)))
    return total


@pytest.fixture(scope="module")
def shidoku():
    cons = sudoku_constraint(2, 2)
    sols = all_solutions(cons)
    return cons, sols


@pytest.fixture(scope="module")
def tiny():
    g = torch.Generator().manual_seed(3)
    n, V = 4, 3
    model = PairwiseAR(0.8 * torch.randn(n, V, generator=g, dtype=torch.float64),
                       torch.randn(n, n, V, V, generator=g, dtype=torch.float64))
    alpha = Constraint(n, V, [(-indicator(i, 0, V), -indicator(i + 1, 0, V)) for i in range(n - 1)]
                       + [(indicator(0, 1, V), indicator(3, 2, V))])
    every = torch.tensor(list(itertools.product(range(V), repeat=n)))
    return model, alpha, every


def test_circuit_values_of_the_brief():
    p = np.array([0.2, 0.3, 0.4, 0.1])
    c1 = Circuit([(1, 3), (1, 4), (2, 3), (2, 4)], 4)
    c2 = Circuit([(3, 1), (-4, 3), (-2, 4, 1)], 4)
    assert c1.wmc(p, 1 - p)[0] == pytest.approx(0.0976, abs=1e-12)
    assert c2.wmc(p, 1 - p)[0] == pytest.approx(0.4216, abs=1e-12)
    assert Circuit([(1, -1)], 4).wmc(p, 1 - p)[0] == pytest.approx(1.0)
    assert c1.pysdd_wmc(p, 1 - p) == pytest.approx(0.0976, abs=1e-12)


def test_circuit_against_brute_force_and_pysdd():
    rng = np.random.default_rng(0)
    tested = 0
    for _ in range(40):
        n = 5
        clauses = [tuple(int(v) * int(rng.choice([-1, 1])) for v in rng.choice(np.arange(1, n + 1), rng.integers(1, 4),
                                                                                 replace=False))
                   for _ in range(rng.integers(1, 7))]
        wp, wn = rng.random(n), rng.random(n)
        try:
            c = Circuit(clauses, n)
        except ValueError:
            assert _brute_wmc(clauses, n, np.ones(n), np.ones(n)) == 0
            continue
        want = _brute_wmc(clauses, n, wp, wn)
        assert c.wmc(wp, wn)[0] == pytest.approx(want, rel=1e-10)
        assert c.pysdd_wmc(wp, wn) == pytest.approx(want, rel=1e-10)
        batch = c.wmc(np.stack([wp, wp * 0.5], 1), np.stack([wn, wn], 1))
        assert batch[1] == pytest.approx(_brute_wmc(clauses, n, wp * 0.5, wn), rel=1e-10)
        tested += 1
    assert tested > 10


def test_circuit_sampler_frequencies(shidoku):
    cons, sols = shidoku
    rng = np.random.default_rng(2)
    theta = rng.dirichlet(np.ones(4), size=(1, 16))
    mass = np.prod(theta[0][np.arange(16), sols], 1)
    assert cons.probability(theta)[0] == pytest.approx(mass.sum(), rel=1e-10)
    mass /= mass.sum()
    draws = cons.sample(np.repeat(theta, 40_000, 0), rng)
    assert cons.satisfied(draws).all()
    index = {tuple(s): i for i, s in enumerate(sols.tolist())}
    obs = np.bincount([index[tuple(d)] for d in draws.tolist()], minlength=288)
    assert _chi_pvalue(obs, mass * len(draws)) > 1e-4


def test_shidoku_count_and_table(shidoku):
    cons, sols = shidoku
    assert len(sols) == 288 == cons.circuit.model_count()
    assert sudoku_valid(sols, 2, 2).all()
    table = sudoku_constraint(2, 2)
    table.tabulate(sols)
    rng = np.random.default_rng(0)
    for _ in range(40):
        i = int(rng.integers(1, 16))
        prefix = sols[rng.integers(288)][:i].copy()
        prefix[-1] = rng.integers(4)
        assert (table.allowed(prefix) == cons.allowed(prefix)).all()


def test_avoid_constraint_with_multi_token_sequences():
    cons = avoid_constraint(4, [(1, 2), (3,)], vocab_size=5)
    every = np.array(list(itertools.product(range(5), repeat=4)))
    def bad(y):
        return 3 in y or any(y[i] == 1 and y[i + 1] == 2 for i in range(3))
    want = np.array([not bad(list(y)) for y in every])
    assert (cons.satisfied(cons.categories(every)) == want).all()
    # the weighted count under uniform token probabilities equals the share of allowed sequences
    assert cons.C == 4 and sorted(set(cons.categories(np.arange(5)).tolist())) == [0, 1, 2, 3]
    theta = np.zeros((1, 4, cons.C))
    np.add.at(theta[0], (np.arange(4)[:, None].repeat(5, 1), np.tile(cons.categories(np.arange(5)), (4, 1))), 0.2)
    assert cons.probability(theta)[0] == pytest.approx(want.mean())


def test_unit_propagation_and_unsatisfiable():
    units, rest = unit_propagate([(1,), (-1, 2), (2, 3, -4), (-3, 4)])
    assert units == {1: True, 2: True} and rest == [(-3, 4)]
    with pytest.raises(ValueError, match="unsatisfiable"):
        Circuit([(1,), (-1,)], 2)
    with pytest.raises(ValueError, match="unsatisfiable"):
        Circuit([(1, 2), (-1, 2), (1, -2), (-1, -2)], 2)
    with pytest.raises(ValueError, match="unsatisfiable"):
        sudoku_constraint(2, 2, {0: 0, 1: 0})


def test_local_distribution_against_brute_force(tiny):
    model, _, every = tiny
    p = model.log_prob(every).exp().numpy()
    Y = model.sample(5, torch.Generator().manual_seed(0))[0]
    cand, theta, _ = local_distribution(model, Y)
    assert torch.allclose(theta.sum(-1), torch.ones(5, 4, dtype=torch.float64))
    for b in range(5):
        for i in range(4):
            same = (np.delete(every.numpy(), i, 1) == np.delete(Y[b].numpy(), i)).all(1)
            cond = np.array([p[same & (every[:, i].numpy() == v)].sum() for v in range(3)])
            assert np.allclose(theta[b, i].numpy(), cond / cond.sum(), atol=1e-12)


def test_pairwise_fast_likelihoods_equal_generic():
    model = shidoku_model(1)
    Y = model.sample(32, torch.Generator().manual_seed(1))[0]
    for cand in (torch.arange(4).expand(32, 16, 4).clone(), torch.arange(4).flip(0)[:3].expand(32, 16, 3).clone()):
        model.evaluations = 0
        fast = model.local_log_joint(Y, cand)
        n_fast = model.evaluations
        model.evaluations = 0
        slow = SequenceModel.local_log_joint(model, Y, cand)
        assert torch.allclose(fast, slow, atol=1e-10) and n_fast == model.evaluations == neighbourhood_size(Y, cand)


def test_top_k_candidates_include_the_sample(tiny):
    model, _, _ = tiny
    Y = model.sample(20, torch.Generator().manual_seed(4))[0]
    cand, theta, _ = local_distribution(model, Y, k=1)
    assert (cand == Y[..., None]).any(-1).all()
    assert torch.allclose(theta.sum(-1), torch.ones(20, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="k must be"):
        local_distribution(model, Y, k=0)


def test_genc_proposal_against_enumeration(shidoku):
    cons, sols = shidoku
    model = shidoku_model(0)
    c = genc_candidates(model, cons, 6, None, torch.Generator().manual_seed(2))
    index = {tuple(s): i for i, s in enumerate(sols.tolist())}
    lp = model.log_prob(torch.as_tensor(sols)).numpy()
    _, theta, _ = local_distribution(model, c["Y"])
    for b in range(6):
        mass = np.prod(theta[b].numpy()[np.arange(16), sols], 1)
        j = index[tuple(c["Yt"][b].tolist())]
        assert np.exp(c["log_p_alpha"][b]) == pytest.approx(mass.sum(), rel=1e-10)
        assert float(c["log_q"][b]) == pytest.approx(np.log(mass[j] / mass.sum()), abs=1e-9)
        assert float(c["log_p"][b]) == pytest.approx(lp[j], abs=1e-9)


def test_candidates_follow_the_proposal_marginal(tiny):
    "Drawn candidates against r(y~) = sum_y p(y) p~_y(y~ | alpha), enumerated over every y."
    model, alpha, every = tiny
    p = model.log_prob(every).exp().numpy()
    ok = alpha.satisfied(every.numpy())
    _, theta, _ = local_distribution(model, every)
    ev = every.numpy()
    r = np.zeros(len(ev))
    for b in range(len(ev)):
        q = np.prod(theta[b].numpy()[np.arange(4), ev[ok]], 1)
        r[ok] += p[b] * q / q.sum()
    c = genc_candidates(model, alpha, 30_000, None, torch.Generator().manual_seed(1))
    obs = np.bincount((c["Yt"].numpy() * 3 ** np.arange(4)[::-1]).sum(1), minlength=81)
    assert _chi_pvalue(obs, r * 30_000) > 1e-4


def test_circuit_in_log_space_does_not_underflow():
    "A 9x9 puzzle under a sharply peaked factorised distribution: p~(alpha) far below the smallest double."
    g = torch.Generator().manual_seed(0)
    pz = sudoku_puzzles(1, 3, 3, 36, g)[0]
    cons = sudoku_constraint(3, 3, pz["clues"])
    wrong = random_sudoku_grids(1, 3, 3, g)[0].numpy()             # peaked on a grid that breaks most clues
    eps = 1e-6
    theta = np.full((1, 81, 9), eps)
    theta[0, np.arange(81), wrong] = 1 - 8 * eps
    lp = cons.log_probability(theta)[0]
    assert np.isfinite(lp) and lp < np.log(np.finfo(float).tiny)
    x = cons.sample(np.repeat(theta, 5, 0), np.random.default_rng(0))
    assert cons.satisfied(x).all() and sudoku_valid(x, 3, 3).all()
    assert cons.circuit.model_count() >= 1


def test_factorised_model_makes_genc_exact(shidoku):
    cons, sols = shidoku
    base = shidoku_model(0)
    flat = PairwiseAR(base.a, torch.zeros_like(base.W))
    out, info = genc_sample(flat, cons, 8000, 1, None, torch.Generator().manual_seed(0))
    assert np.ptp(info["logw"]) < 1e-9
    lp = flat.log_prob(torch.as_tensor(sols)).numpy()
    exact = np.exp(lp - lp.max())
    exact /= exact.sum()
    index = {tuple(s): i for i, s in enumerate(sols.tolist())}
    obs = np.bincount([index[tuple(y)] for y in out.tolist()], minlength=288)
    assert _chi_pvalue(obs, exact * len(out)) > 1e-4


def test_genc_converges_with_S_on_a_tiny_model(tiny):
    model, alpha, every = tiny
    p = model.log_prob(every).exp().numpy()
    ok = alpha.satisfied(every.numpy())
    target = np.where(ok, p, 0) / p[ok].sum()
    code = lambda Y: (np.asarray(Y) * 3 ** np.arange(4)[::-1]).sum(-1)
    tv = {}
    for S in (1, 32):
        out, _ = genc_sample(model, alpha, 4000, S, None, torch.Generator().manual_seed(S))
        assert alpha.satisfied(out.numpy()).all()
        tv[S] = 0.5 * np.abs(np.bincount(code(out), minlength=81) / 4000 - target).sum()
    assert tv[32] < tv[1] / 2


def test_every_output_satisfies_and_bad_inputs(shidoku):
    cons, _ = shidoku
    model = shidoku_model(2)
    out, _ = genc_sample(model, cons, 50, 3, None, torch.Generator().manual_seed(0))
    assert cons.satisfied(out.numpy()).all()
    for bad, msg in ((dict(S=0), "S must"), (dict(k=0), "k must"), (dict(m=0), "m must")):
        with pytest.raises(ValueError, match=msg):
            genc_sample(model, cons, **({"m": 1} | bad))
    with pytest.raises(ValueError, match="theta must"):
        cons.probability(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="positions"):
        Constraint(0, 2)


def test_genc_is_deterministic(shidoku):
    cons, _ = shidoku
    model = shidoku_model(0)
    run = lambda: genc_sample(model, cons, 40, 4, None, torch.Generator().manual_seed(7))
    (a, ia), (b, ib) = run(), run()
    assert torch.equal(a, b) and np.array_equal(ia["logw"], ib["logw"])


def test_baselines(shidoku):
    cons, sols = shidoku
    table = sudoku_constraint(2, 2)
    table.tabulate(sols)
    model = shidoku_model(0)
    g = torch.Generator().manual_seed(0)
    Y, draws = rejection_sample(model, table, 30, g)
    assert table.satisfied(Y.numpy()).all() and draws >= 30
    Y, logq = masked_sample(model, table, 100, 1, g)
    assert table.satisfied(Y.numpy()).all()
    law = experiment.masking_law(model, table, sols)
    assert law.sum() == pytest.approx(1.0)
    index = {tuple(s): i for i, s in enumerate(sols.tolist())}
    assert np.allclose(np.log(law[[index[tuple(y)] for y in Y.tolist()]]), logq.numpy())
    Y, _ = masked_sample(model, table, 50, 8, g)
    assert table.satisfied(Y.numpy()).all()


def test_puzzles_and_clash_mask():
    g = torch.Generator().manual_seed(0)
    assert sudoku_valid(random_sudoku_grids(50, 2, 2, g), 2, 2).all()
    assert sudoku_valid(random_sudoku_grids(5, 3, 3, g), 3, 3).all()
    pz = sudoku_puzzles(3, 2, 2, 5, g)
    for p in pz:
        assert len(p["clues"]) == 5 and all(int(p["grid"][c]) == d for c, d in p["clues"].items())
    mask = clash_mask(2, 2, {13: 3})
    allowed = mask(torch.tensor([[0, 1, 2, 3, 2]]), 5)[0]
    assert not allowed.any()        # 0, 1 in the box, 2 in the row, 3 a clue in the column
    assert clash_mask(2, 2, {})(torch.tensor([[0, 1, 2, 3, 2]]), 5)[0].tolist() == [False, False, False, True]


def test_transformers_word_ban_equals_the_circuit_mask_and_causal_lm_likelihood():
    from transformers import NoBadWordsLogitsProcessor
    G = TopicGrammar()
    gpt, _ = train_gpt2(G.sample, G.V, G.n, seed=0, steps=5)
    bad = [[b] for b in G.banned]
    avoid = avoid_constraint(G.n, [tuple(b) for b in bad], G.V)
    g = torch.Generator().manual_seed(0)
    clean = G.sample(200, g)
    clean = clean[~torch.as_tensor(G.has_banned(clean[:, :2]))][:10, :2]
    ids = torch.cat([torch.zeros(len(clean), 1, dtype=torch.long), clean], 1)
    hf = torch.isfinite(NoBadWordsLogitsProcessor(bad, eos_token_id=None)(ids, torch.zeros(len(ids), G.V)))
    ours = np.stack([avoid.allowed(avoid.categories(r[1:].numpy()))[avoid.categories(np.arange(G.V))] for r in ids])
    assert torch.equal(hf, torch.as_tensor(ours))
    lm = CausalLM(gpt, [0], G.n)
    Ys = G.sample(8, g)
    full = torch.cat([torch.zeros(8, 1, dtype=torch.long), Ys], 1)
    with torch.no_grad():
        logits = gpt(input_ids=full, attention_mask=torch.ones_like(full)).logits
    ref = -torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), full[:, 1:], reduction="none").sum(1)
    assert torch.allclose(lm.log_prob(Ys).float(), ref, atol=1e-4)
    out, _ = genc_sample(lm, avoid, 6, 2, 2, g)
    assert not G.has_banned(out).any()
    Yb = experiment.word_banning(lm, 20, bad, 0)
    assert Yb.shape == (20, G.n) and not G.has_banned(Yb).any()


def test_grammar_target():
    G = TopicGrammar(0.7)
    assert G.exact_toxic_given_allowed() == pytest.approx(0.5 * 0.3 ** 4 / (0.5 * 0.3 ** 4 + 0.5))
    sents = G.sentences()
    assert len(sents) == 2 * 7 * 7 * 7 * 2 * 7
    Y = G.sample(20_000, torch.Generator().manual_seed(0))
    assert abs(G.is_toxic(Y).mean() - 0.5) < 0.02
    assert np.exp(G.log_prob(sents.numpy())).sum() == pytest.approx(1.0)
    assert -G.log_prob(Y.numpy()).mean() / G.n == pytest.approx(G.entropy(), abs=0.02)
    allowed = ~G.has_banned(Y)
    assert G.is_toxic(Y[torch.as_tensor(allowed)]).mean() == pytest.approx(G.exact_toxic_given_allowed(), abs=0.01)


def _parts_with_effect(m, solutions=1, grid_loss=0.3, nats=1.16):
    """Rows built so that every claim's per-seed effect (oriented: positive is the paper's direction) is its delta
    times m[seed]."""
    d = {k: v[0] for k, v in experiment.DELTAS.items()}
    sh, pz, gr = [], [], []
    for s, ms in enumerate(m):
        e1, et, e4, e2 = (d[k] * ms for k in ("C1-closer", "C1-trend", "C4-budget", "C2-puzzles"))
        sh += [dict(seed=s, method="exact draws", S=None, tv=0.1, valid=1.0, evals=None),
               dict(seed=s, method="rejection", S=None, tv=0.1, valid=1.0, evals=40.0),
               dict(seed=s, method="masking", S=None, tv=0.3 + et + e1, valid=1.0, evals=1.0),
               dict(seed=s, method="Gen-C", S=1, tv=0.3 + et, valid=1.0, evals=50.0),
               dict(seed=s, method="Gen-C", S=4, tv=0.3, valid=1.0, evals=200.0),
               dict(seed=s, method="masked SIR", S=50, matches=1, tv=0.3 + et + e4, valid=1.0, evals=50.0)]
        pz.append(dict(seed=s, genc=1.0, sat_mask=1.0, greedy=1.0 - e2, clash_restarts=1.0 - 1.01 * e2,
                       solutions=solutions, grid_loss=grid_loss, uniform_nats=np.log(4)))
        e3, e5 = d["C3-topic"] * ms, d["C5-topic-budget"] * ms
        # target 0.05; Gen-C overshoots below it by 0.03, word banning stays above it by 0.03 + effect
        gr += [dict(seed=s, method=meth, S=S, toxic=t, banned=0.0, target_toxic=0.05, nats=nats, grammar_nats=1.15)
               for meth, S, t in (("word banning", None, 0.08 + e3), ("Gen-C", 16, 0.02), ("Gen-C", 1, 0.02),
                                  ("word banning + SIR", 20, 0.08 + e5))]
    return {"shidoku": sh, "puzzles": pz, "grammar": gr}


_CFG = dict(S_values=(1, 4), sir_match=(1,), lm_S=(1, 16), lm_sir_match=1)


def _claims(parts):
    cfg = dataclasses.replace(experiment.Config.preset("ci"), **_CFG)
    return {c["id"]: c for c in experiment.make_claims(parts, cfg)}


CLAIM_IDS = ("C1-closer", "C1-trend", "C2-puzzles", "C3-topic", "C4-budget", "C5-topic-budget")


@pytest.mark.parametrize("m, verdict", [
    ((2.0, 2.1, 2.2), "reproduced"),          # above 0 and past delta
    ((0.3, 0.35, 0.4), "partial"),            # above 0, short of delta
    ((-1.0, 1.0, 3.0), "inconclusive"),       # reaches both 0 and delta
    ((-0.5, -0.4, -0.6), "not_reproduced"),   # reaches 0, short of delta
])
def test_claim_rules_follow_the_effect_against_delta(m, verdict):
    claims = _claims(_parts_with_effect(m))
    for k in CLAIM_IDS:
        assert claims[k]["verdict"] == verdict, (k, claims[k]["interval"])
        assert claims[k]["delta"] == experiment.DELTAS[k][0] and claims[k]["better"] == "higher"
        assert f"delta = {experiment.DELTAS[k][0]}" in claims[k]["rule"]
    assert all(g["passed"] for g in claims["C2-puzzles"]["gates"] + claims["C3-topic"]["gates"])


def test_claim_rules_take_the_weakest_part():
    "C1-closer needs Gen-C below masking at every S; C1-trend a fall at every step; the weakest part decides."
    parts = _parts_with_effect((2.0, 2.1, 2.2))
    for r in parts["shidoku"]:
        if r["method"] == "masking":
            r["tv"] = 0.5 + 0.01 * r["seed"]
        if r["method"] == "Gen-C" and r["S"] == 1:
            r["tv"] = 0.49 + 0.01 * r["seed"] + 0.001 * r["seed"] ** 2      # close to masking at S=1 only
    claims = _claims(parts)
    c1 = claims["C1-closer"]
    assert c1["verdict"] in ("partial", "not_reproduced") and "S=1" in c1["interval"]["of"]
    assert "S=4" in c1["note"]
    parts["shidoku"] += [dict(seed=s, method="Gen-C", S=16, tv=0.4, valid=1.0, evals=800.0) for s in range(3)]
    cfg = dataclasses.replace(experiment.Config.preset("ci"), **(_CFG | dict(S_values=(1, 4, 16))))
    trend = {c["id"]: c for c in experiment.make_claims(parts, cfg)}["C1-trend"]
    assert trend["verdict"] == "not_reproduced" and "S=4 - " not in trend["interval"]["of"]   # rises from 4 to 16
    assert trend["interval"]["estimate"] < 0 and "rejection" in trend["note"]


def test_topic_claims_score_the_distance_to_the_target_not_the_rate():
    "A Gen-C that over-steers to a rate of 0 is as far from the target as one that stays above it."
    parts = _parts_with_effect((2.0, 2.1, 2.2))
    for r in parts["grammar"]:
        if r["method"] == "Gen-C":
            r["toxic"] = 0.0                                             # 0.05 below the target
        if r["method"].startswith("word banning"):
            r["toxic"] = 0.1 + 0.001 * r["seed"]                          # 0.05 above it
    claims = _claims(parts)
    assert claims["C3-topic"]["verdict"] == "not_reproduced" and abs(claims["C3-topic"]["interval"]["estimate"]) < 0.01


def test_claims_not_run_when_a_gate_fails():
    claims = _claims(_parts_with_effect((2.0, 2.1, 2.2), solutions=2))
    c2 = claims["C2-puzzles"]
    assert c2["verdict"] == "not_run"
    assert c2["gates"][0] == dict(name="share of puzzles with a unique solution", value=0.0,
                                  threshold=experiment.PUZZLE_UNIQUE_MIN, better="higher", passed=False)
    assert c2["interval"]["lo"] > c2["delta"]   # the gap would have reproduced it
    assert all(claims[k]["verdict"] == "reproduced" for k in CLAIM_IDS if k != "C2-puzzles")
    claims = _claims(_parts_with_effect((2.0, 2.1, 2.2), grid_loss=1.0))
    assert claims["C2-puzzles"]["verdict"] == "not_run" and not claims["C2-puzzles"]["gates"][1]["passed"]
    claims = _claims(_parts_with_effect((2.0, 2.1, 2.2), nats=1.3))
    assert claims["C3-topic"]["verdict"] == claims["C5-topic-budget"]["verdict"] == "not_run"
    assert claims["C1-closer"]["verdict"] == "reproduced"


def test_tiny_run_is_deterministic():
    cfg = experiment.Config.preset("tiny")
    a, b = experiment.run(cfg), experiment.run(cfg)
    ids = {c["id"] for c in a["claims"]}
    assert set(CLAIM_IDS) | {"K1-valid", "K2-solved", "K3-banning"} == ids
    strip = lambda rows: [{k: v for k, v in r.items() if "seconds" not in k} for r in rows]
    assert strip(a["rows"]) == strip(b["rows"]) and strip(a["grammar"]) == strip(b["grammar"])
    assert all(c["verdict"] == "passed" for c in a["claims"] if c["kind"] == "check")
    assert all(c["replicates"] == cfg.n_seeds for c in a["claims"] if c["kind"] == "claim")


def test_config_rejects_bad_settings():
    with pytest.raises(ValueError, match="n_seeds"):
        experiment.Config(n_seeds=1)
    with pytest.raises(ValueError, match="S must"):
        experiment.Config(S_values=(0, 4))
    with pytest.raises(ValueError, match="4x4"):
        experiment.Config(box=(3, 3), puzzle_model="pairwise")
    assert experiment.plan(experiment.Config.preset("full"))[-1]["phase"] == "SmolLM2 probe"


def test_full_preset_smoke_run(tmp_path):
    doc = cli.run_experiment("genc", "full", "cpu", 0, root=tmp_path, smoke=True)
    assert {c["id"] for c in doc["claims"]} >= set(CLAIM_IDS)
    assert not (tmp_path / "book" / "results" / "genc" / "full.json").exists()


def test_laptop_preset_smoke_run(tmp_path):
    doc = cli.run_experiment("genc", "laptop", "cpu", 0, root=tmp_path, smoke=True)
    assert {c["id"] for c in doc["claims"]} >= set(CLAIM_IDS)
    assert not (tmp_path / "book" / "results" / "genc" / "laptop.json").exists()


def test_presets_fit_their_budgets():
    "The full preset's dry-run estimate fits 10 minutes on one GPU; the laptop preset keeps ci's code path."
    est = cli.estimate_wall("genc", "full", measure=False)
    assert est["seconds"] is not None and est["seconds"] <= 600
    lap, ci = experiment.Config.preset("laptop"), experiment.Config.preset("ci")
    assert lap.n_seeds >= 8 and lap.n_probe_prompts == ci.n_probe_prompts == 0 and lap.first_seed != ci.first_seed
    assert experiment.plan(lap)[0]["units"] > experiment.plan(ci)[0]["units"]


def _tiny_gpt2(V=5, n=2, steps=5):
    return train_gpt2(lambda m, g: torch.randint(1, V, (m, n), generator=g), V, n, seed=0, steps=steps)[0]


def test_banned_log_q_is_the_law_of_transformers_generate():
    "word banning + SIR weighs by p / q: q must be the law generate(bad_words_ids=...) samples from."
    gpt = _tiny_gpt2()
    lm = CausalLM(gpt, [0], 2)
    bad = [[1], [3, 2]]                                        # one token, and a two-token sequence
    every = torch.tensor(list(itertools.product(range(5), repeat=2)))
    q = experiment.banned_log_q(lm, every, bad).exp().numpy()
    assert q.sum() == pytest.approx(1.0, abs=1e-5)
    banned = (every == 1).any(1) | ((every[:, 0] == 3) & (every[:, 1] == 2))
    assert (q[banned.numpy()] == 0).all()
    Y = experiment.word_banning(lm, 6000, bad, 0)
    obs = np.bincount((Y[:, 0] * 5 + Y[:, 1]).numpy(), minlength=25)
    assert obs[banned.numpy()].sum() == 0
    assert _chi_pvalue(obs, q / q.sum() * obs.sum()) > 1e-4


def test_causal_lm_top_k_path_against_brute_force():
    "local_distribution with top-k on a transformers model: the candidates and theta from explicit forward passes."
    gpt = _tiny_gpt2(V=6, n=3)
    lm = CausalLM(gpt, [0], 3)
    Y = torch.tensor([[1, 2, 3], [4, 4, 1], [5, 1, 2]])
    cand, theta, ll = local_distribution(lm, Y, k=2)
    ref_lp = lambda y: float(torch.log_softmax(gpt(input_ids=torch.tensor([[0] + list(y)])).logits[0, :-1], -1)
                             .gather(-1, torch.tensor(list(y))[:, None]).sum())
    with torch.no_grad():
        for b in range(len(Y)):
            lc = torch.log_softmax(gpt(input_ids=torch.cat([torch.zeros(1, dtype=torch.long), Y[b]])[None]).logits[0],
                                   -1)[:3]
            for i in range(3):
                top = set(lc[i].topk(2).indices.tolist())
                assert set(cand[b, i, :2].tolist()) == top and int(Y[b, i]) in cand[b, i].tolist()
                scores = []
                for j, v in enumerate(cand[b, i].tolist()):
                    if j == 2 and v in cand[b, i, :2].tolist():
                        scores.append(-np.inf)                  # the repeated slot carries no mass
                        continue
                    y = Y[b].tolist()
                    y[i] = v
                    scores.append(ref_lp(y))
                    assert float(ll[b, i, j]) == pytest.approx(scores[-1], abs=1e-4)
                ref = np.exp(np.array(scores) - max(scores))
                assert np.allclose(theta[b, i].numpy(), ref / ref.sum(), atol=1e-5)


def test_genc_sample_on_an_unsatisfiable_constraint():
    with pytest.raises(ValueError, match="unsatisfiable"):
        sudoku_constraint(2, 2, {0: 0, 5: 0})                    # the same digit twice in a box
    with pytest.raises(ValueError, match="unsatisfiable"):
        Constraint(2, 2, [(indicator(0, 0, 2),), (indicator(0, 1, 2),)])
    # satisfiable, but never by the top-1 candidates: every group is infeasible and is drawn again until it gives up
    a = torch.zeros(3, 3, dtype=torch.float64)
    a[:, 2] = -60.0
    model = PairwiseAR(a, torch.zeros(3, 3, 3, 3, dtype=torch.float64))
    only_2 = avoid_constraint(3, [(0,), (1,)], 3)
    with pytest.raises(RuntimeError, match="no feasible candidate"):
        genc_sample(model, only_2, 4, 2, 1, torch.Generator().manual_seed(0), max_rounds=3)
    out, _ = genc_sample(model, only_2, 4, 2, None, torch.Generator().manual_seed(0))
    assert (out == 2).all()                                      # every token a candidate: feasible


def test_one_generator_and_the_indicator():
    cons = sudoku_constraint(2, 2)
    model = shidoku_model(0)
    with pytest.raises(ValueError, match="torch.Generator"):
        genc_sample(model, cons, 2, 1, None, np.random.default_rng(0))
    assert indicator(3, 2, 4) == cons.var(3, 2) == 3 * 4 + 2 + 1
    with pytest.raises(ValueError):
        indicator(0, 4, 4)


def test_random_grids_reach_every_grid_uniformly_and_unique_puzzles(shidoku):
    _, sols = shidoku
    index = {tuple(s): i for i, s in enumerate(sols.tolist())}
    counts = np.bincount([index[tuple(x)] for x in random_sudoku_grids(6000, 2, 2, torch.Generator().manual_seed(0))
                          .tolist()], minlength=288)
    assert (counts > 0).all() and chisquare(counts).pvalue > 1e-4
    for p in sudoku_puzzles(15, 2, 2, 4, torch.Generator().manual_seed(1), unique=True):
        assert p["solutions"] == 1 == sudoku_constraint(2, 2, p["clues"]).circuit.model_count()
        assert all(int(p["grid"][c]) == d for c, d in p["clues"].items())
    p9 = sudoku_puzzles(1, 3, 3, 30, torch.Generator().manual_seed(2), unique=True)[0]
    assert p9["solutions"] == 1 and len(p9["clues"]) >= 30


def test_genc_generate_on_a_transformers_model_and_tokenizer():
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    G = TopicGrammar()
    gpt, _ = train_gpt2(G.sample, G.V, G.n, seed=0, steps=5)
    wl = Tokenizer(tok_models.WordLevel({w: i for i, w in enumerate(G.words)}, unk_token="<s>"))
    wl.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=wl, unk_token="<s>")
    assert banned_spellings(tok, ["vile"]) == [[G.id["vile"]]]
    texts = genc_generate(gpt, tok, "<s>", ["vile", "idiot", "scum"], k=2, S=2, m=6, max_new_tokens=4,
                          generator=torch.Generator().manual_seed(0))
    assert len(texts) == 6 and all(len(t.split()) == 4 for t in texts)
    assert not any(w in t.split() for t in texts for w in ("vile", "idiot", "scum"))
    with pytest.raises(ValueError, match="banned_words"):
        banned_spellings(tok, ["zebra"])
