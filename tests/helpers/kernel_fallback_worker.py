"""Run by tests/model/test_cpu_kernels.py with a failing CXX and an empty EMPO2_KERNEL_CACHE:
prints one JSON line: whether the kernels are available and why not; with --sample also the
tokens a tiny model samples under decode_kernels "auto" and "xla", and the error "cpu" gives."""

import json
import sys

import jax

from empo2_jax.model import cpu_kernels, llama
from empo2_jax.model.configs import get_preset
from empo2_jax.sampling.sampler import SamplerSettings, generate


def tokens(mode: str) -> list:
  config = get_preset("tiny", vocab_size=512, decode_kernels=mode)  # a small vocabulary: fast
  params = llama.init_params(config, jax.random.key(0))
  out = generate(
    params,
    config,
    [[1, 2, 3, 4], [5, 6]],
    max_new_tokens=6,
    rng=jax.random.key(1),
    settings=SamplerSettings(cache_dtype="float32"),
  )
  return [t.tolist() for t, _ in out]


def main() -> None:
  out = {"available": cpu_kernels.available(), "build_error": cpu_kernels.build_error()}
  if "--sample" in sys.argv:
    out["auto_tokens"], out["xla_tokens"] = tokens("auto"), tokens("xla")
    try:
      tokens("cpu")
      out["cpu_error"] = ""
    except RuntimeError as e:
      out["cpu_error"] = str(e)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
