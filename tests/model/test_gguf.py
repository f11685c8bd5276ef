"""GGUF loading on small files written here with gguf.GGUFWriter: every weight type the package
dequantizes, llama.cpp's q/k row order, qwen2 biases, and clear errors."""

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as Q

from empo2_jax.model import gguf as G
from empo2_jax.model import hf, llama
from empo2_jax.model.configs import LlamaConfig

QUANTIZABLE = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
DEQUANT_ONLY = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]  # the package cannot quantize these
# max |error| of a round trip through each type, relative to the tensor's max |value|
ROUND_TRIP_TOL = {
  Q.F32: 0.0,
  Q.F16: 1e-3,
  Q.BF16: 1e-2,
  Q.Q8_0: 1e-2,
  Q.Q5_0: 0.07,
  Q.Q5_1: 0.07,
  Q.Q4_0: 0.15,
  Q.Q4_1: 0.15,
}
# 256-wide so that every block size (32, 256) divides each row
SMALL = LlamaConfig(
  vocab_size=256,
  hidden_size=256,
  intermediate_size=256,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=64,
  rope_theta=10000.0,
  rms_norm_eps=1e-5,
  tie_word_embeddings=False,
  attention_bias=False,
)
_GGUF_NAMES = {
  "wq": "attn_q",
  "wk": "attn_k",
  "wv": "attn_v",
  "wo": "attn_output",
  "w_gate": "ffn_gate",
  "w_up": "ffn_up",
  "w_down": "ffn_down",
  "attn_norm": "attn_norm",
  "mlp_norm": "ffn_norm",
  "bq": "attn_q",
  "bk": "attn_k",
  "bv": "attn_v",
}


def _random_bytes(rng, shape, qtype):
  """Random blocks of `qtype` whose float16 scale fields stay finite (bit 6 of every byte clear:
  a float16's exponent then stays below all-ones)."""
  raw = rng.integers(0, 256, size=gguf.quants.quant_shape_to_byte_shape(shape, qtype))
  return (raw & 0xBF).astype(np.uint8)


def write_gguf(path, config, params, qtype, *, arch="llama", rng=None, tensors=None):
  """Write `params` (our layout, float32) as a GGUF file the way llama.cpp's converter lays it
  out: [out, in] matrices, llama q/k rows in GGUF order, norms in F32, matrices in `qtype`.
  For types the package cannot quantize, random blocks are written instead. Returns
  {gguf name: (written array, type)}."""
  c = config
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(c.num_layers)
  w.add_context_length(c.max_position_embeddings)
  w.add_embedding_length(c.hidden_size)
  w.add_feed_forward_length(c.intermediate_size)
  w.add_head_count(c.num_heads)
  w.add_head_count_kv(c.num_kv_heads)
  w.add_rope_freq_base(c.rope_theta)
  w.add_layer_norm_rms_eps(c.rms_norm_eps)
  w.add_rope_dimension_count(c.head_dim)
  w.add_vocab_size(c.vocab_size)
  written = {}

  def add(name, hf_layout):
    t = qtype if hf_layout.ndim == 2 else Q.F32
    if t in DEQUANT_ONLY:
      data = _random_bytes(rng, hf_layout.shape, t)
    else:
      data = gguf.quants.quantize(np.ascontiguousarray(hf_layout, np.float32), t)
    w.add_tensor(name, data, raw_dtype=t if t not in (Q.F32, Q.F16) else None)
    written[name] = (data, t)

  add("token_embd.weight", np.asarray(params["embed"]))
  add("output_norm.weight", np.asarray(params["final_norm"]))
  if not c.tie_word_embeddings:
    add("output.weight", np.asarray(params["lm_head"]).T)
  for i in range(c.num_layers):
    for ours, value in params["layers"].items():
      v = np.asarray(value[i])
      kind = "bias" if ours.startswith("b") else "weight"
      if v.ndim == 2:
        v = v.T
        if arch == "llama" and ours in ("wq", "wk"):
          v = G.to_gguf_rows(v, c.num_heads if ours == "wq" else c.num_kv_heads)
      add(f"blk.{i}.{_GGUF_NAMES[ours]}.{kind}", v)
  for name, arr in (tensors or {}).items():
    w.add_tensor(name, arr)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return written


def _params(config, seed=0):
  import jax

  return jax.tree.map(np.array, llama.init_params(config, jax.random.PRNGKey(seed), std=0.5))


