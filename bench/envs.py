"""Steps/s of EnvPool (1, 2, 4 workers and the default size) vs a plain loop over the library's
`ScienceWorldEnv`, both doing the same work per step under the default
env.action_correction="always": the state's valid-action list from the JVM, the text mapped to
the closest valid action (`actions.correct_action`, the same fallback), an ambiguity prompt
answered with option 0, the step.

The library loop takes the list its own `step` already fetched (`info["valid"]`, its
`get_valid_action_object_combinations()` after the step, which is the list of the next step's
state): asking again would fetch a second list per step, and since the simulator names some
objects with the JVM-wide random generator it would also change the trajectory. Its JVM gets the
pool's JVM options (envs/base.py:DEFAULT_JAVA_OPTIONS): object order and hashing cost the same.

Both replay the same episodes (gold-action texts of train rows of paper tasks, cut where the
episode ends under "always"); the timed part is reset + every step of `--passes` passes, after
untimed warm-up passes until every JVM has run `--warm-steps` steps: a ScienceWorld JVM needs a
few hundred steps of JIT compilation to reach its speed (a fresh one steps ~4x slower), which a
training run's long-lived JVMs are past, and a pool of n workers gives each JVM 1/n of a pass.
The default size is what `env.workers=0` picks (envs/pool.py:auto_workers: one
worker per usable CPU, at most the episodes). Last line:
`envs steps_per_s pool=<default size> naive=<b> ratio=<pool/b> per_core=<pool / CPUs> workers=<n>
pool4=<4 workers> cpu_ratio=<CPU per step: library loop / pool>`. CPU per step (this process and
its descendants, all threads, from /proc) is printed beside each rate: on a machine shared with
other work the rates follow the load, the CPU per step much less.

  .venv/bin/python bench/envs.py [--episodes 12] [--warm-steps 400] [--passes 1]
"""

import collections
import math
import os
import time

from _common import parser, result
from empo2_jax.envs import actions
from empo2_jax.envs.base import DEFAULT_JAVA_OPTIONS
from empo2_jax.envs.pool import EnvPool, PoolConfig, auto_workers, usable_cpus
from empo2_jax.envs.scienceworld.env import SciWorldConfig, SciWorldEnv
from empo2_jax.envs.scienceworld.jvm import env_var

CONFIG = SciWorldConfig()  # action_correction="always"

TASKS = (
  "find-plant",
  "chemistry-mix",
  "find-animal",
  "use-thermometer",
  "lifespan-longest-lived",
  "find-living-thing",
)


