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
                                     all_solutions, avoid_constraint, clash_mask, genc_candidates, genc_sample,
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
    c = Constraint.__new__(Constraint)
    c.C = V
    alpha = Constraint(n, V, [(-c.var(i, 0), -c.var(i + 1, 0)) for i in range(n - 1)] + [(c.var(0, 1), c.var(3, 2))])
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
    c = genc_candidates(model, cons, 6, None, torch.Generator().manual_seed(2), np.random.default_rng(2))
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
    c = genc_candidates(model, alpha, 30_000, None, torch.Generator().manual_seed(1), np.random.default_rng(1))
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
    out, info = genc_sample(flat, cons, 8000, 1, None, torch.Generator().manual_seed(0), np.random.default_rng(0))
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
        out, _ = genc_sample(model, alpha, 4000, S, None, torch.Generator().manual_seed(S), np.random.default_rng(S))
        assert alpha.satisfied(out.numpy()).all()
        tv[S] = 0.5 * np.abs(np.bincount(code(out), minlength=81) / 4000 - target).sum()
    assert tv[32] < tv[1] / 2


def test_every_output_satisfies_and_bad_inputs(shidoku):
    cons, _ = shidoku
    model = shidoku_model(2)
    out, _ = genc_sample(model, cons, 50, 3, None, torch.Generator().manual_seed(0), np.random.default_rng(0))
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
    run = lambda: genc_sample(model, cons, 40, 4, None, torch.Generator().manual_seed(7), np.random.default_rng(7))
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
    out, _ = genc_sample(lm, avoid, 6, 2, 2, g, np.random.default_rng(0))
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


def _claims_with_effect(m, solutions=1):
    """make_claims on rows built so that every claim's per-seed effect (oriented: positive is the paper's direction) is
    its delta times m[seed]."""
    cfg = dataclasses.replace(experiment.Config.preset("ci"), S_values=(1, 4), sir_match=(1,), lm_S=(1, 16),
                              lm_sir_match=1)
    d = {k: v[0] for k, v in experiment.DELTAS.items()}
    sh, pz, gr = [], [], []
    for s, ms in enumerate(m):
        e1, e4, e2 = d["C1-closer"] * ms, d["C4-budget"] * ms, d["C2-puzzles"] * ms
        sh += [dict(seed=s, method="exact draws", S=None, tv=0.1, valid=1.0),
               dict(seed=s, method="masking", S=None, tv=0.3 + e1, valid=1.0),
               dict(seed=s, method="Gen-C", S=1, tv=0.3 + e1, valid=1.0),
               dict(seed=s, method="Gen-C", S=4, tv=0.3, valid=1.0),
               dict(seed=s, method="masked SIR", S=51, matches=1, tv=0.3 + e1 + e4, valid=1.0)]
        pz.append(dict(seed=s, genc=1.0, sat_mask=1.0, greedy=1.0 - e2, clash_restarts=1.0 - 1.01 * e2,
                       solutions=solutions))
        e3, e5 = d["C3-topic"] * ms, d["C5-topic-budget"] * ms
        gr += [dict(seed=s, method=meth, S=S, toxic=t, banned=0.0, target_toxic=0.01)
               for meth, S, t in (("word banning", None, 0.1 + e3), ("Gen-C", 16, 0.1), ("Gen-C", 1, 0.05),
                                  ("word banning + SIR", 20, 0.05 + e5))]
    return {c["id"]: c for c in experiment.make_claims({"shidoku": sh, "puzzles": pz, "grammar": gr}, cfg)}


CLAIM_IDS = ("C1-closer", "C2-puzzles", "C3-topic", "C4-budget", "C5-topic-budget")


@pytest.mark.parametrize("m, verdict", [
    ((2.0, 2.1, 2.2), "reproduced"),          # above 0 and past delta
    ((0.3, 0.35, 0.4), "partial"),            # above 0, short of delta
    ((-1.0, 1.0, 3.0), "inconclusive"),       # reaches both 0 and delta
    ((-0.5, -0.4, -0.6), "not_reproduced"),   # reaches 0, short of delta
])
def test_claim_rules_follow_the_effect_against_delta(m, verdict):
    claims = _claims_with_effect(m)
    for k in CLAIM_IDS:
        assert claims[k]["verdict"] == verdict, (k, claims[k]["interval"])
        assert claims[k]["delta"] == experiment.DELTAS[k][0] and claims[k]["better"] == "higher"
        assert f"delta = {experiment.DELTAS[k][0]}" in claims[k]["rule"]
    assert claims["C2-puzzles"]["gates"][0]["passed"]


def test_claim_rules_take_the_weakest_part():
    "C1 needs both gaps: Gen-C below masking and Gen-C's fall with S; one short part decides."
    claims = _claims_with_effect((2.0, 2.1, 2.2))
    assert claims["C1-closer"]["verdict"] == "reproduced"
    cfg = dataclasses.replace(experiment.Config.preset("ci"), S_values=(1, 4), sir_match=(1,), lm_S=(1, 16),
                              lm_sir_match=1)
    sh = [dict(seed=s, method=meth, S=S, tv=tv, valid=1.0, **({"matches": 1} if meth == "masked SIR" else {}))
          for s in range(3) for meth, S, tv in (("exact draws", None, 0.1), ("masking", None, 0.5 + 0.01 * s),
                                                ("Gen-C", 1, 0.31 + 0.001 * s), ("Gen-C", 4, 0.3),
                                                ("masked SIR", 51, 0.5))]
    parts = {"shidoku": sh, "puzzles": [dict(seed=s, genc=1.0, sat_mask=1.0, greedy=0.0, clash_restarts=0.0,
                                             solutions=1) for s in range(3)],
             "grammar": [dict(seed=s, method=meth, S=S, toxic=0.1, banned=0.0, target_toxic=0.01) for s in range(3)
                         for meth, S in (("word banning", None), ("Gen-C", 16), ("Gen-C", 1),
                                         ("word banning + SIR", 20))]}
    c1 = {c["id"]: c for c in experiment.make_claims(parts, cfg)}["C1-closer"]
    assert c1["interval"]["lo"] > c1["delta"]   # masking's gap alone would reproduce ...
    assert c1["verdict"] == "partial"           # ... but Gen-C falls with S by less than delta


def test_puzzle_claim_not_run_when_puzzles_have_several_solutions():
    claims = _claims_with_effect((2.0, 2.1, 2.2), solutions=2)
    c2 = claims["C2-puzzles"]
    assert c2["verdict"] == "not_run"
    assert c2["gates"] == [dict(name="share of puzzles with a unique solution", value=0.0,
                                threshold=experiment.PUZZLE_UNIQUE_MIN, better="higher", passed=False)]
    assert c2["interval"]["lo"] > c2["delta"]   # the gap would have reproduced it
    assert all(claims[k]["verdict"] == "reproduced" for k in CLAIM_IDS if k != "C2-puzzles")


def test_tiny_run_is_deterministic():
    cfg = experiment.Config.preset("tiny")
    a, b = experiment.run(cfg), experiment.run(cfg)
    ids = {c["id"] for c in a["claims"]}
    assert {"C1-closer", "C2-puzzles", "C3-topic", "C4-budget", "C5-topic-budget", "K1-valid", "K2-solved",
            "K3-banning"} == ids
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
    assert {c["id"] for c in doc["claims"]} >= {"C1-closer", "C2-puzzles", "C3-topic", "C4-budget"}
    assert not (tmp_path / "book" / "results" / "genc" / "full.json").exists()
