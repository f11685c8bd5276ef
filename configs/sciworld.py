"""EMPO2 on ScienceWorld.

  configs/sciworld.py                 the paper's setup (Qwen2.5-7B-Instruct; needs
                                      --config.model.checkpoint=DIR, local or gs://)
  configs/sciworld.py:cpu             the embedded CPU default: a small random-init Qwen2-architecture
                                      model, bundled tokenizer and MiniLM, one task, small batch
  configs/sciworld.py:task=find-animal[,cpu]   pick the task (and optionally the CPU variant)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import base  # noqa: E402  pylint: disable=wrong-import-position


def _parse(arg):
  out = {}
  for part in (arg or "").split(","):
    part = part.strip()
    if not part:
      continue
    k, eq, v = part.partition("=")
    if k == "task" and not v:
      raise ValueError("sciworld config argument 'task' needs a value, e.g. task=find-animal")
    out[k] = v if eq else True
  unknown = set(out) - {"cpu", "task", "7b", "tiny"}
  if unknown:
    raise ValueError(f"unknown sciworld config arguments {sorted(unknown)}; "
                     "valid: cpu, tiny, 7b, task=<name>")
  return out


def get_config(arg=None):
  args = _parse(arg)
  c = base.get_config()
  if "task" in args:
    c.env.task = args["task"]
  if args.get("cpu") or args.get("tiny"):
    # Small Qwen2-architecture model (real vocabulary), random init from the seed.
    c.model.preset = "tiny"
    c.model.random_init = True
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat = "none"
    c.mesh = dict(data=1, fsdp=-1, tensor=1)
    c.env.task = args.get("task", "find-animal")
    c.env.num_train_rows = 2
    c.env.num_test_rows = 2
    c.env.max_steps = 4
    c.env.workers = 2
    c.rollout.rows_per_iter = 2
    c.rollout.group_size = 2
    c.rollout.max_new_tokens = 12
    c.rollout.max_context = 6144
    c.rollout.cache_dtype = "float32"
    c.empo2.tip_max_new_tokens = 24
    # All three modes show up within a few iterations of the demo.
    c.empo2.p_memory = 0.5
    c.empo2.q_offpolicy = 0.5
    # A random-init model spreads its probability over the whole vocabulary (log-prob ~ -12 per
    # token), so the paper's delta = -5 would mask every sample; the demo masks only outliers.
    c.loss.low_prob_delta = -25.0
    # A random policy scores the same in every episode (its text maps to 'look around'), so the
    # only learning signal in the demo is the intrinsic reward. With a strict threshold the number
    # of retrieved tips differs between steps, so memory iterations get non-zero advantages.
    c.memory.threshold = 0.95
    c.optim.lr = 1e-3
    # 2 rows x 2 rollouts x <= 4 turns = 16 samples: 4 shuffled mini-batches, as the paper's
    # 128 episodes give ~15-30 of 128 samples.
    c.optim.minibatch_size = 4
    c.optim.micro_rows = 4
    c.optim.max_prompt_len = c.rollout.max_context - c.rollout.max_new_tokens
    c.train.iterations = 4      # seed 0 draws on_tips, on, off, on
    c.train.eval_every = 2
    c.train.eval_repeats = 1
    c.train.checkpoint_every = 2
  if args.get("tiny"):   # test-sized: fewer steps still
    c.env.max_steps = 2
    c.env.num_test_rows = 1
    c.train.iterations = 2
    c.train.eval_every = 0
    c.train.eval_at_end = False
  c.lock()
  return c
