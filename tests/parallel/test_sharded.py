"""Sharded forward / lm_train_step on 8 simulated CPU devices equal one device; two hosts equal one.

Each case runs tests/helpers/parallel_worker.py in a subprocess: the device count (XLA_FLAGS) must
be set
before jax starts, and the main pytest process has one device.
"""

import json

import numpy as np
import pytest

from tests.helpers import processes

TOL = 1e-5
# tiny model of the worker: D=64, heads*hd=64, kv=32, F=128, V=512, L=2; batch 16 rows


def _worker(*args):
  return processes.start("parallel_worker.py", *args)


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
  out = tmp_path_factory.mktemp("parity") / "parity.json"
  processes.finish([_worker("parity", out)], timeout=900)
  return json.loads(out.read_text())


@pytest.mark.slow
def test_one_device_reference_is_the_plain_model_and_trains(parity):
  assert parity["ref_vs_unsharded_forward"] <= TOL
  assert parity["ref_params_moved"] > 1e-4  # the step really updated the params
  assert 5.0 < parity["ref_loss"] < 7.5  # ~ln(512) for a random init


@pytest.mark.slow
@pytest.mark.parametrize(
  "mesh,wq,embed",
  [
    ("(8, 1, 1)", [2, 64, 64], [512, 64]),  # data only: params replicated
    ("(1, 8, 1)", [2, 8, 64], [512, 8]),  # fsdp on D
    ("(1, 4, 2)", [2, 16, 32], [256, 16]),  # fsdp on D, tensor on heads / vocab
    ("(2, 2, 2)", [2, 32, 32], [256, 32]),
  ],
)
def test_sharded_matches_one_device(parity, mesh, wq, embed):
  r = parity[mesh]
  assert r["logits"] <= TOL and r["loss"] <= TOL and r["params"] <= TOL, r
  assert r["grad_norm"] <= TOL * 10, r
  assert r["wq_shard"] == wq and r["embed_shard"] == embed
  assert r["mu_wq_shard"] == wq  # Adam moments sharded like their params


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
  mesh = "data=2,fsdp=2,tensor=2"
  ref, two = tmp_path / "one.npz", tmp_path / "two.npz"
  addr = processes.coordinator()
  procs = [_worker("run", ref, mesh)]
  procs += [_worker("run", two, mesh, addr, 2, pid) for pid in (0, 1)]
  processes.finish(procs, timeout=900)
  a, b = np.load(ref), np.load(two)
  assert int(a["processes"]) == 1 and int(b["processes"]) == 2
  assert int(a["devices"]) == int(b["devices"]) == 8
  assert np.abs(a["logits"] - b["logits"]).max() <= TOL
  assert abs(float(a["loss"]) - float(b["loss"])) <= TOL
  params = [k for k in a.files if k.startswith("arr_")]
  assert params and max(np.abs(a[k] - b[k]).max() for k in params) <= TOL
