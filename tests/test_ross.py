"""Tests of iclr25_repro.ross: the scene generator's answers against a reading of the pixels, POPE's negatives, the
visual-token / latent-token alignment, the zero gradient at the image positions under the text loss, the cosine
schedule against its closed form, the denoising loss at initialisation and with an oracle, repeated draws, identical
inference logits, the metrics against scikit-learn, EfficientNet-Lite0 on real photos, bad inputs, determinism, the
claims' rules on altered rows, a tiny run and the full preset's smoke run."""
import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from iclr25_repro.core import cli
from iclr25_repro.ross import experiment
from iclr25_repro.ross.model import (CELL, COLOUR_NAMES, PAIR_FREQ, PAIRS, SHAPES, CellAutoencoder, EfficientNetEncoder,
                                     RandomConvEncoder, RossModel, answer, ask, cell_pixels, encode_conversations, fit,
                                     fit_autoencoder, make_scenes, probe_r2, qa_metrics, shape_mask, evaluation_questions,
                                     training_questions, visual_tokens, vocabulary, with_position_code)
from helpers import with_metric

PALETTE = np.array([(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.2, 0.4, 1.0), (1.0, 1.0, 0.0), (1.0, 0.0, 1.0), (0.0, 1.0, 1.0)])


def read_cell(patch):
    "(colour, shape, size) of an 8 x 8 x 3 patch read from its pixels alone; None for an empty cell."
    lit = patch.max(-1) > 0.5
    if not lit.any():
        return None
    colour = int(np.argmin(((PALETTE - patch[lit].mean(0)) ** 2).sum(1)))
    rows, cols = np.flatnonzero(lit.any(1)), np.flatnonzero(lit.any(0))
    box = lit[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    size = int(box.shape[0] > 3)
    corners = box[0, 0] and box[-1, -1]
    shape = 1 if not corners else (2 if not box[box.shape[0] // 2, box.shape[1] // 2] else 0)
    return colour, shape, size


def read_scene(image, grid):
    return [read_cell(image[r * CELL:(r + 1) * CELL, c * CELL:(c + 1) * CELL]) for r in range(grid) for c in range(grid)]


@pytest.mark.parametrize("grid,max_objects", [(3, 4), (4, 9)])
def test_answers_match_a_reading_of_the_pixels(grid, max_objects):
    sc = make_scenes(150, seed=7, grid=grid, max_objects=max_objects)
    seen = [read_scene(im, grid) for im in sc.images]
    for cells, a in zip(seen, sc.attrs):
        assert [None if x[0] < 0 else tuple(int(v) for v in x) for x in a] == cells
    for q in evaluation_questions(sc, seed=7) + [dict(x, image=i) for i, c in enumerate(training_questions(sc, 4, seed=7))
                                           for x in c]:
        cells = [c for c in seen[q["image"]] if c is not None]
        w = q["words"]
        if q["kind"] == "fine":
            c = seen[q["image"]][int(w[-1][4:])]
            assert q["answer"] == ("none" if c is None else COLOUR_NAMES[c[0]])
        elif q["kind"] == "count":
            assert q["answer"] == str(sum(c[0] == COLOUR_NAMES.index(w[-1]) for c in cells))
        else:
            pair = (COLOUR_NAMES.index(w[3]), SHAPES.index(w[4]))
            assert q["answer"] == ("yes" if pair in {(c[0], c[1]) for c in cells} else "no")


def test_pope_negatives_and_balance():
    sc = make_scenes(300, seed=3)
    rng = np.random.default_rng(0)
    n_adv = 0
    for a in sc.attrs:
        present = {(int(c), int(s)) for c, s, _ in a[a[:, 0] >= 0]}
        absent = [p for p in PAIRS if p not in present]
        q = ask(a, "pope", rng, 3, negative="popular")
        assert (COLOUR_NAMES.index(q["words"][3]), SHAPES.index(q["words"][4])) == absent[0]
        assert PAIR_FREQ[PAIRS.index(absent[0])] == max(PAIR_FREQ[PAIRS.index(p)] for p in absent)
        q = ask(a, "pope", rng, 3, negative="adversarial")
        if q is None:
            continue
        n_adv += 1
        c, s = COLOUR_NAMES.index(q["words"][3]), SHAPES.index(q["words"][4])
        assert (c, s) not in present and c in {p[0] for p in present} and s in {p[1] for p in present}
        assert q["answer"] == "no"
    assert n_adv > 100
    tq = evaluation_questions(sc, seed=3)
    for split in ("random", "popular", "adversarial"):
        ans = [q["answer"] for q in tq if q.get("split") == split]
        assert len(ans) > 0 and ans.count("yes") == ans.count("no")


def test_generator_is_deterministic():
    a, b = make_scenes(20, seed=5), make_scenes(20, seed=5)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.attrs, b.attrs)
    assert not np.array_equal(a.images, make_scenes(20, seed=6).images)
    assert training_questions(a, 3, seed=1) == training_questions(b, 3, seed=1)
    assert evaluation_questions(a, seed=1) == evaluation_questions(b, seed=1)


@pytest.fixture(scope="module")
def batch():
    sc = make_scenes(32, seed=0)
    vocab = vocabulary()
    conv = encode_conversations(training_questions(sc, 3, seed=0), vocab)
    feats, _ = visual_tokens(RandomConvEncoder(64, seed=0), sc.images, grid=3)
    latents = CellAutoencoder(8).encode(sc.images).detach()
    return sc, vocab, conv, feats, latents, cell_pixels(sc.images, 3)


def test_alignment_of_tokens_and_latents(batch):
    sc = batch[0]
    img = sc.images[:1]
    rc, tok, en = RandomConvEncoder(64, seed=0), CellAutoencoder(8), EfficientNetEncoder()
    f0, z0, e0 = rc(img)[0], tok.encode(img)[0].detach(), en(img)[0]
    for cell in range(9):
        r, c = divmod(cell, 3)
        x = img.copy()
        x[:, r * CELL:(r + 1) * CELL, c * CELL:(c + 1) * CELL] = np.random.default_rng(cell).random((CELL, CELL, 3))
        want = [j == cell for j in range(9)]
        assert ((rc(x)[0] - f0).abs().sum(-1) > 0).tolist() == want
        assert ((tok.encode(x)[0].detach() - z0).abs().sum(-1) > 0).tolist() == want
        assert int((en(x)[0] - e0).abs().sum(-1).argmax()) == cell
    px = cell_pixels(sc.images, 3)
    assert torch.allclose(px[0, 5].reshape(8, 8, 3), torch.as_tensor(sc.images[0, 8:16, 16:24]) * 2 - 1)
    vt, _ = visual_tokens(rc, sc.images, grid=3)
    assert vt.shape == (32, 9, 70) and torch.equal(vt[0, 7, -6:], torch.tensor([0., 0., 1., 0., 1., 0.]))


def _image_grad(vision_loss, batch, which, moved=False):
    _, vocab, conv, feats, latents, pixels = batch
    torch.manual_seed(0)
    m = RossModel(feats.shape[-1], len(vocab), 9, vision_loss=vision_loss)
    if moved:
        nn.init.normal_(m.denoiser.out.weight, std=0.02)
    out = m(feats, conv, latents=latents, pixels=pixels)
    (g,) = torch.autograd.grad(out["lm_loss"] if which == "text" else out["loss"], [out["image_hidden"]],
                               allow_unused=True)
    return 0.0 if g is None else float(g.norm())


def test_text_loss_gives_zero_gradient_at_the_final_image_states(batch):
    for vl in (None, "regress", "denoise"):
        assert _image_grad(vl, batch, "text") == 0.0
    assert _image_grad(None, batch, "total") == 0.0
    assert _image_grad("denoise", batch, "total") == 0.0          # zero output layer: no path to z at step 0
    assert _image_grad("denoise", batch, "total", moved=True) > 0
    assert _image_grad("regress", batch, "total") > 0


def test_schedule_is_the_cosine_schedule(batch):
    feats, vocab = batch[3], batch[1]
    ac = RossModel(feats.shape[-1], len(vocab), 9, vision_loss="denoise").scheduler.alphas_cumprod.double().numpy()
    f = lambda u: np.cos((u + 0.008) / 1.008 * np.pi / 2) ** 2
    t = np.arange(1000)
    beta = np.minimum(1 - f((t + 1) / 1000) / f(t / 1000), 0.999)
    assert np.allclose(ac, np.cumprod(1 - beta), rtol=1e-5, atol=1e-9)


def test_denoising_loss_at_initialisation_and_with_an_oracle(batch):
    _, vocab, conv, feats, latents, _ = batch
    torch.manual_seed(1)
    m = RossModel(feats.shape[-1], len(vocab), 9, vision_loss="denoise", reps=4)
    with torch.no_grad():
        z = m.cond_norm(m.hidden_states(feats)[:, 1:])
        l0 = float(m.denoise_loss(z, latents))
    assert abs(l0 - 1) < 3 * math.sqrt(2 / (4 * latents.numel()))
    ac, x0 = m.scheduler.alphas_cumprod, latents.repeat(4, 1, 1)

    class Oracle(nn.Module):
        def forward(self, x_t, t, z):
            a = ac[t].view(-1, 1, 1)
            return (x_t - a.sqrt() * x0) / (1 - a).sqrt()

    m.denoiser = Oracle()
    with torch.no_grad():
        assert float(m.denoise_loss(z, latents)) < 1e-6
    # given eps and t, the loss is a deterministic function of them
    m2 = RossModel(feats.shape[-1], len(vocab), 9, vision_loss="denoise", reps=1)
    eps, t = torch.randn_like(latents), torch.randint(0, 1000, (len(latents),))
    with torch.no_grad():
        assert float(m2.denoise_loss(z, latents, eps=eps, t=t)) == float(m2.denoise_loss(z, latents, eps=eps, t=t))


def test_repeated_draws_keep_the_mean(batch):
    _, vocab, _, feats, latents, _ = batch
    torch.manual_seed(2)
    m = RossModel(feats.shape[-1], len(vocab), 9, vision_loss="denoise", reps=1)
    nn.init.normal_(m.denoiser.out.weight, std=0.5)
    with torch.no_grad():
        z = m.cond_norm(m.hidden_states(feats[:8])[:, 1:])
        draws = {}
        for r in (1, 4):
            m.reps = r
            draws[r] = np.array([float(m.denoise_loss(z, latents[:8])) for _ in range(200)])
    se = math.sqrt(draws[1].var() / 200 + draws[4].var() / 200)
    assert abs(draws[1].mean() - draws[4].mean()) < 4 * se
    assert 2.5 < draws[1].var() / draws[4].var() < 6.5


def test_inference_ignores_the_vision_heads_and_variants_share_their_init(batch):
    _, vocab, conv, feats, latents, pixels = batch
    q = conv[:8, 0, :5]
    logits = {}
    for vl in (None, "regress", "denoise"):
        torch.manual_seed(3)
        m = RossModel(feats.shape[-1], len(vocab), 9, vision_loss=vl)
        fit(m, feats, conv, latents, pixels, steps=3, batch=8, seed=0)
        bare = copy.deepcopy(m)
        for attr in ("denoiser", "regressor", "scheduler"):
            if hasattr(bare, attr):
                delattr(bare, attr)
        assert torch.equal(bare.answer_logits(feats[:8], q), m.answer_logits(feats[:8], q))
        torch.manual_seed(3)
        logits[vl] = RossModel(feats.shape[-1], len(vocab), 9, vision_loss=vl).answer_logits(feats[:8], q)
    assert torch.equal(logits[None], logits["regress"]) and torch.equal(logits[None], logits["denoise"])


def test_reconstruct_and_autoencoder(batch):
    sc, vocab, _, feats, _, _ = batch
    ae, mse = fit_autoencoder(sc.images, latent_dim=8, steps=30, seed=0)
    z = ae.encode(sc.images)
    assert z.shape == (32, 9, 8) and abs(float(z.mean())) < 1e-4 and abs(float(z.std()) - 1) < 0.05
    assert ae.decode(z, 3).shape == (32, 24, 24, 3) and mse > 0
    m = RossModel(feats.shape[-1], len(vocab), 9, vision_loss="denoise")
    x = m.reconstruct(feats[:2], steps=5, seed=0)
    assert x.shape == (2, 9, 8) and torch.equal(x, m.reconstruct(feats[:2], steps=5, seed=0))


def test_qa_metrics_against_sklearn():
    from sklearn.metrics import accuracy_score, f1_score
    sc = make_scenes(120, seed=4)
    qs = evaluation_questions(sc, seed=4)
    rng = np.random.default_rng(0)
    words = vocabulary()
    pred = [q["answer"] if rng.random() < 0.6 else str(rng.choice(words)) for q in qs]
    pred = [("yes" if rng.random() < 0.7 else "no") if q["kind"] == "pope" and rng.random() < 0.5 else p
            for q, p in zip(qs, pred)]
    met = qa_metrics(qs, pred)
    fine = [i for i, q in enumerate(qs) if q["kind"] == "fine"]
    assert met["fine_acc"] == pytest.approx(accuracy_score([qs[i]["answer"] for i in fine], [pred[i] for i in fine]))
    for s in ("random", "popular", "adversarial"):
        idx = [i for i, q in enumerate(qs) if q.get("split") == s]
        y, p = [qs[i]["answer"] == "yes" for i in idx], [pred[i] == "yes" for i in idx]
        assert met[f"pope_{s}_acc"] == pytest.approx(np.mean([qs[i]["answer"] == pred[i] for i in idx]))
        assert met[f"pope_{s}_f1"] == pytest.approx(f1_score(y, p))
        assert met[f"pope_{s}_yes"] == pytest.approx(np.mean(p))
    assert qa_metrics(qs, [q["answer"] for q in qs])["well_formed"] == 1.0
    assert met["well_formed"] < 1.0


def test_probe_r2_against_a_reference():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 10))
    assert probe_r2(X, X @ rng.normal(size=10)) > 0.99
    assert probe_r2(X, rng.normal(size=300)) < 0.05


