"""The HTTP protocol class of a ``serve --workers N`` worker, by import path.

Why a module of its own: uvicorn sends its configuration to each worker process by value, and
the edge's protocol class is built at run time around the HTTP limits
(process/http_protocol.py), which cannot be sent that way. Each worker imports this module
instead (uvicorn's ``http`` option accepts ``module:Class``), which builds the same class from
the same environment and bind address the parent validated (``FAIRGATE_WORKER_SPEC``, see
server/workers.py).
"""

from __future__ import annotations

import orjson

from fairgate import environment
from fairgate.process.http_protocol import protocol_for
from fairgate.process.http_settings import HttpSettings
from fairgate.server.workers import WORKER_SPEC_ENV

_env = environment.snapshot()
WorkerHttpProtocol = protocol_for(
    HttpSettings.from_env(_env, orjson.loads(_env[WORKER_SPEC_ENV])["bind"])
)
