"""Tests of iclr25_repro.rekv: the rotary map and the decoder against transformers' Llama, sliding-window encoding and
full retrieval against full attention, pre-RoPE representative keys, block scoring and frame selection, the KV-size
formula, the stored cache under questions, streaming against offline encoding, the world's invariants, bad inputs,
ReKV on a transformers Llama through its Cache, the key convolution of the context model (ReKV's store and answers
against one causal pass, its reach, bad settings), determinism, the claims' rules and gates on altered rows, the checks, the external arm's width, a tiny run and the laptop
and full presets' smoke runs."""
import dataclasses

import numpy as np
import pytest
import torch

from iclr25_repro.core import cli
from iclr25_repro.rekv import experiment
from iclr25_repro.rekv.model import (Decoder, DecoderConfig, ReKV, ReKVCache, SceneWorld, block_scores, kv_bytes, rope,
                                     select_frames, train_decoder, train_dual_encoder)
from helpers import with_metric


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    world = SceneWorld()
    dec = Decoder(DecoderConfig(world.vocab_size, rope_theta=1e6)).eval()
    v = world.videos(3, 20, 2, rng=0)
    return world, dec, v


def full_logits(world, dec, frames, q):
    B = frames.shape[0]
    ids = torch.cat([torch.tensor(world.sink_ids).expand(B, -1), torch.as_tensor(frames).reshape(B, -1), q], 1)
    with torch.no_grad():
        return dec(ids)[:, -1]


def test_rope_matches_transformers():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    cfg = DecoderConfig(vocab_size=30, rope_theta=1e6)
    x = torch.randn(2, 4, 6, cfg.head_dim)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 100, 101, 4000, 4001]])
    cos, sin = LlamaRotaryEmbedding(cfg.to_llama())(x, pos)
    # float32 angles at position 4000 agree to about 1e-4
    assert torch.allclose(rope(x, pos, 1e6), apply_rotary_pos_emb(x, x, cos, sin)[0], atol=1e-3)
    assert torch.allclose(rope(x[:1], pos[:1], 1e6), apply_rotary_pos_emb(x, x, cos, sin)[0][:1], atol=1e-5)


@pytest.mark.parametrize("heads,kv", [(4, 2), (4, 4), (4, 1)])
def test_decoder_matches_llama(heads, kv):
    torch.manual_seed(1)
    dec = Decoder(DecoderConfig(vocab_size=40, n_heads=heads, n_kv_heads=kv)).eval()
    ids = torch.randint(0, 40, (2, 33))
    with torch.no_grad():
        assert torch.allclose(dec(ids), dec.to_llama()(ids).logits, atol=1e-4)


@pytest.mark.parametrize("heads,kv,score", [(4, 2, "dot"), (4, 1, "cosine")])
def test_rekv_cache_on_transformers_llama(setup, heads, kv, score):
    "ReKVCache on a LlamaForCausalLM: all frames retrieved equals the model's own forward; a top-k equals ReKV."
    world, _, v = setup
    torch.manual_seed(2)
    dec = Decoder(DecoderConfig(world.vocab_size, n_layers=3, n_heads=heads, n_kv_heads=kv, rope_theta=1e6)).eval()
    llama = dec.to_llama()
    frames, q = torch.as_tensor(v["frames"]), torch.as_tensor(world.question(v["needle_shape"][:, 1]))
    full = ReKVCache(llama, world.sink_ids, 3, window=None, r=20, score=score).encode(frames)
    ids = torch.cat([torch.tensor(world.sink_ids).expand(3, -1), frames.reshape(3, -1), q], 1)
    with torch.no_grad():
        own = llama(ids).logits[:, -1]
    assert (full.answer(q) - own).abs().max() < 1e-4
    assert full.get_seq_length() == world.n_sinks + 20 * 3
    # a 6-frame window, top 4 frames in blocks of 2, read in two parts: ReKV's logits and frames on the same weights
    c = ReKVCache(llama, world.sink_ids, 3, window=6, r=4, b=2, score=score).encode(frames[:, :7]).encode(frames[:, 7:])
    rk = ReKV(dec, world.sink_ids, 3, window=6, r=4, b=2, score=score)
    ref, picks = rk.answer(rk.encode(frames), q)
    assert (c.answer(q) - ref).abs().max() < 1e-4
    assert all(torch.equal(a, b) for a, b in zip(c.picks, picks)) and c.picks[0].shape == (3, 4)
    with pytest.raises(ValueError, match="question must be"):
        c.answer(q[:1])
    with pytest.raises(ValueError, match="multiple of b"):
        ReKVCache(llama, world.sink_ids, 3, window=6, r=4, b=2).encode(frames[:, :7]).answer(q)
    with pytest.raises(ValueError, match="frames must be"):
        ReKVCache(llama, world.sink_ids, 3).encode(frames[..., :2])
    with pytest.raises(ValueError, match="causal LM"):
        ReKVCache(dec, world.sink_ids, 3)


