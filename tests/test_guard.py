"""Tests of iclr25_repro.guard: exact models, Theorem 2, the twisted proposal, the sampler and its budget, the DPG
gradient, the transformers wrapper and LogitsProcessor, estimators, bad inputs, determinism, and a tiny run."""
import math

import pytest
import torch

from iclr25_repro.guard import experiment
from iclr25_repro.guard.model import (BudgetExhausted, CausalLMProposal, TabularLM, TokenBoost, all_sequences, contains,
                                      dpg, dpg_loss, estimate_report, exact_report, first_position, guard_sample,
                                      logit_boost, prompt_analogue, restricted_fit, sft, tiny_gpt2, toy_base,
                                      twisted_proposal)

V, T = 5, 4


@pytest.fixture(scope="module")
def toy():
    a = toy_base(V=V, T=T, p_target=0.02, seed=2)
    Y = all_sequences(V, T)
    b = contains(V - 1)
    with torch.no_grad():
        la = a.log_prob(Y)
    return a, Y, b, b(Y), la


def test_all_sequences_and_exact_normalisation(toy):
    a, Y, b, ok, la = toy
    assert Y.shape == (V**T, T) and len(torch.unique(Y, dim=0)) == V**T
    assert abs(float(la.exp().sum()) - 1) < 1e-12
    assert first_position(torch.tensor([[0, 4, 4, 1], [0, 0, 0, 0]]), 4).tolist() == [1, -1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_theorem2_identity_on_random_chains(toy, seed):
    a, Y, b, ok, la = toy
    q = TabularLM(torch.randn(T, V + 1, 2, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64), V - 1)
    with torch.no_grad():
        r = exact_report(la, q.log_prob(Y), ok)
    assert abs(r["kl_g_aprime"] - (r["kl_g_gprime"] - math.log(r["AR"]))) < 1e-10
    assert r["kl_g_gprime"] >= 0 and r["kl_gprime_g"] >= 0 and 0 <= r["tv"] <= 1


def test_ideal_distribution(toy):
    a, Y, b, ok, la = toy
    r = exact_report(la, la, ok)
    assert abs(r["kl_g_aprime"] + math.log(r["Z"])) < 1e-12 and r["AR"] == r["Z"] and r["kl_g_gprime"] == 0


def test_twisted_proposal_is_exact(toy):
    a, Y, b, ok, la = toy
    star = twisted_proposal(a)
    with torch.no_grad():
        r = exact_report(la, star.log_prob(Y), ok)
    assert abs(r["AR"] - 1) < 1e-12 and r["kl_g_gprime"] < 1e-12 and r["kl_g_aprime"] < 1e-12


def test_restricted_family_cannot_reach_g(toy):
    a, Y, b, ok, la = toy
    with torch.no_grad():
        r = exact_report(la, restricted_fit(a, Y, b).log_prob(Y), ok)
    assert r["kl_g_gprime"] > 1e-3 and r["AR"] < 1


def test_sampler_never_violates_and_raises_on_budget(toy):
    a, Y, b, ok, la = toy
    gen = torch.Generator().manual_seed(0)
    out, st = guard_sample(logit_boost(a, 5.0), b, 300, max_tries=100_000, batch_size=500, generator=gen)
    assert len(out) == 300 and b(out).all() and st.accepted == 300
    out, st = guard_sample(twisted_proposal(a), b, 123, max_tries=10_000, batch_size=500, generator=gen)
    assert st.tries == 123 and len(out) == 123          # AR = 1: one draw per output, the unused rest not counted
    with pytest.raises(BudgetExhausted, match="max_tries=50"):
        guard_sample(a, b, 300, max_tries=50, generator=gen)
    with pytest.raises(ValueError, match="must be >= 1"):
        guard_sample(a, b, 0, max_tries=10)


def test_sampling_matches_exact_probabilities(toy):
    a, Y, b, ok, la = toy
    draws = a.sample(100_000, torch.Generator().manual_seed(3))
    freq = torch.bincount(draws @ (V ** torch.arange(T - 1, -1, -1)), minlength=V**T).double() / 100_000
    assert float((freq - la.exp()).abs().max()) < 0.01


def test_dpg_gradient_equals_exact_forward_kl_gradient():
    small = toy_base(V=3, T=3, p_target=0.1, seed=1)
    Y = all_sequences(3, 3)
    ok = contains(2)(Y)
    gen = torch.Generator().manual_seed(5)
    pi = TabularLM(small.logits.detach() + 0.5 * torch.randn(small.logits.shape, generator=gen, dtype=torch.float64), 2)
    q = TabularLM(small.logits.detach() - 0.5 * torch.randn(small.logits.shape, generator=gen, dtype=torch.float64), 2)
    with torch.no_grad():
        la, lq = small.log_prob(Y), q.log_prob(Y)
        Z = float(la[ok].exp().sum())
        g = torch.where(ok, (la - math.log(Z)).exp(), torch.zeros_like(la))
        w = torch.where(ok, (la - lq).exp(), torch.zeros_like(la))                 # P / q
    exact = torch.autograd.grad((g[ok] * (g[ok].log() - pi.log_prob(Y)[ok])).sum(), pi.logits)[0]
    for B in (0.0, 0.3, 5.0):
        est = torch.autograd.grad(dpg_loss(pi.log_prob(Y), lq, w, Z, B, sample_weight=lq.exp()), pi.logits)[0]
        assert torch.allclose(est, exact, atol=1e-12)
    # the batch form (uniform average over draws from q) is an unbiased estimate of the same gradient
    draws = q.sample(200_000, torch.Generator().manual_seed(6))
    with torch.no_grad():
        ldq, okd = q.log_prob(draws), contains(2)(draws)
        wd = torch.where(okd, (small.log_prob(draws) - ldq).exp(), torch.zeros_like(ldq))
    mc = torch.autograd.grad(dpg_loss(pi.log_prob(draws), ldq, wd, Z, 0.0), pi.logits)[0]
    assert float((mc - exact).abs().max()) < 0.02 * float(exact.abs().max()) + 1e-3


def test_token_boost_is_transformers_sequence_bias():
    from transformers import SequenceBiasLogitsProcessor
    boost = TokenBoost(3, 4.0)
    assert isinstance(boost, SequenceBiasLogitsProcessor)
    scores = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[5, 1], [5, 3]])
    out = boost(ids, scores.clone())
    manual = scores.clone()
    manual[:, 3] += math.log(4.0)
    assert torch.allclose(out, manual)
    p, p0 = torch.softmax(out, -1), torch.softmax(scores, -1)                   # probability x 4, then renormalised
    assert torch.allclose(p[:, 3] / p[:, 0], 4 * p0[:, 3] / p0[:, 0])
    with pytest.raises(ValueError, match="positive"):
        TokenBoost(3, 0.0)


