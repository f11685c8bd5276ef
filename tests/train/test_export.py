"""launch/export.py: a run's checkpoint -> a Hugging Face directory that transformers loads and
decodes greedily exactly as our sampler does (tiny random-init model after 2 AdamW steps)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = ["Where is the red box?", "look around", "Name one animal."]
NEW_TOKENS = 6


def _trained_checkpoint(workdir, sub="checkpoints"):
  """A tiny-config run's checkpoint at step 2, written by train/checkpoint.py, after two AdamW
  steps of next-token loss (so the exported weights are not the init)."""
  import optax

  from empo2_jax.defaults import load_config
  from empo2_jax.memory.store import MemoryStore
  from empo2_jax.model import configs, llama
  from empo2_jax.rl.update import TrainState
  from empo2_jax.train import checkpoint as ckpt_lib

  c = load_config(os.path.join(ROOT, "configs", "sciworld.py:tiny"))
  cfg = configs.get_preset(c.model.preset, param_dtype="float32", compute_dtype="float32")
  params = llama.init_params(cfg, jax.random.PRNGKey(c.seed))
  opt = optax.adamw(1e-2)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, 1000)
  mask = jnp.ones_like(tokens)

  def loss(p):
    logits = llama.forward(p, cfg, tokens[:, :-1], mask[:, :-1])
    lp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(lp, tokens[:, 1:, None], -1).mean()

  state = TrainState(params, opt.init(params), jnp.int32(0))
  for _ in range(2):
    grads = jax.grad(loss)(state.params)
    updates, opt_state = opt.update(grads, state.opt_state, state.params)
    state = TrainState(optax.apply_updates(state.params, updates), opt_state, state.step + 1)
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, sub), async_save=False)
  meta = {"format": 1, "iteration": 2, "variation_cursor": 0, "config": json.loads(c.to_json())}
  blob = ckpt_lib.memory_to_blob(MemoryStore())
  ckpt.save(2, {"train": state, "rng": np.asarray(jax.random.PRNGKey(0))}, blob, meta, wait=True)
  ckpt.close()
  return cfg, state.params


def _export(workdir, out, *extra):
  return subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "launch", "export.py"),
      f"--workdir={workdir}",
      f"--out={out}",
      *extra,
    ],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=ROOT,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )


@pytest.mark.slow  # ~1-2 min on 2 busy cores: a JAX compile, an export subprocess, torch
def test_export_loads_in_transformers_and_decodes_like_our_sampler(tmp_path):
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  from empo2_jax.sampling import sampler

  cfg, params = _trained_checkpoint(tmp_path / "run")
  out = tmp_path / "hf"
  done = _export(tmp_path / "run", out)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "exported kind=rl step=2" in done.stdout
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))

  tok = AutoTokenizer.from_pretrained(out)
  assert tok.chat_template and "<|im_start|>" in tok.chat_template
  model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  prompts = [
    tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
    for p in PROMPTS
  ]
  prompts = [list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts]
  ours = sampler.generate(
    params, cfg, prompts, max_new_tokens=NEW_TOKENS, temperature=0.0, rng=jax.random.PRNGKey(0)
  )
  for prompt, (tokens, _) in zip(prompts, ours):
    ids = torch.tensor([prompt])
    with torch.no_grad():
      for _ in range(NEW_TOKENS):  # greedy: the argmax of transformers' forward, token by token
        nxt = model(ids).logits[0, -1].argmax()
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    assert ids[0, len(prompt) :].tolist() == tokens.tolist()


def test_export_refuses_a_workdir_without_checkpoint(tmp_path):
  (tmp_path / "empty").mkdir()
  out = _export(tmp_path / "empty", tmp_path / "hf")
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")
  assert "no checkpoint" in lines[0] and not (tmp_path / "hf").exists()
