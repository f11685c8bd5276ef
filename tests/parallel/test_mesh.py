"""Mesh specs, partition rules and their clear errors (one process, no device mesh needed)."""

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from empo2_jax.model import llama, lora
from empo2_jax.model.configs import get_preset
from empo2_jax.parallel import mesh as pmesh, sharding as shd
from empo2_jax.programs import aot, train_lm


def abstract_mesh(data, fsdp, tensor):
  return AbstractMesh((data, fsdp, tensor), pmesh.AXES)


def test_mesh_spec_parsing_and_minus_one():
  assert pmesh.parse_mesh_spec("data=2, fsdp=-1") == {"data": 2, "fsdp": -1, "tensor": 1}
  assert pmesh.resolve_mesh_shape("data=2,fsdp=-1,tensor=2", 16) == {
    "data": 2,
    "fsdp": 4,
    "tensor": 2,
  }
  assert pmesh.resolve_mesh_shape((1, 4, 2), 8) == {"data": 1, "fsdp": 4, "tensor": 2}


@pytest.mark.parametrize(
  "spec,devices,msg",
  [
    ((3, 1, 1), 8, "uses 3 devices but there are 8"),
    ("data=3,fsdp=-1", 8, "does not divide the 8 devices"),
    ("data=-1,fsdp=-1", 8, "at most one axis may be -1"),
    ("pipeline=2", 8, "unknown mesh axes ['pipeline']"),
    ("data2", 8, "is not axis=size"),
  ],
)
def test_mesh_errors(spec, devices, msg):
  with pytest.raises(ValueError) as e:
    pmesh.resolve_mesh_shape(spec, devices)
  assert msg in str(e.value)


def test_make_mesh_on_this_host_and_bad_count():
  mesh = pmesh.make_mesh("fsdp=-1")
  assert mesh.axis_names == pmesh.AXES and mesh.devices.size == jax.device_count()
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
  with pytest.raises(ValueError, match="uses 2 devices but there are 1"):
    pmesh.make_mesh((2, 1, 1), jax.devices()[:1])


def test_rules_cover_every_param_and_keep_layer_axis_unsharded():
  config = get_preset("7b")
  specs = shd.tree_specs(llama.param_shapes(config))
  assert specs["embed"] == P("tensor", "fsdp") and specs["lm_head"] == P("fsdp", "tensor")
  assert specs["layers"]["wq"] == P(None, "fsdp", "tensor")
  assert specs["layers"]["w_down"] == P(None, "tensor", "fsdp")
  assert specs["layers"]["attn_norm"] == P() and specs["final_norm"] == P()
  for name, spec in specs["layers"].items():
    assert len(spec) == 0 or spec[0] is None, name
  # every 7B param divides a (data=1, fsdp=16, tensor=4) pod slice
  shd.tree_shardings(llama.param_shapes(config), abstract_mesh(1, 16, 4))


def test_lora_adapters_shard_as_their_weights_and_their_moments_follow():
  """A [L, in, r] splits as its weight's input dim, B [L, r, out] as its output dim; the rank and
  the layer axis never; a LoRA state's AdamW moments cover the adapters with the same specs."""
  config = get_preset("7b", lora_rank=16)
  specs = shd.tree_specs({"layers": lora.adapter_shapes(config)})["layers"]
  base = shd.tree_specs(llama.param_shapes(config))["layers"]
  for w in lora.TARGETS.values():
    assert specs[f"{w}_lora_a"] == P(None, base[w][1], None), w
    assert specs[f"{w}_lora_b"] == P(None, None, base[w][2]), w
  shd.tree_shardings({"layers": lora.adapter_shapes(config)}, abstract_mesh(1, 16, 4))
  opt = train_lm.make_optimizer(train_lm.LMTrainConfig())
  state = shd.tree_specs(train_lm.abstract_train_state(get_preset("tiny", lora_rank=4), opt))
  adam = state.opt_state[1][0]
  assert set(adam.mu["layers"]) == {k for k in state.params["layers"] if lora.is_adapter(k)}
  assert adam.mu["layers"] == {k: v for k, v in state.params["layers"].items() if "_lora_" in k}


def test_optimizer_state_follows_params():
  config = get_preset("tiny")
  opt = train_lm.make_optimizer(train_lm.LMTrainConfig())
  state = train_lm.abstract_train_state(config, opt)
  specs = shd.tree_specs(state)
  adam = specs.opt_state[1][0]
  assert adam.mu == specs.params and adam.nu == specs.params
  assert adam.count == P() and specs.step == P()


def test_micro_batches_keep_each_devices_rows():
  """programs/train_lm's micro-batches: with the rows over 4 devices (rows 0-3, 4-7, ...), each
  micro-batch of 8 takes 2 rows of every device; on one device, consecutive rows."""
  x = np.arange(32).reshape(16, 2)
  got = np.asarray(train_lm._micro_batches(x, 8, 4))
  assert got.shape == (2, 8, 2)
  assert got[..., 0].tolist() == [[0, 2, 8, 10, 16, 18, 24, 26], [4, 6, 12, 14, 20, 22, 28, 30]]
  one = np.asarray(train_lm._micro_batches(x, 8, 1))
  np.testing.assert_array_equal(one, x.reshape(2, 8, 2))


def test_unshardable_dim_names_the_param():
  shapes = llama.param_shapes(get_preset("0.5b"))  # D = 896 = 2^7 * 7
  with pytest.raises(ValueError) as e:
    shd.tree_shardings(shapes, abstract_mesh(1, 256, 1))
  assert "embed" in str(e.value) and "896" in str(e.value) and "fsdp" in str(e.value)
  with pytest.raises(ValueError, match="layers/wq"):
    shd.tree_shardings({"layers": {"wq": (2, 64, 6)}}, abstract_mesh(1, 1, 4))


def test_unmatched_param_is_an_error():
  with pytest.raises(ValueError, match="no partition rule matches param 'layers/w_new'"):
    shd.tree_specs({"layers": {"w_new": (2, 8, 8)}})


def test_batch_must_divide_data_times_fsdp():
  mesh = pmesh.make_mesh((1, 1, 1))
  shd.shard_batch({"tokens": np.zeros((3, 4), np.int32)}, mesh)  # 1 device: any batch
  with pytest.raises(ValueError, match="divisible by data\\*fsdp = 8"):
    shd._check_batch("tokens", (12, 4), abstract_mesh(2, 4, 1))


def test_unknown_topology_lists_valid_examples():
  with pytest.raises(ValueError) as e:
    aot.topology_devices("v9x:2x2")
  assert "unknown TPU topology 'v9x:2x2'" in str(e.value) and "v5p:2x2x1" in str(e.value)
  with pytest.raises(ValueError, match="unknown TPU topology"):
    aot.topology_devices("v5p")


def test_model_flops_formula_matches_param_count():
  c = get_preset("7b")
  matmul = (
    c.num_params()
    - c.vocab_size * c.hidden_size
    - c.hidden_size * (2 * c.num_layers + 1)
    - c.num_layers * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
  )
  assert aot.forward_flops_per_token(c, 0) == pytest.approx(2 * matmul)
