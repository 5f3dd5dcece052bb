"""Training data: corpora (stdlib sources, text files, uint16 token files) and per-peer batch sampling."""

from __future__ import annotations

from swarmtrain.app.data.corpus import Corpus, build_corpus, default_cache_dir, hash_split, stdlib_root
from swarmtrain.app.data.describe import describe_data
from swarmtrain.app.data.sampler import BatchSampler, eval_batches

__all__ = [
    "Corpus",
    "build_corpus",
    "describe_data",
    "default_cache_dir",
    "hash_split",
    "stdlib_root",
    "BatchSampler",
    "eval_batches",
]
