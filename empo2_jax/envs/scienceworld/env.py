"""ScienceWorld (1.2.3, PyPI) as a `TextEnv`, set up as in docs/method.md §7.

Speed: the library's `ScienceWorldEnv.step` asks the JVM for every valid action, the look-around and
the inventory after each step. `SciWorldEnv.step` talks to the same Java object (`PythonInterface`)
but only sends the action and reads score, completion and move count — the state changes and the
numbers are the library's. Where it needs the valid actions (`valid_actions`), it reads the Java
list in a few round trips instead of one per action (scienceworld/jvm.py: ScienceWorldJvm.strings).
Each call asks the JVM anew and none is moved or saved: the simulator picks some object names
(the unique referents of `getValidActionObjectCombinations`) with the JVM-wide
`scala.util.Random`, which every simulator in the JVM shares and every load reseeds, so two calls
in a row can list different names and the order of the calls shapes what later calls see.

Action handling (`SciWorldConfig.action_correction`, docs/method.md §2):
  "always"    (default; the authors' code) every text is mapped to the closest valid action
              before it is sent; the valid actions are fetched every step (~0.05 s of JVM time).
  "on_reject" (ours) the text goes to the simulator as written; only when the parser rejects it
              are the valid actions fetched and the text mapped to the closest one
              (`actions.correct_action`, word-level Jaccard).
In both, an "Ambiguous request" (the simulator lists the objects the command could mean and waits
for a number; no move is spent) is answered with option 0 in the same step, as the release does:
the agent never sees the list and no turn is lost. `executed_action` is then option 0's text.

One JVM can host many episodes: every `SciWorldEnv` owns a `PythonInterface` of its own, and several
envs may share one `ScienceWorldJvm` (the process pool does this). The simulator orders a room's
objects by Java identity hash codes, so without care the same variation reads differently in
processes with different histories; DEFAULT_JAVA_OPTIONS (envs/base.py) pins the hash
(-XX:hashCode=2) so that observations do not depend on what the JVM ran before (needed for exact
resume).
"""

from __future__ import annotations

import dataclasses
import numbers

from empo2_jax.envs import actions
from empo2_jax.envs.base import (
  DEFAULT_JAVA_OPTIONS,
  ResetInfo,
  ResetResult,
  Split,
  StepInfo,
  StepResult,
  check_split,
  check_task,
)
from empo2_jax.envs.scienceworld.jvm import ScienceWorldJvm

# The 30 tasks of ScienceWorld 1.2.3 (the simulator's own order).
ALL_TASKS: tuple[str, ...] = (
  "boil",
  "change-the-state-of-matter-of",
  "chemistry-mix",
  "chemistry-mix-paint-secondary-color",
  "chemistry-mix-paint-tertiary-color",
  "find-animal",
  "find-living-thing",
  "find-non-living-thing",
  "find-plant",
  "freeze",
  "grow-fruit",
  "grow-plant",
  "identify-life-stages-1",
  "identify-life-stages-2",
  "inclined-plane-determine-angle",
  "inclined-plane-friction-named-surfaces",
  "inclined-plane-friction-unnamed-surfaces",
  "lifespan-longest-lived",
  "lifespan-longest-lived-then-shortest-lived",
  "lifespan-shortest-lived",
  "measure-melting-point-known-substance",
  "measure-melting-point-unknown-substance",
  "melt",
  "mendelian-genetics-known-plant",
  "mendelian-genetics-unknown-plant",
  "power-component",
  "power-component-renewable-vs-nonrenewable-energy",
  "test-conductivity",
  "test-conductivity-of-unknown-substances",
  "use-thermometer",
)

# The 18 tasks the EMPO2 paper reports (docs/method.md §7).
PAPER_TASKS: tuple[str, ...] = (
  "chemistry-mix",
  "chemistry-mix-paint-secondary-color",
  "chemistry-mix-paint-tertiary-color",
  "find-animal",
  "find-living-thing",
  "find-non-living-thing",
  "find-plant",
  "identify-life-stages-1",
  "identify-life-stages-2",
  "lifespan-longest-lived",
  "lifespan-longest-lived-then-shortest-lived",
  "lifespan-shortest-lived",
  "power-component",
  "power-component-renewable-vs-nonrenewable-energy",
  "test-conductivity",
  "test-conductivity-of-unknown-substances",
  "measure-melting-point-known-substance",
  "use-thermometer",
)

FAILURE_SCORE = -100  # what the simulator reports when the task is failed (e.g. wrong focus)


