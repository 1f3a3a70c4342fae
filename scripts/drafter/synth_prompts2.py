"""A second round of drafter-training prompts (see synth_prompts.py, the
first), in families the first lacks: open chat on new topics with the
constraints a chat benchmark puts on answers (length, format, audience),
chat about code in several languages, "explain / review / document this
function" over short functions of the Python standard library, typed
function stubs with doctest examples (the examples are computed by this
file's own reference implementations), and word problems of new shapes.
Seeded, built from this file's own templates and word lists (and the
stdlib's source); prompts equal to an eval prompt are dropped.

usage: .venv/bin/python scripts/drafter/synth_prompts2.py OUT_DIR [SEED]
then:  dspark gen-drafter-data --prompts OUT_DIR --out data/selfgen-synth2
"""
from __future__ import annotations

import importlib
import inspect
import random
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_prompts import ITEMS, NAMES, split_list, write_sets  # noqa: E402

TOPICS2 = """
a night train across Europe|the history of coffee|learning to swim as an adult|a neighborhood cleanup|
the first smartphone|wildfires|a student exchange year|the Apollo program|indoor plants|
a food truck business|the Viking age|a rescue dog|the future of libraries|paper money|
a year without social media|the Mongol Empire|noise pollution|a jazz festival in New Orleans|
the discovery of penicillin|tiny houses|a chess tournament|the Hubble telescope|
a family recipe book|dinosaurs|carpooling|the Harlem Renaissance|a startup that failed|
the history of the bicycle|desalination|a trip to Iceland|the Ottoman Empire|
a marathon training plan|sleep and memory|the invention of the light bulb|a pottery class|
microplastics|a town without cars|Ancient Greek theater|a data breach at a small company|
the gig economy|a science museum for children|the Mars rovers|a new public park|
the history of vaccines|a ballet performance|electric airplanes|homeschooling|
the Dust Bowl|a cooking competition|nuclear fusion|a school uniform policy|
the history of maps|a hot air balloon ride|antibiotic resistance|a spelling bee|
the Byzantine Empire|vertical farming|a camping trip that went wrong|the metric system|
a local election|the Northern Lights|a robotics club|the history of tea|
a library book sale|self-driving trucks|the Inca road system|a summer internship|
urban heat islands|the invention of writing|a flea market|the International Space Station|
a choir concert|water scarcity|the first computer programmers|a skateboarding park|
the history of the Olympics|a small island nation|online learning|the printing of books in Asia|
a zero-waste kitchen|the Suez Canal|a city bike-sharing program|the life cycle of stars|
a surprise birthday party|the Great Barrier Reef|a four-day work week|the history of jeans
"""

CONSTRAINTS = ["", "", "", " Please answer in fewer than 150 words.", " Keep it under 100 words.",
               " Use exactly three bullet points.", " Please be concise.",
               " Answer in two short paragraphs.", " Use a friendly, informal tone.",
               " Format your answer as a numbered list.", " End with a one-sentence summary.",
               " Include at least one concrete example."]

CHAT2 = [
    "Write a travel guide entry about {t} for first-time visitors.",
    "Draft a short opinion column about {t} for a local newspaper.",
    "Write a letter to a city council member about {t}.",
    "Create a FAQ with five questions and answers about {t}.",
    "Write the opening paragraph of a mystery novel that begins with {t}.",
    "Describe {t} using vivid imagery and at least two metaphors.",
    "Write a short debate: one paragraph for and one paragraph against {t}.",
    "Explain why {t} matters, as if you were giving a five-minute talk.",
    "Write a lesson plan for a 45-minute class about {t}.",
    "What questions should someone ask before getting involved in {t}?",
    "Write a social media post announcing an event about {t}.",
    "Give a brief history of {t} and explain its significance today.",
    "Write a children's story that teaches a lesson through {t}.",
    "What would a newspaper headline about {t} look like in the year 2050? Write the article's first paragraph.",
    "Write a job advertisement for a position related to {t}.",
    "Summarize the arguments an economist might make about {t}.",
    "Describe three people whose lives are affected by {t}, in one paragraph each.",
    "Write a motivational message for someone who is struggling with {t}.",
    "Create a checklist for organizing {t}.",
    "Explain the connection between {t} and {t2}.",
    "You are {p}. Someone asks you about {t}. What do you say?",
    "Pretend to be {p} and describe your morning routine in a way that involves {t}.",
    "Write a conversation between {p} and {p2} about {t}.",
    "As {p}, write a short complaint letter about {t}.",
    "Write a short essay on how {t} has changed the way people live.",
    "Give a balanced overview of the debate around {t}.",
]

