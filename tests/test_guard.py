"""Tests of iclr25_repro.guard: exact models, Theorem 2, the twisted proposal, the sampler and its budget, the DPG
gradient, the transformers wrapper and LogitsProcessor, estimators, bad inputs, determinism, and a tiny run."""
import math

import numpy as np
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
    "Both trainers must cut KL(g||a') well below the base model's -log Z (a nat or more) and lift AR to several Z."
    a, Y, b, ok, la = toy
    def run(seed, baseline="constant"):
        gen = torch.Generator().manual_seed(seed)
        pol, log = dpg(a, a, b, budget=4000, batch_size=200, lr=0.1, baseline=baseline, generator=gen)
        with torch.no_grad():
            return exact_report(la, pol.log_prob(Y), ok), log
    (r1, l1), (r2, l2) = run(0), run(0)
    assert r1 == r2 and l1 == l2
    start = -math.log(r1["Z"])
    assert r1["kl_g_aprime"] < start - 1.0 and r1["AR"] > 3 * r1["Z"]
    rm, _ = run(0, "moving")
    assert rm["kl_g_aprime"] < start - 1.0 and rm != r1           # the other baseline: another run, also improving
    samples = a.sample(20_000, torch.Generator().manual_seed(1))
    acc = samples[b(samples)]
    m = sft(a, acc, steps=30, lr=0.05, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        r = exact_report(la, m.log_prob(Y), ok)
    assert r["kl_g_aprime"] < start - 1.0 and r["AR"] > 3 * r["Z"]
    with pytest.raises(ValueError, match="at least one sample"):
        sft(a, acc[:0])
    with pytest.raises(ValueError, match="budget"):
        dpg(a, a, b, budget=10, batch_size=100)
    with pytest.raises(ValueError, match="baseline"):
        dpg(a, a, b, budget=200, batch_size=100, baseline="ema")


def test_dpg_adopts_the_judged_snapshot(toy, monkeypatch):
    """Offline DPG: when pi is judged better, the new proposal q is pi as it was judged (before it trains on that
    batch), not the pi that has since taken a step on the batch it was judged on (which would favour pi)."""
    import copy as _copy
    from iclr25_repro.guard import model as M
    a, Y, b, ok, la = toy
    copies, judged, first_use = [], [], []
    real_deepcopy, real_lp, real_sample = _copy.deepcopy, TabularLM.log_prob, TabularLM.sample
    def deepcopy(x, *args):
        y = real_deepcopy(x, *args)
        if isinstance(x, TabularLM):
            copies.append(y)
        return y
    def log_prob(self, Yb):
        if not torch.is_grad_enabled() and copies and self is copies[0]:     # pi, scored for the offline check
            judged.append(self.logits.detach().clone())
        return real_lp(self, Yb)
    def sample(self, n, generator=None):
        if len(copies) > 2 and self not in copies[:2] and all(self is not q for q, _, _ in first_use):
            first_use.append((self, self.logits.detach().clone(), copies[0].logits.detach().clone()))
        return real_sample(self, n, generator)
    monkeypatch.setattr(M.copy, "deepcopy", deepcopy)
    monkeypatch.setattr(TabularLM, "log_prob", log_prob)
    monkeypatch.setattr(TabularLM, "sample", sample)
    pol, log = dpg(a, a, b, budget=4000, batch_size=200, lr=0.1, check_every=2,
                   generator=torch.Generator().manual_seed(0))
    assert log.proposal_updates >= 1 and len(first_use) == log.proposal_updates
    for q, w_q, w_pi in first_use:
        assert any(torch.equal(w_q, j) for j in judged)      # q is a state of pi that was judged ...
        assert not torch.equal(w_q, w_pi)                    # ... not pi after its step on the judging batch


def test_restricted_fit_is_the_forward_kl_optimum(toy):
    "No flag-unaware chain is closer to g in KL(g || .) than restricted_fit's: random perturbations all do worse."
    a, Y, b, ok, la = toy
    r = restricted_fit(a, Y, b)
    with torch.no_grad():
        best = exact_report(la, r.log_prob(Y), ok)["kl_g_aprime"]
    gen = torch.Generator().manual_seed(0)
    for scale in (1e-3, 1e-2, 0.3):
        for _ in range(5):
            q = TabularLM(r.logits.detach() + scale * torch.randn(r.logits.shape, generator=gen, dtype=r.logits.dtype),
                          r.target)
            with torch.no_grad():
                assert exact_report(la, q.log_prob(Y), ok)["kl_g_aprime"] > best - 1e-12
    # and the gradient of KL(g || .) at the fit vanishes (a stationary point of a convex problem in the logits)
    m = TabularLM(r.logits.detach(), r.target)
    g = torch.where(ok, (la - la[ok].logsumexp(0)).exp(), torch.zeros_like(la))
    kl = -(g[ok] * m.log_prob(Y)[ok]).sum()
    (grad,) = torch.autograd.grad(kl, m.logits)
    assert float(grad.abs().max()) < 1e-8


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
    assert out["claims"][0]["verdict"] == "passed" and out["claims"][-1]["verdict"] == "not_run"   # no Part C
    for c in out["claims"][2:6]:
        assert c["delta"] > 0 and c["delta_reason"]
    for c in out["claims"][2:4]:
        assert c["verdict"] in ("reproduced", "partial", "inconclusive", "not_reproduced", "not_run")
        assert c["replicates"] >= 2
    assert out["claims"][4]["verdict"] == "not_run"                     # C3 needs Part C
    assert set(out["b"]["chosen_lr"]) == {"SFT", "DPG", "warm-start DPG"}
    assert set(out["a"]["best_variant"]) == set(out["a"]["budgets"])    # Part A: the variant chosen per budget
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
           w_a=(-0.3, -0.35, -0.4), w_b=(-0.3, -0.35, -0.4), m_a2=None, w_a2=None, min_accepted=5):
    """Synthetic results of Parts A and B (Z = 0.01 in both, DPG the judged variant) whose C2 margins are m_*, ARs
    ar_*, C2b differences of KL(g||a') (warm-start minus DPG) w_*; Part A has a second budget (m_a2, w_a2: default
    the first's). Part A's smallest budget holds 10 expected accepted samples, Part B's 20."""
    def rows(m, ar, w, budget):
        at = {} if budget is None else {"budget": budget}
        out = []
        for s in range(len(m)):
            out += [dict(name="DPG", seed=s, AR=ar[s], kl_g_gprime=0.2, kl_g_aprime=1.0,
                         frontier={"logit boost": dict(kl=0.2 + m[s], reached=True)}, **at),
                    dict(name="SFT", seed=s, kl_g_gprime=1.2 + m[s], kl_g_aprime=2.0, **at),
                    dict(name="warm-start DPG", seed=s, kl_g_aprime=1.0 + w[s], kl_g_gprime=0.2, **at)]
        return out
    guard = [dict(outputs=10, violations=0, z=0.0)]
    a = dict(rows=rows(m_a, ar_a, w_a, 1000) + rows(m_a2 or m_a, ar_a, w_a2 or w_a, 3000), guard=guard, Z=0.01,
             best_variant={1000: "DPG", 3000: "DPG"}, budgets=[1000, 3000])
    b = dict(rows=rows(m_b, ar_b, w_b, None), guard=guard, Z=0.01, best_variant="DPG", budget=2000)
    return {c["id"]: c for c in experiment.make_claims(a, b, None, min_accepted=min_accepted)}


