"""MiniLM encoder: parity with transformers BertModel (torch, CPU) + mean pooling + L2 norm."""

import numpy as np
import pytest

from empo2_jax.model import encoder as enc_mod

SENTENCES = [
  "open door to kitchen",
  "You are in the greenhouse. In it, you see: a flower pot 1, a seed jar, a shovel, and a sink.",
  "Your task is to boil water. First, focus on the substance. Then, take actions that will "
  "cause it to change its state of matter.",
  "focus on red wax",
  "a",
  "",
  "Score: 42/100 — the thermometer reads 23°C; ¿qué? 日本語 émigré naïve café",
  "move metal pot to stove; activate stove; wait1; look at metal pot; use thermometer in "
  "inventory on substance in metal pot",
  # longer than 256 word pieces: truncation must match
  " ".join(
    f"look around room {i} and pick up the orange and the apple and the banana" for i in range(40)
  ),
  "pour cup containing red paint in cup containing blue paint, then mix cup",
  "user: You are in the hallway. assistant: go to art studio\nuser: You move to the art studio.",
]


@pytest.fixture(scope="module")
def encoder():
  return enc_mod.Encoder.load(max_batch=8)


def _reference(sentences, model_dir, max_len):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
  model = transformers.BertModel.from_pretrained(str(model_dir)).eval()
  batch = tok(sentences, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
  with torch.no_grad():
    h = model(**batch).last_hidden_state
  m = batch["attention_mask"][..., None].float()
  pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
  out = torch.nn.functional.normalize(pooled, p=2, dim=1)
  return out.numpy(), batch["input_ids"].numpy(), batch["attention_mask"].numpy()


def test_parity_with_transformers_bert(encoder):
  ref, ref_ids, ref_mask = _reference(
    SENTENCES, enc_mod.default_model_dir(), encoder.cfg.max_seq_length
  )
  ours = encoder.encode(SENTENCES)
  assert ours.shape == (len(SENTENCES), 384) and ours.dtype == np.float32
  # same word pieces, truncated at 256
  ids = encoder.tokenize(SENTENCES)
  for i, row in enumerate(ids):
    assert row == ref_ids[i][ref_mask[i] > 0].tolist()
  assert max(len(r) for r in ids) == 256
  cos = (ours * ref).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(ref, axis=-1)
  assert cos.min() >= 0.9999, cos
  np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-5)


def test_batching_and_order_do_not_change_embeddings(encoder):
  full = encoder.encode(SENTENCES)
  singles = np.concatenate([encoder.encode([s]) for s in SENTENCES[:4]])
  np.testing.assert_allclose(singles, full[:4], atol=2e-5)
  rev = encoder.encode(SENTENCES[::-1])
  np.testing.assert_allclose(rev[::-1], full, atol=2e-5)
  assert encoder.encode([]).shape == (0, 384)


def test_calls_cover_every_row_once_within_the_token_budget(encoder):
  rng = np.random.default_rng(0)
  for budget in (16, 256, 4096):
    for _ in range(20):
      lengths = sorted(rng.integers(1, 400, rng.integers(1, 150)).tolist())
      enc = enc_mod.Encoder(encoder.params, encoder.cfg, encoder.tokenizer, 64, budget)
      calls = enc._calls(lengths)
      covered = [i for rows, _, _ in calls for i in range(rows.start, rows.stop)]
      assert covered == list(range(len(lengths)))  # in order, each once
      for rows, n_b, n_len in calls:
        n = rows.stop - rows.start
        assert n <= n_b <= 64 and n_b & (n_b - 1) == 0
        assert min(lengths[rows.stop - 1], 256) <= n_len <= 256
        assert n == 1 or n_b * n_len <= budget


def test_token_budget_does_not_change_embeddings(encoder):
  texts = SENTENCES + [f"go to room {i} " * (i % 40 + 1) for i in range(40)]
  big = enc_mod.Encoder(encoder.params, encoder.cfg, encoder.tokenizer, 64, 1 << 20)
  small = enc_mod.Encoder(encoder.params, encoder.cfg, encoder.tokenizer, 64, 512)
  assert len(small._calls(sorted(map(len, small.tokenize(texts))))) > 4  # the budget split it
  np.testing.assert_allclose(small.encode(texts), big.encode(texts), atol=2e-5)


def test_semantics_similar_texts_closer(encoder):
  e = encoder.encode(
    ["open the door to the kitchen", "open door to kitchen", "the melting point of lead"]
  )
  assert e[0] @ e[1] > 0.8 > e[0] @ e[2]


def test_missing_directory_says_what_to_pass(tmp_path):
  with pytest.raises(FileNotFoundError, match="Encoder.load\\(path="):
    enc_mod.Encoder.load(tmp_path / "nope")
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    enc_mod.Encoder.load(tmp_path)


def test_repeated_texts_are_embedded_once_and_returned_in_place(encoder, monkeypatch):
  texts = ["open the door", "look around", "open the door", "go north", "look around"]
  want = np.stack([encoder.encode([t])[0] for t in texts])
  calls = []
  embed = encoder._embed
  monkeypatch.setattr(encoder, "_embed", lambda *a: calls.append(a[1].shape) or embed(*a))
  got = encoder.encode(texts)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert sum(shape[0] for shape in calls) < len(texts)  # 3 distinct texts, padded rows