PEOPLE2 = """a retired sea captain|a cheerful mail carrier|a skeptical scientist|an ancient Greek philosopher|
a robot learning to cook|a tired night-shift nurse|a travel vlogger|a famous detective|
a medieval blacksmith|a dragon who collects books|a high school principal|a nervous stand-up comedian|
a kind grandmother|a Victorian inventor|a lighthouse cat|an alien visiting Earth for the first time
"""

LANGS = ["Python", "JavaScript", "C++", "Java", "Go", "Rust", "C", "TypeScript", "Bash", "SQL"]
CODE_TASKS = """reverse a linked list|check whether a string is a palindrome|find the longest common prefix of a list of strings|
count word frequencies in a text file|implement a stack with push, pop and peek|merge two sorted arrays|
compute the factorial of a number recursively and iteratively|find all prime numbers below n with a sieve|
implement binary search|read a CSV file and print the average of one column|validate an email address|
implement a simple LRU cache|find the shortest path in an unweighted graph|flatten a nested list|
implement bubble sort and explain its complexity|parse a date string and print the day of the week|
remove duplicate lines from a file|compute the greatest common divisor of two numbers|
implement a queue using two stacks|convert a number to its Roman numeral|check if two strings are anagrams|
find the maximum subarray sum|rotate a matrix by 90 degrees|implement a simple tokenizer for arithmetic expressions|
count the islands in a grid of zeros and ones|find the k most frequent elements in a list|
generate all permutations of a string|implement a binary search tree with insert and search|
detect a cycle in a linked list|compute the edit distance between two strings
"""
CODE_CHAT = [
    "Write a {lang} program to {c}.", "How would you {c} in {lang}? Show the code and explain it.",
    "Write a function in {lang} to {c}, and add comments that explain each step.",
    "Implement a {lang} function to {c}. What is its time complexity?",
    "I need to {c} in {lang}. Can you help me with the code?",
]
CONCEPTS = """closures|list comprehensions|recursion|exceptions|generators|decorators|pointers|
hash tables|classes and inheritance|interfaces|asynchronous programming|unit testing|
regular expressions|memory management|immutability|higher-order functions|iterators|
static typing|garbage collection|threads and locks|database indexes|REST APIs|
version control with git|dynamic programming|big-O notation
"""
CONCEPT_CHAT = ["Explain {k} in {lang} with a short example.",
                "What are {k}, and when should I use them in {lang}?",
                "What is the difference between {k} and {k2}? Use {lang} examples.",
                "Give me three common mistakes programmers make with {k}."]


def _fill_const(rng: random.Random, s: str) -> str:
    return s + rng.choice(CONSTRAINTS)


def chat2_prompts(rng: random.Random, n: int) -> list[str]:
    topics, people = split_list(TOPICS2), split_list(PEOPLE2)
    tasks, concepts = split_list(CODE_TASKS), split_list(CONCEPTS)
    out = set()
    while len(out) < n:
        kind = rng.random()
        if kind < 0.7:
            t, t2 = rng.sample(topics, 2)
            p, p2 = rng.sample(people, 2)
            s = _fill_const(rng, rng.choice(CHAT2).format(t=t, t2=t2, p=p, p2=p2))
        elif kind < 0.9:
            s = rng.choice(CODE_CHAT).format(lang=rng.choice(LANGS), c=rng.choice(tasks))
        else:
            k, k2 = rng.sample(concepts, 2)
            s = rng.choice(CONCEPT_CHAT).format(k=k, k2=k2, lang=rng.choice(LANGS[:7]))
        out.add(s)
    return sorted(out)


EXPLAIN_MODULES = ("textwrap string statistics bisect heapq fractions difflib shlex fnmatch "
                   "posixpath colorsys calendar html base64 functools random urllib.parse "
                   "ipaddress copy glob keyword pprint csv json.encoder _pydecimal ntpath "
                   "gettext tokenize argparse shutil tempfile collections enum operator "
                   "mimetypes graphlib plistlib sched queue reprlib pathlib datetime").split()
EXPLAIN_LEADS = ["Explain what the following Python function does, step by step:",
                 "Review this code and suggest improvements:",
                 "Add type hints and a docstring to this function:",
                 "What does this function return for typical inputs? Explain with an example.",
                 "Rewrite this function to make it easier to read:",
                 "Write unit tests for the following function:"]


