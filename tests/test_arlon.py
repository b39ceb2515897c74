"""Tests of iclr25_repro.arlon: the tracker on generated videos, the latent VQ against scikit-learn and scipy, the
planner's loss against a hand computation, the zero-initialised injection, the DiT loss's fixed points, uncertainty
sampling's moments, bad inputs, determinism, a tiny run, the claims' rules on altered rows and the full preset's smoke
run."""
import dataclasses
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
from scipy.stats import entropy

from iclr25_repro.arlon import experiment
from iclr25_repro.arlon.model import (FIRST_FRAMES, INTENSITIES, SPRITE, THRESHOLD, ARLONPipeline, LatentVQ, PlanAR,
                                      VideoDiT, all_prompts, background, check_prompt, dit_loss, fit_dit, make_scheduler,
                                      make_videos, motion_metrics, prompt_ids, to_latent, track, uncertainty_sample)
from iclr25_repro.core import cli


@pytest.fixture(scope="module")
def data():
    v = make_videos([all_prompts()[i % 48] for i in range(96)], n_frames=16, seed=0)
    X = to_latent(v["frames"])
    vq = LatentVQ(32, 4, 4, seed=0).fit(X)
    return dict(v=v, X=X, vq=vq, pids=prompt_ids(v["prompts"]))


