"""Tests of empo2_jax/agent/: the actor, its memory reads and the fidelity switches it
implements."""
