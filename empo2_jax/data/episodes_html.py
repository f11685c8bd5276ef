"""What the agent did, as one static HTML page (inline CSS, no scripts, no server).

    records = read_records("runs/cpu")          # the run's saved episodes (train.save_episodes)
    page = render(records, modes=read_modes("runs/cpu"), title="runs/cpu")

Per iteration: its mode (on / on_tips / off) and its groups; a group's rollouts (one task
variation) stand side by side. Per episode: score, success, whether memory was used; per turn the
observation, the tips shown in the prompt, the raw and the executed action, the reward (+ the
intrinsic reward) and the turn's advantage in the update; then the tip the agent wrote after the
episode. Every text from the run is HTML-escaped.

Records are data/trajectories.episode_record dicts: read from the per-iteration staging files
(<workdir>/episodes/staging/iter-*.jsonl, written during the run) or, when those are gone, from
the TFDS dataset built at the end (<workdir>/episodes/tfds). Reading writes nothing.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from typing import Iterable, Optional

from etils import epath

from empo2_jax.errors import UserError

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #222; background: #fafafa; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 2px solid #888; }
h3 { font-size: 1em; margin: 1em 0 .3em; color: #444; }
.mode { display: inline-block; padding: 0 .5em; border-radius: 3px; color: #fff; }
.mode-on { background: #3a6ea5; } .mode-on_tips { background: #7a4fa0; }
.mode-off { background: #b5651d; } .mode-eval, .mode- { background: #666; }
.group { display: flex; gap: 1em; overflow-x: auto; align-items: flex-start; }
.episode { flex: 0 0 44em; background: #fff; border: 1px solid #ccc; border-radius: 4px;
  padding: .5em; }
.episode.success { border-color: #2e8b57; border-width: 2px; }
.meta { color: #555; font-size: .9em; }
table { border-collapse: collapse; width: 100%; margin: .4em 0; }
td, th { border-top: 1px solid #ddd; padding: .25em; vertical-align: top; text-align: left; }
th { font-weight: 600; color: #555; font-size: .85em; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font: 12px/1.35 monospace; }
td.obs { width: 50%; }
.obs pre { max-height: 12em; overflow-y: auto; background: #f4f4f4; padding: .2em; tab-size: 2; }
.tips { margin: .2em 0; padding-left: 1.2em; color: #5a3d7a; font-size: .9em; }
.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
.pos { color: #1d7a3c; } .neg { color: #b22222; }
.written { background: #fff8dc; border-left: 3px solid #daa520; padding: .3em; margin-top: .4em; }
"""


def read_records(workdir) -> list[dict]:
  """The run's saved episodes (see the module docstring); UserError when there are none."""
  root = epath.Path(workdir) / "episodes"
  staging = sorted((root / "staging").glob("iter-*.jsonl")) if (root / "staging").is_dir() else []
  if staging:
    out = []
    for path in staging:
      out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out
  versions = sorted((root / "tfds").glob("*/*")) if (root / "tfds").is_dir() else []
  if versions:
    from empo2_jax.data import trajectories

    source = trajectories.load(versions[-1])
    return [trajectories.decode(source[i]) for i in range(len(source))]
  raise UserError(
    "the run saved no episodes",
    str(root),
    "train with --config.train.save_episodes=True to record them",
  )


def read_modes(workdir) -> dict[int, str]:
  """{iteration: mode} from <workdir>/metrics.jsonl (empty when it is not there)."""
  path = epath.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return {}
  out = {}
  for line in path.read_text().splitlines():
    try:
      rec = json.loads(line)
    except json.JSONDecodeError:
      continue
    if "iteration" in rec and "mode" in rec:
      out[int(rec["iteration"])] = str(rec["mode"])
  return out


def _e(text) -> str:
  return html.escape(str(text), quote=True)


def _num(x, signed: bool = False) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return '<span class="num">–</span>'
  cls = " pos" if signed and x > 0 else " neg" if signed and x < 0 else ""
  return (
    f'<span class="num{cls}">{x:+.3g}</span>' if signed else f'<span class="num">{x:.4g}</span>'
  )


