"""launch/inspect_run.py: a run's saved episodes -> one static HTML page (escaped text, modes per
iteration, groups side by side, tips shown, rewards and advantages, the tip written)."""

import json
import os
import subprocess
import sys
from html.parser import HTMLParser

from empo2_jax.agent.actor import Episode
from empo2_jax.data import episodes_html
from empo2_jax.data import trajectories as traj
from empo2_jax.rl.batch import Turn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVIL = "<script>alert('x')</script> & \"quoted\""


def _episode(iteration, rollout_id, mode):
  e = Episode(
    task="find-animal",
    variation=7 + rollout_id // 2,
    group_id=rollout_id // 2,
    rollout_id=rollout_id,
    mode=mode,
    use_memory=mode != "on",
  )
  for t in range(2):
    tips = [f"tip {iteration}.{rollout_id}.{t} {EVIL}"] if mode != "on" else []
    obs = f"obs {iteration}.{rollout_id}.{t}: a <b>room</b> & a door"
    e.turns.append(
      Turn(
        messages=[{"role": "user", "content": obs}],
        response=f"raw {EVIL}",
        response_ids=[1, 2],
        sampler_logprobs=[-0.5, -0.25],
        mode=mode,
        group_id=e.group_id,
        rollout_id=rollout_id,
        step=t,
        episode_return=50.0,
        reward=25.0 * t,
        intrinsic=0.5 if tips else 0.0,
        advantage=0.75 - rollout_id,
      )
    )
    e.observations.append(obs)
    e.executed.append(f"go to kitchen {t}")
    e.tips_shown.append(tips)
    e.retrieved.append(len(tips))
  e.score, e.success, e.tip = 50.0 + rollout_id, rollout_id == 1, f"written {EVIL} {rollout_id}"
  return e


class _Tags(HTMLParser):
  def __init__(self):
    super().__init__()
    self.tags, self.text = [], []

  def handle_starttag(self, tag, attrs):
    self.tags.append((tag, dict(attrs)))

  def handle_data(self, data):
    self.text.append(data)


def _saved_run(tmp_path):
  """A run directory as train.save_episodes leaves it: staging files and metrics.jsonl."""
  run = tmp_path / "run"
  log = traj.EpisodeLog(run / "episodes")
  modes = {1: "on_tips", 2: "on"}
  for it, mode in modes.items():
    log.write(it, [_episode(it, r, mode) for r in range(4)])
  (run / "metrics.jsonl").write_text(
    "".join(json.dumps({"iteration": it, "mode": m}) + "\n" for it, m in modes.items())
  )
  return run, log


def _inspect(*args):
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, "launch", "inspect_run.py"), *args],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=ROOT,
  )


def test_page_escapes_text_and_shows_every_turn(tmp_path):
  run, _ = _saved_run(tmp_path)
  out = tmp_path / "page" / "episodes.html"
  done = _inspect(f"--workdir={run}", f"--out={out}")
  assert done.returncode == 0, done.stderr[-3000:]
  assert "8 episodes" in done.stdout
  page = out.read_text()
  assert "<script" not in page and "&lt;script&gt;" in page  # the run's text is escaped
  parser = _Tags()
  parser.feed(page)
  tags = [t for t, _ in parser.tags]
  assert tags.count("script") == 0 and tags.count("style") == 1  # inline CSS, no scripts
  classes = [a.get("class", "") for _, a in parser.tags]
  assert sum(c.startswith("episode") for c in classes) == 8
  assert classes.count("group") == 4  # 2 iterations x 2 groups, each group's rollouts in a row
  assert sum("success" in c.split() for c in classes) == 2
  text = "".join(parser.text)
  assert "Iteration 1" in text and "Iteration 2" in text
  assert "on_tips" in text  # the iteration's mode
  for it in (1, 2):
    for r in range(4):
      for t in range(2):
        assert f"obs {it}.{r}.{t}: a <b>room</b> & a door" in text  # unescaped by the parser
  assert "tip 1.3.1 " + EVIL in text and "tip 2.0.0" not in text  # tips only where shown
  assert f"written {EVIL} 3" in text and "go to kitchen 1" in text
  assert "-2.25" in text  # rollout 3's advantage, 0.75 - 3
  assert "+0.5" in text  # the intrinsic reward of a turn with tips


def test_iterations_filter_and_the_tfds_fallback(tmp_path):
  run, log = _saved_run(tmp_path)
  log.build_dataset()
  for f in (run / "episodes" / "staging").iterdir():
    f.unlink()  # only the TFDS dataset is left
  records = episodes_html.read_records(run)
  assert len(records) == 8 and all("advantage" in r["turns"] for r in records)
  out = tmp_path / "it2.html"
  done = _inspect(f"--workdir={run}", f"--out={out}", "--iterations=2")
  assert done.returncode == 0, done.stderr[-3000:]
  page = out.read_text()
  assert "Iteration 2" in page and "Iteration 1" not in page


def test_a_run_without_episodes_is_one_error_line(tmp_path):
  (tmp_path / "run").mkdir()
  done = _inspect(f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / 'x.html'}")
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")
  assert "save_episodes" in lines[0] and not (tmp_path / "x.html").exists()
