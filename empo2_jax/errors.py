"""The error a user can fix: what went wrong, where, and what to do (empo2_jax/cli.py prints it as
one line). A leaf module: the launch scripts, preflight checks and I/O helpers raise it without
importing the command-line machinery."""

from __future__ import annotations


class UserError(Exception):
  """What went wrong, where (a file, a directory or a config key) and what to do about it."""

  def __init__(self, what: str, where: str, todo: str):
    super().__init__(what, where, todo)
    self.what, self.where, self.todo = what, where, todo

  def __str__(self) -> str:
    return f"{self.what} ({self.where}): {self.todo}"
