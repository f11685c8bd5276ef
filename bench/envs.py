"""Steps/s of EnvPool (1, 2, 4 workers and the default size) vs a plain loop over the library's
`ScienceWorldEnv.step`.

Both replay the same episodes (gold actions of train rows of paper tasks, cut where the episode
ends); the timed part is reset + every step, after one untimed warm-up pass each (JIT).
The default size is what `env.workers=0` picks (envs/pool.py:auto_workers: one worker per usable
CPU, at most the episodes). Last line:
`envs steps_per_s pool=<default size> naive=<b> ratio=<pool/b> per_core=<pool / CPUs> workers=<n>
pool4=<4 workers>`.

  .venv/bin/python bench/envs.py [--episodes 12]
"""

import os

from _common import parser, result, seconds_per_call
from empo2_jax.envs.pool import EnvPool, PoolConfig, auto_workers, usable_cpus
from empo2_jax.envs.scienceworld import SciWorldEnv

TASKS = (
  "find-plant",
  "chemistry-mix",
  "find-animal",
  "use-thermometer",
  "lifespan-longest-lived",
  "find-living-thing",
)


def make_episodes(n):
  """[(task, variation, gold actions up to the end of the episode)]."""
  env = SciWorldEnv()
  out = []
  try:
    for i in range(n):
      task = TASKS[i % len(TASKS)]
      var = env.rows(task, "train")[i // len(TASKS) % 5]
      gold = env.gold_actions(task, var)
      env.reset(task, var)
      for k, action in enumerate(gold):
        if env.step(action).done:
          gold = gold[: k + 1]
          break
      out.append((task, var, gold))
  finally:
    env.close()
  return out


def run_naive(episodes):
  from scienceworld import ScienceWorldEnv

  env = ScienceWorldEnv("", envStepLimit=100)
  try:

    def one_pass():
      steps = 0
      for task, var, gold in episodes:
        env.load(task, var, "easy")
        env.reset()
        for action in gold:
          env.step(action)
          steps += 1
      return steps

    secs, steps = seconds_per_call(one_pass, 1)
    return steps / secs
  finally:
    env.close()


def run_pool(episodes, num_workers):
  with EnvPool(pool_config=PoolConfig(num_workers=num_workers)) as pool:

    def one_pass():
      pool.reset([(task, var) for task, var, _ in episodes])
      steps = 0
      for i in range(max(len(g) for *_, g in episodes)):
        acts = [g[i] if i < len(g) else None for *_, g in episodes]
        steps += sum(r is not None for r in pool.step(acts))
      return steps

    secs, steps = seconds_per_call(one_pass, 1)
    return steps / secs


def main():
  ap = parser(__doc__)
  ap.add_argument("--episodes", type=int, default=12)
  args = ap.parse_args()
  episodes = make_episodes(args.episodes)
  print(
    f"{len(episodes)} episodes, {sum(len(g) for *_, g in episodes)} steps per pass, "
    f"{os.cpu_count()} CPUs",
    flush=True,
  )
  naive = run_naive(episodes)
  print(f"naive library env.step: {naive:.1f} steps/s", flush=True)
  default = auto_workers(len(episodes))
  cpus = usable_cpus()
  pool = {}
  for n in sorted({1, 2, 4, default}):
    pool[n] = run_pool(episodes, n)
    print(f"pool {n} workers: {pool[n]:.1f} steps/s ({pool[n] / n:.1f} per worker)", flush=True)
  result(
    "envs steps_per_s",
    pool=pool[default],
    naive=naive,
    ratio=(pool[default] / naive, ".2f"),
    per_core=pool[default] / cpus,
    workers=(default, "d"),
    pool4=pool[4],
    fmt=".1f",
  )


if __name__ == "__main__":
  main()
