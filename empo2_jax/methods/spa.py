"""SPA (Chen et al. 2025, `shiqichen17/SPA@3848e68`; docs/methods.md §7): self-play world-model SFT,
then RL from that checkpoint, with Pass@1 and Pass@k reported during RL.

Stage A (launch/spa.py) rolls out the CURRENT policy with the world-model answer format requested
(`WM_INSTRUCTION`, SPA's `add_worldmodel` mode), sampling at temperature 1. Stage B converts every
episode into an SFT chat (`episode_chat`): each assistant turn becomes

    <think><observation>
    {the true state before the turn}
    </observation>{the model's own thoughts, when its answer parsed}<prediction>
    {the true state after the turn}
    </prediction></think><answer>{the action the environment executed}</answer>

as SPA's `convert_to_sft_format_add_worldmodel` replaces the <observation> / <prediction> contents
with the environment's states (`all_states[i]`, `all_states[i + 1]`). The states are the env's bare
state renderings (`ResetInfo.state` / `StepInfo.state`: the puzzle grids) or, for environments
without one (ScienceWorld), the observation text. Choices that are proposals (docs/methods.md §7.3):

  * the ground-truth state text is KEPT in the targets and trained on (the released
    SFTDataset masks it to <obs_content>/<pred_content>, which matches the paper's "mask the
    state" ablation, not the main method);
  * every trajectory is kept, whether it succeeded or not (SPA's success filter is commented out),
    up to its first turn that named no action (`valid_prefix`; the published data drops
    format-violating trajectories, which with a 135M model would drop nearly all of them); a
    turn whose answer did not parse keeps no thoughts, and its answer is the executed action;
  * a whole episode is one packed SFT row (train/sft.py): each turn is scored under the same
    history SPA's per-turn examples (prompt = messages[:i]) give it;
  * a seeded 80/20 train/validation split by episode (SPA: a random 80/20 split).

Stage C is the method's RL (GRPO here; SPA's PPO with a critic is not part of this trainer), from
the SFT checkpoint, with the base prompt (the world-model format is not requested) and the action
taken from the <answer> span (`action_text`). SPA's es_manager metric (within each group of
same-task rollouts, pass@k = any success; reported: the mean over groups) is
`train/metrics.pass_at_k`, which every evaluation reports.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import numpy as np

from empo2_jax.methods.base import GRPO_OVERRIDES, Plugin, register

# The `spa` config section's defaults (the base config's).
# [proposed]: a proposal of docs/methods.md, not a value found in the authors' code.
SECTION = dict(
  enabled=False,
  # [proposed] stage A: iterations of rollout.variations_per_iter x group_size episodes of the
  # current policy in the world-model format (SPA: 5 batches of 256 episodes)
  collect_iterations=2,
  collect_temperature=1.0,  # SPA samples at temperature 1
  # [proposed] extra response tokens for <observation>/<prediction> (collection and RL, where
  # the SFT'd model keeps writing them), ADDED to rollout.max_new_tokens
  extra_new_tokens=96,
  val_share=0.2,  # SPA's 80/20 split
  sft_epochs=5,  # SPA's SFT epochs over the collected rows (0: config.sft.steps steps)
)

WM_INSTRUCTION = (
  "Always answer in this format: <think><observation> the current state </observation> your "
  "thoughts <prediction> the state after your action </prediction></think><answer> your action "
  "</answer>, with no extra text."
)
_WM = re.compile(
  r"<think>\s*<observation>(.*?)</observation>(.*?)<prediction>(.*?)</prediction>\s*</think>"
  r"\s*<answer>(.*?)</answer>",
  re.DOTALL,
)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)


def parse_wm(text: str) -> Optional[dict]:
  """SPA's regex: {observation, thoughts, prediction, answer} of a well-formed answer, else None."""
  m = _WM.search(text)
  if not m:
    return None
  obs, thoughts, pred, answer = (g.strip() for g in m.groups())
  return {"observation": obs, "thoughts": thoughts, "prediction": pred, "answer": answer}


def action_text(text: str) -> str:
  """The action part of an answer: the <answer> span's text when there is one (also unclosed),
  else the text without world-model spans."""
  m = _ANSWER.search(text)
  if m:
    return m.group(1).strip()
  text = re.sub(
    r"<observation>.*?</observation>|<prediction>.*?</prediction>", "", text, flags=re.DOTALL
  )
  return re.sub(r"</?think>", "", text).strip()


