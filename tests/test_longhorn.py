"""Tests of iclr25_repro.longhorn: the closed-form update against a linear solve, the chunked scan against the
sequential loop (values and gradients, several chunk sizes), the decay bounds, causality, step-by-step decoding, the
transformers-style loss, the transformers interface (padding, generate, save_pretrained, Trainer), the Mamba-style layer
against transformers' MambaMixer, the explicit delta-rule baseline, the MQAR and text generators, bad inputs, determinism,
the claims' rules, a tiny run of the experiment and the full preset's smoke run."""
import math

import numpy as np
import pytest
import torch

from iclr25_repro.longhorn import experiment
from iclr25_repro.longhorn.model import (ExplicitDeltaLayer, LonghornLayer, MambaStyleLayer, SSMBlock, SSMCache,
                                         SSMConfig, SSMForCausalLM, SSMMixer, diagonal_coefficients, explicit_update,
                                         implicit_update, llama_baseline, conv_llama_baseline, ShortConv, mqar, query_accuracy, scan_chunked,
                                         scan_sequential)


def lm_(vocab_size, d_model=16, n_layer=2, **kw):
    return SSMForCausalLM(SSMConfig(vocab_size=vocab_size, d_model=d_model, n_layer=n_layer, **kw))


def test_closed_form_equals_linear_solve_and_contracts_the_residual():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        N = int(torch.randint(2, 9, (1,), generator=g))
        k, s = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)
        x, beta = torch.tensor(0.3, dtype=torch.float64), torch.rand(1, generator=g, dtype=torch.float64)[0] * 5
        closed = implicit_update(s, k, x, beta)                       # the package
        solve = torch.linalg.solve(torch.eye(N, dtype=torch.float64) + beta * torch.outer(k, k), s + beta * k * x)
        assert torch.allclose(closed, solve, atol=1e-12)
        assert float(closed @ k - x) == pytest.approx(float((s @ k - x) / (1 + beta * k @ k)), abs=1e-12)
        # the explicit step is one gradient step of size beta on (s^T k - x)^2 / 2, by autograd
        s_ = s.clone().requires_grad_(True)
        grad = torch.autograd.grad(0.5 * (s_ @ k - x) ** 2, s_)[0]
        assert torch.allclose(explicit_update(s, k, x, beta), s - beta * grad, atol=1e-12)
        # the diagonal coefficients: exact for a one-hot key, the implicit step's decays within [1/(1+beta|k|^2), 1]
        e = torch.zeros(N, dtype=torch.float64)
        e[int(torch.randint(0, N, (1,), generator=g))] = 1.0
        a, u = diagonal_coefficients(beta.reshape(1), e, x.reshape(1))
        assert torch.allclose(a[0] * s + u[0], implicit_update(s, e, x, beta), atol=1e-14)
        a, _ = diagonal_coefficients(beta.reshape(1), k, x.reshape(1))
        assert (a <= 1).all() and (a >= 1 / (1 + beta * k @ k) - 1e-12).all()
        a_exp, _ = diagonal_coefficients(beta.reshape(1), k, x.reshape(1), implicit=False)
        assert torch.allclose(a_exp[0], 1 - beta * k * k)
    # a wrong closed form (the explicit step) fails the linear solve: the test can fail
    assert not torch.allclose(explicit_update(s, k, x, beta), solve, atol=1e-6)


