"""The ScienceWorld JVM's py4j gateway requires its auth token (envs/scienceworld/env.py): the owner
drives it; a client on the same port without the token is refused."""

import pytest
from py4j.java_gateway import GatewayParameters, JavaGateway
from py4j.protocol import Py4JError

from empo2_jax.envs.scienceworld.env import ScienceWorldJvm


def test_gateway_needs_the_token():
  jvm = ScienceWorldJvm()
  try:
    server = jvm.new_server()  # the owner, with the token
    assert server is not None
    stranger = JavaGateway(gateway_parameters=GatewayParameters(port=jvm.port))
    try:
      with pytest.raises(Py4JError):
        stranger.jvm.java.lang.System.currentTimeMillis()
    finally:
      stranger.close()
    wrong = JavaGateway(gateway_parameters=GatewayParameters(port=jvm.port, auth_token="guess"))
    try:
      with pytest.raises(Py4JError):
        wrong.jvm.java.lang.System.currentTimeMillis()
    finally:
      wrong.close()
    assert jvm.new_server() is not None  # the owner's connection still works
  finally:
    jvm.close()
