"""The HTTP protocol class of a ``serve --workers N`` worker, by import path.

Why a module of its own: uvicorn sends its configuration to each worker process by value, and
the edge's protocol class is built at run time around the HTTP limits
(process/http_protocol.py), which cannot be sent that way. Each worker imports this module
instead (uvicorn's ``http`` option accepts ``module:Class``), which builds the same class from
the same settings and bind address the parent validated (``FAIRGATE_WORKER_SPEC``, read back
through the worker's settings; see server/workers.py).
"""

from __future__ import annotations

from fairgate import environment
from fairgate.process.http_protocol import protocol_for
from fairgate.process.settings import Settings
from fairgate.server.workers import worker_limits

WorkerHttpProtocol = protocol_for(
    worker_limits(Settings.load(environment.snapshot(), strict=False))
)