@pytest.mark.parametrize("L", [1, 7, 16, 33])
@pytest.mark.parametrize("chunk", [1, 3, 16, 64])
def test_chunked_scan_equals_the_sequential_loop_with_gradients(L, chunk):
    g = torch.Generator().manual_seed(L * 100 + chunk)
    a = torch.rand(2, L, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.randn(2, L, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    s0 = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, L, 3, 2, generator=g, dtype=torch.float64)
    ref, par = scan_sequential(a, u, s0), scan_chunked(a, u, s0, chunk)
    assert torch.allclose(ref, par, atol=1e-12)
    for x, y in zip(torch.autograd.grad((ref * w).sum(), (a, u, s0)), torch.autograd.grad((par * w).sum(), (a, u, s0))):
        assert torch.allclose(x, y, atol=1e-12)


def test_chunked_scan_gradcheck():
    g = torch.Generator().manual_seed(3)
    a = torch.rand(1, 9, 2, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.randn(1, 9, 2, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, u: scan_chunked(a, u, chunk=4), (a, u))


def test_long_sequences_do_not_underflow():
    S = scan_chunked(torch.full((1, 3000, 2), 0.5), torch.ones(1, 3000, 2), chunk=32)
    assert torch.isfinite(S).all() and torch.allclose(S[0, 200:], torch.full((2800, 2), 2.0))


def test_longhorn_decays_within_the_bounds_and_mamba_in_unit_interval():
    torch.manual_seed(0)
    for kind in ("longhorn", "mamba"):
        m = SSMMixer(16, d_state=4, expand=2, kind=kind)
        with torch.no_grad():
            m.x_proj.weight.mul_(20)   # large keys and step sizes
        m.record = True
        m(torch.randn(3, 12, 16))
        a = m.last["a"]
        assert (a >= -1e-6).all() and (a <= 1 + 1e-6).all()   # float32 rounding at most
        if kind == "longhorn":
            beta, k = m.last["beta"], m.last["k"]
            lower = 1 / (1 + beta * (k * k).sum(-1, keepdim=True))
            assert (a >= lower.unsqueeze(-1) - 1e-6).all()
            assert (1 - beta * (k * k).sum(-1, keepdim=True) < -1).any()   # the explicit step would be unstable here


@pytest.mark.parametrize("kind", ["longhorn", "mamba"])
def test_layer_is_causal_and_scans_agree(kind):
    torch.manual_seed(1)
    m = SSMMixer(16, d_state=4, expand=1, kind=kind, scan="chunked", chunk=4)
    seq = SSMMixer(16, d_state=4, expand=1, kind=kind, scan="sequential")
    seq.load_state_dict(m.state_dict())
    h = torch.randn(2, 21, 16)
    h2 = h.clone()
    h2[:, 13] += 1.0
    d = (m(h2) - m(h)).abs().amax(dim=(0, 2))
    assert d[:13].max() == 0 and d[13] > 0
    assert torch.allclose(m(h), seq(h), atol=1e-5)


@pytest.mark.parametrize("kind", ["longhorn", "mamba", "explicit"])
def test_step_by_step_decoding_equals_the_parallel_forward(kind):
    torch.manual_seed(6)
    lm = lm_(20, kind=kind, d_state=4, expand=2, chunk=4).double()
    ids = torch.randint(0, 20, (2, 13))
    full = lm(ids).logits
    cache, rec = None, []
    for t in range(ids.shape[1]):
        logits, cache = lm.step(ids[:, t], cache)
        rec.append(logits)
    assert torch.allclose(torch.stack(rec, 1), full, atol=1e-10)
    assert [tuple(c.shape) for c in cache[0]] == [(2, 32, 4), (2, 32, 4)]


def test_parameter_counts_differ_by_the_decay_rates():
    lh, mb = LonghornLayer(32, d_state=8), MambaStyleLayer(32, d_state=8)
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(mb) - count(lh) == lh.d_inner * lh.d_state


def test_lm_loss_matches_transformers_convention():
    from transformers.loss.loss_utils import ForCausalLMLoss
    torch.manual_seed(2)
    lm = lm_(20, d_state=4, expand=1)
    ids = torch.randint(0, 20, (2, 11))
    labels = torch.where(torch.rand(2, 11) < 0.5, ids, -100)
    out = lm(input_ids=ids, labels=labels)
    assert out.logits.shape == (2, 11, 20)
    assert torch.allclose(out.loss, ForCausalLMLoss(out.logits, labels, vocab_size=20))
    assert lm(ids).loss is None


def test_llama_baseline_builds_offline():
    m = llama_baseline(16, d_model=16, n_layer=1, n_heads=2)
    out = m(input_ids=torch.randint(0, 16, (1, 5)), labels=torch.randint(0, 16, (1, 5)))
    assert out.logits.shape == (1, 5, 16) and torch.isfinite(out.loss)


def test_short_conv_is_causal_depthwise_and_has_shapes():
    torch.manual_seed(0)
    conv = ShortConv(6, d_conv=4)
    x = torch.randn(2, 12, 6)
    y = conv(x)
    assert y.shape == x.shape
    for t in (0, 5, 11):   # the output at t depends on inputs t - 3 .. t only, channel by channel
        x2 = x.clone()
        x2[:, t, 2] += 1.0
        d = (conv(x2) - y).abs()
        assert d[:, :t].sum() == 0 and d[:, t:t + 4, 2].min() > 0 and d[:, t + 4:].sum() == 0
        assert torch.cat([d[..., :2], d[..., 3:]], -1).sum() == 0
    for bad in (dict(channels=0), dict(channels=4, d_conv=0), dict(channels=True)):
        with pytest.raises(ValueError):
            ShortConv(**{"channels": 4, **bad})
    with pytest.raises(ValueError, match="expected"):
        conv(torch.randn(2, 12, 5))


def test_conv_llama_is_causal_generates_and_trains():
    torch.manual_seed(0)
    m = conv_llama_baseline(16, d_model=16, n_layer=2, n_heads=2)
    assert all(isinstance(l.self_attn.k_proj[1], ShortConv) for l in m.model.layers)
    ids = torch.randint(0, 16, (2, 10))
    with torch.no_grad():
        out = m(input_ids=ids).logits
        ids2 = ids.clone()
        ids2[:, 6] = (ids2[:, 6] + 1) % 16
        out2 = m(input_ids=ids2).logits
    assert out.shape == (2, 10, 16) and torch.equal(out[:, :6], out2[:, :6]) and not torch.equal(out[:, 6:], out2[:, 6:])
    gen = m.generate(ids[:, :5], attention_mask=torch.ones(2, 5, dtype=torch.long), max_new_tokens=3,
                     do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ref = ids[:, :5]
        for _ in range(3):
            ref = torch.cat([ref, m(input_ids=ref).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(gen, ref)
    # it trains: on one MQAR batch the loss falls and the convolution's weights receive gradients
    ids, labels = mqar(8, 16, 2, 16, torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        loss = m(input_ids=ids, labels=labels).loss
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        assert m.model.layers[0].self_attn.k_proj[1].conv1d.weight.grad.abs().sum() > 0
        opt.step()
    assert float(loss) < 0.5 * first


def test_mqar_structure():
    ids, labels = mqar(16, 40, 5, 24, torch.Generator().manual_seed(0))
    assert ids.shape == labels.shape == (16, 40)
    for b in range(16):
        keys, vals = ids[b, 0:10:2], ids[b, 1:10:2]
        assert len(set(keys.tolist())) == 5 and (keys >= 1).all() and (keys < 12).all() and (vals >= 12).all()
        q = (labels[b] != -100).nonzero().squeeze(1)
        assert len(q) == 5
        pairs = dict(zip(keys.tolist(), vals.tolist()))
        for i in q.tolist():
            assert pairs[ids[b, i - 1].item()] == ids[b, i].item() == labels[b, i].item()


def test_query_accuracy_of_a_constant_model():
    ids, labels = mqar(8, 16, 2, 8, torch.Generator().manual_seed(1))

    class Const:
        def __call__(self, input_ids):
            logits = torch.zeros(*input_ids.shape, 8)
            logits[..., 4] = 1.0
            return type("O", (), {"logits": logits})()
    target = labels[:, 1:][labels[:, 1:] != -100]
    assert query_accuracy(Const(), ids, labels) == pytest.approx(float((target == 4).float().mean()))


@pytest.mark.parametrize("call, match", [
    (lambda: scan_sequential(torch.rand(2, 3), torch.rand(2, 4)), "same shape"),
    (lambda: scan_chunked(torch.rand(2, 3), torch.rand(2, 3).double()), "dtype"),
    (lambda: scan_chunked(torch.rand(2, 3), torch.rand(2, 3), chunk=0), "chunk"),
    (lambda: scan_chunked(torch.rand(2, 3, 4), torch.rand(2, 3, 4), s0=torch.rand(2, 3)), "s0"),
    (lambda: scan_sequential(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)), "floating"),
    (lambda: SSMMixer(8, kind="rwkv"), "kind"),
    (lambda: SSMMixer(8, scan="fft"), "scan"),
    (lambda: SSMMixer(8, d_state=0), "d_state"),
    (lambda: SSMMixer(8, kind="mamba", key_norm=True), "key_norm"),
    (lambda: SSMMixer(8)(torch.randn(2, 5, 7)), "expected a float tensor"),
    (lambda: SSMMixer(8)(torch.randn(2, 5, 8), torch.ones(2, 4)), "mask"),
    (lambda: lm_(10, 8, 1)(torch.randn(2, 5)), "int64"),
    (lambda: lm_(10, 8, 1)(torch.full((1, 3), 10)), r"\[0, 10\)"),
    (lambda: lm_(10, 8, 1)(torch.zeros(1, 3, dtype=torch.long), labels=torch.zeros(1, 4, dtype=torch.long)), "labels"),
    (lambda: lm_(10, 8, 1)(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 4)), "attention_mask"),
    (lambda: SSMConfig(vocab_size=1), "vocab_size"),
    (lambda: SSMConfig(n_layer=0), "n_layer"),
    (lambda: SSMConfig(kind="gla"), "kind"),
    (lambda: SSMConfig(tie_word_embeddings=False), "ties"),
    (lambda: SSMForCausalLM(10), "SSMConfig"),
    (lambda: mqar(2, 10, 4, 32), "length"),
    (lambda: mqar(2, 64, 16, 32), "n_pairs"),
    (lambda: llama_baseline(10, d_model=10, n_heads=4), "divisible"),
    (lambda: experiment.build("GLA", experiment.Config.preset("tiny"), 16, 32), "unknown model"),
    (lambda: scan_chunked(torch.rand(2, 0, 3), torch.rand(2, 0, 3)), "length >= 1"),
    (lambda: lm_(10, 8, 1).step(torch.zeros(2, 3, dtype=torch.long)), "token"),
    (lambda: SSMMixer(8).step(torch.randn(2, 5, 8)), "expected a float tensor"),
    (lambda: lm_(10, 8, 2).step(torch.zeros(2, dtype=torch.long), cache=[None]), "one entry per layer"),
    (lambda: lm_(10, 8, 1).step(torch.full((2,), 10)), r"\[0, 10\)"),
    (lambda: experiment.Config.preset("tiny", warmup=0), "warmup"),
    (lambda: experiment.Config.preset("tiny", n_seeds=1), "n_seeds"),
    (lambda: experiment.Config.preset("tiny", models=("Longhorn", "Llama")), "models"),
    (lambda: experiment.Config.preset("tiny", length_factors=(2, 4)), "length_factors"),
    (lambda: experiment.Config.preset("tiny", pairs=(20,)), "pairs"),
    (lambda: experiment.Config.preset("tiny", lrs=(0.0,)), "lrs"),
    (lambda: experiment.Config.preset("tiny", lm_steps=-1), "lm_steps"),
    (lambda: experiment.decay_stats(LonghornLayer(8), torch.zeros(1, 4, dtype=torch.long)), "longhorn"),
    (lambda: experiment.decay_stats(lm_(10, 8, 1, kind="mamba"), torch.zeros(1, 4, dtype=torch.long)), "longhorn"),
    (lambda: query_accuracy(lm_(10, 8, 1), torch.zeros(1, 4, dtype=torch.long), torch.full((1, 4), -100)),
     "no labelled"),
    (lambda: query_accuracy(lm_(10, 8, 1), torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long)),
     "labels"),
    (lambda: experiment.synthetic_corpus(2, 8, 16, 0, copy_prob=1.0), "copy_prob"),
    (lambda: experiment.loglog_slope([{"scan": "chunked", "length": L, "seconds": 1.0} for L in (8, 16)] * 3, "chunked"),
     "three or more"),
    (lambda: experiment.Config.preset("tiny", lm_models=("Longhorn", "Llama")), "lm_models"),
])
def test_bad_inputs_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _reference(m, h):
    "Token-by-token loop of the official recurrence (selective_scan_online7_ref semantics), the explicit step or Mamba's S6."
    L = h.shape[1]
    xz = h @ m.in_proj.weight.T
    x, z = xz[..., :m.d_inner], xz[..., m.d_inner:]
    x = torch.nn.functional.silu(torch.nn.functional.conv1d(x.transpose(1, 2), m.conv1d.weight, m.conv1d.bias,
                                                            padding=m.d_conv - 1, groups=m.d_inner)[..., :L]).transpose(1, 2)
    S = torch.zeros(h.shape[0], m.d_inner, m.d_state, dtype=h.dtype)
    ys = []
    for t in range(L):
        p = x[:, t] @ m.x_proj.weight.T
        dt, k, q = p[:, :m.dt_rank], p[:, m.dt_rank:m.dt_rank + m.d_state], p[:, m.dt_rank + m.d_state:]
        r = dt @ m.dt_proj.weight.T + m.dt_proj.bias
        if m.kind != "mamba":
            if m.key_norm:
                k = k / k.norm(dim=-1, keepdim=True)
            e = torch.sigmoid(r)
            if m.kind == "longhorn":
                e = e / (1 + e * (k ** 2).sum(-1, keepdim=True))
            S = (1 - e[:, :, None] * k[:, None] ** 2) * S + (e * x[:, t])[:, :, None] * k[:, None]
        else:
            e = torch.nn.functional.softplus(r)
            S = torch.exp(-e[:, :, None] * torch.exp(m.A_log)[None]) * S + (e * x[:, t])[:, :, None] * k[:, None]
        ys.append(((S * q[:, None]).sum(-1) + m.D * x[:, t]) * torch.nn.functional.silu(z[:, t]))
    return torch.stack(ys, 1) @ m.out_proj.weight.T


@pytest.mark.parametrize("kind, key_norm", [("longhorn", False), ("longhorn", True), ("mamba", False),
                                            ("explicit", False), ("explicit", True)])
@pytest.mark.parametrize("scan", ["chunked", "sequential"])
def test_layer_matches_the_token_by_token_reference(kind, key_norm, scan):
    torch.manual_seed(4)
    m = SSMMixer(16, d_state=4, expand=2, kind=kind, scan=scan, chunk=4, key_norm=key_norm).double()
    h = torch.randn(2, 11, 16, dtype=torch.float64)
    assert torch.allclose(m(h), _reference(m, h), atol=1e-10)


def test_mamba_style_layer_is_transformers_mamba_mixer():
    from transformers import MambaConfig
    from transformers.models.mamba.modeling_mamba import MambaMixer
    torch.manual_seed(7)
    ours = MambaStyleLayer(32, d_state=8, expand=2).double()
    hf = MambaMixer(MambaConfig(hidden_size=32, state_size=8, expand=2, conv_kernel=4, time_step_rank=ours.dt_rank,
                                use_bias=False, use_conv_bias=True, hidden_act="silu"), layer_idx=0).double().eval()
    hf.load_state_dict(ours.state_dict(), strict=True)
    h = torch.randn(3, 17, 32, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(ours(h), hf(h), atol=1e-10)


def test_explicit_step_is_stable_with_normalised_keys_and_not_without():
    torch.manual_seed(8)
    for key_norm in (False, True):
        m = ExplicitDeltaLayer(16, d_state=4, expand=1, key_norm=key_norm)
        with torch.no_grad():
            m.x_proj.weight.mul_(20)   # large keys
        m.record = True
        m(torch.randn(2, 12, 16))
        a, k = m.last["a"], m.last["k"]
        if key_norm:
            assert torch.allclose(k.norm(dim=-1), torch.ones(k.shape[:-1]), atol=1e-5)
            assert (a >= 0).all() and (a <= 1).all()   # 1 - beta k_n^2 with |k| = 1 and beta < 1
        else:
            assert (a < -1).any()                       # the explicit step leaves the stable range
        beta = m.last["beta"]
        assert torch.allclose(a, 1 - beta.unsqueeze(-1) * (k * k).unsqueeze(-2))


def test_block_is_the_residual_of_the_normed_mixer():
    torch.manual_seed(9)
    b = SSMBlock(16, d_state=4, expand=1).double()
    h = torch.randn(2, 7, 16, dtype=torch.float64)
    assert torch.allclose(b(h), h + b.mixer(b.norm(h)))
    out, cache = b.step(h[:, 0])
    assert torch.allclose(out, b(h[:, :1])[:, 0])


@pytest.mark.parametrize("kind", ["longhorn", "mamba"])
def test_left_padding_changes_nothing_at_the_real_positions(kind):
    torch.manual_seed(10)
    lm = lm_(20, kind=kind, d_state=4).double()
    ids = torch.randint(1, 20, (3, 8))
    pad = torch.zeros(3, 5, dtype=torch.long)
    padded = lm(torch.cat([pad, ids], 1), attention_mask=torch.cat([pad, torch.ones_like(ids)], 1)).logits[:, 5:]
    assert torch.allclose(padded, lm(ids).logits, atol=1e-10)
    assert torch.allclose(lm(ids, attention_mask=torch.ones_like(ids)).logits, lm(ids).logits)


def test_generate_equals_greedy_decoding_with_step_and_save_pretrained_round_trips(tmp_path):
    torch.manual_seed(11)
    lm = lm_(20, d_state=4).double()
    ids = torch.randint(0, 20, (2, 6))
    out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False, pad_token_id=0)
    cache = None
    for t in range(ids.shape[1]):
        logits, cache = lm.step(ids[:, t], cache)
    seq = ids
    for _ in range(5):
        nxt = logits.argmax(-1)
        seq = torch.cat([seq, nxt[:, None]], 1)
        logits, cache = lm.step(nxt, cache)
    assert torch.equal(out, seq)
    lm.save_pretrained(tmp_path)
    back = SSMForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert back.config.to_dict()["kind"] == "longhorn" and back.config.d_state == 4
    assert torch.equal(back(ids).logits, lm(ids).logits)
    assert {k for k in back.state_dict()} == {k for k in lm.state_dict()}


def test_generate_keeps_an_ssm_cache_linear_in_the_length():
    torch.manual_seed(12)
    lm = lm_(20, d_state=4).double()
    ids = torch.randint(1, 20, (2, 7))
    calls = []
    orig = lm._cached_step
    lm._cached_step = lambda *a, **k: calls.append(1) or orig(*a, **k)
    out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert len(calls) == 7 + 8 - 1          # the prompt once, then one step per new token (no rerun of the prefix)
    del lm._cached_step
    # the cached forward equals the parallel one, and the cache's state equals `step`'s
    cache = SSMCache(len(lm.layers))
    cached = lm(ids, cache=cache).logits
    assert torch.allclose(cached, lm(ids).logits, atol=1e-10) and cache.get_seq_length() == 7
    ref = None
    for t in range(7):
        _, ref = lm.step(ids[:, t], ref)
    assert all(torch.allclose(a, b) for e, f in zip(cache.entries, ref) for a, b in zip(e, f))
    # left padding: the padded row generates what the unpadded one does
    pad = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids[:1]], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 7, dtype=torch.long)], 1)
    padded = lm.generate(pad, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(padded[0, 3:], out[0])
    # beam search reorders the cache without error; a wrong cache type is refused
    assert lm.generate(ids, max_new_tokens=3, num_beams=2, do_sample=False, pad_token_id=0).shape == (2, 10)
    with pytest.raises(ValueError, match="SSMCache"):
        lm(ids, cache=[None, None])


def test_trainer_trains_it(tmp_path):
    from transformers import Trainer, TrainingArguments

    class Counting(torch.utils.data.Dataset):
        def __len__(self):
            return 128

        def __getitem__(self, i):
            x = (torch.arange(12) + i) % 16
            return {"input_ids": x, "labels": x}
    torch.manual_seed(0)
    lm = lm_(16, d_state=4, scan="sequential")
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=30, per_device_train_batch_size=16, learning_rate=3e-2,
                             logging_steps=10, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=lm, args=args, train_dataset=Counting())
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert losses[-1] < 0.5 * losses[0]


