"""The other exploration methods of issue 19, as pieces of the same trainer (docs/methods.md §5-8):

  rnd.py   RND intrinsic reward on frozen MiniLM state embeddings ("empo2 + rnd")
  sge.py   strategy-guided exploration: <strategy> spans, mixed strategy temperatures with
           temperature-correct log-probs, strategy reflection
  herl.py  hindsight experience: guidance from the best failed episode's unmet goals, the guided
           re-rollout injected into its group, the bonus and the HE token weight
  spa.py   self-play world-model SFT data (<observation>/<prediction> with the true states), Pass@k;
           train/spa_run.py runs its collection and SFT stages (launch/spa.py)
  config.py  the config sections (rnd, sge, herl, spa), their checks, the methods' settings
  sections.py  the sections' default values (a leaf: config.py and the methods' dataclasses)

Each module keeps its math and text in pure functions (tested against numpy / hand-computed
values); the trainer and the actor call them through small hooks (explore/hooks.py).
"""