def test_window_at_least_T_is_full_attention(setup):
    world, dec, v = setup
    q = torch.as_tensor(world.question(v["needle_shape"][:, 0]))
    rk = ReKV(dec, world.sink_ids, 3, window=20, r=20)
    cache = rk.encode(v["frames"])
    ref = full_logits(world, dec, v["frames"], q)
    for mode in ("full", "window", "rekv"):   # with r >= T ReKV retrieves everything
        logits, _ = rk.answer(cache, q, mode=mode)
        assert torch.allclose(logits, ref, atol=1e-4), mode
    # one-pass full attention gives the same store
    c_full = ReKV(dec, world.sink_ids, 3, window=None).encode(v["frames"])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(c_full.frame_k, cache.frame_k))


def test_narrow_window_changes_deeper_layers_only(setup):
    world, dec, v = setup
    wide = ReKV(dec, world.sink_ids, 3, window=None).encode(v["frames"])
    narrow = ReKV(dec, world.sink_ids, 3, window=2).encode(v["frames"])
    assert torch.allclose(wide.frame_k[0], narrow.frame_k[0], atol=1e-6)   # layer 0 keys: token embeddings only
    assert (wide.frame_k[1] - narrow.frame_k[1]).abs().max() > 1e-3


def test_representative_keys_are_pre_rope_and_position_free(setup):
    world, dec, v = setup
    frames = v["frames"].copy()
    frames[:, 15] = frames[:, 2]      # the same frame content at two times
    cache = ReKV(dec, world.sink_ids, 3, window=4).encode(frames)
    assert torch.allclose(cache.rep[0][:, 2], cache.rep[0][:, 15], atol=1e-6)
    k = cache.frame_k[0][:, :, 6:9].mean(2).repeat_interleave(2, 1).reshape(3, -1)
    assert torch.allclose(cache.rep[0][:, 2], k, atol=1e-6)


def test_scores_dot_and_cosine(setup):
    world, dec, v = setup
    q = torch.as_tensor(world.question(v["needle_shape"][:, 0]))
    dot, cos = ReKV(dec, world.sink_ids, 3, window=4, r=4), ReKV(dec, world.sink_ids, 3, window=4, r=4, score="cosine")
    cache = dot.encode(v["frames"])
    _, s_dot = dot.retrieve(cache, q)
    _, s_cos = cos.retrieve(cache, q)
    assert s_cos[1].abs().max() <= 1 + 1e-5 and not torch.allclose(s_dot[0], s_cos[0])
    # cosine = dot / (|q||k|): in layer 0 both passes share the question's query (it reads only embeddings), so the
    # ratio is constant per video once divided by the key norms
    ratio = s_dot[0] / s_cos[0] / cache.rep[0].norm(dim=-1)
    assert torch.allclose(ratio, ratio[:, :1].expand_as(ratio), rtol=1e-3)
    # deeper layers: with r >= T both retrieve every frame, so layer 1's query is shared too
    dot_all, cos_all = (ReKV(dec, world.sink_ids, 3, window=4, r=20, score=s) for s in ("dot", "cosine"))
    _, s_dot = dot_all.retrieve(cache, q)
    _, s_cos = cos_all.retrieve(cache, q)
    ratio = s_dot[1] / s_cos[1] / cache.rep[1].norm(dim=-1)
    assert torch.allclose(ratio, ratio[:, :1].expand_as(ratio), rtol=1e-3)


