"""A training process does not load torch (torch is installed in the test venv, for the Hugging Face
references): tensorboardX's package __init__ and transformers' AutoTokenizer import it, which cost
every run ~0.2 GiB resident (bench/host_memory.py). The event files (train/metrics.py) and the
embedded model's tokenizer must work without it, and torch must stay importable afterwards."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import os, sys
from empo2_jax.train import build, metrics, trainer  # the training modules
from empo2_jax.model.gguf import smollm2_gguf_path
from empo2_jax.model.tokenizer import load_tokenizer

ev = metrics.EventFile(sys.argv[1])
ev.write(3, {"return_mean": 0.25})
ev.close()
records = list(metrics._event_records(open(ev.path, "rb").read()))
assert [r[1].step for r in records] == [0, 3], records
assert records[1][1].summary.value[0].simple_value == 0.25
tok = load_tokenizer(smollm2_gguf_path())
chat = [{"role": "user", "content": "look around"}]
ids = tok.apply_chat_template(chat, add_generation_prompt=True)
assert tok.decode(ids).count("look around") == 1
print("torch_loaded", "torch" in sys.modules)
import torch  # hidden only while tensorboardX loaded

print("torch_after", torch.tensor([1.0, 2.0]).sum().item())
"""


def test_training_modules_events_and_tokenizer_do_not_load_torch(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  env.pop("XLA_FLAGS", None)
  out = subprocess.run(
    [sys.executable, "-c", SCRIPT, str(tmp_path / "events")],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  assert "torch_loaded False" in lines, out.stdout
  assert "torch_after 3.0" in lines, out.stdout
