"""Episode-packed update == one row per turn: log-probs, masks, losses and gradients (1e-5)."""

import dataclasses

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from empo2_jax.envs.scienceworld import prompts
from empo2_jax.envs.fewshot import PromptMaterial
from empo2_jax.model import configs as model_configs
from empo2_jax.model import llama
from empo2_jax.model.tokenizer import IM_END_ID, load_tokenizer
from empo2_jax.rl import minibatch
from empo2_jax.rl.batch import Turn, build_batch, build_packed_batch
from empo2_jax.rl.update import init_train_state, make_optimizer, make_update_fn
from tests.helpers.rl_settings import batch_config, loss_config, update_config

MATERIAL = PromptMaterial(
  task_description="Find a non-living thing and move it to the red box.",
  action_templates=("look around", "go to LOC", "focus on OBJ"),
  inventory="nothing",
  focus_items=("cup", "chair"),
  few_shot=(),
)
ACTIONS = ["look around", "go to kitchen", "focus on cup", "move cup to red box", "wait"]


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer()


def episode_turns(tok, rollout_id, group_id, n_turns, mode, rng, ret):
  """Turns of one episode as the actor records them: the chat grows by the raw answer and the
  next observation; memory modes carry tip blocks in every user message."""
  tips = ["open the door first", f"tip {rollout_id}"] if mode != "on" else []
  messages = [
    {
      "role": "user",
      "content": prompts.first_user_message(MATERIAL, f"You are in room {rollout_id}.", tips),
    }
  ]
  out = []
  for t in range(n_turns):
    action = ACTIONS[(t + rollout_id) % len(ACTIONS)]
    ids = tok(action, add_special_tokens=False)["input_ids"] + [IM_END_ID]
    out.append(
      Turn(
        messages=list(messages),
        response=action,
        response_ids=ids,
        sampler_logprobs=list(rng.normal(-1.0, 0.3, len(ids))),
        mode=mode,
        group_id=group_id,
        rollout_id=rollout_id,
        step=t,
        episode_return=ret,
      )
    )
    messages = messages + [
      {"role": "assistant", "content": action},
      {
        "role": "user",
        "content": prompts.step_user_message(f"Observation {t} of episode {rollout_id}.", tips),
      },
    ]
  return out


