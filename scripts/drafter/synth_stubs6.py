"""The code tasks of the sixth prompt round (synth_prompts6.py): typed stubs in
a code benchmark's shape, and one-line asks with an assert line, on tasks no
earlier round has (games, schedules, money, text layout, spreadsheets,
calendars, number curiosities...). Their example outputs are computed by this
file's reference implementations, never typed by hand; the docstring styles
and the example drawing are round 5's (synth_stubs5.py). No name restates a
stub of rounds 2-5 or a code benchmark's entry point
(tests/worker/test_synth_prompts.py checks the names).
"""
from __future__ import annotations

import datetime
import math
import random
import re
from collections import Counter

from synth_prompts2 import _ints
from synth_stubs5 import _doc, examples

WORDS6 = "falcon pepper ribbon lantern copper meadow walnut cobalt saddle thistle garnet puzzle mirror cactus".split()
CARDS6 = ["2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K", "A"]
SCRABBLE6 = {c: v for letters, v in (("aeilnorstu", 1), ("dg", 2), ("bcmp", 3), ("fhvwy", 4), ("k", 5), ("jx", 8),
                                     ("qz", 10)) for c in letters}
BEATS6 = {"rock": "scissors", "paper": "rock", "scissors": "paper"}
MORSE6 = dict(zip("abcdefghijklmnopqrstuvwxyz", (
    ".- -... -.-. -.. . ..-. --. .... .. .--- -.- .-.. -- -. --- .--. --.- .-. ... - ..- ...- .-- -..- -.-- --..".split())))
LEVELS6 = {"INFO": ["started", "user logged in", "cache warmed"], "WARN": ["disk 80% full", "slow query"],
           "ERROR": ["timeout", "file not found"]}
ANAGRAMS6 = ["listen", "silent", "enlist", "stone", "notes", "onset", "rat", "tar", "art", "below", "elbow", "lemon"]
TITLES6 = ["Hello, World!", "  Ten Tips for Better Sleep  ", "Python 3.12: What's New?", "Rock & Roll Forever",
           "The A-Team returns", "100% Pure Orange Juice", "Why? Because!"]
WEEKDAYS6 = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _ws(r, lo=2, hi=5):
    return [r.choice(WORDS6) for _ in range(r.randint(lo, hi))]


def _blackjack(cards):
    total = sum(11 if c == "A" else 10 if c in {"J", "Q", "K"} else int(c) for c in cards)
    aces = cards.count("A")
    while total > 21 and aces:
        total, aces = total - 10, aces - 1
    return total


def _lines3(b):
    return b + ["".join(col) for col in zip(*b)] + ["".join(b[i][i] for i in range(3)),
                                                   "".join(b[i][2 - i] for i in range(3))]


def _ttt(b):
    lines = _lines3(b)
    return next((p for p in "XO" if p * 3 in lines), "")


def _board(r):
    while True:
        b = ["".join(r.choice("XO..") for _ in range(3)) for _ in range(3)]
        if sum(p * 3 in _lines3(b) for p in "XO") <= 1:
            return b


def _free(busy, start, end):
    out, cur = [], start
    for a, b in sorted(busy):
        if a > cur:
            out.append((cur, a))
        cur = max(cur, b)
    if cur < end:
        out.append((cur, end))
    return out


def _busy(r):
    out = []
    for _ in range(r.randint(1, 3)):
        a = r.randint(8, 16)
        out.append((a, min(18, a + r.randint(1, 3))))
    return out


def _overlaps(iv):
    return sum(a1 < b2 and a2 < b1 for i, (a1, b1) in enumerate(iv) for a2, b2 in iv[i + 1:])


def _levels(lines):
    out = {}
    for ln in lines:
        lvl = ln[1:ln.index("]")]
        out[lvl] = out.get(lvl, 0) + 1
    return out


def _log(r):
    return [f"[{lv}] {r.choice(LEVELS6[lv])}" for lv in (r.choice(list(LEVELS6)) for _ in range(r.randint(1, 4)))]


def _suffix(ws):
    s = ws[0]
    for w in ws[1:]:
        while not w.endswith(s):
            s = s[1:]
    return s


