"""scripts/drafter/synth_prompts.py: the new drafter-training prompts are
seeded (the same files on every machine), of the promised kinds and sizes,
and share nothing with the eval sets (never train on eval prompts)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT.parent / "shared/datasets/eval"


def _load(name: str = "synth_prompts"):
    if str(ROOT / "scripts/drafter") not in sys.path:  # the scripts import each other
        sys.path.insert(0, str(ROOT / "scripts/drafter"))
    spec = importlib.util.spec_from_file_location(name, ROOT / f"scripts/drafter/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _read(path: Path) -> list[str]:
    return [json.loads(line)["turns"][0] for line in path.read_text(encoding="utf-8").split("\n")
            if line.strip()]


def _regenerated(n: int, files, tmp_path, monkeypatch):
    """Round n's script run again into tmp_path gives the committed files byte
    for byte (nothing in rounds 4-5 depends on the Python version); returns the
    script's module and the committed prompts by file."""
    if not EVAL.is_dir():
        pytest.skip(f"no eval prompt sets at {EVAL} (the round drops prompts near them)")
    mod = _load(f"synth_prompts{n}")
    monkeypatch.setattr("sys.argv", [f"synth_prompts{n}.py", str(tmp_path)])
    assert mod.main() == 0
    committed = ROOT / f"data/prompts-synth{n}"
    for name in files:
        assert (tmp_path / f"{name}.jsonl").read_bytes() == \
            (committed / f"{name}.jsonl").read_bytes(), name
    return mod, {name: _read(committed / f"{name}.jsonl") for name in files}


def _far_from_eval(prompts: list[str]) -> list[str]:
    """Assert that no prompt is equal or near an eval prompt (EvalGuard) nor holds
    a line of an eval problem; returns the eval prompts."""
    from collections import Counter

    from dspark.worker.training.decontam import EvalGuard
    guard = EvalGuard.from_dir(EVAL)
    assert not [t for t in prompts if guard.near(t)][:5]
    evals = [t for f in EVAL.glob("*.jsonl") for t in _read(f)]
    lines = Counter(ln.strip() for e in evals for ln in set(e.split("\n")))
    problem = {ln for ln, n in lines.items() if len(ln) >= 40 and n <= 3}
    assert not sorted(problem & {ln.strip() for t in prompts for ln in t.split("\n")})[:5]
    return evals


def test_synth_prompts_are_seeded_and_match_the_committed_files(tmp_path, monkeypatch):
    mod = _load()
    monkeypatch.setattr("sys.argv", ["synth_prompts.py", str(tmp_path)])
    assert mod.main() == 0
    sizes = {p.stem: len(_read(p)) for p in tmp_path.glob("*.jsonl")}
    assert sizes["synth-chat"] == 1400 and sizes["synth-math"] == 250
    assert sizes["synth-pyfunc"] >= 400 and sizes["synth-stubs"] >= 300
    # chat and function tasks are drawn before the stdlib stubs (whose count
    # depends on the Python version), so they must equal the committed files
    committed = ROOT / "data/prompts-synth"
    for name in ("synth-chat", "synth-pyfunc"):
        assert _read(tmp_path / f"{name}.jsonl") == _read(committed / f"{name}.jsonl")
    again = tmp_path / "again"
    monkeypatch.setattr("sys.argv", ["synth_prompts.py", str(again), "1"])
    mod.main()
    assert _read(again / "synth-chat.jsonl") != _read(tmp_path / "synth-chat.jsonl")