def test_decay_stats_on_known_keys():
    torch.manual_seed(5)
    lm = lm_(12, n_layer=1, d_state=4, expand=1)
    ids = torch.randint(0, 12, (2, 9))
    lm.mixers[0].record = True
    lm(ids)
    last = lm.mixers[0].last
    beta, k = last["beta"], last["k"]
    expected = float((1 - beta.unsqueeze(-1) * (k * k).unsqueeze(-2) < -1).double().mean())
    st = experiment.decay_stats(lm, ids)
    assert st["outside_bounds"] == 0 and st["explicit_below_minus_one"] == pytest.approx(expected)
    assert st["min_decay"] == pytest.approx(float(last["a"].min()))
    assert lm.mixers[0].record is True          # the recording state is restored
    with torch.no_grad():                        # large keys: the explicit step leaves [-1, 1], the implicit one not
        lm.mixers[0].x_proj.weight.mul_(30)
    st = experiment.decay_stats(lm, ids)
    assert st["outside_bounds"] == 0 and st["explicit_below_minus_one"] > 0
    assert st["state_max_explicit"] > st["state_max"]
    ex = lm_(12, n_layer=1, d_state=4, expand=1, kind="explicit")
    with torch.no_grad():
        ex.mixers[0].x_proj.weight.mul_(30)
    st = experiment.decay_stats(ex, ids)   # the explicit model's own decays are the explicit ones
    assert st["min_decay"] < -1 and st["state_max"] == pytest.approx(st["state_max_explicit"])


