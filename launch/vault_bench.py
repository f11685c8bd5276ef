"""The vault bench: which objective moves what memory tips achieve into the tip-free weights
(docs/vault_bench.md). One command runs the start (a format SFT), its gate, then every arm-seed,
writing each arm-seed's record as it finishes; rerunning it skips what is done.

  python launch/vault_bench.py --config=configs/vault.py:small --root=runs/vault_small \\
      --records=docs/vault/small                                   # every arm x 5 seeds
  python launch/vault_bench.py --config=configs/vault.py:cpu --root=runs/vault_135m \\
      --records=docs/vault/135m --arms=D,A,E,F,G,P --seeds=0,1,2
  python launch/vault_bench.py --config=configs/vault.py --config.model.checkpoint=DIR ...
  python launch/vault_bench.py --records=docs/vault/small --report   # the table and the plot

The arms run only when the gate holds (with-tip success 0.60-0.90, tip-free <= 0.03 on the
trained vaults); otherwise the command stops and says so: change the start, not the arms.
--root holds the start's weights and each arm-seed's workdir while it runs (removed after its
record is written); --records holds what is kept: start.json, gate.json, arms/<arm>_s<seed>.json.
Records whose start's weights are gone (a fresh machine) get the start built again and its gate
measured again (start_rebuilt.json, gate_rebuilt.json); the arms go on only if that gate holds.
"""

import sys
import warnings

warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from empo2_jax import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "config file (path[:arg])")
_ROOT = flags.DEFINE_string("root", "runs/vault", "the start's weights and the running arms")
_RECORDS = flags.DEFINE_string("records", "", "where the records go (default: <root>/records)")
_ARMS = flags.DEFINE_list("arms", ["P", "D", "A", "B", "E", "F", "F+", "G", "W"], "arms, in order")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2", "3", "4"], "seeds; every arm per seed")
_ITERATIONS = flags.DEFINE_integer("iterations", 0, "iterations per arm-seed (0: the config's)")
_P_COPY = flags.DEFINE_float("p_copy", 0.75, "the SFT's share of with-tip answers that copy it")
_SFT_VAULTS = flags.DEFINE_integer("sft_vaults", 1024, "vaults in the format SFT (2 chats each)")
_SFT_TIPS = flags.DEFINE_enum(
  "sft_tips", "oracle", ["oracle", "mixed"],
  "the SFT's tip blocks: the oracle tip alone, or also among / replaced by failed tips",
)  # fmt: skip
_GATE_ONLY = flags.DEFINE_bool("gate_only", False, "stop after the gate")
_IGNORE_GATE = flags.DEFINE_bool(
  "ignore_gate", False, "run the arms even if the gate fails (mechanics checks: no verdict)"
)
_REPORT = flags.DEFINE_bool("report", False, "only print the table and write the plot")
_PLOT = flags.DEFINE_string("plot", "", "the plot's path (default: <records>/vault_bench.png)")


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  records = _RECORDS.value or f"{_ROOT.value}/records"
  from empo2_jax.train import vault_report

  if _REPORT.value:
    table = vault_report.report(records, plot=_PLOT.value or f"{records}/vault_bench.png")
    print(table)
    return
  if _CONFIG.value is None:
    cli.fail(ValueError("--config is required, e.g. --config=configs/vault.py:small"))
  from empo2_jax.train import vault_bench

  unknown = [a for a in _ARMS.value if a not in vault_bench.ARMS]
  if unknown:
    cli.fail(ValueError(f"--arms: unknown {unknown}; valid: {', '.join(vault_bench.ARMS)}"))
  seeds = [int(s) for s in _SEEDS.value]
  bench = vault_bench.Bench(
    _CONFIG.value, _ROOT.value, records, p_copy=_P_COPY.value, sft_vaults=_SFT_VAULTS.value,
    sft_tips=_SFT_TIPS.value,
  )  # fmt: skip
  start = bench.start()
  print(f"vault start loss_first={start['loss_first']:.4f} loss_last={start['loss_last']:.4f}")
  gate = bench.gate()
  print(
    f"vault gate with_tips={gate['with_tips']['success']:.3f} "
    f"tip_free={gate['tip_free']['success']:.3f} "
    f"groups_mixed={gate['with_tips']['groups_mixed']:.3f} holds={gate['holds']}",
    flush=True,
  )
  if not gate["holds"] and not _IGNORE_GATE.value:
    sys.exit(
      "error: the gate does not hold (with-tip success must be in [0.60, 0.90] and tip-free "
      f"<= 0.03; {records}/{'gate_rebuilt' if bench.rebuilt else 'gate'}.json): change the "
      "start (--p_copy, sft.steps), not the arms"
    )
  if _GATE_ONLY.value:
    return
  for seed in seeds:
    for name in _ARMS.value:
      try:
        rec = bench.arm(name, seed, _ITERATIONS.value or None)
      except vault_bench.Preempted as e:
        print(f"preempted: {e}", flush=True)
        return  # exit status 0, as a preempted training run; the rerun resumes here
      tr = rec["scores"]["trained"]
      greedy = sum(v["greedy"] for v in tr.values()) / len(tr)
      print(f"vault arm={name} seed={seed} trained_greedy={greedy:.3f} s={rec['seconds']:.0f}")
      sys.stdout.flush()
  print(vault_report.report(records, plot=_PLOT.value or f"{records}/vault_bench.png"))


if __name__ == "__main__":
  cli.run(main)
