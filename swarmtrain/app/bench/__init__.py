"""Benchmark harnesses the ``bench`` command drives: the in-process strategy harness and grid."""
