"""The EMPO2 update compiles ahead of time for a TPU topology (libtpu in a subprocess)."""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = textwrap.dedent("""
    import os
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from empo2_jax.defaults import get_config
    from empo2_jax.programs import aot
    from empo2_jax.train import settings
    import empo2_jax.programs.update_aot  # registers "train_step"
    c = get_config()  # the base config's mesh, remat, dtypes and update settings
    BASE = dict(mesh=",".join(f"{k}={v}" for k, v in c.mesh.items()), remat=c.model.remat,
                param_dtype=c.model.param_dtype, compute_dtype=c.model.compute_dtype,
                update=settings.update_config(c))
    req = aot.AotRequest(program="train_step", preset="tiny", topology="v5p:2x2x1", batch=8,
                         seq=96, num_microbatches=2, cost_probe=True, **BASE)
    r = aot.compile_program(req)
    print(aot.format_report(r, req))
    print("RESULT", r["fits"], r["per_chip_gib"], r["compiler_flops"], r["model_flops"],
          r["floor_flops"])
    # One mini-batch of 128 rows vs two (256 rows, docs/method.md §1 item 5): same micro-batches,
    # so the memory differs only by the extra rows of data.
    per_chip = []
    for batch in (128, 256):
        req = aot.AotRequest(program="train_step", preset="tiny", topology="v5p:2x2x1",
                             batch=batch, seq=96, num_microbatches=32, cost_probe=False, **BASE)
        r = aot.compile_program(req)
        print(aot.format_report(r, req))
        per_chip.append(r["per_chip_gib"])
    print("MINIBATCHES", *per_chip)
    # fuse_layer_grads reaches rl/update.make_update_fn: forced on without full remat, it refuses
    import dataclasses
    try:
        aot.compile_program(dataclasses.replace(req, remat="none", fuse_layer_grads=True))
        print("FUSE_REFUSED", False)
    except ValueError as e:
        print("FUSE_REFUSED", "fuse_layer_grads" in str(e))
""")


@pytest.mark.slow
def test_train_step_compiles_for_v5p():
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  out = subprocess.run(
    [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
  )
  assert out.returncode == 0, out.stderr[-3000:]
  line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1].split()
  fits, per_chip, compiler_flops, model_flops, floor = line[1] == "True", *map(float, line[2:])
  assert fits and 0 < per_chip < 2.0
  # ... and at least the matmul floor (every pass + the remat recompute), so its time is believed
  assert floor < compiler_flops, line
  # the loop-free cost probe sees the whole update: compiler and model flop counts agree roughly
  assert 0.5 < compiler_flops / model_flops < 3.0, line
  one, two = map(
    float, [ln for ln in out.stdout.splitlines() if ln.startswith("MINIBATCHES")][-1].split()[1:]
  )
  assert 0 < one <= two < one + 0.01, (one, two)
  assert "FUSE_REFUSED True" in out.stdout


LORA_SCRIPT = textwrap.dedent("""
    import os
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from empo2_jax.defaults import get_config
    from empo2_jax.programs import aot
    from empo2_jax.train import settings
    import empo2_jax.programs.update_aot  # registers "train_step"
    c = get_config()
    base = dict(program="train_step", preset="tiny", topology="v4:2x2x1", batch=16, seq=96,
                num_microbatches=2, cost_probe=False, mesh="data=1,fsdp=-1,tensor=1",
                remat="full", compute_dtype="bfloat16", update=settings.update_config(c))
    for name, kw in (("full", dict(param_dtype="float32")),
                     ("lora", dict(param_dtype="bfloat16", lora_rank=16))):
        r = aot.compile_program(aot.AotRequest(**base, **kw))
        print("RESULT", name, r["chips"], r["devices"], r["hbm_gib"], r["argument_gib"])
""")


def test_lora_train_step_compiles_for_a_v4_8_as_its_vm_presents_it():
  """v4:2x2x1 is 4 megacore devices (one a chip, 32 GiB each), as a v4-8 VM runs them; the LoRA
  update's state (bf16 base + fp32 adapters and their AdamW moments) is far below the full one's
  (fp32 params + two moments)."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  out = subprocess.run(
    [sys.executable, "-c", LORA_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
    timeout=900,
  )  # fmt: skip
  assert out.returncode == 0, out.stderr[-3000:]
  rows = {
    ln.split()[1]: ln.split()[2:] for ln in out.stdout.splitlines() if ln.startswith("RESULT")
  }
  assert rows["full"][:3] == rows["lora"][:3] == ["4", "4", "32"]
  full, lora = float(rows["full"][3]), float(rows["lora"][3])
  # tiny: 8.9M params, 8.3M of them the (not adapted) embedding; fp32 x 3 -> bf16 + adapters
  assert lora < full / 4
