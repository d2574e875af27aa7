"""OmegaConf resolvers that numdev's configs use; registered when numdev is imported (numdev.conf
is a subpackage, so every way of composing a numdev config registers them first).

- `${numdev_run_id:}`: a token fixed for the life of this process, unique among processes started
  in the same second (process id + random bits). conf/hydra/default.yaml appends it to the
  one-second time stamp of default run directories, so processes started together never share one.
"""

from __future__ import annotations

import os
import secrets

from omegaconf import OmegaConf

RUN_ID = f"{os.getpid()}{secrets.token_hex(2)}"


def register() -> None:
    if not OmegaConf.has_resolver("numdev_run_id"):
        OmegaConf.register_new_resolver("numdev_run_id", lambda: RUN_ID)