def test_param_groups_exempt_a_log_after_from_pretrained(tmp_path):
    lm = lm_(12, n_layer=1, d_state=4, expand=1, kind="mamba")
    lm.save_pretrained(tmp_path)
    back = SSMForCausalLM.from_pretrained(tmp_path)
    decay, keep = experiment.param_groups(back, 0.1)
    assert id(back.mixers[0].A_log) in {id(p) for p in keep["params"]}


def test_param_groups_exempt_vectors_and_flagged_parameters():
    lm = lm_(12, n_layer=1, d_state=4, expand=1, kind="mamba")
    decay, keep = experiment.param_groups(lm, 0.1)
    ids = {id(p) for p in keep["params"]}
    assert id(lm.mixers[0].A_log) in ids and id(lm.mixers[0].D) in ids and id(lm.mixers[0].dt_proj.bias) in ids
    assert id(lm.mixers[0].in_proj.weight) in {id(p) for p in decay["params"]} and keep["weight_decay"] == 0.0


def test_training_is_deterministic():
    cfg = experiment.Config.preset("tiny")
    kw = dict(model="Longhorn", cell=cfg.cells[0], lr=1e-2, seed=0, cfg_dict=cfg.to_dict())
    a, b = experiment.train_and_evaluate(**kw), experiment.train_and_evaluate(**kw)
    assert a["losses"] == b["losses"] and a["accuracy"] == b["accuracy"]


