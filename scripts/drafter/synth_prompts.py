"""Write new drafter-training prompts closer to the eval mix than the shared
training set (which is mostly competition code, maths and long arena-hard
tasks): open chat in the categories of a chat benchmark (writing, roleplay,
reasoning, extraction, STEM, humanities), short "write a python function"
tasks, function stubs with docstrings taken from the Python standard library,
and arithmetic word problems. Everything is built from this file's own
templates and word lists (and the stdlib's docstrings), seeded, so the same
files come out on every machine; nothing is taken from the eval sets.

usage: .venv/bin/python scripts/drafter/synth_prompts.py OUT_DIR [SEED]
then:  dspark gen-drafter-data --prompts OUT_DIR --out data/selfgen-synth
"""
from __future__ import annotations

import importlib
import inspect
import itertools
import json
import random
import sys
import textwrap
from pathlib import Path

TOPICS = """
a weekend in Lisbon|the history of the printing press|urban beekeeping|remote work|electric cars|
learning a second language|the water cycle|a small bakery opening|volunteering at an animal shelter|
the benefits of sleep|climate change and farming|the Roman Empire|public libraries|minimalism|
a mountain hiking trip|the first moon landing|starting a podcast|home composting|chess for beginners|
the invention of the telephone|ocean plastic|a new fitness app|the Renaissance|jazz music|
saving money as a student|a community garden|solar panels|the immune system|a city marathon|
photosynthesis|the Silk Road|video game design|healthy breakfast habits|a local farmers market|
artificial intelligence in hospitals|the French Revolution|coral reefs|time management|
a family reunion|3D printing|the stock market|a road trip across Canada|black holes|
public transport|writing a first novel|the Great Wall of China|vaccines|a job interview|
recycling electronics|the Industrial Revolution|meditation|a science fair project|
a rainy day in Tokyo|desert ecosystems|cybersecurity at home|the Olympic Games|origami|
a museum of modern art|honeybee decline|the human heart|open-source software|a tea ceremony|
wind energy|the Amazon rainforest|a cooking class in Italy|smartphone addiction|
ancient Egyptian pyramids|a school debate club|renewable energy jobs|a winter festival|
online privacy|the theory of evolution|a new coffee shop|learning to play guitar|
the Cold War|volcanoes|a charity bike ride|the history of chocolate|electric scooters|
quantum computers|a lighthouse keeper|fast fashion|the Beatles|a high school reunion|
bird migration|the printing of money|a hackathon|the life of Marie Curie|earthquakes|
a vegetarian diet|space tourism|a village in the Alps|the history of the internet|
board games|the Great Depression|a hospital volunteer program|glaciers|street food in Bangkok
"""

PEOPLE = """a pirate captain|a medieval knight|a detective in 1920s London|a friendly robot|
a nervous first-year teacher|a famous chef|a tour guide in Rome|an astronaut on Mars|
a customer service agent|a wise old wizard|a sports commentator|a park ranger|
a time traveler from the year 3000|a museum curator|a personal fitness coach|
a startup founder pitching to investors|a librarian|a ship's doctor|a news anchor|a grumpy cat
"""

AUDIENCES = ["a five-year-old", "a high school student", "a busy manager", "a retired engineer",
             "someone who has never used a computer", "a first-year university student"]

CHAT = [
    "Compose a blog post about {t}, with a catchy title and three short sections.",
    "Write a short story of about 200 words that involves {t}.",
    "Write a persuasive paragraph arguing that more people should care about {t}.",
    "Draft a polite email to your manager proposing a team workshop on {t}.",
    "Write a haiku and then a limerick about {t}.",
    "Give me five creative ideas for a school project on {t}.",
    "Explain {t} to {a} in simple terms.",
    "What are the main advantages and disadvantages of {t}?",
    "Summarize the most important facts about {t} in a bulleted list.",
    "Write a product description for a new gadget inspired by {t}.",
    "Create a one-week plan for someone who wants to learn about {t}.",
    "Write a speech for a graduation ceremony that mentions {t}.",
    "Pretend you are {p}. Describe your opinion of {t}.",
    "Act as {p} and give advice to a young person about {t}.",
    "Imagine you are {p}. Write a diary entry about a day spent dealing with {t}.",
    "Compare {t} and {t2}. How are they similar and how are they different?",
    "Write a dialogue between two friends who disagree about {t}.",
    "Suggest a title and an outline for a magazine article about {t}.",
    "What are three common misconceptions about {t}, and what is the truth?",
    "Write a short poem that tells the story of {t}.",
    "Describe {t} from the point of view of someone living 200 years ago.",
    "List ten interesting questions someone could ask an expert on {t}.",
    "Write a review of a fictional documentary about {t}.",
    "How might {t} change over the next twenty years? Give reasons.",
    "Write an advertisement script of about 100 words for an event about {t}.",
    "Rewrite the following sentence in a more formal tone: \"{t} is kind of a big deal these days.\"",
    "Describe how {t} affects the environment and what people can do about it.",
    "What skills would a person need to work in a field related to {t}?",
    "Write a thank-you note to a teacher who taught you about {t}.",
    "Give a step-by-step guide for a beginner who wants to get started with {t}.",
]

