"""The gold data of launch/sft.py: which tasks, which variations, rendered as the actor's chats.

    tasks = sft_tasks(c.sft.tasks, c.env.task, ALL_TASKS)   # "" -> (c.env.task,)
    env = gold_env(env_config)                               # gold actions run as written
    chats = gold_chats(env, tasks, variations=c.sft.variations, max_turns=10, n_few_shot=0)
    chats[k].task, chats[k].variation, chats[k].messages  # messages: train/sft.gold_chat

Two warm starts (config `sft.tasks`, defaults.py):
  ""              the target task's own gold paths (the learning experiment, docs/results.md);
  "a,b,..."       a FORMAT-ONLY warm start: gold paths of the listed OTHER tasks teach the action
                  format (verbs, object names, one action a line) and nothing about the target task
                  `env.task`, which must not be listed (ValueError otherwise).
Gold paths come from TRAIN variations only (envs/fewshot.replay_gold refuses any other), and only
successful replays are kept.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from empo2_jax.train import sft


@dataclasses.dataclass(frozen=True)
class GoldChat:
  """One gold episode as SFT data: where it came from and the actor's chat of it."""

  task: str
  variation: int  # a train variation of `task`
  messages: list  # train/sft.gold_chat: user/assistant messages, the gold actions as answers


def sft_tasks(spec: str, target: str, valid: Sequence[str]) -> tuple[str, ...]:
  """The tasks whose gold paths SFT trains on, from config `sft.tasks` (comma-separated).

  "" -> (target,): behaviour cloning on the target task. Otherwise the listed tasks in order,
  without repeats; each must be one of `valid`, and the target must not be among them (a
  format-only warm start never sees the target's gold paths). Raises ValueError saying what to
  pass."""
  names = [t.strip() for t in str(spec or "").split(",") if t.strip()]
  if not names:
    return (target,)
  unknown = [t for t in names if t not in valid]
  if unknown:
    raise ValueError(f"sft.tasks: unknown task(s) {unknown}; valid: {', '.join(valid)}")
  if target in names:
    others = ",".join(t for t in names if t != target)
    raise ValueError(
      f"sft.tasks lists the target task env.task={target!r}: a format-only warm start must not "
      f"train on the target's gold paths. Drop it (--config.sft.tasks={others}) or pass "
      f"--config.sft.tasks='' to clone the target's own gold paths"
    )
  return tuple(dict.fromkeys(names))


def gold_env(env_config):
  """The local ScienceWorld env gold paths are replayed in (envs/sciworld_suite.local_env): no
  agent step limit, and gold actions run as written (find-animal variation 0 under the agent's
  "always" correction: 7 of its 10 gold actions changed)."""
  from empo2_jax.envs.scienceworld.suite import local_env

  return local_env(env_config)


def gold_chats(
  env,
  tasks: Sequence[str],
  *,
  variations: int = 0,
  max_turns: int = 0,
  n_few_shot: int = 0,
  success_score: float = 70,
) -> list[GoldChat]:
  """Gold chats of the first `variations` TRAIN variations (0: all) of each task in `tasks`.

  env: `gold_env(...)`, a local env without the agent's step limit that runs gold actions as
  written; max_turns > 0 keeps each chat's first max_turns actions (the agent's step limit);
  n_few_shot: gold examples of the SAME task in the first prompt, as the actor's prompt material
  has them (envs/fewshot.gold_trajectories). Replays scoring <= success_score are dropped. The
  env's episode is replaced."""
  from empo2_jax.envs import fewshot

  out = []
  for task in tasks:
    train = env.variations(task, "train")
    chosen = train[:variations] if variations else train
    shots = tuple(fewshot.gold_trajectories(env, task, n=n_few_shot))
    for v in chosen:
      traj = fewshot.replay_gold(env, task, v)
      if traj.final_score <= success_score:
        continue
      material = fewshot.prompt_material(env, task, v, shots)
      out.append(GoldChat(task, int(v), sft.gold_chat(material, traj, max_turns=max_turns)))
  return out


__all__ = ["GoldChat", "sft_tasks", "gold_env", "gold_chats"]