def test_a_diverging_run_stops_and_is_counted():
    cfg = experiment.Config.preset("tiny", steps=4)
    r = experiment.train_and_evaluate("Explicit", cfg.cells[0], lr=float("inf"), seed=0, cfg_dict=cfg.to_dict())
    assert r["diverged_at"] is not None and r["final_loss"] == math.inf and set(r["accuracy"]) == {16, 32}


def test_synthetic_corpus_copies_spans_and_is_deterministic():
    x = experiment.synthetic_corpus(64, 128, 50, seed=3, copy_prob=0.05, span=8)
    assert x.shape == (64, 128) and x.min() >= 0 and x.max() < 50
    assert torch.equal(x, experiment.synthetic_corpus(64, 128, 50, seed=3, copy_prob=0.05, span=8))
    # without copies every bigram comes from the grammar's successor table: at most 8 successors per token
    y = experiment.synthetic_corpus(64, 128, 50, seed=3, copy_prob=0.0)
    succ = {}
    for row in y.tolist():
        for a, b in zip(row, row[1:]):
            succ.setdefault(a, set()).add(b)
    assert max(len(s) for s in succ.values()) <= 8
    # with copies, some bigrams fall outside the grammar (a copied span starts anywhere)
    outside = sum(b not in succ.get(a, set()) for row in x.tolist() for a, b in zip(row, row[1:]))
    assert outside > 0


def test_loglog_slope_recovers_known_exponents():
    g = np.random.default_rng(0)
    rows = [{"scan": "chunked", "length": L, "repeat": r, "seconds": 1e-6 * L * np.exp(0.05 * g.standard_normal())}
            for L in (64, 128, 256, 512, 1024) for r in range(3)]
    rows += [{"scan": "sequential", "length": L, "repeat": r, "seconds": 1e-9 * L ** 2.0} for L in (64, 128, 256)
             for r in range(2)]
    iv = experiment.loglog_slope(rows, "chunked")
    assert iv["estimate"] == pytest.approx(1.0, abs=0.1) and iv["lo"] < 1 < iv["hi"] and iv["n"] == 5   # one per length
    assert experiment.loglog_slope(rows, "sequential")["estimate"] == pytest.approx(2.0, abs=1e-9)


