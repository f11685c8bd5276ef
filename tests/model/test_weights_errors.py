"""Broken weight files raise CheckpointError naming the file, the tensor and what to do; the
safetensors writer round-trips exactly (bf16 included, and with files torch writes)."""

import json
import os
import re
import struct
import tempfile

import ml_dtypes
import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as Q

from empo2_jax.model import gguf as G
from empo2_jax.model import hf
from empo2_jax.model.configs import LlamaConfig
from empo2_jax.model.llama import param_shapes
from tests.model.test_gguf import write_gguf

CFG = LlamaConfig(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=48,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  rope_theta=10000.0,
  rms_norm_eps=1e-5,
  tie_word_embeddings=False,
  attention_bias=True,
)
WHAT_TO_DO = re.compile(r"re-(download|export|convert)")


def _params(seed=0):
  rng = np.random.default_rng(seed)

  def draw(shape):
    return rng.standard_normal(shape).astype(np.float32)

  shapes = param_shapes(CFG)
  params = {k: draw(v) for k, v in shapes.items() if k != "layers"}
  params["layers"] = {k: draw(v) for k, v in shapes["layers"].items()}
  return params


# ---------------------------------------------------------------------------------------------
# safetensors: a valid checkpoint directory, and ways to break its model.safetensors
# ---------------------------------------------------------------------------------------------


def _split(raw: bytes):
  (n,) = struct.unpack("<Q", raw[:8])
  return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _join(header: dict, data: bytes) -> bytes:
  blob = json.dumps(header).encode()
  blob += b" " * (-len(blob) % 8)
  return struct.pack("<Q", len(blob)) + blob + data


def _spans(header):
  """[(start, end, name)] of the tensors' data, in file order."""
  return sorted((*v["data_offsets"], k) for k, v in header.items() if k != "__metadata__")


def _cut(raw, broken):
  """The first tensor (in file order) whose data `broken` lacks."""
  header, data = _split(raw)
  available = len(data) - (len(raw) - len(broken))
  return next(name for _, end, name in _spans(header) if end > available)


def _edit(name, **changes):
  def mutate(raw):
    header, data = _split(raw)
    header[name] = {**header[name], **changes}
    return _join(header, data)

  return mutate


def _shift_last(raw):
  header, data = _split(raw)
  start, end, name = _spans(header)[-1]
  header[name]["data_offsets"] = [start + 64, end + 64]
  return _join(header, data)


def _drop(name):
  def mutate(raw):
    header, data = _split(raw)
    keep = {}
    for k, v in header.items():
      if k != "__metadata__" and k != name:
        a, b = v["data_offsets"]
        keep[k] = (v, data[a:b])
    out, offset, chunks = {}, 0, []
    for k, (v, chunk) in keep.items():
      out[k] = {**v, "data_offsets": [offset, offset + len(chunk)]}
      offset += len(chunk)
      chunks.append(chunk)
    return _join(out, b"".join(chunks))

  return mutate


