"""empo2_jax.programs: whole jitted programs built from the layers below (model, parallel, rl,
sampling), and their ahead-of-time compilation for a TPU topology without a TPU:

  aot.py          the AOT driver: abstract inputs on a topology's mesh, lower, compile, memory and
                  time estimates; the program registry (PROGRAMS)
  train_lm.py     the LM train step (masked next-token NLL, AdamW) on one device or a mesh: SFT's
                  step (train/sft.py), the AOT "lm_train_step" program, the mesh tests
  update_aot.py   registers the EMPO2 update (rl/update.py) as "train_step"
  sampler_aot.py  registers the sampler's decode loop and prefill as "sampler", "sampler_prefill"

parallel/ keeps the primitives (mesh, sharding rules) that the model and the update use.
"""