LRS = (1e-3, 1e-2, 1e-1)


def _results(acc, ratio8=None, unstable=None, outside=0, lrs=LRS):
    """Synthetic sweep runs, one cell: acc[model] lists per-seed accuracies at the training length (32) at every rate
    (the lowest rate has the lowest training loss, so it is the chosen one); unstable[model] lists, per seed, how many
    of the highest rates diverged."""
    out = []
    cp = {"outside_bounds": outside, "min_decay": 0.1, "explicit_below_minus_one": 0.01, "state_max": 1.0,
          "state_max_explicit": 10.0}
    for m, vals in acc.items():
        for s, a in enumerate(vals):
            r8 = (ratio8 or {}).get(m, 1.0)
            n_bad = ((unstable or {}).get(m) or [0] * len(vals))[s]
            for i, lr in enumerate(lrs):
                bad = i >= len(lrs) - n_bad
                out.append({"model": m, "seed": s, "L0": 32, "width": 64, "K": 4, "lr": lr,
                            "accuracy": {32: a, 64: a, 128: a, 256: a * r8}, "final_loss": math.inf if bad else 1.0 + 0.1 * i,
                            "diverged_at": 5 if bad else None,
                            "checkpoints": [cp] if m in ("Longhorn", "Explicit") else []})
    return out


_BENCH = [{"scan": s, "length": L, "repeat": r, "seconds": 1e-6 * L ** (2 if s == "Llama" else 1) * (1 + 0.01 * r)}
          for s in ("chunked", "sequential", "Llama") for L in (256, 512, 1024, 2048) for r in range(3)]


def _claims(results, bench=_BENCH, lm=()):
    return {c["id"]: c for c in experiment.make_claims(results, bench, list(lm), experiment.Config.preset("ci"))}


def _verdicts(results, bench=_BENCH, lm=()):
    return {k: c["verdict"] for k, c in _claims(results, bench, lm).items()}


_BASE = {"Longhorn": [0.5, 0.52, 0.48], "Mamba-style": [0.3, 0.31, 0.29], "Llama": [0.55, 0.5, 0.6],
         experiment.CEILING: [0.95, 0.95, 0.95],
         "Explicit": [0.3, 0.32, 0.28], "Explicit, normalised keys": [0.4, 0.4, 0.4]}
_UNSTABLE = {"Explicit": [2, 2, 2]}   # the explicit step unstable at the two highest of three rates on every seed


def test_make_claims_rules_and_deltas():
    v = _verdicts(_results(_BASE, unstable=_UNSTABLE))
    assert v == {"C1-recall": "reproduced", "C2-stable": "reproduced", "K1-bounds": "passed",
                 "C3-extrapolation": "reproduced", "K2-linear": "passed", "C5-lm": "not_run"}
    c = _claims(_results(_BASE, unstable=_UNSTABLE))
    for cid, d in (("C1-recall", 0.05), ("C2-stable", 0.2), ("C3-extrapolation", 0.2), ("C5-lm", 0.01)):
        assert c[cid]["delta"] == pytest.approx(d) == experiment.DELTAS[cid][0] and c[cid]["delta_reason"]
    assert c["C3-extrapolation"]["band"] == [pytest.approx(0.8), None]
    assert c["C2-stable"]["interval"]["estimate"] == pytest.approx(2 / 3)
    assert c["K2-linear"]["kind"] == "check" and "delta" not in c["K2-linear"]


def test_c1_verdicts_move_with_the_numbers():
    # ahead by 0.02 on every seed, real but below delta = 0.05: partial; ahead on average only: inconclusive; behind:
    # not reproduced
    assert _verdicts(_results(dict(_BASE, **{"Mamba-style": [0.48, 0.5, 0.46]})))["C1-recall"] == "partial"
    assert _verdicts(_results(dict(_BASE, **{"Mamba-style": [0.1, 0.6, 0.45]})))["C1-recall"] == "inconclusive"
    assert _verdicts(_results(dict(_BASE, **{"Mamba-style": [0.6, 0.6, 0.6]})))["C1-recall"] == "not_reproduced"
    # the accuracy is read at the chosen rate: a model's accuracy at another rate does not count
    runs = _results(_BASE)
    for r in runs:
        if r["model"] == "Mamba-style" and r["lr"] != LRS[0]:
            r["accuracy"] = {L: 0.9 for L in r["accuracy"]}
    assert _verdicts(runs)["C1-recall"] == "reproduced"


def test_c2_is_decided_on_the_range_of_stable_rates():
    # the explicit step unstable at two of three rates on every seed: reproduced; at one rate on one seed only (the
    # interval of the share includes 0 and reaches 0.2): inconclusive; at no rate (equal ranges): not reproduced
    assert _verdicts(_results(_BASE, unstable=_UNSTABLE))["C2-stable"] == "reproduced"
    assert _verdicts(_results(_BASE, unstable={"Explicit": [1, 0, 0]}))["C2-stable"] == "inconclusive"
    assert _verdicts(_results(_BASE))["C2-stable"] == "not_reproduced"
    # a real difference below delta: over ten rates, one rate fewer on every seed (0.1 < 0.2): partial
    ten = tuple(10.0 ** (-4 + 0.3 * i) for i in range(10))
    assert _verdicts(_results(_BASE, unstable={"Explicit": [1, 1, 1]}, lrs=ten))["C2-stable"] == "partial"
    # Longhorn unstable where the explicit step is (both at the top rate): not reproduced
    both = _results(_BASE, unstable={"Explicit": [1, 1, 1], "Longhorn": [1, 1, 1]})
    assert _verdicts(both)["C2-stable"] == "not_reproduced"
    # a run that did not diverge but whose loss ended above log V (the untrained guess) is not stable
    blown = _results(_BASE)
    for r in blown:
        if r["model"] == "Explicit" and r["lr"] != LRS[0]:
            r["final_loss"] = math.log(32) + 0.5
    assert _verdicts(blown)["C2-stable"] == "reproduced"
    assert experiment.is_stable({"diverged_at": None, "final_loss": 3.0}, 32)
    assert not experiment.is_stable({"diverged_at": None, "final_loss": 3.5}, 32)   # log 32 = 3.47
    assert not experiment.is_stable({"diverged_at": 3, "final_loss": math.inf}, 32)