def test_dpg_claim_rule_moves_with_the_numbers():
    "C2: every part's margin interval against delta 0.1 and log10(AR / Z) against 1; the weakest decides; the gate."
    v = lambda **kw: _parts(**kw)["C2-dpg"]["verdict"]
    c2 = _parts()["C2-dpg"]
    assert c2["verdict"] == "reproduced" and c2["delta"] == 0.1 and c2["better"] == "higher" and c2["interval"]["lo"] > 0
    small = (0.02, 0.03, 0.025)
    assert v(m_a=small, m_b=small) == "partial"                          # real margins, below delta
    assert v(m_b=small) == "partial"                                     # one part partial: the weaker decides
    assert v(m_a=(-0.2, 0.3, 0.1)) == "inconclusive"                     # across 0, reaching delta
    assert v(m_b=(-0.05, -0.04, -0.06)) == "not_reproduced"              # worse than the competitors
    assert v(m_a2=(-0.05, -0.04, -0.06)) == "not_reproduced"             # the second budget alone can sink it
    assert v(ar_b=(0.05, 0.05, 0.05)) == "not_reproduced"                # AR 5 Z on every seed: not a large factor
    assert v(ar_a=(0.05, 0.5, 0.2)) == "inconclusive"                    # AR's interval across 10 Z
    assert _parts(m_b=small)["C2-dpg"]["interval"]["hi"] < 0.1           # the record shows the part that decided
    gated = _parts(min_accepted=11)["C2-dpg"]                            # Part A's 10 expected accepted samples < 11
    assert gated["verdict"] == "not_run" and gated["gates"][0]["value"] == pytest.approx(10)
    assert _parts(min_accepted=10)["C2-dpg"]["verdict"] == "reproduced"  # at the threshold: passes