def make_turns(tok, mode, seed=0):
  rng = np.random.default_rng(seed)
  turns = []
  for r, n in enumerate((3, 2, 4, 1)):
    turns += episode_turns(tok, r, r // 2, n, mode, rng, ret=float(10 * r))
  return turns


def tiny():
  cfg = model_configs.get_preset("tiny")
  return cfg, llama.init_params(cfg, jax.random.PRNGKey(5), std=0.05)


def run_update(cfg, params, batch, ucfg, seed=(0, 1)):
  arranged, _ = minibatch.arrange(batch, ucfg, seed=seed)
  opt = make_optimizer(ucfg)
  update = make_update_fn(cfg, ucfg, opt, donate=False)
  state, met = update(init_train_state(jax.tree.map(jnp.copy, params), opt), arranged)
  met = jax.device_get(met)
  met.pop("per_sample")
  return state, {k: float(v) for k, v in met.items()}


@pytest.mark.parametrize(
  "mode,variant",
  [("off", "paper")]
  + [
    pytest.param(*p, marks=pytest.mark.slow)
    for p in (("on", "paper"), ("off", "release"), ("on_tips", "paper"))
  ],
)
def test_packed_update_equals_per_turn_update(tok, mode, variant):
  cfg, params = tiny()
  turns = make_turns(tok, mode)
  adv = np.random.default_rng(1).normal(size=len(turns)).astype(np.float32)
  bcfg = batch_config(
    max_prompt_len=2048,
    response_len=8,
    ratio_variant=variant,
    micro_rows=2,
    pad_id=tok.pad_token_id,
  )
  per_turn, s1 = build_batch(turns, adv, tok, bcfg)
  packed, s2 = build_packed_batch(turns, adv, tok, bcfg)
  assert s2["packed_rows"] == 4 and s1["n_samples"] == s2["n_samples"] == len(turns)
  assert s2["tokens"] * 2 < s1["tokens"]  # history is carried once per episode
  # The random policy gives log-probs near -12; this delta masks some turns and not others.
  loss = loss_config(low_prob_delta=-12.2)
  # One optimizer step over all turns (the split differs between layouts by construction); a large
  # Adam eps makes the step linear in the gradient, so parameters compare gradients.
  ucfg = update_config(
    minibatch_size=64, micro_rows=2, lr=1e-2, eps=1.0, loss=loss, vocab_chunk=4096
  )
  st1, m1 = run_update(cfg, params, per_turn, ucfg)
  st2, m2 = run_update(cfg, params, packed, ucfg)
  assert m1["optim_steps"] == m2["optim_steps"] == 1
  assert 0.0 < m1["masked_frac"] < 1.0
  for k in (
    "masked_frac",
    "n_tokens",
    "old_logp_mean",
    "sampler_vs_old_logp_absdiff",
    "loss",
    "pg_loss",
    "entropy",
    "grad_norm",
    "update_norm",
  ):
    np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, atol=1e-6, err_msg=k)
  for a, b in zip(jax.tree.leaves(st1.params), jax.tree.leaves(st2.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.parametrize("layout", [pytest.param("packed", marks=pytest.mark.slow), "turn"])
def test_a_grown_update_shape_takes_the_same_steps(tok, layout):
  """update_shapes="grow": a batch padded to a larger length, turn axis, slot count and slot size
  (the run's high-water shape) takes the same optimizer steps on the same samples as the batch in
  its own buckets: parameters and metrics match."""
  cfg, params = tiny()
  turns = make_turns(tok, "on")
  adv = np.random.default_rng(2).normal(size=len(turns)).astype(np.float32)
  bcfg = batch_config(max_prompt_len=2048, response_len=8, micro_rows=2, pad_id=tok.pad_token_id)
  ucfg = update_config(minibatch_size=4, micro_rows=2, lr=1e-2, vocab_chunk=4096)
  if layout == "packed":
    fit, _ = build_packed_batch(turns, adv, tok, bcfg)
    grown, _ = build_packed_batch(turns, adv, tok, bcfg, min_len=fit["cur_tokens"].shape[1] + 96,
                                  min_turns=fit["sample_index"].shape[1] + 3)  # fmt: skip
  else:
    fit, _ = build_batch(turns, adv, tok, bcfg)
    grown, _ = build_batch(turns, adv, tok, bcfg, min_len=fit["cur_tokens"].shape[1] + 96)
  assert grown["cur_tokens"].shape[1] == fit["cur_tokens"].shape[1] + 96
  a, lay_a = minibatch.arrange(fit, ucfg, seed=(0, 3))
  b, lay_b = minibatch.arrange(grown, ucfg, seed=(0, 3), min_slots=lay_a["slots"] + 2,
                               min_slot_rows=2 * lay_a["slot_rows"])  # fmt: skip
  assert lay_b["slots"] == lay_a["slots"] + 2 and lay_b["rows"] > lay_a["rows"]
  assert (
    lay_b["num_minibatches"] == lay_a["num_minibatches"] > 1 and lay_b["sizes"] == lay_a["sizes"]
  )
  with pytest.raises(ValueError, match="multiple of micro_rows"):
    minibatch.arrange(fit, ucfg, seed=0, min_slot_rows=3)
  opt = make_optimizer(ucfg)
  update = make_update_fn(cfg, ucfg, opt, donate=False)
  st_a, m_a = update(init_train_state(jax.tree.map(jnp.copy, params), opt), a)
  st_b, m_b = update(init_train_state(jax.tree.map(jnp.copy, params), opt), b)
  assert int(m_a["optim_steps"]) == int(m_b["optim_steps"]) == lay_a["num_minibatches"]
  for k in ("loss", "n_tokens", "grad_norm", "update_norm"):
    np.testing.assert_allclose(float(m_b[k]), float(m_a[k]), rtol=1e-5, atol=1e-6, err_msg=k)
  for x, y in zip(jax.tree.leaves(st_a.params), jax.tree.leaves(st_b.params)):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=1e-5)


def test_packed_minibatches_are_counted_in_turn_samples(tok):
  cfg, params = tiny()
  rng = np.random.default_rng(0)
  turns = []
  for r in range(8):
    turns += episode_turns(tok, r, r // 4, 5, "on", rng, ret=float(r))
  adv = rng.normal(size=len(turns)).astype(np.float32)
  bcfg = batch_config(max_prompt_len=2048, response_len=8, micro_rows=1, pad_id=tok.pad_token_id)
  packed, stats = build_packed_batch(turns, adv, tok, bcfg)
  assert stats["packed_rows"] == 8
  ucfg = update_config(
    minibatch_size=10, micro_rows=1, vocab_chunk=4096, loss=loss_config(low_prob_mask=False)
  )
  arranged, lay = minibatch.arrange(packed, ucfg, seed=(0, 3))
  assert lay["num_minibatches"] == 4 and lay["slot_rows"] == 2 and sorted(lay["sizes"]) == [2] * 4
  _, met = run_update(cfg, params, packed, ucfg, seed=(0, 3))
  assert met["optim_steps"] == 4 and met["update_norm"] > 0


def test_a_turn_whose_history_was_retokenised_differently_gets_its_own_row(tok):
  turns = make_turns(tok, "on")[:3]  # episode 0: three turns
  # Turn 1's chat shows a different answer than the ids turn 0 sampled (e.g. stripped text).
  turns[0] = dataclasses.replace(
    turns[0],
    response_ids=tok(" look", add_special_tokens=False)["input_ids"] + [IM_END_ID],
    sampler_logprobs=[-1.0, -1.0],
  )
  bcfg = batch_config(max_prompt_len=2048, response_len=8, micro_rows=1, pad_id=tok.pad_token_id)
  packed, stats = build_packed_batch(turns, np.ones(3, np.float32), tok, bcfg)
  assert stats["packed_rows"] == 2
  assert packed["sample_index"][:2, :2].tolist() == [[0, -1], [1, 2]]


@pytest.mark.parametrize("layout", ["packed", "turn"])
def test_max_update_shape_bounds_every_batch_of_the_config(tok, layout):
  """update_shapes="max": no batch the config allows (variations_per_iter x group_size episodes of 1
  to max_steps turns, any mode) is larger than settings.max_update_shape, and with it as the floor
  every iteration's update has exactly that shape: one update program for the run."""
  from configs import sciworld
  from empo2_jax.train import settings
  from empo2_jax.train.iteration import UPDATE_FLOOR_KEYS

  c = sciworld.get_config("tiny")
  with c.unlocked():
    c.rollout.variations_per_iter, c.rollout.group_size, c.env.max_steps = 2, 3, 5
    c.rollout.max_context, c.optim.max_prompt_len = 1024, 1024 - c.rollout.max_new_tokens
    c.optim.minibatch_size, c.optim.micro_rows, c.optim.layout = 4, 2, layout
  bcfg = settings.batch_config(c, tok.pad_token_id)
  ucfg = settings.update_config(c)
  top = settings.max_update_shape(c, bcfg, ucfg)
  build = build_packed_batch if layout == "packed" else build_batch
  rng = np.random.default_rng(0)
  seen = {k: 0 for k in UPDATE_FLOOR_KEYS}
  for trial in range(12):
    mode = ("on", "off", "on_tips")[trial % 3]
    turns = []
    for r in range(6):
      n = 5 if trial % 4 == 0 else int(rng.integers(1, 6))
      turns += episode_turns(tok, r, r // 3, n, mode, rng, ret=float(rng.integers(0, 100)))
    adv = rng.normal(size=len(turns)).astype(np.float32)
    kw = {"min_turns": top["turns"]} if layout == "packed" else {}
    for floors in (False, True):
      batch, _ = build(turns, adv, tok, bcfg, **(dict(min_len=top["len"], **kw) if floors else {}))
      assert int(batch["cur_attn"].sum(axis=1).max()) <= c.rollout.max_context
      out, lay = minibatch.arrange(
        batch, ucfg, seed=(0, trial), **(
          dict(min_slots=top["slots"], min_slot_rows=top["slot_rows"]) if floors else {}
        )
      )  # fmt: skip
      shape = minibatch.update_shape(out, lay)
      if floors:
        assert shape == top, (trial, shape, top)
      else:
        assert all(shape[k] <= top[k] for k in shape), (trial, shape, top)
        seen = {k: max(v, shape[k]) for k, v in seen.items()}
  # the bound is not slack everywhere: the turn axis and the slot count reach it
  assert seen["slots"] == top["slots"] and seen["turns"] == top["turns"], (seen, top)
