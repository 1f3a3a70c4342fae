"""A fifth round of drafter-training prompts (after synth_prompts.py, 2, 3 and 4),
weighted towards code, where the last round (80% chat) gained most: typed
stubs in a code benchmark's shape on new tasks, with docstrings of several
styles and examples computed by reference implementations (synth_stubs5.py);
one-line "write a function" asks on new tasks, a few with an assert line;
multi-sentence chat asks (writing with a purpose, role-play, plans,
explanations) on new topics; and word problems of new shapes. Seeded, from
this file's and synth_stubs5.py's own templates and word lists; prompts equal
to or near an eval prompt are dropped (services/worker/training/decontam.py).

usage: .venv/bin/python scripts/drafter/synth_prompts5.py OUT_DIR [SEED]
then:  dspark gen-drafter-data --prompts OUT_DIR --out data/selfgen-synth5
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_prompts import expand, split_list  # noqa: E402
from synth_prompts3 import write_guarded  # noqa: E402
from synth_prompts4 import MATH_TAIL4  # noqa: E402
from synth_stubs5 import assert5_prompts, heval5_prompts  # noqa: E402

FUNC5 = {
    "{op} a list of {rec}": dict(
        op=["sort", "find the entry with the largest second field in", "find the entry with the smallest second "
            "field in", "group into a dictionary of lists keyed by the first field", "compute the average second "
            "field of", "keep only the entries above a threshold from", "return the first fields, ordered by the "
            "second, from"],
        rec=["(name, score) pairs", "(product, price) tuples", "(city, population) tuples", "(title, year) records",
             "(employee, salary) pairs", "(date, temperature) readings", "(team, points) tuples"]),
    "return the {agg} of the {sel} in a list of integers": dict(
        agg=["sum", "product", "average", "count", "largest", "smallest"],
        sel=["elements at prime indices", "multiples of three", "elements larger than the one before them",
             "elements between the first and the last zero", "elements that occur exactly twice",
             "perfect squares", "numbers whose digits are all odd", "elements above the list's mean"]),
    "check whether a given string is a valid {f}": dict(
        f=["hexadecimal color code", "time in 24-hour format", "date in the format YYYY-MM-DD", "US ZIP code",
           "MAC address", "ISBN-10 number", "Python identifier", "semantic version such as 1.4.2",
           "Roman numeral below 4000", "phone number in the format 555-123-4567"]),
    "convert {a}": dict(
        a=["a number of minutes into hours and minutes", "a temperature from Kelvin to Celsius",
           "miles to kilometers, rounded to two decimals", "a list of (key, value) pairs into a dictionary of lists",
           "a string of comma-separated numbers into a list of integers", "a 12-hour time such as '7:05 PM' into "
           "24-hour format", "a hexadecimal color code into an RGB tuple", "an RGB tuple into a hexadecimal color "
           "code", "a word into pig latin", "a dictionary into a list of 'key=value' strings",
           "a list of words into an English phrase joined by commas and 'and'", "kilograms to pounds",
           "a number of seconds into a string such as '2 hours, 5 minutes'", "a grade out of 20 into a percentage"]),
    "find the {x} in a grid of integers": dict(
        x=["row with the largest sum", "column with the smallest sum", "number of cells equal to zero",
           "position of the largest value", "sum of the border cells", "sum of every 2 by 2 block",
           "row that holds the most even numbers", "number of distinct values", "cells equal to their row's maximum",
           "length of the longest horizontal run of equal values"]),
    "return the {w} of a sentence{q}": dict(
        w=["word that appears most often", "words sorted by length", "number of capitalized words",
           "words in reverse alphabetical order", "second longest word", "average word length",
           "words that contain a double letter", "first word that repeats", "words that appear exactly once",
           "longest word that starts with a vowel"], q=["", ", ignoring punctuation", ", ignoring case"]),
    "calculate {m}": dict(
        m=["the monthly payment of a loan from its principal, yearly interest rate and number of months",
           "the speed needed to cover a distance in a given time", "the age in whole years of a person born on a "
           "given date", "the total of a shopping cart after a percentage discount code", "the body mass index from "
           "height and weight", "the distance between two points in 3D space", "the angle between the hands of a "
           "clock at a given time", "the price after a sequence of percentage discounts", "the number of square "
           "tiles needed to cover a rectangular floor", "the fuel cost of a trip from its distance, consumption "
           "and fuel price", "the slope and intercept of the line through two points", "the years needed for "
           "savings to double at a given yearly rate", "the number of weekdays between two dates"]),
    "make a new list in which each element of a list of integers is {r}": dict(
        r=["replaced by the sum of its neighbors", "replaced by its rank", "doubled if odd and halved if even",
           "replaced by the number of times it occurs", "replaced by its distance from the list's mean",
           "replaced by the distance to the nearest zero", "replaced by the largest element to its right",
           "rounded to the nearest multiple of five", "replaced by the count of smaller elements after it",
           "replaced by the product of all elements before it"]),
    "{op} in a given string": dict(
        op=["swap each pair of adjacent characters", "replace every digit with its English word",
            "remove the characters that occur more than once", "double every vowel",
            "move all digits to the end, keeping their order", "shift each letter to the next letter of the alphabet",
            "sort the letters of each word", "put a dash between two consecutive odd digits",
            "upper-case every third character", "reverse the text inside each pair of parentheses"]),
    "{op} a dictionary {q}": dict(
        op=["build", "return"],
        q=["that merges two dictionaries by adding the values of shared keys", "of the keys whose values are above "
           "the mean value", "that maps each value to the list of keys holding it", "without the keys whose value "
           "is None", "that turns dotted keys such as 'a.b' into nested dictionaries", "with its keys renamed by a "
           "mapping of old to new names", "sorted by the length of its keys"]),
    "return the {p} of a given positive integer": dict(
        p=["number of trailing zeros in the factorial", "sum of the proper divisors", "largest digit",
           "product of the nonzero digits", "digits sorted in ascending order", "number of steps to reach one by "
           "halving when even and subtracting one when odd", "smallest prime greater than it",
           "eight-bit binary string", "multiplicative persistence", "number of distinct prime factors",
           "nearest palindrome", "digits rotated left by one place"]),
    "simulate {s}": dict(
        s=["a bank account that refuses withdrawals larger than its balance", "a traffic light through n changes",
           "a vending machine that returns change in the fewest coins", "an elevator serving a list of floor requests",
           "a parking lot with a fixed number of spaces", "n rolls of two dice and return the most common total",
           "a library that lends and takes back books", "a thermostat that heats below a target temperature"]),
}
FUNC_LEADS5 = ["Write a function to", "Write a function to", "Write a python function to",
               "Write a Python function that can"]
FUNC_TAILS5 = ["", "", "", "", " without using any imports", " in a single pass", " using a dictionary",
               " and include a docstring", " and add type hints"]


def func5_prompts(rng: random.Random, n: int, n_assert: int) -> list[str]:
    cands = expand(FUNC5)
    rng.shuffle(cands)
    out = {f"{rng.choice(FUNC_LEADS5)} {c}." for c in cands}
    while len(out) < n - n_assert:
        out.add(f"{rng.choice(FUNC_LEADS5)} {rng.choice(cands)}{rng.choice(FUNC_TAILS5)}.")
    return sorted(out | set(assert5_prompts(rng, n_assert)))


TOPICS5 = """
the history of lighthouses|a village that bans cars on weekends|the first public zoo|night trains coming back to Europe|
the invention of the stethoscope|a school that grows its own food|salt marshes|the Library of Alexandria|
the history of chess clocks|a town that runs on geothermal heat|the Songhai Empire|a repair-it-yourself movement|
the history of the bicycle bell|storm chasers|the Transcontinental Railroad|a neighborhood seed swap|
the invention of the paperclip|fog harvesting in deserts|the history of street lighting|a citizen science bird count|
the Hanging Gardens of Babylon|a floating market|the history of crossword puzzles|snow leopards|a town's first library|
the history of lunch boxes|the Carrington Event|an island without cars|the Oregon Trail|sand dunes that sing|
the invention of the elevator brake|a library of tools and toys|the history of diving bells|glass frogs|
a four-season ice hotel|the Great Stink of London|the history of the compass|a hospital garden|
a museum of broken relationships|the first transatlantic cable"""
PEOPLE5 = """
a lighthouse keeper in 1890|a nervous dragon applying for a job|a cheerful tax inspector|a retired astronaut now
teaching kindergarten|a Victorian ghost who loves the internet|a strict ballet teacher|a talkative taxi-driving robot|
a medieval monk copying books|a detective who is also a cat|an optimistic weather balloon|a 1920s jazz pianist|
a chess-playing octopus|a very polite pirate|a lost time-traveling tourist|a librarian at the end of the world"""
AUDIENCES5 = ["a room of nervous exam takers", "new members of a hiking club", "a group of museum volunteers",
              "parents at a school open day", "readers of a gardening blog", "a team that just lost a match",
              "first-time home buyers", "an audience of night-shift workers"]
ASKS5 = """a short story about a lost umbrella that travels around the world|a welcome speech for a new neighborhood
library|a travel blog post about a weekend in a fishing village|a persuasive essay on why every town needs a repair
café|an email asking a manager for a flexible work schedule|a wedding toast for two marathon runners|
a letter to your future self ten years from now|a short mystery set in a lighthouse|a complaint to an airline about a
lost guitar|a cover letter for a job at an aquarium|an advertisement for a museum sleepover|a eulogy for a beloved old car|
a thank-you email to a mentor who helped you change careers"""
PLANS5 = """a three-day visit to a city you have never seen|a month of learning to cook on a budget|
a week-long program to help a shy teenager make friends|a school's first climate week|a small charity's first
fundraiser|a ten-week plan to run a first 10 km race|a family reunion for forty people|a community clean-up of a river|
moving house with two cats|a weekend workshop on fixing bicycles"""
CHAT5 = [
    "Write {w}. Make it vivid and engaging, and give it a clear structure.",
    "I need to write {w}. Please draft it for me, and keep the tone warm but professional.",
    "Draft {w}. Afterwards, list two ways it could be made more persuasive.",
    "Write {w} for {a}. Keep it under 200 words.",
    "Create a detailed plan for {pl}. Break it into steps, and mention what could go wrong at each step.",
    "Help me organize {pl}. Give me a checklist, a rough budget and a timeline.",
    "I am responsible for {pl}. What should I do first, and how do I keep everyone motivated?",
    "Imagine you are {p}. Describe a typical day in your life, and then share one piece of advice with {a}.",
    "Pretend to be {p} for the rest of this conversation. Introduce yourself and tell me about {t}.",
    "You are {p}. Write a short letter to {a} explaining what {t} means to you.",
    "Explain {t} to {a}. Use one analogy, and finish with a question that makes them think.",
    "Write a blog post about {t}. Give it a catchy title, three subheadings and a short conclusion.",
    "Tell me about {t}. Why does it matter today, and what can we learn from it? Answer in three paragraphs.",
    "Compose a short podcast script in which two hosts discuss {t}. Include an opening line and a closing line.",
    "Describe {t} as if you were writing a museum guide. Keep it under 150 words and end with a fun fact.",
    "Write a persuasive paragraph arguing that schools should teach more about {t}. Then write a paragraph "
    "arguing against it.",
    "Compare {t} and {t2}. What do they have in common? Present your answer as a short essay.",
    "Draft a short interview with {p} about {t}. Include five questions and their answers.",
]


def chat5_prompts(rng: random.Random, n: int) -> list[str]:
    L = {k: split_list(v) for k, v in dict(t=TOPICS5, p=PEOPLE5, w=ASKS5, pl=PLANS5).items()}
    L["p"] = [" ".join(p.split()) for p in L["p"]]
    L["w"] = [" ".join(w.split()) for w in L["w"]]
    L["pl"] = [" ".join(w.split()) for w in L["pl"]]
    out = set()
    while len(out) < n:
        t, t2 = rng.sample(L["t"], 2)
        out.add(rng.choice(CHAT5).format(t=t, t2=t2, p=rng.choice(L["p"]), a=rng.choice(AUDIENCES5),
                                         w=rng.choice(L["w"]), pl=rng.choice(L["pl"])))
    return sorted(out)


NAMES5 = "Anouk Bashir Celeste Dario Esme Femi Gustav Hana Idris Jonah Kalani Leonie Matteo Nadia Osei Pilar".split()
ITEMS5 = ["a tablet", "a telescope", "a skateboard", "a sewing machine", "a keyboard", "a tent", "a guitar amplifier"]


def _math5(rng: random.Random) -> str:
    n1, n2 = rng.sample(NAMES5, 2)
    k = rng.randrange(12)
    if k == 0:
        h, mm, m, w = rng.randint(6, 9), rng.choice([0, 15, 20, 45]), rng.randint(85, 150), rng.randint(10, 40)
        return (f"A movie starts at {h}:{mm:02d} p.m. and lasts {m} minutes. Afterwards {n1} walks home, which takes "
                f"{w} minutes. At what time does {n1} get home?")
    if k == 1:
        s1, s2 = rng.sample([12, 16, 18, 20, 24, 32], 2)
        return (f"A {s1}-ounce box of cereal costs ${rng.randint(25, 60) / 10:.2f} and a {s2}-ounce box costs "
                f"${rng.randint(30, 90) / 10:.2f}. Which box costs less per ounce, and by how many cents per ounce?")
    if k == 2:
        a, b = rng.randint(2, 12), rng.randint(3, 20)
        return (f"{n1} gave half of a sticker collection to {n2}, then gave {a} "
                f"stickers to a cousin and had {b} left. How many stickers did {n1} start with?")
    if k == 3:
        b = rng.randint(4, 20)
        a = rng.randint(2, min(10, 2 * b - 2))
        return f"In {a} years, {n1} will be twice as old as {n2} is now. {n2} is {b} years old. How old is {n1} now?"
    if k == 4:
        sm, lg, ns, nl = rng.randint(2, 3), rng.randint(4, 5), rng.randint(10, 60), rng.randint(10, 60)
        return (f"A café sells small coffees for ${sm} and large coffees for ${lg}. On Saturday it sold {ns + nl} "
                f"coffees and took ${sm * ns + lg * nl}. How many large coffees did it sell?")
    if k == 5:
        base, r1, r2, km, d = rng.randint(2, 5), rng.randint(2, 4), rng.randint(1, 2), rng.randint(3, 8), rng.randint(5, 25)
        return (f"A taxi charges ${base} plus ${r1} per kilometer for the first {km} km and ${r2} per kilometer after "
                f"that. How much does a {d} km ride cost?")
    if k == 6:
        t = rng.choice([6, 12])
        a, b = rng.randint(8, 20), rng.randint(6, 15)
        return (f"{n1} is tiling a kitchen floor that measures {a} feet by {b} feet with square tiles {t} inches on "
                f"each side. How many tiles are needed?")
    if k == 7:
        c, h, w, s = rng.randint(20, 80) * 5, rng.randint(10, 60), rng.randint(15, 40), rng.randint(3, 10)
        return (f"{n1} wants to buy {rng.choice(ITEMS5)} that costs ${c}. {n1} has ${h} saved and earns "
                f"${w} a week walking dogs, but spends ${s} a week on snacks. How many weeks until {n1} can buy it?")
    if k == 8:
        a, b, m = rng.randint(3, 6), rng.randint(12, 20), rng.choice([10, 15, 20, 30])
        return (f"{n1} leaves home walking at {a} km/h. {m} minutes later, {n2} sets off from the same place by bike "
                f"at {b} km/h along the same road. How many minutes after setting off does {n2} catch up?")
    if k == 9:
        a, p, b, c = rng.randint(3, 12) * 20, rng.choice([10, 25, 40, 50]), rng.randint(3, 15), rng.randint(10, 60)
        return (f"A bookshop had {a} copies of a novel. It sold {p}% of them on Monday and {b} more on Tuesday, then "
                f"received a delivery of {c} copies. How many copies does it have now?")
    if k == 10:
        w1, b1, h1, w2, h2 = rng.randint(2, 6), rng.randint(4, 20) * 10, rng.randint(2, 5), rng.randint(3, 9), rng.randint(2, 8)
        return (f"{w1} workers can pack {b1} boxes in {h1} hours. At the same rate, how many boxes can {w2} workers "
                f"pack in {h2} hours?")
    d1, s1, d2, s2 = rng.randint(4, 12) * 10, rng.choice([40, 50, 60]), rng.randint(4, 12) * 10, rng.choice([80, 90, 100])
    return (f"{n1} drove {d1} km at {s1} km/h and then {d2} km at {s2} km/h. What was {n1}'s "
            "average speed for the whole trip?")


def math5_prompts(rng: random.Random, n: int) -> list[str]:
    out = set()
    while len(out) < n:
        out.add(_math5(rng) + rng.choice(MATH_TAIL4))
    return sorted(out)


def main() -> int:
    out = Path(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    rng = random.Random(seed)
    sets = {"synth5-heval": heval5_prompts(rng, 14), "synth5-func": func5_prompts(rng, 450, 60),
            "synth5-chat": chat5_prompts(rng, 350), "synth5-math": math5_prompts(rng, 300)}
    write_guarded(out, sets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
