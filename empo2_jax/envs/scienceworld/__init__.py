"""ScienceWorld (Wang et al. 2022), the paper's environment (docs/method.md §7), in one package:

  env.py      the wrapper: the paper's setup, fast stepping, action correction, tasks and splits
  jvm.py      one ScienceWorld JVM behind an authenticated py4j gateway
  prompts.py  its messages (system prompt, first and later user messages, tips: `SCIENCEWORLD`)
  suite.py    its registry entry (envs/registry.py): pool workers, config, local env, materials

Importing this package starts nothing and imports neither py4j nor the scienceworld library;
env.py, jvm.py and suite.py do (still without starting a JVM).
"""