@dataclasses.dataclass(frozen=True)
class SciWorldConfig:
  """Every number of the ScienceWorld setup; defaults are the paper's (docs/method.md §7)."""

  simplification: str = "easy"
  env_step_limit: int = 100  # simulator moves before it ends the episode
  default_max_steps: int = 30  # agent steps per episode, unless overridden below
  max_steps_overrides: tuple[tuple[str, int], ...] = (
    ("chemistry-mix", 60),
    ("measure-melting-point-known-substance", 120),
    ("boil", 100),
    ("grow-fruit", 60),
  )
  num_train_variations: int = 5  # the first train variations a run trains on
  num_dev_variations: int = 20
  num_test_variations: int = 20  # first test variations used for evaluation
  success_score: int = 70  # success = done and score > success_score
  fallback_action: str = actions.DEFAULT_FALLBACK_ACTION
  action_correction: str = "always"  # or "on_reject" (ours): see the module docstring
  java_tool_options: str = DEFAULT_JAVA_OPTIONS

  def __post_init__(self):
    if self.action_correction not in actions.CORRECTION_MODES:
      raise ValueError(
        f"action_correction={self.action_correction!r}; valid: "
        f"{', '.join(actions.CORRECTION_MODES)}"
      )
    for task, _ in self.max_steps_overrides:
      check_task(task, ALL_TASKS)

  def max_steps(self, task: str) -> int:
    check_task(task, ALL_TASKS)
    return dict(self.max_steps_overrides).get(task, self.default_max_steps)

  def num_variations(self, split: Split) -> int:
    check_split(split)
    return {
      "train": self.num_train_variations,
      "dev": self.num_dev_variations,
      "test": self.num_test_variations,
    }[split]