def _suffix_arg(r):
    end = r.choice(["ing", "tion", "er", "ly", ""])
    return ([r.choice(["sing", "walk", "mo", "sta", "rea", "o", "cal"]) + end for _ in range(r.randint(2, 4))],)


def _rotations(word, cands):
    return [c for c in cands if len(c) == len(word) and c in word + word]


def _rot_arg(r):
    w = r.choice(WORDS6[:8])
    cands = [w[i:] + w[:i] for i in r.sample(range(len(w)), 2)] + r.sample(WORDS6, 2)
    r.shuffle(cands)
    return w, cands


def _proper_sum(n):
    return sum(d for d in range(1, n) if n % d == 0)


def _kaprekar(n):
    steps = 0
    while n != 6174:
        s = f"{n:04d}"
        n = int("".join(sorted(s, reverse=True))) - int("".join(sorted(s)))
        steps += 1
    return steps


def _kap_arg(r):
    while True:
        n = r.randint(1000, 9998)
        if len(set(str(n))) > 1:
            return (n,)


def _mins(t):
    h, m = t.split(":")
    return int(h) * 60 + int(m)


def _times(r, k=None):
    return [f"{r.randint(6, 20):02d}:{r.choice([0, 10, 15, 30, 40, 45]):02d}" for _ in range(k or r.randint(2, 4))]


def _gaps(ts):
    ms = sorted(map(_mins, ts))
    return [b - a for a, b in zip(ms, ms[1:])]


def _people(r):
    return [(n, r.randint(18, 70)) for n in r.sample(["Ana", "Bo", "Cem", "Dia", "Eli", "Fay"], r.randint(2, 4))]


def _notes(amount, notes):
    out = {}
    for n in notes:
        if amount >= n:
            out[n], amount = amount // n, amount % n
    return out


def _price(amount, symbol):
    return f"{'-' if amount < 0 else ''}{symbol}{abs(amount):,.2f}"


def _dice(r):
    if r.random() < 0.4:
        a, b = r.sample(range(1, 7), 2)
        d = [a] * 3 + [b] * 2
        r.shuffle(d)
        return (d,)
    return ([r.randint(1, 6) for _ in range(5)],)


def _pairmax(a, b):
    n = min(len(a), len(b))
    return [max(x, y) for x, y in zip(a, b)] + a[n:] + b[n:]


def _first_diff(a, b):
    if a == b:
        return -1
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _diff_arg(r):
    a = r.choice(WORDS6)
    b = r.choice([a, a[:r.randint(1, len(a) - 1)], a[:2] + "x" + a[3:], r.choice(WORDS6)])
    return (a, b) if r.random() < 0.5 else (b, a)


def _hollow(n):
    return ["*" * n if i in (0, n - 1) else "*" + " " * (n - 2) + "*" for i in range(n)]