def test_synth_prompts_share_nothing_with_the_eval_sets():
    """Both rounds (synth_prompts.py and synth_prompts2.py)."""
    if not EVAL.is_dir():
        pytest.skip(f"no eval prompt sets at {EVAL}")
    evals = [t for f in EVAL.glob("*.jsonl") for t in _read(f)]
    synth = [t for d in ("prompts-synth", "prompts-synth2")
             for f in (ROOT / "data" / d).glob("*.jsonl") for t in _read(f)]
    assert len(synth) > 4000
    eval_set = set(evals)
    assert not [s for s in synth if s in eval_set]
    # no line of an eval problem inside a synthetic prompt (the stubs quote stdlib
    # docstrings): every eval line of 40+ characters but the shared instructions
    from collections import Counter
    lines = Counter(ln.strip() for e in evals for ln in set(e.split("\n")))
    problem = {ln for ln, n in lines.items() if len(ln) >= 40 and n <= 3}
    assert len(problem) > 1000
    synth_lines = {ln.strip() for s in synth for ln in s.split("\n")}
    assert not sorted(problem & synth_lines)[:5]


def test_second_round_is_seeded_and_matches_the_committed_files(tmp_path, monkeypatch):
    mod = _load("synth_prompts2")
    monkeypatch.setattr("sys.argv", ["synth_prompts2.py", str(tmp_path)])
    assert mod.main() == 0
    sizes = {p.stem: len(_read(p)) for p in tmp_path.glob("*.jsonl")}
    assert sizes["synth2-chat"] == 1000 and sizes["synth2-math"] == 250
    assert sizes["synth2-heval"] >= 300 and sizes["synth2-explain"] >= 150
    # everything but the stdlib sources (drawn last, version-dependent) is reproduced
    committed = ROOT / "data/prompts-synth2"
    for name in ("synth2-chat", "synth2-heval", "synth2-math"):
        assert _read(tmp_path / f"{name}.jsonl") == _read(committed / f"{name}.jsonl")
    # no overlap with the first round
    first = {t for f in (ROOT / "data/prompts-synth").glob("*.jsonl") for t in _read(f)}
    assert not first & {t for f in committed.glob("*.jsonl") for t in _read(f)}


def test_second_round_stub_examples_are_the_reference_answers():
    """The doctest examples in the typed stubs are what a correct solution
    returns (checked here against independent implementations of a few)."""
    mod = _load("synth_prompts2")
    by_name = {s[0]: s for s in mod.STUBS}
    assert len(by_name) == len(mod.STUBS) >= 30
    checks = {"sum_of_evens": ([1, 2, 3, 4, -6], 0), "running_max": ([3, 1, 4, 1, 5], [3, 3, 4, 4, 5]),
              "rotate_left": (([1, 2, 3, 4], 1), [2, 3, 4, 1]), "to_binary": (5, "101"),
              "collatz_steps": (6, 8), "nested_depth": ("(())(()())", 2),
              "caesar_shift": (("xyz", 2), "zab"), "closest_to_zero": ([-2, 2, 5], 2),
              "count_islands_1d": ([1, 1, 0, 1, 0, 0, 1], 3),
              "triangle_type": ((5, 5, 8), "isosceles")}
    for name, (args, want) in checks.items():
        args = args if isinstance(args, tuple) else (args,)
        assert by_name[name][4](*args) == want, name
    import random
    prompts = mod.heval_prompts(random.Random(3), 2)
    assert len(prompts) > len(mod.STUBS)
    p = next(p for p in prompts if "def sum_of_evens(" in p)
    assert "from typing import List" in p and ">>> sum_of_evens([" in p


def test_third_round_is_seeded_matches_the_committed_files_and_avoids_eval_problems(tmp_path, monkeypatch):
    if not EVAL.is_dir():
        pytest.skip(f"no eval prompt sets at {EVAL} (the round drops prompts near them)")
    mod = _load("synth_prompts3")
    monkeypatch.setattr("sys.argv", ["synth_prompts3.py", str(tmp_path)])
    assert mod.main() == 0
    committed = ROOT / "data/prompts-synth3"
    for name in ("synth3-chat", "synth3-heval", "synth3-func"):
        got = _read(tmp_path / f"{name}.jsonl")
        assert got == _read(committed / f"{name}.jsonl"), name
        assert len(got) >= 250, name
    earlier = {t for d in ("prompts-synth", "prompts-synth2")
               for f in (ROOT / "data" / d).glob("*.jsonl") for t in _read(f)}
    assert not earlier & {t for f in committed.glob("*.jsonl") for t in _read(f)}
    # no stub is named like a code benchmark's problem (they would restate it)
    import re
    eval_names = {n for f in EVAL.glob("*.jsonl") for t in _read(f) for n in re.findall(r"def (\w+)\(", t)}
    assert len(eval_names) > 100
    assert not {s[0] for s in mod.STUBS3} & eval_names