def test_replicate_and_ceiling_gates():
    # two seeds: C1, C2 and C3 not run, with the gate's numbers
    two = {m: v[:2] for m, v in _BASE.items()}
    c = _claims(_results(two, unstable={"Explicit": [2, 2]}))
    for cid in ("C1-recall", "C2-stable", "C3-extrapolation"):
        g = c[cid]["gates"][0]
        assert c[cid]["verdict"] == "not_run" and not g["passed"] and g["value"] == 2 and g["threshold"] == 3
    # the ceiling model below 0.9 at the training length: C1 and C3 not run; C2 still decided (the plain Llama's
    # accuracy is no gate)
    c = _claims(_results(dict(_BASE, **{experiment.CEILING: [0.5, 0.5, 0.5]}), unstable=_UNSTABLE))
    assert c["C1-recall"]["verdict"] == c["C3-extrapolation"]["verdict"] == "not_run"
    g = c["C1-recall"]["gates"][1]
    assert not g["passed"] and g["value"] == pytest.approx(0.5) and g["threshold"] == experiment.ATTENTION_CEILING
    assert c["C1-recall"]["interval"] is not None and c["C2-stable"]["verdict"] == "reproduced"
    # the ceiling model just at 0.9: decided, whatever the plain Llama scores
    assert _verdicts(_results(dict(_BASE, **{experiment.CEILING: [0.9, 0.9, 0.9]})))["C1-recall"] == "reproduced"
    assert _verdicts(_results(dict(_BASE, Llama=[0.1, 0.1, 0.1])))["C1-recall"] == "reproduced"
    # Longhorn below 3x chance (3/16): C3 not run on its own gate, C1 decided
    c = _claims(_results(dict(_BASE, Longhorn=[0.18, 0.18, 0.18])))
    assert c["C3-extrapolation"]["verdict"] == "not_run" and c["C1-recall"]["verdict"] != "not_run"
    assert [x["passed"] for x in c["C3-extrapolation"]["gates"]] == [True, True, False]
    from iclr25_repro.core.results import CLAIM_SCHEMA, CHECK_SCHEMA
    import jsonschema
    for r in c.values():
        jsonschema.validate(r, CLAIM_SCHEMA if r["kind"] == "claim" else CHECK_SCHEMA)


def test_c3_band_and_the_checks():
    # C3 against the band [0.8, inf): inside, wholly below, across its edge
    assert _verdicts(_results(_BASE, ratio8={"Longhorn": 0.81}))["C3-extrapolation"] == "reproduced"
    assert _verdicts(_results(_BASE, ratio8={"Longhorn": 0.79}))["C3-extrapolation"] == "not_reproduced"
    spread = _results(_BASE)
    for r in spread:
        if r["model"] == "Longhorn":
            r["accuracy"] = {**r["accuracy"], 256: r["accuracy"][32] * (0.5, 1.0, 0.9)[r["seed"]]}
    assert _verdicts(spread)["C3-extrapolation"] == "inconclusive"
    # K1 fails on a decay outside the bounds; K2 on a quadratic cost, and passes on a linear one
    assert _verdicts(_results(_BASE, outside=1))["K1-bounds"] == "failed"
    quad = [dict(b, seconds=1e-9 * b["length"] ** 2) for b in _BENCH]
    assert _verdicts(_results(_BASE), bench=quad)["K2-linear"] == "failed"
    k2 = _claims(_results(_BASE))["K2-linear"]
    assert k2["verdict"] == "passed" and k2["ours"] == pytest.approx(1.0, abs=0.01) and "Llama" in k2["note"]
    # a Llama timed at fewer than three lengths gives no slope, and K2 still decides
    short = [b for b in _BENCH if b["scan"] != "Llama" or b["length"] <= 512]
    assert _verdicts(_results(_BASE), bench=short)["K2-linear"] == "passed"


def test_c3_ratio_floors_the_denominator_at_chance():
    # the ceiling model at 0.01, below chance (1/16), at the training length would give any ratio; the floor keeps it
    # at most 1/chance
    base = dict(_BASE, **{experiment.CEILING: [0.01, 0.01, 0.01]})
    c3 = _claims(_results(base, ratio8={experiment.CEILING: 5.0}))["C3-extrapolation"]
    assert c3["baseline"] == pytest.approx(0.05 / (1 / 16))


def _lm_runs(diverged=(), n_diverged=1):
    runs = []
    for m, x in (("Longhorn", 2.0), ("Mamba-style", 2.2), ("Llama", 2.1)):
        for s in range(3):
            d = m in diverged and s < n_diverged
            runs.append({"model": m, "seed": s, "parameters": 1000, "diverged_at": 7 if d else None,
                         "final_val_loss": math.inf if d else x + 0.01 * s,
                         "curve": [{"tokens": 10, "val_loss": x + 0.5}] + ([] if d else [{"tokens": 20, "val_loss": x}])})
    return runs