def make_episodes(n):
  """[(task, variation, gold texts up to the end of the episode under CONFIG)]."""
  env = SciWorldEnv(CONFIG)
  out = []
  try:
    for i in range(n):
      task = TASKS[i % len(TASKS)]
      var = env.used_variations(task, "train")[i // len(TASKS) % 5]
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


def library_step(env, raw, valid):
  """One step of the release's loop on the library: `raw` mapped to the closest of `valid`, an
  ambiguity prompt answered with option 0. Returns (done, info)."""
  text = actions.normalize_action(raw)
  executed = actions.correct_action(text, valid, fallback=CONFIG.fallback_action)
  obs, _, done, info = env.step(executed)
  options = actions.parse_ambiguity_options(obs)
  if options and actions.AMBIGUITY_ANSWER in options:
    _, _, done, info = env.step(actions.AMBIGUITY_ANSWER)
  return done, info


def tree_cpu_s() -> float:
  """CPU seconds (user + system, all threads) so far of this process and its descendants (the
  library's JVM; the pool's workers and their JVMs), from /proc."""
  stats = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          fields = f.read().rsplit(")", 1)[1].split()
      except OSError:  # gone meanwhile
        continue
      stats[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
  children = collections.defaultdict(list)
  for pid, (ppid, _) in stats.items():
    children[ppid].append(pid)
  total, todo = 0, [os.getpid()]
  while todo:
    pid = todo.pop()
    total += stats.get(pid, (0, 0))[1]
    todo += children[pid]
  return total / os.sysconf("SC_CLK_TCK")


def measure(one_pass, passes, warm):
  """(steps/s, CPU ms per step) of `passes` calls of one_pass after `warm` untimed ones."""
  for _ in range(warm):
    one_pass()
  cpu0, t0 = tree_cpu_s(), time.perf_counter()
  steps = sum(one_pass() for _ in range(passes))
  secs, cpu = time.perf_counter() - t0, tree_cpu_s() - cpu0
  return steps / secs, 1000 * cpu / steps


def warm_passes(episodes, jvms, warm_steps):
  """Untimed passes that give each of `jvms` JVMs about `warm_steps` steps."""
  return max(1, math.ceil(warm_steps * jvms / sum(len(g) for *_, g in episodes)))


def run_naive(episodes, warm_steps, passes):
  from scienceworld import ScienceWorldEnv

  with env_var("JAVA_TOOL_OPTIONS", DEFAULT_JAVA_OPTIONS):
    env = ScienceWorldEnv("", envStepLimit=CONFIG.env_step_limit)
  try:

    def one_pass():
      steps = 0
      for task, var, texts in episodes:
        env.load(task, var, CONFIG.simplification)
        _, info = env.reset()
        for raw in texts:
          done, info = library_step(env, raw, info["valid"])
          steps += 1
          if done:
            break
      return steps

    return measure(one_pass, passes, warm_passes(episodes, 1, warm_steps))
  finally:
    env.close()


def run_pool(episodes, num_workers, warm_steps, passes):
  with EnvPool(CONFIG, PoolConfig(num_workers=num_workers)) as pool:

    def one_pass():
      pool.reset([(task, var) for task, var, _ in episodes])
      live = [True] * len(episodes)  # a slot may end at another step than alone (shared JVM)
      steps = 0
      for i in range(max(len(g) for *_, g in episodes)):
        acts = [g[i] if live[k] and i < len(g) else None for k, (*_, g) in enumerate(episodes)]
        for k, r in enumerate(pool.step(acts)):
          if r is not None:
            steps += 1
            live[k] = not r.done
      return steps

    return measure(one_pass, passes, warm_passes(episodes, num_workers, warm_steps))


def main():
  ap = parser(__doc__)
  ap.add_argument("--episodes", type=int, default=12)
  ap.add_argument("--warm-steps", type=int, default=400, help="untimed steps per JVM first")
  ap.add_argument("--passes", type=int, default=1, help="timed passes")
  args = ap.parse_args()
  episodes = make_episodes(args.episodes)
  print(
    f"{len(episodes)} episodes, {sum(len(g) for *_, g in episodes)} steps per pass, "
    f"{os.cpu_count()} CPUs",
    flush=True,
  )
  naive, naive_cpu = run_naive(episodes, args.warm_steps, args.passes)
  print(f"library loop (same work): {naive:.1f} steps/s, {naive_cpu:.0f} ms CPU/step", flush=True)
  default = auto_workers(len(episodes))
  cpus = usable_cpus()
  pool, cpu = {}, {}
  for n in sorted({1, 2, 4, default}):
    pool[n], cpu[n] = run_pool(episodes, n, args.warm_steps, args.passes)
    print(
      f"pool {n} workers: {pool[n]:.1f} steps/s ({pool[n] / n:.1f} per worker), "
      f"{cpu[n]:.0f} ms CPU/step",
      flush=True,
    )
  result(
    "envs steps_per_s",
    pool=pool[default],
    naive=naive,
    ratio=(pool[default] / naive, ".2f"),
    per_core=pool[default] / cpus,
    workers=(default, "d"),
    pool4=pool[4],
    cpu_ratio=(naive_cpu / cpu[default], ".2f"),
    fmt=".1f",
  )


if __name__ == "__main__":
  main()
