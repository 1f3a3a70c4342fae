"""Never train a drafter on the eval prompts, nor on near copies of them.

A drafter learns to predict the target's answers. Trained on a prompt that is
an eval prompt in other words ("Write a Python function that can find the
n-th octagonal number." beside the eval's "Write a function to find the nth
octagonal number."), it has seen the target's answer to the eval prompt, and
the eval's tau says more about memory than about the drafter. Three checks,
each cheap enough to run over every training prompt:

* **equal**: the prompt is an eval turn;
* **short task**: both first lines are short (one-line coding or maths tasks),
  and after dropping the instruction lead ("Write a python function to"),
  articles and punctuation they are at least ``SIMILAR`` alike (difflib
  ratio);
* **entry point**: the prompt defines a function whose name an eval prompt
  defines, or one of ``PARAPHRASES``: stubs of an earlier synthetic round
  that restate a code benchmark's problem in other words (found by reading,
  since no word-level measure told them from honest neighbours).
"""
from __future__ import annotations

import bisect
import difflib
import json
import re
from collections import Counter
from pathlib import Path

SIMILAR = 0.8
SHORT = 160
# stub name -> the eval problem's entry point it restates
PARAPHRASES = {"running_max": "rolling_max", "mean_absolute_difference": "mean_absolute_deviation",
               "nested_depth": "parse_nested_parens", "swap_case": "flip_case",
               "caesar_shift": "decode_shift", "count_vowels": "vowels_count", "is_sorted": "is_sorted",
               "to_binary": "decimal_to_binary", "second_largest": "next_smallest"}

_LEAD = re.compile(r"^(write|implement|create) an? (python )?(function|program)( that can| that| to)?\s*")
_DEF = re.compile(r"\bdef ([A-Za-z_]\w*)\s*\(")


def _norm(first_line: str) -> str:
    s = _LEAD.sub("", first_line.lower().strip())
    s = s.replace("n-th", "nth").replace("k-th", "kth")
    s = re.sub(r"[^a-z0-9 ]", " ", s)
    return " ".join(w for w in s.split() if w not in {"a", "an", "the", "given"})


def _first_line(prompt: str) -> str:
    return prompt.strip().split("\n", 1)[0]


class EvalGuard:
    """The eval turns, indexed for the three checks."""

    def __init__(self, eval_turns: list[str]):
        self.turns = set(eval_turns)
        self.by_name: dict[str, str] = {}
        for t in eval_turns:
            for n in _DEF.findall(t):
                self.by_name.setdefault(n, t)
        self.names = set(self.by_name) | set(PARAPHRASES)
        # a first line many eval turns share is an instruction ("Write a solution
        # to the following problem..."), not a task
        firsts = Counter(_first_line(t) for t in set(eval_turns))
        self.instructions = {ln for ln, n in firsts.items() if n >= 3}
        self.by_short: dict[str, str] = {}
        for t in eval_turns:
            ln = _first_line(t)
            if len(ln) <= SHORT and ln not in self.instructions and _norm(ln):
                self.by_short.setdefault(_norm(ln), t)
        self.short = sorted(self.by_short, key=len)
        self._lens = [len(e) for e in self.short]

    @classmethod
    def from_dir(cls, eval_dir: Path) -> "EvalGuard":
        turns = [t for f in sorted(Path(eval_dir).glob("*.jsonl"))
                 for line in f.read_text(encoding="utf-8").split("\n") if line.strip()
                 for t in json.loads(line)["turns"]]
        return cls(turns)

    def why(self, prompt: str) -> str | None:
        """None when the prompt may be trained on, else which check it fails."""
        m = self.match(prompt)
        return m[0] if m else None

    def match(self, prompt: str) -> tuple[str, str | None] | None:
        """(check failed, the eval turn it is near), or None. The turn is None
        for a listed paraphrase of a problem the eval sets do not hold."""
        if prompt in self.turns:
            return "equal", prompt
        names = _DEF.findall(prompt) if "def " in prompt else []
        for n in names:
            if n in self.names:
                return "entry point", self.by_name.get(n, self.by_name.get(PARAPHRASES.get(n, "")))
        first = _first_line(prompt)
        if len(first) <= SHORT and first not in self.instructions:
            n = _norm(first)
            sm = difflib.SequenceMatcher(None, "", n, autojunk=False)
            # ratio = 2 * matches / (len(a) + len(b)) >= SIMILAR needs the
            # shorter string to be at least SIMILAR / (2 - SIMILAR) of the longer
            r = SIMILAR / (2 - SIMILAR)
            lo, hi = bisect.bisect_left(self._lens, len(n) * r), bisect.bisect_right(self._lens, len(n) / r)
            for e in self.short[lo:hi]:
                sm.set_seq1(e)
                if sm.quick_ratio() >= SIMILAR and sm.ratio() >= SIMILAR:
                    return "short task", self.by_short[e]
        return None

    def near(self, prompt: str) -> bool:
        return self.match(prompt) is not None