def test_third_round_stub_examples_are_the_reference_answers():
    mod = _load("synth_prompts3")
    by_name = {s[0]: s for s in mod.STUBS3}
    assert len(by_name) == len(mod.STUBS3) >= 30
    checks = {"transpose": ([[1, 2, 3], [4, 5, 6]], [[1, 4], [2, 5], [3, 6]]),
              "moving_average": (([1.0, 2.0, 4.0], 2), [1.5, 3.0]),
              "missing_number": ([0, 1, 3], 2), "snake_to_camel": ("max_node_count", "maxNodeCount"),
              "camel_to_snake": ("parseHttpRequest", "parse_http_request"),
              "most_common": ([3, 1, 3, 1, 2], 1), "longest_run": ([1, 1, 0, 0, 0, 1], 3),
              "seconds_to_clock": (3725, "01:02:05"), "clock_to_seconds": ("01:02:05", 3725),
              "merge_intervals": ([[5, 7], [1, 3], [2, 4]], [[1, 4], [5, 7]]),
              "max_profit": ([7, 1, 5, 3, 6, 4], 5), "first_unique_index": ("loveleetcode", 2),
              "is_leap_year": (1900, False), "percent_change": ((40.0, 50.0), 25.0),
              "count_pairs_with_difference": (([1, 3, 5, 3], 2), 4)}
    for name, (args, want) in checks.items():
        args = args if isinstance(args, tuple) else (args,)
        assert by_name[name][4](*args) == want, name
    import random
    r = random.Random(5)
    for name, *_, ref, make in mod.STUBS3:  # every input maker gives arguments its reference takes
        for _ in range(5):
            ref(*make(r))


ROUND4 = ("synth4-chat", "synth4-math", "synth4-code")


def test_fourth_round_is_seeded_matches_the_committed_files_and_is_far_from_eval(tmp_path, monkeypatch):
    mod, sets = _regenerated(4, ROUND4, tmp_path, monkeypatch)
    assert len(sets["synth4-chat"]) >= 1400 and len(sets["synth4-math"]) >= 170 and len(sets["synth4-code"]) >= 170
    r4 = [t for v in sets.values() for t in v]
    assert len(sets["synth4-chat"]) / len(r4) >= 0.75  # the round is aimed at chat
    assert max(len(t) for t in r4) < 600  # far below the generator's prompt limit
    earlier = {t for d in ("prompts-synth", "prompts-synth2", "prompts-synth3")
               for f in (ROOT / "data" / d).glob("*.jsonl") for t in _read(f)}
    assert not earlier & set(r4)
    # none equal or near an eval prompt, no line of an eval problem, no eval entry point
    import re

    evals = _far_from_eval(r4)
    eval_names = {n for t in evals for n in re.findall(r"def (\w+)\(", t)}
    names = {n for t in r4 for n in re.findall(r"def (\w+)\(", t)} | {s[0] for s in mod.EXAMPLES4}
    assert len(names) >= 8 and not names & eval_names