def test_retrieval_pass_reads_the_frames_each_layer_picked(setup):
    """Layer 1's query comes from a layer-0 pass over the sinks and layer 0's picks (as in the official code), not
    over the window: recompute it from a pass with that context and compare the scores."""
    world, dec, v = setup
    q = torch.as_tensor(world.question(v["needle_shape"][:, 0]))
    rk = ReKV(dec, world.sink_ids, 3, window=4, r=4)
    cache = rk.encode(v["frames"])
    picks, scores = rk.retrieve(cache, q)
    assert torch.equal(picks[1], select_frames(scores[1], 4, 1))

    def layer1_scores(idx0):
        seen = {}

        def fn(l, qq):
            if l == 1:
                seen["q"] = qq.mean(2).reshape(qq.shape[0], -1)
            ctx = rk._context(cache, l, idx0)
            return ctx, ctx.length[:, None] + torch.arange(q.shape[1])
        with torch.no_grad():
            dec(q, context_fn=fn, last_only=True)
        return torch.einsum("btd,bd->bt", cache.rep[1], seen["q"])

    assert torch.allclose(layer1_scores(picks[0]), scores[1], atol=1e-5)
    window = rk.frames_for(cache, "window")
    assert not torch.equal(picks[0].sort(1).values, window[:, -4:])       # the two contexts differ here
    assert not torch.allclose(layer1_scores(window), scores[1], atol=1e-3)


def test_padding_is_ignored(setup):
    world, dec, v = setup
    q = torch.as_tensor(world.question(v["needle_shape"][:, 0]))
    rk = ReKV(dec, world.sink_ids, 3, window=4, r=4)
    cache = rk.encode(v["frames"])
    two = torch.tensor([[2, 9], [0, 5], [11, 19]])
    ref, _ = rk.answer(cache, q, mode="frames", frames=two)
    for padded in (torch.cat([two, torch.full((3, 1), -1)], 1), torch.cat([torch.full((3, 2), -1), two], 1)):
        logits, picks = rk.answer(cache, q, mode="frames", frames=padded)
        assert torch.allclose(logits, ref, atol=1e-5)
        assert (picks[0][:, :2] == two).all() and (picks[0][:, 2:] == -1).all()


