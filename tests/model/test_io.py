"""Checkpoint round trips and clear errors of empo2_jax.model.hf."""

import json
import os

import numpy as np
import pytest
import torch

from empo2_jax.model import configs, hf, llama
from tests.conftest import make_hf_checkpoint


def _hf_state(model):
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("tie", [False, True])
def test_round_trip_identical_and_loadable(tmp_path, tie):
  src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
  model = make_hf_checkpoint(src, tie=tie, seed=3)
  config, params = hf.load_checkpoint(src)
  hf.save_checkpoint(dst, config, params)
  from transformers import Qwen2ForCausalLM

  back = Qwen2ForCausalLM.from_pretrained(dst, torch_dtype=torch.float32)
  a, b = _hf_state(model), _hf_state(back)
  assert set(a) == set(b)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_sharded_save_and_load(tmp_path):
  config = configs.get_preset("tiny").replace(vocab_size=1000, tie_word_embeddings=False)
  import jax

  params = llama.init_params(config, jax.random.PRNGKey(0))
  hf.save_checkpoint(str(tmp_path), config, params, max_shard_bytes=100_000)
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 2
  config2, params2 = hf.load_checkpoint(str(tmp_path))
  assert config2.num_layers == config.num_layers
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(x), y)


def test_bf16_load_casts(hf_tiny):
  import ml_dtypes

  config, params = hf.load_checkpoint(hf_tiny[0], dtype="bfloat16")
  assert params["layers"]["wq"].dtype == ml_dtypes.bfloat16
  assert config.param_dtype == "bfloat16"


def test_transformers_bf16_checkpoint_loads_exactly(tmp_path, hf_tiny):
  import copy

  import ml_dtypes

  model = copy.deepcopy(hf_tiny[1]).to(torch.bfloat16)
  model.save_pretrained(str(tmp_path), safe_serialization=True)
  config, params = hf.load_checkpoint(str(tmp_path), dtype="bfloat16")
  state = {k: v.float().numpy() for k, v in model.state_dict().items()}
  assert params["embed"].dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(
    params["embed"].astype(np.float32), state["model.embed_tokens.weight"]
  )
  for i in range(config.num_layers):
    got = params["layers"]["wq"][i].astype(np.float32)
    np.testing.assert_array_equal(got, state[f"model.layers.{i}.self_attn.q_proj.weight"].T)
    got = params["layers"]["bk"][i].astype(np.float32)
    np.testing.assert_array_equal(got, state[f"model.layers.{i}.self_attn.k_proj.bias"])


def test_errors_are_clear(tmp_path, hf_tiny):
  with pytest.raises(hf.CheckpointError, match="no config.json"):
    hf.load_checkpoint(str(tmp_path))
  (tmp_path / "config.json").write_text(
    json.dumps({"model_type": "mistral", "architectures": ["MistralForCausalLM"]})
  )
  with pytest.raises(ValueError, match="unsupported checkpoint: model_type='mistral'"):
    hf.load_checkpoint(str(tmp_path))
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
  with pytest.raises(ValueError, match="lacks"):
    hf.load_checkpoint(str(tmp_path))
  cfg = json.load(open(os.path.join(hf_tiny[0], "config.json")))
  cfg["rope_scaling"] = {"type": "yarn", "factor": 4.0}
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="rope scaling"):
    hf.load_checkpoint(str(tmp_path))
  cfg["rope_scaling"] = None
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(hf.CheckpointError, match="no model.safetensors"):
    hf.load_checkpoint(str(tmp_path))
  # a shape mismatch names the tensor
  cfg["intermediate_size"] = cfg["intermediate_size"] + 8
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  os.symlink(os.path.join(hf_tiny[0], "model.safetensors"), tmp_path / "model.safetensors")
  with pytest.raises(hf.CheckpointError, match=r"model\.layers\.0\.mlp\.\w+_proj\.weight"):
    hf.load_checkpoint(str(tmp_path))


def test_presets_have_published_sizes():
  # parameter counts of the Qwen2.5 model cards (billions, 2 significant digits)
  expected = {
    "0.5b": 0.49,
    "1.5b": 1.54,
    "3b": 3.09,
    "7b": 7.61,
    "14b": 14.7,
    "32b": 32.5,
    "72b": 72.7,
  }
  for name, billions in expected.items():
    n = configs.get_preset(name).num_params() / 1e9
    assert abs(n - billions) / billions < 0.02, (name, n)
  with pytest.raises(KeyError, match="valid"):
    configs.get_preset("8b")


@pytest.mark.slow
def test_logit_checker_cli(hf_tiny):
  import subprocess
  import sys

  out = subprocess.run(
    [sys.executable, "-m", "empo2_jax.model.check", "--hf_dir", hf_tiny[0]],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  last = out.stdout.strip().splitlines()[-1]
  assert last.startswith("max_abs_diff=") and " kl=" in last
  assert float(last.split()[0].split("=")[1]) < 1e-4
  bad = subprocess.run(
    [sys.executable, "-m", "empo2_jax.model.check", "--hf_dir", hf_tiny[0], "--max_abs_diff", "0"],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert bad.returncode == 1
