"""agent/episode.reset_episodes and apply_step: the two moves the actor's and Retrospex's rollout
loops make on an episode, checked field by field against the env's results written out here."""

from empo2_jax.agent.episode import Episode, apply_step, reset_episodes
from empo2_jax.envs.base import ResetInfo, ResetResult, StepInfo, StepResult


class _Pool:
  def __init__(self, failed):
    self.failed = failed
    self.seen = None

  def reset(self, specs):
    self.seen = list(specs)
    return [
      ResetResult(
        f"room {v}", ResetInfo(t, v, "find it", env_failed=f, state=f"grid {v}" if f else "")
      )
      for (t, v), f in zip(specs, self.failed)
    ]


def _episodes(n):
  return [Episode("find", v, 0, v, "on", False) for v in range(n)]


def test_reset_ends_failed_episodes_and_records_states():
  eps = _episodes(3)
  pool = _Pool([False, True, False])
  obs = reset_episodes(pool, eps, records=("states",))
  assert pool.seen == [("find", 0), ("find", 1), ("find", 2)]
  assert obs == ["room 0", "room 1", "room 2"]
  assert [e.done for e in eps] == [False, True, False]
  assert [e.env_failed for e in eps] == [False, True, False]
  # the state rendering where the env has one, else the observation
  assert [e.extras["states"] for e in eps] == [["room 0"], ["grid 1"], ["room 2"]]
  plain = _episodes(1)
  reset_episodes(_Pool([False]), plain)  # no method asked: nothing recorded
  assert plain[0].extras == {}


def _result(obs, score, *, done=False, truncated=False, failed=False, success=False):
  info = StepInfo(
    score=score,
    valid=True,
    raw_action="go kitchen ",
    executed_action="go to kitchen",
    truncated=truncated,
    success=success,
    env_failed=failed,
    goals="1/2 goals",
  )
  return StepResult(obs, score, done, info)


def test_apply_step_records_the_env_answer():
  (e,) = _episodes(1)
  e.messages.append({"role": "user", "content": "room 0"})
  nxt = apply_step(e, " room 0 ", "go kitchen", _result("kitchen", 25.0), records=("states",))
  assert nxt == "kitchen"
  assert e.messages[-1] == {"role": "assistant", "content": "go kitchen"}
  assert e.executed == ["go to kitchen"]
  assert e.key_lines == ["observation: room 0", "action: go to kitchen"]
  assert (e.score, e.success, e.done, e.env_failed, e.truncated) == (
    25.0,
    False,
    False,
    False,
    False,
  )
  assert (
    e.final_observation == "kitchen"
    and e.extras["states"] == ["kitchen"]
    and e.goals == "1/2 goals"
  )

  apply_step(e, "kitchen", "look", _result("done", 100.0, done=True, success=True))
  assert (e.score, e.success, e.done) == (100.0, True, True)
  assert e.executed == ["go to kitchen", "go to kitchen"]


def test_apply_step_ends_on_truncation_or_env_failure():
  (a, b) = _episodes(2)
  apply_step(a, "x", "y", _result("z", 0.0, truncated=True))
  assert a.done and a.truncated and not a.env_failed
  apply_step(b, "x", "y", _result("z", 0.0, failed=True))
  assert b.done and b.env_failed
