"""The sampler under a 2-device CPU mesh (fsdp=2): same samples as one device, cache batch-sharded.

Runs in a subprocess because the host device count is fixed when JAX starts.
"""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
  import numpy as np, jax
  from empo2_jax.model import llama
  from empo2_jax.model.configs import LlamaConfig
  from empo2_jax.parallel.mesh import make_mesh
  from empo2_jax.parallel.sharding import shard_tree
  from empo2_jax.sampling.sampler import SamplerSettings, generate
  from empo2_jax.sampling.session import Session
  assert jax.device_count() == 2, jax.devices()
  cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=1e4)
  params = llama.init_params(cfg, jax.random.key(0), std=0.3)
  st = SamplerSettings(cache_dtype="float32", prefill_chunks=(16, 64))
  mesh = make_mesh("data=1,fsdp=2,tensor=1")
  sharded = shard_tree(params, mesh)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 256, n).tolist() for n in (3, 40, 90)]
  kw = dict(max_new_tokens=8, temperature=1.0, rng=jax.random.key(1), settings=st)
  one = generate(params, cfg, prompts, **kw)
  two = generate(sharded, cfg, prompts, mesh=mesh, **kw)
  for (ta, la), (tb, lb) in zip(one, two):
    assert ta.tolist() == tb.tolist(), (ta, tb)
    np.testing.assert_allclose(la, lb, atol=1e-5)
  sess = Session(sharded, cfg, num_rows=4, max_tokens=256, settings=st, mesh=mesh)
  out = sess.step({0: prompts[0], 3: prompts[2]}, max_new_tokens=8, temperature=1.0,
                  rng=jax.random.key(1))
  assert len(sess.cache["k"].sharding.device_set) == 2
  assert sess.cache["k"].addressable_shards[0].data.shape[1] == 2     # rows split over fsdp
  print("MESH_OK")
""")


@pytest.mark.slow
def test_sampler_on_two_device_mesh():
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=root,
    XLA_FLAGS="--xla_force_host_platform_device_count=2",
  )
  proc = subprocess.run(
    [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600, cwd=root
  )
  assert "MESH_OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
