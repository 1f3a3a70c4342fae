"""A third round of drafter-training prompts (after synth_prompts.py and
synth_prompts2.py), aimed at the two eval families where the drafter is
weakest: chat of the kinds a chat benchmark asks for (writing with a form
and an audience, role-play, editing or summarizing a given passage,
humanities and STEM questions), and code problems (typed stubs with doctest
examples computed by this file's own reference implementations, and
one-line "write a function" tasks of new shapes). Seeded, built from this
file's own templates and word lists; prompts equal to or near an eval
prompt are dropped (services/worker/training/decontam.py).

usage: .venv/bin/python scripts/drafter/synth_prompts3.py OUT_DIR [SEED]
then:  dspark gen-drafter-data --prompts OUT_DIR --out data/selfgen-synth3
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_prompts import expand, split_list, write_sets  # noqa: E402
from synth_prompts2 import _ints, stub_parts  # noqa: E402

from dspark.worker.training.decontam import EvalGuard  # noqa: E402

EVAL = Path(__file__).resolve().parents[3] / "shared/datasets/eval"

TOPICS3 = """
a community garden|the history of chocolate|moving to a new city|a volunteer fire department|
the invention of the telephone|coral bleaching|a gap year|the Silk Road|houseplants that clean the air|
a bakery opening|the Roman aqueducts|adopting a cat|the future of newspapers|cryptocurrency|
a week of digital detox|the Aztec Empire|light pollution|a blues concert|the discovery of DNA|
co-living spaces|a school science fair|the James Webb telescope|a family reunion|volcanoes|
public transport in small towns|the Renaissance in Florence|a product launch that went badly|
the history of the piano|recycling plastics|a road trip through Patagonia|the Qing dynasty|
learning a musical instrument as an adult|caffeine and sleep|the invention of the radio|
a woodworking workshop|ocean acidification|a car-free Sunday|Shakespeare's Globe Theatre|
remote work burnout|a planetarium show|the Voyager probes|a new bike lane|the history of anesthesia|
an opera premiere|hydrogen cars|year-round schooling|the Great Depression|a baking contest|
solar power in deserts|banning phones in classrooms|the history of the calendar|a kayaking trip|
honeybee decline|a poetry slam|the Khmer Empire|lab-grown meat|a hiking trip in the rain|
the decimal system|a school board meeting|auroras on other planets|a coding bootcamp|
the history of soap|a used bookstore|delivery drones|the Maya calendar|a first job interview|
city trees|the invention of paper|a garage sale|living on the Moon|a marching band|
drought-resistant crops|the first women in science|a climbing gym|the history of the World Cup|
a remote mountain village|language learning apps|the history of glass|a plastic-free week|
the Panama Canal|a shared electric scooter service|black holes|a retirement party|
the Amazon rainforest|a three-day weekend|the history of sneakers|a museum night tour
"""

PEOPLE3 = """a grumpy wizard|a cheerful astronaut|a time traveler from the year 1850|a wise old tree|
a pirate who is afraid of water|a museum tour guide|a chess grandmaster|a small-town mayor|
a marine biologist|a stage magician|a Roman senator|a talking parrot|a football coach at halftime|
a librarian who loves mysteries|a nervous first-time pilot|a famous chef|a sports commentator|
a ghost in an old castle|a superhero on vacation|a park ranger
"""

AUDIENCES3 = ["a ten-year-old", "a group of retirees", "new employees", "a skeptical investor",
              "first-year university students", "a visiting tourist", "a busy parent",
              "a school principal", "someone who has never used a computer", "a team of engineers"]

FORMS = ["an email", "a short poem", "a blog post", "a product description", "a speech",
         "a limerick", "a haiku sequence of three haiku", "a short story", "a news report",
         "a diary entry", "a persuasive essay", "a movie plot summary", "a podcast intro",
         "a travel itinerary", "a recipe-style guide", "a thank-you note", "a press release",
         "a set of interview questions", "a one-act play scene", "a book review"]

CONSTRAINTS3 = ["", "", "", "", " Keep it under 120 words.", " Use no more than five sentences.",
                " Make it humorous.", " Write it in a formal tone.", " Use simple words.",
                " Include a title.", " Use bullet points.", " Make every sentence start with a different letter.",
                " End with a question to the reader.", " Mention at least two numbers or dates."]

CHAT3 = [
    "Write {f} about {t}.", "Write {f} about {t} for {a}.", "Compose {f} that explains {t} to {a}.",
    "Draft {f} inviting people to an event about {t}.",
    "Pretend you are {p}. Describe {t} in your own voice.",
    "Imagine you are {p} and someone asks you for advice about {t}. Reply in character.",
    "Embrace the role of {p} throughout this conversation. What is your opinion of {t}?",
    "You are {p}. Write a short speech to {a} about {t}.",
    "What are the pros and cons of {t}? Give three of each.",
    "How might {t} change in the next twenty years? Explain your reasoning.",
    "Compare {t} and {t2}: what do they have in common, and how do they differ?",
    "Describe the main challenges of {t} and propose a solution for each.",
    "Write a short dialogue between {p} and {p2} who disagree about {t}.",
    "Give five creative ideas for a school project about {t}.",
    "Explain the ethical questions raised by {t}.",
    "What lessons can we learn from {t}? Answer in a few paragraphs.",
    "Outline a short presentation on {t}, with a title for each slide.",
    "Write a catchy slogan and a short paragraph for a campaign about {t}.",
    "Tell me three surprising facts about {t}, and explain why each is surprising.",
    "How would you explain {t} to {a}?",
]

SCIENCE3 = """entropy|plate tectonics|the immune system|supply and demand|inflation|natural selection|
the water cycle|quantum entanglement|the placebo effect|compound interest|photosynthesis in algae|
how vaccines train the body|the Doppler effect|opportunity cost|the carbon cycle|game theory|
how a transistor works|continental drift|the speed of light|cognitive biases|how GPS works|
the stock market|the nitrogen cycle|the scientific method|how batteries store energy|
comparative advantage|the theory of relativity|how the heart pumps blood|machine learning|
the separation of powers|the Industrial Revolution|the Enlightenment|the Cold War|
the causes of World War I|the French Revolution|the printing press|the fall of the Roman Empire|
Impressionism|existentialism|utilitarianism|the social contract|Greek mythology
"""
STEM3 = ["Explain {s} in simple terms.", "What is {s}? Give an everyday example.",
         "Explain {s} to {a}.", "What are the most common misconceptions about {s}?",
         "Describe {s} and why it matters today.",
         "Summarize the key ideas of {s} in five bullet points.",
         "Write a short quiz with three questions and answers about {s}."]

SENTENCES = """The meeting was moved from Tuesday to Thursday because the manager was traveling.|
Our team finished the project two weeks ahead of schedule.|The new library opens at nine in the morning.|
Several customers complained that the app crashes when they upload photos.|
The city plans to plant five hundred trees along the river next spring.|
Sales rose by twelve percent in the third quarter.|The museum will be closed for renovation until June.|
Volunteers collected over two tons of litter from the beach.|The recipe calls for three eggs and a cup of flour.|
Most students said they prefer online homework to paper worksheets.|
The train was delayed by forty minutes due to a signal failure.|The company hired twenty new engineers this year.|
The festival attracted visitors from more than thirty countries.|Prices at the farmers market went up in the summer.|
The school introduced a four-day week as an experiment.|The bridge will reopen after the safety inspection.|
Researchers found that short walks improve concentration.|The restaurant changed its menu to include more vegetarian dishes.|
The power outage lasted for almost six hours.|Our neighbor's dog barks every time the mail arrives.|
The report shows that energy use fell by eight percent.|The new software update fixes the login problem.|
The concert was sold out within an hour.|Local farmers are worried about the dry weather.
"""
EDIT = ["Edit the following paragraph to correct any grammatical errors and make it more formal:\n{x}",
        "Summarize the following text in one sentence:\n{x}",
        "Rewrite the following paragraph so that a child could understand it:\n{x}",
        "Extract the key facts from the following text and list them as bullet points:\n{x}",
        "Turn the following notes into a short, friendly email to a colleague:\n{x}",
        "Identify the main point of the following text, and suggest a headline for it:\n{x}",
        "Translate the following text into French:\n{x}",
        "Rewrite the following paragraph in the style of a news report:\n{x}"]


def _sloppy(rng: random.Random, s: str) -> str:
    """An editing exercise: a sentence with one small error or none."""
    r = rng.random()
    if r < 0.25:
        s = s.replace(" the ", " teh ", 1)
    elif r < 0.45:
        s = s.replace(" was ", " were ", 1)
    elif r < 0.6:
        s = s[0].lower() + s[1:]
    return s


def chat3_prompts(rng: random.Random, n: int) -> list[str]:
    topics, people, science = split_list(TOPICS3), split_list(PEOPLE3), split_list(SCIENCE3)
    sentences = split_list(SENTENCES)
    out = set()
    while len(out) < n:
        kind = rng.random()
        a = rng.choice(AUDIENCES3)
        if kind < 0.6:
            t, t2 = rng.sample(topics, 2)
            p, p2 = rng.sample(people, 2)
            s = rng.choice(CHAT3).format(f=rng.choice(FORMS), t=t, t2=t2, p=p, p2=p2, a=a)
            s += rng.choice(CONSTRAINTS3)
        elif kind < 0.8:
            s = rng.choice(STEM3).format(s=rng.choice(science), a=a)
        else:
            x = " ".join(_sloppy(rng, t) for t in rng.sample(sentences, rng.randint(2, 4)))
            s = rng.choice(EDIT).format(x=x)
        out.add(s)
    return sorted(out)


# Typed stubs with doctest examples, in the shape of a code benchmark's
# problems: (name, params, return type, docstring, reference, input maker).
def _words(r, k=None):
    pool = "cat dog sun apple level noon tree moon stone river bird star radar wind".split()
    return [r.choice(pool) for _ in range(k or r.randint(2, 5))]


def _text(r):
    return " ".join(_words(r, r.randint(2, 5)))


def _matrix(r, square=False):
    rows = r.randint(2, 3)
    cols = rows if square else r.randint(2, 3)
    return [[r.randint(0, 9) for _ in range(cols)] for _ in range(rows)]


def _clock(s):
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _merge(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _intervals(r):
    return [sorted([r.randint(0, 12), r.randint(0, 12)]) for _ in range(r.randint(2, 4))]


def _missing_one(r):
    n = r.randint(3, 7)
    gone = r.randint(0, n)
    return [i for i in range(n + 1) if i != gone]


def _first_unique(s):
    return next((i for i, c in enumerate(s) if s.count(c) == 1), -1)


# None of these is a code benchmark's problem: the eval sets are never
# paraphrased (tests/worker/test_synth_prompts.py checks the function names
# against the eval sets' own).
STUBS3 = [
    ("transpose", "matrix: List[List[int]]", "List[List[int]]", "Return the transpose of a rectangular matrix.",
     lambda m: [list(c) for c in zip(*m)], lambda r: (_matrix(r),)),
    ("moving_average", "values: List[float], k: int", "List[float]",
     "Return the average of every window of k consecutive values, rounded to two decimals.",
     lambda xs, k: [round(sum(xs[i:i + k]) / k, 2) for i in range(len(xs) - k + 1)],
     lambda r: ([float(x) for x in _ints(r, 0, 9, 5)], r.randint(2, 3))),
    ("missing_number", "numbers: List[int]", "int",
     "The list holds every integer from 0 to n exactly once, except one. Return the missing integer.",
     lambda xs: len(xs) * (len(xs) + 1) // 2 - sum(xs),
     lambda r: (_missing_one(r),)),
    ("snake_to_camel", "name: str", "str",
     "Convert a snake_case identifier to camelCase.",
     lambda s: s.split("_")[0] + "".join(w.capitalize() for w in s.split("_")[1:]),
     lambda r: ("_".join(_words(r, r.randint(2, 3))),)),
    ("camel_to_snake", "name: str", "str", "Convert a camelCase identifier to snake_case.",
     lambda s: "".join("_" + c.lower() if c.isupper() else c for c in s),
     lambda r: (r.choice(["userName", "maxValue", "parseHttpRequest", "x", "totalCount", "getId"]),)),
    ("hamming_distance", "a: str, b: str", "int",
     "Return the number of positions at which two strings of equal length differ.",
     lambda a, b: sum(x != y for x, y in zip(a, b)),
     lambda r: tuple(r.choice([["karolin", "kathrin"], ["10110", "10011"], ["abc", "abc"], ["rose", "nose"]]))),
    ("most_common", "numbers: List[int]", "int",
     "Return the value that occurs most often in the list; on a tie, return the smallest such value.",
     lambda xs: min(set(xs), key=lambda x: (-xs.count(x), x)), lambda r: (_ints(r, 0, 5, 6),)),
    ("diagonal_sum", "matrix: List[List[int]]", "int",
     "Return the sum of the main diagonal of a square matrix.",
     lambda m: sum(m[i][i] for i in range(len(m))), lambda r: (_matrix(r, True),)),
    ("invert_dict", "mapping: Dict[str, int]", "Dict[int, str]",
     "Swap the keys and values of a dictionary whose values are all different.",
     lambda d: {v: k for k, v in d.items()},
     lambda r: (dict(zip(r.sample(["a", "b", "c", "d", "e"], 3), r.sample(range(10), 3))),)),
    ("longest_run", "items: List[int]", "int",
     "Return the length of the longest run of equal consecutive elements.",
     lambda xs: max(len(list(g)) for _, g in __import__("itertools").groupby(xs)),
     lambda r: (_ints(r, 0, 2, 7),)),
    ("acronym", "phrase: str", "str", "Return the acronym of a phrase: the first letter of each word, in upper case.",
     lambda s: "".join(w[0].upper() for w in s.split()),
     lambda r: (r.choice(["portable network graphics", "as soon as possible", "central processing unit",
                          "frequently asked questions", "random access memory"]),)),
    ("percent_change", "old: float, new: float", "float",
     "Return the percentage change from old to new, rounded to one decimal place.",
     lambda a, b: round((b - a) / a * 100, 1), lambda r: (float(r.randint(10, 90)), float(r.randint(5, 120)))),
    ("is_leap_year", "year: int", "bool",
     "Return True if the year is a leap year in the Gregorian calendar.",
     lambda y: y % 4 == 0 and (y % 100 != 0 or y % 400 == 0),
     lambda r: (r.choice([1900, 2000, 2023, 2024, 1996, 2100]),)),
    ("seconds_to_clock", "seconds: int", "str",
     "Format a number of seconds as a clock string HH:MM:SS.", _clock, lambda r: (r.randint(0, 40000),)),
    ("clock_to_seconds", "clock: str", "int",
     "Convert a clock string HH:MM:SS to the number of seconds since midnight.",
     lambda c: sum(int(x) * m for x, m in zip(c.split(":"), (3600, 60, 1))),
     lambda r: (_clock(r.randint(0, 86399)),)),
    ("dot_product", "a: List[int], b: List[int]", "int",
     "Return the dot product of two vectors of the same length.",
     lambda a, b: sum(x * y for x, y in zip(a, b)), lambda r: (_ints(r, -3, 6, 3), _ints(r, -3, 6, 3))),
    ("manhattan_distance", "p: Tuple[int, int], q: Tuple[int, int]", "int",
     "Return the Manhattan distance between two points on a grid.",
     lambda p, q: abs(p[0] - q[0]) + abs(p[1] - q[1]),
     lambda r: ((r.randint(-5, 5), r.randint(-5, 5)), (r.randint(-5, 5), r.randint(-5, 5)))),
    ("kth_largest", "numbers: List[int], k: int", "int",
     "Return the k-th largest element of the list (k = 1 is the largest).",
     lambda xs, k: sorted(xs, reverse=True)[k - 1], lambda r: (_ints(r, 0, 30, 5), r.randint(1, 3))),
    ("merge_intervals", "intervals: List[List[int]]", "List[List[int]]",
     "Merge all overlapping intervals and return them sorted by their start.", _merge,
     lambda r: (_intervals(r),)),
    ("clamp_all", "values: List[int], low: int, high: int", "List[int]",
     "Limit every value to the range from low to high.",
     lambda xs, lo, hi: [min(max(x, lo), hi) for x in xs], lambda r: (_ints(r), 0, r.randint(5, 10))),
    ("zip_to_dict", "keys: List[str], values: List[int]", "Dict[str, int]",
     "Build a dictionary from a list of keys and a list of values of the same length.",
     lambda ks, vs: dict(zip(ks, vs)), lambda r: (r.sample(["x", "y", "z", "w"], 3), _ints(r, 0, 9, 3))),
    ("initials", "full_name: str", "str",
     "Return the initials of a full name, each in upper case and followed by a dot.",
     lambda s: "".join(w[0].upper() + "." for w in s.split()),
     lambda r: (r.choice(["ada lovelace", "Alan Mathison Turing", "grace hopper", "Linus Torvalds"]),)),
    ("cumulative_sum", "numbers: List[int]", "List[int]",
     "Return the running totals of the list: the i-th result is the sum of the first i + 1 numbers.",
     lambda xs: list(__import__("itertools").accumulate(xs)), lambda r: (_ints(r),)),
    ("row_maxima", "matrix: List[List[int]]", "List[int]",
     "Return the largest value of each row of the matrix.", lambda m: [max(row) for row in m],
     lambda r: (_matrix(r),)),
    ("word_lengths", "sentence: str", "List[int]",
     "Return the length of each word of the sentence, in order.", lambda s: [len(w) for w in s.split()],
     lambda r: (_text(r),)),
    ("split_even_odd", "numbers: List[int]", "Tuple[List[int], List[int]]",
     "Split the list into its even and its odd numbers, keeping their order.",
     lambda xs: ([x for x in xs if x % 2 == 0], [x for x in xs if x % 2]), lambda r: (_ints(r, 0, 20),)),
    ("count_pairs_with_difference", "numbers: List[int], k: int", "int",
     "Count the pairs of positions i < j whose values differ by exactly k.",
     lambda xs, k: sum(abs(xs[i] - xs[j]) == k for i in range(len(xs)) for j in range(i + 1, len(xs))),
     lambda r: (_ints(r, 0, 6, 5), r.randint(1, 3))),
    ("binary_to_int", "bits: str", "int", "Convert a string of zeros and ones to the integer it represents.",
     lambda b: int(b, 2), lambda r: ("".join(r.choice("01") for _ in range(r.randint(1, 8))),)),
    ("expand_runs", "runs: List[Tuple[str, int]]", "str",
     "Each pair holds a character and a count; return the string with each character repeated count times.",
     lambda rs: "".join(c * k for c, k in rs),
     lambda r: ([(r.choice("abxyz"), r.randint(1, 4)) for _ in range(r.randint(1, 3))],)),
    ("max_profit", "prices: List[int]", "int",
     "Given the price of a stock on each day, return the largest profit from buying on one day and "
     "selling on a later day, or 0 if no profit is possible.",
     lambda ps: max([0] + [ps[j] - ps[i] for i in range(len(ps)) for j in range(i + 1, len(ps))]),
     lambda r: (_ints(r, 1, 15, 5),)),
    ("first_unique_index", "text: str", "int",
     "Return the index of the first character that occurs only once in the text, or -1 if there is none.",
     _first_unique, lambda r: (r.choice(["leetcode", "loveleetcode", "aabb", "swiss", "level", "z"]),)),
    ("celsius_to_fahrenheit", "temperatures: List[float]", "List[float]",
     "Convert each temperature from Celsius to Fahrenheit, rounded to one decimal place.",
     lambda ts: [round(t * 9 / 5 + 32, 1) for t in ts], lambda r: ([float(x) for x in _ints(r, -10, 40, 3)],)),
]
STUB_LEADS3 = ["Write a solution to the following problem and make sure that it passes the tests:",
               "Complete the following Python function:", "Implement the function below:",
               "Fill in the body of this function:"]


def heval3_prompts(rng: random.Random, n_per: int) -> list[str]:
    out = set()
    for name, params, ret, doc, ref, make in STUBS3:
        for _ in range(n_per):
            head, ex = stub_parts(rng, name, params, ret, ref, make,
                                  ("List", "Dict", "Optional", "Tuple"))
            if rng.random() < 0.5:
                body = f'{head}def {name}({params}) -> {ret}:\n    """ {doc}\n{ex}    """\n'
            else:
                body = f'{head}def {name}({params}) -> {ret}:\n    """{doc}\n    For example:\n{ex}    """\n'
            out.add(f"{rng.choice(STUB_LEADS3)}\n```python\n{body}\n```")
    return sorted(out)


FUNC3 = {
    "check whether the given {x} {p}": dict(
        x=["list", "string", "tuple", "number", "dictionary"],
        p=["is empty", "contains only unique elements", "is sorted", "has an even length",
           "contains a given element", "is symmetric", "contains any negative values"]),
    "find the {k} of {w}": dict(
        k=["count", "sum", "index", "position", "length"],
        w=["the longest word in a sentence", "the first vowel in a string", "the maximum element in a list",
           "the common elements of two lists", "the words longer than n characters", "the last digit of a number",
           "the smallest missing positive integer", "the pairs whose sum is k"]),
    "{v} every {u} of a given {c}": dict(
        v=["reverse", "capitalize", "square", "double", "remove", "count"],
        u=["word", "element", "character", "k-th element", "vowel", "digit"],
        c=["string", "list", "sentence", "tuple"]),
    "return the {n} {e} of a list": dict(
        n=["first n", "last n", "k largest", "k smallest", "even-indexed", "odd", "distinct"],
        e=["elements", "numbers", "strings", "items"]),
    "calculate the {q} of {a}": dict(
        q=["area", "perimeter", "average", "sum", "product", "difference"],
        a=["a list of numbers", "a right triangle given its two legs", "two fractions",
           "the digits of an integer", "the diagonals of a rhombus", "a regular polygon",
           "the first n prime numbers", "all odd numbers in a range"]),
    "check if a string {s}": dict(
        s=["starts with a vowel", "ends with a digit", "contains only letters", "is a valid IPv4 address",
           "is a pangram", "contains balanced parentheses", "matches a simple email pattern",
           "has all characters in alphabetical order", "contains two consecutive identical characters"]),
}


def func3_prompts(rng: random.Random, n: int) -> list[str]:
    cands = expand(FUNC3)
    rng.shuffle(cands)
    lead = ["Write a python function to", "Write a function to", "Write a function that can"]
    return sorted({f"{rng.choice(lead)} {c}." for c in cands[:n]})


def main() -> int:
    out = Path(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    rng = random.Random(seed)
    sets = {"synth3-chat": chat3_prompts(rng, 1000), "synth3-heval": heval3_prompts(rng, 12),
            "synth3-func": func3_prompts(rng, 400)}
    write_guarded(out, sets)
    return 0


def write_guarded(out: Path, sets: dict[str, list[str]]) -> None:
    """write_sets without the prompts near an eval prompt (not only equal ones),
    saying per set how many were dropped (rounds 3 and 4)."""
    if EVAL.is_dir():
        guard = EvalGuard.from_dir(EVAL)
        kept = {k: [p for p in v if not guard.near(p)] for k, v in sets.items()}
        for k, v in sets.items():
            print(f"{k}: {len(v) - len(kept[k])} near an eval prompt dropped", file=sys.stderr)
        sets = kept
    write_sets(out, sets)


if __name__ == "__main__":
    sys.exit(main())
