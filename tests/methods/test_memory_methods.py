"""The memory-into-weights methods train end to end (tiny FrozenLake, two iterations, every
iteration a memory one): ctx_distill samples WITHOUT tips while retrieving them in the shadow and
trains on their teacher view; opid scores each turn with its episode's hindsight tip;
empo2_release rolls out with tips and updates with the release's ratio and length check."""

import numpy as np
import pytest

from configs import frozenlake
from empo2_jax import methods
from empo2_jax.train.build import ConfigError, check_config


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


def _episode(group, shown, ret, failed=False):
  from empo2_jax.agent.episode import Episode

  e = Episode("t", group, group, 0, "off", shown)
  e.shadow_memory, e.score, e.env_failed = not shown, ret, failed
  return e


def test_edge_gate_opens_the_groups_whose_tip_half_scored_higher():
  from empo2_jax.methods.ctx_distill import edge_gate

  eps = [
    *(_episode(0, True, r) for r in (1.0, 3.0)),  # tips mean 2.0 > 1.5: open
    *(_episode(0, False, r) for r in (1.0, 2.0)),
    *(_episode(1, True, r) for r in (1.0, 1.0)),  # a tie stays closed
    *(_episode(1, False, r) for r in (0.0, 2.0)),
    _episode(2, True, 5.0, failed=True),  # the tip half's only episode failed: closed
    _episode(2, False, 0.0),
    _episode(3, True, 0.0),  # a failed tip-free episode counts in neither mean ...
    _episode(3, False, 1.0, failed=True),
    _episode(3, False, -1.0),
  ]
  opened, m = edge_gate(eps)
  assert opened == [eps[2], eps[3], eps[11], eps[12]]  # ... but is taught with its group
  assert m["ctx_distill/edge_open_share"] == 2 / 4
  gaps = [np.mean([1, 3]) - np.mean([1, 2]), np.mean([1, 1]) - np.mean([0, 2]), 0.0 - (-1.0)]
  assert m["ctx_distill/edge_gap_mean"] == pytest.approx(np.mean(gaps))


def test_edge_gate_needs_groups_of_two():
  c = frozenlake.get_config("tiny")
  methods.apply(c, "ctx_distill")
  c.ctx_distill.edge_gate = True
  assert methods.Hooks(c).memory_view("off") == "split"
  c.rollout.group_size = 1  # refused for every run (rl/advantages.AdvantageSettings)
  with pytest.raises(ConfigError, match="rollout.group_size=1: must be >= 2"):
    check_config(c)


@pytest.mark.slow
def test_edge_gate_teaches_only_the_tip_free_half_of_open_groups(tmp_path):
  from empo2_jax.train.trainer import Trainer

  c = frozenlake.get_config("tiny")
  methods.apply(c, "ctx_distill")
  c.ctx_distill.edge_gate = True
  c.empo2.force_mode = "off"
  c.memory.threshold = -1.0
  c.env.num_train_variations = c.rollout.variations_per_iter
  half = c.rollout.group_size // 2
  trainer = Trainer(c, str(tmp_path), progress=False)
  try:
    trainer.train_iteration()
    trainer.iteration += 1
    result = trainer.train_iteration()
  finally:
    trainer.close()
  eps, m = result.episodes, result.metrics
  by_group = {}
  for e in sorted(eps, key=lambda e: e.rollout_id):
    by_group.setdefault(e.group_id, []).append(e)
  opened = 0
  for grp in by_group.values():
    assert [e.use_memory for e in grp] == [j < half for j in range(len(grp))]
    assert [e.shadow_memory for e in grp] == [j >= half for j in range(len(grp))]
    tips_half, free_half = grp[:half], grp[half:]
    assert all(not e.shadow_tips for e in tips_half)
    assert all(len(e.shadow_tips) == len(e.turns) for e in free_half)
    assert all(not any(t) for e in free_half for t in e.tips_shown)  # nothing shown
    assert all(t.teacher_messages is None for e in tips_half for t in e.turns)
    ok = [e for e in grp if not e.env_failed]
    gap = np.mean([e.score for e in ok if e.use_memory]) - np.mean(
      [e.score for e in ok if e.shadow_memory]
    )
    for e in free_half:
      for t, shadow in zip(e.turns, e.shadow_tips):
        assert (t.teacher_messages is not None) == bool(gap > 0 and shadow)
    opened += gap > 0
  assert m["ctx_distill/edge_open_share"] == opened / len(by_group)
  assert m["retrieval_hits_per_step"] > 0  # the tip half saw iteration 1's tips


def test_an_iteration_without_teacher_views_says_it_trained_plain_grpo(caplog):
  """report_teacher_views: with views, plain_grpo 0; without, 1 and one log line a run (empty
  slots: a memory still being built, or no episode tip); slots that held tips yet none was
  retrieved: NoTeacherError, naming the settings to check."""
  from empo2_jax.methods import teacher_views as tv

  ctx = methods.RolloutContext(rollout=None, seed=0, memory_entries=0)
  tv._WARNED_NO_TEACHER.discard("ctx_distill")
  assert tv.report_teacher_views(ctx, "ctx_distill", 5, tips_read=True) == {
    "ctx_distill/plain_grpo": 0.0
  }
  with caplog.at_level("WARNING", logger="empo2_jax"):
    for _ in range(3):
      m = tv.report_teacher_views(ctx, "ctx_distill", 0, tips_read=True)
      assert m == {"ctx_distill/plain_grpo": 1.0}
  lines = [r.getMessage() for r in caplog.records if "plain GRPO" in r.getMessage()]
  assert len(lines) == 1 and "memory slots were empty" in lines[0]
  held = methods.RolloutContext(rollout=None, seed=0, memory_entries=8)
  with pytest.raises(tv.NoTeacherError, match="held 8 tips .* memory.threshold"):
    tv.report_teacher_views(held, "ctx_distill", 0, tips_read=True)
  # a teacher from the episodes' own tips (OPID's default) does not read the memory: no error
  assert tv.report_teacher_views(held, "opid", 0, tips_read=False) == {"opid/plain_grpo": 1.0}


def test_opid_reads_its_hindsight_from_the_memory_when_asked():
  c = frozenlake.get_config("tiny")
  methods.apply(c, "opid")
  assert methods.Hooks(c).memory_view("off") == "none"  # OPID's own tip: no retrieval
  c.opid.tip_source = "memory"
  hooks = methods.Hooks(c)
  assert hooks.memory_view("off") == "shadow" and hooks.memory_view("on") == "none"
  c.opid.tip_source = "oracle"
  with pytest.raises(ValueError, match="opid.tip_source='oracle'; valid: episode, memory"):
    methods.check(c)
