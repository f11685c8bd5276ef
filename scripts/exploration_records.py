"""The exploration experiment's committed records (scripts/exploration_experiment.sh `archive`
and the check in `sft`): runs/ does not outlive a checkout, so what the report reads is copied
into the repository, and an SFT start rebuilt later must be the archived one, byte for byte.

  python scripts/exploration_records.py check SFT_DIR ARCHIVE   # is the start the archived one
  python scripts/exploration_records.py archive ROOT ARCHIVE    # ROOT's records into ARCHIVE
"""

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

# What compare.tip_usage and inspect read of an episode (data/trajectories.episode_record),
# without prompts, observations, token ids or log-probs.
KEEP = ("episode_id", "iteration", "task", "variation", "group_id", "rollout_id", "mode",
        "use_memory", "score", "success", "env_failed", "tip", "tips")  # fmt: skip
TURNS = ("executed_action", "reward", "num_tips", "num_tokens")


def hf_sha256(hf: str) -> dict:
  """{file name: SHA-256} of an hf/ checkpoint directory (streamed: the weights are 0.5 GB)."""
  out = {}
  for name in sorted(os.listdir(hf)):
    with open(os.path.join(hf, name), "rb") as f:
      out[name] = hashlib.file_digest(f, "sha256").hexdigest()
  return out


def machine() -> dict:
  """What an fp32 start's last bits depend on besides the code: the CPU model and jax/jaxlib."""
  import importlib.metadata
  import platform

  cpu = platform.processor() or platform.machine()
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
    cpu = names[0] if names else cpu
  out = {"cpu": cpu}
  for pkg in ("jax", "jaxlib"):
    try:
      out[pkg] = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
      out[pkg] = None
  return out


def differing(archived: str, got: dict) -> list:
  """The files whose hash differs from the archived start's ([] when it is the same)."""
  with open(archived) as f:
    want = json.load(f)["hf_sha256"]
  return sorted(n for n in set(want) | set(got) if want.get(n) != got.get(n))


def check(sft: str, archived: str) -> None:
  hf = os.path.join(sft, "sft", "hf")
  got = hf_sha256(hf)
  if not os.path.exists(archived):
    print(f"sft: no {archived} yet (the archive step writes it)")
    return
  bad = differing(archived, got)
  if bad:
    with open(archived) as f:
      built_on = json.load(f).get("machine", "not recorded")
    sys.exit(
      f"sft: {hf} differs from the archived start in {bad}: the arms would not share one "
      f"start; rebuild with the commit {archived} names, on the machine kind it was built on "
      f"({built_on}; this one: {machine()})"
    )
  print(f"sft: {hf} matches {archived} ({len(got)} files)")


def _trim(line: str) -> str:
  e = json.loads(line)
  rec = {k: e[k] for k in KEEP if k in e}
  rec["turns"] = {k: e["turns"][k] for k in TURNS if k in e["turns"]}
  return json.dumps(rec) + "\n"


def archive(root: str, dest: str) -> None:
  n_eval = n_runs = 0
  for src in glob.glob(f"{root}/eval/*/it*/*/eval/result.json"):
    out = os.path.join(dest, os.path.relpath(src, root))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    shutil.copyfile(src, out)
    n_eval += 1
  for run in glob.glob(f"{root}/arms/*/*"):
    if not os.path.exists(f"{run}/metrics.jsonl"):
      continue
    out = os.path.join(dest, os.path.relpath(run, root))
    os.makedirs(f"{out}/episodes/staging", exist_ok=True)
    shutil.copyfile(f"{run}/metrics.jsonl", f"{out}/metrics.jsonl")
    for src in sorted(glob.glob(f"{run}/episodes/staging/iter-*.jsonl")):
      with open(src) as f, open(f"{out}/episodes/staging/{os.path.basename(src)}", "w") as g:
        g.writelines(_trim(line) for line in f if line.strip())
    n_runs += 1
  hf = f"{root}/sft/sft/hf"
  if os.path.isdir(hf):
    got, old = hf_sha256(hf), f"{dest}/sft.json"
    if os.path.exists(old):
      if differing(old, got):
        sys.exit(f"{root}/sft differs from {old}: not archived (the arms would not share a start)")
    else:
      summary = f"{root}/sft/sft_summary.json"
      code = (os.environ.get("PYTHONPATH") or ".").split(":")[0]  # the checkout whose code ran
      rev = subprocess.run(["git", "-C", code, "rev-parse", "HEAD"], capture_output=True, text=True)
      blob = {
        "summary": json.load(open(summary)) if os.path.exists(summary) else None,
        "hf_sha256": got,
        "code_commit": rev.stdout.strip(),  # $PYTHONPATH's checkout (the run worktree), else ours
        "machine": machine(),
      }
      os.makedirs(dest, exist_ok=True)
      with open(old, "w") as f:
        json.dump(blob, f, indent=1)
  print(f"archived {n_eval} evaluations and {n_runs} training runs into {dest}")


if __name__ == "__main__":
  steps = {"check": check, "archive": archive}
  if len(sys.argv) != 4 or sys.argv[1] not in steps:
    sys.exit(__doc__)
  steps[sys.argv[1]](*sys.argv[2:])