def test_dpg_and_sft_improve_and_are_deterministic(toy):
    a, Y, b, ok, la = toy
    def run(seed):
        gen = torch.Generator().manual_seed(seed)
        pol, log = dpg(a, a, b, budget=4000, batch_size=200, lr=0.1, generator=gen)
        with torch.no_grad():
            return exact_report(la, pol.log_prob(Y), ok), log
    (r1, l1), (r2, l2) = run(0), run(0)
    assert r1 == r2 and l1 == l2
    assert r1["kl_g_aprime"] < -math.log(r1["Z"])
    samples = a.sample(20_000, torch.Generator().manual_seed(1))
    acc = samples[b(samples)]
    m = sft(a, acc, steps=30, lr=0.05, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        r = exact_report(la, m.log_prob(Y), ok)
    assert r["AR"] > r["Z"]
    with pytest.raises(ValueError, match="at least one sample"):
        sft(a, acc[:0])
    with pytest.raises(ValueError, match="budget"):
        dpg(a, a, b, budget=10, batch_size=100)


def test_prompt_analogue_shifts_positions(toy):
    a, Y, b, ok, la = toy
    pos = first_position(Y, V - 1)
    with torch.no_grad():
        r = exact_report(la, prompt_analogue(a, 20.0).log_prob(Y), ok, pos, T)
    assert r["pos_gprime"][0] > r["pos_g"][0] + 0.1


def test_transformers_wrapper_and_logits_processor():
    lm = CausalLMProposal(tiny_gpt2(4, 3, seed=0), 4, 3)
    boosted = CausalLMProposal(lm.model, 4, 3, [TokenBoost(3, 4.0)])
    Y = all_sequences(4, 3)
    with torch.no_grad():
        p, pb = lm.log_prob(Y).exp(), boosted.log_prob(Y).exp()
    assert abs(float(p.sum()) - 1) < 1e-9 and abs(float(pb.sum()) - 1) < 1e-9
    has = contains(3)(Y)
    assert float(pb[has].sum()) > float(p[has].sum())
    s1 = boosted.sample(50, torch.Generator().manual_seed(0))
    s2 = boosted.sample(50, torch.Generator().manual_seed(0))
    assert torch.equal(s1, s2) and s1.shape == (50, 3) and int(s1.max()) < 4
    with pytest.raises(ValueError, match="positive"):
        TokenBoost(3, 0.0)


def test_estimators_cover_exact_values(toy):
    a, Y, b, ok, la = toy
    q = logit_boost(a, 4.0)
    gen = torch.Generator().manual_seed(0)
    Xa, Xq = a.sample(40_000, gen), q.sample(10_000, gen)
    oa, oq = b(Xa), b(Xq)
    with torch.no_grad():
        est = estimate_report(oa, oq, a.log_prob(Xa[oa]), q.log_prob(Xa[oa]), a.log_prob(Xq[oq]), q.log_prob(Xq[oq]))
        ex = exact_report(la, q.log_prob(Y), ok)
    for k, v in est.items():
        assert v["lo"] <= ex[k] <= v["hi"], (k, v, ex[k])
    with pytest.raises(ValueError, match="non-empty"):
        estimate_report(oa[:0], oq, la[:1], la[:1], la[:1], la[:1])


def test_bad_inputs():
    with pytest.raises(ValueError, match="shape"):
        TabularLM(torch.zeros(3, 4, 2, 4), 0)
    with pytest.raises(ValueError, match="target"):
        TabularLM(torch.zeros(3, 5, 2, 4), 7)
    a = toy_base(V=4, T=3, seed=0)
    with pytest.raises(ValueError, match="shape"):
        a.log_prob(torch.zeros(5, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids"):
        a.log_prob(torch.full((2, 3), 9))
    with pytest.raises(ValueError, match="p_target"):
        toy_base(p_target=1.5)
    with pytest.raises(ValueError, match="enumeration"):
        all_sequences(50, 6)


def test_cached_sampling_matches_log_prob_and_batching():
    lm = CausalLMProposal(tiny_gpt2(3, 3, seed=2), 3, 3, [TokenBoost(2, 2.0)])
    Y = all_sequences(3, 3)
    with torch.no_grad():
        p = lm.log_prob(Y).exp()
        assert torch.allclose(lm.log_prob(Y, batch_size=5), lm.log_prob(Y), atol=1e-12)   # across batch boundaries
    draws = lm.sample(30_000, torch.Generator().manual_seed(0), batch_size=7_000)
    freq = torch.bincount(draws @ torch.tensor([9, 3, 1]), minlength=27).double() / 30_000
    assert float((freq - p).abs().max()) < 0.01


def test_sft_and_dpg_train_a_transformer():
    lm = CausalLMProposal(tiny_gpt2(3, 3, seed=0), 3, 3)
    b = contains(2)
    Y = all_sequences(3, 3)
    with torch.no_grad():
        la = lm.log_prob(Y)
    pol, log = dpg(lm, lm, b, budget=1000, batch_size=250, lr=3e-3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        r = exact_report(la, pol.log_prob(Y), b(Y))
    assert r["AR"] > r["Z"] and log.samples == 1000
    with pytest.raises(ValueError, match="vocabulary"):
        CausalLMProposal(tiny_gpt2(3, 3), 5, 3)


def test_tiny_experiment_is_deterministic():
    cfg = experiment.Config.preset("tiny")
    r1, r2 = experiment.run(cfg), experiment.run(cfg)
    assert r1["claims"] == r2["claims"] and r1["rows"] == r2["rows"]


def test_tiny_experiment_run():
    out = experiment.run(experiment.Config.preset("tiny"))
    ids = [c["id"] for c in out["claims"]]
    assert ids == ["C1-guarantee", "C1b-cost", "C2-dpg", "C2b-warm-start", "C3-position", "C4-real-model"]
    assert [c["kind"] for c in out["claims"]] == ["check", "check", "claim", "claim", "claim", "claim"]
    assert out["claims"][0]["verdict"] == "passed" and out["claims"][-1]["verdict"] == "not_run"   # Part C: full only
    for c in out["claims"][2:6]:
        assert c["delta"] > 0 and c["delta_reason"]
    for c in out["claims"][2:5]:
        assert c["verdict"] in ("reproduced", "partial", "inconclusive", "not_reproduced", "not_run")
        assert c["replicates"] >= 2
    assert set(out["b"]["chosen_lr"]) == {"SFT", "DPG", "warm-start DPG"}
    assert sum(g["violations"] for g in out["a"]["guard"] + out["b"]["guard"]) == 0


def test_learned_prompt_is_a_proper_distribution_with_its_own_context():
    "The same GPT-2 started from BOS and from the instruction id: two distributions, each summing to 1, sampled as scored."
    lm = tiny_gpt2(3, 3, seed=4, n_context=2)
    a, p = CausalLMProposal(lm, 3, 3), CausalLMProposal(lm, 3, 3, prefix=4)
    Y = all_sequences(3, 3)
    la, lp = a.log_prob(Y).detach(), p.log_prob(Y).detach()
    assert abs(float(la.exp().sum()) - 1) < 1e-9 and abs(float(lp.exp().sum()) - 1) < 1e-9
    assert float((la - lp).abs().max()) > 1e-3                       # the context changes the distribution
    X = p.sample(20_000, torch.Generator().manual_seed(0))
    freq = torch.bincount(X[:, 0] * 9 + X[:, 1] * 3 + X[:, 2], minlength=27).double() / len(X)
    assert float((freq - lp.exp()).abs().max()) < 0.02                 # sampling follows log_prob
    with pytest.raises(ValueError, match="prefix"):
        CausalLMProposal(lm, 3, 3, prefix=2)
    with pytest.raises(ValueError, match="vocabulary"):
        CausalLMProposal(tiny_gpt2(3, 3), 3, 3, prefix=4)


def test_matched_point_bisects_to_the_target_and_bounds_out_of_reach():
    "On a family with AR = f / (f + 9) and KL = log f: bisection finds the strength whose AR is the target."
    ev = lambda f: (f / (f + 9), math.log(f))
    grid = [(f, *ev(f)) for f in (1.0, 4.0, 16.0, 64.0)]
    p = experiment.matched_point(ev, 0.5, grid, iters=20)          # AR 0.5 at f = 9: KL log 9
    assert p["reached"] and p["kl"] == pytest.approx(math.log(9), abs=1e-4)
    out = experiment.matched_point(ev, 0.99, grid)                 # beyond f = 64: its KL, flagged
    assert not out["reached"] and out["kl"] == pytest.approx(math.log(64))
    g = experiment.grid_point(grid, 0.5)                            # on the grid only: between f = 4 and 16
    assert g["reached"] and math.log(4) < g["kl"] < math.log(16)


def _tiny_llama(vocab: int = 12, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def test_text_proposal_is_exact_and_lora_starts_equal():
    "TextProposal on a tiny Llama: log_prob sums to 1 over every banned-free continuation, sampling follows it, and "
    "a LoRA copy equals the model until trained, with only the adapter trainable."
    from iclr25_repro.guard.model import TextProposal, contains_any, lora_proposal, _trainable_copy
    lm = _tiny_llama()
    p = TextProposal(lm, torch.tensor([3, 5, 7]), 3, banned=[0, 1])
    Y = all_sequences(12, 3)
    free = ~torch.isin(Y, torch.tensor([0, 1])).any(1)
    with torch.no_grad():
        lp = p.log_prob(Y[free])
    assert lp.dtype == torch.float64 and abs(float(lp.exp().sum()) - 1) < 1e-5
    X = p.sample(4000, torch.Generator().manual_seed(0))
    assert not torch.isin(X, torch.tensor([0, 1])).any()                       # the end tokens are never emitted
    b = contains_any([4, 9])
    with torch.no_grad():
        exact = float(p.log_prob(Y[free][b(Y[free])]).exp().sum())
    assert abs(float(b(X).double().mean()) - exact) < 4 * math.sqrt(exact * (1 - exact) / 4000)
    q = lora_proposal(p, r=2)
    with torch.no_grad():
        assert torch.allclose(q.log_prob(Y[:50]), p.log_prob(Y[:50]), atol=1e-6)
    t = _trainable_copy(q)
    names = [n for n, w in t.named_parameters() if w.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert all(w.requires_grad for w in _trainable_copy(p).parameters())       # without LoRA: everything trains


def test_real_model_claim_rule_at_its_boundaries():
    "C4: the margin's interval against delta and log10(AR / Z) against min(10, 0.5 / Z), the weaker of the two."
    def c(dpg_ar, dpg_kl, prompt=(0.5, 1.0)):
        ars = dpg_ar if isinstance(dpg_ar, (list, tuple)) else [dpg_ar] * len(dpg_kl)
        rows = [dict(name="prompting", family="prompting + boost", strength=1.0, AR=prompt[0], kl_g_gprime=prompt[1]),
                dict(name="logit boost x4", family="logit boost", strength=4.0, AR=0.2, kl_g_gprime=0.3),
                dict(name="logit boost x64", family="logit boost", strength=64.0, AR=0.9, kl_g_gprime=2.0)]
        rows += [dict(name="DPG (LoRA)", family="DPG (LoRA)", seed=s, AR=ar, kl_g_gprime=k)
                 for s, (ar, k) in enumerate(zip(ars, dpg_kl))]
        return experiment.real_model_claim(dict(rows=rows, Z=0.02, n_g=100))
    none = experiment.real_model_claim(None)
    assert none["verdict"] == "not_run" and none["delta"] == experiment.DELTAS["C4-real-model"][0]
    good = c(0.8, [0.2, 0.25, 0.3])       # boost at AR 0.8 about 1.87; prompting cannot reach 0.8: its 1.0 bounds it
    assert good["verdict"] == "reproduced" and good["interval"]["lo"] > 0 and good["better"] == "higher"
    assert c(0.8, [0.97, 0.98, 0.96])["verdict"] == "partial"          # margins 0.02-0.04: real, below delta 0.1
    assert c(0.4, [0.9, 1.1, 1.3])["verdict"] == "inconclusive"        # margins +0.1, -0.1, -0.3: wide, across 0
    assert c(0.8, [1.05, 1.1, 1.08])["verdict"] == "not_reproduced"    # margins -0.05 to -0.1: below delta, not above 0
    assert c(0.15, [0.2, 0.25, 0.3])["verdict"] == "not_reproduced"    # AR below min(10 Z, 0.5) = 0.2 on every seed
    assert c([0.1, 0.8, 0.4], [0.2, 0.25, 0.3])["verdict"] == "inconclusive"   # AR's interval across 10 Z
    few = c(0.8, [0.2])                                                   # one seed: nothing to build an interval on
    assert few["verdict"] == "not_run" and few["ours"] is None


def _parts(m_a=(0.3, 0.35, 0.4), m_b=(0.3, 0.35, 0.4), ar_a=(0.5, 0.5, 0.5), ar_b=(0.5, 0.5, 0.5),
           w_a=(-0.3, -0.35, -0.4), w_b=(-0.3, -0.35, -0.4), tv_prompt=0.25, tv_dpg=(0.02, 0.03, 0.04), err=0.01,
           exact_boost=True):
    """Synthetic results of Parts A and B (Z = 0.01 in both, DPG the judged variant) whose C2 margins are m_*, ARs
    ar_*, C2b differences of KL(g||a') (warm-start minus DPG) w_*, C3 positional TVs tv_prompt and tv_dpg, and the
    learned prompt's positional error against the exact instruction boost err."""
    pos = lambda t: [0.5 + t, 0.3 - t, 0.2]        # TV t from g's positions [0.5, 0.3, 0.2]
    def rows(m, ar, w, budget):
        at = {} if budget is None else {"budget": budget}
        out = []
        for s in range(len(m)):
            out += [dict(name="DPG", seed=s, AR=ar[s], kl_g_gprime=0.2, kl_g_aprime=1.0, pos_g=pos(0),
                         pos_gprime=pos(tv_dpg[s]), frontier={"logit boost": dict(kl=0.2 + m[s], reached=True)}, **at),
                    dict(name="SFT", seed=s, kl_g_gprime=1.2 + m[s], kl_g_aprime=2.0, **at),
                    dict(name="warm-start DPG", seed=s, kl_g_aprime=1.0 + w[s], kl_g_gprime=0.2, **at)]
        return out
    guard = [dict(outputs=10, violations=0, z=0.0)]
    a = dict(rows=rows(m_a, ar_a, w_a, 1000), guard=guard, Z=0.01, best_variant="DPG")
    b_rows = rows(m_b, ar_b, w_b, None) + [dict(name="learned prompt", pos_g=pos(0), pos_gprime=pos(tv_prompt))]
    if exact_boost:
        b_rows.append(dict(name="logit boost x8", family="logit boost", strength=8.0, pos_g=pos(0),
                           pos_gprime=pos(tv_prompt - err)))
    b = dict(rows=b_rows, guard=guard, Z=0.01, best_variant="DPG", prompt_boost=8.0)
    return {c["id"]: c for c in experiment.make_claims(a, b)}


def test_dpg_claim_rule_moves_with_the_numbers():
    "C2: each part's margin interval against delta 0.1 and log10(AR / Z) against 1; the weakest of the four."
    v = lambda **kw: _parts(**kw)["C2-dpg"]["verdict"]
    c2 = _parts()["C2-dpg"]
    assert c2["verdict"] == "reproduced" and c2["delta"] == 0.1 and c2["better"] == "higher" and c2["interval"]["lo"] > 0
    small = (0.02, 0.03, 0.025)
    assert v(m_a=small, m_b=small) == "partial"                          # real margins, below delta
    assert v(m_b=small) == "partial"                                     # one part partial: the weaker decides
    assert v(m_a=(-0.2, 0.3, 0.1)) == "inconclusive"                     # across 0, reaching delta
    assert v(m_b=(-0.05, -0.04, -0.06)) == "not_reproduced"              # worse than the competitors
    assert v(ar_b=(0.05, 0.05, 0.05)) == "not_reproduced"                # AR 5 Z on every seed: not a large factor
    assert v(ar_a=(0.05, 0.5, 0.2)) == "inconclusive"                    # AR's interval across 10 Z
    assert _parts(m_b=small)["C2-dpg"]["interval"]["hi"] < 0.1           # the record shows the part that decided


def test_warm_start_claim_rule_moves_with_the_numbers():
    "C2b: warm-start minus DPG in KL(g||a'), lower is better, delta 0.1 nats, in both parts."
    v = lambda **kw: _parts(**kw)["C2b-warm-start"]["verdict"]
    c = _parts()["C2b-warm-start"]
    assert c["verdict"] == "reproduced" and c["better"] == "lower" and c["interval"]["hi"] < 0
    small = (-0.02, -0.03, -0.025)
    assert v(w_a=small) == "partial"
    assert v(w_b=(0.2, -0.3, -0.1)) == "inconclusive"
    assert v(w_a=(0.05, 0.04, 0.06)) == "not_reproduced"                 # warm start worse in one part
    assert v(w_a=(0.3, 0.35, 0.4), w_b=(0.3, 0.35, 0.4)) == "not_reproduced"


def test_position_claim_rule_and_its_gate():
    "C3: the learned prompt's positional TV minus the DPG proposal's against delta 0.05, gated on its learning error."
    v = lambda **kw: _parts(**kw)["C3-position"]["verdict"]
    c = _parts()["C3-position"]
    assert c["verdict"] == "reproduced" and c["delta"] == 0.05 and c["gates"][0]["passed"]
    assert c["gates"][0]["value"] == pytest.approx(0.01)
    assert v(tv_dpg=(0.22, 0.23, 0.215)) == "partial"                    # TV 0.02-0.035 more than DPG's: below delta
    assert v(tv_dpg=(0.05, 0.28, 0.2)) == "inconclusive"
    assert v(tv_dpg=(0.26, 0.27, 0.28)) == "not_reproduced"              # DPG distorts the positions more
    failed = _parts(err=0.1)["C3-position"]                              # the prompt's own error above delta
    assert failed["verdict"] == "not_run" and not failed["gates"][0]["passed"]
    assert failed["gates"][0]["value"] == pytest.approx(0.1) and failed["interval"]["lo"] > 0
    unmeasured = _parts(exact_boost=False)["C3-position"]                # the exact boost not evaluated
    assert unmeasured["verdict"] == "not_run" and unmeasured["gates"][0]["value"] is None


def test_full_preset_smoke_and_plan():
    "The full preset, every loop capped, on the CPU: Parts A and B at their full sizes and Part C on SmolLM2 (minutes)."
    from iclr25_repro.core import cli
    phases = experiment.plan(experiment.Config.preset("full"))
    assert phases[-1]["phase"].startswith("Part C") and phases[-1]["tokens"] == 32
    doc = cli.run_experiment("guard", "full", "cpu", 0, smoke=True)
    assert doc["config"]["smoke"] is True and doc["config"]["c_run"] is True
    assert [c["id"] for c in doc["claims"]][-1] == "C4-real-model"


def test_enumerated_log_prob_equals_the_model():
    "The lookup DPG reads for the base gives exactly the model's log p(y), and rejects a table of the wrong size."
    from iclr25_repro.guard.experiment import EnumeratedLogProb
    V, T = 4, 3
    a = CausalLMProposal(tiny_gpt2(V, T, seed=3), V, T)
    Y = all_sequences(V, T)
    with torch.no_grad():
        table = EnumeratedLogProb(a.log_prob(Y), V, T)
        idx = torch.randperm(len(Y), generator=torch.Generator().manual_seed(0))[:17]
        assert torch.equal(table.log_prob(Y[idx]), a.log_prob(Y[idx]))
    with pytest.raises(ValueError, match="V\\*\\*T"):
        EnumeratedLogProb(torch.zeros(5), V, T)