REASONING = [
    "{n1} is taller than {n2}, and {n2} is taller than {n3}. Who is the shortest? Explain your reasoning.",
    "If all {x}s are {y}s and some {y}s are {z}s, can we conclude that some {x}s are {z}s? Explain.",
    "A bag holds {a} red balls and {b} blue balls. If you draw one ball at random, what is the "
    "probability that it is blue? Show your work.",
    "{n1} has {a} siblings, and each of them has the same number of brothers as sisters. "
    "Is this possible? Think it through.",
    "A train leaves at {h}:00 and travels {a}0 km at {b}0 km/h. When does it arrive? Explain.",
    "In a race, {n1} finished ahead of {n2} but behind {n3}. {n4} finished last. "
    "What was the finishing order?",
]

EXTRACTION = [
    "Extract every person's name and the city they live in from this text, as JSON: "
    "\"{n1} moved to {c1} last year, while {n2} still lives in {c2}. Their friend {n3} "
    "visits {c3} every summer.\"",
    "From the following sentence, list the products and their prices in a table: "
    "\"The shop sells {i1} for ${a}, {i2} for ${b} and {i3} for ${c}.\"",
    "Identify the dates mentioned in this note and sort them: \"Meet {n1} on March {a}, "
    "send the report by January {b}, and book the venue before July {c}.\"",
    "Classify each of these words as a noun, verb or adjective: {w}.",
]

STEM = [
    "Explain how {s} works.", "What is the difference between {s} and {s2}?",
    "Describe a simple experiment that demonstrates {s}.",
    "Why is {s} important in everyday life?", "Write a short quiz with answers about {s}.",
]
SCIENCE = """photosynthesis|Newton's laws of motion|the greenhouse effect|electric circuits|
DNA replication|supply and demand|the Pythagorean theorem|plate tectonics|sound waves|
the periodic table|compound interest|natural selection|the speed of light|magnetism|
cell division|binary numbers|inflation|the scientific method|gravity|friction|
entropy|the human digestive system|machine learning|recursion in programming|
vaccination|the Doppler effect|chemical bonds|probability|the placebo effect|
democracy|the separation of powers|the Enlightenment|opportunity cost|the carbon cycle
"""

NAMES = ("Alice Ben Carla Diego Emma Farid Grace Hiro Ines Jonas Kira Liam Maya Noah Olga Pedro "
         "Quinn Rosa Sam Tara Umar Vera Will Xena Yusuf Zoe").split()
CITIES = "Paris Nairobi Lima Oslo Seoul Denver Cairo Madrid Hanoi Perth Quito Dublin".split()
ITEMS = "apples notebooks candles headphones mugs umbrellas batteries scarves lamps pens".split()
WORDS = "quickly river bright jump happy table run blue sing mountain slowly green eat".split()


def split_list(s: str) -> list[str]:
    return [x.strip() for x in s.split("|") if x.strip()]


def chat_prompts(rng: random.Random, n: int) -> list[str]:
    topics, people, science = split_list(TOPICS), split_list(PEOPLE), split_list(SCIENCE)
    out = set()
    while len(out) < n:
        kind = rng.random()
        if kind < 0.68:
            t, t2 = rng.sample(topics, 2)
            s = rng.choice(CHAT).format(t=t, t2=t2, a=rng.choice(AUDIENCES), p=rng.choice(people))
        elif kind < 0.8:
            s, s2 = rng.sample(science, 2)
            s = rng.choice(STEM).format(s=s, s2=s2)
        elif kind < 0.9:
            n1, n2, n3, n4 = rng.sample(NAMES, 4)
            s = rng.choice(REASONING).format(
                n1=n1, n2=n2, n3=n3, n4=n4, a=rng.randint(2, 9), b=rng.randint(2, 9),
                h=rng.randint(6, 20), x=rng.choice(["cat", "bird", "tree", "car"]),
                y=rng.choice(["animal", "thing", "machine", "plant"]),
                z=rng.choice(["pets", "green things", "fast things", "tall things"]))
        else:
            n1, n2, n3 = rng.sample(NAMES, 3)
            c1, c2, c3 = rng.sample(CITIES, 3)
            i1, i2, i3 = rng.sample(ITEMS, 3)
            s = rng.choice(EXTRACTION).format(
                n1=n1, n2=n2, n3=n3, c1=c1, c2=c2, c3=c3, i1=i1, i2=i2, i3=i3,
                a=rng.randint(2, 28), b=rng.randint(2, 28), c=rng.randint(2, 28),
                w=", ".join(rng.sample(WORDS, 6)))
        out.add(s)
    return sorted(out)