def test_tracker_reads_the_generated_videos():
    v = make_videos(all_prompts(), n_frames=40, seed=5)
    tr = track(v["frames"])
    assert tr["found"].all() and np.allclose(tr["centroid"], v["positions"] + SPRITE // 2)
    areas = {"square": 25, "plus": 9, "disk": 21}
    for k, p in enumerate(v["prompts"]):
        assert (tr["area"][k] == areas[p["shape"]]).all() and np.allclose(tr["intensity"][k], v["intensity"][k])
        assert p["intensity"] is None or v["intensity"][k] == p["intensity"]
        step = np.abs(np.diff(v["positions"][k], axis=0))
        assert (step <= p["speed"]).all() and (step.max() == p["speed"])        # bounces never add speed
    m = motion_metrics(v["frames"], v["frames"], v["prompts"])
    assert all(r["dynamic"] == 1 and r["consistency"] == 1 and r["missing"] == 0 for r in m)
    empty = torch.from_numpy(np.broadcast_to(background(16), v["frames"].shape).copy())
    gone = motion_metrics(empty, v["frames"], v["prompts"])
    assert all(r["missing"] == 1 and r["consistency"] == 0 and r["dynamic"] == 0 for r in gone)
    dim = v["frames"].clone()
    dim[v["frames"] > 0.3] = 0.45                                             # every sprite at intensity 0.45
    bright = [r for r, p in zip(motion_metrics(dim, v["frames"], v["prompts"]), v["prompts"]) if p["intensity"] == 1.0]
    assert all(r["consistency"] == 0 and r["missing"] == 0 for r in bright)


def test_unsaid_intensity_is_the_videos_own():
    unsaid = [p for p in all_prompts() if p["intensity"] is None]
    v = make_videos(unsaid * 4, n_frames=24, seed=7)
    assert set(v["intensity"].tolist()) == set(INTENSITIES)
    assert torch.equal(make_videos(unsaid, 24, seed=7)["frames"], v["frames"][:len(unsaid)])
    said = make_videos([dict(p, intensity=0.5) for p in unsaid], 24, seed=7)
    assert (said["intensity"] == 0.5).all()
    assert all(r["consistency"] == 1 for r in motion_metrics(v["frames"], v["frames"], v["prompts"]))
    # the second half at the other level: half the frames keep the video's own intensity
    x = v["frames"].clone()
    on = (x - torch.from_numpy(background(16))) > THRESHOLD
    other = torch.from_numpy(sum(INTENSITIES) - v["intensity"]).view(-1, 1, 1, 1).expand_as(x)
    x[:, 12:] = torch.where(on[:, 12:], other[:, 12:], x[:, 12:])
    assert all(r["consistency"] == 0.5 for r in motion_metrics(x, v["frames"], v["prompts"]))
    # a video whose first frames hold no sprite has no intensity to keep
    x[:, :FIRST_FRAMES] = torch.from_numpy(background(16))
    assert all(r["consistency"] == 0 and r["intensity_drift"] == 1 for r in motion_metrics(x, v["frames"], v["prompts"]))


def test_vq_against_sklearn_and_scipy(data):
    from sklearn.metrics import pairwise_distances_argmin
    vq, X = data["vq"], data["X"]
    z = vq.encode(X)
    pooled = vq.pool(X).reshape(-1, 16).numpy()
    assert np.array_equal(z.reshape(-1).numpy(), pairwise_distances_argmin(pooled, vq.codebook.numpy()))
    counts = np.bincount(z.reshape(-1).numpy(), minlength=vq.n_codes)
    assert np.isclose(vq.perplexity(z), np.exp(entropy(counts)))
    assert torch.equal(vq.encode(vq.decode(z)), z) and vq.perplexity(z) >= vq.n_codes / 4
    coarse = LatentVQ(8, 4, 8, seed=0).fit(X)
    assert float(((coarse.decode(coarse.encode(X)) - X) ** 2).mean()) > float(((vq.decode(z) - X) ** 2).mean())


def test_planner_loss_and_sampling(data):
    z = data["vq"].encode(data["X"])
    torch.manual_seed(0)
    ar = PlanAR(32, z.shape[1])
    with torch.no_grad():
        loss, _ = ar.loss(data["pids"][:6], z[:6])
        ids = torch.cat([ar.prefix(data["pids"][:6]), z[:6], torch.full((6, 1), ar.eos)], 1)
        logp = torch.log_softmax(ar.gpt(input_ids=ids, attention_mask=torch.ones_like(ids)).logits, -1)
    assert torch.allclose(loss, -logp[:, 4:-1].gather(-1, ids[:, 5:, None]).mean(), atol=1e-6)
    s = ar.sample(data["pids"][:5], seed=3, top_k=50)
    assert s.shape == (5, z.shape[1]) and int(s.max()) < 32 and torch.equal(s, ar.sample(data["pids"][:5], seed=3, top_k=50))


def test_zero_gate_and_dropped_plan(data):
    torch.manual_seed(1)
    dit = VideoDiT(window=10)
    for m in [b.ada.linear for b in dit.blocks] + [dit.final_mod, dit.out]:
        nn.init.normal_(m.weight, std=0.05)
    x, t, ref = torch.randn(3, 10, 16, 16), torch.tensor([5, 500, 900]), torch.zeros(3, 10)
    with torch.no_grad():
        base = dit(x, t, data["pids"][:3], ref)
        assert torch.equal(dit(x, t, data["pids"][:3], ref, plan=torch.randn(3, 10, 16, 16)), base)
        nn.init.normal_(dit.blocks[1].inject.gate.weight, std=0.05)
        assert not torch.allclose(dit(x, t, data["pids"][:3], ref, plan=torch.randn(3, 10, 16, 16)), base)
        assert torch.equal(dit(x, t, data["pids"][:3], ref), base)


@pytest.mark.parametrize("pred", ["sample", "epsilon"])
def test_dit_loss_fixed_points(data, pred):
    sched = make_scheduler(pred)
    x0 = torch.cat([data["X"][:32], data["X"][:32, :4]], 1)[:, :10]
    ref = torch.zeros(32, 10)
    ref[:, :2] = 1
    g = lambda: torch.Generator().manual_seed(0)
    with torch.no_grad():
        l0 = float(dit_loss(VideoDiT(), sched, x0, data["pids"][:32], ref, generator=g()))
    if pred == "sample":
        assert abs(l0 - float((x0[:, 2:] ** 2).mean())) < 1e-6
    else:
        assert abs(l0 - 1) < 3 * np.sqrt(2 / (32 * 8 * 256))

    class Oracle(nn.Module):
        def forward(self, x_in, t, pids, ref_mask, plan=None):
            if pred == "sample":
                return x0
            a = sched.alphas_cumprod[t].view(-1, 1, 1, 1)
            return (x_in - a.sqrt() * x0) / (1 - a).sqrt()

    assert float(dit_loss(Oracle(), sched, x0, data["pids"][:32], ref, generator=g())) < 1e-6


def test_uncertainty_sampling_moments():
    F = torch.rand(200, 8, 16, 16)
    lam, mu, sd = 0.5, -0.2, 0.3
    d = (uncertainty_sample(F, lam, mu, sd, 1.0, torch.Generator().manual_seed(0)) - F).reshape(-1)
    assert abs(float(d.mean()) - lam * mu) < 5 * lam * sd / np.sqrt(d.numel())
    assert abs(float(d.std()) - lam * sd) < 5 * lam * sd / np.sqrt(2 * d.numel())
    assert torch.equal(uncertainty_sample(F, 0.0, mu, sd, 1.0), F)
    assert torch.equal(uncertainty_sample(F, lam, mu, sd, 0.0), F)


def test_bad_inputs(data):
    pipe = ARLONPipeline(VideoDiT(window=10), data["vq"], None)
    p = all_prompts()[:2]
    with pytest.raises(ValueError, match="multiple of the segment"):
        pipe(p, n_frames=12, steps=2, plan=None)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="steps"):
            pipe(p, n_frames=8, steps=bad, plan=None)
    with pytest.raises(ValueError, match="unknown field"):
        pipe([dict(p[0], colour="red")], n_frames=8, steps=2, plan=None)
    with pytest.raises(ValueError, match="lacks"):
        check_prompt({"shape": "disk"})
    with pytest.raises(ValueError, match="must be one of"):
        check_prompt(dict(p[0], speed=3))
    with pytest.raises(ValueError, match="'ar'"):
        pipe(p, n_frames=8, steps=2, plan="ar")                      # no AR model in this pipeline
    with pytest.raises(ValueError, match="plan codes"):
        pipe(p, n_frames=8, steps=2, plan=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="window"):
        ARLONPipeline(VideoDiT(window=8), data["vq"], None, segment=8, n_ref=2)
    with pytest.raises(ValueError, match="not fitted"):
        LatentVQ().encode(data["X"])
    with pytest.raises(ValueError, match="codes must be in"):
        data["vq"].decode(torch.full((1, 4), 99))
    with pytest.raises(ValueError, match="square"):
        track(np.zeros((4, 8, 9)))
    with pytest.raises(ValueError, match="steps"):
        experiment.Config(steps=(5,))
    with pytest.raises(ValueError, match="multiple"):
        experiment.Config(n_frames=30)
    with pytest.raises(ValueError, match="between 1 and 24"):
        experiment.Config(unsaid_intensity=True, n_eval=30)
    assert len(experiment.eval_prompts(False)) == 48 and len(experiment.eval_prompts(True)) == 24


