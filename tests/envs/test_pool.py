"""EnvPool: gold replay through worker processes, crash and hang recovery, no orphan JVMs."""

import os
import signal

import pytest

from empo2_jax.envs.pool import EnvPool, PoolConfig
from empo2_jax.envs.scienceworld.env import SciWorldConfig, SciWorldEnv

# Gold paths run as written (the default, the authors' "always" correction, would map a valid
# "open door to X" of an open door to "close door to X"): train/sft_gold.gold_env does the same.
GOLD = SciWorldConfig(action_correction="on_reject")

EPISODES = [
  ("find-plant", 0),
  ("chemistry-mix", 1),
  ("find-animal", 2),
  ("use-thermometer", 3),
  ("lifespan-longest-lived", 0),
]


def alive(pid):
  """True if `pid` is a running (not zombie) process, read from the process table."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      state = f.read().rsplit(")", 1)[1].split()[0]
  except FileNotFoundError:
    return False
  return state != "Z"


def scienceworld_jvms_of(parent_pids):
  """Running java processes of scienceworld.jar whose parent is one of `parent_pids`."""
  found = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        cmd = f.read()
      with open(f"/proc/{entry}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError):
      continue
    if b"scienceworld.jar" in cmd and ppid in parent_pids and alive(int(entry)):
      found.append(int(entry))
  return found


@pytest.fixture(scope="module")
def reference():
  """Gold actions and the wrapper's per-step scores for EPISODES (single process)."""
  env = SciWorldEnv(GOLD)
  out = []
  for task, var in EPISODES:
    gold = env.gold_actions(task, var)
    env.reset(task, var)
    scores = []
    for action in gold:
      result = env.step(action)
      scores.append(result.info.score)
      if result.done:
        break
    out.append((gold[: len(scores)], scores))
  env.close()
  return out


def run_gold(pool, reference, kill_at=None, kill_signal=signal.SIGKILL):
  """Steps all EPISODES with their gold actions; sends `kill_signal` to worker 0's JVM before
  step `kill_at`. Returns per-episode lists of StepResults."""
  pool.reset(EPISODES)
  results = [[] for _ in EPISODES]
  for i in range(max(len(g) for g, _ in reference)):
    if i == kill_at:
      os.kill(pool.java_pids()[0], kill_signal)
    acts = [
      g[i] if i < len(g) and not (r and r[-1].done) else None
      for (g, _), r in zip(reference, results)
    ]
    for k, res in enumerate(pool.step(acts)):
      if res is not None:
        results[k].append(res)
  return results


@pytest.mark.slow
def test_pool_gold_replay_survives_sigkill(reference):
  with EnvPool(GOLD, pool_config=PoolConfig(num_workers=2)) as pool:
    workers = [w.process.pid for w in pool._workers]  # pylint: disable=protected-access
    results = run_gold(pool, reference, kill_at=3)
    assert pool.restarts == 1
    started = list(pool.java_pids_started)
    workers += [w.process.pid for w in pool._workers]  # pylint: disable=protected-access
  for (_, ref_scores), res in zip(reference, results):
    assert [r.info.score for r in res] == ref_scores  # same scores at every step
    assert res[-1].done and res[-1].info.score == 100 and res[-1].info.success
    assert not any(r.info.env_failed for r in res)
  assert len(started) == 3  # two at start, one replacement
  assert not [p for p in started if alive(p)]
  assert not [p for p in workers if alive(p)]
  assert not scienceworld_jvms_of(set(workers))


@pytest.mark.slow
def test_pool_recovers_from_hung_worker(reference):
  cfg = PoolConfig(num_workers=1, call_timeout_s=3.0)
  with EnvPool(GOLD, pool_config=cfg) as pool:
    results = run_gold(pool, reference, kill_at=2, kill_signal=signal.SIGSTOP)
    assert pool.restarts == 1
    started = list(pool.java_pids_started)
  for (_, ref_scores), res in zip(reference, results):
    assert [r.info.score for r in res] == ref_scores
  assert not [p for p in started if alive(p)]


@pytest.mark.slow
def test_pool_marks_episodes_failed_after_retries():
  with EnvPool(pool_config=PoolConfig(num_workers=1, max_retries=0)) as pool:
    pool.reset([("find-plant", 0), ("find-plant", 1)])
    os.kill(pool.java_pids()[0], signal.SIGKILL)
    results = pool.step(["look around", None])  # no exception reaches the caller
    assert results[1] is None
    assert results[0].done and results[0].info.env_failed and not results[0].info.success
    again = pool.step([None, "look around"])  # the other episode on that worker failed too
    assert again[1].info.env_failed
    started = list(pool.java_pids_started)
  assert not [p for p in started if alive(p)]


@pytest.mark.slow
def test_pool_input_errors_and_close():
  pool = EnvPool(pool_config=PoolConfig(num_workers=1))
  try:
    with pytest.raises(ValueError, match="Valid tasks:.*find-plant"):
      pool.reset([("find-plants", 0)])
    first = pool.reset([("find-plant", 0)])
    assert "plant" in first[0].info.task_description and first[0].info.max_steps == 30
    with pytest.raises(ValueError, match="1 episodes"):
      pool.step(["look around", "look around"])
    while not pool.step(["focus on agent"])[0].done:
      pass
    with pytest.raises(ValueError, match="is done"):
      pool.step(["look around"])
  finally:
    pool.close()
  assert not alive(pool.java_pids_started[0])
  with pytest.raises(RuntimeError, match="closed"):
    pool.step(["look around"])


def test_auto_workers_follows_cpus_and_episodes():
  from empo2_jax.envs.pool import auto_workers, usable_cpus

  assert auto_workers(128, cpus=16) == 16  # one per CPU
  assert auto_workers(4, cpus=16) == 4  # never more than the episodes stepped at once
  assert auto_workers(0, cpus=16) == 1
  assert usable_cpus() == len(os.sched_getaffinity(0))
  assert auto_workers(128) == min(usable_cpus(), 128)
