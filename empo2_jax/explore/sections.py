"""The exploration methods' config sections with their default values: the base config's
(explore/config.add_defaults puts them in), and the defaults of the methods' settings dataclasses
(explore/rnd.py RNDConfig, sge.py SGEConfig, herl.py HeRLConfig). A leaf module: no imports.
Every default marked [proposed] is a proposal of docs/methods.md, not a value found in the
authors' code."""

RND = dict(
  hidden=256,  # [proposed] MLP 384 -> 256 -> 256 -> 128, ReLU, orthogonal(sqrt 2) init
  out=128,
  lr=1e-4,  # [proposed] Adam, one step per rollout batch over all visited states
  obs_clip=5.0,  # RND's clip of the normalised input
  normalise="minmax",  # [proposed] 'minmax' (batch -> [0, 1]), 'std' (RND's), 'none'
  gamma=0.99,  # RND's gamma_int (for 'std')
  # [proposed] which rollouts get the reward: 'memory' (where EMPO2 gives 1/(n+1), the
  # like-for-like ablation) or 'all'. The predictor trains on every iteration's states.
  rollouts="memory",
)
SGE = dict(
  enabled=False,
  # [proposed] temperature:share classes of a group's strategy spans (docs/methods.md §5.3)
  strategy_temperatures="1.0:0.5,1.3:0.25,1.6:0.25",
  # [proposed] the strategy phase's token budget, ADDED to rollout.max_new_tokens
  strategy_max_new_tokens=32,
  reflect_share=0.5,  # [proposed] rho
  reflect_history=3,  # [proposed] M
  reflect_from_iteration=1,  # [proposed] reflection from the second iteration on
)
HERL = dict(
  enabled=False,
  alpha=0.05,  # reward_shaping_alpha (HeRL scripts)
  gamma_s=1.0,  # he_shaping_gamma (HeRL's IF script)
  temperature=0.3,  # the rewrite temperature (HeRL scripts)
  max_actions_shown=12,  # [proposed] the failed attempt's last actions in the hindsight block
)
SPA = dict(
  enabled=False,
  # [proposed] stage A: iterations of rollout.rows_per_iter x group_size episodes of the
  # current policy in the world-model format (SPA: 5 batches of 256 episodes)
  collect_iterations=2,
  collect_temperature=1.0,  # SPA samples at temperature 1
  # [proposed] extra response tokens for <observation>/<prediction> (collection and RL, where
  # the SFT'd model keeps writing them), ADDED to rollout.max_new_tokens
  extra_new_tokens=96,
  val_share=0.2,  # SPA's 80/20 split
  sft_epochs=5,  # SPA's SFT epochs over the collected rows (0: config.sft.steps steps)
)