def test_determinism(data):
    a, b = make_videos(all_prompts()[:4], 16, seed=2), make_videos(all_prompts()[:4], 16, seed=2)
    assert torch.equal(a["frames"], b["frames"])
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        dit = VideoDiT(window=10)
        F = data["vq"].decode(data["vq"].encode(data["X"]))
        h = fit_dit(dit, data["X"], data["pids"], F, steps=3, batch=4, lam=0.3, noise_p=0.5, seed=1)
        out = ARLONPipeline(dit, data["vq"], None)(all_prompts()[:2], 8, 2,
                                                   plan=data["vq"].encode(data["X"][:2, :8]), seed=4)
        runs.append(([r["loss"] for r in h], out["frames"]))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])


@pytest.fixture(scope="module")
def tiny():
    return experiment.run(experiment.Config.preset("tiny"))


def test_tiny_run(tiny):
    cfg = experiment.Config.preset("tiny")
    ids = {c["id"]: c for c in tiny["claims"]}
    assert set(ids) == {"C1-dynamic", "C1-consistency", "C2", "C3", "K1", "K2", "K3", "K4"}
    assert all(ids[k]["verdict"] == "passed" for k in ("K2", "K3", "K4"))
    rollouts = [r for r in tiny["rows"] if r["kind"] == "rollout"]
    assert len(rollouts) == cfg.n_seeds * cfg.n_eval * len(experiment.arms(cfg))
    assert tiny["examples"]["true"].shape == (cfg.n_examples, cfg.n_frames, cfg.size, cfg.size)
    again = experiment.run(cfg)
    key = lambda out: [(r.get("plan"), r.get("consistency"), r.get("dynamic")) for r in out["rows"]]
    assert key(tiny) == key(again)


def fake_rows(c1=0.2, dyn=0.3, c2=0.2, c3=0.2, oracle=0.9, ar_acc=0.6, spread=0.02, n_seeds=2, n_eval=6, harm=0.1):
    "Rows with chosen effects: consistency and dynamic degree per arm, with a small per-prompt spread."
    cfg = experiment.Config.preset("ci", n_seeds=n_seeds, n_eval=n_eval)
    hi, lo = cfg.steps[0], cfg.steps[-1]
    rng = np.random.default_rng(0)
    rows = []
    for s in range(n_seeds):
        rows.append(dict(seed=s, kind="seed", ar_acc=ar_acc, true_dynamic=1.0, true_consistency=1.0, true_missing=0.0,
                         vq_idempotent=True, vq_perplexity=40.0, mse_fine=0.1, mse_coarse=0.12))
        for k in range(n_eval):
            e = lambda: float(rng.normal(0, spread))
            base = 0.5
            cons = {("noise-tolerant", "none", hi): base, ("noise-tolerant", "AR", hi): base + c1,
                    ("noise-tolerant", "oracle", hi): oracle,
                    ("noise-tolerant", "none", lo): base - 0.3, ("noise-tolerant", "AR", lo): base + c1 - 0.3 + c2,
                    ("noise-tolerant", "oracle", lo): oracle - 0.1,
                    ("noise-tolerant", "AR-corrupted", hi): base + c1 - harm,
                    ("plain", "AR", hi): base + c1, ("plain", "AR-corrupted", hi): base + c1 - harm - c3}
            for (d, p, st), c in cons.items():
                dynamic = {"none": 0.5, "AR": 0.5 + dyn, "oracle": 0.95}.get(p, 0.7) + e()
                rows.append(dict(seed=s, kind="rollout", prompt=k, dit=d, plan=p, steps=st, consistency=c + e(),
                                 dynamic=dynamic, missing=0.0, adherence_px={"none": 4.0, "AR": 2.0}.get(p, 1.0)))
    return rows, list(range(n_seeds)), cfg