FUNC_TASKS = {
    "find the {q} {e} in a given {c}": dict(
        q=["largest", "smallest", "second largest", "second smallest", "most frequent",
           "first repeated", "first non-repeated", "last even", "first odd"],
        e=["element", "number", "integer"], c=["list", "tuple", "array", "list of lists"]),
    "count the number of {x} in a given string": dict(
        x=["vowels", "consonants", "uppercase letters", "digits", "words", "spaces",
           "special characters", "palindromic substrings", "distinct characters"]),
    "check whether a given number is {p}": dict(
        p=["prime", "a perfect square", "a palindrome", "an Armstrong number", "a power of two",
           "a perfect number", "a Fibonacci number", "even or odd", "a happy number",
           "divisible by 11", "a Harshad number", "a strong number"]),
    "remove {r} from a given {c}": dict(
        r=["duplicates", "all whitespace", "all digits", "the first and last element",
           "empty strings", "all occurrences of a given value", "every second element",
           "all vowels", "the k-th element"], c=["list", "string", "tuple"]),
    "convert {a} to {b}": dict(
        a=["a decimal number", "a binary string", "a snake case string", "a list of strings",
           "a tuple of integers", "degrees", "a Roman numeral", "a dictionary"],
        b=["its binary representation", "an integer", "camel case", "a single string",
           "a list", "radians", "a list of key-value tuples", "an octal number"]),
    "find the {m} of a {s}": dict(
        m=["area", "perimeter", "volume", "surface area", "diagonal length"],
        s=["circle", "square", "rectangle", "cube", "sphere", "cylinder", "cone", "trapezium",
           "rhombus", "regular hexagon", "triangular prism", "pyramid"]),
    "find the n-th {k} number": dict(
        k=["Fibonacci", "Catalan", "triangular", "pentagonal", "Lucas", "hexagonal", "Bell",
           "Jacobsthal", "octagonal", "tetrahedral", "star", "centered hexagonal"]),
    "sort a {c} {b}": dict(
        c=["list of tuples", "list of dictionaries", "list of strings", "matrix", "list of words"],
        b=["by its second element", "by a given key", "by length", "by the sum of each row",
           "in descending order", "alphabetically ignoring case", "by the last character"]),
    "{op} two {c}": dict(
        op=["merge", "find the common elements of", "find the difference between",
            "interleave", "zip", "compare", "add element-wise"],
        c=["sorted lists", "dictionaries", "tuples", "sets", "lists of equal length", "strings"]),
    "compute the {agg} of {w}": dict(
        agg=["sum", "product", "average", "median", "maximum", "cumulative sum"],
        w=["the digits of a number", "all even numbers up to n", "the squares of the first n "
           "natural numbers", "the cubes of the first n odd numbers", "a nested list",
           "the values in a dictionary", "all numbers in a string"]),
}


def expand(patterns: dict[str, dict[str, list[str]]]) -> list[str]:
    """Every pattern filled with every combination of its slots' values (pattern
    order, then the slots' product in their order)."""
    return [pattern.format(**dict(zip(slots, values)))
            for pattern, slots in patterns.items()
            for values in itertools.product(*slots.values())]


def func_prompts(rng: random.Random, n: int) -> list[str]:
    cands = expand(FUNC_TASKS)
    rng.shuffle(cands)
    lead = ["Write a python function to", "Write a function to", "Write a Python function that can"]
    return sorted(f"{rng.choice(lead)} {c}." for c in cands[:n])


STUB_MODULES = ("textwrap string statistics bisect heapq fractions difflib shlex fnmatch "
                "posixpath colorsys calendar html base64 functools random urllib.parse "
                "email.utils ipaddress copy glob keyword pprint quopri zipfile tarfile "
                "csv json.decoder json.encoder _pydecimal _pydatetime ntpath gettext locale "
                "inspect dis ast tokenize argparse configparser shutil tempfile "
                "collections collections.abc enum dataclasses typing operator weakref "
                "http.cookies mimetypes imghdr sndhdr wave uuid secrets hmac graphlib "
                "plistlib sched queue threading subprocess logging optparse getopt "
                "reprlib netrc smtplib ftplib pathlib datetime decimal numbers").split()
