"""Multi-host rollouts: two jax.distributed CPU processes, each stepping half of the episodes in its
own ScienceWorld pool, end with the batch, memory and metrics of a single process.

Runs tests/helpers/rollout_hosts_worker.py three times in subprocesses (one process alone; two
processes
together), each with one CPU device: the distributed start must happen before jax is used.
"""

import json

import numpy as np
import pytest

from empo2_jax.agent import hosts
from tests.helpers import processes


def test_host_share_is_contiguous_balanced_and_complete():
  for n, count in ((4, 2), (5, 2), (7, 3), (1, 2), (0, 3), (16, 4)):
    shares = [hosts.host_share(n, i, count) for i in range(count)]
    assert [i for s in shares for i in s] == list(range(n))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
  assert hosts.host_share(5, 0, 2) == range(0, 3) and hosts.host_share(5, 1, 2) == range(3, 5)
  assert hosts.host_share(3) == range(3)  # one process: everything
  with pytest.raises(ValueError, match="host index 2"):
    hosts.host_share(4, 2, 2)


def test_episodes_round_trip_through_bytes_exactly():
  from empo2_jax.agent.actor import Episode
  from empo2_jax.rl.batch import Turn

  e = Episode(
    "find-animal",
    3,
    1,
    7,
    "off",
    True,
    messages=[{"role": "user", "content": "ü ✓"}],
    score=-100.0,
    tip="a tip",
    tips_shown=[["t1", "t2"]],
    retrieved=[2],
  )
  e.turns.append(
    Turn(
      messages=list(e.messages),
      response="go",
      response_ids=[1, 2],
      sampler_logprobs=[-0.1234567890123, float(np.float32(-2.5e-8))],
      mode="off",
      group_id=1,
      rollout_id=7,
      step=0,
      episode_return=-100.0,
      reward=-100.0,
      intrinsic=1 / 3,
      obs_key="kitchen",
    )
  )
  back = hosts.episodes_from_bytes(
    hosts.episodes_to_bytes([e, Episode("boil", 0, 0, 8, "on", False)])
  )
  assert back[0] == e and back[1].task == "boil" and isinstance(back[0].turns[0], Turn)
  assert hosts.gather_episodes([e]) == [e]  # one process: the list itself


def test_sum_stats_one_process_is_identity():
  assert hosts.sum_stats({"steps": 3, "memory_writes": 2}, ("memory_writes",)) == {
    "steps": 3,
    "memory_writes": 2,
  }


def _close(a, b, path="", atol=1e-5):
  """Structural equality: exact for strings, ints and bools, `atol` for floats."""
  if isinstance(a, dict):
    assert isinstance(b, dict) and sorted(a) == sorted(b), (path, sorted(a), sorted(b))
    for k in a:
      _close(a[k], b[k], f"{path}.{k}", atol)
  elif isinstance(a, list):
    assert isinstance(b, list) and len(a) == len(b), (path, len(a), len(b))
    if a and all(isinstance(x, float) for x in a):
      np.testing.assert_allclose(a, b, atol=atol, rtol=1e-4, err_msg=path)
    else:
      for i, (x, y) in enumerate(zip(a, b)):
        _close(x, y, f"{path}[{i}]", atol)
  elif isinstance(a, float) and not isinstance(b, bool):
    assert np.isclose(a, b, atol=atol, rtol=1e-4, equal_nan=True), (path, a, b)
  else:
    assert a == b, (path, a, b)


@pytest.mark.slow
def test_two_hosts_give_the_batch_memory_and_metrics_of_one(tmp_path):
  addr = processes.coordinator()
  outs = {name: tmp_path / f"{name}.json" for name in ("single", "p0", "p1")}
  cmds = {
    "single": [str(outs["single"]), str(tmp_path / "run_single")],
    "p0": [str(outs["p0"]), str(tmp_path / "run_multi"), addr, "2", "0"],
    "p1": [str(outs["p1"]), str(tmp_path / "run_multi"), addr, "2", "1"],
  }
  # workers 0, 1, 2 = single, p0, p1
  processes.finish([processes.start("rollout_hosts_worker.py", *a) for a in cmds.values()], 900)
  single, p0, p1 = (json.loads(outs[n].read_text()) for n in ("single", "p0", "p1"))
  assert (single["processes"], p0["processes"], p1["processes"]) == (1, 2, 2)

  # each host stepped only its share: 4 training episodes split 2 + 2, the 1 eval episode on p0
  assert single["pool_episodes"] == [4, 4, 1]
  assert p0["pool_episodes"] == [2, 2, 1] and p1["pool_episodes"] == [2, 2]

  # the two hosts agree exactly (same gathered bytes, same update)
  for key in ("iterations", "eval", "memory"):
    assert p0[key] == p1[key], key

  # ... and agree with one process (floats up to rounding: the update runs on another mesh)
  for key in ("iterations", "eval", "memory"):
    _close(single[key], p0[key], key)

  # the comparison is not vacuous: memory rollouts that retrieved and wrote tips
  it1, it2 = single["iterations"]
  assert it1["metrics"]["memory_writes"] > 0 and it2["metrics"]["retrieval_hits_per_step"] > 0
  assert [e["rollout_id"] for e in it2["episodes"]] == [0, 1, 2, 3]
  assert len({tuple(t["response_ids"]) for e in it2["episodes"] for t in e["turns"]}) > 1
  assert single["eval"]["eval/episodes"] == 1
