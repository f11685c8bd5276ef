"""The vault bench's data (docs/vault_bench.md): the oracle tips and memories its arms start from,
the format-SFT chats of its start, and the exact scores of a policy on a list of vaults.

    tip = oracle_tip(seed, env_cfg)                       # the code, in the rule-tip format
    store = vault_memory(encoder, env, vaults, tip_of)    # one tip a vault, in its own slot
    chats = sft_chats(env, sft_vault_seeds(n, taken), rng, p_copy=0.75)
    scores = score_vaults(params, model_config, tokenizer, env, vaults, tips=None)

Everything here is deterministic given its arguments (the chats given the numpy Generator).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence


from empo2_jax.agent.memory import chat_key
from empo2_jax.envs import vault
from empo2_jax.memory.reflect import MemoryWrite, memory_text
from empo2_jax.memory.rule_tip import rule_tip
from empo2_jax.memory.store import MemoryStore
from empo2_jax.memory.sync import gather_and_commit
from empo2_jax.train import probe

TASK = vault.TASK
SFT_FIRST_SEED = 3_000_000  # the format SFT's vaults: seeds in no split (envs/puzzles.py)
# The kinds of tip block in the SFT's with-tip chats and their shares (sft_chats' `tip_kinds`):
# the oracle tip alone; the oracle tip among failed episodes' tips (what a memory of the agent's
# own rule tips shows); failed episodes' tips alone (nothing to copy: any code). "oracle" is what
# the bench's arms show; "mixed" also prepares a start for a memory of the agent's own tips.
TIP_KINDS = {
  "oracle": {"oracle": 1.0},
  "mixed": {"oracle": 0.6, "mixed": 0.25, "failed": 0.15},
}


def _text(code: Sequence[str]) -> str:
  return vault.code_text(code)


def tip_for(code: Sequence[str], success: bool) -> str:
  """The memory text of an episode that answered `code`, as the rule reflector writes it."""
  answer = _text(code)
  return memory_text(
    rule_tip([answer], [1.0 if success else 0.0], ""), answer, float(success), None
  )


def oracle_tip(seed: int, cfg: vault.VaultConfig) -> str:
  """The vault's code in the rule-tip format: its successful episode's memory text."""
  return tip_for(vault.vault_code(seed, cfg.code_length, cfg.buttons), True)


def first_message(env: vault.VaultEnv, seed: int, tips: Sequence[str] = ()) -> list[dict]:
  """The chat of a vault's episode up to its one answer (the actor's first user message)."""
  material = vault.materials(env, TASK, [seed], 0)[(TASK, seed)]
  obs = env.make_game(seed).grid()  # what reset shows, without resetting the env
  return [{"role": "user", "content": vault.first_user_message(material, obs, tips)}]


def vault_memory(encoder, env, vaults: Sequence[int], tip_of: Mapping[int, str]) -> MemoryStore:
  """A memory with one entry per vault v, tip_of[v], in v's slot, keyed by the vault's first
  message as the actor keys a step (agent/memory.chat_key)."""
  store = MemoryStore(dim=encoder.dim)
  writes = [
    MemoryWrite((TASK, int(v)), tip_of[v], 1.0, chat_key(first_message(env, v), encoder))
    for v in vaults
  ]
  gather_and_commit(store, encoder, writes, 0)
  if len(store) != len(vaults):
    raise RuntimeError(f"vault memory holds {len(store)} entries for {len(vaults)} vaults")
  return store


def shifted_tips(vaults: Sequence[int], cfg: vault.VaultConfig) -> dict:
  """{vault: another vault's oracle tip}: the negative control's memory. Each vault gets the tip
  of the vault k places on (the least k >= 1 for which no vault gets its own code)."""
  codes = [vault.vault_code(v, cfg.code_length, cfg.buttons) for v in vaults]
  n = len(vaults)
  for k in range(1, n):
    if all(codes[i] != codes[(i + k) % n] for i in range(n)):
      return {v: oracle_tip(vaults[(i + k) % n], cfg) for i, v in enumerate(vaults)}
  raise ValueError(f"no shift gives every one of {n} vaults another vault's code")


def sft_vault_seeds(n: int, taken_names: Sequence[str]) -> list[int]:
  """`n` SFT vault seeds from SFT_FIRST_SEED on, skipping any whose name is in taken_names (the
  bench's trained and unseen vaults: the SFT must teach nothing about them)."""
  taken, out, s = set(taken_names), [], SFT_FIRST_SEED
  while len(out) < n:
    if vault.vault_name(s) not in taken:
      out.append(s)
    s += 1
  return out


def sft_chats(
  env: vault.VaultEnv, seeds: Sequence[int], rng, p_copy: float, tip_kinds: str = "oracle"
) -> list[list[dict]]:
  """The format SFT's chats, two a vault: without tips, a uniformly random code; with a tip
  block drawn from TIP_KINDS[tip_kinds], the oracle tip's code with probability p_copy (else a
  random code), and for a block of failed tips only, a random code. Failed tips name random
  wrong codes."""
  cfg = env.config
  buttons, length = cfg.buttons, cfg.code_length
  if tip_kinds not in TIP_KINDS:
    raise ValueError(f"tip_kinds={tip_kinds!r}; valid: {', '.join(TIP_KINDS)}")
  kinds, shares = list(TIP_KINDS[tip_kinds]), list(TIP_KINDS[tip_kinds].values())

  def random_code():
    return [buttons[i] for i in rng.integers(len(buttons), size=length)]

  def wrong_codes(code, k):
    out = []
    while len(out) < k:
      c = random_code()
      if c != code and c not in out:
        out.append(c)
    return out

  chats = []
  for s in seeds:
    code = vault.vault_code(s, length, buttons)
    chats.append(first_message(env, s) + [{"role": "assistant", "content": _text(random_code())}])
    kind = kinds[rng.choice(len(kinds), p=shares)]
    failed = [tip_for(c, False) for c in wrong_codes(code, int(rng.integers(1, 4)))]
    tips = {"oracle": [tip_for(code, True)], "failed": failed}.get(kind)
    if tips is None:  # mixed: the oracle tip at a random place among the failed ones
      tips = list(failed)
      tips.insert(int(rng.integers(len(tips) + 1)), tip_for(code, True))
    copy = kind != "failed" and rng.random() < p_copy
    answer = code if copy else random_code()
    chats.append(first_message(env, s, tips) + [{"role": "assistant", "content": _text(answer)}])
  return chats


def score_vaults(
  params,
  model_config,
  tokenizer,
  env,
  vaults: Sequence[int],
  tips: Optional[Mapping[int, str]] = None,
  scorer=None,
) -> dict:
  """Each vault's code under `params`, exactly: {vault: {"logp": the summed log-prob of the code's
  tokens after the vault's first message (with tips[v] shown when `tips` is given, else
  tip-free), "greedy": whether every code token is the argmax (greedy decoding answers the code;
  what follows it cannot change the env's reading: three buttons are pressed)}}."""
  records = []
  for i, v in enumerate(vaults):
    code = vault.vault_code(v, env.config.code_length, env.config.buttons)
    ids = tokenizer(_text(code), add_special_tokens=False)["input_ids"]
    shown = [tips[v]] if tips is not None else []
    records.append(
      {
        "id": i,
        "episode_id": i,
        "step": 0,
        "variation": int(v),
        "set": "success",
        "messages": first_message(env, v, shown),
        "response_ids": list(ids),
      }
    )
  out = probe.score(
    params, model_config, tokenizer, records, rows=len(records), scorer=scorer,
    with_tips=tips is not None,
  )  # fmt: skip
  if out["dropped_long"]:
    raise RuntimeError(f"{out['dropped_long']} vault prompts did not fit the scorer")
  return {
    int(v): {
      "logp": out["samples"][i]["logp_sum"],
      "greedy": out["samples"][i]["top1_sum"] == out["samples"][i]["tokens"],
    }
    for i, v in enumerate(vaults)
  }


__all__ = [
  "SFT_FIRST_SEED",
  "TIP_KINDS",
  "tip_for",
  "oracle_tip",
  "first_message",
  "vault_memory",
  "shifted_tips",
  "sft_vault_seeds",
  "sft_chats",
  "score_vaults",
]
