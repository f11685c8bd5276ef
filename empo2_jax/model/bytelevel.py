"""GPT-2's byte-level alphabet, shared by the tokenizers built here (tokenizer.py from Qwen2.5's
ranks, gguf.py from a GGUF file's vocabulary)."""

from __future__ import annotations


def byte_to_unicode() -> dict[int, str]:
  """GPT-2's reversible byte -> printable-character map used by byte-level BPE."""
  printable = (
    list(range(ord("!"), ord("~") + 1))
    + list(range(ord("¡"), ord("¬") + 1))
    + list(range(ord("®"), ord("ÿ") + 1))
  )
  table, extra = {}, 0
  for b in range(256):
    if b in printable:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return table
