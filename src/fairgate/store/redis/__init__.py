"""The Redis quota store (one server or a Cluster): the store and its Lua scripts (``store``;
the scripts live in ``fairgate/store/lua``), the pipelined script lane of the hot path
(``lane``) and concurrency slots shared between replicas (``slots``)."""
