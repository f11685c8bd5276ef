"""Behaviour pin: the tiny config's metrics over 3 iterations (seed 0 draws on_tips, on, off: every
mode once) and an evaluation after the last (without and with memory) equal the values recorded
for this host's kind in tests/integration/data/tiny_metrics_pin/<kind>.json (their git log says
when and why each recording was made; the sampler drawing tokens by inverting the CDF at one
uniform a row, the same distribution as the Gumbel draw before it but other draws, was the last
behaviour change).

A refactor that changes what the trainer computes moves some of these numbers: the rollout's
returns and token counts, the tips written and retrieved, the advantages, the loss, the gradient
norm and the evaluation. Wall-clock, memory and compile counts are not behaviour and are left out.

Recordings are kept per host kind (`host_kind`: the machine, the CPU's vendor and model, and the
instruction sets that change fp32 results). float32 results differ in their last bits between CPU
kinds (the decode kernels build with -march=native, XLA:CPU vectorises for its host), and a
sampled token is a discontinuous function of the logits: one token drawn otherwise changes the
rest of the run. On a host of a recorded kind every value is compared (rtol 1e-6). On another
kind the run passes when it equals some recording; otherwise only what no recorded kind has been
seen to change is compared (`host_independent`: the first two iterations whole, the configured
counts of later ones), and a warning says how to record the kind. unidentified.json was recorded
before recordings were keyed, on a kind other than x86_64-AuthenticAMD-AMD-EPYC-avx512f-avx2-fma.

Record on a host of a kind without a recording, and after a behaviour change (say why in the
commit) on every kind there is; delete the recordings of kinds that cannot be re-recorded then
(test_recordings_agree_where_the_host_does_not_matter fails while a stale one is left):
  .venv/bin/python tests/integration/test_metrics_pin.py --record
"""

from __future__ import annotations

import copy
import glob
import json
import math
import os
import re
import sys
import tempfile
import warnings

import pytest

from empo2_jax.model import cpu_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PINS = os.path.join(ROOT, "tests", "integration", "data", "tiny_metrics_pin")
RECORD = "python tests/integration/test_metrics_pin.py --record"
# not behaviour: wall clock, host memory, compile counts, throughput
VOLATILE_PREFIXES = ("time/", "host/")
VOLATILE_PARTS = ("per_s", "_sec", "throughput")
RTOL = ATOL = 1e-6
# instruction sets whose presence changes fp32 results (vector width, fused multiply-add)
FP_FEATURES = ("avx512f", "avx2", "fma", "asimd", "sve", "sve2")
# iterations every recorded kind (and the XLA decode path) samples the same tokens in
HOST_INDEPENDENT_ITERATIONS = 2
# what the config fixes in every iteration, whatever tokens were sampled
CONFIGURED = ("mode", "mode_id", "samples")
CONFIGURED += ("eval/episodes", "eval/k", "eval_mem/episodes", "eval_mem/k")


def host_kind(cpu: str | None = None) -> str:
  """This host's numeric kind, a file name: machine, CPU vendor and model, and which of
  FP_FEATURES it has, read from `cpu_kernels.host_cpu()` (what the kernels' cache key names)."""
  machine, *lines = (cpu if cpu is not None else cpu_kernels.host_cpu()).splitlines()
  fields = dict(line.partition(": ")[::2] for line in lines)
  features = set((fields.get("flags") or fields.get("Features") or "").split())
  names = [fields.get(f) for f in ("vendor_id", "model name", "CPU implementer", "CPU part")]
  if not any(names):  # no /proc/cpuinfo: host_cpu gave the processor's name
    names = [line for line in lines if ": " not in line]
  parts = [machine, *filter(None, names), *(f for f in FP_FEATURES if f in features)]
  return re.sub(r"[^A-Za-z0-9_.]+", "-", "-".join(parts)).strip("-")


def recordings() -> dict[str, list[dict]]:
  """{kind: metrics of each iteration} for every recording."""
  out = {}
  for path in sorted(glob.glob(os.path.join(PINS, "*.json"))):
    with open(path) as f:
      out[os.path.basename(path)[: -len(".json")]] = json.load(f)
  return out


def pinned(m: dict) -> dict:
  return {
    k: v
    for k, v in m.items()
    if not k.startswith(VOLATILE_PREFIXES)
    and not any(p in k for p in VOLATILE_PARTS)
    and isinstance(v, (int, float, str, bool))
  }


def host_independent(metrics: list[dict]) -> list[dict]:
  """The part of a run no recorded CPU kind has changed: the first iterations whole, then the
  values the config fixes."""
  return [
    m if i < HOST_INDEPENDENT_ITERATIONS else {k: v for k, v in m.items() if k in CONFIGURED}
    for i, m in enumerate(metrics)
  ]


def tiny_metrics(workdir: str) -> list[dict]:
  from empo2_jax.defaults import load_config
  from empo2_jax.train.trainer import Trainer

  config = load_config(os.path.join(ROOT, "configs", "sciworld.py") + ":tiny")
  config.train.iterations = 3
  config.train.eval_at_end = True
  config.train.eval_with_memory = True
  trainer = Trainer(config, workdir, progress=False)
  return [pinned(m) for m in trainer.run()]  # run() closes the trainer


def _close(a, b) -> bool:
  if isinstance(a, float) or isinstance(b, float):
    if isinstance(a, bool) or isinstance(b, bool):
      return a == b
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
      return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= ATOL + RTOL * abs(b)
  return a == b


