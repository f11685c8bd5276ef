"""empo2_jax.rl: the update's pure kernels. Importing the package registers the built-in loss
terms (rl/loss_terms.py, rl/teacher_terms.py), so every config built after it has their keys."""

from empo2_jax.rl import teacher_terms  # noqa: F401  registers ctx_kl and opid
