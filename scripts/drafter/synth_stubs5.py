"""The code tasks of the fifth prompt round (synth_prompts5.py): typed stubs in
a code benchmark's shape, and one-line asks with an assert line, whose example
outputs are computed by this file's reference implementations (never typed by
hand). None restates a task of rounds 2-3's stub lists or a code benchmark's
problem (tests/worker/test_synth_prompts.py checks the names).
"""
from __future__ import annotations

import datetime
import random
import textwrap

from synth_prompts2 import _ints

WORDS5 = "lamp grape kiwi oak pebble canyon ember quill harbor violet maple jade onion tulip echo".split()
DAYS5 = ["2019-02-28", "2020-02-29", "2021-07-04", "2023-12-31", "2024-03-01", "2022-10-15", "2000-01-01"]


def _ws(r, lo=2, hi=5):
    return [r.choice(WORDS5) for _ in range(r.randint(lo, hi))]


def _grid(r, rows=None, cols=None, hi=9):
    rows = rows or r.randint(2, 3)
    cols = cols or r.randint(2, 4)
    return [[r.randint(0, hi) for _ in range(cols)] for _ in range(rows)]


def _spiral(m):
    m, out = [row[:] for row in m], []
    while m:
        out += m.pop(0)
        m = [list(c) for c in zip(*m)][::-1]
    return out


def _ranges(xs):
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return out


def _luhn(s):
    ds = [int(c) for c in s[::-1]]
    return sum(d if i % 2 == 0 else (2 * d - 9 if d > 4 else 2 * d) for i, d in enumerate(ds)) % 10 == 0


def _card(r):
    body = [r.randint(0, 9) for _ in range(r.randint(5, 9))]
    s = "".join(map(str, body))
    check = next(c for c in range(10) if _luhn(s + str(c)))
    return s + str((check + (r.random() < 0.4)) % 10)


def _hhmm(r):
    return f"{r.randint(0, 23):02d}:{r.choice([0, 5, 15, 30, 45, 50]):02d}"


def _minutes(a, b):
    (h1, m1), (h2, m2) = (map(int, a.split(":")), map(int, b.split(":")))
    return (h2 * 60 + m2 - h1 * 60 - m1) % 1440


def _title_except(text, minor):
    ws = text.split()
    return " ".join(w if i and w in minor else w.capitalize() for i, w in enumerate(ws))


def _neighbors(g, i, j):
    return sum(g[a][b] for a in range(i - 1, i + 2) for b in range(j - 1, j + 2)
               if (a, b) != (i, j) and 0 <= a < len(g) and 0 <= b < len(g[0]))


def _nb_args(r):
    g = _grid(r, 3, 3)
    return g, r.randrange(3), r.randrange(3)


def _inc_run(xs):
    best = cur = 1
    for a, b in zip(xs, xs[1:]):
        cur = cur + 1 if b > a else 1
        best = max(best, cur)
    return best


def _digital_root(n):
    while n >= 10:
        n = sum(map(int, str(n)))
    return n


def _reach(edges, start):
    seen, todo = {start}, [start]
    while todo:
        u = todo.pop()
        for a, b in edges:
            for x, y in ((a, b), (b, a)):
                if x == u and y not in seen:
                    seen.add(y)
                    todo.append(y)
    return sorted(seen)


def _edges(r):
    return [tuple(r.sample(range(1, 7), 2)) for _ in range(r.randint(2, 4))]


def _ordinal(n):
    suf = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suf}"


def _duration(s):
    total, num = 0, ""
    for c in s:
        if c.isdigit():
            num += c
        else:
            total += int(num) * {"h": 3600, "m": 60, "s": 1}[c]
            num = ""
    return total


def _dur_arg(r):
    parts = [(r.randint(1, 9), u) for u in "hms" if r.random() < 0.6] or [(r.randint(1, 59), "m")]
    return "".join(f"{n}{u}" for n, u in parts)


