"""Tensor codecs: pure math, no network (DESIGN.md section 3)."""