def differences(got: list[dict], want: list[dict], same_names: bool = True) -> list[str]:
  """Where `got` is not `want`, one line an iteration. same_names=False compares the names both
  hold only (another kind's recording may be older than a metric)."""
  if len(got) != len(want):
    return [f"{len(got)} iterations, recorded {len(want)}"]
  out = []
  for i, (g, w) in enumerate(zip(got, want), start=1):
    names = sorted(set(g) ^ set(w)) if same_names else []
    bad = {k: (g[k], w[k]) for k in w if k in g and not _close(g[k], w[k])}
    if names or bad:
      side = f"names only one side has {names}, " if names else ""
      out.append(f"iteration {i}: {side}(now, recorded) {bad}")
  return out


def host_differences(got: list[dict], want: list[dict]) -> list[str]:
  """`differences` where no recorded CPU kind has changed the run."""
  return differences(host_independent(got), host_independent(want), same_names=False)


def check_run(got: list[dict], kind: str, recorded: dict[str, list[dict]]) -> None:
  """Assert the run `got` on a host of `kind` against the recordings (the module's docstring);
  warn where the kind has none."""
  assert recorded, f"no recording in {PINS}: {RECORD}"
  assert [m["mode"] for m in got] == ["on_tips", "on", "off"]
  if kind in recorded:
    bad = differences(got, recorded[kind])
    assert not bad, f"host kind {kind}: " + "; ".join(bad)
    return
  equal = [k for k, want in recorded.items() if not differences(got, want, same_names=False)]
  if not equal:
    for other, want in recorded.items():
      bad = host_differences(got, want)
      assert not bad, (
        f"host kind {kind} has no recording, and where no recorded kind differs it differs from "
        f"{other}: {'; '.join(bad)}. Behaviour changed (re-record every kind), or this kind "
        f"samples other tokens sooner than the recorded ones (record it): {RECORD}"
      )
  warnings.warn(
    f"host kind {kind} has no recording: "
    + (f"the run equals {equal}'s" if equal else "only its host-independent metrics were compared")
    + f"; record it: {RECORD}"
  )


@pytest.mark.slow
def test_tiny_metrics_equal_the_recorded_values(tmp_path):
  check_run(tiny_metrics(str(tmp_path)), host_kind(), recordings())


def test_the_check_is_exact_on_a_recorded_kind_and_partial_on_another():
  """check_run on runs made from a recording: every value counts on its own kind; on a kind
  without a recording a change in a later iteration's sampled tokens passes with a warning, one in
  the first iteration fails saying how to record."""
  kind, want = next(iter(recordings().items()))
  check_run(copy.deepcopy(want), kind, {kind: want})
  tokens = copy.deepcopy(want)
  tokens[2]["prefill_tokens"] += 5
  with pytest.raises(AssertionError, match="prefill_tokens"):
    check_run(tokens, kind, {kind: want})
  with pytest.warns(UserWarning, match="only its host-independent metrics.*--record"):
    check_run(tokens, "another-kind", {kind: want})
  with pytest.warns(UserWarning, match="the run equals"):  # a metric newer than the recording
    check_run([dict(m, new_metric=1.0) for m in want], "another-kind", {kind: want})
  early = copy.deepcopy(want)
  early[0]["return_mean"] += 1.0
  with pytest.raises(AssertionError, match="return_mean.*--record"):
    check_run(early, "another-kind", {kind: want})
  renamed = [dict(m, new_metric=1.0) for m in want]
  with pytest.raises(AssertionError, match="names only one side has"):
    check_run(renamed, kind, {kind: want})


def test_recordings_agree_where_the_host_does_not_matter():
  """Every recording is of the three modes and equals the others where no CPU kind has changed the
  run: a behaviour change recorded on one kind leaves no other kind's stale recording behind."""
  recorded = recordings()
  assert recorded, f"no recording in {PINS}: {RECORD}"
  (first, want), *rest = recorded.items()
  assert [m["mode"] for m in want] == ["on_tips", "on", "off"], first
  for kind, got in rest:
    bad = host_differences(got, want)
    assert not bad, f"recordings {kind} and {first} disagree: " + "; ".join(bad)


def test_host_kind_names_the_cpu_and_the_features_that_change_fp32():
  intel = "x86_64\nvendor_id: GenuineIntel\nmodel name: Intel(R) Xeon(R) 8481C\nflags: sse avx2 fma"
  intel += " avx512f avx512_bf16"
  assert host_kind(intel) == "x86_64-GenuineIntel-Intel-R-Xeon-R-8481C-avx512f-avx2-fma"
  assert host_kind(intel.replace(" avx512_bf16", "")) == host_kind(intel)  # no fp32 change
  assert host_kind(intel.replace(" avx512f", "")) != host_kind(intel)
  arm = "aarch64\nCPU implementer: 0x41\nCPU part: 0xd0c\nFeatures: fp asimd sve"
  assert host_kind(arm) == "aarch64-0x41-0xd0c-asimd-sve"
  assert host_kind("arm64\narm") == "arm64-arm"  # no /proc/cpuinfo
  assert host_kind() == host_kind(cpu_kernels.host_cpu())


if __name__ == "__main__":
  if sys.argv[1:] != ["--record"]:
    sys.exit(__doc__)
  kind = host_kind()
  with tempfile.TemporaryDirectory() as d:
    metrics = tiny_metrics(d)
  os.makedirs(PINS, exist_ok=True)
  path = os.path.join(PINS, f"{kind}.json")
  with open(path, "w") as f:
    json.dump(metrics, f, indent=1, sort_keys=True)
  print(f"wrote {path}: {len(metrics)} iterations, {sum(map(len, metrics))} values")
  for other, want in recordings().items():
    if other != kind and host_differences(metrics, want):
      print(f"{other} differs where the host does not matter: re-record it on its kind, or delete")
