"""The model pins its layer activations' rows on the mesh (parallel/sharding.shard_activation), so
an FSDP update moves weights, not activations.

The check reads the collectives of the compiled EMPO2 update on 8 simulated CPU devices (mesh
fsdp=8, a tiny model with 256-token rows): with the builders' mesh context no collective carries a
[rows, tokens, ...] activation and every layer weight is all-gathered; with the context removed
(the project before this change) XLA's propagation gathers and all-reduces activations instead,
which is what the test exists to catch. The numerics of the sharded update against one device are
tests/rl/test_update.py::test_update_on_8_devices_matches_one_device.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from empo2_jax.parallel import sharding as shd

SCRIPT = textwrap.dedent("""
    import json, re, sys
    import jax
    from empo2_jax.model import llama
    from empo2_jax.model.configs import LlamaConfig
    from empo2_jax.parallel import sharding as shd
    from empo2_jax.parallel.mesh import make_mesh
    from empo2_jax.rl import update as U
    from empo2_jax.programs.update_aot import abstract_batch
    from tests.helpers.rl_settings import update_config

    C = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=256, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=False)
    mesh = make_mesh("data=1,fsdp=8,tensor=1", jax.devices())
    cfg = update_config(minibatch_size=16, micro_rows=16, vocab_chunk=512)
    opt = U.make_optimizer(cfg)
    init = lambda: U.init_train_state(llama.init_params(C, jax.random.key(0)), opt)
    state = shd.abstract_on_mesh(jax.eval_shape(init), mesh)
    state_sh = jax.tree.map(lambda x: x.sharding, state)
    batch = abstract_batch(mesh, 16, 256, 8)
    out = {}
    for name in ("context", "no_context"):
        if name == "no_context":
            U.on_mesh = lambda fn, mesh: fn
        fn = U.make_update_fn(C, cfg, opt, batch_sharding=shd.batch_sharding(mesh),
                              state_sharding=state_sh)
        txt = fn.lower(state, batch).compile().as_text()
        ops = "all-reduce|all-gather|reduce-scatter|all-to-all"
        pat = r"= ([a-z0-9]+)\\[([0-9,]*)\\]\\S* (" + ops + r")\\("
        out[name] = sorted({(t, s, op) for t, s, op in re.findall(pat, txt)})
    print("RESULT " + json.dumps(out))
""")


def _collectives():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run(
    [sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True, timeout=600
  )
  assert out.returncode == 0, out.stderr[-3000:]
  line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1]
  return {
    k: [(t, tuple(int(d) for d in s.split(",") if d), op) for t, s, op in v]
    for k, v in json.loads(line[len("RESULT ") :]).items()
  }


def _moves_activations(collectives):
  """Collectives of float arrays shaped [16 rows, 256 tokens, ...]: activations, not weights."""
  return [c for c in collectives if c[0] in ("f32", "bf16") and c[1][:2] == (16, 256)]


@pytest.mark.slow
def test_the_fsdp_update_gathers_weights_not_activations():
  got = _collectives()
  assert _moves_activations(got["context"]) == [], got["context"]
  gathered = {shape for _, shape, op in got["context"] if op == "all-gather"}
  # D=64, F=256, heads*hd=64, kv*hd=32: every layer matrix arrives whole on every chip
  for shape in [(64, 64), (64, 32), (64, 256), (256, 64)]:
    assert shape in gathered, (shape, got["context"])
  # Without the mesh context XLA all-reduces [rows, tokens, width] partial sums instead.
  assert any(op == "all-reduce" for *_, op in _moves_activations(got["no_context"])), got


def test_shard_activation_without_a_mesh_is_the_identity_and_drops_missing_axes():
  x = jnp.ones((4, 3, 8))
  assert shd.shard_activation(x, ("data", "fsdp"), None, "tensor") is x
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp"))  # no "tensor" axis

  def f(y):
    return shd.shard_activation(y * 2, ("data", "fsdp"), None, "tensor")

  text = jax.jit(shd.on_mesh(f, mesh)).lower(x).as_text()
  assert 'sharding_constraint' in text and '[{"data", "fsdp"}, {}, {}]' in text, text
  np.testing.assert_array_equal(jax.jit(shd.on_mesh(f, mesh))(x), 2 * x)
