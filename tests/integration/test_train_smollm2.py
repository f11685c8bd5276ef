"""The CPU demo's real model in the loop: SmolLM2-135M-Instruct acts in ScienceWorld and writes
tips."""

import os

import numpy as np
import pytest
from configs import sciworld

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_smollm2_iteration_acts_writes_tips_and_matches_sampler_logprobs(tmp_path):
  from empo2_jax.train.trainer import Trainer

  config = sciworld.get_config("cpu")
  config.empo2.force_mode = "on_tips"
  config.env.max_steps = 2
  config.train.iterations = 1
  trainer = Trainer(config, str(tmp_path), progress=False)
  try:
    assert trainer.model_config.num_layers == 30 and trainer.model_config.vocab_size == 49152
    result = trainer.train_iteration()
    m, eps = result.metrics, result.episodes
    assert all(len(e.turns) >= 1 for e in eps)
    # The pretrained policy writes real text: at least one tip of more than five words.
    assert max(len(e.tip.split()) for e in eps) > 5, [e.tip for e in eps]
    assert m["memory_size"] > 0
    # fp32: the update's recomputed old log-probs equal the sampler's (same weights, same view):
    # on-policy, the update takes the sampler's (optim.old_logp_source=sampler) and its first
    # mini-batch's forward pass measures the difference, within rl/update.SAMPLER_LOGP_TOL.
    from empo2_jax.rl.update import SAMPLER_LOGP_TOL

    assert m["loss/old_from_sampler"] == 1.0
    assert m["loss/sampler_vs_old_logp_absdiff"] < 1e-4
    assert m["loss/sampler_vs_old_logp_maxdiff"] <= SAMPLER_LOGP_TOL
    assert m["optim_steps"] >= 1 and np.isfinite(m["loss/loss"])
  finally:
    trainer.close()