def test_blocks_with_a_partial_last_block(setup):
    world, dec, v = setup                      # 20 frames, blocks of 3: the last block holds frames 18 and 19
    q = torch.as_tensor(world.question(v["needle_shape"][:, 0]))
    rk = ReKV(dec, world.sink_ids, 3, window=4, r=6, b=3)
    cache = rk.encode(v["frames"])
    late = torch.arange(20.0).expand(3, -1)    # external scores favouring the end: blocks [18, 19] and [15, 16, 17]
    logits, picks = rk.answer(cache, q, mode="external", scores=late)
    assert picks[0].tolist() == [[15, 16, 17, 18, 19, -1]] * 3
    ref, _ = rk.answer(cache, q, mode="frames", frames=torch.arange(15, 20).expand(3, -1))
    assert torch.allclose(logits, ref, atol=1e-5)
    logits, picks = rk.answer(cache, q)        # end to end: every layer reads whole blocks, in time order
    assert torch.isfinite(logits).all()
    for p in picks:
        for row in p.tolist():
            row = [x for x in row if x >= 0]
            assert row == sorted(set(row)) and len(row) in (5, 6)
            blocks = {x // 3 for x in row}
            assert all(set(range(3 * k, min(3 * k + 3, 20))) <= set(row) for k in blocks)


def test_block_scores_and_selection():
    s = torch.tensor([[1.0, 3.0, 0.0, 0.0, 10.0], [5.0, 0.0, 0.0, 6.0, 0.0]])
    assert torch.allclose(block_scores(s, 2), torch.tensor([[2.0, 0.0, 10.0], [2.5, 3.0, 0.0]]))
    idx = select_frames(s, 2, 1)
    assert idx.tolist() == [[1, 4], [0, 3]]
    assert select_frames(s, 4, 2).tolist() == [[0, 1, 4, -1], [0, 1, 2, 3]]
    assert select_frames(s, 6, 1).tolist() == [[0, 1, 2, 3, 4, -1]] * 2
    big = torch.randn(4, 300)
    for b in (1, 2, 4, 8):
        sel = select_frames(big, 16, b)
        for row in sel.tolist():
            row = [x for x in row if x >= 0]
            assert row == sorted(set(row)) and len(row) <= 16
    with pytest.raises(ValueError, match="multiple of the block size"):
        select_frames(big, 6, 4)


def test_kv_bytes_formula(setup):
    world, dec, v = setup
    assert round(kv_bytes(28, 1800, 196, 4, 128) / 2**30, 1) == 18.8
    assert round(kv_bytes(24, 1800, 196, 2, 64) / 2**30, 1) == 4.0
    cache = ReKV(dec, world.sink_ids, 3, window=4).encode(v["frames"])
    assert cache.nbytes() == 3 * kv_bytes(2, 20, 3, 2, 16, bytes_per_value=4)
    with pytest.raises(ValueError):
        kv_bytes(2, -1, 3, 2, 16)


def test_questions_leave_the_cache_untouched_and_read_sinks(setup):
    world, dec, v = setup
    rk = ReKV(dec, world.sink_ids, 3, window=4, r=4)
    cache = rk.encode(v["frames"])
    before = [t.clone() for t in cache.frame_k + cache.frame_v + cache.rep + cache.sink_k]
    q = torch.as_tensor(world.question(v["needle_shape"][:, 1]))
    for mode in ("rekv", "window", "full"):
        rk.answer(cache, q, mode=mode)
    assert all(torch.equal(a, b) for a, b in zip(before, cache.frame_k + cache.frame_v + cache.rep + cache.sink_k))
    _, picks = rk.answer(cache, q)
    ctx = rk._context(cache, 1, picks[1])
    assert torch.equal(ctx.k[:, :, :world.n_sinks], cache.sink_k[1]) and ctx.mask[:, :world.n_sinks].all()


def test_external_and_oracle_modes(setup):
    world, dec, v = setup
    rk = ReKV(dec, world.sink_ids, 3, window=4, r=4)
    cache = rk.encode(v["frames"])
    q = torch.as_tensor(world.question(v["needle_shape"][:, 0]))
    scores = torch.zeros(3, 20)
    scores[torch.arange(3), torch.as_tensor(v["needle_frame"][:, 0])] = 1.0
    _, picks = rk.answer(cache, q, mode="external", scores=scores)
    assert all((p == torch.as_tensor(v["needle_frame"][:, 0])[:, None]).any(1).all() for p in picks)
    nf = torch.as_tensor(v["needle_frame"][:, :1])
    logits, picks = rk.answer(cache, q, mode="frames", frames=nf)
    # reading one frame equals a fresh causal pass over sinks + that frame (positions contiguous after the sinks)
    # only in layer 0, where the stored keys do not depend on context; check the positions instead
    ctx = rk._context(cache, 0, picks[0])
    assert ctx.pos.shape[1] == world.n_sinks + 3 and ctx.length.tolist() == [world.n_sinks + 3] * 3


def test_streaming_equals_offline(setup):
    world, dec, v = setup
    for window in (4, None):
        rk = ReKV(dec, world.sink_ids, 3, window=window)
        once = rk.encode(v["frames"])
        parts = rk.encode(v["frames"][:, :7])
        parts = rk.encode(v["frames"][:, 7:13], parts)
        parts = rk.encode(v["frames"][:, 13:], parts)
        for a, b in zip(once.frame_k + once.frame_v + once.rep, parts.frame_k + parts.frame_v + parts.rep):
            assert torch.allclose(a, b, atol=1e-5)


def test_world_invariants():
    world = SceneWorld()
    v = world.videos(50, 64, 4, rng=2, spread=True)
    shape = (v["frames"][..., 0] - world.obj0) // world.n_colours
    colour = (v["frames"][..., 0] - world.obj0) % world.n_colours
    rows = np.arange(50)[:, None]
    assert ((shape[:, :, None] == v["needle_shape"][:, None]).sum(1) == 1).all()
    assert (shape[rows, v["needle_frame"]] == v["needle_shape"]).all()
    assert (colour[rows, v["needle_frame"]] == v["needle_colour"]).all()
    assert ((v["needle_frame"] // 16) == np.arange(4)).all()        # spread: needle j in segment j
    ids, y = world.training_batch(5, 16, rng=0)
    k = y.shape[1]
    assert ids.shape == (5, world.n_sinks + 16 * 3 + 2 * k) and (ids[:, -2 * k::2] == world.q_token).all()
    assert ids.max() < world.vocab_size
    with pytest.raises(ValueError, match="n_needles"):
        world.videos(1, 3, 4, 0)
    # context questions: no needle in the last frame, the frame after each needle and its colour
    v = world.videos(200, 8, 4, rng=3, after=True)
    assert (v["needle_frame"] < 7).all() and (v["after_frame"] == v["needle_frame"] + 1).all()
    col = (v["frames"][..., 0] - world.obj0) % world.n_colours
    assert (col[np.arange(200)[:, None], v["after_frame"]] == v["after_colour"]).all()
    with pytest.raises(ValueError, match="n_needles"):
        world.videos(1, 4, 4, 0, after=True)
    aw = SceneWorld(after_frac=1.0)
    ids, y = aw.training_batch(5, 16, rng=0)
    k = y.shape[1]
    assert (ids[:, -2 * k::2] == aw.after_token).all() and aw.after_token == aw.vocab_size - 1
    # the answers are the colours of the frames after the needles
    frames = ids[:, aw.n_sinks:aw.n_sinks + 48].reshape(5, 16, 3)
    shapes = ids[:, -2 * k + 1::2] - aw.word0
    obj = frames[..., 0] - aw.obj0
    for i in range(5):
        for j in range(k):
            t = int(np.flatnonzero((obj[i] // aw.n_colours).numpy() == int(shapes[i, j]))[0])
            assert int(y[i, j]) == aw.colour_token(int(obj[i, t + 1]) % aw.n_colours)
    mixed = SceneWorld(after_frac=0.5).training_batch(400, 16, rng=1)[0]
    share = float((mixed[:, -2::2] == aw.after_token).float().mean())
    assert 0.4 < share < 0.6
    with pytest.raises(ValueError, match="after_frac"):
        SceneWorld(after_frac=1.5)


def test_bad_inputs(setup):
    world, dec, v = setup
    with pytest.raises(ValueError, match="r \\(frames retrieved\\)"):
        ReKV(dec, world.sink_ids, 3, r=0)
    with pytest.raises(ValueError, match="window must be at least one frame"):
        ReKV(dec, world.sink_ids, 3, window=0)
    with pytest.raises(ValueError, match="b must be"):
        ReKV(dec, world.sink_ids, 3, r=8, b=3)
    with pytest.raises(ValueError, match="score must be"):
        ReKV(dec, world.sink_ids, 3, score="l2")
    rk = ReKV(dec, world.sink_ids, 3)
    q = torch.as_tensor(world.question(v["needle_shape"][:, 0]))
    with pytest.raises(ValueError, match="no frame has been encoded"):
        rk.answer(None, q)
    with pytest.raises(ValueError, match="frames must be"):
        rk.encode(torch.zeros(3, 4, 2, dtype=torch.long))
    cache = rk.encode(v["frames"])
    with pytest.raises(ValueError, match="unknown mode"):
        rk.answer(cache, q, mode="bm25")
    with pytest.raises(ValueError, match="question must be"):
        rk.answer(cache, q[:1])
    with pytest.raises(ValueError, match="n_heads"):
        DecoderConfig(vocab_size=10, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="claim_frames"):
        experiment.Config(claim_frames=77)
    with pytest.raises(ValueError, match="context_from"):
        experiment.Config(context_conv=4, context_from=0)


def test_training_is_deterministic_and_learns():
    world = SceneWorld()
    cfg = DecoderConfig(world.vocab_size, rope_theta=1e6)
    a, la = train_decoder(world, cfg, 30, 16, 16, 3e-3, seed=5)
    b, lb = train_decoder(world, cfg, 30, 16, 16, 3e-3, seed=5)
    assert la == lb and all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert np.mean(la[-5:]) < np.mean(la[:5])
    e1, e2 = train_dual_encoder(world, 20, 16, 16, 1e-2, 3), train_dual_encoder(world, 20, 16, 16, 1e-2, 3)
    assert torch.equal(e1.frame.weight, e2.frame.weight)


@pytest.fixture(scope="module")
def tiny():
    return experiment.run(experiment.Config.preset("tiny"))


CLAIMS = {"C1-uniform", "C1-window", "C1-oracle", "C2-external"}
CHECKS = {"K1-amortised", "K2-no-future", "K3-kv-bytes", "K4-recall", "K5-tokens", "K6-deep"}


def test_tiny_run(tiny):
    again = experiment.run(experiment.Config.preset("tiny"))
    acc = lambda out: [(r["seed"], r["T"], r["arm"], r["accuracy"]) for r in out["rows"] if "accuracy" in r]
    assert acc(tiny) == acc(again)
    ids = {c["id"]: c for c in tiny["claims"]}
    assert set(ids) == CLAIMS | CHECKS
    assert {"ctx-train", *experiment.CONTEXT_ARMS} <= {r["arm"] for r in tiny["rows"]}   # the context model ran
    for k in ("K1-amortised", "K2-no-future", "K3-kv-bytes", "K5-tokens"):
        assert ids[k]["verdict"] == "passed", k
    for k, (delta, reason) in experiment.DELTAS.items():
        assert ids[k]["delta"] == delta and ids[k]["delta_reason"] == reason
        assert [g["threshold"] for g in ids[k]["gates"]] == [experiment.COMPETENT] * 2
    assert set(experiment.DELTAS) == CLAIMS
    assert ids["C1-uniform"]["better"] == "higher" and ids["C1-uniform"]["band"] is None
    assert ids["C1-oracle"]["band"] == [None, experiment.ORACLE_GAP]
    assert ids["C2-external"]["band"] == [-experiment.EXTERNAL_MARGIN, None]
    cfg = experiment.Config.preset("tiny")
    by_d = [r for r in tiny["rows"] if r["arm"] == "external-d"]
    assert sorted({r["d"] for r in by_d}) == sorted(cfg.external_dims) and all(0 <= r["recall"] <= 1 for r in by_d)


def test_external_arm_has_the_decoders_width():
    "The external arm's width is fixed by the principle 'the decoder's width' at every preset, and no free knob sets it."
    assert "dual_dim" not in {f.name for f in dataclasses.fields(experiment.Config)}
    world = SceneWorld()
    cfg = experiment.Config.preset("tiny", external_dims=(8, 256))
    rows = experiment.external_recall(world, cfg, seed=0, rng=np.random.default_rng(0))
    narrow, wide = (r["recall"] for r in rows)
    assert wide > narrow + 0.2          # the width matters: why it is fixed in advance


def _set(rows, metric, arm, T, by_seed):
    "A copy of rows with metric set, per seed, for one (arm, length) cell."
    return with_metric(rows, metric, by_seed, require_metric=True, arm=arm, T=T)


def test_claim_rules_follow_the_rows(tiny):
    cfg = experiment.Config.preset("tiny")
    seeds, T, T0 = tiny["seeds"], cfg.claim_frames, min(cfg.test_frames)
    s0, s1 = seeds
    verdicts = lambda rows: {c["id"]: c["verdict"] for c in experiment.make_claims(rows, seeds, cfg)}
    # a competent decoder: the oracle and full attention at the training length answer
    competent = _set(tiny["rows"], "accuracy", "full", T0, {s0: 1.0, s1: 1.0})

    def with_acc(rekv, other, oracle=(1.0, 1.0), rows=competent):
        rows = _set(rows, "accuracy", "rekv", T, {s0: rekv, s1: rekv + 0.011})
        for arm in ("uniform", "window", "external"):
            rows = _set(rows, "accuracy", arm, T, {s0: other, s1: other + 0.01})
        return verdicts(_set(rows, "accuracy", "oracle", T, dict(zip(seeds, oracle))))

    good, bad = with_acc(0.9, 0.2), with_acc(0.2, 0.9)
    for c in ("C1-uniform", "C1-window", "C2-external"):
        assert good[c] == "reproduced" and bad[c] == "not_reproduced", c
    # C1 against delta = 0.037: a tight gain of 2 points is real but smaller than matters; no gain rules delta out
    small, none = with_acc(0.22, 0.2), with_acc(0.2, 0.2)
    for c in ("C1-uniform", "C1-window"):
        assert small[c] == "partial" and none[c] == "not_reproduced", c
    # a noisy gain: the two-seed interval holds both 0 and delta
    rows = _set(_set(competent, "accuracy", "oracle", T, {s0: 1.0, s1: 1.0}), "accuracy", "rekv", T, {s0: 0.9, s1: 0.3})
    rows = _set(rows, "accuracy", "uniform", T, {s0: 0.3, s1: 0.4})
    assert verdicts(rows)["C1-uniform"] == "inconclusive"
    # C1-oracle, the band (None, 0.10) on oracle - ReKV: inside, across the edge, wholly beyond
    assert with_acc(0.85, 0.5, oracle=(0.9, 0.91))["C1-oracle"] == "reproduced" and bad["C1-oracle"] == "not_reproduced"
    rows = _set(competent, "accuracy", "rekv", T, {s0: 0.9, s1: 0.8})
    rows = _set(rows, "accuracy", "oracle", T, {s0: 0.9, s1: 0.95})
    assert verdicts(rows)["C1-oracle"] == "inconclusive"
    # external non-inferiority, the band (-0.05, None): 3 points worse is inside, 20 points worse is not, a noisy
    # difference across -0.05 does not decide
    assert with_acc(0.87, 0.9)["C2-external"] == "reproduced" and with_acc(0.7, 0.9)["C2-external"] == "not_reproduced"
    rows = _set(competent, "accuracy", "oracle", T, {s0: 1.0, s1: 1.0})
    rows = _set(_set(rows, "accuracy", "rekv", T, {s0: 0.9, s1: 0.8}), "accuracy", "external", T, {s0: 0.9, s1: 0.95})
    assert verdicts(rows)["C2-external"] == "inconclusive"
    # the gates: an oracle that does not answer, or full attention failing at the training length, leaves every
    # accuracy claim not_run whatever the gains
    weak_oracle = with_acc(0.9, 0.2, oracle=(0.5, 0.6))
    weak_full = with_acc(0.9, 0.2, rows=_set(competent, "accuracy", "full", T0, {s0: 0.5, s1: 0.5}))
    for c in CLAIMS:
        assert weak_oracle[c] == "not_run" and weak_full[c] == "not_run", c

    # K4, accuracy follows recall over (uniform, external, rekv, oracle): rising passes, falling fails
    def with_recall(sign):
        rows = tiny["rows"]
        for arm, rec in (("uniform", 0.1), ("external", 0.4), ("rekv", 0.7), ("oracle", 1.0)):
            acc = rec + (1 - rec) / 8
            rows = _set(rows, "recall_union", arm, T, {s0: rec, s1: rec})
            rows = _set(rows, "accuracy", arm, T, {s0: acc if sign > 0 else 1.1 - acc, s1: acc if sign > 0 else 1.1 - acc})
        return verdicts(rows)["K4-recall"]
    assert with_recall(+1) == "passed" and with_recall(-1) == "failed"
    # K5, tokens read: a ReKV that read more at the long video fails
    assert verdicts(_set(tiny["rows"], "tokens_read", "rekv", T, {s0: 99.0, s1: 99.0}))["K5-tokens"] == "failed"
    ct = experiment.cost_test(tiny["rows"], seeds, cfg)
    assert set(ct) >= {"rekv", "full", "T", "T0", "Tf"}
    # K6, the mechanism test: a layer >= 1 must find the frame after the needle in DEEP_RECALL of the context
    # questions, and full attention must answer them at the training length (the model learned them): on the context
    # questions, on the context model where the run trained one (tiny does), else on the main decoder
    assert experiment.has_context_model(tiny["rows"])
    main_only = [r for r in tiny["rows"] if not str(r.get("arm")).startswith("ctx-")]
    for rows, pre in ((tiny["rows"], "ctx-"), (main_only, "")):
        deep = _set(rows, "recall_l1", pre + "after-rekv", T, {s0: 0.5, s1: 0.6})
        learned = _set(deep, "accuracy", pre + "after-full", T0, {s0: 1.0, s1: 0.95})
        assert verdicts(learned)["K6-deep"] == "passed", pre
        assert verdicts(_set(deep, "accuracy", pre + "after-full", T0, {s0: 0.2, s1: 0.1}))["K6-deep"] == "failed", pre
        shallow = _set(learned, "recall_l1", pre + "after-rekv", T, {s0: 0.1, s1: 0.1})
        assert verdicts(_set(shallow, "recall_l0", pre + "after-rekv", T, {s0: 0.9, s1: 0.9}))["K6-deep"] == "failed", pre
    # the context model's arms, not the main decoder's, decide K6 when both are there
    other = _set(_set(tiny["rows"], "recall_l1", "after-rekv", T, {s0: 0.9, s1: 0.9}), "accuracy", "after-full", T0,
                 {s0: 1.0, s1: 1.0})
    other = _set(_set(other, "recall_l1", "ctx-after-rekv", T, {s0: 0.0, s1: 0.0}), "recall_l0", "ctx-after-rekv", T,
                 {s0: 0.9, s1: 0.9})
    assert verdicts(other)["K6-deep"] == "failed"


@pytest.mark.parametrize("scale", ["laptop", "full"])
def test_preset_smoke(tmp_path, scale):
    preset, smoke = experiment.Config.preset(scale), experiment.Config.preset(scale, smoke=True)
    for f in dataclasses.fields(preset):
        if f.name not in experiment.Config.SMOKE and f.name not in ("device", "smoke"):
            assert getattr(smoke, f.name) == getattr(preset, f.name), f.name
    doc = cli.run_experiment("rekv", scale, "cpu", 0, root=tmp_path, smoke=True)
    assert {c["id"] for c in doc["claims"]} == CLAIMS | CHECKS
    arms = {r["arm"] for r in doc["details"]}
    if scale == "full":
        assert {"rekv r=8", "rekv b=2"} <= arms
    assert not (tmp_path / "book").exists()


def test_presets_fit_their_budgets():
    "The full preset's dry-run estimate fits 10 minutes on one GPU at the stated rate."
    est = cli.estimate_wall("rekv", "full")
    assert est["seconds"] is not None and est["seconds"] <= 600


@pytest.fixture(scope="module")
def conv_setup(setup):
    world, _, v = setup
    torch.manual_seed(3)
    return world, Decoder(DecoderConfig(world.vocab_size, n_layers=3, rope_theta=1e6, key_conv=4)).eval(), v


@pytest.mark.parametrize("first", [0, 1])
def test_key_conv_rekv_equals_full_attention(setup, first):
    """A decoder with a key convolution (in every layer, or from layer 1 on): ReKV's store and answers equal one causal
    pass over sinks, frames and question."""
    world, _, v = setup
    torch.manual_seed(3)
    dec = Decoder(DecoderConfig(world.vocab_size, n_layers=3, rope_theta=1e6, key_conv=4, key_conv_from=first)).eval()
    B, S, M, T = 3, world.n_sinks, 3, 20
    q = torch.as_tensor(world.question(v["needle_shape"][:, 0], after=True))
    ids = torch.cat([torch.tensor(world.sink_ids).expand(B, -1), torch.as_tensor(v["frames"]).reshape(B, -1), q], 1)
    with torch.no_grad():
        ref, kv = dec(ids, return_kv=True)
    rk = ReKV(dec, world.sink_ids, M, window=T, r=T)
    cache = rk.encode(v["frames"])
    # the stored (post-convolution, pre-RoPE) keys are those of the full pass in every layer
    for l, (_, k, _) in enumerate(kv):
        assert torch.allclose(cache.frame_k[l], k[:, :, S:S + T * M], atol=1e-5), l
    for mode in ("full", "window", "rekv"):
        assert torch.allclose(rk.answer(cache, q, mode=mode)[0], ref[:, -1], atol=1e-4), mode
    # one pass, and three streamed parts, give the same store: the convolution's state crosses every call
    once = ReKV(dec, world.sink_ids, M, window=None).encode(v["frames"])
    parts = ReKV(dec, world.sink_ids, M, window=4)
    c = parts.encode(v["frames"][:, 13:], parts.encode(v["frames"][:, 7:13], parts.encode(v["frames"][:, :7])))
    narrow = ReKV(dec, world.sink_ids, M, window=4).encode(v["frames"])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(once.frame_k, cache.frame_k))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(c.frame_k + c.rep, narrow.frame_k + narrow.rep))
    # layer 0's keys read token embeddings only (through the convolution): a narrow window leaves them unchanged
    assert torch.allclose(once.frame_k[0], narrow.frame_k[0], atol=1e-5)
    assert (once.frame_k[1] - narrow.frame_k[1]).abs().max() > 1e-3
    # the question's own keys are never stored and the stream's convolution state is left as it was
    st = [None if s is None else s.clone() for s in cache.key_state]
    rk.answer(cache, q)
    assert all(a is b is None or torch.equal(a, b) for a, b in zip(st, cache.key_state))
    assert (cache.key_state[0] is None) == (first == 1)
    assert hasattr(dec.model.layers[0].self_attn, "k_conv") == (first == 0)


def test_key_conv_reaches_the_previous_frame(conv_setup):
    "Width M + 1 puts the previous frame's object token into the key of a frame's first token; width M does not."
    world, dec, v = conv_setup
    frames = torch.as_tensor(v["frames"][:1]).clone()
    other = frames.clone()
    other[0, 5, 0] = world.obj0 + (int(frames[0, 5, 0]) - world.obj0 + world.n_colours) % (world.n_shapes * world.n_colours)
    for width, reaches in ((4, True), (3, False)):
        torch.manual_seed(4)
        d = Decoder(DecoderConfig(world.vocab_size, n_layers=1, rope_theta=1e6, key_conv=width)).eval()
        rk = ReKV(d, world.sink_ids, 3, window=None)
        k0, k1 = rk.encode(frames).frame_k[0], rk.encode(other).frame_k[0]
        moved = (k0 - k1).abs().amax((0, 1, 3)) > 1e-6                     # (T*M,) tokens whose layer-0 key changed
        assert moved.nonzero().flatten().tolist() == ([15, 16, 17, 18] if reaches else [15, 16, 17])


def test_key_conv_bad_inputs(conv_setup):
    world, dec, _ = conv_setup
    with pytest.raises(ValueError, match="key_conv"):
        DecoderConfig(vocab_size=10, key_conv=-1)
    with pytest.raises(ValueError, match="key_conv_from"):
        DecoderConfig(vocab_size=10, n_layers=2, key_conv=4, key_conv_from=2)
    with pytest.raises(ValueError, match="no LlamaConfig twin"):
        dec.to_llama()