def test_gguf_row_order_round_trip():
  n_heads, hd = 3, 8
  w = np.arange(n_heads * hd * 2, dtype=np.float32).reshape(n_heads * hd, 2)
  g = G.to_gguf_rows(w, n_heads)
  # llama.cpp interleaves each head's halves: rows (r0, i0, r1, i1, ...) of HF's (r..., i...)
  for h in range(n_heads):
    for i in range(hd // 2):
      np.testing.assert_array_equal(g[h * hd + 2 * i], w[h * hd + i])
      np.testing.assert_array_equal(g[h * hd + 2 * i + 1], w[h * hd + hd // 2 + i])
  np.testing.assert_array_equal(G.from_gguf_rows(g, n_heads), w)
  assert not np.array_equal(g, w)


@pytest.mark.parametrize("qtype", QUANTIZABLE + DEQUANT_ONLY, ids=lambda q: q.name)
def test_every_type_loads_as_the_package_dequantizes(tmp_path, qtype):
  params = _params(SMALL)
  path = tmp_path / "m.gguf"
  written = write_gguf(path, SMALL, params, qtype, rng=np.random.default_rng(0))
  config, got = G.load_gguf(str(path))
  # GGUF stores the epsilon as float32
  assert config == SMALL.replace(rms_norm_eps=float(np.float32(SMALL.rms_norm_eps)))
  for i in range(SMALL.num_layers):
    for ours in got["layers"]:
      data, t = written[f"blk.{i}.{_GGUF_NAMES[ours]}.weight"]
      want = gguf.quants.dequantize(data, t)
      if ours in ("wq", "wk"):
        want = G.from_gguf_rows(want, SMALL.num_heads if ours == "wq" else SMALL.num_kv_heads)
      want = want.T if want.ndim == 2 else want
      np.testing.assert_array_equal(got["layers"][ours][i], want, err_msg=f"{ours}[{i}]")
      if qtype in ROUND_TRIP_TOL:  # the loaded model is the one that was written
        ref = params["layers"][ours][i]
        err = np.abs(got["layers"][ours][i] - ref).max() / np.abs(ref).max()
        assert err <= ROUND_TRIP_TOL[qtype], (ours, err)
  np.testing.assert_array_equal(got["embed"], gguf.quants.dequantize(*written["token_embd.weight"]))
  np.testing.assert_array_equal(got["lm_head"], gguf.quants.dequantize(*written["output.weight"]).T)


def test_qwen2_gguf_keeps_biases_and_row_order(tmp_path):
  config = SMALL.replace(attention_bias=True, tie_word_embeddings=True)
  params = _params(config, seed=1)
  params["layers"]["bq"] = params["layers"]["bq"] + 0.5  # nonzero biases
  path = tmp_path / "q.gguf"
  write_gguf(path, config, params, Q.F32, arch="qwen2")
  loaded, got = hf.load_checkpoint(str(path), dtype="bfloat16")  # dispatches on .gguf
  assert loaded.attention_bias and loaded.tie_word_embeddings and "lm_head" not in got
  assert loaded.param_dtype == "bfloat16" and got["layers"]["bq"].dtype.name == "bfloat16"
  for k, v in params["layers"].items():
    np.testing.assert_allclose(
      got["layers"][k].astype(np.float32), v, rtol=1e-2, atol=1e-2, err_msg=k
    )


def test_errors_name_the_problem(tmp_path):
  params = _params(SMALL)
  path = tmp_path / "extra.gguf"
  write_gguf(path, SMALL, params, Q.F32, tensors={"rope_freqs.weight": np.ones(32, np.float32)})
  with pytest.raises(hf.CheckpointError, match="rope_freqs"):
    G.load_gguf(str(path))
  path = tmp_path / "odd.gguf"
  write_gguf(path, SMALL, params, Q.F32, tensors={"blk.0.attn_gate.weight": np.ones(4, np.float32)})
  with pytest.raises(hf.CheckpointError, match="unexpected GGUF tensor blk.0.attn_gate.weight"):
    G.load_gguf(str(path))
  path = tmp_path / "phi.gguf"
  w = gguf.GGUFWriter(str(path), "phi2")
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(hf.CheckpointError, match="architecture='phi2'"):
    G.load_gguf(str(path))
  with pytest.raises(hf.CheckpointError, match="no such GGUF file"):
    hf.load_checkpoint(str(tmp_path / "missing.gguf"))
