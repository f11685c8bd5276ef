"""Evaluation: a policy's test episodes and their metrics (`Evaluator`, `eval_metrics`: the
trainer's eval/... and eval_mem/...), and tables in the shape of the paper's Table 1 (per task,
return mean ± std and success).

`summarize(episodes)` reduces finished actor episodes; `table_markdown` / `table_csv` render rows
{task, setting, episodes, return_mean, return_std, success} for the README, papers and sweeps.
"""

from __future__ import annotations

import csv
import io
from typing import Sequence

import numpy as np

import jax

from empo2_jax.train.metrics import episode_summary, pass_at_k, return_summary

COLUMNS = ("task", "setting", "episodes", "return_mean", "return_std", "success")


class Evaluator:
  """The test variations' (`variations`) x train.eval_repeats episodes of a policy at
  train.eval_temperature;
  WITHOUT memory unless asked (docs/method.md §1). Memory is read, never written, during
  evaluation. `actor` is the run's agent/actor.Actor, `notes` the active methods'
  eval_notes(specs) (methods/base.Hooks)."""

  def __init__(self, config, actor, model_config, notes):
    self.config, self.actor, self.model_config, self.notes = config, actor, model_config, notes

  def specs(self, variations) -> list[tuple]:
    """(task, variation, group) of every episode: one group a variation, eval_repeats episodes
    each."""
    c = self.config
    return [
      (c.env.task, v, g) for g, v in enumerate(variations) for _ in range(c.train.eval_repeats)
    ]

  def episodes(self, params, rng, variations, with_memory: bool = False) -> list:
    """Every spec's episode, in spec order. At most train.eval_batch episodes at once (0: a
    training rollout's variations x group), so evaluating many test variations never needs more
    sampler memory (KV cache) than training does. The first part draws with `rng` itself: an
    evaluation that fits in one part is unchanged; part k draws with fold_in(rng, k)."""
    c = self.config
    specs = self.specs(variations)
    notes = self.notes(specs)
    size = c.train.eval_batch or c.rollout.variations_per_iter * c.rollout.group_size
    episodes = []
    for k, start in enumerate(range(0, len(specs), size)):
      part = slice(start, start + size)
      episodes += self.actor.rollout(
        params,
        self.model_config,
        specs[part],
        use_memory=with_memory,
        temperature=c.train.eval_temperature,
        rng=rng if k == 0 else jax.random.fold_in(rng, k),
        mode="eval",
        notes=None if notes is None else notes[part],
        # test variations have no slot: they read the task's slots only where asked
        memory_fallback=c.memory.unseen_fallback == "task",
      ).episodes
    return episodes


def eval_metrics(episodes, with_memory: bool = False) -> dict:
  """eval/... (eval_mem/... with memory): `episode_summary` of the test episodes, Pass@1 and
  Pass@k over the eval_repeats episodes of each test variation (SPA's es_manager: pass@k = any
  success in the group, averaged over the groups; train/metrics.py)."""
  summary = episode_summary(episodes)
  ok = [e for e in episodes if not e.env_failed]
  tag = "eval_mem" if with_memory else "eval"
  pass1, passk, k = pass_at_k([e.group_id for e in ok], [e.success for e in ok])
  return {
    **{f"{tag}/{name}": v for name, v in summary.items()},
    f"{tag}/pass@1": pass1,
    f"{tag}/pass@k": passk,
    f"{tag}/k": k,
  }


def summarize(task: str, setting: str, returns: Sequence[float], successes: Sequence[bool]) -> dict:
  r = np.asarray(returns, np.float64)
  if r.size == 0:
    raise ValueError(f"no episodes to summarise for {task} ({setting})")
  return {"task": task, "setting": setting, "episodes": int(r.size), **return_summary(r, successes)}


def with_average(rows: Sequence[dict]) -> list[dict]:
  """Rows plus one 'average' row per setting (mean of the per-task means, as the paper reports)."""
  out = list(rows)
  for setting in dict.fromkeys(r["setting"] for r in rows):
    sub = [r for r in rows if r["setting"] == setting]
    if len(sub) > 1:
      out.append(
        {
          "task": "average",
          "setting": setting,
          "episodes": int(sum(r["episodes"] for r in sub)),
          "return_mean": float(np.mean([r["return_mean"] for r in sub])),
          "return_std": float(np.std([r["return_mean"] for r in sub])),
          "success": float(np.mean([r["success"] for r in sub])),
        }
      )
  return out


def table_markdown(rows: Sequence[dict]) -> str:
  lines = ["| task | setting | episodes | return | success |", "|---|---|---|---|---|"]
  for r in rows:
    lines.append(
      f"| {r['task']} | {r['setting']} | {r['episodes']} | "
      f"{r['return_mean']:.1f} ± {r['return_std']:.1f} | {100 * r['success']:.1f}% |"
    )
  return "\n".join(lines) + "\n"


def table_csv(rows: Sequence[dict]) -> str:
  buf = io.StringIO()
  w = csv.DictWriter(buf, fieldnames=COLUMNS)
  w.writeheader()
  for r in rows:
    w.writerow({k: r[k] for k in COLUMNS})
  return buf.getvalue()
