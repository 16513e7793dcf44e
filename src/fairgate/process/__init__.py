"""What one gateway process holds and how it speaks HTTP.

``state.Gateway`` (the metadata database, the quota engine and store, resilience, the snapshot,
the OAuth service), the HTTP edge (``edge``: host check, request ids, the ``/v1`` fast lane;
``http_protocol``: uvicorn's httptools protocol with head/body deadlines and connection caps;
``client_http``: the request and answer types of the fast lane; ``errors``), the edge's
settings (``http_settings``), the per-key rate guard and admin backoff (``guards``), logs,
metrics and tracing. The request path and the admin API stand on it; the process assembly
(``fairgate.server``) stands on all three.
"""
