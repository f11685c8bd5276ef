"""The format-only warm start (config sft.tasks, train/sft_gold.py): which tasks' gold paths SFT
trains on, that the target task's never enter the data, and the error when it is listed."""

import os
import subprocess
import sys

import pytest

from empo2_jax import defaults
from empo2_jax.envs.scienceworld.env import ALL_TASKS
from empo2_jax.train.sft_gold import gold_chats, sft_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = "find-non-living-thing"


def test_task_list_default_is_the_target_and_a_list_excludes_it():
  assert sft_tasks("", TARGET, ALL_TASKS) == (TARGET,)
  assert sft_tasks(" find-plant, boil ,find-plant", TARGET, ALL_TASKS) == ("find-plant", "boil")
  with pytest.raises(ValueError, match="lists the target task env.task='find-non-living-thing'"):
    sft_tasks(f"boil,{TARGET}", TARGET, ALL_TASKS)
  with pytest.raises(ValueError, match=r"unknown task\(s\) \['bake'\]; valid: boil"):
    sft_tasks("boil,bake", TARGET, ALL_TASKS)


def test_format_variant_lists_other_tasks_only():
  c = defaults.load_config(os.path.join(ROOT, "configs", "sciworld.py") + ":learn,format")
  tasks = sft_tasks(c.sft.tasks, c.env.task, ALL_TASKS)
  assert len(tasks) >= 3 and c.env.task not in tasks
  assert not c.sft.eval_before and not c.sft.eval_after  # no look at any test variation
  # the RL arms keep the authors' correction; only the SFT's gold replay runs actions as written
  assert c.env.action_correction == "always"
  # the EMPO2 arms run the paper's p = 0.25 and q = 2/3, not the CPU demo's 0.5 / 0.5
  assert (c.empo2.p_memory, c.empo2.q_offpolicy) == (0.25, 2.0 / 3.0)
  c2 = defaults.load_config(os.path.join(ROOT, "configs", "sciworld.py") + ":learn")
  assert c2.sft.tasks == "" and c2.sft.eval_before  # today's behaviour unchanged
  with pytest.raises(ValueError, match="'format' modifies 'learn'"):
    defaults.load_config(os.path.join(ROOT, "configs", "sciworld.py") + ":cpu,format")


@pytest.mark.slow
def test_gold_data_holds_the_listed_tasks_train_variations_and_never_the_target():
  from empo2_jax.envs.scienceworld.env import SciWorldConfig
  from empo2_jax.train.sft_gold import gold_env

  env = gold_env(SciWorldConfig(default_max_steps=10, action_correction="always"))
  try:
    tasks = sft_tasks("lifespan-longest-lived,find-plant", TARGET, ALL_TASKS)
    chats = gold_chats(env, tasks, variations=2, max_turns=10)
    assert [(g.task, g.variation) for g in chats] == [
      (t, v) for t in tasks for v in env.variations(t, "train")[:2]
    ]
    target_texts = set()
    for v in env.variations(TARGET, "train")[:20]:
      target_texts.add(env.reset(TARGET, v).info.task_description)
    for g in chats:
      assert g.variation in env.variations(g.task, "train")
      description = env.reset(g.task, g.variation).info.task_description
      first = g.messages[0]["content"]
      assert description in first  # the row is that task's own episode
      text = "\n".join(m["content"] for m in g.messages)
      assert not any(t in text for t in target_texts)
      answers = [m["content"] for m in g.messages if m["role"] == "assistant"]
      assert answers == env.gold_actions(g.task, g.variation)[: len(answers)]  # as written
      assert 1 <= len(answers) <= 10
  finally:
    env.close()


def test_launch_sft_refuses_a_list_with_the_target_before_loading_anything(tmp_path):
  cmd = [
    sys.executable,
    os.path.join(ROOT, "launch", "sft.py"),
    "--config=" + os.path.join(ROOT, "configs", "sciworld.py") + ":tiny",
    f"--workdir={tmp_path / 'sft'}",
    "--config.sft.tasks=find-plant,find-animal",  # tiny's target is find-animal
  ]
  out = subprocess.run(
    cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )  # fmt: skip
  assert out.returncode == 2
  assert "error: sft.tasks lists the target task env.task='find-animal'" in out.stderr
  assert "--config.sft.tasks=find-plant" in out.stderr  # says what to pass instead
