"""EMPO2 (or any method) on WebShop (empo2_jax/envs/webshop/).

configs/webshop.py                 the paper-scale setup (Table 2): verl-agent's WebShop settings
                                   (synthetic goals, 15 steps, 16 goals x 8 rollouts, 128 test
                                   goals); needs --config.model.checkpoint=DIR and, for the real
                                   catalogue, --config.env.data_dir=DIR (local or gs://) holding
                                   items_shuffle_1000.json + items_ins_v2_1000.json (or the full
                                   files); without it the bundled fixture catalogue is used
configs/webshop.py:cpu             the embedded SmolLM2-135M-Instruct, small batch, 2 iterations
configs/webshop.py:tiny            a random-init tiny model (tests: mechanics only)
configs/webshop.py:cpu,human       human goals (items_human_ins.json) instead of synthetic ones
"""

from empo2_jax import defaults

ARGS = ("cpu", "tiny", "human")


def get_config(arg=None):
  args = defaults.parse_args("webshop", arg, ARGS)
  c = defaults.get_config()
  c.unlock()  # the WebShop fields below are new keys of config.env
  c.env.name = "webshop"
  c.env.task = "webshop"
  # envs/webshop/suite.py reads these (envs/webshop/env.py WebShopConfig documents them).
  c.env.data_dir = ""  # "" = the bundled fixture catalogue
  c.env.goals = "human" if args.get("human") else "synthetic"
  c.env.price_seed = 0
  c.env.num_products = 0  # 0 = every product record
  c.env.num_test = 500  # test = the first 500 goals after the seed-233 shuffle, train = the rest
  c.env.num_dev = 0
  # 0: all train goals; the trainer walks them variations_per_iter at a time
  c.env.num_train_variations = 0
  c.env.num_test_variations = 128  # verl-agent validates on 128 test goals
  c.env.max_steps = 15
  c.env.reward_mode = "score"  # return = Table 2 score (100 x reward); "verl": 10 on a perfect buy
  c.env.search_backend = "lucene"
  c.env.show_attrs = False
  c.env.few_shot = 0  # verl-agent's prompt has no examples
  c.env.workers = 4  # no JVM: a worker is one process with the catalogue, index and spaCy
  c.rollout.max_new_tokens = 48  # one action: a search query or click[...]
  c.rollout.max_context = 8192
  c.optim.max_prompt_len = c.rollout.max_context - c.rollout.max_new_tokens
  if args.get("human") and (args.get("cpu") or args.get("tiny")):
    c.env.num_test = 40  # the fixture has 142 human goals: keep 102 for training
  if args.get("cpu") or args.get("tiny"):
    # "click[b0xxxxxxxx]" or a short search is ~10-20 tokens; a results page with its 13
    # admissible actions is ~700 tokens
    defaults.small_cpu(c, max_new_tokens=24, max_context=4096, iterations=2, eval_every=2)
    c.env.max_steps = 5  # search, click a product, pick up to two options, buy
    c.env.num_test_variations = 2
  if args.get("cpu"):
    defaults.embedded_model(c)
    # Episodes of 5 pages with their action lists pack to ~2-3.5k tokens a row: without remat the
    # 30-layer update reached 6.9 GB here (and was OOM-killed on the shared machine).
    c.model.remat = "full"
  if args.get("tiny"):
    defaults.tiny_model(c)
  c.lock()
  return c