def target(state: str, next_state: str, action: str, thoughts: str = "") -> str:
  """One assistant turn of the SFT data, with the TRUE current and next states."""
  thoughts = f" {thoughts.strip()} " if thoughts.strip() else ""
  return (
    f"<think><observation>\n{state.strip()}\n</observation>{thoughts}<prediction>\n"
    f"{next_state.strip()}\n</prediction></think><answer>{action.strip()}</answer>"
  )


def episode_chat(
  messages: Sequence[dict], states: Sequence[str], actions: Sequence[str]
) -> list[dict]:
  """An episode's chat with every assistant turn replaced by its SFT target.

  messages: the chat as sampled (user, assistant, user, assistant, ...); states: the true state
  before each turn and after the last one (len = turns + 1); actions: what the env executed per
  turn. Raises ValueError when the counts do not match."""
  turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
  if len(states) != len(turns) + 1 or len(actions) != len(turns):
    raise ValueError(
      f"{len(turns)} assistant turns need {len(turns) + 1} states and {len(turns)} actions; "
      f"got {len(states)} and {len(actions)}"
    )
  out = [dict(m) for m in messages]
  for t, i in enumerate(turns):
    parsed = parse_wm(messages[i]["content"])
    thoughts = parsed["thoughts"] if parsed else ""
    out[i] = {
      "role": "assistant",
      "content": target(states[t], states[t + 1], actions[t], thoughts),
    }
  return out


def valid_prefix(messages: Sequence[dict], states: Sequence[str], actions: Sequence[str]):
  """(messages, states, actions) cut before the first turn whose executed action is empty (the
  answer named no action: a format violation, whose target would teach an empty answer; SPA's
  published data drops such trajectories, this keeps the turns before it). Nothing left: None."""
  n = next((t for t, a in enumerate(actions) if not a.strip()), len(actions))
  if n == 0:
    return None
  turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
  return list(messages[: turns[n - 1] + 1]), list(states[: n + 1]), list(actions[:n])


def split(n: int, val_share: float, seed: int) -> tuple[list[int], list[int]]:
  """(train indices, validation indices): a seeded permutation cut at round(n * (1 - share));
  with n >= 2 and share > 0 both parts are non-empty."""
  perm = np.random.default_rng(seed).permutation(n).tolist()
  n_val = int(round(n * val_share))
  if n >= 2 and val_share > 0:
    n_val = min(max(n_val, 1), n - 1)
  return sorted(perm[n_val:]), sorted(perm[:n_val])


# -- the plugin: what SPA adds to the trainer --
class SPA(Plugin):
  """The env reads the <answer> span; the world-model text lengthens the response. Stages A and
  B (collection and SFT) are train/spa_run.py (launch/spa.py)."""

  name, section = "spa", SECTION
  sampler_logprobs = False
  exclusive = True
  episode_records = ("states",)  # the world-model targets (train/spa_run.to_chats)

  @classmethod
  def check(cls, c) -> None:
    s = c.spa
    if s.collect_iterations < 1 or not 0.0 <= s.val_share < 1.0 or s.sft_epochs < 0:
      raise ValueError(
        f"spa: need collect_iterations >= 1, 0 <= val_share < 1 and sft_epochs >= 0; got "
        f"{s.collect_iterations}, {s.val_share}, {s.sft_epochs}"
      )

  @classmethod
  def extra_response_tokens(cls, c) -> int:
    return int(c.spa.extra_new_tokens)

  def env_text(self, response: str) -> str:
    return action_text(response)


register(
  "spa",
  "SPA: self-play world-model SFT (the true states in <observation>/<prediction>), then GRPO "
  "from it, Pass@k during RL (methods/spa.py, launch/spa.py)",
  overrides={**GRPO_OVERRIDES, "spa.enabled": True},
  commands=("{python} launch/spa.py --config={config} --config.method={name} --workdir={workdir}",),
  label="SPA",
  plugin=SPA,
)


__all__ = [
  "SPA",
  "SECTION",
  "WM_INSTRUCTION",
  "parse_wm",
  "action_text",
  "target",
  "episode_chat",
  "valid_prefix",
  "split",
]
