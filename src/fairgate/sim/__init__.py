"""``fairgate simulate``: replay a workload of many client keys against a pool and measure how
fairly and how fully each sharing policy used it, against the exact fair ideal (weighted
max-min; weighted dominant-resource-fair over several dimensions).

Pure parts (``scenario``, ``workload``, ``ideal``, ``fairness``) do no I/O; ``policies`` drives
the real :class:`~fairgate.quota.engine.QuotaEngine` on a real store with a manual clock;
``runner`` ties them together and ``report`` prints and draws the results.
"""