def test_claim_rules_follow_the_rows():
    def verdicts(**kw):
        rows, seeds, cfg = fake_rows(**kw)
        return {c["id"]: c["verdict"] for c in experiment.make_claims(rows, seeds, cfg)}

    good = verdicts()
    assert [good[c] for c in ("C1-dynamic", "C1-consistency", "C2", "C3", "K1")] == ["reproduced"] * 4 + ["passed"]
    assert verdicts(c1=0.02, spread=0.005)["C1-consistency"] == "partial"       # more consistent, by less than delta
    slow = verdicts(dyn=-0.2)                                                   # the plan slows the sprite down
    assert slow["C1-dynamic"] == "not_reproduced" and slow["C1-consistency"] == "reproduced"
    flat = verdicts(oracle=0.53, c1=0.0)                                        # even the true plan adds no consistency
    assert flat["C1-consistency"] == "not_run" and flat["C1-dynamic"] == "reproduced"
    assert verdicts(c2=0.0, spread=0.2)["C2"] == "inconclusive"      # too noisy to tell
    assert verdicts(c2=-0.1)["C2"] == "not_reproduced"
    assert verdicts(c3=0.01, spread=0.005)["C3"] == "partial"
    assert verdicts(c3=-0.1, harm=0.2)["C3"] == "not_reproduced"
    harmless = verdicts(harm=0.0, c3=0.02)                                      # the corruption costs nothing
    assert harmless["C3"] == "not_run" and harmless["C2"] == "reproduced"
    gated = verdicts(oracle=0.3)                                      # the DiT cannot render even the true plan
    assert all(gated[c] == "not_run" for c in ("C1-dynamic", "C1-consistency", "C2", "C3")) and gated["K1"] == "failed"
    assert all(v == "not_run" for c, v in verdicts(ar_acc=0.1).items() if c.startswith("C"))
    rows, seeds, cfg = fake_rows()
    recs = {c["id"]: c for c in experiment.make_claims(rows, seeds, cfg)}
    assert recs["C2"]["delta"] == experiment.DELTAS["C2"][0] and recs["C1-consistency"]["interval"]["n"] == 12


def test_full_smoke(tmp_root):
    full, smoke = experiment.Config.preset("full"), experiment.Config.preset("full", smoke=True, device="cpu")
    for f in dataclasses.fields(full):   # model sizes, arms and phases stay at the full preset
        if f.name not in experiment.Config.SMOKE and f.name not in ("device", "smoke"):
            assert getattr(smoke, f.name) == getattr(full, f.name), f.name
    start = time.perf_counter()
    doc = cli.run_experiment("arlon", "full", "cpu", 0, smoke=True)
    assert doc["scale"] == "full" and doc["config"]["smoke"] is True and doc["claims"]
    ablated = {r["dit"] for r in doc["details"] if r.get("kind") == "rollout"} - {"noise-tolerant", "plain"}
    assert ablated == set(experiment.ABLATIONS)          # every ablation DiT rendered, and only on the first seed
    assert {r["seed"] for r in doc["details"] if r.get("dit") in ablated} == {0}
    assert not (tmp_root / "book" / "results").exists()
    assert time.perf_counter() - start < 60


