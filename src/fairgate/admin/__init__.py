"""The admin API (``/api/...``) and the dashboard's handler.

One module per resource family (keys and connections in ``resources``, pools, combos and their
statistics, OAuth logins, resilience state, the test clock), their request and answer models in
``models``, the routes assembled in ``api``. It reads and changes the gateway's state through
``fairgate.process`` and the metadata repositories; the request path never imports it.
"""
