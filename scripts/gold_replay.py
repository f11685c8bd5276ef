"""Replay ScienceWorld's gold action sequences through our env under each action correction and
report which episodes fail and which gold texts were sent as another action.

  .venv/bin/python scripts/gold_replay.py [--tasks boil,freeze,...] [--modes always,on_reject]

Per task: its last train and last test variation (envs/scienceworld: the library's splits). Each
gold text goes through SciWorldEnv.step (the agent's step limit lifted); an episode succeeds when
it ends with score > 70 as a run counts it. Lines:
  gold_replay mode=<m> task=<t> variation=<v> success=<0|1> score=<s> steps=<n>
  gold_replay_sub mode=<m> task=<t> variation=<v> step=<i> gold="<text>" sent="<text>"
and, per mode, `gold_replay_total mode=<m> failed=<f> of=<n>`.
"""

import argparse
import dataclasses

from empo2_jax.envs.scienceworld.env import ALL_TASKS, SciWorldConfig, SciWorldEnv


def replay(env, task, variation, mode):
  env.reset(task, variation)
  subs, result = [], None
  for i, text in enumerate(env.gold_actions(task, variation)):
    result = env.step(text)
    if result.info.executed_action != text and text != "0":  # "0": an ambiguity answer
      subs.append((i, text, result.info.executed_action))
    if result.done:
      break
  score = result.info.score if result else 0
  success = bool(result and result.done and score > env.config.success_score)
  return success, score, (i + 1 if result else 0), subs


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--tasks", default=",".join(ALL_TASKS))
  ap.add_argument("--modes", default="always,on_reject")
  args = ap.parse_args()
  for mode in args.modes.split(","):
    config = dataclasses.replace(
      SciWorldConfig(action_correction=mode), default_max_steps=1000, max_steps_overrides=()
    )
    failed = total = 0
    with SciWorldEnv(config) as env:
      for task in args.tasks.split(","):
        for split in ("train", "test"):
          variation = env.variations(task, split)[-1]
          success, score, steps, subs = replay(env, task, variation, mode)
          failed, total = failed + (not success), total + 1
          print(
            f"gold_replay mode={mode} task={task} variation={variation} success={int(success)} "
            f"score={score} steps={steps}",
            flush=True,
          )
          for i, gold, sent in subs:
            print(
              f'gold_replay_sub mode={mode} task={task} variation={variation} step={i} '
              f'gold="{gold}" sent="{sent}"'
            )
    print(f"gold_replay_total mode={mode} failed={failed} of={total}", flush=True)


if __name__ == "__main__":
  main()
