"""A sixth round of drafter-training prompts (after synth_prompts.py to 5),
aimed at the weakest eval sets: chat in a chat benchmark's shape first, then
typed code stubs. About 45% multi-sentence chat asks with a purpose (writing
in new genres for a named audience, role-play scenes, explanations of new
concepts, advice, what-if questions, decisions, critiques of a given draft,
multi-part asks); 25% typed stubs in a code benchmark's shape on 50 new tasks,
with docstrings and examples computed by reference implementations
(synth_stubs6.py); 15% one-line "write a function" asks on new tasks, a few
with an assert line; 15% word problems of new shapes. Seeded, from this
file's and synth_stubs6.py's own templates and word lists (none repeats an
earlier round's); prompts equal to or near an eval prompt are dropped
(services/worker/training/decontam.py).

usage: .venv/bin/python scripts/drafter/synth_prompts6.py OUT_DIR [SEED]
then:  dspark gen-drafter-data --prompts OUT_DIR --out data/selfgen-synth6
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_prompts import expand, split_list  # noqa: E402
from synth_prompts3 import write_guarded  # noqa: E402
from synth_prompts4 import MATH_TAIL4  # noqa: E402
from synth_stubs6 import assert6_prompts, heval6_prompts  # noqa: E402

FUNC6 = {
    "score {g}": dict(
        g=["a blackjack hand given as a list of card names", "a word in Scrabble",
           "a round of rock-paper-scissors between two players", "a game of darts from a list of (number, ring) throws",
           "a bowling game from a list of the pins knocked down by each roll",
           "five dice in Yahtzee as three of a kind, full house or nothing", "a tic-tac-toe board by returning "
           "its winner", "a quiz in which a right answer earns a point and a wrong one loses half a point"]),
    "take a list of {rec} and {op}": dict(
        rec=["(name, age) tuples", "dictionaries with 'name' and 'age' keys"],
        op=["return the names of the people older than a given age", "return the names sorted by age and then by "
            "name", "count the people in each decade of age", "find the youngest and the oldest person",
            "return the average age rounded to one decimal", "group the names by their first letter"]),
    "take a list of (start, end) meeting times in hours and {op}": dict(
        op=["return the free gaps between 9 and 17", "count the pairs of meetings that overlap",
            "find the longest meeting", "return the total time spent in meetings, counting overlaps once",
            "check whether any two meetings clash", "find the smallest number of rooms needed"]),
    "return the {x} of a list of 'HH:MM' times": dict(
        x=["time closest to noon", "gaps in minutes between consecutive times", "earliest time after a given time",
           "span in minutes from the earliest to the latest", "times sorted from earliest to latest",
           "number of times before midday"]),
    "check whether a positive integer is {k}": dict(
        k=["an automorphic number", "an abundant number", "a deficient number", "a Kaprekar number",
           "a Smith number", "a Disarium number", "a neon number", "a spy number, whose digit sum equals its "
           "digit product", "a Keith number", "a duck number, which holds a zero but does not start with one"]),
    "encode a string {e}": dict(
        e=["in Morse code, separating words with ' / '", "with the Atbash cipher", "by replacing each letter with "
           "its position in the alphabet", "in the NATO phonetic alphabet", "with a rail fence cipher of two rails",
           "by replacing each vowel with the next vowel"]),
    "format {x}": dict(
        x=["a float as a price with a currency symbol, thousands separators and two decimals",
           "a list of numbers as a right-aligned column of text", "ten digits as a phone number like (555) 123-4567",
           "a number of seconds as 'MM:SS'", "a list of dictionaries as a plain text table",
           "a date 'YYYY-MM-DD' as 'March 5, 2024'", "a fraction as a percentage with one decimal",
           "a full name as 'Last, First'"]),
    "for a spreadsheet, {op}": dict(
        op=["convert a column label such as 'AB' to its number", "convert a column number to its label",
            "convert a cell name such as 'C7' into a (row, column) pair", "add up a range such as 'A1:B3' from a "
            "dictionary of cell values"]),
    "return {x} as a list of strings": dict(
        x=["a staircase of '#' characters of height n", "a hollow square of '*' with side n",
           "a diamond of '*' that is n rows tall at its widest", "a calendar page for a given month and year",
           "a list of lines framed by a border of '='", "a multiplication table from 1 to n"]),
    "{op} in a list of words": dict(
        op=["group the anagrams", "find the words that are rotations of the first word",
            "find the pairs of words that share their last two letters", "find the words that can be typed with "
            "the letters of one keyboard row", "find the words whose letters are in alphabetical order",
            "count the words that contain every vowel"]),
    "calculate {m}": dict(
        m=["the change owed as the fewest notes and coins", "the parking fee for a stay in minutes when the first "
           "half hour is free", "the shipping cost of a parcel from its weight using weight bands",
           "the balance of a deposit after n years of yearly interest", "the calories burned on a walk from its "
           "distance and the walker's weight", "a grade point average from a list of (letter grade, credits) pairs",
           "the electricity bill from a month's first and last meter readings",
           "how long a download takes from its size in megabytes and a speed in megabits per second"]),
    "return the {x} two lists of integers": dict(
        x=["values that appear in exactly one of", "element-wise maximum of", "positions where the values differ in",
           "number of values shared, counting repeats, by", "length of the common start of"]),
    "{t}": dict(
        t=["return the index of the first character where two strings differ",
           "check whether one insertion, deletion or replacement turns one string into another",
           "count the positions at which two strings hold the same character",
           "check whether one string is a rotation of another", "decode a message written in Morse code",
           "decode a message written with the Atbash cipher", "turn a title into a URL slug",
           "shorten a text to a number of characters without cutting a word, adding '...'",
           "center a string in a given width with a fill character", "count the groups of consecutive vowels in a word",
           "count the ways to make an amount from a list of coin values",
           "return the date of the n-th given weekday of a month", "add a number of days to a date 'YYYY-MM-DD'",
           "expand a string such as '1-3,7' into a list of numbers", "return the k most frequent words of a text",
           "count the inversions in a list of integers", "split a list around a pivot into smaller, equal and "
           "larger values", "return the cells of a grid that are smaller than all four of their neighbors",
           "return how many floors an elevator travels to serve a list of floor requests",
           "fill a list of (item, quantity) orders from a stock dictionary, skipping the ones that cannot be filled",
           "return the BMI category of a person from weight and height"]),
}
FUNC_LEADS6 = ["Write a function to", "Write a function to", "Write a python function to",
               "Write a Python function that can", "Create a Python function to"]
FUNC_TAILS6 = ["", "", "", "", " and return the result", " with a docstring and two examples",
               " using only the standard library", " and explain its time complexity", " with type hints"]


def func6_prompts(rng: random.Random, n: int, n_assert: int) -> list[str]:
    cands = expand(FUNC6)
    rng.shuffle(cands)
    out = {f"{rng.choice(FUNC_LEADS6)} {c}." for c in cands}
    while len(out) < n - n_assert:
        out.add(f"{rng.choice(FUNC_LEADS6)} {rng.choice(cands)}{rng.choice(FUNC_TAILS6)}.")
    return sorted(out | set(assert6_prompts(rng, n_assert)))


TOPICS6 = """
the history of the shipping container|a town that lends out bicycles for free|the Dutch tulip mania|
urban rooftop farms|the history of the metronome|the Antikythera mechanism|a school with no homework|
the first ambulance services|river dolphins|the shrinking of the Aral Sea|the history of the teddy bear|
a night at a mountain observatory|the Pony Express|volunteer lifeguards|the history of sign language|
a library inside a train station|the Svalbard seed vault|coffee cooperatives in Colombia|the history of the
fountain pen|wolves returning to Yellowstone|the Great Molasses Flood|cities that paint their roofs white|
the history of the weather vane|monarch butterfly migration|the Mali Empire under Mansa Musa|
the history of the alarm clock|a village that talks in whistles|community fridges|the history of roller skates|
the Terracotta Army|the first public swimming pools|an orchestra that plays recycled instruments|
the history of the sandwich|lichens|the Berlin Airlift|the Cahokia mounds|dark-sky parks|tardigrades|
the Channel Tunnel|a pumpkin boat regatta|the history of the escalator|the Voynich manuscript"""
PEOPLE6 = """
a medieval mapmaker|a retired circus strongman|a cranky museum night guard|a vending machine that has come to
life|a 1950s radio quiz host|an apprentice alchemist|a Roman gladiator on his day off|the cook at a polar research
station|a shy theater stage manager|a Martian exchange student|a hopelessly romantic toaster|a Wild West
stagecoach driver|a beekeeper who talks to her bees|a chess clock with strong opinions|an ancient Maya astronomer|
the conductor of the last steam train"""
AUDIENCES6 = ["new volunteers at a food bank", "eleven-year-olds on a school trip", "the staff of a small hotel",
              "a city council meeting", "listeners of a late-night podcast", "a class of adult learners",
              "people waiting in a long queue", "a youth football team", "new parents", "a room of retired teachers"]
GENRES6 = """a one-minute radio news bulletin|a crowdfunding campaign page|a public service announcement|
a LinkedIn post|a short op-ed|a villanelle|a spoken-word poem|a riddle in verse|a pitch for a television series|
the opening of a children's novel|a guided audio tour script|a school assembly talk|a newsletter feature|
a set of five trivia cards|a letter to a pen pal abroad|an inscription for a commemorative plaque|
an exhibition leaflet|a bedtime story|a mock-documentary voice-over|a one-page comic script|a travel journal entry|
the opening of a TED-style talk|a postcard from the year 2080"""
CONCEPTS6 = """
how noise-cancelling headphones work|the bystander effect|how credit scores work|regression to the mean|
the Dunning-Kruger effect|why bread dough rises|how a bill becomes a law|Occam's razor|how a refrigerator
keeps food cold|why leaves change color in autumn|the difference between weather and climate|how carbon dating
works|how a search engine ranks pages|the anchoring effect|how airplane wings create lift|the prisoner's dilemma|
why we have leap years|survivorship bias|the butterfly effect|how 3D glasses work|the multiplier effect in
economics|how the kidneys clean the blood|why onions make people cry|the habitable zone around a star|herd
immunity|how earthquakes are measured"""
ADVICE6 = """
I just got my first credit card and I am afraid of getting into debt|My teenage son plays video games all night|
I have to give a speech at my sister's wedding and I am terrified|I keep buying books that I never read|
My elderly father refuses to stop driving|I was offered a promotion that means moving away from my friends|
My small online shop gets visitors but almost no sales|I want to learn to draw but I think I have no talent|
A coworker keeps presenting my ideas as his own in meetings|I moved to a new town and feel lonely at weekends|
Snails are eating everything in my vegetable garden|I lose focus after twenty minutes of studying|
Our book club has turned into a gossip club|I want to ask for a raise but do not know how much to ask for"""
WHATIF6 = """
every city banned private cars|people needed only two hours of sleep a night|the internet went down for a whole
month|it rained every afternoon everywhere on Earth|money had to be spent within a year of being earned|
everyone had to change jobs every five years|the Moon were twice as close to Earth|nobody could tell a lie for
a whole day|all schools held their lessons outdoors|paper had never been invented|every home had to grow its own
food|pets could talk but only once a day"""
DECISIONS6 = """
buy an electric bike or keep taking the bus|learn Spanish or Mandarin|rent a flat in the city center or a house
in the suburbs|take a gap year before university|start a side business or save more money|adopt an older dog or
a puppy|go back to school at forty|accept a job with a long commute and a higher salary|sell my car and use car
sharing instead|work from a café instead of from home"""
DRAFTS6 = """
Our new café are opening next week and we hope you will come because the coffee is good and also the cakes.|
Dear team, the meeting is moved. Please come. It is important. Thanks.|
Join the running club! Running is good. You will like it. We run on Tuesdays.|
The museum have many old things and you can look at them for a long time if you wants.|
We regret to inform you that your order was late due to reasons. Sorry.|
Recycling is good for the planet so you should do it because it is good for the planet.|
Hi, I am writing to apply for the job because I need a job and I think I would be good.|
Our town festival is happening soon and there will be lots of stuff to do and things to see."""
SCENES6 = """walked into your workplace by mistake|asked you for directions to the nearest library|told you that
I have never seen the sea|asked you what you had for breakfast|complained that my soup is cold|asked for your
autograph|asked you to explain your job to my children|told you that I want your job one day|brought you a
present wrapped in newspaper|asked you about the worst day of your career"""
CONSTRAINTS6 = ["", "", "", "", "", " Please keep it under 200 words.", " Use no more than three paragraphs.",
                " Write it in the present tense.", " Avoid clichés.", " End each paragraph with a question.",
                " Use at least one simile.", " Keep the sentences short and simple.",
                " Include a list of three key points.", " Finish with a memorable one-line summary."]
CHAT6 = [
    # writing with a purpose
    "Write {g} about {t} for {a}. The goal is to get them excited about it, so keep the tone lively.{k}",
    "I have to prepare {g} on {t}. Write a first draft, then tell me which part would benefit most from a personal "
    "story.{k}",
    "Create {g} about {t}. Start with a hook, give three concrete details, and end with something the reader can do "
    "next.{k}",
    "My manager asked me for {g} about {t}, aimed at {a}. Please write it, and then suggest a title.{k}",
    "Develop an outline for {g} about {t}, with key points and subheadings, and then write its opening paragraph.",
    "Write two versions of {g} about {t}, one serious and one playful. Then say which would work better for {a}, "
    "and why.",
    # role-play
    "Let's role-play. You are {p}, and I have just {sc}. Reply in character, in four or five sentences.",
    "Stay in the role of {p}. I have just {sc}. How do you respond? Then, out of character, explain what made your "
    "reply fit the role.",
    "As {p}, write a short diary entry about the day you first heard about {t}.{k}",
    "You are {p}, giving a five-minute talk to {a} about {t}. Write the talk, and include one joke that {p} would "
    "tell.",
    "Write a letter from {p} to {p2} about {t}, and then write the reply.{k}",
    # explanations
    "Explain {c}. Start with a one-sentence definition, then give an example from daily life, and end with a common "
    "misunderstanding.",
    "I am helping {a} prepare for a quiz. Explain {c} in a way they will remember, and write two quiz questions about "
    "it with answers.",
    "What is {c}, and why should anyone outside a laboratory care about it? Use a comparison with cooking or sport.",
    "Explain {c} and {c2}, and then describe one situation where both matter at the same time.",
    "Give a short explanation of {c} for {a}, followed by three questions they might ask and your answers.",
    # advice
    "{s}. Without asking me any questions, tell me the three most important things to do, in order of priority, and "
    "why.",
    "Here is my situation: {s}. Give me a realistic plan for the next two weeks, and tell me how I will know it is "
    "working.",
    "{s}. Write the message I could send to explain this to the person involved, keeping it kind and clear.",
    "A friend writes to me: \"{s}.\" Write a thoughtful reply of about 150 words that shows empathy and offers two "
    "suggestions.",
    # what-if and decisions
    "What would happen if {w}? Consider the effects on daily life, on work and on nature, and finish with your own "
    "view.",
    "Imagine a world where {w}. Describe a typical morning there, and then list three problems people would face.",
    "Write a short news report from the day when {w}. Include a quote from {p}.{k}",
    "I am trying to decide whether to {d}. Give me the strongest argument on each side, then ask me the one "
    "question that would settle it.",
    "Should I {d}? Give a balanced answer with a short table of pros and cons, and end with a recommendation for "
    "someone on a tight budget.",
    # critique and revision of a given draft
    "Here is a draft: \"{x}\" Point out two weaknesses in it, then rewrite it to be clearer and more engaging.",
    "Improve this text for {a}: \"{x}\" Keep the meaning, change the tone to suit them, and list your main changes.",
    # multi-part asks
    "First, sum up what most people know about {t} in two sentences. Second, share a lesser-known fact about it. "
    "Finally, suggest a question for a class discussion.",
    "Write a quiz of five questions about {t}, with the answers, and then a paragraph that ties the answers "
    "together.",
    "Tell the story of {t} in three acts: the beginning, the turning point and what came after. Keep each act to one "
    "paragraph.",
    "Plan a one-day event about {t} for {a}: give it a name, a schedule of four activities and a short invitation.",
    "Compare how {a} and {a2} might see {t}. Write one paragraph for each point of view and one on what they share.",
]


def chat6_prompts(rng: random.Random, n: int) -> list[str]:
    L = {k: [" ".join(x.split()) for x in split_list(v)] for k, v in dict(
        t=TOPICS6, p=PEOPLE6, g=GENRES6, c=CONCEPTS6, s=ADVICE6, w=WHATIF6, d=DECISIONS6, x=DRAFTS6,
        sc=SCENES6).items()}
    out = set()
    while len(out) < n:
        t, t2 = rng.sample(L["t"], 2)
        p, p2 = rng.sample(L["p"], 2)
        c, c2 = rng.sample(L["c"], 2)
        a, a2 = rng.sample(AUDIENCES6, 2)
        out.add(rng.choice(CHAT6).format(
            t=t, t2=t2, p=p, p2=p2, c=c, c2=c2, a=a, a2=a2, g=rng.choice(L["g"]), s=rng.choice(L["s"]),
            w=rng.choice(L["w"]), d=rng.choice(L["d"]), x=rng.choice(L["x"]), sc=rng.choice(L["sc"]),
            k=rng.choice(CONSTRAINTS6)))
    return sorted(out)


NAMES6 = ("Aiko Bram Cyrus Delia Emeka Freya Gideon Hester Ingrid Javier Kofi Lorena Mateus Nia Otto Paloma Rohan "
          "Saskia Thiago Wanjiru").split()
MONTHS6 = [("March", 31), ("April", 30), ("May", 31), ("June", 30), ("September", 30), ("October", 31)]
GOODS6 = [("melons", "a crate"), ("pumpkins", "a cart"), ("bottles of juice", "a box"), ("bricks", "a pallet")]


def _math6(rng: random.Random) -> str:
    n1, n2 = rng.sample(NAMES6, 2)
    k = rng.randrange(14)
    if k == 0:
        (mo, days), d, a, b = rng.choice(MONTHS6), rng.randint(1, 28), rng.choice([14, 21, 28]), rng.choice([7, 14])
        return (f"{n1} borrowed a library book on {mo} {d}. The loan lasts {a} days, and {n1} renewed it once for "
                f"another {b} days. {mo} has {days} days. On what date is the book due?")
    if k == 1:
        p, x, m = rng.randint(2, 9), rng.randint(2, 4), rng.randint(5, 20)
        return (f"A shop sells notebooks for ${p} each with a 'buy {x}, get one free' offer. How much does {n1} pay "
                f"for {m} notebooks?")
    if k == 2:
        a, p1, b, p2, p3 = rng.randint(20, 80), rng.choice([1, 2, 3]), rng.randint(10, 50), rng.choice([2, 5]), rng.choice([5, 8, 10])
        goal = a * p1 + b * p2 + rng.randint(5, 30) * p3
        return (f"The school choir wants to raise ${goal} for a trip. It sold {a} cookies at ${p1} each and {b} raffle "
                f"tickets at ${p2} each. How many ${p3} car washes does it still need to reach its goal?")
    if k == 3:
        x = rng.randint(3, 9)
        v = (x + 1) * rng.randint(2, 12) * 50
        return (f"A bottle of fruit syrup says to mix 1 part syrup with {x} parts water. {n1} wants to make {v} ml of "
                f"drink for a party. How many milliliters of syrup and of water are needed?")
    if k == 4:
        base, c, t = rng.randint(15, 30) * 100, rng.choice([5, 8, 10, 12]), rng.randint(5, 20) * 1000
        s = t + rng.randint(1, 30) * 500
        return (f"{n1} earns a base salary of ${base} a month plus a {c}% commission on sales above ${t}. Last month "
                f"{n1} sold ${s} worth of furniture. How much did {n1} earn last month?")
    if k == 5:
        m, p = rng.choice([2, 3, 4, 5]), rng.randint(6, 15)
        L = m * rng.randint(8, 40)
        return (f"{n1} is building a straight fence {L} meters long with a post every {m} meters, including one at "
                f"each end. Each post costs ${p}. How much do the posts cost in total?")
    if k == 6:
        m, h, mm = rng.choice([12, 15, 18, 20, 25]), rng.randint(5, 7), rng.choice([0, 5, 10])
        h2, mm2 = h + rng.randint(1, 3), rng.randint(0, 59)
        return (f"Trains leave a station every {m} minutes, starting at {h}:{mm:02d} a.m. {n1} reaches the platform "
                f"at {h2}:{mm2:02d} a.m. How many minutes does {n1} wait for the next train?")
    if k == 7:
        x, r1, r2 = rng.randint(4, 20) * 50, rng.choice([0.8, 0.9]), rng.choice([0.8, 1.0, 1.25])
        s = rng.randint(4, int(x * r1) // 20 - 1) * 20  # less than the euros bought
        return (f"Before a trip, {n1} changed ${x} into euros at {r1} euros per dollar. {n1} spent {s} euros and "
                f"changed the rest back at {r2} euros per dollar. How many dollars did {n1} get back?")
    if k == 8:
        n, rounds, m, b = rng.randint(5, 12), rng.choice(["once", "twice"]), rng.choice([20, 30, 45]), rng.randint(2, 4)
        return (f"In a chess club tournament, each of the {n} players plays every other player {rounds}. Each game "
                f"takes {m} minutes and {b} games can be played at the same time. How many hours does the tournament "
                f"take at the least?")
    if k == 9:
        (goods, box), c, w, each, j = rng.choice(GOODS6), rng.randint(6, 20), rng.randint(2, 6), rng.randint(2, 8), rng.randint(3, 25)
        return (f"{box.capitalize()} holding {c} identical {goods} weighs {w + c * each} kg. The empty {box.split()[1]} "
                f"weighs {w} kg. How much would the same {box.split()[1]} weigh with {j} {goods}?")
    if k == 10:
        lpm, m, d, p = rng.randint(8, 15), rng.randint(5, 12), rng.randint(4, 7), rng.choice([20, 25, 30, 40])
        return (f"{n1}'s shower uses {lpm} liters of water a minute. {n1} showers for {m} minutes on {d} days a week. "
                f"A new shower head uses {p}% less water. How many liters does it save in four weeks?")
    if k == 11:
        a, d, w = rng.choice([2, 2.5, 3]), rng.randint(3, 6), rng.randint(2, 8)
        b = rng.randint(int(a * d), int(2 * a * d) - 1)
        return (f"A single bus ticket costs ${a:g} and a weekly pass costs ${b}. {n1} rides the bus to work and back "
                f"on {d} days a week. How much does {n1} save over {w} weeks by buying weekly passes?")
    if k == 12:
        p, q = rng.randint(50, 100), rng.choice([8, 10, 12, 15, 16, 20])
        return (f"{n1}'s phone battery is at {p}%. Streaming video uses {q}% of the battery every hour, and the phone "
                f"warns when it reaches 20%. For how many minutes can {n1} watch video before the warning?")
    w, h, win, cov, can = rng.randint(3, 6), rng.choice([2.5, 3]), rng.randint(2, 4), rng.choice([8, 10, 12]), rng.choice([2, 2.5, 5])
    return (f"A room has four walls, each {w} m wide and {h:g} m high. One wall has a window of {win} square meters "
            f"and another a door of 2 square meters. One liter of paint covers {cov} square meters, and {n1} wants "
            f"two coats. Paint is sold in {can:g}-liter cans. How many cans must {n1} buy?")


def math6_prompts(rng: random.Random, n: int) -> list[str]:
    out = set()
    while len(out) < n:
        out.add(_math6(rng) + rng.choice(MATH_TAIL4))
    return sorted(out)


def main() -> int:
    out = Path(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    rng = random.Random(seed)
    sets = {"synth6-chat": chat6_prompts(rng, 810), "synth6-heval": heval6_prompts(rng, 9),
            "synth6-func": func6_prompts(rng, 270, 40), "synth6-math": math6_prompts(rng, 270)}
    write_guarded(out, sets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
