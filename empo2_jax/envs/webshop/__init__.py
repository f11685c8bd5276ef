"""WebShop (Yao et al. 2022) with the original semantics, over data in the original file formats.

  data.py     loading items_shuffle*.json / items_ins_v2*.json / items_human_ins.json (local or
              gs://), product cleaning, sampled prices, human or synthetic goals, the seed-233
              shuffle; splits: test = the first 500 goals, train = the rest
  search.py   BM25 over the original index's document strings (Lucene 8's scoring, top 50)
  reward.py   the original get_reward (spaCy nouns, thefuzz token_set_ratio, colours, price)
  pages.py    the text ("simple") observation and clickables of every page type
  env.py      WebShopEnv, a TextEnv: page flow, search[...] / click[...], step limit, rewards
  prompts.py  the agent's view of a page (verl-agent's wrapper) and the chat messages
  suite.py    the registry entry (config.env.name = "webshop")
  fixture/    a bundled made-up catalogue in the original formats
              (scripts/make_webshop_fixture.py)

Import the submodules directly; this package imports nothing heavy (spaCy loads on the first
reward, the index is built when an env is created).
"""