def test_c5_rules_and_edge_cases():
    c5 = lambda lm: _claims(_results(_BASE), lm=lm)["C5-lm"]
    lm = _lm_runs()
    assert c5(lm)["verdict"] == "reproduced"
    shift = lambda dx: [dict(r, final_val_loss=r["final_val_loss"] + dx) if r["model"] == "Longhorn" else r for r in lm]
    assert c5(shift(0.195))["verdict"] == "partial"
    assert c5([dict(r, final_val_loss=3.0) if r["model"] == "Longhorn" else r for r in lm])["verdict"] == "not_reproduced"
    noisy = [dict(r, final_val_loss=(2.5, 1.9, 2.1)[r["seed"]]) if r["model"] == "Longhorn" else r for r in lm]
    assert c5(noisy)["verdict"] == "inconclusive"
    assert c5(_lm_runs(diverged=("Llama",)))["verdict"] == "reproduced"          # a diverged Llama does not matter
    # a divergence makes the losses incomparable: decided on the per-seed difference in diverged runs
    lh = c5(_lm_runs(diverged=("Longhorn",), n_diverged=3))
    assert lh["verdict"] == "not_reproduced" and math.isfinite(lh["ours"])       # the last evaluation before it
    assert c5(_lm_runs(diverged=("Longhorn",)))["verdict"] == "inconclusive"    # one seed of three
    assert c5(_lm_runs(diverged=("Mamba-style",), n_diverged=3))["verdict"] == "reproduced"
    assert c5(_lm_runs(diverged=("Mamba-style", "Longhorn")))["verdict"] == "not_reproduced"


def test_choose_rates_uses_the_training_loss_averaged_over_seeds():
    runs = _results(_BASE, unstable={"Explicit": [0, 0, 1]})
    for r in runs:   # Longhorn: the middle rate is best on average though not on every seed
        if r["model"] == "Longhorn":
            r["final_loss"] = {LRS[0]: 2.0, LRS[1]: (1.0, 1.0, 2.5)[r["seed"]], LRS[2]: 3.0}[r["lr"]]
    chosen = experiment.choose_rates(runs)
    cell = (32, 64, 4)
    assert chosen["Longhorn", cell] == LRS[1] and chosen["Mamba-style", cell] == LRS[0]
    # a rate at which one seed diverged averages to inf and is never chosen over a finite one
    for r in runs:
        if r["model"] == "Llama":
            r["final_loss"] = {LRS[0]: 2.0, LRS[1]: math.inf if r["seed"] == 0 else 0.5, LRS[2]: 3.0}[r["lr"]]
    assert experiment.choose_rates(runs)["Llama", cell] == LRS[0]
    assert {r["lr"] for r in experiment.at_chosen_rates(runs) if r["model"] == "Longhorn"} == {LRS[1]}


def test_the_explicit_step_diverges_at_a_high_learning_rate_where_longhorn_does_not():
    cfg = experiment.Config.preset("ci", steps=12, batch=8, n_eval=4, length_factors=(1,), warmup=2,
                                   checkpoint_every=100)
    run = lambda m, lr: experiment.train_and_evaluate(m, cfg.cells[0], lr, 0, cfg.to_dict())
    explicit, longhorn = run("Explicit", 0.1), run("Longhorn", 0.1)
    assert explicit["diverged_at"] is not None and explicit["final_loss"] == math.inf
    assert longhorn["diverged_at"] is None and all(map(math.isfinite, longhorn["losses"]))
    assert run("Explicit", 1e-2)["diverged_at"] is None   # the rate, not the model, makes it diverge


@pytest.fixture(scope="module")
def tiny_run():
    cfg = experiment.Config.preset("tiny", lrs=(1e-4, 1e-2))
    return cfg, experiment.run(cfg)


def test_tiny_run(tiny_run):
    cfg, out = tiny_run
    assert [c["id"] for c in out["claims"]] == ["C1-recall", "C2-stable", "K1-bounds", "C3-extrapolation",
                                                "K2-linear", "C5-lm"]
    assert len(out["rows"]) == len(out["sweep"]) == len(cfg.models) * len(cfg.cells) * len(cfg.lrs) * cfg.n_seeds
    assert sum(r["chosen"] for r in out["rows"]) == len(out["results"]) == len(cfg.models) * cfg.n_seeds
    for r in out["rows"]:
        assert all(0 <= r[f"acc_x{f}"] <= 1 for f in cfg.length_factors)
    for scan in ("chunked", "sequential", "Llama"):
        assert {(b["length"], b["repeat"]) for b in out["bench"] if b["scan"] == scan} == {
            (L, r) for L in cfg.bench_lengths for r in range(cfg.bench_repeats)}
    assert all(np.isfinite(b["seconds"]) and b["seconds"] > 0 for b in out["bench"])
    chosen = experiment.choose_rates(out["sweep"])
    assert all(out["chosen_lr"][f"{m} {c}"] == lr for (m, c), lr in chosen.items())


def test_laptop_preset_smoke_run_and_the_same_code_path():
    from iclr25_repro.core import cli
    laptop, ci = experiment.Config.preset("laptop").to_dict(), experiment.Config.preset("ci").to_dict()
    assert set(laptop) == set(ci) and laptop["models"] == ci["models"] and laptop["n_seeds"] >= 3
    doc = cli.run_experiment("longhorn", "laptop", "cpu", 0, smoke=True)
    assert [c["id"] for c in doc["claims"]] == ["C1-recall", "C2-stable", "K1-bounds", "C3-extrapolation",
                                                "K2-linear", "C5-lm"]


def test_full_preset_smoke_run():
    from iclr25_repro.core import cli
    doc = cli.run_experiment("longhorn", "full", "cpu", 0, smoke=True)
    assert next(c for c in doc["claims"] if c["id"] == "C5-lm")["verdict"] != "not_run"   # the LM phase ran


def test_plan_counts_the_work_and_fits_the_budgets():
    from iclr25_repro.core.cli import plan_units
    full = experiment.Config.preset("full")
    phases = [p["phase"] for p in experiment.plan(full)]
    assert phases[0].startswith("MQAR runs") and any("language models" in p for p in phases)
    assert phases[-1].startswith("scan benchmark")
    assert not any("language" in p for p in (q["phase"] for q in experiment.plan(experiment.Config.preset("ci"))))
    assert plan_units(experiment.plan(full)) / experiment.GPU_UNITS_PER_S <= 600   # the full preset's 10 minutes
    units = {s: plan_units(experiment.plan(experiment.Config.preset(s))) for s in ("ci", "laptop")}
    assert 10 * units["ci"] < units["laptop"]
