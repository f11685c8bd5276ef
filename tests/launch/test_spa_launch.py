"""SPA's stages on FrozenLake (configs/frozenlake.py:tiny): stage A records the env's true states
(replayed in a local env); launch/spa.py runs SFT on world-model chats and RL from the SFT policy
with Pass@k in its evaluations."""

import json
import os
import subprocess
import sys

import pytest

from configs import frozenlake
from empo2_jax import methods

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spa_command(workdir) -> list[str]:
  """launch/spa.py on FrozenLake tiny, one SFT epoch and one RL iteration (also test_gcs_launch)."""
  return [
    sys.executable,
    os.path.join(ROOT, "launch", "spa.py"),
    "--config=" + os.path.join(ROOT, "configs", "frozenlake.py") + ":tiny",
    f"--workdir={workdir}",
    "--config.spa.sft_epochs=1",
    "--config.spa.extra_new_tokens=8",
    "--config.sft.batch_rows=2",
    "--config.sft.lr=1e-3",
    "--config.train.iterations=1",
    "--config.train.eval_at_end=True",
    "--config.train.eval_repeats=2",
    "--no_progress",
  ]


def _local_env(c):
  from empo2_jax.envs import frozenlake as fl

  return fl.FrozenLakeEnv(fl.env_config(c))


@pytest.mark.slow
def test_stage_a_episodes_hold_the_true_states(tmp_path):
  from empo2_jax.methods import spa
  from empo2_jax.train import spa_run
  from empo2_jax.train.trainer import Trainer

  c = frozenlake.get_config("tiny")
  methods.apply(c, "spa")
  c.spa.collect_iterations = 1
  c.spa.extra_new_tokens = 8
  trainer = Trainer(c, str(tmp_path), progress=False)
  try:
    episodes = spa_run.collect(trainer, c)
  finally:
    trainer.close()
  assert len(episodes) == c.rollout.variations_per_iter * c.rollout.group_size
  env = _local_env(c)
  for e in episodes:
    assert e.messages[0]["content"].startswith(spa.WM_INSTRUCTION)
    assert len(e.extras["states"]) == len(e.turns) + 1
    assert e.extras["states"][0] == env.reset(e.task, e.variation).info.state
    for t, turn in enumerate(e.turns):  # the env read the answer span of the raw response
      res = env.step(spa.action_text(turn.response))
      assert e.extras["states"][t + 1] == res.info.state
      assert "You have" not in e.extras["states"][t + 1]  # the bare state, not the observation


def _gold_chats(c, n):
  """World-model chats of gold episodes (true states, gold actions) of n train seeds."""
  from empo2_jax.methods import spa

  env = _local_env(c)
  chats = []
  for v in env.used_variations(c.env.task, "train")[:n]:
    obs, info = env.reset(c.env.task, v)
    msgs, states, actions = [], [info.state], []
    for action in env.gold_actions(c.env.task, v)[: c.env.max_steps]:
      msgs += [{"role": "user", "content": obs}, {"role": "assistant", "content": action}]
      obs, _, done, step = env.step(action)
      states.append(step.state)
      actions.append(step.executed_action)
      if done:
        break
    chats.append(spa.episode_chat(msgs, states, actions))
  return chats


@pytest.mark.slow
def test_launch_spa_sft_then_rl_with_pass_at_k(tmp_path):
  """Stage A's files given (gold world-model chats): launch/spa.py trains on them, exports the
  policy, then runs RL from it with eval pass@1 / pass@k; a rerun skips A and B."""
  c = frozenlake.get_config("tiny")
  chats = _gold_chats(c, 3)
  assert all("<observation>" in m["content"] for ch in chats for m in ch[1::2])
  spa_dir = tmp_path / "run" / "spa"
  spa_dir.mkdir(parents=True)
  for name, part in (("train", chats[:2]), ("val", chats[2:])):
    (spa_dir / f"wm_{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in part))
  (spa_dir / "collect.json").write_text(json.dumps({"episodes": 3}))
  cmd = spa_command(tmp_path / "run")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  info = json.loads((spa_dir / "collect.json").read_text())
  assert info["sft_steps"] == 1 and info["val_loss_after"] < info["val_loss_before"]
  assert os.path.exists(spa_dir / "sft" / "hf" / "config.json")
  rec = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert len(rec) == 1 and rec[0]["eval/k"] == 2
  assert 0.0 <= rec[0]["eval/pass@1"] <= rec[0]["eval/pass@k"] <= 1.0
  again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "stages A and B skipped" in again.stdout
