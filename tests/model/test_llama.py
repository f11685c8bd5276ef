"""Llama-family checkpoints: random transformers LlamaForCausalLM models load and match, round trip,
config errors name the field, SmolLM2 presets, sharding rules without attention biases."""

import json
import os

import numpy as np
import pytest
import torch

import jax

from empo2_jax.model import configs, hf, llama
from tests.conftest import hf_logits, random_batch

LLAMA3_ROPE = {
  "rope_type": "llama3",
  "factor": 8.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 16,
}
CASES = {
  "mha_untied": dict(heads=4, kv_heads=4, tie=False),
  "gqa_tied": dict(heads=6, kv_heads=2, tie=True),
  "gqa_llama3_rope": dict(heads=4, kv_heads=2, tie=False, theta=500000.0, rope=LLAMA3_ROPE),
  "mqa_headdim": dict(heads=4, kv_heads=1, head_dim=32, tie=True),
}


def make_llama_checkpoint(
  path,
  *,
  vocab=384,
  hidden=48,
  inter=80,
  layers=2,
  heads=4,
  kv_heads=2,
  head_dim=None,
  tie=False,
  theta=10000.0,
  rope=None,
  seed=0,
):
  """Save a random-init transformers LlamaForCausalLM (fp32, random norms) to `path`."""
  from transformers import LlamaConfig, LlamaForCausalLM

  torch.manual_seed(seed)
  cfg = LlamaConfig(
    vocab_size=vocab,
    hidden_size=hidden,
    intermediate_size=inter,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=kv_heads,
    head_dim=head_dim or hidden // heads,
    rope_theta=theta,
    rope_scaling=rope,
    tie_word_embeddings=tie,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
  )
  model = LlamaForCausalLM(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(path, safe_serialization=True)
  return model


@pytest.mark.parametrize("case", sorted(CASES))
def test_llama_fp32_logits_match_hf(tmp_path, case):
  model = make_llama_checkpoint(str(tmp_path), **CASES[case])
  config, params = hf.load_checkpoint(str(tmp_path))
  assert not config.attention_bias and "bq" not in params["layers"]
  assert (config.rope_scaling is not None) == ("rope" in CASES[case])
  rng = np.random.default_rng(1)
  # positions up to 60 > original_max_position_embeddings: every llama3 frequency band is used
  tokens, mask = random_batch(rng, 3, 61, config.vocab_size, left_pad=[(1, 9)], right_pad=[(2, 5)])
  ref = hf_logits(model, tokens, mask)
  ours = np.asarray(jax.jit(llama.forward, static_argnums=1)(params, config, tokens, mask))
  valid = mask.astype(bool)
  assert np.abs(ours[valid] - ref[valid]).max() <= 1e-4


def test_llama3_rope_changes_frequencies():
  base = configs.get_preset("smollm2-135m")
  scaled = base.replace(rope_scaling=configs.RopeScaling(8.0, 1.0, 4.0, 64))
  a, b = np.asarray(llama.rope_inv_freq(base)), np.asarray(llama.rope_inv_freq(scaled))
  assert a[0] == b[0]  # high frequencies kept
  np.testing.assert_allclose(b[-1], a[-1] / 8.0, rtol=1e-6)  # low frequencies divided by factor


@pytest.mark.parametrize("tie", [False, True])
def test_llama_round_trip_loads_in_transformers(tmp_path, tie):
  src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
  model = make_llama_checkpoint(src, tie=tie, rope=LLAMA3_ROPE, seed=3)
  config, params = hf.load_checkpoint(src)
  hf.save_checkpoint(dst, config, params)
  saved = json.load(open(os.path.join(dst, "config.json")))
  assert saved["architectures"] == ["LlamaForCausalLM"] and saved["model_type"] == "llama"
  from transformers import AutoModelForCausalLM

  back = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32)
  assert type(back).__name__ == "LlamaForCausalLM"
  a, b = model.state_dict(), back.state_dict()
  assert set(a) == set(b)
  for k in a:
    np.testing.assert_array_equal(a[k].numpy(), b[k].numpy(), err_msg=k)
  tokens, mask = random_batch(np.random.default_rng(0), 1, 40, config.vocab_size)
  np.testing.assert_array_equal(hf_logits(model, tokens, mask), hf_logits(back, tokens, mask))
  config2, _ = hf.load_checkpoint(dst)
  assert config2 == config


def _llama_dict(**kw):
  d = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
  }
  d.update(kw)
  return d


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("mlp_bias", True, "mlp_bias"),
    ("attention_bias", True, "attention_bias"),
    ("hidden_act", "gelu", "hidden_act"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope scaling type 'yarn'"),
    ("rope_scaling", {"type": "linear", "factor": 2.0}, "rope scaling type 'linear'"),
    (
      "rope_parameters",
      {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
      "rope scaling type 'dynamic'",
    ),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "lacks"),
  ],
)
def test_unsupported_llama_fields_are_named(field, value, match):
  with pytest.raises(ValueError, match=match):
    configs.LlamaConfig.from_hf_dict(_llama_dict(**{field: value}))


def test_hf_dict_reads_both_rope_spellings_and_qwen2_keeps_biases():
  new = configs.LlamaConfig.from_hf_dict(
    _llama_dict(rope_parameters={**LLAMA3_ROPE, "rope_theta": 5e5})
  )
  old = configs.LlamaConfig.from_hf_dict(_llama_dict(rope_scaling=LLAMA3_ROPE, rope_theta=5e5))
  assert new == old and new.rope_theta == 5e5 and new.rope_scaling.factor == 8.0
  assert configs.LlamaConfig.from_hf_dict(new.to_hf_dict()) == new
  qwen = configs.get_preset("tiny")
  assert qwen.attention_bias and qwen.to_hf_dict()["architectures"] == ["Qwen2ForCausalLM"]
  with pytest.raises(ValueError, match="use_sliding_window"):
    configs.LlamaConfig.from_hf_dict({**qwen.to_hf_dict(), "use_sliding_window": True})


def test_smollm2_presets_have_published_sizes():
  # parameter counts of the SmolLM2 model cards (135M, 360M, 1.7B)
  for name, millions in {
    "smollm2-135m": 134.5,
    "smollm2-360m": 361.8,
    "smollm2-1.7b": 1711.4,
  }.items():
    cfg = configs.get_preset(name)
    assert not cfg.attention_bias and cfg.tie_word_embeddings and cfg.vocab_size == 49152
    assert abs(cfg.num_params() / 1e6 - millions) < 0.5, (name, cfg.num_params())
  assert configs.get_preset("SmolLM2-360M").num_heads == 15


def test_llama_params_shard_without_bias_rules():
  from jax.sharding import PartitionSpec as P
  from empo2_jax.parallel import sharding as shd

  shapes = llama.param_shapes(configs.get_preset("smollm2-135m"))
  assert not {"bq", "bk", "bv"} & set(shapes["layers"])
  specs = shd.tree_specs(shapes)
  assert specs["layers"]["wk"] == P(None, "fsdp", "tensor") and specs["embed"] == P(
    "tensor", "fsdp"
  )
  params = llama.init_params(
    configs.get_preset("smollm2-135m").replace(num_layers=1, vocab_size=64), jax.random.PRNGKey(0)
  )
  assert jax.tree.structure(params) == jax.tree.structure(
    jax.tree.map(lambda _: 0, shd.tree_specs(params), is_leaf=lambda x: isinstance(x, P))
  )
