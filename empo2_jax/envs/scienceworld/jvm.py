"""The ScienceWorld JVM behind a py4j gateway, and reading Java string lists from it quickly.

Reading a `java.util.List<String>` through py4j the plain way (`[str(a) for a in jlist]`) costs
one socket round trip per element: ~30 ms for the ~800 valid actions of a typical state.
`ScienceWorldJvm.strings` has the JVM render the whole list into a StringBuilder (one call:
`append(list)` writes `list.toString()`, "[a, b, c]"), then reads that text in pieces and splits
it: about a dozen round trips, ~2 ms. The pieces stay under ~8 KiB each: a longer py4j reply
stalls ~40 ms on loopback TCP (py4j's Java side writes it in 8 KiB pieces and the second one waits
for the delayed ACK of the first: Nagle's algorithm). The elements are the same Java strings in
the same order; where the text cannot be split back unambiguously (an element holding ", ", a
surrogate pair that a piece could cut), the list is read element by element instead.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Iterator

from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from scienceworld.constants import BASEPATH, JAR_PATH

from empo2_jax.envs.base import DEFAULT_JAVA_OPTIONS

# `strings` reads the rendered list in pieces of this many UTF-16 units: py4j's reply is the piece
# escaped (a newline or backslash takes 2 bytes) and UTF-8 encoded, so ASCII text of any content
# stays under 8 KiB (non-ASCII text may stall, never garbles: see `split_rendered`).
PIECE_CHARS = 4000
SEPARATOR = ", "  # AbstractCollection.toString's


@contextlib.contextmanager
def env_var(name: str, value: str | None) -> Iterator[None]:
  """Sets an environment variable for the duration of the block (a child process inherits it)."""
  old = os.environ.get(name)
  if value is None:
    os.environ.pop(name, None)
  else:
    os.environ[name] = value
  try:
    yield
  finally:
    if old is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = old


def split_rendered(text: str, expected: int) -> list[str] | None:
  """The elements of a list rendered as `AbstractCollection.toString` does ("[a, b, c]"), or None
  when that text does not give exactly `expected` elements: an element holding the separator
  adds a part (", " cannot overlap itself, so every occurrence splits), and a text that is not
  bracketed is some other rendering."""
  if expected == 0:
    return []
  if not (text.startswith("[") and text.endswith("]")):
    return None
  parts = text[1:-1].split(SEPARATOR)
  return parts if len(parts) == expected else None


class ScienceWorldJvm:
  """One ScienceWorld JVM behind a py4j gateway, in its own process group (Ctrl-C spares it; the
  owner closes it). It exits by itself when its owner process dies (py4j --die-on-broken-pipe).

  The gateway listens on 127.0.0.1 and requires an auth token (py4j's --enable-auth: the JVM
  makes a random token at start and hands it to this process through its stdout pipe), so another
  local user or process cannot drive the JVM (a py4j gateway can call any Java method, e.g. run
  programs). The token stays inside this object's gateway."""

  def __init__(self, java_tool_options: str | None = DEFAULT_JAVA_OPTIONS):
    with env_var("JAVA_TOOL_OPTIONS", java_tool_options):
      port, token, proc = launch_gateway(
        classpath=JAR_PATH,
        die_on_exit=True,
        cwd=BASEPATH,
        return_proc=True,
        create_new_process_group=True,
        enable_auth=True,
      )
    self.process: subprocess.Popen = proc
    self.port = port
    self._gateway = JavaGateway(
      gateway_parameters=GatewayParameters(auto_field=True, port=port, auth_token=token),
      java_process=proc,
    )
    self._closed = False

  @property
  def pid(self) -> int:
    return self.process.pid

  def new_server(self):
    """A fresh simulator instance (a Java `PythonInterface`) inside this JVM."""
    self._check_open()
    return self._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()

  def strings(self, java_list) -> list[str]:
    """The elements of a Java `List<String>` as Python strings, in order: what
    `[str(a) for a in java_list]` returns, in a few round trips (module docstring)."""
    self._check_open()
    n = int(java_list.size())
    if n == 0:
      return []
    rendered = self._gateway.jvm.java.lang.StringBuilder().append(java_list)
    length = int(rendered.length())
    items = None
    if int(rendered.codePointCount(0, length)) == length:  # no surrogate pair a piece could cut
      text = "".join(
        str(rendered.substring(i, min(length, i + PIECE_CHARS)))
        for i in range(0, length, PIECE_CHARS)
      )
      items = split_rendered(text, n)
    return items if items is not None else [str(a) for a in java_list]

  def close(self, timeout_s: float = 10.0) -> None:
    if self._closed:
      return
    self._closed = True
    with contextlib.suppress(Exception):
      self._gateway.shutdown()
    if self.process.poll() is None:
      with contextlib.suppress(OSError, ValueError):  # a newline makes the gateway exit
        self.process.stdin.write(b"\n")
        self.process.stdin.flush()
      try:
        self.process.wait(timeout=timeout_s)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()

  def _check_open(self) -> None:
    if self._closed:
      raise RuntimeError("This ScienceWorld JVM is closed; start a new ScienceWorldJvm.")