def test_warm_start_claim_rule_moves_with_the_numbers():
    "C2b: warm-start minus DPG in KL(g||a'), lower is better, delta 0.1 nats, in every part and budget."
    v = lambda **kw: _parts(**kw)["C2b-warm-start"]["verdict"]
    c = _parts()["C2b-warm-start"]
    assert c["verdict"] == "reproduced" and c["better"] == "lower" and c["interval"]["hi"] < 0
    small = (-0.02, -0.03, -0.025)
    assert v(w_a=small, w_a2=small) == "partial"
    assert v(w_b=(0.2, -0.3, -0.1)) == "inconclusive"
    assert v(w_a=(0.05, 0.04, 0.06)) == "not_reproduced"                 # warm start worse in one part
    assert v(w_a2=(0.05, 0.04, 0.06)) == "not_reproduced"                # ... or at one budget
    assert v(w_a=(0.3, 0.35, 0.4), w_b=(0.3, 0.35, 0.4)) == "not_reproduced"
    assert _parts(min_accepted=1000)["C2b-warm-start"]["verdict"] == "not_run"


def _c3(moves, min_valid: int = 30):
    """Synthetic Part C (T = 24, 6 bins of 4 tokens): g's first positions repeat 0..11 (a third in each of the first
    three bins, exactly, in every chunk: GUARD's TV is 0); prompting's chunk i is the same 60 positions with moves[i]
    of them taken from the third bin to position 0, a TV of moves[i] / 60."""
    g = list(range(12)) * 40
    p = []
    for m in moves:
        chunk = list(range(12)) * 5
        for i in [i for i, x in enumerate(chunk) if x >= 8][:m]:
            chunk[i] = 0
        p += chunk
    rows = [dict(name="prompting", AR=0.5, first_pos=p)]
    return experiment.position_claim(dict(rows=rows, first_pos_g=g, T=24, Z=0.05, min_valid=min_valid,
                                          chunks=len(moves), bins=6))


def test_position_claim_rule_and_its_gate():
    "C3 on Part C: prompting's positional TV from g minus GUARD's (its sampling noise), against delta 0.05; the gate."
    c = _c3([12, 14, 13, 15])
    assert c["verdict"] == "reproduced" and c["delta"] == 0.05 and c["gates"][0]["passed"] and c["replicates"] == 4
    assert c["ours"] == pytest.approx(54 / 240) and c["baseline"] == 0
    assert _c3([1, 2, 1, 2])["verdict"] == "partial"                 # TV 0.017-0.033: real, below delta
    assert _c3([0, 12, 0, 6])["verdict"] == "inconclusive"           # across 0, reaching delta
    assert _c3([0, 1, 0, 0])["verdict"] == "not_reproduced"          # no shift that matters
    few = _c3([12, 14, 13, 15], min_valid=61)                        # 60 per chunk < 61
    assert few["verdict"] == "not_run" and few["gates"][0]["value"] == 60 and few["interval"] is not None
    none = experiment.position_claim(None)
    assert none["verdict"] == "not_run" and not none["gates"][0]["passed"]