def _human(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _perimeter(ps):
    return round(sum(((ps[i][0] - ps[i - 1][0]) ** 2 + (ps[i][1] - ps[i - 1][1]) ** 2) ** 0.5
                     for i in range(len(ps))), 2)


def _pts(r, k=None):
    return [(r.randint(-4, 6), r.randint(-4, 6)) for _ in range(k or r.randint(3, 4))]


def _stack(ops):
    st = []
    for op in ops:
        if op == "pop":
            if st:
                st.pop()
        else:
            st.append(int(op.split()[1]))
    return st


def _ops(r):
    return [r.choice(["pop", f"push {r.randint(1, 9)}", f"push {r.randint(1, 9)}"]) for _ in range(r.randint(3, 6))]


def _rpn(tokens):
    st = []
    for t in tokens:
        if t in "+-*":
            b, a = st.pop(), st.pop()
            st.append(a + b if t == "+" else a - b if t == "-" else a * b)
        else:
            st.append(int(t))
    return st[0]


def _rpn_arg(r):
    toks = [str(r.randint(1, 9))]
    for _ in range(r.randint(1, 3)):
        toks += [str(r.randint(1, 9)), r.choice("+-*")]
    return toks


def _username(s):
    return 3 <= len(s) <= 12 and s[0].isalpha() and all(c.isalnum() or c == "_" for c in s)


def _dense_rank(xs):
    order = sorted(set(xs), reverse=True)
    return [order.index(x) + 1 for x in xs]


def _majority(xs):
    m = max(set(xs), key=xs.count)
    return m if xs.count(m) * 2 > len(xs) else None


def _avg_by_key(pairs):
    out = {}
    for k, v in pairs:
        out.setdefault(k, []).append(v)
    return {k: round(sum(v) / len(v), 2) for k, v in out.items()}


# (name, params, return type, docstring, reference, input maker)
STUBS5 = [
    ("group_by_initial", "words: List[str]", "Dict[str, List[str]]",
     "Group the words by their first letter, keeping the words of each group in their original order.",
     lambda ws: {w[0]: [x for x in ws if x[0] == w[0]] for w in ws}, lambda r: (_ws(r, 3, 6),)),
    ("column_sums", "grid: List[List[int]]", "List[int]", "Return the sum of each column of a rectangular grid.",
     lambda g: [sum(c) for c in zip(*g)], lambda r: (_grid(r),)),
    ("spiral_order", "grid: List[List[int]]", "List[int]",
     "Return the values of the grid in spiral order: along the top row, down the right side, back along the "
     "bottom and up the left side, then inwards.", _spiral, lambda r: (_grid(r, r.randint(2, 3), 3),)),
    ("digit_frequencies", "n: int", "List[int]",
     "Return a list of ten counts: how many times each digit 0 to 9 occurs in the decimal form of n.",
     lambda n: [str(n).count(str(d)) for d in range(10)], lambda r: (r.randint(0, 10 ** r.randint(1, 6)),)),
    ("zero_pad", "numbers: List[int], width: int", "List[str]",
     "Write each number with leading zeros so that it is at least width characters long.",
     lambda xs, w: [str(x).zfill(w) for x in xs], lambda r: (_ints(r, 0, 500, 3), r.randint(2, 4))),
    ("previous_smaller", "numbers: List[int]", "List[Optional[int]]",
     "For each element, return the nearest element to its left that is smaller than it, or None if there is none.",
     lambda xs: [next((xs[j] for j in range(i - 1, -1, -1) if xs[j] < xs[i]), None) for i in range(len(xs))],
     lambda r: (_ints(r, 0, 9, 5),)),
    ("next_greater", "numbers: List[int]", "List[int]",
     "For each element, return the first element to its right that is greater than it, or -1 if there is none.",
     lambda xs: [next((y for y in xs[i + 1:] if y > x), -1) for i, x in enumerate(xs)], lambda r: (_ints(r, 0, 9, 5),)),
    ("window_maxima", "values: List[int], k: int", "List[int]",
     "Return the maximum of every window of k consecutive values, from left to right.",
     lambda xs, k: [max(xs[i:i + k]) for i in range(len(xs) - k + 1)], lambda r: (_ints(r, 0, 20, 6), r.randint(2, 3))),
    ("compress_ranges", "numbers: List[int]", "List[str]",
     "Given a sorted list of distinct integers, describe it as ranges: a run of consecutive numbers becomes "
     "'start-end' and a number on its own stays as it is.", _ranges,
     lambda r: (sorted(r.sample(range(1, 15), r.randint(3, 7))),)),
    ("pascal_row", "n: int", "List[int]", "Return row n of Pascal's triangle, where row 0 is [1].",
     lambda n: [__import__("math").comb(n, k) for k in range(n + 1)], lambda r: (r.randint(0, 7),)),
    ("passes_luhn", "digits: str", "bool",
     "Return True if the string of digits passes the Luhn checksum used by credit card numbers.",
     _luhn, lambda r: (_card(r),)),
    ("minutes_between", "start: str, end: str", "int",
     "Both times are 'HH:MM' on a 24-hour clock. Return the minutes from start to end, going past midnight "
     "if end is earlier than start.", _minutes, lambda r: (_hhmm(r), _hhmm(r))),
    ("day_of_year", "date: str", "int", "Return the day number within its year (1 to 366) of a date 'YYYY-MM-DD'.",
     lambda d: datetime.date.fromisoformat(d).timetuple().tm_yday, lambda r: (r.choice(DAYS5),)),
    ("weekday_of", "date: str", "str", "Return the English name of the weekday of a date given as 'YYYY-MM-DD'.",
     lambda d: datetime.date.fromisoformat(d).strftime("%A"), lambda r: (r.choice(DAYS5),)),
    ("headline_case", "text: str, minor: List[str]", "str",
     "Capitalize every word of the text except the minor words, which stay as they are unless they come first.",
     _title_except, lambda r: (" ".join(r.sample(["the", "of", "and", "a", "in"] + _ws(r, 3, 3), 5)), ["the", "of", "and", "a", "in"])),
    ("mask_card", "number: str", "str",
     "Hide all but the last four characters of a card number by replacing them with '*'.",
     lambda s: "*" * max(len(s) - 4, 0) + s[-4:], lambda r: (_card(r),)),
    ("parse_pairs", "text: str", "Dict[str, str]",
     "Parse a string of 'key=value' items separated by semicolons into a dictionary.",
     lambda s: dict(p.split("=", 1) for p in s.split(";") if p),
     lambda r: (";".join(f"{k}={r.randint(0, 99)}" for k in r.sample(["x", "mode", "size", "id", "user"], r.randint(1, 3))),)),
    ("bar_chart", "counts: List[int]", "List[str]",
     "Draw a text bar chart: one string per count, made of that many '#' characters.",
     lambda xs: ["#" * x for x in xs], lambda r: (_ints(r, 0, 6, 3),)),
    ("mirror_rows", "grid: List[List[int]]", "List[List[int]]", "Return the grid flipped left to right.",
     lambda g: [row[::-1] for row in g], lambda r: (_grid(r),)),
    ("neighbor_sum", "grid: List[List[int]], row: int, col: int", "int",
     "Return the sum of the up to eight cells that touch the cell at (row, col), diagonals included.",
     _neighbors, _nb_args),
    ("count_peaks", "values: List[int]", "int",
     "Count the elements that are strictly greater than both of their neighbors (the ends never count).",
     lambda xs: sum(xs[i - 1] < xs[i] > xs[i + 1] for i in range(1, len(xs) - 1)), lambda r: (_ints(r, 0, 9, 7),)),
    ("longest_rising_run", "values: List[int]", "int",
     "Return the length of the longest stretch of consecutive values that strictly increase.",
     _inc_run, lambda r: (_ints(r, 0, 9, 7),)),
    ("majority_element", "values: List[int]", "Optional[int]",
     "Return the value that occurs in more than half of the positions, or None if no value does.",
     _majority, lambda r: (r.choice([[2, 2, 1, 2], [1, 2, 3], [5, 5, 5, 1, 1], [4], [7, 7, 8, 8]]),)),
    ("sum_of_multiples", "limit: int, factors: List[int]", "int",
     "Return the sum of the positive integers below limit that are divisible by at least one of the factors.",
     lambda n, fs: sum(i for i in range(1, n) if any(i % f == 0 for f in fs)),
     lambda r: (r.randint(5, 30), sorted(r.sample([2, 3, 5, 7], 2)))),
    ("digital_root", "n: int", "int", "Add up the digits of n again and again until a single digit is left, and return it.",
     _digital_root, lambda r: (r.randint(0, 99999),)),
    ("is_isogram", "word: str", "bool", "Return True if no letter occurs more than once in the word, ignoring case.",
     lambda w: len(set(w.lower())) == len(w), lambda r: (r.choice(WORDS5 + ["Alpha", "dermatoglyphics", "Unique"]),)),
    ("vowel_positions", "word: str", "List[int]", "Return the indices of the vowels (a, e, i, o, u) in the word.",
     lambda w: [i for i, c in enumerate(w) if c in "aeiou"], lambda r: (r.choice(WORDS5),)),
    ("total_with_tax", "prices: List[float], rate: float", "float",
     "Return the total of the prices after adding a sales tax of rate percent, rounded to two decimals.",
     lambda ps, t: round(sum(ps) * (1 + t / 100), 2),
     lambda r: ([r.randint(100, 2000) / 100 for _ in range(r.randint(1, 3))], float(r.choice([5, 8, 10, 20])))),
    ("split_bill", "total: float, people: int, tip_percent: int", "float",
     "Return what each person pays when a bill plus a tip of tip_percent percent is split evenly, rounded to two decimals.",
     lambda t, n, p: round(t * (1 + p / 100) / n, 2), lambda r: (float(r.randint(20, 150)), r.randint(2, 6), r.choice([10, 15, 20]))),
    ("scale_recipe", "amounts: Dict[str, float], factor: float", "Dict[str, float]",
     "Multiply every ingredient amount by factor, rounding each result to one decimal.",
     lambda d, f: {k: round(v * f, 1) for k, v in d.items()},
     lambda r: ({k: float(r.randint(1, 8) * 25) for k in r.sample(["flour", "sugar", "butter", "milk"], 2)}, r.choice([0.5, 1.5, 2.0, 3.0]))),
    ("top_scorer", "scores: Dict[str, int]", "str",
     "Return the name with the highest score; if several share it, return the one that comes first alphabetically.",
     lambda d: min(d, key=lambda k: (-d[k], k)),
     lambda r: ({k: r.randint(5, 9) for k in r.sample(["ana", "ben", "cy", "dee", "eli"], 3)},)),
    ("average_by_key", "pairs: List[Tuple[str, int]]", "Dict[str, float]",
     "Group the (key, value) pairs by key and return the average value of each key, rounded to two decimals.",
     _avg_by_key, lambda r: ([(r.choice("ab"), r.randint(1, 9)) for _ in range(r.randint(2, 5))],)),
    ("wrap_words", "text: str, width: int", "List[str]",
     "Break the text into lines of at most width characters without splitting words (no word is longer than width).",
     lambda s, w: textwrap.wrap(s, w), lambda r: (" ".join(_ws(r, 3, 6)), r.randint(7, 14))),
    ("is_arithmetic", "values: List[int]", "bool",
     "Return True if the differences between consecutive values are all the same (lists of fewer than three "
     "values always are).", lambda xs: len({b - a for a, b in zip(xs, xs[1:])}) <= 1,
     lambda r: ([r.randint(0, 5) + i * r.choice([2, 3]) for i in range(4)] if r.random() < 0.5 else _ints(r, 0, 9, 4),)),
    ("dense_rank", "scores: List[int]", "List[int]",
     "Rank each score, 1 being the highest; equal scores share a rank and the next rank follows without a gap.",
     _dense_rank, lambda r: (_ints(r, 1, 6, 5),)),
    ("adjacency_lists", "edges: List[Tuple[int, int]]", "Dict[int, List[int]]",
     "Build the adjacency lists of an undirected graph: every node maps to its sorted neighbors.",
     lambda es: {u: sorted({b for a, b in es if a == u} | {a for a, b in es if b == u}) for u in sorted({x for e in es for x in e})},
     lambda r: (_edges(r),)),
    ("reachable_nodes", "edges: List[Tuple[int, int]], start: int", "List[int]",
     "Return, sorted, every node that can be reached from start in an undirected graph, start included.",
     _reach, lambda r: (_edges(r), r.randint(1, 6))),
    ("to_ordinal", "n: int", "str", "Return the English ordinal of a positive integer, such as '1st', '12th' or '23rd'.",
     _ordinal, lambda r: (r.choice([1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111, 112, 123]),)),
    ("with_thousands", "n: int", "str", "Write the integer with a comma between each group of three digits.",
     lambda n: f"{n:,}", lambda r: (r.choice([-1, 1]) * r.randint(0, 10 ** r.randint(2, 8)),)),
    ("duration_seconds", "text: str", "int",
     "Convert a duration such as '1h30m' or '2m5s' (hours, minutes and seconds, each optional) to seconds.",
     _duration, lambda r: (_dur_arg(r),)),
    ("human_bytes", "size: int", "str",
     "Describe a number of bytes for people: below 1024 as 'N B', otherwise in KB, MB or GB with one decimal.",
     _human, lambda r: (r.choice([512, 1024, 1536, 10 ** 6, 5 * 2 ** 30, 123456789, 2047]),)),
    ("polygon_perimeter", "points: List[Tuple[int, int]]", "float",
     "Return the perimeter of the closed polygon through the points in order, rounded to two decimals.",
     _perimeter, lambda r: (_pts(r),)),
    ("bounding_box", "points: List[Tuple[int, int]]", "Tuple[int, int, int, int]",
     "Return (min_x, min_y, max_x, max_y) of the smallest axis-aligned box holding every point.",
     lambda ps: (min(p[0] for p in ps), min(p[1] for p in ps), max(p[0] for p in ps), max(p[1] for p in ps)),
     lambda r: (_pts(r),)),
    ("checkerboard", "n: int", "List[str]",
     "Return n rows of n characters alternating '#' and '.', starting with '#' in the top-left corner.",
     lambda n: ["".join("#."[(i + j) % 2] for j in range(n)) for i in range(n)], lambda r: (r.randint(1, 4),)),
    ("weighted_average", "values: List[float], weights: List[float]", "float",
     "Return the average of the values weighted by the weights, rounded to two decimals.",
     lambda vs, ws: round(sum(v * w for v, w in zip(vs, ws)) / sum(ws), 2),
     lambda r: ([float(x) for x in _ints(r, 50, 100, 3)], [float(x) for x in _ints(r, 1, 4, 3)])),
    ("apply_stack_ops", "ops: List[str]", "List[int]",
     "Start from an empty stack and apply each operation, 'push X' or 'pop' (a pop on an empty stack does "
     "nothing). Return the stack from bottom to top.", _stack, lambda r: (_ops(r),)),
    ("eval_postfix", "tokens: List[str]", "int",
     "Evaluate an expression in reverse Polish notation whose tokens are integers and the operators +, - and *.",
     _rpn, lambda r: (_rpn_arg(r),)),
    ("valid_username", "name: str", "bool",
     "A username is valid when it has 3 to 12 characters, starts with a letter and holds only letters, digits "
     "and underscores. Return whether the name is valid.",
     _username, lambda r: (r.choice(["ab", "alice_99", "9lives", "x" * 13, "dev-ops", "Zed", "team_7_lead"]),)),
    ("alternating_sum", "values: List[int]", "int",
     "Return values[0] - values[1] + values[2] - values[3] + ... for the whole list.",
     lambda xs: sum(x if i % 2 == 0 else -x for i, x in enumerate(xs)), lambda r: (_ints(r, 0, 20),)),
    ("wait_times", "durations: List[int]", "List[int]",
     "Customers are served one after another; durations[i] is how long customer i takes. Return how long each "
     "customer waits before being served.", lambda ds: [sum(ds[:i]) for i in range(len(ds))], lambda r: (_ints(r, 1, 9, 4),)),
]


def examples(rng: random.Random, name: str, ref, make, k: int | None = None) -> list[tuple[str, str]]:
    """(call, repr of the reference's result) for 1-3 inputs drawn by ``make``."""
    out = []
    for _ in range(k or rng.randint(1, 3)):
        a = make(rng)
        out.append((f"{name}({', '.join(map(repr, a))})", repr(ref(*a))))
    return out


def _doc(rng: random.Random, params: str, ret: str, doc: str, ex: list[tuple[str, str]]) -> str:
    """A docstring in one of several styles (indented 4, with its quotes)."""
    style = rng.randrange(5)
    tests = "".join(f"    >>> {c}\n    {v}\n" for c, v in ex)
    if style == 0 or not ex and style in (1, 2):
        return f'    """ {doc}\n{tests}    """\n'
    if style == 1:
        return f'    """{doc}\n    For example:\n{tests}    """\n'
    if style == 2:
        lines = "".join(f"    {c} ==> {v}\n" for c, v in ex)
        return f'    """\n    {doc}\n\n    Example{"s" if len(ex) > 1 else ""}:\n{lines}    """\n'
    if style == 3:
        wrapped = "\n".join(textwrap.wrap(doc, 88, initial_indent="    ", subsequent_indent="    "))
        return f'    """\n{wrapped}\n\n' + "".join(f"    {c} should return {v}\n" for c, v in ex) + '    """\n'
    args = "".join(f"        {p.split(':')[0].strip()} ({p.split(':', 1)[1].strip()})\n" for p in _split_params(params))
    return (f'    """{doc}\n\n    Args:\n{args}\n    Returns:\n        {ret}\n' +
            (f"\n    Examples:\n{tests}" if ex else "") + '    """\n')


def _split_params(params: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for c in params:
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    return out + [cur]


STUB_LEADS5 = ["", "", "Complete the following function.", "Finish this Python code:",
               "Write a solution to the following problem and make sure that it passes the tests:",
               "Implement this function so that the examples in its docstring hold:"]


def heval5_prompts(rng: random.Random, n_per: int) -> list[str]:
    out = set()
    for name, params, ret, doc, ref, make in STUBS5:
        for _ in range(n_per):
            ex = examples(rng, name, ref, make) if rng.random() < 0.85 else []
            typing = sorted({t for t in ("List", "Dict", "Optional", "Tuple") if t in params + ret})
            head = f"from typing import {', '.join(typing)}\n\n\n" if typing else ""
            body = f"{head}def {name}({params}) -> {ret}:\n{_doc(rng, params, ret, doc, ex)}"
            lead = rng.choice(STUB_LEADS5)
            out.add(f"{lead}\n```python\n{body}\n```" if lead else body)
    return sorted(out)


# One-line asks with an MBPP-style test line: (name, what it does, reference, input maker).
ASSERT5 = [
    ("count_long_words", "count the words of a sentence that have more than four letters",
     lambda s: sum(len(w) > 4 for w in s.split()), lambda r: (" ".join(_ws(r, 3, 6)),)),
    ("middle_element", "return the middle element of a list of odd length",
     lambda xs: xs[len(xs) // 2], lambda r: (_ints(r, 0, 50, r.choice([3, 5, 7])),)),
    ("hours_and_minutes", "convert a number of minutes into a tuple of whole hours and remaining minutes",
     lambda m: divmod(m, 60), lambda r: (r.randint(0, 600),)),
    ("repeat_each", "repeat every character of a string k times",
     lambda s, k: "".join(c * k for c in s), lambda r: (r.choice(WORDS5), r.randint(2, 3))),
    ("sum_of_digit_squares", "return the sum of the squares of the digits of a non-negative integer",
     lambda n: sum(int(d) ** 2 for d in str(n)), lambda r: (r.randint(0, 9999),)),
    ("last_word_length", "return the length of the last word of a sentence",
     lambda s: len(s.split()[-1]), lambda r: (" ".join(_ws(r)),)),
    ("pad_to_even", "append a zero to a list of integers if its length is odd",
     lambda xs: xs + [0] * (len(xs) % 2), lambda r: (_ints(r, 1, 9),)),
    ("kelvin_to_celsius", "convert a temperature in Kelvin to Celsius, rounded to one decimal",
     lambda k: round(k - 273.15, 1), lambda r: (float(r.randint(200, 400)),)),
    ("count_rising_pairs", "count the positions where a list's element is larger than the one before it",
     lambda xs: sum(b > a for a, b in zip(xs, xs[1:])), lambda r: (_ints(r, 0, 9, 6),)),
    ("every_other_word", "return every other word of a sentence, starting with the first",
     lambda s: s.split()[::2], lambda r: (" ".join(_ws(r, 3, 6)),)),
    ("triangle_perimeter_from_points", "return the perimeter of the triangle with the three given corner points, "
     "rounded to two decimals", lambda a, b, c: _perimeter([a, b, c]), lambda r: tuple(_pts(r, 3))),
    ("days_in_month", "return the number of days in a given month of a given year",
     lambda y, m: (datetime.date(y + m // 12, m % 12 + 1, 1) - datetime.date(y, m, 1)).days,
     lambda r: (r.choice([1900, 2000, 2023, 2024]), r.randint(1, 12))),
]


def assert5_prompts(rng: random.Random, n: int) -> list[str]:
    out = set()
    leads = ["Write a function to", "Write a python function to"]
    while len(out) < n:
        name, what, ref, make = rng.choice(ASSERT5)
        tests = "\n".join(f"assert {c} == {v}" for c, v in examples(rng, name, ref, make, rng.randint(1, 3)))
        out.add(f"{rng.choice(leads)} {what}.\nYour code should pass these tests:\n\n{tests}")
    return sorted(out)
