"""Before a launch script touches a gs:// path: can it be reached at all?

    check_gcs_access(workdir, "--workdir")    # cli.UserError (one line, exit 2) when it cannot

Without Google credentials gcsfs does not fail: it falls back to anonymous access, and then every
request is refused (403) or, off Google's network, retried for minutes before a traceback. This
check says at once what is missing: the gcsfs package (empo2_jax/remote.py's check) or the
credentials. It asks what gcsfs asks first (google.auth's Application Default Credentials: the
GOOGLE_APPLICATION_CREDENTIALS key file, `gcloud auth application-default login`, or the metadata
server of a Google Cloud VM), and passes without asking when STORAGE_EMULATOR_HOST names a GCS
emulator (tests/core/test_gcs.py) or fsspec is configured with a gcs token. Local paths pass
untouched.
"""

from __future__ import annotations

import os

from empo2_jax import remote
from empo2_jax.errors import UserError

CREDENTIALS_HINT = (
  "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
  "service-account key file (a local GCS emulator: STORAGE_EMULATOR_HOST=http://HOST:PORT)"
)


def check_gcs_access(path, what: str = "path") -> None:
  """UserError when `path` is gs:// and gcsfs is missing or no credentials are found."""
  path = os.fspath(path)
  if not path.startswith("gs://"):
    return
  remote.check(path)  # gcsfs installed (it brings google-auth)
  if os.environ.get("STORAGE_EMULATOR_HOST"):
    return
  import fsspec
  import google.auth
  from google.auth import exceptions

  if (fsspec.config.conf.get("gcs") or {}).get("token"):
    return  # gcsfs is given its token by fsspec's configuration
  try:
    google.auth.default()
  except exceptions.DefaultCredentialsError as e:
    detail = str(e).splitlines()[0].split(". To set up")[0].rstrip(".")  # google's first words
    what = f"{what} is on gs:// but no Google Cloud credentials were found"
    if "default credentials were not found" not in detail:  # e.g. a key file that is not there
      what += f": {detail}"
    raise UserError(what, path, CREDENTIALS_HINT) from e


__all__ = ["check_gcs_access", "CREDENTIALS_HINT"]
