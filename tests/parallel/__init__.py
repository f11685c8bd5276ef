"""Tests of empo2_jax/parallel/: meshes, sharding rules, sharded programs against one device."""
