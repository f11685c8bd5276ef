"""Dotted paths into a config (ml_collections.ConfigDict or any nested mapping), and settings
dataclasses built from a config section by field name. A leaf module: no imports of ours.

    parent, key = lookup(config, "empo2.p_memory")   # parent[key] is the field
    cfg = by_name(UpdateConfig, config.optim, temperature=0.7)
"""

from __future__ import annotations

import dataclasses


class UnknownKey(KeyError):
  """A dotted path that names no field: `where` (the node, e.g. 'config.empo2'), `part` (the
  missing key) and `keys` (the node's keys)."""

  def __init__(self, path: str, where: str, part: str, keys: list):
    self.path, self.where, self.part, self.keys = path, where, part, keys
    super().__init__(f"{path!r}: {where} has no field {part!r}; valid keys: {', '.join(keys)}")

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


__all__ = ["UnknownKey", "lookup", "by_name"]