def explain_prompts(rng: random.Random, n: int) -> list[str]:
    """Short functions of the standard library, docstrings removed."""
    out = {}
    for mod_name in EXPLAIN_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except Exception:
            continue
        fns = [f for name, f in vars(mod).items()
               if inspect.isfunction(f) and f.__module__ == mod.__name__]
        for f in fns:
            try:
                src = textwrap.dedent(inspect.getsource(f))
            except (OSError, TypeError):
                continue
            if f.__doc__:
                src = src.replace(f.__doc__, "", 1)
                src = "\n".join(ln for ln in src.split("\n")
                                if ln.strip() not in ('""""""', "''''''", 'r""""""'))
            lines = [ln for ln in src.split("\n") if ln.strip()]
            if not 5 <= len(lines) <= 25 or any(len(ln) > 100 for ln in lines):
                continue
            out.setdefault(f"{mod_name}.{f.__name__}", "\n".join(lines))
    keys = sorted(out)
    rng.shuffle(keys)
    return sorted(f"{rng.choice(EXPLAIN_LEADS)}\n```python\n{out[k]}\n```" for k in keys[:n])


# Typed stubs with doctest examples, in the shape of a code benchmark's
# problems: (name, params, return type, docstring, reference, input maker).
def _ints(r, lo=-9, hi=20, k=None):
    return [r.randint(lo, hi) for _ in range(k or r.randint(3, 7))]


def _words(r, k=None):
    pool = "apple tree sun moon river stone cloud bird fish star rain leaf wind road".split()
    return [r.choice(pool) for _ in range(k or r.randint(2, 5))]


def _text(r):
    return " ".join(_words(r, r.randint(2, 5)))


