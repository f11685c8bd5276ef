"""Subprocess body for tests/integration/test_rollout_multihost.py: the tiny EMPO2 trainer on one
CPU device,
alone or as one of NPROC jax.distributed processes.

  python tests/helpers/rollout_hosts_worker.py OUT.json WORKDIR                  # one process
  python tests/helpers/rollout_hosts_worker.py OUT.json WORKDIR ADDR NPROC PID   # one of NPROC

Runs two training iterations (memory rollouts, so the second one retrieves the first one's tips)
and one evaluation (a single episode: a second host has none), then dumps what every host must
agree on: episodes, the last update batch, metrics, memory; and how many episodes this host's own
env pool ran.
"""

import json
import os
import sys

if __name__ == "__main__":
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
  os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np  # noqa: E402

import jax  # noqa: E402


def dump_store(store):
  out = []
  for key in store.keys():
    s = store.slot(key)
    out.append(
      {
        "slot": list(key),
        "texts": s.texts,
        "scores": s.scores.tolist(),
        "iterations": s.iterations.tolist(),
        "embeddings": s.embeddings.tolist(),
      }
    )
  return out


def main(out_path, workdir, addr=None, nproc=1, pid=0):
  if addr:
    from empo2_jax.parallel import mesh as pmesh

    pmesh.initialize_distributed(addr, nproc, pid)
  from empo2_jax.agent import hosts
  from empo2_jax.defaults import load_config
  from empo2_jax.train.trainer import Trainer

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  config = load_config(os.path.join(root, "configs", "sciworld.py") + ":tiny")
  config.env.workers = 1
  config.empo2.force_mode = "on_tips"
  config.train.eval_repeats = 1  # tiny: one test row, so one eval episode
  trainer = Trainer(config, workdir, progress=False)
  ran = []  # episodes this host's own pool was asked to run
  reset = trainer.pool.reset
  trainer.pool.reset = lambda eps: ran.append(len(eps)) or reset(eps)
  try:
    iterations = []
    for _ in range(2):
      result = trainer.train_iteration()
      m = result.metrics
      trainer.iteration += 1
      iterations.append(
        {
          "metrics": {k: v for k, v in m.items() if not k.startswith("time/")},
          "episodes": json.loads(hosts.episodes_to_bytes(result.episodes)),
          "batch": {k: np.asarray(v).tolist() for k, v in result.batch.items()},
        }
      )
    ev = trainer.evaluate(False)
    out = {
      "processes": jax.process_count(),
      "iterations": iterations,
      "eval": {k: v for k, v in ev.items() if not k.startswith("time/")},
      "memory": dump_store(trainer.memory.store),
      "pool_episodes": ran,
    }
  finally:
    trainer.close()
  with open(out_path, "w") as f:
    json.dump(out, f)
  if addr:
    jax.distributed.shutdown()


if __name__ == "__main__":
  args = sys.argv[1:]
  if len(args) == 2:
    main(*args)
  else:
    main(args[0], args[1], args[2], int(args[3]), int(args[4]))
