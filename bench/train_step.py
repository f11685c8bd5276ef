"""Training-step throughput: our jitted EMPO2 update vs a torch forward+backward+AdamW step.

  python bench/train_step.py [--layers 2] [--batch 4] [--prompt 224] [--response 32] [--iters 2]

Model: Qwen2.5-0.5B shapes cut to --layers layers (real 151,936 vocabulary), fp32, random init,
written once as a Hugging Face checkpoint so both sides hold identical weights. Batch: `--batch`
rows of prompt + response tokens; the loss covers the response tokens.

Ours: one `rl/update` call = old log-probs (no-grad forward) + forward/backward + clipped AdamW
(one mini-batch, one micro-batch). Torch: transformers' Qwen2ForCausalLM forward (full logits),
log-softmax of the response positions, the same on-policy surrogate, backward, clip, AdamW step.
Last line: `train_step tokens_per_s ours=<a> torch=<b> ratio=<a/b>` (tokens = batch x length).
"""

import dataclasses
import tempfile

import numpy as np

from _common import parser, platform, result, seconds_per_call


def make_batch(rows, prompt, response, vocab):
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, vocab, (rows, prompt + response)).astype(np.int32)
  attn = np.ones_like(tokens)
  return {
    "cur_tokens": tokens,
    "cur_attn": attn,
    "old_tokens": tokens,
    "old_attn": attn,
    "response_mask": np.ones((rows, response), np.float32),
    "sampler_logp": np.full((rows, response), -12.0, np.float32),
    "advantages": rng.normal(0, 1, rows).astype(np.float32),
    "sample_index": np.arange(rows, dtype=np.int32),
  }


def time_ours(path, batch, iters):
  import jax
  import jax.numpy as jnp

  from empo2_jax.model import hf
  from empo2_jax.defaults import get_config
  from empo2_jax.rl.update import init_train_state, make_optimizer, make_update_fn
  from empo2_jax.train import settings

  config, params = hf.load_checkpoint(path)
  rows = batch["advantages"].shape[0]
  cfg = settings.update_config(get_config())  # the base config's, with the measurement's own
  cfg = dataclasses.replace(
    cfg, lr=1e-6, micro_rows=rows, loss=dataclasses.replace(cfg.loss, low_prob_mask=False)
  )  # random model: every token is rare
  opt = make_optimizer(cfg)
  state = init_train_state(jax.device_put(params), opt)
  batch = jax.tree.map(jnp.asarray, batch)
  update = make_update_fn(config, cfg, opt)

  def step():
    nonlocal state
    state, met = update(state, batch)
    jax.block_until_ready(state)
    return met

  secs, met = seconds_per_call(step, iters)  # the warm-up call compiles
  return secs, float(met["loss"])


def time_torch(path, batch, iters):
  import torch
  from transformers import Qwen2ForCausalLM

  model = Qwen2ForCausalLM.from_pretrained(path, torch_dtype=torch.float32).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
  tokens = torch.tensor(batch["cur_tokens"], dtype=torch.long)
  attn = torch.tensor(batch["cur_attn"], dtype=torch.long)
  adv = torch.tensor(batch["advantages"])[:, None]
  mask = torch.tensor(batch["response_mask"])
  resp = mask.shape[1]
  length = tokens.shape[1]

  def step():
    logits = model(input_ids=tokens, attention_mask=attn).logits  # [B, L, V]
    logp = torch.log_softmax(logits[:, length - resp - 1 : length - 1].float(), -1)
    logp = logp.gather(-1, tokens[:, length - resp :, None])[..., 0]
    ratio = torch.exp(logp - logp.detach())  # on-policy PPO ratio: value 1, gradient of logp
    loss = -(adv * ratio * mask).sum() / mask.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())

  return seconds_per_call(step, iters)


def main():
  ap = parser(__doc__)
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--prompt", type=int, default=224)
  ap.add_argument("--response", type=int, default=32)
  ap.add_argument("--iters", type=int, default=2)
  args = ap.parse_args()

  import jax
  import torch

  from empo2_jax.model import configs, hf, llama

  config = configs.get_preset("0.5b", num_layers=args.layers)
  path = tempfile.mkdtemp(prefix="bench_train_")
  hf.save_checkpoint(path, config, llama.init_params(config, jax.random.PRNGKey(0)))
  batch = make_batch(args.batch, args.prompt, args.response, 151643)
  n_tok = batch["cur_tokens"].size

  ours_s, ours_loss = time_ours(path, batch, args.iters)
  torch_s, torch_loss = time_torch(path, batch, args.iters)
  print(
    f"model=0.5b-shape layers={args.layers} batch={args.batch} length="
    f"{args.prompt + args.response} (response {args.response}) fp32 "
    f"device={platform()} torch_threads={torch.get_num_threads()}"
  )
  print(
    f"step_s ours={ours_s:.3f} torch={torch_s:.3f}  last loss ours={ours_loss:.4f} "
    f"torch={torch_loss:.4f}"
  )
  result(
    "train_step tokens_per_s",
    ours=n_tok / ours_s,
    torch=n_tok / torch_s,
    ratio=(torch_s / ours_s, ".3f"),
    fmt=".1f",
  )


if __name__ == "__main__":
  main()