def _center(text, width, fill):
    pad = max(width - len(text), 0)
    return fill * (pad // 2) + text + fill * (pad - pad // 2)


def _trunc(text, limit):
    if len(text) <= limit:
        return text
    out = ""
    for w in text.split():
        cand = f"{out} {w}" if out else w
        if len(cand) > limit:
            break
        out = cand
    return out + "..."


def _groups(ws):
    out = {}
    for w in ws:
        out.setdefault("".join(sorted(w)), []).append(w)
    return list(out.values())


def _local_min(g):
    return [(i, j) for i in range(len(g)) for j in range(len(g[0]))
            if all(g[i][j] < g[a][b] for a, b in ((i - 1, j), (i + 1, j), (i, j - 1), (i, j + 1))
                   if 0 <= a < len(g) and 0 <= b < len(g[0]))]


def _grid6(r, rows, cols, hi=9):
    return [[r.randint(0, hi) for _ in range(cols)] for _ in range(rows)]


def _fill(stock, orders):
    left = dict(stock)
    for item, q in orders:
        if left.get(item, 0) >= q:
            left[item] -= q
    return left


def _orders(r):
    items = r.sample(["pens", "cups", "maps", "tape"], 2)
    return ({k: r.randint(0, 6) for k in items}, [(r.choice(items), r.randint(1, 4)) for _ in range(r.randint(1, 3))])


def _one_edit(a, b):
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    s, lg = sorted((a, b), key=len)
    return any(lg[:i] + lg[i + 1:] == s for i in range(len(lg)))


def _edit_arg(r):
    a = r.choice(WORDS6)
    i = r.randrange(len(a))
    b = r.choice([a[:i] + a[i + 1:], a[:i] + "e" + a[i:], a[:i] + "z" + a[i + 1:], a, r.choice(WORDS6),
                  a[:i] + "zz" + a[i + 1:]])
    return a, b


def _col_num(label):
    n = 0
    for c in label:
        n = n * 26 + ord(c) - 64
    return n


def _col_label(n):
    s = ""
    while n:
        n, rem = divmod(n - 1, 26)
        s = chr(65 + rem) + s
    return s


def _expand(text):
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def _ranges_arg(r):
    parts, x = [], r.randint(1, 4)
    for _ in range(r.randint(1, 3)):
        k = r.randint(0, 3)
        parts.append(f"{x}-{x + k}" if k else str(x))
        x += k + r.randint(2, 4)
    return (",".join(parts),)


def _morse(text):
    return " / ".join(" ".join(MORSE6[c] for c in w) for w in text.lower().split())


def _change(amount, coins):
    ways = [1] + [0] * amount
    for c in coins:
        for v in range(c, amount + 1):
            ways[v] += ways[v - c]
    return ways[amount]


def _nth_weekday(year, month, weekday, n):
    d = datetime.date(year, month, 1)
    d += datetime.timedelta(days=(WEEKDAYS6.index(weekday) - d.weekday()) % 7 + 7 * (n - 1))
    return d.isoformat()


def _top_words(text, k):
    c = Counter(text.split())
    return sorted(c, key=lambda w: (-c[w], w))[:k]


def _bmi(w, h):
    b = w / h ** 2
    return "underweight" if b < 18.5 else "normal" if b < 25 else "overweight" if b < 30 else "obese"


# (name, params, return type, docstring, reference, input maker)
STUBS6 = [
    ("blackjack_total", "cards: List[str]", "int",
     "Return the value of a blackjack hand. Cards are '2' to '10', 'J', 'Q', 'K' and 'A'; number cards count their "
     "number, picture cards count 10, and each ace counts 11 unless that would take the total over 21, then 1.",
     _blackjack, lambda r: ([r.choice(CARDS6) for _ in range(r.randint(2, 4))],)),
    ("scrabble_score", "word: str", "int",
     "Return the Scrabble score of a lower-case word: a e i l n o r s t u are worth 1, d g 2, b c m p 3, "
     "f h v w y 4, k 5, j x 8 and q z 10.", lambda w: sum(SCRABBLE6[c] for c in w),
     lambda r: (r.choice(WORDS6 + ["quiz", "jazz", "kayak"]),)),
    ("rps_winner", "first: str, second: str", "str",
     "Two players each show 'rock', 'paper' or 'scissors'. Rock beats scissors, scissors beat paper and paper "
     "beats rock. Return 'first' or 'second' for the winner, or 'draw'.",
     lambda a, b: "draw" if a == b else "first" if BEATS6[a] == b else "second",
     lambda r: (r.choice(list(BEATS6)), r.choice(list(BEATS6)))),
    ("tic_tac_toe_winner", "board: List[str]", "str",
     "The board is three strings of three characters, each 'X', 'O' or '.'. Return 'X' or 'O' if that player has "
     "three in a row, column or diagonal, and '' if nobody has.", _ttt, lambda r: (_board(r),)),
    ("free_slots", "busy: List[Tuple[int, int]], start: int, end: int", "List[Tuple[int, int]]",
     "busy holds (from, to) hours of meetings, in any order and possibly overlapping, all between start and end. "
     "Return the free (from, to) gaps of the day in order.", _free, lambda r: (_busy(r), 8, 18)),
    ("count_overlaps", "intervals: List[Tuple[int, int]]", "int",
     "Count the pairs of (start, end) intervals that overlap; intervals that only touch at an end do not overlap.",
     _overlaps, lambda r: (_busy(r) + _busy(r),)),
    ("level_counts", "lines: List[str]", "Dict[str, int]",
     "Each log line looks like '[LEVEL] message'. Count how many lines there are of each level.",
     _levels, lambda r: (_log(r),)),
    ("common_suffix", "words: List[str]", "str",
     "Return the longest string that every word ends with ('' if there is none).", _suffix, _suffix_arg),
    ("rotations_in", "word: str, candidates: List[str]", "List[str]",
     "Return, in their order, the candidates that are rotations of word (the same letters moved round in a circle).",
     _rotations, _rot_arg),
    ("group_by_length", "words: List[str]", "Dict[int, List[str]]",
     "Map each word length, in increasing order, to the words of that length in their original order.",
     lambda ws: {k: [w for w in ws if len(w) == k] for k in sorted({len(w) for w in ws})},
     lambda r: (r.sample(WORDS6 + ["ox", "bee", "kite"], r.randint(3, 5)),)),
    ("is_harshad", "n: int", "bool", "Return True if the positive integer n is divisible by the sum of its digits.",
     lambda n: n % sum(map(int, str(n))) == 0, lambda r: (r.randint(1, 300),)),
    ("is_automorphic", "n: int", "bool", "Return True if the square of n ends with the digits of n itself.",
     lambda n: str(n * n).endswith(str(n)), lambda r: (r.choice([5, 6, 7, 10, 25, 76, 13, 376, 625, 99, 9376]),)),
    ("abundant_below", "limit: int", "List[int]",
     "Return the numbers below limit whose proper divisors (all divisors smaller than the number) add up to more "
     "than the number.", lambda n: [k for k in range(1, n) if _proper_sum(k) > k], lambda r: (r.randint(10, 50),)),
    ("kaprekar_steps", "n: int", "int",
     "n has four digits, not all equal. Repeatedly replace it by its digits sorted in descending order minus its "
     "digits sorted in ascending order (keeping leading zeros) and return how many steps it takes to reach 6174.",
     _kaprekar, _kap_arg),
    ("closest_to_noon", "times: List[str]", "str",
     "Return the 'HH:MM' time that is closest to 12:00; if two are equally close, return the earlier one.",
     lambda ts: min(ts, key=lambda t: (abs(_mins(t) - 720), _mins(t))), lambda r: (_times(r),)),
    ("gaps_in_minutes", "times: List[str]", "List[int]",
     "Sort the 'HH:MM' times of one day and return the number of minutes between each time and the next.",
     _gaps, lambda r: (_times(r, r.randint(2, 4)),)),
    ("sort_by_age", "people: List[Tuple[str, int]]", "List[str]",
     "Return the names of the (name, age) pairs sorted from youngest to oldest, with equal ages in alphabetical order.",
     lambda ps: [n for n, _ in sorted(ps, key=lambda p: (p[1], p[0]))], lambda r: (_people(r),)),
    ("count_by_decade", "ages: List[int]", "Dict[int, int]",
     "Count the ages of each decade: 34 and 37 both belong to 30. Return the decades in increasing order.",
     lambda xs: {d: sum(x // 10 * 10 == d for x in xs) for d in sorted({x // 10 * 10 for x in xs})},
     lambda r: (_ints(r, 1, 89, r.randint(3, 6)),)),
    ("fewest_notes", "amount: int, notes: List[int]", "Dict[int, int]",
     "notes are the values of notes and coins from largest to smallest, the last being 1. Pay amount by always "
     "taking as many as possible of the largest value that fits, and return how many of each value are used "
     "(values that are not used are left out).", _notes,
     lambda r: (r.randint(1, 200), r.choice([[50, 20, 10, 5, 2, 1], [100, 25, 10, 5, 1]]))),
    ("format_price", "amount: float, symbol: str", "str",
     "Write the amount with the currency symbol, commas between thousands and two decimals; a negative amount "
     "starts with '-' before the symbol.", _price,
     lambda r: (r.choice([1, 1, -1]) * r.randint(0, 500000) / 100, r.choice(["$", "€", "£"]))),
    ("compound_balance", "principal: float, rate: float, years: int", "float",
     "Return the balance after the given number of years when principal earns rate percent interest, added once "
     "a year, rounded to two decimals.", lambda p, rt, y: round(p * (1 + rt / 100) ** y, 2),
     lambda r: (float(r.randint(1, 20) * 100), float(r.choice([2, 3, 4, 5])), r.randint(1, 5))),
    ("is_full_house", "dice: List[int]", "bool",
     "Five dice make a full house when three show one value and the other two show another value. Return whether "
     "they do.", lambda d: sorted(Counter(d).values()) == [2, 3], _dice),
    ("pairwise_max", "a: List[int], b: List[int]", "List[int]",
     "Return the larger of a[i] and b[i] for each position; the extra elements of the longer list are kept as "
     "they are.", _pairmax, lambda r: (_ints(r, 0, 9), _ints(r, 0, 9))),
    ("in_exactly_one", "a: List[int], b: List[int]", "List[int]",
     "Return, sorted and without repeats, the values that occur in one of the lists but not in the other.",
     lambda a, b: sorted(set(a) ^ set(b)), lambda r: (_ints(r, 0, 9, 4), _ints(r, 0, 9, 4))),
    ("first_difference", "a: str, b: str", "int",
     "Return the first index at which the strings differ. If one is the beginning of the other, return the "
     "length of the shorter one; if they are equal, return -1.", _first_diff, _diff_arg),
    ("staircase", "n: int", "List[str]",
     "Return the n rows of a staircase of '#' that rises to the right: row i (from 1) has n - i spaces and i '#'.",
     lambda n: [" " * (n - i) + "#" * i for i in range(1, n + 1)], lambda r: (r.randint(1, 4),)),
    ("hollow_square", "n: int", "List[str]",
     "Return the rows of an n by n square drawn with '*' on its border and spaces inside.",
     _hollow, lambda r: (r.randint(1, 4),)),
    ("center_text", "text: str, width: int, fill: str", "str",
     "Pad the text on both sides with the fill character to make it width characters long; when the padding "
     "cannot be split evenly the extra character goes on the right. Text at least width long is returned as it is.",
     _center, lambda r: (r.choice(WORDS6), r.randint(5, 11), r.choice("*-=."))),
    ("truncate_words", "text: str, limit: int", "str",
     "If the text is longer than limit characters, keep as many whole words from its start as fit in limit "
     "characters and add '...'; otherwise return the text unchanged.", _trunc,
     lambda r: (" ".join(_ws(r, 2, 5)), r.randint(8, 25))),
    ("slugify", "title: str", "str",
     "Turn a title into a URL slug: lower case, every run of characters that are not letters or digits becomes "
     "one '-', and no '-' at either end.", lambda t: re.sub(r"[^a-z0-9]+", "-", t.lower()).strip("-"),
     lambda r: (r.choice(TITLES6),)),
    ("vowel_groups", "word: str", "int", "Count the groups of consecutive vowels (a, e, i, o, u) in the word.",
     lambda w: len(re.findall("[aeiou]+", w.lower())), lambda r: (r.choice(WORDS6 + ["beautiful", "queue", "rhythm"]),)),
    ("anagram_groups", "words: List[str]", "List[List[str]]",
     "Group the words that are anagrams of each other. Groups come in the order of their first word, and words "
     "keep their order inside a group.", _groups, lambda r: (r.sample(ANAGRAMS6, r.randint(3, 6)),)),
    ("count_inversions", "values: List[int]", "int",
     "Count the pairs of positions i < j with values[i] > values[j].",
     lambda xs: sum(xs[i] > xs[j] for i in range(len(xs)) for j in range(i + 1, len(xs))), lambda r: (_ints(r, 0, 9, 5),)),
    ("three_way_partition", "values: List[int], pivot: int", "List[int]",
     "Return the values smaller than pivot, then those equal to it, then the larger ones, each part keeping the "
     "original order.", lambda xs, p: [x for x in xs if x < p] + [x for x in xs if x == p] + [x for x in xs if x > p],
     lambda r: (_ints(r, 0, 9, 6), r.randint(2, 7))),
    ("anti_diagonal", "grid: List[List[int]]", "List[int]",
     "Return the values of a square grid on the diagonal from the top-right corner to the bottom-left corner.",
     lambda g: [g[i][len(g) - 1 - i] for i in range(len(g))], lambda r: (_grid6(r, *[r.randint(2, 3)] * 2),)),
    ("local_minima", "grid: List[List[int]]", "List[Tuple[int, int]]",
     "Return the (row, column) positions of the cells that are smaller than each of their up, down, left and right "
     "neighbors, in reading order.", _local_min, lambda r: (_grid6(r, r.randint(2, 3), 3),)),
    ("elevator_distance", "start: int, requests: List[int]", "int",
     "An elevator starts at floor start and visits the requested floors in order. Return how many floors it travels.",
     lambda s, rq: sum(abs(b - a) for a, b in zip([s] + rq, rq)), lambda r: (r.randint(0, 5), _ints(r, 0, 12, 3))),
    ("parking_fee", "minutes: int", "int",
     "Parking is free for the first 30 minutes; after that it costs 2 for every started hour beyond the free half "
     "hour, but never more than 20. Return the fee for a stay of the given minutes.",
     lambda m: 0 if m <= 30 else min(20, 2 * math.ceil((m - 30) / 60)), lambda r: (r.choice([10, 30, 31, 90, 91, 400, 800]),)),
    ("shipping_cost", "weight_kg: float", "float",
     "A parcel of up to 1 kg costs 5.0 to send; every started kilogram above that adds 2.5. Return the cost.",
     lambda w: 5.0 + 2.5 * math.ceil(max(0.0, w - 1)), lambda r: (r.randint(1, 60) / 10,)),
    ("bmi_category", "weight_kg: float, height_m: float", "str",
     "Compute the body mass index, weight divided by height squared, and return 'underweight' below 18.5, "
     "'normal' below 25, 'overweight' below 30 and 'obese' otherwise.", _bmi,
     lambda r: (float(r.randint(45, 110)), r.choice([1.55, 1.62, 1.7, 1.78, 1.85]))),
    ("fill_orders", "stock: Dict[str, int], orders: List[Tuple[str, int]]", "Dict[str, int]",
     "Go through the (item, quantity) orders in turn; an order is filled, and taken from the stock, only if "
     "enough of the item is left, otherwise it is skipped. Return the stock that is left.", _fill, _orders),
    ("is_one_edit", "a: str, b: str", "bool",
     "Return True if exactly one insertion, deletion or replacement of a character turns a into b.",
     _one_edit, _edit_arg),
    ("column_number", "label: str", "int",
     "Spreadsheet columns are labelled A to Z, then AA, AB and so on. Return the number of a column, A being 1.",
     _col_num, lambda r: (r.choice(["A", "Z", "AA", "AZ", "BA", "ZZ", "AAA", "C", "XFD"]),)),
    ("column_label", "n: int", "str",
     "Return the spreadsheet label of column n, where 1 is 'A', 26 is 'Z', 27 is 'AA' and 28 is 'AB'.",
     _col_label, lambda r: (r.choice([1, 5, 26, 27, 52, 53, 702, 703, r.randint(1, 800)]),)),
    ("expand_ranges", "text: str", "List[int]",
     "The text lists numbers and ranges separated by commas, such as '1-3,7'. Return every number it covers.",
     _expand, _ranges_arg),
    ("to_morse", "text: str", "str",
     "Translate the lower-case letters into Morse code: the codes of a word's letters are separated by spaces and "
     "words by ' / '.", _morse, lambda r: (" ".join(_ws(r, 1, 2)),)),
    ("change_ways", "amount: int, coins: List[int]", "int",
     "Return the number of different ways to make amount from any number of the coins (the order does not matter).",
     _change, lambda r: (r.randint(0, 20), r.choice([[1, 2], [1, 2, 5], [2, 3], [1, 5, 10]]))),
    ("nth_weekday_date", "year: int, month: int, weekday: str, n: int", "str",
     "Return, as 'YYYY-MM-DD', the date of the n-th given weekday (such as 'Monday') of the month.",
     _nth_weekday, lambda r: (r.choice([2023, 2024, 2025]), r.randint(1, 12), r.choice(WEEKDAYS6), r.randint(1, 4))),
    ("add_days", "date: str, days: int", "str",
     "Return the date 'YYYY-MM-DD' that comes the given number of days after date (before it if days is negative).",
     lambda d, k: (datetime.date.fromisoformat(d) + datetime.timedelta(days=k)).isoformat(),
     lambda r: (r.choice(["2024-02-27", "2023-12-30", "2025-03-01", "2022-06-15"]), r.randint(-40, 400))),
    ("top_words", "text: str, k: int", "List[str]",
     "Return the k most frequent words of the text, most frequent first, ties in alphabetical order.",
     _top_words, lambda r: (" ".join(_ws(r, 4, 8)), r.randint(1, 3))),
]

STUB_LEADS6 = ["Write a solution to the following problem and make sure that it passes the tests:"] * 3 + [
    "", "Complete the body of this function.", "Fill in the missing code:",
    "Here is a function signature with its docstring. Write the implementation:"]


def heval6_prompts(rng: random.Random, n_per: int) -> list[str]:
    out = set()
    for name, params, ret, doc, ref, make in STUBS6:
        mine, tries = set(), 0
        while len(mine) < n_per and tries < 20 * n_per:
            tries += 1
            ex = examples(rng, name, ref, make) if rng.random() < 0.9 else []
            typing = sorted({t for t in ("List", "Dict", "Optional", "Tuple") if t in params + ret})
            head = f"from typing import {', '.join(typing)}\n\n\n" if typing else ""
            body = f"{head}def {name}({params}) -> {ret}:\n{_doc(rng, params, ret, doc, ex)}"
            lead = rng.choice(STUB_LEADS6)
            mine.add(f"{lead}\n```python\n{body}\n```" if lead else body)
        out |= mine
    return sorted(out)


# One-line asks with a test line: (name, what it does, reference, input maker).
ASSERT6 = [
    ("count_words_starting_with", "count the words of a sentence that start with a given letter",
     lambda s, c: sum(w.startswith(c) for w in s.split()), lambda r: (" ".join(_ws(r, 3, 6)), r.choice("cmpt"))),
    ("doubled_letter_count", "count the places in a string where the same letter appears twice in a row",
     lambda s: sum(a == b for a, b in zip(s, s[1:])), lambda r: (r.choice(WORDS6 + ["bookkeeper", "balloon"]),)),
    ("mirror_word", "return a word followed by its reverse", lambda w: w + w[::-1], lambda r: (r.choice(WORDS6),)),
    ("discounted_price", "return a price after a percentage discount, rounded to two decimals",
     lambda p, d: round(p * (1 - d / 100), 2), lambda r: (r.randint(100, 9999) / 100, r.choice([5, 10, 15, 25, 30]))),
    ("fahrenheit_to_kelvin", "convert a temperature in Fahrenheit to Kelvin, rounded to two decimals",
     lambda f: round((f - 32) * 5 / 9 + 273.15, 2), lambda r: (float(r.randint(-40, 212)),)),
    ("minutes_to_clock", "write a number of minutes as a string 'H:MM'",
     lambda m: f"{m // 60}:{m % 60:02d}", lambda r: (r.randint(0, 900),)),
    ("last_digit_total", "return the sum of the last digits of a list of non-negative integers",
     lambda xs: sum(x % 10 for x in xs), lambda r: (_ints(r, 0, 999, 4),)),
    ("shout", "turn a sentence into upper case and add an exclamation mark at its end",
     lambda s: s.upper() + "!", lambda r: (" ".join(_ws(r, 2, 4)),)),
    ("count_above_average", "count the elements of a list that are larger than the average of the list",
     lambda xs: sum(x > sum(xs) / len(xs) for x in xs), lambda r: (_ints(r, 0, 20, 5),)),
    ("seconds_until_midnight", "return the number of seconds from a time 'HH:MM:SS' until midnight",
     lambda t: 86400 - sum(int(x) * m for x, m in zip(t.split(":"), (3600, 60, 1))),
     lambda r: (f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}",)),
]


def assert6_prompts(rng: random.Random, n: int) -> list[str]:
    out = set()
    leads = ["Write a function to", "Write a python function to", "Write a Python function that can"]
    while len(out) < n:
        name, what, ref, make = rng.choice(ASSERT6)
        tests = "\n".join(f"assert {c} == {v}" for c, v in examples(rng, name, ref, make, rng.randint(1, 3)))
        out.add(f"{rng.choice(leads)} {what}.\nYour code should pass these tests:\n\n{tests}")
    return sorted(out)