STUBS = [
    ("sum_of_evens", "numbers: List[int]", "int", "Return the sum of the even numbers in the list.",
     lambda xs: sum(x for x in xs if x % 2 == 0), lambda r: (_ints(r),)),
    ("count_positive", "numbers: List[int]", "int", "Count how many numbers in the list are greater than zero.",
     lambda xs: sum(1 for x in xs if x > 0), lambda r: (_ints(r),)),
    ("running_max", "numbers: List[int]", "List[int]",
     "From a given list of integers, generate a list where each element is the largest value seen so far.",
     lambda xs: [max(xs[:i + 1]) for i in range(len(xs))], lambda r: (_ints(r),)),
    ("pairwise_diff", "numbers: List[int]", "List[int]",
     "Return the differences between each element and the one before it.",
     lambda xs: [b - a for a, b in zip(xs, xs[1:])], lambda r: (_ints(r),)),
    ("second_largest", "numbers: List[int]", "Optional[int]",
     "Return the second largest distinct value in the list, or None if there is none.",
     lambda xs: sorted(set(xs))[-2] if len(set(xs)) > 1 else None, lambda r: (_ints(r, 0, 9),)),
    ("capitalize_words", "text: str", "str", "Capitalize the first letter of every word in the text.",
     lambda s: " ".join(w.capitalize() for w in s.split(" ")), lambda r: (_text(r),)),
    ("count_vowels", "text: str", "int", "Return the number of vowels (a, e, i, o, u) in the string.",
     lambda s: sum(c in "aeiou" for c in s), lambda r: (_text(r),)),
    ("reverse_words", "sentence: str", "str", "Return the sentence with the order of its words reversed.",
     lambda s: " ".join(s.split(" ")[::-1]), lambda r: (_text(r),)),
    ("longest_word", "sentence: str", "str",
     "Return the longest word in the sentence. If several words have the same length, return the first one.",
     lambda s: max(s.split(" "), key=len), lambda r: (_text(r),)),
    ("digit_sum", "n: int", "int", "Return the sum of the decimal digits of a non-negative integer n.",
     lambda n: sum(map(int, str(n))), lambda r: (r.randint(0, 99999),)),
    ("is_sorted", "numbers: List[int]", "bool", "Return True if the list is sorted in non-decreasing order.",
     lambda xs: xs == sorted(xs), lambda r: (sorted(_ints(r)) if r.random() < .5 else _ints(r),)),
    ("chunk", "items: List[int], size: int", "List[List[int]]",
     "Split the list into consecutive chunks of the given size; the last chunk may be shorter.",
     lambda xs, k: [xs[i:i + k] for i in range(0, len(xs), k)], lambda r: (_ints(r), r.randint(1, 3))),
    ("rotate_left", "items: List[int], k: int", "List[int]",
     "Rotate the list to the left by k positions.",
     lambda xs, k: xs[k % len(xs):] + xs[:k % len(xs)], lambda r: (_ints(r), r.randint(0, 6))),
    ("count_char", "text: str, char: str", "int",
     "Count how many times the character appears in the text, ignoring case.",
     lambda s, c: s.lower().count(c.lower()), lambda r: (_text(r), r.choice("aeiorst"))),
    ("unique_in_order", "items: List[int]", "List[int]",
     "Remove duplicates from the list, keeping the first occurrence of each element in order.",
     lambda xs: list(dict.fromkeys(xs)), lambda r: (_ints(r, 0, 5, 7),)),
    ("alternate_case", "text: str", "str",
     "Return the string with letters alternating between upper and lower case, starting with upper case.",
     lambda s: "".join(c.upper() if i % 2 == 0 else c.lower() for i, c in enumerate(s)),
     lambda r: (r.choice(_words(r, 4)),)),
    ("product_except_self", "numbers: List[int]", "List[int]",
     "Return a list where each element is the product of all other elements of the input.",
     lambda xs: [__import__("math").prod(xs[:i] + xs[i + 1:]) for i in range(len(xs))],
     lambda r: (_ints(r, 1, 6, 4),)),
    ("count_words", "sentence: str", "Dict[str, int]",
     "Return a dictionary mapping each word in the sentence to the number of times it occurs.",
     lambda s: {w: s.split(" ").count(w) for w in dict.fromkeys(s.split(" "))},
     lambda r: (" ".join(_words(r, 4)),)),
    ("triangle_type", "a: int, b: int, c: int", "str",
     "Given the side lengths of a triangle, return 'equilateral', 'isosceles' or 'scalene'.",
     lambda a, b, c: "equilateral" if a == b == c else ("isosceles" if len({a, b, c}) == 2 else "scalene"),
     lambda r: tuple(r.choice([[3, 3, 3], [3, 4, 5], [5, 5, 8], [2, 3, 4], [6, 6, 6]]))),
    ("filter_by_length", "words: List[str], n: int", "List[str]",
     "Return only the words whose length is at least n.",
     lambda ws, n: [w for w in ws if len(w) >= n], lambda r: (_words(r), r.randint(3, 5))),
    ("interleave", "a: List[int], b: List[int]", "List[int]",
     "Interleave two lists of equal length: the first element of a, then the first of b, and so on.",
     lambda a, b: [x for p in zip(a, b) for x in p], lambda r: (_ints(r, 0, 9, 3), _ints(r, 0, 9, 3))),
    ("max_gap", "numbers: List[int]", "int",
     "Return the largest difference between two consecutive elements of the sorted list.",
     lambda xs: max(b - a for a, b in zip(sorted(xs), sorted(xs)[1:])), lambda r: (_ints(r),)),
    ("to_binary", "n: int", "str", "Return the binary representation of a non-negative integer as a string.",
     lambda n: bin(n)[2:], lambda r: (r.randint(0, 64),)),
    ("collatz_steps", "n: int", "int",
     "Return the number of steps the Collatz process takes to reach 1 from n.",
     lambda n: (lambda f: f(f, n))(lambda f, m: 0 if m == 1 else 1 + f(f, m // 2 if m % 2 == 0 else 3 * m + 1)),
     lambda r: (r.randint(1, 30),)),
    ("mean_absolute_difference", "numbers: List[float]", "float",
     "Return the mean absolute difference between each number and the mean of the list, rounded to two decimals.",
     lambda xs: round(sum(abs(x - sum(xs) / len(xs)) for x in xs) / len(xs), 2),
     lambda r: ([float(x) for x in _ints(r, 0, 9, 4)],)),
    ("common_prefix", "words: List[str]", "str", "Return the longest common prefix of all the words.",
     lambda ws: __import__("os").path.commonprefix(ws),
     lambda r: ([r.choice(["flow", "flight", "flower", "fling"]) for _ in range(3)],)),
    ("even_index_sum", "numbers: List[int]", "int", "Return the sum of the elements at even indices.",
     lambda xs: sum(xs[::2]), lambda r: (_ints(r),)),
    ("swap_case", "text: str", "str", "Swap the case of every letter in the string.",
     lambda s: s.swapcase(), lambda r: (r.choice(["Hello World", "PyThOn", "abc DEF", "Data 42"]),)),
    ("nested_depth", "parens: str", "int",
     "Return the maximum nesting depth of the parentheses in the string.",
     lambda s: max([0] + [s[:i + 1].count("(") - s[:i + 1].count(")") for i in range(len(s))]),
     lambda r: (r.choice(["(()())", "((()))", "()()", "(())(()())", "()"]),)),
    ("closest_to_zero", "numbers: List[int]", "int",
     "Return the number closest to zero; if there is a tie, return the positive one.",
     lambda xs: min(xs, key=lambda x: (abs(x), -x)), lambda r: (_ints(r),)),
    ("count_islands_1d", "bits: List[int]", "int",
     "Count the groups of consecutive ones in a list of zeros and ones.",
     lambda bs: sum(1 for i, b in enumerate(bs) if b == 1 and (i == 0 or bs[i - 1] == 0)),
     lambda r: ([r.randint(0, 1) for _ in range(8)],)),
    ("caesar_shift", "text: str, shift: int", "str",
     "Shift every lowercase letter of the text forward in the alphabet by shift places, wrapping around.",
     lambda s, k: "".join(chr((ord(c) - 97 + k) % 26 + 97) if c.islower() else c for c in s),
     lambda r: (r.choice(_words(r, 3)), r.randint(1, 5))),
    ("sum_of_squares_below", "n: int", "int", "Return the sum of the squares of all positive integers less than n.",
     lambda n: sum(i * i for i in range(1, n)), lambda r: (r.randint(1, 12),)),
]
STUB_LEADS = ["Write a solution to the following problem and make sure that it passes the tests:",
              "Complete the following Python function:", "Implement the function below:"]


def stub_parts(rng: random.Random, name: str, params: str, ret: str, ref, make,
               typing_names=("List", "Dict", "Optional")) -> tuple[str, str]:
    """A stub's typing import line(s) and its doctest examples: 1-3 inputs drawn by
    ``make``, each shown with the reference implementation's result."""
    args = [make(rng) for _ in range(rng.randint(1, 3))]
    ex = "".join(f"    >>> {name}({', '.join(map(repr, a))})\n    {ref(*a)!r}\n" for a in args)
    typing = sorted({t for t in typing_names if t in params + ret})
    return (f"from typing import {', '.join(typing)}\n\n\n" if typing else ""), ex


def heval_prompts(rng: random.Random, n_per: int) -> list[str]:
    out = set()
    for name, params, ret, doc, ref, make in STUBS:
        for _ in range(n_per):
            head, ex = stub_parts(rng, name, params, ret, ref, make)
            body = f'{head}def {name}({params}) -> {ret}:\n    """ {doc}\n{ex}    """\n'
            out.add(f"{rng.choice(STUB_LEADS)}\n```python\n{body}\n```")
    return sorted(out)


MATH2 = [
    "{n1} buys {a} packs of {i}. Each pack has {b} {i}. {pr} uses {c} {i} every day. How many "
    "days will the {i} last?",
    "A bus has {d} seats. At the first stop {a} people get on, at the second stop {b} get on "
    "and {c} get off. How many empty seats are there now?",
    "{n1} saves ${a} every week. {n2} saves ${b} every week but starts with ${d}. After how many "
    "weeks will they have saved the same amount, if ever?",
    "A rectangle is {a} meters long and {b} meters wide. {n1} wants to put a fence around it "
    "that costs ${c} per meter. How much will the fence cost?",
    "{n1} had ${d}. {pr} spent a fifth of it on books and ${a} on lunch. How much money does "
    "{n1} have left?",
    "A factory makes {a} toys per hour and works {b} hours a day. How many toys does it make in "
    "{c} days if it is closed one of those days?",
    "The price of a jacket is ${d}. It is on sale for {a} percent off. {n1} also has a coupon for "
    "${b} off the sale price. What does {n1} pay?",
    "{n1} is planting flowers. {pr} plants {a} flowers on the first day and {b} more each day "
    "than the day before. How many flowers has {n1} planted after {c} days?",
    "A class of {d} students goes on a trip. Each van holds {b} students. How many vans are "
    "needed, and how many seats are left empty?",
    "{n1}'s garden has {a} tomato plants. Each plant gives {b} tomatoes a week. {pr} sells them "
    "in boxes of {c}. How many full boxes can {n1} sell after {e} weeks?",
]


def math2_prompts(rng: random.Random, n: int) -> list[str]:
    out = set()
    while len(out) < n:
        n1, n2 = rng.sample(NAMES, 2)
        a, b, c = rng.randint(2, 40), rng.randint(2, 30), rng.randint(2, 9)
        s = rng.choice(MATH2).format(n1=n1, n2=n2, pr=rng.choice(["She", "He"]), i=rng.choice(ITEMS),
                                     a=a, b=b, c=c, d=rng.randint(5, 40) * 10, e=rng.randint(2, 6))
        out.add(s + "\nPlease reason step by step, and put your final answer within \\boxed{}.")
    return sorted(out)


def main() -> int:
    out = Path(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    rng = random.Random(seed)
    sets = {"synth2-chat": chat2_prompts(rng, 1000), "synth2-heval": heval_prompts(rng, 10),
            "synth2-math": math2_prompts(rng, 250), "synth2-explain": explain_prompts(rng, 300)}
    write_sets(out, sets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