def test_fourth_round_word_lists_are_new_and_its_code_is_valid():
    """The round's topics, people, concepts and forms repeat none of rounds
    1-3's; its code asks hold Python that compiles; the examples of its
    "function shown by examples" asks are the reference answers."""
    import random
    import re
    mod = _load("synth_prompts4")
    earlier = [_load(n) for n in ("synth_prompts", "synth_prompts2", "synth_prompts3")]

    def items(v):
        return {x.lower() for x in (mod.split_list(v) if isinstance(v, str) else v) if x.strip()}
    old = set().union(*(items(getattr(m, k)) for m in earlier for k in (
        "TOPICS", "TOPICS2", "TOPICS3", "PEOPLE", "PEOPLE2", "PEOPLE3", "SCIENCE", "SCIENCE3", "CONCEPTS",
        "AUDIENCES", "AUDIENCES3", "FORMS", "CONSTRAINTS", "CONSTRAINTS3", "SENTENCES", "CODE_TASKS", "NAMES")
        if hasattr(m, k)))
    assert len(old) > 400
    for k in ("TOPICS4", "PEOPLE4", "CONCEPTS4", "AUDIENCES4", "FORMS4", "CONSTRAINTS4", "SENTENCES4", "NAMES4",
              "SCRIPTS4"):
        new = items(getattr(mod, k))
        assert len(new) >= 8 and not new & old, k
    code = _read(ROOT / "data/prompts-synth4/synth4-code.jsonl")
    blocks = [c for t in code for c in re.findall(r"```python\n(.*?)\n```", t, re.S)]
    assert len(blocks) > 40
    for c in blocks:
        compile(c, "<prompt>", "exec")
    by_name = {s[0]: s for s in mod.EXAMPLES4}
    checks = {"spread": ([3, -1, 4], 5), "next_weekday": (("Saturday", 2), "Monday"),
              "round_to_multiple": ((15, 10), 20)}
    for name, (args, want) in checks.items():
        args = args if isinstance(args, tuple) else (args,)
        assert by_name[name][4](*args) == want, name
    assert by_name["round_to_multiple"][4](12, 25) == 0
    r = random.Random(5)
    for name, *_, ref, make in mod.EXAMPLES4:  # every input maker gives arguments its reference takes
        for _ in range(5):
            ref(*make(r))
    # seeded: the same seed draws the same prompts, another seed others
    assert mod.chat4_prompts(random.Random(3), 200) == mod.chat4_prompts(random.Random(3), 200)
    assert mod.chat4_prompts(random.Random(1), 200) != mod.chat4_prompts(random.Random(3), 200)


ROUND5 = ("synth5-heval", "synth5-func", "synth5-chat", "synth5-math")


def test_fifth_round_is_seeded_matches_the_committed_files_and_is_far_from_eval(tmp_path, monkeypatch):
    mod, sets = _regenerated(5, ROUND5, tmp_path, monkeypatch)
    assert len(sets["synth5-heval"]) >= 650 and len(sets["synth5-func"]) >= 430
    assert len(sets["synth5-chat"]) >= 330 and len(sets["synth5-math"]) >= 280
    r5 = [t for v in sets.values() for t in v]
    earlier = {t for d in ("prompts-synth", "prompts-synth2", "prompts-synth3", "prompts-synth4")
               for f in (ROOT / "data" / d).glob("*.jsonl") for t in _read(f)}
    assert not earlier & set(r5)
    import re

    evals = _far_from_eval(r5)
    # new tasks: no eval entry point, no name of rounds 2-4's stubs, 40+ distinct stubs
    stubs = _load("synth_stubs5")
    names = {s[0] for s in stubs.STUBS5} | {s[0] for s in stubs.ASSERT5}
    eval_names = {n for t in evals for n in re.findall(r"def (\w+)\(", t)}
    old = ({s[0] for s in _load("synth_prompts2").STUBS} | {s[0] for s in _load("synth_prompts3").STUBS3}
           | {s[0] for s in _load("synth_prompts4").EXAMPLES4})
    assert len(stubs.STUBS5) >= 40 and len(names) == len(stubs.STUBS5) + len(stubs.ASSERT5)
    assert not names & (eval_names | old)
    assert {n for t in sets["synth5-heval"] for n in re.findall(r"def (\w+)\(", t)} == {s[0] for s in stubs.STUBS5}