LEADS = ["Write a solution to the following problem and make sure that it passes the tests:",
         "Complete the following Python function:",
         "Implement the function below so that it does what its docstring says:"]


def stub_prompts(rng: random.Random, n: int) -> list[str]:
    out = {}
    for mod_name in STUB_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except Exception:
            continue
        objs = []
        for name, obj in vars(mod).items():
            if name.startswith("_"):
                continue
            if inspect.isfunction(obj) and obj.__module__ == mod.__name__:
                objs.append((name, obj))
            elif inspect.isclass(obj) and obj.__module__ == mod.__name__:
                objs += [(m, f) for m, f in vars(obj).items()
                         if inspect.isfunction(f) and not m.startswith("_")]
        for name, fn in objs:
            doc = inspect.getdoc(fn)
            if not doc or len(doc) < 60 or len(doc) > 900:
                continue
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                continue
            body = textwrap.indent(f'"""{doc}\n"""', "    ")
            out.setdefault(f"{name}{sig}", f"```python\ndef {name}{sig}:\n{body}\n```")
    keys = sorted(out)
    rng.shuffle(keys)
    return sorted(f"{rng.choice(LEADS)}\n{out[k]}" for k in keys[:n])


MATH = [
    "{n1} has {a} {i}. {pr} buys {b} more and then gives {c} to a friend. How many {i} does "
    "{n1} have now?",
    "A shop sells {i} for ${a} each. {n1} buys {b} of them and pays with a ${d} bill. How much "
    "change does {n1} get?",
    "{n1} reads {a} pages every weekday and {b} pages on each day of the weekend. How many pages "
    "does {n1} read in {c} weeks?",
    "A farmer has {a} rows of trees with {b} trees in each row. {c} trees are cut down. How many "
    "trees are left?",
    "{n1} earns ${a} an hour and works {b} hours a day for {c} days. {pr} spends a quarter of "
    "the money on rent. How much money is left?",
    "A recipe needs {a} cups of flour for {b} cookies. How many cups of flour are needed for "
    "{e} cookies?",
    "{n1} is {a} years old. {n2} is {b} years older than {n1}, and {n3} is twice as old as "
    "{n2}. What is the sum of their ages?",
    "A tank holds {d} liters of water. It leaks {a} liters every hour, and {b} liters are added "
    "every {c} hours. How much water is in the tank after {e} hours?",
    "{n1} runs {a} km on Monday, {b} km more on Tuesday than on Monday, and half of Tuesday's "
    "distance on Wednesday. How far does {n1} run in the three days?",
    "There are {d} students in a school. {a} percent of them play football and {b} percent of "
    "the rest play chess. How many students play chess?",
]


def math_prompts(rng: random.Random, n: int) -> list[str]:
    out = set()
    while len(out) < n:
        n1, n2, n3 = rng.sample(NAMES, 3)
        a, b, c = rng.randint(2, 40), rng.randint(2, 30), rng.randint(2, 9)
        s = rng.choice(MATH).format(n1=n1, n2=n2, n3=n3, pr=rng.choice(["She", "He"]),
                                    i=rng.choice(ITEMS), a=a, b=b, c=c, d=rng.randint(5, 20) * 50,
                                    e=b * rng.randint(2, 6))
        out.add(s + "\nPlease reason step by step, and put your final answer within \\boxed{}.")
    return sorted(out)


def eval_prompts() -> set[str]:
    """Every turn of the eval sets (../shared/datasets/eval), when present."""
    root = Path(__file__).resolve().parents[3] / "shared/datasets/eval"
    return {t for f in sorted(root.glob("*.jsonl"))
            for line in f.read_text(encoding="utf-8").split("\n") if line.strip()
            for t in json.loads(line)["turns"]}


def main() -> int:
    out = Path(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    rng = random.Random(seed)
    sets = {"synth-chat": chat_prompts(rng, 1400), "synth-pyfunc": func_prompts(rng, 500),
            "synth-stubs": stub_prompts(rng, 400), "synth-math": math_prompts(rng, 250)}
    write_sets(out, sets)
    return 0


def write_sets(out: Path, sets: dict[str, list[str]]) -> None:
    """One {"turns": [prompt]} JSONL file per set. A short template task can
    coincide with an eval prompt ("Write a function to find the volume of a
    sphere."): never train on one (dropped after drawing, so the other prompts
    stay the same)."""
    evals = eval_prompts()
    out.mkdir(parents=True, exist_ok=True)
    for name, prompts in sets.items():
        prompts = [p for p in prompts if p not in evals]
        (out / f"{name}.jsonl").write_text(
            "".join(json.dumps({"turns": [p]}) + "\n" for p in prompts), encoding="utf-8")
        print(f"{name}: {len(prompts)} prompts", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