def test_efficientnet_classifies_the_sample_photos():
    from sklearn.datasets import load_sample_images
    from iclr25_repro.core.pretrained import load_image_encoder
    net = load_image_encoder().eval()
    top5 = {}
    for name, im in zip(("china", "flower"), load_sample_images().images):
        x = torch.as_tensor(np.asarray(im, dtype=np.float32) / 255).permute(2, 0, 1)[None]
        x = torch.nn.functional.interpolate(x, size=(224, 224), mode="bilinear", antialias=True, align_corners=False)
        with torch.no_grad():
            top5[name] = net(x * 2 - 1)[0].topk(5).indices.tolist()
    # china.jpg is a temple: bell cote 442, castle 483, dome 538, monastery 663, stupa 832; flower.jpg: daisy 985
    assert set(top5["china"]) & {442, 483, 538, 663, 832}, top5
    assert 985 in top5["flower"], top5


def test_bad_inputs(batch):
    _, vocab, conv, feats, latents, _ = batch
    V = len(vocab)
    with pytest.raises(ValueError, match="shape must be"):
        shape_mask(3, 0)
    with pytest.raises(ValueError, match="grid"):
        make_scenes(4, seed=0, grid=1)
    with pytest.raises(ValueError, match="max_objects"):
        make_scenes(4, seed=0, grid=3, max_objects=10)
    a = make_scenes(1, seed=0).attrs[0]
    with pytest.raises(ValueError, match="kind"):
        ask(a, "size", np.random.default_rng(0), 3)
    with pytest.raises(ValueError, match="cell"):
        ask(a, "fine", np.random.default_rng(0), 3, cell=9)
    with pytest.raises(ValueError, match="negative"):
        ask(a, "pope", np.random.default_rng(0), 3, negative="hard")
    with pytest.raises(ValueError, match="vocabulary"):
        encode_conversations([[dict(words=["which", "colour", "is", "in", "cell12"], answer="red")]], vocab)
    with pytest.raises(ValueError, match="multiple of 8"):
        RandomConvEncoder(8)(np.zeros((2, 20, 20, 3)))
    with pytest.raises(ValueError, match="H = W"):
        RandomConvEncoder(8)(np.zeros((2, 16, 24, 3)))
    with pytest.raises(ValueError, match="tokens"):
        with_position_code(torch.zeros(2, 8, 4), grid=3)
    with pytest.raises(ValueError, match="vision_loss"):
        RossModel(10, V, 9, vision_loss="pixels")
    with pytest.raises(ValueError, match="square"):
        RossModel(10, V, 8)
    m = RossModel(feats.shape[-1], V, 9, vision_loss="denoise")
    with pytest.raises(ValueError, match="feats"):
        m.hidden_states(torch.zeros(2, 4, feats.shape[-1]))
    with pytest.raises(ValueError, match="latents"):
        m(feats, conv)
    with pytest.raises(ValueError, match="pixels"):
        RossModel(feats.shape[-1], V, 9, vision_loss="regress")(feats, conv)
    with pytest.raises(ValueError, match="reconstruct"):
        RossModel(feats.shape[-1], V, 9, vision_loss=None).reconstruct(feats)
    with pytest.raises(ValueError, match="steps"):
        fit(m, feats, conv, latents, steps=0)
    with pytest.raises(ValueError, match="predictions"):
        qa_metrics([dict(answer="yes", kind="pope")], [])
    with pytest.raises(ValueError, match="at least 6"):
        probe_r2(np.zeros((4, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="encoders"):
        experiment.Config(encoders=("clip",))
    with pytest.raises(ValueError, match="n_seeds"):
        experiment.Config(n_seeds=1)
    with pytest.raises(ValueError, match="lm_sizes"):
        experiment.Config(lm_sizes=((50, 2),))


def test_training_is_deterministic_and_learns(batch):
    _, vocab, conv, feats, latents, pixels = batch
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        m = RossModel(feats.shape[-1], len(vocab), 9, vision_loss="denoise")
        hist = fit(m, feats, conv, latents, pixels, steps=40, batch=16, seed=0, log_every=10)
        runs.append((hist, [p.detach().clone() for p in m.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert runs[0][0][-1]["lm_loss"] < runs[0][0][0]["lm_loss"]


@pytest.fixture(scope="module")
def tiny():
    return experiment.run(experiment.Config.preset("tiny"))


def test_tiny_run(tiny):
    again = experiment.run(experiment.Config.preset("tiny"))
    key = lambda out: [(r["seed"], r["encoder"], r["variant"], r["fine_acc"], r["probe_final"]) for r in out["rows"]]
    assert key(tiny) == key(again)
    ids = {c["id"]: c for c in tiny["claims"]}
    assert set(ids) == {"C1-random", "C1-efficientnet", "C1-POPE", "C2-pixels", "C2-latent", "C3", "K1", "K2"}
    assert ids["K1"]["verdict"] == "passed" and ids["K2"]["verdict"] == "passed"
    cfg = experiment.Config.preset("tiny")
    assert len(tiny["rows"]) == cfg.n_seeds * len(cfg.encoders) * len(cfg.lm_sizes) * len(experiment.VARIANTS) == 16
    assert tiny["recon"] is not None and len(tiny["recon"]["denoiser"]) == cfg.recon_images


def test_claim_rules_follow_the_rows(tiny):
    cfg = experiment.Config.preset("tiny")
    seeds = tiny["seeds"]
    s0, s1 = seeds
    verdicts = lambda rows: {c["id"]: c["verdict"] for c in experiment.make_claims(rows, seeds, cfg)}

    def rows_with(d_fine, d_pope, base_fine=0.8, base_pope=0.7, r_fine=None, probe=(0.8, 0.7), features=0.9, use=1.5):
        rows = with_metric(tiny["rows"], "probe_features", {s0: features, s1: features})
        rows = with_metric(rows, "cond_use", {s0: use, s1: use}, variant="ROSS-D")
        for metric, v in (("fine_acc", base_fine), ("pope_adversarial_acc", base_pope)):
            for arm in ("baseline", "ROSS-R", "ROSS-R-latent"):
                rows = with_metric(rows, metric, {s0: v, s1: v + 0.01}, variant=arm)
        if r_fine is not None:
            rows = with_metric(rows, "fine_acc", {s0: r_fine, s1: r_fine + 0.01}, variant="ROSS-R")
        rows = with_metric(rows, "fine_acc", {s0: base_fine + d_fine[0], s1: base_fine + 0.01 + d_fine[1]}, variant="ROSS-D")
        rows = with_metric(rows, "pope_adversarial_acc", {s0: base_pope + d_pope[0], s1: base_pope + 0.01 + d_pope[1]},
                           variant="ROSS-D")
        rows = with_metric(rows, "probe_read", {s0: probe[0], s1: probe[0] + 0.01}, variant="ROSS-D")
        rows = with_metric(rows, "probe_read", {s0: probe[1], s1: probe[1] + 0.01}, variant="baseline")
        return verdicts(rows)

    claims = ("C1-random", "C1-efficientnet", "C1-POPE", "C2-pixels", "C2-latent", "C3")
    good = rows_with((0.1, 0.1), (0.1, 0.1))
    assert all(good[c] == "reproduced" for c in claims)
    flat = rows_with((0.1, 0.1), (0.0, 0.0))                                        # POPE did not move
    assert flat["C1-POPE"] == "not_reproduced" and flat["C1-random"] == "reproduced"
    assert rows_with((0.1, 0.1), (0.2, -0.1))["C1-POPE"] == "inconclusive"         # two seeds disagree
    assert rows_with((0.1, 0.1), (0.01, 0.01))["C1-POPE"] == "partial"             # real but below delta
    assert rows_with((-0.1, -0.1), (0.1, 0.1))["C1-efficientnet"] == "not_reproduced"
    assert rows_with((0.01, 0.01), (0.1, 0.1))["C1-random"] == "partial"
    pixels = rows_with((0.1, 0.1), (0.1, 0.1), r_fine=0.95)                       # regressing pixels wins
    assert pixels["C2-pixels"] == "not_reproduced" and pixels["C2-latent"] == "reproduced"
    assert rows_with((0.1, 0.1), (0.1, 0.1), probe=(0.7, 0.8))["C3"] == "not_reproduced"
    assert rows_with((0.1, 0.1), (0.1, 0.1), probe=(0.72, 0.7))["C3"] == "partial"
    gated = rows_with((0.1, 0.1), (0.1, 0.1), base_fine=0.5)                       # the baseline did not learn
    assert all(gated[c] == "not_run" for c in claims)
    ignored = rows_with((0.1, 0.1), (0.1, 0.1), use=1.02)                          # the denoiser ignores its condition
    assert all(ignored[c] == "not_run" for c in claims)
    ceiling = rows_with((0.01, 0.01), (0.1, 0.1), base_fine=0.97)                  # no room for a gain
    assert ceiling["C1-random"] == ceiling["C1-efficientnet"] == "not_run" and ceiling["C2-latent"] != "not_run"
    chance = rows_with((0.1, 0.1), (0.1, 0.1), base_pope=0.5)                      # no binding to improve on
    assert chance["C1-POPE"] == "not_run" and chance["C1-random"] == "reproduced"
    absent = rows_with((0.1, 0.1), (0.1, 0.1), features=0.3)                       # the detail is not in the features
    assert absent["C3"] == "not_run" and absent["C1-random"] == "reproduced"
    recs = {c["id"]: c for c in experiment.make_claims(tiny["rows"], seeds, cfg)}
    for cid in claims:
        assert recs[cid]["delta"] == experiment.DELTAS[cid.split("-")[0]][0] and recs[cid]["delta_reason"]


def test_condition_use_detects_an_ignored_condition(batch):
    "condition_use is about 1 for a denoiser that ignores z (zero output layer) and above 1 once z matters."
    sc, vocab, conv, feats, latents, pixels = batch
    m = RossModel(feats.shape[-1], len(vocab), 9, vision_loss="denoise", reps=2)
    assert abs(experiment.condition_use(m, feats, latents, seed=0) - 1) < 1e-6   # output layer at zero
    fit(m, feats, conv, latents, steps=30, batch=16, lr=3e-3, seed=0)
    assert experiment.condition_use(m, feats, latents, seed=0) > 1


def test_full_smoke(tmp_path):
    full, smoke = experiment.Config.preset("full"), experiment.Config.preset("full", smoke=True)
    for f in dataclasses.fields(full):
        if f.name not in experiment.Config.SMOKE and f.name not in ("device", "smoke"):
            assert getattr(smoke, f.name) == getattr(full, f.name), f.name
    assert full.lm_sizes == ((256, 6), (128, 6)) and full.encoders == ("random", "efficientnet")
    assert full.grid == 6 and full.max_objects == 12 and full.n_train * full.questions_per_image == 100_000
    doc = cli.run_experiment("ross", "full", "cpu", 0, root=tmp_path, smoke=True)
    assert {c["id"] for c in doc["claims"]} == {"C1-random", "C1-efficientnet", "C1-POPE", "C2-pixels", "C2-latent", "C3", "K1", "K2"}
    assert {(r["lm"], r["variant"]) for r in doc["details"]} == {
        (lm, v) for lm in ("256x6", "128x6") for v in experiment.VARIANTS}
    assert not (tmp_path / "book").exists()