NORM, DOWN = "model.norm.weight", "model.layers.0.mlp.down_proj.weight"
D, F = CFG.hidden_size, CFG.intermediate_size
# id -> (how to break the bytes of model.safetensors, tensor the message must name: a name, None,
# or a function of the valid and the broken bytes)
SAFETENSORS_CASES = {
  "truncated": (lambda raw: raw[: len(raw) * 3 // 5], _cut),
  "truncated_in_header": (lambda raw: raw[:20], None),
  "empty": (lambda raw: b"", None),
  "random_bytes": (lambda raw: np.random.default_rng(0).bytes(len(raw)), None),
  "header_length_huge": (lambda raw: struct.pack("<Q", 1 << 40) + raw[8:], None),
  "header_not_json": (lambda raw: raw[:8] + b"\x00{" * 10 + raw[28:], None),
  "offsets_past_end": (_shift_last, lambda raw, broken: _spans(_split(raw)[0])[-1][2]),
  "shape_vs_bytes": (_edit(NORM, shape=[D + 1]), NORM),
  "shape_vs_config": (_edit(DOWN, shape=[F, D]), DOWN),
  "unknown_dtype": (_edit(NORM, dtype="X99"), NORM),
  "dtype_numpy_lacks": (_edit(NORM, dtype="F8_E4M3", shape=[4 * D]), NORM),
  "missing_tensor": (_drop(DOWN), DOWN),
}


@pytest.fixture(scope="module")
def valid_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("valid"))
  hf.save_checkpoint(path, CFG, _params())
  return path


def _copy_dir(src, dst):
  os.makedirs(dst)
  for name in os.listdir(src):
    with open(os.path.join(src, name), "rb") as f:
      data = f.read()
    with open(os.path.join(dst, name), "wb") as f:
      f.write(data)


def test_valid_checkpoint_loads(valid_dir):
  config, params = hf.load_checkpoint(valid_dir)
  assert config.num_layers == CFG.num_layers and config.attention_bias
  want = _params()
  np.testing.assert_array_equal(params["layers"]["w_down"], want["layers"]["w_down"])
  np.testing.assert_array_equal(params["lm_head"], want["lm_head"])


@pytest.mark.parametrize("case", sorted(SAFETENSORS_CASES))
def test_broken_safetensors(tmp_path, valid_dir, case):
  mutate, tensor = SAFETENSORS_CASES[case]
  ckpt = str(tmp_path / "ckpt")
  _copy_dir(valid_dir, ckpt)
  file = os.path.join(ckpt, "model.safetensors")
  with open(file, "rb") as f:
    raw = f.read()
  broken = mutate(raw)
  if callable(tensor):
    tensor = tensor(raw, broken)
  with open(file, "wb") as f:
    f.write(broken)
  with pytest.raises(hf.CheckpointError) as info:
    hf.load_checkpoint(ckpt)
  msg = str(info.value)
  assert "model.safetensors" in msg and ckpt in msg, msg
  if tensor:
    assert tensor in msg, msg
  assert WHAT_TO_DO.search(msg), msg


def test_broken_shards_and_json(tmp_path):
  ckpt = tmp_path / "sharded"
  hf.save_checkpoint(str(ckpt), CFG, _params(), max_shard_bytes=20_000)
  index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
  shard = index[DOWN]
  raw = (ckpt / shard).read_bytes()
  (ckpt / shard).write_bytes(_drop(DOWN)(raw))
  with pytest.raises(hf.CheckpointError, match=rf"{shard}: lacks tensors \['{DOWN}'\]"):
    hf.load_checkpoint(str(ckpt))
  (ckpt / "model.safetensors.index.json").write_text('{"weight_map": ')
  with pytest.raises(hf.CheckpointError, match=r"model\.safetensors\.index\.json: not valid JSON"):
    hf.load_checkpoint(str(ckpt))
  (ckpt / "config.json").write_bytes(b"\xff\xfe garbage")
  with pytest.raises(hf.CheckpointError, match=r"config\.json: not valid JSON"):
    hf.load_checkpoint(str(ckpt))


# ---------------------------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------------------------


def _set_type(name, value):
  """Change the tensor type of `name` in a GGUF file's tensor info to `value`."""
  key = struct.pack("<Q", len(name)) + name.encode()

  def mutate(raw):
    at = raw.index(key) + len(key)
    (n_dims,) = struct.unpack("<I", raw[at : at + 4])
    at += 4 + 8 * n_dims
    return raw[:at] + struct.pack("<I", value) + raw[at + 4 :]

  return mutate


def _safetensors_bytes(raw):
  with tempfile.TemporaryDirectory() as d:
    hf.write_safetensors(os.path.join(d, "x.safetensors"), {"a": np.ones(4, np.float32)})
    with open(os.path.join(d, "x.safetensors"), "rb") as f:
      return f.read()


GNORM = "output_norm.weight"
# id -> (how to break the bytes of a valid .gguf, tensor the message must name, words it must hold)
GGUF_CASES = {
  "type_without_dequantizer": (_set_type(GNORM, Q.Q8_1.value), GNORM, "Q8_1"),
  "type_unknown": (_set_type(GNORM, 99), GNORM, "tensor type 99"),
  "truncated": (lambda raw: raw[:-100], "CUT", "truncated"),
  "truncated_in_header": (lambda raw: raw[:64], None, "not a readable GGUF"),
  "safetensors_file": (_safetensors_bytes, None, "safetensors"),
  "random_bytes": (lambda raw: np.random.default_rng(1).bytes(len(raw)), None, "not a GGUF"),
  "empty": (lambda raw: b"", None, "empty"),
}


@pytest.fixture(scope="module")
def valid_gguf(tmp_path_factory):
  path = tmp_path_factory.mktemp("gguf") / "m.gguf"
  write_gguf(path, CFG, _params(), Q.F32, arch="qwen2")
  return path


def test_valid_gguf_loads(valid_gguf):
  config, params = G.load_gguf(str(valid_gguf))
  assert config.num_layers == CFG.num_layers
  np.testing.assert_array_equal(params["layers"]["w_up"], _params()["layers"]["w_up"])


@pytest.mark.parametrize("case", sorted(GGUF_CASES))
def test_broken_gguf(tmp_path, valid_gguf, case):
  mutate, tensor, words = GGUF_CASES[case]
  raw = valid_gguf.read_bytes()
  broken = mutate(raw)
  if tensor == "CUT":  # the first tensor, in file order, whose data `broken` lacks
    tensors = sorted(gguf.GGUFReader(str(valid_gguf)).tensors, key=lambda t: t.data_offset)
    tensor = next(t.name for t in tensors if t.data_offset + t.n_bytes > len(broken))
  path = tmp_path / "broken.gguf"
  path.write_bytes(broken)
  with pytest.raises(hf.CheckpointError) as info:
    G.load_gguf(str(path))
  msg = str(info.value)
  assert str(path) in msg and words in msg, msg
  if tensor:
    assert tensor in msg, msg
  assert WHAT_TO_DO.search(msg) or case == "type_without_dequantizer", msg


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------


def test_round_trip_is_exact(tmp_path):
  rng = np.random.default_rng(0)
  f32 = rng.standard_normal((5, 7)).astype(np.float32)
  tensors = {
    "f32": f32,
    "bf16": f32.astype(ml_dtypes.bfloat16),
    "f16": f32.astype(np.float16),
    "i32": rng.integers(-(2**31), 2**31 - 1, (3, 4), dtype=np.int32),
    "i64": rng.integers(-(2**62), 2**62, (6,), dtype=np.int64),
    "u8": rng.integers(0, 256, (2, 2, 2), dtype=np.uint8),
    "bool": rng.random(5) > 0.5,
    "transposed": f32.T,  # not C-contiguous
    "scalar": np.array(3.25, np.float32),
    "empty": np.zeros((0, 3), np.float32),
  }
  path = str(tmp_path / "rt.safetensors")
  hf.write_safetensors(path, tensors)
  got = dict(hf.iter_safetensors(path))
  assert set(got) == set(tensors)
  for name, want in tensors.items():
    assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
    assert got[name].tobytes() == np.ascontiguousarray(want).tobytes(), name
  assert got["bf16"].dtype == ml_dtypes.bfloat16


def test_bf16_interoperates_with_torch(tmp_path):
  torch = pytest.importorskip("torch")
  from safetensors.torch import load_file, save_file

  x = torch.randn(4, 6).to(torch.bfloat16)
  save_file({"x": x}, str(tmp_path / "torch.safetensors"), metadata={"format": "pt"})
  (name, got), *rest = list(hf.iter_safetensors(str(tmp_path / "torch.safetensors")))
  assert name == "x" and not rest and got.dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(got.view(np.int16), x.view(torch.int16).numpy())
  ours = np.asarray(x.float().numpy()).astype(ml_dtypes.bfloat16)
  hf.write_safetensors(str(tmp_path / "ours.safetensors"), {"y": ours})
  back = load_file(str(tmp_path / "ours.safetensors"))["y"]
  assert back.dtype == torch.bfloat16 and torch.equal(back, x)


def test_unwritable_dtype_names_the_tensor(tmp_path):
  path = str(tmp_path / "bad.safetensors")
  with pytest.raises(hf.CheckpointError, match="bad.safetensors: tensor c: numpy dtype complex128"):
    hf.write_safetensors(path, {"ok": np.ones(2, np.float32), "c": np.ones(2, np.complex128)})
  assert not os.path.exists(path)
