"""Episodes -> TFDS array_record dataset -> as_data_source(): read back equal (no TensorFlow)."""

import json
import sys

import numpy as np

from empo2_jax.agent.actor import Episode
from empo2_jax.data import trajectories as traj
from empo2_jax.rl.batch import Turn


def _episode(rng, rollout_id, n_turns, mode="on_tips"):
  e = Episode(
    task="find-animal",
    variation=int(rng.integers(0, 5)),
    group_id=rollout_id // 2,
    rollout_id=rollout_id,
    mode=mode,
    use_memory=mode != "on",
  )
  msgs = []
  for t in range(n_turns):
    tips = [f"tip ü {rollout_id}.{t}.{k} <tip>" for k in range(int(rng.integers(0, 3)))]
    obs = f"You see a room {t} with\n\ta café and an animal {rng.integers(100)}"
    msgs = msgs + [{"role": "user", "content": obs + "".join(tips)}]
    ids = rng.integers(0, 150_000, size=int(rng.integers(0, 6))).tolist()
    e.turns.append(
      Turn(
        messages=list(msgs),
        response=f"go to room {t} ",
        response_ids=ids,
        sampler_logprobs=rng.normal(size=len(ids)).tolist(),
        mode=mode,
        group_id=e.group_id,
        rollout_id=rollout_id,
        step=t,
        episode_return=0.0,
        reward=float(rng.normal()),
        intrinsic=0.1 * len(tips),
        advantage=float(rng.normal()),
      )
    )
    msgs = msgs + [{"role": "assistant", "content": f"go to room {t} "}]
    e.observations.append(obs)
    e.executed.append(f"go to room {t}")
    e.tips_shown.append(tips)
    e.retrieved.append(len(tips))
  e.score, e.success, e.tip = float(rng.normal()) * 50, bool(rollout_id % 2), f"tip {rollout_id}"
  return e


def test_episodes_read_back_equal(tmp_path):
  rng = np.random.default_rng(0)
  log = traj.EpisodeLog(tmp_path / "episodes")
  written = {}
  for it in (1, 2, 3):
    eps = [_episode(rng, i, n_turns=i % 4, mode=("on", "on_tips", "off")[it % 3]) for i in range(5)]
    log.write(it, eps)
    written.update({r["episode_id"]: r for r in (traj.episode_record(e, it) for e in eps)})
  log.drop_after(2)  # a resumed run forgets iteration 3 ...
  again = _episode(rng, 0, 2)
  log.write(3, [again])  # ... and writes it again
  written = {k: v for k, v in written.items() if not k.startswith("it00000003")}
  written["it00000003-00000"] = traj.episode_record(again, 3)
  assert {r["episode_id"] for r in log.records()} == set(written)

  path = log.build_dataset()
  source = traj.load(path)
  assert len(source) == len(written) == 11
  got = {}
  for i in range(len(source)):
    rec = traj.decode(source[i])
    got[rec["episode_id"]] = rec
  assert set(got) == set(written)
  for k, want in written.items():
    assert got[k] == json.loads(json.dumps(want)), k
  # an episode with tips: per-turn counts cut the flat list back into turns
  rec = next(r for r in got.values() if sum(r["turns"]["num_tips"]) > 1)
  cut = np.cumsum([0] + rec["turns"]["num_tips"])
  assert all(t.endswith("<tip>") for t in rec["tips"][cut[0] : cut[-1]])
  assert "tensorflow" not in sys.modules

  # rebuilding replaces the old build (the resumed run's final dataset)
  log.drop_after(1)
  source = traj.load(log.build_dataset())
  assert len(source) == 5
