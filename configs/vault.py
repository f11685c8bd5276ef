"""The vault bench (docs/vault_bench.md): one-turn vaults whose code only a memory tip gives.

configs/vault.py              a model of your own: --config.model.checkpoint=DIR (its format
                              start: launch/vault_bench.py builds it)
configs/vault.py:small        the first 3 of SmolLM2-135M-Instruct's 30 layers, its embedding and
                              tokenizer (the bench's start trains it; fast on a CPU)
configs/vault.py:scratch      SmolLM2's tokenizer and architecture at hidden 128 and 4 layers
                              (preset smollm2-small), random init: trained from scratch
configs/vault.py:cpu          the embedded SmolLM2-135M-Instruct
configs/vault.py:tiny         a random-init tiny model (tests: mechanics only)

Every variant: 8 trained vaults x 4 rollouts an iteration, 16 unseen vaults (the dev split) for
the measures, one turn of at most 16 tokens, the rule reflector, the intrinsic reward off (one
memory entry a vault makes it a constant), packed rows of one turn each.
"""

from empo2_jax import defaults

ARGS = ("cpu", "small", "scratch", "tiny")


def get_config(arg=None):
  args = defaults.parse_args("vault", arg, ARGS)
  c = defaults.get_config()
  c.unlock()  # the puzzle fields below are new keys of config.env
  c.env.name = "vault"
  c.env.task = "vault"
  c.env.max_steps = 1
  c.env.max_actions_per_turn = 3
  c.env.max_actions = 3
  c.env.code_length = 3
  c.env.partial_score = False
  c.env.distinct_codes = False  # True: each split's vaults have pairwise distinct codes
  c.env.num_train_variations = 8
  c.env.num_test_variations = 16
  c.env.few_shot = 0
  c.env.workers = 2
  defaults.small_cpu(c, max_new_tokens=16, max_context=512, iterations=10, eval_every=0)
  c.rollout.variations_per_iter = 8
  c.rollout.group_size = 4
  c.empo2.reflector = "rule"
  c.empo2.intrinsic_reward = False
  c.optim.minibatch_size = 8  # 4 optimizer steps an iteration
  c.optim.micro_rows = 8
  c.train.eval_at_end = False
  c.train.checkpoint_every = 0
  # The bench's format SFT (launch/vault_bench.py; train/vault_data.sft_chats): its gate is
  # measured by the bench, so no evaluation before or after.
  c.sft.max_len = 512
  c.sft.eval_before = False
  c.sft.eval_after = False
  c.sft.checkpoint_every = 500
  c.sft.answer_logits = True  # answers are ~9 tokens of ~120: project only those
  c.sft.eval_rows = 256  # loss_first / loss_last on 256 chats, not all of them
  c.sft.pad_multiple = 32  # chats of 100-250 tokens
  if args.get("small"):
    # SmolLM2-135M-Instruct's embedding, tokenizer and first 3 of its 30 layers (~10M of its
    # ~107M parameters outside the embedding): a shallow model the bench's format SFT trains in
    # minutes, which keeps the pretrained early layers that copy text from the context
    defaults.embedded_model(c)
    c.model.keep_layers = 3
    c.loss.low_prob_delta = -5.0  # the paper's mask (embedded_model sets -10 for ScienceWorld)
    c.optim.lr = 3e-4
    _sft(c, steps=1100, rows=8, micro=8, lr=3e-4)
  if args.get("scratch"):
    c.model.preset = "smollm2-small"
    c.model.random_init = True
    c.model.tokenizer = "embedded:smollm2-135m-instruct"
    c.optim.lr = 1e-3
    _sft(c, steps=600, rows=32, micro=32, lr=2e-3)
  if args.get("cpu"):
    # the whole SmolLM2-135M-Instruct; rows of one ~100-token turn fit micro-batches of 8
    defaults.embedded_model(c)
    c.model.remat = "none"  # one short turn a row: the activations are small
    c.loss.low_prob_delta = -5.0  # the paper's mask, as for :small
    c.optim.lr = 3e-5
    c.optim.micro_rows = 8
    _sft(c, steps=150, rows=8, micro=8, lr=1e-4)
  if args.get("tiny"):
    defaults.tiny_model(c)
    c.env.max_steps = 1
    c.env.num_test_variations = 16  # tiny_model's 1 test variation: the bench scores 16
  c.lock()
  return c


def _sft(c, *, steps: int, rows: int, micro: int, lr: float) -> None:
  """The start's SFT: `steps` steps of `rows` chats in micro-batches of `micro` at `lr`."""
  c.sft.steps, c.sft.batch_rows, c.sft.micro_rows, c.sft.lr = steps, rows, micro, lr
