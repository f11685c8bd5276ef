"""Train EMPO2.

  python launch/train.py --config=configs/sciworld.py --config.model.checkpoint=DIR --workdir=runs/x
  python launch/train.py --config=configs/sciworld.py:cpu --workdir=runs/cpu      # CPU demo
  python launch/train.py --config=configs/sciworld.py:cpu --config.empo2.p_memory=0.5 ...

Rerunning the same command continues from the newest checkpoint in --workdir (SIGTERM checkpoints
after the iteration in progress and exits 0; once iterations take longer than
train.stop_deadline_s, it stops at the next turn boundary instead, dropping the iteration in
progress, and exits within that deadline: empo2_jax/train/run_control.py). One run per workdir:
a second one exits at once naming the first (<workdir>/.lock). A failed checkpoint save (disk
full), a failed metrics write or a non-finite update stops the run with exit status 1 and a
message naming the checkpoint a rerun resumes from; a non-finite update's batch goes to
<workdir>/debug/iter_<N>/.
--config.train.save_episodes=True also writes the run's episodes as a TFDS dataset under
<workdir>/episodes/tfds (empo2_jax/data/trajectories.py).

Any config field can be overridden with --config.<path>=value; an unknown key fails with the list
of valid keys at that level. A mistake in the config, the model checkpoint or the workdir prints one
line `error: <what> (<where>): <what to do>` and exits 2 (--debug or EMPO2_DEBUG=1: the traceback).

Multi-host (pods): run the same command with --multihost on every host; each host steps its share
of the episodes in its own env pool and all hosts gather them (empo2_jax/agent/hosts.py). Off TPU,
name the cluster yourself, e.g. two CPU processes on one machine:
  python launch/train.py --config=configs/sciworld.py:cpu --workdir=runs/mh --multihost \
      --coordinator_address=localhost:12345 --num_processes=2 --process_id=0   # and =1
"""

import sys
import warnings

# ScienceWorld starts its JVM with fork+exec; Python warns about fork in a threaded process, which
# does not apply to an immediate exec.
warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from empo2_jax import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "config file (path[:arg])", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "where metrics and checkpoints go")
_NO_PROGRESS = flags.DEFINE_bool("no_progress", False, "disable the progress bar")
_MULTIHOST = flags.DEFINE_bool(
  "multihost",
  False,
  "call jax.distributed.initialize() first (TPU pod slices: run the same command on every host)",
)
_COORDINATOR = flags.DEFINE_string(
  "coordinator_address", None, "with --multihost off TPU: host:port of process 0"
)
_NUM_PROCESSES = flags.DEFINE_integer(
  "num_processes", None, "with --multihost off TPU: how many processes"
)
_PROCESS_ID = flags.DEFINE_integer(
  "process_id", None, "with --multihost off TPU: this process's index"
)


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:  # keep orbax's INFO lines out of the way
    logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  _apply_method(config)
  from empo2_jax.train import hoststats

  hoststats.limit_malloc_arenas(config.train.malloc_arenas)  # before XLA starts its threads
  logging.info("config:\n%s", config)
  explicit = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if any(x is not None for x in explicit) and not _MULTIHOST.value:
    sys.exit("error: --coordinator_address/--num_processes/--process_id need --multihost")
  if _MULTIHOST.value:
    from empo2_jax.parallel.mesh import initialize_distributed

    try:
      initialize_distributed(*explicit)
    except ValueError as e:
      sys.exit(f"error: {e}")
  import jax
  from empo2_jax.train import build, workdir_lock

  try:  # before JAX starts its backend: a bad config fails fast and is not locked or made
    build.check_config(config)
  except build.ConfigError as e:
    cli.fail(e)  # one line, exit 2
  lead = jax.process_index() == 0  # multi-host: one host prints and shows progress
  # One run per workdir (train/workdir_lock.py): a second run fails here, before building
  # anything, naming the first; multi-host: process 0 holds the lock for all.
  lock = None
  if lead:
    try:
      lock = workdir_lock.WorkdirLock(_WORKDIR.value).acquire()
    except workdir_lock.WorkdirBusy as e:
      sys.exit(f"error: {e}")
  try:
    _train(config, lead)
  finally:  # also on an exception and after SIGTERM's checkpoint
    if lock is not None:
      lock.release()


def _apply_method(config) -> None:
  """config.method's defaults (empo2_jax/methods/), except keys set on the command line;
  a method that does not train exits naming the command that runs it."""
  from empo2_jax import methods

  try:
    method = methods.get(config.method)
  except methods.UnknownMethod as e:
    cli.fail(e)  # one line, exit 2
  if not method.trains:
    spec = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--config=")), "CONFIG")
    sys.exit("error: " + cli.not_training_message(config.method, spec, _WORKDIR.value))
  methods.apply(config, keep=cli.explicit_keys(sys.argv[1:]))


def _train(config, lead):
  from empo2_jax.train import checkpoint as ckpt_lib
  from empo2_jax.train import faults
  from empo2_jax.train.build import ConfigError
  from empo2_jax.train.trainer import Trainer

  try:
    trainer = Trainer(config, _WORKDIR.value, progress=lead and not _NO_PROGRESS.value)
  except ConfigError as e:
    cli.fail(e)  # one line, exit 2
  # Resume order: the newest restorable checkpoint in the workdir (a corrupt one falls back to
  # the step before, with a warning), else a fresh start from the config.
  try:
    step = trainer.resume()
  except RuntimeError as e:  # checkpoints there, none restorable: say so, start nothing
    trainer.close()
    cli.fail(e)  # one line, exit 2
  if step is not None and lead:
    print(
      f"resumed from {trainer.checkpointer.directory / str(step)} at iteration {step}", flush=True
    )
  try:
    history = trainer.run()
  except (faults.NonFiniteError, faults.WriteError, ckpt_lib.CheckpointSaveError) as e:
    sys.exit(f"error: {e}")  # the message names the checkpoint a rerun resumes from
  if trainer.preempted:
    how = f" ({trainer.stop_note})" if trainer.stop_note else ""
    print(
      f"preempted (SIGTERM){how}: checkpoint at iteration {trainer.iteration} in "
      f"{trainer.checkpointer.directory}; rerun the same command to continue",
      flush=True,
    )
    return
  if history and lead:
    from empo2_jax.train.hoststats import peak_rss_gib
    from empo2_jax.train.summary import done_line

    # peak_rss_gib: this process's peak resident size (the env workers' JVMs are not in it;
    # host/children_rss_gib in metrics.jsonl has their size)
    print(done_line(history, _WORKDIR.value, peak_rss_gib()))


if __name__ == "__main__":
  cli.run(main)  # one-line errors for config, checkpoint and path mistakes (exit 2)