class SciWorldEnv:
  """ScienceWorld episodes with the paper's setup. Not thread-safe; one episode at a time.

  `jvm=None` starts a JVM owned (and closed) by this env; pass a `ScienceWorldJvm` to share one.
  """

  def __init__(self, config: SciWorldConfig | None = None, jvm: ScienceWorldJvm | None = None):
    self.config = config or SciWorldConfig()
    self._owns_jvm = jvm is None
    self._jvm = jvm if jvm is not None else ScienceWorldJvm(self.config.java_tool_options)
    self._server = self._jvm.new_server()
    self._scratch = None  # second simulator for split lists and gold paths (keeps episode intact)
    self._split_cache: dict[tuple[str, str], list[int]] = {}
    self._task: str | None = None
    self._variation = -1
    self._last_score = 0
    self._steps = 0
    self._done = False

  # ----------------------------------------------------------------- tasks and splits
  @property
  def tasks(self) -> tuple[str, ...]:
    return ALL_TASKS

  def max_variations(self, task: str) -> int:
    check_task(task, ALL_TASKS)
    return int(self._server.getTaskMaxVariations(task))

  def variations(self, task: str, split: Split) -> list[int]:
    """All variations of `task` in `split` (train/dev/test, the simulator's fixed split)."""
    check_task(task, ALL_TASKS)
    check_split(split)
    key = (task, split)
    if key not in self._split_cache:
      scratch = self._scratch_server()
      scratch.load(task, 0, self.config.simplification, False)
      self._split_cache[(task, "train")] = [int(v) for v in scratch.getVariationsTrain()]
      self._split_cache[(task, "dev")] = [int(v) for v in scratch.getVariationsDev()]
      self._split_cache[(task, "test")] = [int(v) for v in scratch.getVariationsTest()]
    return list(self._split_cache[key])

  def used_variations(self, task: str, split: Split) -> list[int]:
    """The variations used for `split`: the first `config.num_variations(split)` of it
    (docs/method.md §7)."""
    return self.variations(task, split)[: self.config.num_variations(split)]

  def gold_actions(self, task: str, variation: int) -> list[str]:
    """The library's gold action sequence for (task, variation); leaves the episode untouched."""
    self._check_variation(task, variation)
    scratch = self._scratch_server()
    scratch.load(task, int(variation), self.config.simplification, True)
    return [str(a) for a in scratch.getGoldActionSequence()]

  # ----------------------------------------------------------------- episode
  def reset(self, task: str, variation: int) -> ResetResult:
    self._check_variation(task, variation)
    variation = int(variation)
    server = self._server
    # The library's load + reset builds the world twice: reset() is load() again with the same
    # arguments, and each load reseeds the JVM's generator and rebuilds the world from nothing;
    # one load gives the same world (tests/envs/test_correction.py) in half the time.
    server.load(task, variation, self.config.simplification, False)
    observation = str(server.step("look around"))  # the library's reset does the same
    self._task, self._variation = task, variation
    # Rewards are measured from 0, not from the score after the opening look-around, so the
    # return equals the final score (docs/method.md §7); only the first step's reward can differ
    # from the library's (which starts from the post-reset score).
    self._last_score = 0
    self._steps = 0
    self._done = False
    info = ResetInfo(
      task=task,
      variation=variation,
      task_description=str(server.getTaskDescription()),
      inventory=self.inventory(),
      max_steps=self.config.max_steps(task),
    )
    return ResetResult(observation, info)

  def step(self, action_text: str) -> StepResult:
    if self._task is None:
      raise RuntimeError("SciWorldEnv.step called before reset(task, variation).")
    if self._done:
      raise RuntimeError(
        f"The episode ({self._task}, variation {self._variation}) is over; "
        "call reset before stepping again."
      )
    text = actions.normalize_action(action_text)
    if self.config.action_correction == "always":
      valid_now = self.valid_actions()
      executed = actions.correct_action(text, valid_now, fallback=self.config.fallback_action)
      valid = text in valid_now
      observation, executed = self._send(executed)
    else:
      observation, executed = self._send(text)
      valid = observation != actions.PARSER_REJECTION
      if not valid:
        executed = actions.correct_action(
          text, self.valid_actions(), fallback=self.config.fallback_action
        )
        observation, executed = self._send(executed)
    return self._finish_step(observation, action_text, executed, valid)

  def _send(self, command: str) -> tuple[str, str]:
    """(observation, what was executed) for one command; an ambiguity prompt is answered with
    option 0 at once, so the observation is that option's outcome and `command` its text."""
    observation = str(self._server.step(command))
    options = actions.parse_ambiguity_options(observation)
    if options and actions.AMBIGUITY_ANSWER in options:
      command = options[actions.AMBIGUITY_ANSWER]
      observation = str(self._server.step(actions.AMBIGUITY_ANSWER))
    return observation, command

  def _finish_step(self, observation: str, raw: str, executed: str, valid: bool) -> StepResult:
    server = self._server
    score = self._score()
    moves = int(server.getNumMoves())
    reward = score - self._last_score
    self._last_score = score
    self._steps += 1
    # The library's end conditions: completed, past the move limit, or failed (negative score).
    sim_done = bool(server.getCompleted()) or moves > self.config.env_step_limit or score < 0
    truncated = not sim_done and self._steps >= self.config.max_steps(self._task)
    done = sim_done or truncated
    self._done = done
    info = StepInfo(
      score=score,
      valid=valid,
      raw_action=raw,
      executed_action=executed,
      moves=moves,
      steps=self._steps,
      truncated=truncated,
      success=done and score > self.config.success_score,
      # the subgoals reached and not (HeRL's hindsight); one call at the episode's end
      goals=self.goal_progress() if done else "",
    )
    return StepResult(observation, float(reward), done, info)

  def goal_progress(self) -> str:
    """The simulator's subgoal table now (`getGoalProgressStr`, the library's
    `get_goal_progress()`): sequential, then unordered/optional subgoals, each with true/false.
    A step that ends the episode carries it as StepInfo.goals, so it reaches the actor through the
    pool's workers (HeRL's hindsight, methods/herl.py; the rule reflector, memory/rule_tip.py)."""
    return str(self._server.getGoalProgressStr())

  def _score(self) -> int:
    return int(round(100 * self._server.getScore()))  # simulator reports 0..1 (or -1)

  # ----------------------------------------------------------------- prompt material
  def valid_actions(self) -> list[str]:
    """Every valid action in the current state, sorted: the library's
    `get_valid_action_object_combinations()` (~0.05 s of JVM time; a fresh call each time, see
    the module docstring)."""
    java_list = self._server.getValidActionObjectCombinations()
    return sorted(self._jvm.strings(java_list))

  def action_templates(self) -> list[str]:
    """Action templates such as 'open OBJ' and 'move OBJ to OBJ'."""
    return [str(a) for a in self._server.getPossibleActions()]

  def focus_items(self) -> list[str]:
    """Objects the agent may currently `focus on` (focusing on a wrong one fails the task)."""
    prefix = "focus on "
    return sorted(a[len(prefix) :] for a in self.valid_actions() if a.startswith(prefix))

  def inventory(self) -> str:
    return str(self._server.freeActionInventory())

  def close(self) -> None:
    if self._owns_jvm:
      self._jvm.close()

  def __enter__(self) -> "SciWorldEnv":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # ----------------------------------------------------------------- helpers
  def _scratch_server(self):
    if self._scratch is None:
      self._scratch = self._jvm.new_server()
    return self._scratch

  def _check_variation(self, task: str, variation: int) -> None:
    n = self.max_variations(task)
    if not isinstance(variation, numbers.Integral) or not 0 <= variation < n:
      raise ValueError(f"Variation {variation!r} is out of range for task {task!r} (0..{n - 1}).")
