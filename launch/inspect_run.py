"""Show what the agent did in a run: one static HTML page (no server, no scripts).

  python launch/inspect_run.py --workdir=runs/cpu --out=runs/cpu/episodes.html
  python launch/inspect_run.py --workdir=runs/cpu --out=/tmp/it2.html --iterations=2

The run must have saved its episodes (--config.train.save_episodes=True). Per iteration: its mode;
per group: the rollouts of one task variation side by side; per episode: each turn's observation,
tips shown, raw and executed action, reward and advantage, then the tip the agent wrote and the
episode's score (empo2_jax/data/episodes_html.py).

(Not launch/inspect.py: a script's directory comes first on the import path, so that name would
shadow Python's own `inspect` module for every script in launch/.)
"""

import argparse

from etils import epath

from empo2_jax import cli


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True, help="the run's workdir (local or gs://)")
  p.add_argument("--out", required=True, help="the HTML file to write")
  p.add_argument("--iterations", default="", help="comma-separated iterations (default: all)")
  args = p.parse_args(argv)
  from empo2_jax import preflight
  from empo2_jax.data import episodes_html

  preflight.check_remote(args.workdir)
  if not epath.Path(args.workdir).is_dir():
    raise cli.UserError("no such run directory", args.workdir, "pass a launch/train.py --workdir")
  records = episodes_html.read_records(args.workdir)
  if args.iterations:
    keep = {int(x) for x in args.iterations.split(",") if x.strip()}
    records = [r for r in records if int(r["iteration"]) in keep]
  page = episodes_html.render(
    records, modes=episodes_html.read_modes(args.workdir), title=str(args.workdir)
  )
  out = epath.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(page)
  print(f"wrote {out} ({len(records)} episodes)")
  return 0


if __name__ == "__main__":
  cli.guard(main)
