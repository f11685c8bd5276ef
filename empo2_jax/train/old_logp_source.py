"""Where a run's old log-probs come from (optim.old_logp_source; docs/method.md §4): the sampler's
own log-probs of the sampled tokens, or a recompute by the update. The sampler's serve only where
train/settings.py says they are the update's old log-probs (same policy, same view, same
temperature), and only while they agree with the recomputed ones: the first update whose check
(loss/sampler_vs_old_logp_maxdiff on its first mini-batch) is past rl/update.SAMPLER_LOGP_TOL
turns them off for the rest of the run (this process).
"""

from __future__ import annotations

import logging

import numpy as np

from empo2_jax.rl import update as update_lib
from empo2_jax.train import settings

log = logging.getLogger("empo2_jax")


class OldLogpSource:
  def __init__(self, c, update_cfg):
    self.config, self.update_cfg = c, update_cfg
    self.fallback = False  # set by `check`: recompute from now on
    source, why = settings.old_logp_source(c)
    if c.optim.old_logp_source == "sampler" and source != "sampler":
      log.info("optim.old_logp_source=sampler not applicable (%s): recomputing old log-probs", why)

  def from_sampler(self, mode: str, batch: dict) -> np.bool_:
    """The update's old_from_sampler flag for an iteration of `mode` on `batch`."""
    ok = self.update_cfg.old_logp_source == "sampler" and not self.fallback
    ok = ok and settings.old_logp_from_sampler(mode, self.config.empo2.ratio_variant, batch)
    return np.bool_(ok)

  def check(self, it: int, upd: dict) -> None:
    """After an update that took the sampler's log-probs as old log-probs: if its first
    mini-batch's recomputed log-probs differ from them by more than SAMPLER_LOGP_TOL (or by
    NaN), warn and recompute for the rest of the run. The update already taken stands: its
    first step's ratio was off by at most that difference, which PPO's clipping bounds."""
    diff = upd.get("loss/sampler_vs_old_logp_maxdiff", 0.0)
    if upd.get("loss/old_from_sampler") and not diff <= update_lib.SAMPLER_LOGP_TOL:
      log.warning(
        "iteration %d: sampler log-probs differ from the recomputed ones by up to %.3g nats "
        "(tolerance %.3g): recomputing old log-probs from now on",
        it + 1,
        diff,
        update_lib.SAMPLER_LOGP_TOL,
      )
      self.fallback = True