def _check_round_examples(n: int, stubs, by_name: dict, checks: dict, min_seen: int) -> None:
    """Round n's references give the hand-worked answers in ``checks``, every
    input maker gives arguments its reference takes, and every example in the
    committed stubs and one-line asks (doctests, '==>', 'should return',
    assert lines) is what the reference returns (at least ``min_seen``)."""
    import random
    import re
    for name, (args, want) in checks.items():
        args = args if isinstance(args, tuple) else (args,)
        assert by_name[name](*args) == want, name
    r = random.Random(5)
    for s in getattr(stubs, f"STUBS{n}"):
        for _ in range(5):
            s[4](*s[5](r))
    pats = [r"\n\s*>>> (.*)\n\s*(.*)\n", r"\n\s*(\w+\(.*\)) ==> (.*)\n", r"\n\s*(\w+\(.*\)) should return (.*)\n",
            r"\nassert (\w+\(.*\)) == (.*)"]
    seen = 0
    for f in (f"synth{n}-heval", f"synth{n}-func"):
        for t in _read(ROOT / f"data/prompts-synth{n}/{f}.jsonl"):
            for pat in pats:
                for call, want in re.findall(pat, t.replace("\n", "\n\n")):
                    assert repr(eval(call, dict(by_name))) == want.strip(), call
                    seen += 1
    assert seen > min_seen


def _earlier_items(mod, earlier) -> tuple:
    """(items, old): a word list's normalised entries, and every entry of the
    earlier rounds' upper-case string lists."""
    def items(v):
        return {" ".join(x.lower().split()) for x in (mod.split_list(v) if isinstance(v, str) else v) if x.strip()}
    old = set().union(*(items(getattr(m, k)) for m in earlier for k in dir(m)
                        if k.isupper() and isinstance(getattr(m, k), (str, list))
                        and all(isinstance(x, str) for x in getattr(m, k))))
    return items, old


def test_fifth_round_examples_are_the_reference_answers_and_word_lists_are_new():
    """Every example output in the committed stubs (doctests, '==>', 'should
    return') and assert lines is what the reference returns; a few references
    are checked against hand-worked answers; the chat word lists repeat none
    of rounds 1-4's."""
    import random
    stubs = _load("synth_stubs5")
    by_name = {s[0]: s[4] for s in stubs.STUBS5} | {s[0]: s[2] for s in stubs.ASSERT5}
    checks = {"spiral_order": ([[1, 2, 3], [4, 5, 6], [7, 8, 9]], [1, 2, 3, 6, 9, 8, 7, 4, 5]),
              "compress_ranges": ([1, 2, 3, 5, 7, 8], ["1-3", "5", "7-8"]), "pascal_row": (4, [1, 4, 6, 4, 1]),
              "passes_luhn": ("79927398713", True), "minutes_between": (("23:30", "00:15"), 45),
              "day_of_year": ("2020-03-01", 61), "to_ordinal": (112, "112th"), "with_thousands": (-1234567, "-1,234,567"),
              "duration_seconds": ("1h30m5s", 5405), "human_bytes": (1536, "1.5 KB"), "eval_postfix": (["3", "4", "+", "2", "*"], 14),
              "dense_rank": ([50, 70, 50, 90], [3, 2, 3, 1]), "next_greater": ([4, 5, 2, 25], [5, 25, 25, -1]),
              "digital_root": (493193, 2), "sum_of_multiples": ((10, [3, 5]), 23), "majority_element": ([1, 2, 1, 3], None),
              "days_in_month": ((2024, 2), 29), "wait_times": ([3, 1, 2], [0, 3, 4]),
              "apply_stack_ops": (["push 1", "pop", "pop", "push 4"], [4])}
    _check_round_examples(5, stubs, by_name, checks, 1000)
    # the chat word lists are new
    mod = _load("synth_prompts5")
    earlier = [_load(n) for n in ("synth_prompts", "synth_prompts2", "synth_prompts3", "synth_prompts4")]
    items, old = _earlier_items(mod, earlier)
    assert len(old) > 600
    for k in ("TOPICS5", "PEOPLE5", "AUDIENCES5", "ASKS5", "PLANS5", "NAMES5"):
        new = items(getattr(mod, k))
        assert len(new) >= 8 and not new & old, (k, new & old)
    assert mod.chat5_prompts(random.Random(3), 100) == mod.chat5_prompts(random.Random(3), 100)
    assert mod.math5_prompts(random.Random(1), 100) != mod.math5_prompts(random.Random(3), 100)