def test_plan_modes_and_adapter(data):
    x, t, ref = torch.randn(3, 10, 16, 16), torch.tensor([5, 500, 900]), torch.zeros(3, 10)
    plan = torch.randn(3, 10, 16, 16)
    torch.manual_seed(2)
    cat = VideoDiT(window=10, plan_mode="concat")
    assert cat.patch_in.in_features == 3 * 16 and VideoDiT(window=10).patch_in.in_features == 2 * 16
    nn.init.normal_(cat.out.weight, std=0.05)
    with torch.no_grad():
        out = cat(x, t, data["pids"][:3], ref, plan=plan)
        assert out.shape == x.shape
        # no plan reads as a plan of zeros; a plan changes the output (no zero gate on this path)
        assert torch.equal(cat(x, t, data["pids"][:3], ref), cat(x, t, data["pids"][:3], ref, plan=torch.zeros_like(x)))
        assert not torch.allclose(out, cat(x, t, data["pids"][:3], ref))
    # without the adapter the injection's gate is still zero at initialisation: the plan changes nothing
    torch.manual_seed(3)
    bare = VideoDiT(window=10, adapter_blocks=0)
    assert len(bare.adapter.blocks) == 0
    h = torch.randn(2, 5, 32)
    assert torch.equal(bare.adapter(h), h)
    nn.init.normal_(bare.out.weight, std=0.05)
    with torch.no_grad():
        assert torch.equal(bare(x, t, data["pids"][:3], ref, plan=plan), bare(x, t, data["pids"][:3], ref))
    with pytest.raises(ValueError, match="plan_mode"):
        VideoDiT(plan_mode="add")
    with pytest.raises(ValueError, match="adapter_blocks"):
        VideoDiT(adapter_blocks=-1)
    with pytest.raises(ValueError, match="plan must have the shape"):
        cat(x, t, data["pids"][:3], ref, plan=plan[:, :8])
    # every plan mode trains a step
    hist = fit_dit(cat, data["X"][:8], data["pids"][:8], data["X"][:8], steps=2, batch=4, seed=0)
    assert len(hist) == 2 and np.isfinite(hist[-1]["loss"])


def test_progressive_plan_and_rollout(data):
    codes = data["vq"].encode(data["X"])
    torch.manual_seed(0)
    ar = PlanAR(32, codes.shape[1])
    p = all_prompts()[5]
    full = ar.sample(prompt_ids([p]), seed=4)
    kept = ar.sample(prompt_ids([p]), seed=9, codes=full[:, :2])
    assert kept.shape == full.shape and torch.equal(kept[:, :2], full[:, :2])
    assert torch.equal(ar.sample(prompt_ids([p]), seed=9, codes=full), full)       # nothing left to sample
    assert torch.equal(ar.sample(prompt_ids([p]), seed=4, codes=full[:, :0]), full)  # no codes kept: a plain sample
    with pytest.raises(ValueError, match="codes must be"):
        ar.sample(prompt_ids([p]), codes=torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="codes must be in"):
        ar.sample(prompt_ids([p]), codes=torch.full((1, 1), 99))
    torch.manual_seed(0)
    pipe = ARLONPipeline(VideoDiT(window=10), data["vq"], ar)
    seg = experiment.progressive_prompts(p, 2)
    assert seg[0] == p and seg[1]["direction"] == 3 - p["direction"] and seg[1]["speed"] == 3 - p["speed"]
    out = pipe.progressive(seg, steps=2, seed=0)
    assert out["frames"].shape == (1, 16, 16, 16) and out["codes"].shape == (1, 4) and out["plan"].shape == (1, 16, 16, 16)
    # one prompt in every segment with the plan dropped is the ordinary rollout without a plan
    same = pipe.progressive([p, p], steps=2, plan=False, seed=0)
    assert same["codes"] is None and torch.equal(same["frames"], pipe([p], n_frames=16, steps=2, plan=None, seed=0)["frames"])
    with pytest.raises(ValueError, match="segment prompts"):
        pipe.progressive([p] * 3, steps=2)
    with pytest.raises(ValueError, match="none"):
        pipe.progressive([], steps=2)
    with pytest.raises(ValueError, match="steps"):
        pipe.progressive(seg, steps=0)
    with pytest.raises(ValueError, match="unknown field"):
        pipe.progressive([dict(p, colour="red"), p], steps=2)


def test_ablations_only_in_the_full_preset():
    for scale in ("tiny", "ci", "laptop"):
        cfg = experiment.Config.preset(scale)
        assert not cfg.ablations and not cfg.progressive
        assert all(d in ("noise-tolerant", "plain") for d, _, _ in experiment.arms(cfg))
    full = experiment.Config.preset("full")
    assert full.ablations and full.progressive
    names = {d for d, _, _ in experiment.arms(full)}
    assert set(experiment.ABLATIONS) <= names
    on = experiment.plan(full)
    off = experiment.plan(experiment.Config.preset("full", ablations=False, progressive=False))
    assert sum(p["units"] for p in on) > sum(p["units"] for p in off)