def _turn_tips(record: dict) -> list[list[str]]:
  """The flat `tips` list cut back into turns by turns.num_tips."""
  tips, out, at = list(record.get("tips", [])), [], 0
  for n in record["turns"].get("num_tips", []):
    out.append(tips[at : at + n])
    at += n
  return out


def render_episode(r: dict) -> str:
  t = r["turns"]
  n = len(t.get("observation", []))
  tips = _turn_tips(r) + [[] for _ in range(n)]
  col = {k: list(t.get(k, [])) + [None] * n for k in t}
  rows = []
  for i in range(n):
    shown = "".join(f"<li>{_e(x)}</li>" for x in tips[i])
    intrinsic = col["intrinsic"][i]
    bonus = f" {_num(intrinsic, True)}<br>intr." if intrinsic else ""
    rows.append(
      "<tr>"
      f'<td class="num">{i + 1}</td>'
      f'<td class="obs"><pre>{_e(col["observation"][i] or "")}</pre>'
      + (f'<ul class="tips" title="tips shown">{shown}</ul>' if shown else "")
      + "</td>"
      f"<td><pre>{_e(col['raw_action'][i] or '')}</pre>"
      f"<div class=meta>→ {_e(col['executed_action'][i] or '')}</div></td>"
      f"<td>{_num(col['reward'][i], True)}{bonus}</td>"
      f"<td>{_num(col.get('advantage', [None] * n)[i], True)}</td>"
      "</tr>"
    )
  cls = "episode success" if r.get("success") else "episode"
  failed = " · <b>env failed</b>" if r.get("env_failed") else ""
  memory = "with tips" if r.get("use_memory") else "no tips"
  written = r.get("tip") or ""
  return (
    f'<div class="{cls}" id="{_e(r.get("episode_id", ""))}">'
    f'<div class="meta">rollout {_e(r.get("rollout_id"))} · {memory} · score '
    f"{_num(r.get('score'))} · {'success' if r.get('success') else 'no success'}{failed}</div>"
    "<table><tr><th>#</th><th>observation · tips shown</th><th>action (raw → executed)</th>"
    "<th>reward</th><th>adv.</th></tr>"
    + "".join(rows)
    + "</table>"
    + (
      f'<div class="written"><b>tip written</b> (episode score {_num(r.get("score"))}): '
      f"{_e(written)}</div>"
      if written
      else ""
    )
    + "</div>"
  )


def render(records: Iterable[dict], *, modes: Optional[dict] = None, title: str = "") -> str:
  """The page: iterations in order, groups within, episodes of a group side by side."""
  modes = dict(modes or {})
  by_iter: dict[int, dict] = defaultdict(lambda: defaultdict(list))
  records = list(records)
  for r in records:
    by_iter[int(r["iteration"])][int(r["group_id"])].append(r)
  body = []
  for it in sorted(by_iter):
    groups = by_iter[it]
    mode = modes.get(it) or next(iter(groups.values()))[0].get("mode", "")
    body.append(f'<h2>Iteration {it} <span class="mode mode-{_e(mode)}">{_e(mode)}</span></h2>')
    for g in sorted(groups):
      eps = sorted(groups[g], key=lambda r: int(r["rollout_id"]))
      first = eps[0]
      scores = [float(e["score"]) for e in eps]
      body.append(
        f"<h3>group {g}: {_e(first.get('task', ''))}, variation {_e(first.get('variation'))}"
        f" · mean score {sum(scores) / len(scores):.3g}</h3>"
        '<div class="group">' + "".join(render_episode(e) for e in eps) + "</div>"
      )
  head = (
    f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title or 'episodes')}</title>"
    f"<style>{CSS}</style></head><body>"
    f"<h1>{_e(title or 'episodes')}</h1><p class=meta>{len(records)} episodes, "
    f"{len(by_iter)} iterations. Reward: the step's score change (+ intrinsic); adv.: the "
    "turn's advantage in the update (– where it was not trained on).</p>"
  )
  return head + "".join(body) + "</body></html>\n"


__all__ = ["read_records", "read_modes", "render", "render_episode"]
