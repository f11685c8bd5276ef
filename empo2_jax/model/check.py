"""Logit checker: our forward vs transformers (torch, CPU) on the same checkpoint.

  python -m empo2_jax.model.check --hf_dir DIR [--dtype float32|bfloat16] [--max_abs_diff 1e-3]
  python -m empo2_jax.model.check --gguf FILE.gguf    (transformers' own GGUF loading as reference)

Runs a few prompts through both, prints per-prompt figures, and as its last line
`max_abs_diff=<float> kl=<float>`; exits 1 when either exceeds its tolerance.
torch and transformers are needed only here (dev dependencies), never by the package itself.
"""

from __future__ import annotations

import sys

import numpy as np
from absl import app, flags

PROMPTS = [
  "Hello, world!",
  "You are in the kitchen. You see a fridge, a stove and a thermometer.",
  "Task: focus on the animal with the longest lifespan, then the shortest.",
  "def add(a, b):\n    return a + b\n",
]

_DIR = flags.DEFINE_string("hf_dir", None, "Hugging Face Llama/Qwen2 checkpoint directory")
_GGUF = flags.DEFINE_string("gguf", None, "a llama.cpp .gguf file (instead of --hf_dir)")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "our compute dtype")
_TOL = flags.DEFINE_float(
  "max_abs_diff", None, "tolerance on |logit diff| (default: 1e-3 fp32, inf for bf16)"
)
_KL_TOL = flags.DEFINE_float(
  "max_kl", None, "tolerance on mean KL(hf||ours) (default 1e-4 fp32, 1e-2 bf16)"
)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(path: str, dtype: str = "float32"):
  """(max |logit diff|, mean KL(hf || ours)) over PROMPTS for an HF directory or a .gguf file."""
  import os

  import jax
  import torch
  from transformers import AutoModelForCausalLM

  from empo2_jax.model import hf, llama
  from empo2_jax.model.tokenizer import load_tokenizer

  config, params = hf.load_checkpoint(path, dtype="float32", compute_dtype=dtype)
  try:
    tok = load_tokenizer(path)
  except (FileNotFoundError, OSError, ValueError):  # weights only: any ids do
    tok = load_tokenizer()
  if hf.is_gguf(path):
    model = AutoModelForCausalLM.from_pretrained(
      os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path), dtype=torch.float32
    )
  else:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  model.eval()
  fwd = jax.jit(llama.forward, static_argnums=1)
  worst, kls = 0.0, []
  for text in PROMPTS:
    ids = [i % config.vocab_size for i in tok(text)["input_ids"]]
    tokens = np.array([ids], np.int32)
    ours = np.asarray(fwd(params, config, tokens, np.ones_like(tokens)))[0]
    with torch.no_grad():
      ref = model(torch.tensor(tokens, dtype=torch.long)).logits[0].float().numpy()
    diff = float(np.abs(ours - ref).max())
    p, q = _log_softmax(ref.astype(np.float64)), _log_softmax(ours.astype(np.float64))
    kl = float((np.exp(p) * (p - q)).sum(-1).mean())
    print(f"prompt_tokens={len(ids)} max_abs_diff={diff:.3e} kl={kl:.3e}")
    worst, kls = max(worst, diff), kls + [kl]
  return worst, float(np.mean(kls))


def main(argv):
  del argv
  if (_DIR.value is None) == (_GGUF.value is None):
    print("pass exactly one of --hf_dir DIR or --gguf FILE", file=sys.stderr)
    sys.exit(2)
  diff, kl = compare(_DIR.value or _GGUF.value, _DTYPE.value)
  fp32 = _DTYPE.value == "float32"
  tol = _TOL.value if _TOL.value is not None else (1e-3 if fp32 else float("inf"))
  kl_tol = _KL_TOL.value if _KL_TOL.value is not None else (1e-4 if fp32 else 1e-2)
  print(f"max_abs_diff={diff:.6g} kl={kl:.6g}")
  if diff > tol or kl > kl_tol:
    print(f"FAILED: tolerance max_abs_diff<={tol} kl<={kl_tol}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
