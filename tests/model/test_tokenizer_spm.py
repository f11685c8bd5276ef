"""A checkpoint directory with only a SentencePiece tokenizer.model: ids and decoding equal
sentencepiece's own, on a BPE model trained here (Llama's settings: byte fallback, split digits,
identity normalizer)."""

import json
import random

import pytest

from empo2_jax.model import spm
from empo2_jax.model.tokenizer import load_tokenizer

WORDS = [
  "the",
  "cat",
  "sat",
  "on",
  "mat",
  "dog",
  "runs",
  "quick",
  "brown",
  "fox",
  "jumps",
  "over",
  "lazy",
  "42",
  "1999",
  "café",
  "naïve",
  "hello",
  "world",
  "thermometer",
  "kitchen",
  "x",
]
TEXTS = [
  "the cat sat",
  "  two  spaces",
  "café 🎉 1999",
  " lead",
  "end ",
  "\nnew\nline\n",
  "UNSEEN Capitals",
  "",
  " ",
  "a  b   c",
  "日本語",
  "tabs\tand\tx",
  "thermometer's 37.5°C",
  "<s>not special in text?</s>",
  "kitchen\n\n\nfox",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  import sentencepiece as sp

  d = tmp_path_factory.mktemp("spm")
  rng = random.Random(0)
  corpus = d / "corpus.txt"
  corpus.write_text(
    "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))) for _ in range(3000))
  )
  sp.SentencePieceTrainer.train(
    input=str(corpus),
    model_prefix=str(d / "tokenizer"),
    vocab_size=300,
    model_type="bpe",
    byte_fallback=True,
    split_digits=True,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    unk_id=0,
    bos_id=1,
    eos_id=2,
    pad_id=-1,
    character_coverage=1.0,
    minloglevel=2,
  )
  corpus.unlink()
  return str(d)


def test_ids_and_decode_match_sentencepiece(model_dir):
  import sentencepiece as sp
  from transformers import LlamaTokenizer

  ref = sp.SentencePieceProcessor(model_file=f"{model_dir}/tokenizer.model")
  tok = load_tokenizer(model_dir)
  fast = LlamaTokenizer.from_pretrained(model_dir)  # transformers' own conversion
  assert (tok.bos_token, tok.eos_token, tok.unk_token) == ("<s>", "</s>", "<unk>")
  assert tok.pad_token == "</s>"  # no pad piece and no <|endoftext|>: pad with eos
  leading_space = 0
  for text in TEXTS + [" ".join(random.Random(i).sample(WORDS, 6)) for i in range(20)]:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if "<s>" in text:  # special tokens stay whole here; sentencepiece spells them out
      continue
    assert ids == ref.encode(text), repr(text)
    assert tok.decode(ids) == ref.decode(ids) == text
    if text.startswith(" "):  # transformers' conversion drops one of the leading spaces
      leading_space += fast(text, add_special_tokens=False)["input_ids"] != ids
    else:
      assert ids == fast(text, add_special_tokens=False)["input_ids"], repr(text)
  assert leading_space > 0
  assert tok("<s>x")["input_ids"][0] == 1


def test_tokenizer_config_adds_bos_and_template(model_dir, tmp_path):
  import shutil

  shutil.copy(f"{model_dir}/tokenizer.model", tmp_path / "tokenizer.model")
  (tmp_path / "tokenizer_config.json").write_text(
    json.dumps(
      {
        "add_bos_token": True,
        "bos_token": {"content": "<s>"},
        "eos_token": "</s>",
        "chat_template": "{% for m in messages %}[{{ m['content'] }}]{% endfor %}",
      }
    )
  )
  tok = load_tokenizer(str(tmp_path))
  assert tok("the cat")["input_ids"][0] == 1
  assert tok("the cat", add_special_tokens=False)["input_ids"][0] != 1
  assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "[x]"


def test_merges_follow_scores():
  merges = spm.merges_from_scores({"a": -5.0, "b": -6.0, "ab": -1.0, "abb": -2.0, "bb": -3.0})
  assert merges[0] == ("a", "b") and merges.index(("ab", "b")) < merges.index(("b", "b"))


def test_unsupported_settings_are_named(tmp_path):
  import sentencepiece as sp

  corpus = tmp_path / "c.txt"
  corpus.write_text("\n".join(" ".join(random.Random(i).sample(WORDS, 8)) for i in range(500)))
  sp.SentencePieceTrainer.train(
    input=str(corpus),
    model_prefix=str(tmp_path / "tokenizer"),
    vocab_size=50,
    model_type="unigram",
    minloglevel=2,
  )
  with pytest.raises(ValueError, match=r"model_type=1.*normalizer_spec\.name='nmt_nfkc'"):
    load_tokenizer.__wrapped__(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="tokenizer.json or tokenizer.model"):
    load_tokenizer.__wrapped__(str(tmp_path / "nothing"))
