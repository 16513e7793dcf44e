"""The process assembled: the ASGI application (``app``: the request path, the admin API and the
dashboard mounted on the process's edge) and ``serve --workers N`` (``workers``,
``worker_protocol``). The top floor below the CLI."""
