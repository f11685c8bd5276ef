"""Subprocess body for tests/integration/test_preempt_multihost.py: one of two jax.distributed CPU
processes
running the real Trainer.run loop with its parts stubbed (an iteration sleeps; a checkpoint is a
line in a file), so the only collective is the trainer's own per-iteration SIGTERM agreement.

python tests/helpers/preempt_worker.py OUT_DIR ADDR NPROC PID
writes OUT_DIR/progress-<PID> (the iterations done, one a line), OUT_DIR/saved-<PID> (the
iterations checkpointed) and, at the end, OUT_DIR/result-<PID>.json.
"""

import json
import os
import sys
import time

if __name__ == "__main__":
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ.pop("XLA_FLAGS", None)

import ml_collections  # noqa: E402

import jax  # noqa: E402

from empo2_jax.train.hoststats import PhasePeaks  # noqa: E402
from empo2_jax.train.run_control import StopSignal  # noqa: E402
from empo2_jax.train.iteration import IterationResult  # noqa: E402
from empo2_jax.train.trainer import Trainer  # noqa: E402

ITERATIONS = 200  # far more than run before the test's SIGTERM


class _Metrics:
  def write(self, iteration, m):
    pass

  def close(self):
    pass


def stub_trainer(out_dir: str, pid: int) -> Trainer:
  t = Trainer.__new__(Trainer)  # the loop and the signal handling are real; the parts are stubs
  t.config = ml_collections.ConfigDict(
    {
      "train": {
        "iterations": ITERATIONS,
        "checkpoint_every": 0,
        "eval_every": 0,
        "eval_at_end": False,
        "eval_with_memory": False,
        "profile_iteration": 0,
      }
    }
  )
  t.iteration, t.preempted, t.episode_log, t.metrics = 0, False, None, _Metrics()
  t.workdir = out_dir
  t.phase_peaks = PhasePeaks()
  t.stop_signal = StopSignal(lambda: t.iteration)  # the real SIGTERM handler
  progress = open(os.path.join(out_dir, f"progress-{pid}"), "a")
  saved = os.path.join(out_dir, f"saved-{pid}")

  def train_iteration():
    time.sleep(0.2 + 0.1 * pid)  # the hosts run at different speeds
    progress.write(f"{t.iteration + 1}\n")
    progress.flush()
    return IterationResult(metrics={}, episodes=[], batch={})

  def save_checkpoint(wait=False):
    with open(saved, "a") as f:
      f.write(f"{t.iteration}\n")
    return t.iteration

  t.train_iteration, t.save_checkpoint = train_iteration, save_checkpoint
  t.close = t.stop_signal.close
  return t


def main(out_dir, addr, nproc, pid):
  jax.distributed.initialize(coordinator_address=addr, num_processes=nproc, process_id=pid)
  t = stub_trainer(out_dir, pid)
  history = t.run()
  result = {"iteration": t.iteration, "preempted": t.preempted, "history": len(history)}
  with open(os.path.join(out_dir, f"result-{pid}.json"), "w") as f:
    json.dump(result, f)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
