"""A LoRA run end to end (configs/frozenlake.py:tiny, bf16 frozen base, rank-8 adapters, a KL
term against the base): a run resumed from its checkpoint repeats the uninterrupted run's
metrics, the checkpoint holds the adapters and not the base, a changed base is refused on resume,
and the exported HF directory (merged) and peft adapters give the run's logits in transformers."""

import json
import os

import numpy as np
import pytest

import jax

from configs import frozenlake
from tests.conftest import hf_logits, random_batch


def _config(iterations):
  c = frozenlake.get_config("tiny")
  c.model.lora_rank = 8
  c.model.lora_alpha = 16.0
  c.model.param_dtype = "bfloat16"  # a frozen base may be bf16; the adapters stay fp32
  c.loss.kl_coef = 0.01  # the reference is the base (the adapters off)
  c.optim.lr = 1e-2
  c.train.iterations = iterations
  c.train.checkpoint_every = 1
  return c


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["iteration"]: r for r in map(json.loads, filter(str.strip, f))}


def _comparable(record):
  return {k: v for k, v in record.items() if k != "time" and not k.startswith(("time/", "host/"))}


@pytest.mark.slow
def test_lora_run_resumes_exactly_and_exports(tmp_path):
  from peft import PeftModel
  from transformers import AutoModelForCausalLM

  from empo2_jax.model import hf, llama, lora
  from empo2_jax.train import export
  from empo2_jax.train.trainer import Trainer

  whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
  Trainer(_config(2), whole, progress=False).run()

  first = Trainer(_config(1), parts, progress=False)
  base_before = jax.tree.map(np.asarray, lora.split(first.state.params)[1])
  first.run()  # iteration 1, checkpointed
  saved = export.restore(export.checkpoint_dir(parts)[1])[1]
  assert saved["layers"] and all(lora.is_adapter(k) for k in saved["layers"])
  assert set(saved) == {"layers"}  # no embedding, norms or base layer weights on disk

  resumed = Trainer(_config(2), parts, progress=False)
  try:
    assert resumed.resume() == 1
    base_after = lora.split(resumed.state.params)[1]
    for a, b in zip(jax.tree.leaves(base_before), jax.tree.leaves(base_after)):
      np.testing.assert_array_equal(a, np.asarray(b))  # one update left the base as it was
    resumed.run()
    params = jax.device_get(resumed.state.params)
    config = resumed.model_config
  finally:
    resumed.close()
  want, got = _records(whole), _records(parts)
  assert sorted(got) == [1, 2] and want[2]["loss/kl_ref"] > 0
  assert _comparable(got[2]) == _comparable(want[2])

  other = Trainer(_config(2), parts, progress=False)  # the same run over another base
  other.base_fingerprint = "0" * 64
  try:
    with pytest.raises(ValueError, match="fingerprint"):
      other.resume()
  finally:
    other.close()

  out, peft_out = str(tmp_path / "hf"), str(tmp_path / "peft")
  export.export_run(parts, out, peft_out=peft_out)
  tokens, mask = random_batch(np.random.default_rng(0), 2, 12, config.vocab_size)
  ours = np.asarray(llama.forward(params, config.replace(compute_dtype="float32"), tokens, mask))
  merged = AutoModelForCausalLM.from_pretrained(out, dtype="float32").eval()
  assert np.abs(hf_logits(merged, tokens, mask) - ours).max() <= 1e-4
  base = jax.tree.map(lambda x: np.asarray(x, np.float32), lora.split(params)[1])
  hf.save_checkpoint(str(tmp_path / "base"), config.replace(param_dtype="float32"), base)
  plain = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), dtype="float32")
  with_peft = PeftModel.from_pretrained(plain, peft_out).eval()
  assert np.abs(hf_logits(with_peft, tokens, mask) - ours).max() <= 1e-4
