"""The SFT loop of launch/sft.py and launch/spa.py: evaluation before and after, steps with orbax
checkpoints (a rerun resumes), the policy exported as a Hugging Face directory.

    summary = run_sft(config, workdir, trainer, chats)   # chats: [[{"role", "content"}, ...]]

The chats' assistant turns are what is trained (train/sft.py: one packed row per chat, the
token-mean NLL of the answers). The workdir may be gs://: every file goes through etils.epath and
empo2_jax/remote.py (sft_metrics.jsonl there is written at each checkpoint and at the end).
"""

import json
import os
import sys
import time

from etils import epath

from empo2_jax import remote


def run_sft(c, workdir, trainer, chats, t0=None) -> dict:
  """SFT of `trainer`'s policy on `chats` (assistant turns scored; train/sft.py): eval before,
  steps with orbax checkpoints under <workdir>/sft/checkpoints (a rerun resumes), eval after,
  the policy as a Hugging Face directory <workdir>/sft/hf, <workdir>/sft_summary.json (also
  returned). Used by launch/sft.py (gold chats) and launch/spa.py (world-model chats)."""
  import numpy as np
  import jax
  import jax.numpy as jnp
  from empo2_jax.model import hf
  from empo2_jax.rl import update as update_lib
  from empo2_jax.train import checkpoint as ckpt_lib
  from empo2_jax.train import sft

  t0 = time.perf_counter() if t0 is None else t0
  rows = sft.chat_rows(trainer.tokenizer, chats, c.sft.max_len)
  if not rows:
    sys.exit(f"error: no SFT turn of {c.env.task} fits sft.max_len={c.sft.max_len}")
  n_turns = sum(len(r.spans) for r in rows)
  print(
    f"sft data episodes={len(rows)} turns={n_turns} "
    f"tokens={sum(len(r.tokens) for r in rows)} gold_s={time.perf_counter() - t0:.1f}",
    flush=True,
  )
  scfg = sft.SFTConfig(
    lr=c.sft.lr,
    weight_decay=c.sft.weight_decay,
    grad_clip=c.sft.grad_clip,
    micro_rows=c.sft.micro_rows,
  )
  if c.sft.batch_rows % c.sft.micro_rows:
    sys.exit(
      f"error: sft.batch_rows={c.sft.batch_rows} must be a multiple of "
      f"sft.micro_rows={c.sft.micro_rows}"
    )
  pad_id = trainer.tokenizer.pad_token_id
  # Whole-dataset loss in groups of batch_rows rows (padding rows are all-masked copies).
  eval_loss = sft.make_eval_loss(trainer.model_config, scfg)

  scored = rows[: c.sft.eval_rows] if c.sft.eval_rows else rows

  def dataset_loss(params):
    total = count = 0.0
    for i in range(0, len(scored), c.sft.batch_rows):
      group = scored[i : i + c.sft.batch_rows]
      batch = sft.pad_rows(group, pad_id, c.sft.pad_multiple, answer_index=c.sft.answer_logits)
      batch = fill_rows(batch, c.sft.batch_rows)
      n = float(batch["loss_mask"][:, 1:].sum())
      total += float(eval_loss(params, batch)) * n
      count += n
    return total / max(count, 1.0)

  # ---- state: fresh from the policy, or the newest SFT checkpoint ----------------------------
  optimizer = update_lib.make_optimizer(scfg)
  state = update_lib.init_train_state(jax.tree.map(jnp.copy, trainer.state.params), optimizer)
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "sft", "checkpoints"), keep=2)
  blob = ckpt_lib.memory_to_blob(trainer.memory.store)  # the (empty) memory: same layout
  found = ckpt.restore_latest(
    jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), {"train": state})
  )
  start, meta = 0, {}
  if found is not None:
    start, restored, _, meta = found
    state = restored["train"]
    print(f"resumed SFT at step {start}", flush=True)
  metrics = remote.LineLog(os.path.join(workdir, "sft_metrics.jsonl"))

  evals = dict(meta.get("evals", {}))
  if c.sft.eval_before and "before" not in evals:
    evals["before"] = trainer.evaluate(False)
  loss_first = meta.get("loss_first")
  if loss_first is None:
    loss_first = dataset_loss(state.params)

  step_fn = sft.make_sft_step(trainer.model_config, scfg, optimizer)
  order_rng = np.random.default_rng(c.seed)
  perms = [
    order_rng.permutation(len(rows))
    for _ in range(-(-c.sft.steps * c.sft.batch_rows // len(rows)) + 1)
  ]
  order = np.concatenate(perms)
  with metrics:
    for step in range(start, c.sft.steps):
      t1 = time.perf_counter()
      picked = [rows[j] for j in order[step * c.sft.batch_rows : (step + 1) * c.sft.batch_rows]]
      batch = sft.pad_rows(picked, pad_id, c.sft.pad_multiple, answer_index=c.sft.answer_logits)
      state, m = step_fn(state, batch)
      rec = {
        "step": step + 1,
        **{k: float(v) for k, v in jax.device_get(m).items()},
        "time": time.perf_counter() - t1,
      }
      if not np.isfinite(rec["loss"]):
        sys.exit(f"error: SFT step {step + 1}: non-finite loss; lower sft.lr")
      metrics.write(json.dumps(rec) + "\n")
      if (step + 1) % 10 == 0 or step == start:
        print(
          f"sft step={step + 1} loss={rec['loss']:.4f} grad_norm={rec['grad_norm']:.3f} "
          f"s={rec['time']:.1f}",
          flush=True,
        )
      every = c.sft.checkpoint_every
      if (every and (step + 1) % every == 0) or step + 1 == c.sft.steps:
        metrics.flush()  # a remote workdir: the lines up to this checkpoint
        ckpt.save(
          step + 1,
          {"train": state},
          blob,
          {
            "format": ckpt_lib.FORMAT_VERSION,
            "iteration": step + 1,
            "variation_cursor": 0,
            "loss_first": loss_first,
            "evals": evals,
            "config": json.loads(c.to_json()),
          },
          wait=True,
        )
  ckpt.close()
  loss_last = dataset_loss(state.params)
  print(f"sft loss_first={loss_first:.4f} loss_last={loss_last:.4f}", flush=True)

  trainer.state = trainer.state._replace(params=state.params)
  if c.sft.eval_after:
    evals["after"] = trainer.evaluate(False)
  if "before" in evals and "after" in evals:
    b, a = evals["before"], evals["after"]
    print(
      f"sft eval_return_before={b['eval/return_mean']:.2f} "
      f"eval_return_after={a['eval/return_mean']:.2f} "
      f"eval_success_before={b['eval/success']:.3f} "
      f"eval_success_after={a['eval/success']:.3f} episodes={a['eval/episodes']}",
      flush=True,
    )
  out_dir = os.path.join(workdir, "sft", "hf")
  hf.save_checkpoint(out_dir, trainer.model_config, jax.device_get(state.params))
  with remote.writable_dir(out_dir) as local:  # gs://: a temp dir, uploaded, then removed
    trainer.tokenizer.save_pretrained(local)
  summary = {
    "loss_first": loss_first,
    "loss_last": loss_last,
    "episodes": len(rows),
    "turns": n_turns,
    "evals": evals,
    "hf_dir": out_dir,
  }
  text = json.dumps(summary, indent=1)
  (epath.Path(workdir) / "sft_summary.json").write_text(text)
  print(f"sft done hf_dir={out_dir}", flush=True)
  return json.loads(text)


def fill_rows(batch, rows):
  """Pad a batch to `rows` rows with fully masked rows (for a fixed jitted shape)."""
  import numpy as np

  n = batch["tokens"].shape[0]
  if n == rows:
    return batch
  return {
    k: np.concatenate([v, np.zeros((rows - n,) + v.shape[1:], v.dtype)]) for k, v in batch.items()
  }


__all__ = ["run_sft"]
