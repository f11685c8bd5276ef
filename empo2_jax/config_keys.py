"""Dotted paths into a config (ml_collections.ConfigDict or any nested mapping), and settings
dataclasses built from a config section by field name. A leaf module: no imports of ours.

    parent, key = lookup(config, "empo2.p_memory")   # parent[key] is the field
    cfg = by_name(UpdateConfig, config.optim, temperature=0.7)
"""

from __future__ import annotations

import dataclasses


# Config keys that were renamed (old dotted path -> new): an old key is refused with the new name
# (docs/architecture.md, "Names").
RENAMED = {
  "optim.old_logprobs": "optim.old_logp_source",
  "rollout.rows_per_iter": "rollout.variations_per_iter",
  "env.num_train_rows": "env.num_train_variations",
  "env.num_test_rows": "env.num_test_variations",
}


class UnknownKey(KeyError):
  """A dotted path that names no field: `where` (the node, e.g. 'config.empo2'), `part` (the
  missing key), `keys` (the node's keys) and `renamed_to` (the key's new path where it was
  renamed, RENAMED; else None)."""

  def __init__(self, path: str, where: str, part: str, keys: list):
    self.path, self.where, self.part, self.keys = path, where, part, keys
    self.renamed_to = RENAMED.get(path)
    if self.renamed_to:
      msg = f"{path!r} was renamed: use {self.renamed_to!r}"
    else:
      msg = f"{path!r}: {where} has no field {part!r}; valid keys: {', '.join(keys)}"
    super().__init__(msg)

  def __str__(self) -> str:  # KeyError's would quote the message
    return self.args[0]


def lookup(config, path: str):
  """(parent node, last key) of the dotted `path`; UnknownKey naming the valid keys."""
  parts = path.split(".")
  node = config
  for i, part in enumerate(parts):
    keys = list(node.keys()) if hasattr(node, "keys") else []
    if part not in keys:
      raise UnknownKey(path, "config" + "".join(f".{p}" for p in parts[:i]), part, keys)
    if i == len(parts) - 1:
      return node, part
    node = node[part]


def by_name(cls, section, **given):
  """A settings dataclass `cls` built by name: the config `section`'s keys that name one of its
  fields, under the same name, then `given` (fields the section does not hold, or values derived
  from it)."""
  fields = {f.name for f in dataclasses.fields(cls)}
  return cls(**{**{k: section[k] for k in section.keys() if k in fields}, **given})


__all__ = ["RENAMED", "UnknownKey", "lookup", "by_name"]
