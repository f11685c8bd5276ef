"""SPA's stages A and B (launch/spa.py runs them, then stage C, the RL): self-play collection in
the world-model format with the current policy, conversion into SFT chats with the true states,
the seeded split, SFT (train/sft_loop.py) and the validation NLL before and after.

    hf_dir = stages_ab(config, "<workdir>/spa")    # the SFT policy as a Hugging Face directory

spa_dir may be gs://: its files go through etils.epath, the SFT through train/sft_loop.py (which
writes gs:// too) and the stage's Trainer like a training workdir.
"""

import json
import math
import sys

from etils import epath


def collect(trainer, c) -> list:
  """Stage A: the episodes of spa.collect_iterations rollouts in the world-model format."""
  import jax

  from empo2_jax.methods import spa

  episodes = []
  for k in range(c.spa.collect_iterations):
    variations = trainer.variations_for_iteration()
    specs = [
      (c.env.task, v, g) for g, v in enumerate(variations) for _ in range(c.rollout.group_size)
    ]
    rollout = trainer.actor.rollout(
      trainer.sampling_params(),
      trainer.model_config,
      specs,
      use_memory=False,
      temperature=c.spa.collect_temperature,
      rng=jax.random.fold_in(trainer.rng, 20_000_000 + k),
      mode="on",
      notes=[spa.WM_INSTRUCTION] * len(specs),
    )
    rollout.close()  # no tips are written
    episodes += [e for e in rollout.episodes if not e.env_failed and e.turns]
    print(f"spa collect iteration={k + 1} episodes={len(episodes)}", flush=True)
  return episodes


def to_chats(episodes) -> list:
  from empo2_jax.methods import spa

  cut = [spa.valid_prefix(e.messages, e.extras["states"], e.executed) for e in episodes]
  return [spa.episode_chat(*x) for x in cut if x is not None]


def val_loss(trainer, c, chats) -> float:
  """Token-mean answer NLL of `chats` under the trainer's current policy (nan: no chats)."""
  import numpy as np

  from empo2_jax.train import sft
  from empo2_jax.train.sft_loop import fill_rows

  rows = sft.chat_rows(trainer.tokenizer, chats, c.sft.max_len)
  if not rows:
    return float("nan")
  scfg = sft.SFTConfig(micro_rows=c.sft.micro_rows)
  loss = sft.make_eval_loss(trainer.model_config, scfg)
  total = count = 0.0
  for i in range(0, len(rows), c.sft.batch_rows):
    batch = fill_rows(sft.pad_rows(rows[i : i + c.sft.batch_rows], trainer.tokenizer.pad_token_id),
                  c.sft.batch_rows)  # fmt: skip
    n = float(np.asarray(batch["loss_mask"])[:, 1:].sum())
    total += float(loss(trainer.state.params, batch)) * n
    count += n
  return total / max(count, 1.0)


def stages_ab(c, spa_dir: str) -> str:
  """Stages A and B in spa_dir; returns the SFT policy's HF directory."""
  from empo2_jax.methods import spa
  from empo2_jax.train.trainer import Trainer
  from empo2_jax.train.sft_loop import run_sft

  spa_dir = str(spa_dir).rstrip("/")
  hf_dir = f"{spa_dir}/sft/hf"
  if (epath.Path(hf_dir) / "config.json").exists():
    print(f"spa: SFT policy found in {hf_dir}; stages A and B skipped", flush=True)
    return hf_dir
  trainer = Trainer(c, spa_dir, progress=False)
  try:
    paths = [epath.Path(spa_dir) / f"wm_{s}.jsonl" for s in ("train", "val")]
    info_path = epath.Path(spa_dir) / "collect.json"
    if all(p.exists() for p in paths + [info_path]):
      train, val = ([json.loads(x) for x in p.read_text().splitlines() if x.strip()] for p in paths)
      info = json.loads(info_path.read_text())
    else:
      episodes = collect(trainer, c)
      chats = to_chats(episodes)
      tr, va = spa.split(len(chats), c.spa.val_share, c.seed)
      train, val = [chats[i] for i in tr], [chats[i] for i in va]
      turns = [t for e in episodes for t in e.turns]
      info = {
        "episodes": len(episodes),
        "turns": len(turns),
        "success": sum(e.success for e in episodes) / max(len(episodes), 1),
        "return_mean": sum(e.score for e in episodes) / max(len(episodes), 1),
        "wm_format_frac": sum(spa.parse_wm(t.response) is not None for t in turns)
        / max(len(turns), 1),
        "train_chats": len(train),
        "val_chats": len(val),
      }
      info_path.parent.mkdir(parents=True, exist_ok=True)
      for p, data in zip(paths, (train, val)):
        p.write_text("".join(json.dumps(x) + "\n" for x in data))
    if not train:
      sys.exit("error: SPA collected no episode to train on; raise spa.collect_iterations")
    info["val_loss_before"] = val_loss(trainer, c, val)
    sft_c = c
    if c.spa.sft_epochs > 0:  # SPA trains epochs over its data
      sft_c = c.copy_and_resolve_references()
      from empo2_jax.train import sft

      n_rows = len(sft.chat_rows(trainer.tokenizer, train, c.sft.max_len))
      sft_c.sft.steps = max(1, math.ceil(c.spa.sft_epochs * n_rows / c.sft.batch_rows))
    summary = run_sft(sft_c, spa_dir, trainer, train)
    info["val_loss_after"] = val_loss(trainer, c, val)
    info["sft_steps"] = int(sft_c.sft.steps)
    info["sft_loss_first"], info["sft_loss_last"] = summary["loss_first"], summary["loss_last"]
    info_path.write_text(json.dumps(info, indent=1))
    print(
      "spa data "
      + " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items()
      ),  # fmt: skip
      flush=True,
    )
  finally:
    trainer.close()
  return hf_dir


__all__ = ["collect", "to_chats", "val_loss", "stages_ab"]