def test_position_split_keeps_chunks_disjoint_and_equal():
    g, p = list(range(100)), list(range(1000, 1050))
    gc, pc, ref, n = experiment.position_split(g, p, 4)
    assert n == 12 and all(len(x) == n for x in gc + pc) and len(ref) == 100 - 48
    flat = [x for c in gc for x in c] + ref
    assert sorted(flat) == g                                                   # disjoint, and nothing lost


def test_sweep_chooses_by_the_worst_tuning_seed(monkeypatch):
    "A rate that is best on one tuning seed but collapses on another loses to a rate that is good on both."
    kls = {(1, 0): 0.1, (1, 1): 50.0, (2, 0): 0.3, (2, 1): 0.3}       # (lr, tuning seed) -> KL(g||a'), every method
    calls = []
    def fake(a, prompted, b, updates, batch, lr, warm_share, gen, which=experiment.METHODS, base=None,
             baseline="constant"):
        t = next(t for t in (0, 1) if gen.initial_seed() == 10_000 + 100 * t)
        calls.append((lr, t))
        return {n: (lr, t, n) for n in which}
    monkeypatch.setattr(experiment, "trained_b", fake)
    def kl_of(m):
        lr, t, n = m
        return kls[lr, t] + (0.05 if n == "DPG" else 0.0)
    # evaluation seeds are drawn from other generators: give them a harmless KL via a second fake
    tune, chosen, best, models = experiment.sweep_train(None, None, None, 10, 10, (1, 2), (0, 1), (), 0.1, kl_of, 0)
    assert chosen == {"SFT": 2, "DPG": 2, "warm-start DPG": 2}          # rate 1 wins seed 0, collapses on seed 1
    assert best == "warm-start DPG"                                     # 0.3 < 0.35 on the worst seed
    assert len(tune) == 2 * 2 * 3 and not models


def test_full_preset_smoke_and_plan():
    "The full preset, every loop capped, on the CPU: Parts A and B and Part C on SmolLM2 with DPG (minutes)."
    from iclr25_repro.core import cli
    phases = experiment.plan(experiment.Config.preset("full"))
    assert phases[-1]["phase"].startswith("Part C") and phases[-1]["tokens"] == 32
    assert all(p["units"] > 0 for p in phases)
    est = cli.estimate_wall("guard", "full", measure=False)
    assert est["seconds"] is not None and est["seconds"] <= 600             # the full preset fits 10 GPU minutes
    doc = cli.run_experiment("guard", "full", "cpu", 0, smoke=True)
    assert doc["config"]["smoke"] is True and doc["config"]["c_run"] is True
    assert [c["id"] for c in doc["claims"]][-1] == "C4-real-model"


def test_laptop_preset_smoke_and_plan():
    "The laptop preset, every loop capped: the same code path as ci, at the sizes that decide C2 and C2b (no Part C)."
    from iclr25_repro.core import cli
    cfg, ci = experiment.Config.preset("laptop"), experiment.Config.preset("ci")
    assert not cfg.c_run and len(cfg.seeds) >= 3 and len(cfg.b_seeds) >= 3 and len(cfg.tune_seeds) >= 2
    assert cfg.min_accepted <= 0.015 * min(cfg.budgets)                     # the gate can pass at laptop (Z > 1.5%)
    assert ci.min_accepted > 0.02 * min(ci.budgets)                          # ... and stops ci's small budgets
    est = cli.estimate_wall("guard", "laptop", measure=False)
    assert est["units"] / 1e6 <= 1200                                        # the plan's own estimate: 20 minutes
    doc = cli.run_experiment("guard", "laptop", "cpu", 0, smoke=True)
    k = {c["id"]: c for c in doc["claims"]}
    assert doc["config"]["smoke"] is True and doc["config"]["T"] == 4
    assert k["C3-position"]["verdict"] == "not_run" and k["C4-real-model"]["verdict"] == "not_run"
    assert k["C1-guarantee"]["verdict"] == "passed"


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