ROUND6 = ("synth6-chat", "synth6-heval", "synth6-func", "synth6-math")


def test_sixth_round_is_seeded_matches_the_committed_files_and_is_far_from_eval(tmp_path, monkeypatch):
    mod, sets = _regenerated(6, ROUND6, tmp_path, monkeypatch)
    sizes = {k: len(v) for k, v in sets.items()}
    assert sizes["synth6-chat"] >= 780 and sizes["synth6-heval"] >= 430
    assert sizes["synth6-func"] >= 250 and sizes["synth6-math"] >= 250
    r6 = [t for v in sets.values() for t in v]
    assert 1700 <= len(r6) <= 1900
    assert sizes["synth6-chat"] / len(r6) >= 0.4  # the round is aimed at chat, then at stubs
    assert sizes["synth6-heval"] / len(r6) >= 0.22
    earlier = {t for d in ("prompts-synth", "prompts-synth2", "prompts-synth3", "prompts-synth4", "prompts-synth5")
               for f in (ROOT / "data" / d).glob("*.jsonl") for t in _read(f)}
    assert not earlier & set(r6)
    import re

    evals = _far_from_eval(r6)
    # new tasks: no eval entry point, no name of rounds 2-5's stubs, 40+ distinct stubs
    stubs = _load("synth_stubs6")
    names = {s[0] for s in stubs.STUBS6} | {s[0] for s in stubs.ASSERT6}
    eval_names = {n for t in evals for n in re.findall(r"def (\w+)\(", t)}
    s5 = _load("synth_stubs5")
    old = ({s[0] for s in _load("synth_prompts2").STUBS} | {s[0] for s in _load("synth_prompts3").STUBS3}
           | {s[0] for s in _load("synth_prompts4").EXAMPLES4} | {s[0] for s in s5.STUBS5} | {s[0] for s in s5.ASSERT5})
    assert len(stubs.STUBS6) >= 40 and len(names) == len(stubs.STUBS6) + len(stubs.ASSERT6)
    assert not names & (eval_names | old)
    assert {n for t in sets["synth6-heval"] for n in re.findall(r"def (\w+)\(", t)} == {s[0] for s in stubs.STUBS6}
    # every stub's code block compiles (a signature and a docstring)
    for t in sets["synth6-heval"]:
        code = re.search(r"```python\n(.*?)\n```", t, re.S)
        compile((code.group(1) if code else t) + "    pass\n", "<stub>", "exec")
    # another seed draws other prompts
    again = tmp_path / "again"
    monkeypatch.setattr("sys.argv", ["synth_prompts6.py", str(again), "1"])
    assert mod.main() == 0
    assert _read(again / "synth6-chat.jsonl") != sets["synth6-chat"]


