"""Drafter training data, part 1b: existing text for prefill-mode distillation.

Self-generated answers cost a decode step per token (~90 tok/s on two CPU
cores). Prefill-mode distillation runs the target over text that is already on
the machine, one forward per chunk (~5-7x more labelled tokens per CPU second),
and trains the drafter on the TARGET's own next-token distributions and argmax
there (never the text's next token): the labels are what the target would say
after that prefix, which is what a drafter has to predict.

Sources (all present on any machine that runs this project; recorded by name in
the training card, never the eval sets):

* ``train-prompts``: every turn of ../shared/datasets/train/*.jsonl whose prompt
  id is in the training split (prose, maths, code tasks);
* ``python-stdlib``: the running Python's standard library sources (code with
  docstrings), test suites excluded;
* ``package-docs``: the long descriptions (README markdown) in the METADATA of
  the installed Python packages (technical prose).

Each document is tokenized (no chat template) and cut into pieces of at most
``seq_len`` tokens; the first ``context_len`` tokens of a piece are context
only (no anchors there, so every anchor has some context), the rest is the
labelled region. Records have the selfgen shape ``{"id", "split", "prompt_ids",
"output_ids"}`` with ``prompt_ids`` = the context part, so the trainer treats
both kinds alike.
"""
from __future__ import annotations

import json
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from .selfgen import split_of

SOURCES = ("train-prompts", "python-stdlib", "package-docs")
_SKIP_DIRS = {"test", "tests", "idlelib", "turtledemo", "site-packages", "__pycache__",
              "lib2to3", "ensurepip", "tkinter"}


def _train_prompt_docs(train_dir: Path) -> Iterator[tuple[str, str]]:
    for f in sorted(Path(train_dir).glob("*.jsonl")):
        for i, line in enumerate(f.read_text(encoding="utf-8").split("\n")):
            if not line.strip():
                continue
            pid = f"{f.stem}:{i}"
            if split_of(pid) != "train":  # held-out prompts stay unseen
                continue
            for j, turn in enumerate(json.loads(line).get("turns", [])):
                if isinstance(turn, str) and turn.strip():
                    yield f"{pid}:{j}", turn


def _stdlib_docs() -> Iterator[tuple[str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if not _SKIP_DIRS & set(p.relative_to(root).parts[:-1]))
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            yield str(p.relative_to(root)), text


def _package_docs() -> Iterator[tuple[str, str]]:
    purelib = Path(sysconfig.get_paths()["purelib"])
    for meta in sorted(purelib.glob("*.dist-info/METADATA")):
        try:
            text = meta.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        _, _, body = text.partition("\n\n")  # headers, blank line, long description
        if len(body.strip()) > 200:
            yield meta.parent.name, body


def documents(source: str, train_dir: Path) -> Iterator[tuple[str, str]]:
    if source == "train-prompts":
        return _train_prompt_docs(train_dir)
    if source == "python-stdlib":
        return _stdlib_docs()
    if source == "package-docs":
        return _package_docs()
    raise ValueError(f"unknown text source {source!r} (known: {', '.join(SOURCES)})")


def text_records(tokenizer, train_dir: Path, tokens_per_source: dict[str, int],
                 seq_len: int = 512, context_len: int = 32, seed: int = 0) -> list[dict]:
    """Pieces of text from each source, up to its token budget.

    tokenizer: a ``tokenizers.Tokenizer``. Documents are taken in a seeded random
    order (so a budget samples the whole source, not its first files).
    """
    if not 0 < context_len < seq_len - 1:
        raise ValueError(f"text_records: need 0 < context_len={context_len} < "
                         f"seq_len-1={seq_len - 1}")
    out: list[dict] = []
    for source, budget in tokens_per_source.items():
        docs = list(documents(source, train_dir))
        random.Random(f"{seed}:{source}").shuffle(docs)
        used = 0
        for name, text in docs:
            if used >= budget:
                break
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            for s in range(0, len(ids), seq_len):
                piece = ids[s:s + seq_len]
                if len(piece) < context_len + 2 or used >= budget:
                    break
                out.append({"id": f"text:{source}:{name}:{s}", "split": "train",
                            "source": source, "prompt_ids": piece[:context_len],
                            "output_ids": piece[context_len:]})
                used += len(piece) - context_len
    return out
