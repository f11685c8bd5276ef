"""The distillation probe (empo2_jax/train/probe.py): make a probe set from tip-guided episodes,
then score any checkpoint on it without tips.

  # 1. a probe set from episodes rolled out WITH memory (launch/eval.py --memory=with
  #    --episodes=DIR writes DIR/with.jsonl; a training run's <workdir>/episodes works too)
  python launch/probe.py --make --episodes=runs/mem/probe_eps/with.jsonl --probe=runs/probe.jsonl
  # 2. a checkpoint's tip-free log-prob and greedy agreement on it (RL or SFT workdir)
  python launch/probe.py --workdir=runs/arm_a --probe=runs/probe.jsonl [--out=runs/arm_a/probe.json]

--make prints the set's size per outcome; scoring prints one line per set:
  probe set=success samples=N tokens=T logp_mean=... sample_logp_mean=... top1=... step=S
and, with --out, writes them with every sample's figures (JSON), for paired comparisons between
checkpoints (scripts/probe_experiment.sh report).
"""

import json
import os
import warnings

warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import flags, logging  # noqa: E402

from empo2_jax import cli  # noqa: E402

_PROBE = flags.DEFINE_string("probe", None, "the probe set (JSONL; gs:// too)", required=True)
_MAKE = flags.DEFINE_bool("make", False, "make the probe set from --episodes instead of scoring")
_EPISODES = flags.DEFINE_multi_string(
  "episodes",
  [],
  "--make: episode records, a JSONL file (launch/eval.py --episodes) or a run's episodes "
  "directory (train.save_episodes); repeatable",
)
_VARIATIONS = flags.DEFINE_list("variations", [], "--make: keep only these variations")
_MIN_TIPS = flags.DEFINE_integer(
  "min_tips", 1, "--make: an episode needs at least this many tips shown over its turns"
)
_MAX_FAILED = flags.DEFINE_integer(
  "max_failed_episodes",
  0,
  "--make: keep at most this many failed episodes (the first by episode id; 0: all), so the "
  "failed set, the specificity control, does not dominate the scoring time",
)
_WORKDIR = flags.DEFINE_string("workdir", None, "scoring: the run whose checkpoint is scored")
_STEP = flags.DEFINE_integer("step", None, "scoring: the checkpoint step (default: the newest)")
_OUT = flags.DEFINE_string("out", "", "scoring: write the figures and per-sample values here")
_ROWS = flags.DEFINE_integer("rows", 1, "scoring: packed rows (episodes) per forward pass")
_MAX_PROMPT = flags.DEFINE_integer(
  "max_prompt_len", 8192, "scoring: samples with a longer tip-free prompt are left out"
)


def _check(flag_values) -> None:
  if flag_values.make and not flag_values.episodes:
    raise cli.UserError("--make needs episodes", "--episodes", "pass --episodes=FILE_OR_DIR")
  if not flag_values.make and not flag_values.workdir:
    raise cli.UserError(
      "scoring needs a checkpoint", "--workdir", "pass --workdir=RUN (or --make to build)"
    )


def _records(source):
  from etils import epath

  from empo2_jax.train import probe

  path = epath.Path(source)
  if path.is_dir():
    return probe.episode_records(path)
  if not path.exists():
    raise cli.UserError("no episodes there", str(path), "pass a JSONL file or an episodes dir")
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def make() -> None:
  from empo2_jax.train import probe

  episodes = [r for src in _EPISODES.value for r in _records(src)]
  keep = [int(v) for v in _VARIATIONS.value] or None
  records = probe.probe_records(episodes, variations=keep, min_tips=_MIN_TIPS.value)
  records = probe.cap_episodes(records, "failed", _MAX_FAILED.value)
  if not records:
    raise cli.UserError(
      "no tip-guided episode among them",
      ", ".join(_EPISODES.value),
      "roll out with memory (launch/eval.py --memory=with --episodes=DIR) after tips exist",
    )
  probe.write_probe(_PROBE.value, records)
  for name, s in probe.summary(records).items():
    print(
      f"probe made set={name} samples={s['samples']} episodes={s['episodes']} "
      f"variations={','.join(map(str, s['variations']))} out={_PROBE.value}",
      flush=True,
    )


def score() -> None:
  import ml_collections
  from etils import epath

  from empo2_jax.train import build, export, probe

  records = probe.read_probe(_PROBE.value)
  workdir = _WORKDIR.value
  if "://" not in workdir:  # orbax opens absolute local paths only
    workdir = os.path.abspath(workdir)
  kind, directory = export.checkpoint_dir(workdir)
  step, params, meta = export.restore(directory, _STEP.value)
  c = ml_collections.ConfigDict(meta["config"])
  result = probe.score(
    params,
    export.model_config(c),
    build.tokenizer(c),
    records,
    max_prompt_len=_MAX_PROMPT.value,
    rows=_ROWS.value,
  )
  for name, s in result["sets"].items():
    print(
      f"probe set={name} samples={s['samples']} tokens={s['tokens']} "
      f"logp_mean={s['logp_mean']:.4f} sample_logp_mean={s['sample_logp_mean']:.4f} "
      f"top1={s['top1']:.4f} step={step} kind={kind}",
      flush=True,
    )
  if _OUT.value:
    out = {"workdir": _WORKDIR.value, "kind": kind, "step": step, "probe": _PROBE.value}
    epath.Path(_OUT.value).write_text(json.dumps({**out, **result}, indent=1))


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  make() if _MAKE.value else score()
  return 0


if __name__ == "__main__":
  cli.run(main, checks=(_check,))
