"""The memory-into-weights methods train end to end (tiny FrozenLake, two iterations, every
iteration a memory one): ctx_distill samples WITHOUT tips while retrieving them in the shadow and
trains on their teacher view; opid scores each turn with its episode's hindsight tip;
empo2_release rolls out with tips and updates with the release's ratio and length check."""

import pytest

from configs import frozenlake
from empo2_jax import methods


def _run(tmp_path, name, iterations=2):
  from empo2_jax.train.trainer import Trainer

  c = frozenlake.get_config("tiny")
  methods.apply(c, name)
  c.empo2.force_mode = "off"
  c.memory.threshold = -1.0  # every stored tip is similar enough: iteration 2 retrieves some
  c.env.num_train_variations = (
    c.rollout.variations_per_iter
  )  # iteration 2 revisits iteration 1's slots
  c.train.iterations = iterations
  return Trainer(c, str(tmp_path), progress=False).run()


def test_registry_entries_set_their_configuration():
  c = frozenlake.get_config("tiny")
  methods.apply(c, "empo2_release")
  assert c.empo2.ratio_variant == "release" and c.optim.prompt_len_check == "sampled"
  assert c.loss.low_prob_mask is False and c.advantage.estimator == "grpo_rollout"
  c = frozenlake.get_config("tiny")
  methods.apply(c, "ctx_distill")
  assert c.ctx_distill.enabled and c.loss.ctx_kl_coef == 1.0
  hooks = methods.Hooks(c)
  assert hooks.memory_view("off") == "shadow" and hooks.memory_view("on") == "none"
  c = frozenlake.get_config("tiny")
  methods.apply(c, "opid")
  assert c.opid.enabled and c.loss.opid_coef == 1.0
  assert methods.Hooks(c).memory_view("off") == "none"


@pytest.mark.slow
def test_ctx_distill_trains_on_shadow_tips(tmp_path):
  first, second = _run(tmp_path, "ctx_distill")
  for m in (first, second):
    assert m["retrieval_hits_per_step"] == 0  # nothing shown to the sampler
  assert second["ctx_distill/shadow_tips_mean"] > 0  # the memory of iteration 1, retrieved
  assert second["ctx_distill/teacher_turns"] > 0 and second["teacher/turns"] > 0
  assert "loss/ctx_kl" in second and "loss/ctx_kl_k1" in second
  assert 0 < second["loss/ratio_p50"] < 10


@pytest.mark.slow
def test_opid_scores_the_hindsight_tip(tmp_path):
  (m,) = _run(tmp_path, "opid", iterations=1)
  assert m["retrieval_hits_per_step"] == 0
  assert m["opid/teacher_turns"] > 0 and m["teacher/turns"] == m["opid/teacher_turns"]


@pytest.mark.slow
def test_empo2_release_trains(tmp_path):
  (m,) = _run(tmp_path, "empo2_release", iterations=1)
  assert m["mode"] == "off" and "loss/pos_adv_low_ratio" in m