def test_sixth_round_examples_are_the_reference_answers_and_word_lists_are_new():
    """Every example output in the committed stubs (doctests, '==>', 'should
    return') and assert lines is what the reference returns; a few references
    are checked against hand-worked answers; the chat word lists and templates
    repeat none of rounds 1-5's, nor do the one-line function tasks."""
    import random
    stubs = _load("synth_stubs6")
    by_name = {s[0]: s[4] for s in stubs.STUBS6} | {s[0]: s[2] for s in stubs.ASSERT6}
    checks = {"blackjack_total": (["A", "K", "A"], 12), "scrabble_score": ("quiz", 22),
              "rps_winner": (("paper", "scissors"), "second"),
              "tic_tac_toe_winner": (["XO.", "OXO", "..X"], "X"),
              "free_slots": (([(10, 12), (9, 11), (14, 15)], 8, 18), [(8, 9), (12, 14), (15, 18)]),
              "count_overlaps": ([(1, 3), (3, 5), (2, 4)], 2), "common_suffix": (["singing", "ring", "bring"], "ing"),
              "is_harshad": (18, True), "is_automorphic": (76, True), "abundant_below": (25, [12, 18, 20, 24]),
              "kaprekar_steps": (3524, 3), "closest_to_noon": (["11:00", "13:00", "09:00"], "11:00"),
              "fewest_notes": ((68, [50, 20, 10, 5, 2, 1]), {50: 1, 10: 1, 5: 1, 2: 1, 1: 1}),
              "format_price": ((-1234.5, "$"), "-$1,234.50"), "is_full_house": ([2, 3, 2, 3, 2], True),
              "first_difference": (("abc", "abcd"), 3), "center_text": (("ab", 5, "*"), "*ab**"),
              "truncate_words": (("one two three", 9), "one two..."), "slugify": ("  Hello, World!  ", "hello-world"),
              "anagram_groups": (["rat", "art", "elbow", "tar", "below"], [["rat", "art", "tar"], ["elbow", "below"]]),
              "count_inversions": ([3, 1, 2], 2), "local_minima": ([[5, 1, 5], [2, 6, 0]], [(0, 1), (1, 0), (1, 2)]),
              "parking_fee": (91, 4), "shipping_cost": (2.1, 10.0), "is_one_edit": (("walnut", "walnuts"), True),
              "column_number": ("AB", 28), "column_label": (703, "AAA"), "expand_ranges": ("1-3,7", [1, 2, 3, 7]),
              "to_morse": ("sos", "... --- ..."), "change_ways": ((5, [1, 2, 5]), 4),
              "nth_weekday_date": ((2024, 11, "Thursday", 4), "2024-11-28"), "add_days": (("2024-02-27", 3), "2024-03-01"),
              "top_words": (("b a b c a b", 2), ["b", "a"]), "seconds_until_midnight": ("23:59:00", 60),
              "minutes_to_clock": (125, "2:05")}
    assert by_name["fill_orders"]({"pens": 3}, [("pens", 2), ("pens", 2), ("pens", 1)]) == {"pens": 0}
    _check_round_examples(6, stubs, by_name, checks, 700)
    # the chat word lists and templates, and the function tasks, are new
    mod = _load("synth_prompts6")
    earlier = [_load(n) for n in ("synth_prompts", "synth_prompts2", "synth_prompts3", "synth_prompts4",
                                  "synth_prompts5")]
    items, old = _earlier_items(mod, earlier)
    assert len(old) > 1000
    for k in ("TOPICS6", "PEOPLE6", "AUDIENCES6", "GENRES6", "CONCEPTS6", "ADVICE6", "WHATIF6", "DECISIONS6",
              "DRAFTS6", "SCENES6", "NAMES6", "CONSTRAINTS6", "CHAT6"):
        new = items(getattr(mod, k))
        assert len(new) >= 8 and not new & old, (k, new & old)
    old_tasks = {" ".join(t.lower().split()) for m in earlier for k in dir(m) if k.startswith("FUNC")
                 and isinstance(getattr(m, k), dict) for t in m.expand(getattr(m, k))}
    new_tasks = {" ".join(t.lower().split()) for t in mod.expand(mod.FUNC6)}
    assert len(old_tasks) > 500 and len(new_tasks) >= 100 and not new_tasks & old_tasks
    assert mod.chat6_prompts(random.Random(3), 100) == mod.chat6_prompts(random.Random(3), 100)
    assert mod.math6_prompts(random.Random(1), 100) != mod.math6_prompts(random.Random(3), 100)
