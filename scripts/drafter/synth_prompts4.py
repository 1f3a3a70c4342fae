"""A fourth round of drafter-training prompts (after synth_prompts.py, 2 and 3),
aimed at chat, where the drafter is weakest: four in five prompts are chat of
the kinds a chat benchmark asks for, on new topics and in new forms (writing
with a form, an audience and a constraint; emails, speeches, product texts;
stories with constraints; role-play; advice; comparisons; explanations, some
with a follow-up such as "then explain it more simply"; puzzles in words;
extraction from, and rewriting of, passages this file writes); the rest are
word problems of new shapes and short coding asks in plain language. Seeded,
from this file's own templates and word lists; prompts equal to or near an
eval prompt are dropped (services/worker/training/decontam.py).

usage: .venv/bin/python scripts/drafter/synth_prompts4.py OUT_DIR [SEED]
then:  dspark gen-drafter-data --prompts OUT_DIR --out data/selfgen-synth4
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_prompts import expand, split_list  # noqa: E402
from synth_prompts2 import _ints, stub_parts  # noqa: E402
from synth_prompts3 import write_guarded  # noqa: E402

TOPICS4 = """
a night market in Taipei|the history of umbrellas|learning to knit|a lost-and-found office|mangrove forests|
the first vending machines|a school gardening club|the Hanseatic League|street art in old towns|a board game café|
the invention of the zipper|wetland restoration|a neighborhood book swap|the history of postage stamps|tidal energy|
a silent retreat|the Phoenicians|a bicycle repair workshop|the history of elevators|baking sourdough bread|
kelp farming|a village radio station|the Trans-Siberian Railway|the history of typewriters|a repair café|
moving back in with your parents|a snow day at school|a community orchestra|the invention of canned food|seed banks|
a rural bus route|the Kingdom of Aksum|a pen pal friendship|the history of fireworks|peatlands|urban foxes|
a town's first traffic light|a neighborhood tool library|rewilding rivers|the history of ice cream|cloud seeding|
the Great Fire of London|a ferry crossing in a storm|a mobile library van|a lantern festival|the Minoans|
the history of roller coasters|desert oases|a cooking club for retirees|the Dead Sea Scrolls|a mountain rescue team|
a power cut during a heatwave|the Hundred Years' War|the history of eyeglasses|the Lewis and Clark expedition|
the invention of the bar code|the first weather forecasts|the Polynesian navigators|a city's first metro line|
the Easter Island statues|the history of puppetry|the Atacama Desert|wildlife bridges over highways|a rooftop cinema|
an underground city in Cappadocia|the California Gold Rush|beavers returning to rivers|a tiny museum of buttons"""
PEOPLE4 = """
a Viking trader|a bored castle guard|a cheerful weather forecaster|a strict driving instructor|a sleepy owl|
a medieval court jester|a deep-sea diver|a robot vacuum cleaner|a hotel concierge|a mountain guide|a retired spy|
a New York taxi driver|a wedding planner|a fortune teller at a fair|a zookeeper|a travel agent from 1960|
an ancient Egyptian scribe|a film director|a farmer from the year 1800|an overconfident GPS|a submarine captain|
a penguin who wants to fly|a late-night radio host|a volcano scientist|a Shakespearean actor
"""
AUDIENCES4 = ["a class of eight-year-olds", "a room full of farmers", "readers of a science magazine",
              "tourists on a bus tour", "people new to the country", "a retired sailor", "a book club",
              "a sports team before a big game", "teenagers who love video games", "my grandparents"]
FORMS4 = """a sonnet|an acrostic poem|a letter to the editor|a radio advertisement|a museum placard|a song chorus|
a short fable with a moral|a newsletter introduction|a fundraising appeal|a postcard message|a brochure text|
a thread of four short social media posts|a short documentary narration|a tour guide's script|a short ballad|
a six-page picture book text|a free-verse poem|an encyclopedia-style entry|a letter from the year 2100|a poster|
an elevator pitch|a short comedy sketch|a text message conversation|a field guide entry"""
CONSTRAINTS4 = ["", "", "", "", "", " Keep it under 80 words.", " Use exactly four sentences.",
                " Write it in the second person.", " Do not use the word 'very'.", " Give it a surprising ending.",
                " Include one question and one exclamation.", " Avoid jargon.", " Finish with a call to action.",
                " Add a short title in capital letters.", " Include a short quote from an imaginary expert."]
WRITE4 = ["Write {f} about {t}.", "Write {f} about {t} for {a}.", "Create {f} that introduces {t} to {a}.",
          "I need {f} about {t} for {a}. Can you write one?", "Could you write {f} on the subject of {t}?",
          "Produce {f} inspired by {t}."]
EMAILS4 = """
your landlord, asking for the broken heating to be repaired|a hotel, asking to move to a quieter room|
a customer whose parcel arrived damaged, apologizing and offering a replacement|a former colleague, asking for a reference|
your neighbors, inviting them to a street party next month|a supplier whose delivery was a week late|
a museum, asking whether school groups get a discount|a recruiter, turning down a job offer|
a bakery, ordering a cake for eighty guests|a new client, welcoming them and explaining the next steps"""
OCCASIONS4 = """
at the opening of a new skate park|thanking volunteers after a flood cleanup|at a best friend's fortieth birthday|
at the retirement party of a school bus driver|welcoming exchange students|to open a charity quiz night|
accepting a prize for the best village garden|at the last performance of a local theater"""
PRODUCTS4 = """
a backpack with a built-in solar panel|a mug that keeps tea at the perfect temperature|a folding electric bike|
a plant pot that sends a message when the soil is dry|a pillow that plays the sound of rain|a lunch box that heats food|
running shoes made from recycled bottles|a bicycle helmet with turn signals|a board game about building railways"""
LETTERS4 = ["Write a {tone} email to {e}.", "Draft a {tone} letter to {e}.", "Write a speech {o}.",
            "Draft a two-minute toast {o}.", "Write a product description for {x}.",
            "Write an advertisement for {x} aimed at {a}.",
            "Write three customer reviews of {x}: one happy, one mixed and one disappointed.",
            "Invent a name for {x}, then write a tagline and a 50-word description."]
TONES4 = ["polite", "friendly", "formal", "firm but friendly", "brief", "warm", "professional"]
CHARS4 = """a retired clockmaker|a girl who can talk to pigeons|a lonely robot in a junkyard|a shy dragon|
a boy who swaps places with his twin|a baker who loses her sense of smell|an old fisherman|a lost suitcase|
a cat who runs a hotel|a goalkeeper who is afraid of the ball|a grandmother learning to skateboard"""
SITS4 = """finds a map hidden in a library book|misses the last train home|has to cook dinner for a queen|
wakes up able to hear what plants think|gets stuck in an elevator with a stranger|enters a kite-flying contest|
discovers that the town clock has stopped|must deliver a letter before midnight|wins a trip to the Moon|
finds a door that was not there yesterday|has one day to save the village fair|looks after a very strange pet"""
STORYK4 = ["in exactly six sentences", "in under 150 words", "in the first person", "with a twist at the end",
           "using only dialogue", "without ever naming the main character", "with a moral in the last line",
           "so that it ends with the words 'and the lights came back on.'", "for a five-year-old at bedtime"]
STORY4 = ["Write a short story about {c} who {s}, {k}.", "Tell a story about {c} who {s}. Write it {k}.",
          "Here is a story idea: {c} {s}. Turn it into a short story {k}."]
ROLES4 = ["Stay in character as {p} for this whole reply. What is the hardest part of your day?",
          "You are {p}. A visitor asks what you would change about {t}. Answer in character.",
          "Take on the persona of {p}. Give me a short tour of your workplace as a monologue.",
          "Speak the way {p} would. Tell me the three rules you live by, and why.",
          "You are {p} and you have just won an award. Give a short acceptance speech.",
          "Answer as {p} would: what do you think of {t}?",
          "Let's role-play. You are {p} and I am a lost tourist. Greet me and offer to help."]
ADVICE4 = """
My roommate keeps leaving dirty dishes in the sink|I want to start running but I get bored quickly|
I have two job offers and cannot decide between them|My grandmother wants to learn to make video calls|
I forget people's names right after I meet them|Our small team misses a deadline almost every month|
I want to cook at home more but only have twenty minutes a day|My neighbor's tree hangs over my garden|
I am moving abroad for a year and want to make friends there|A friend borrowed money and has not paid it back|
I am a new manager and one of my reports used to be my peer|I am retiring next year and worry about being bored"""
ADV4 = ["{s}. What would you suggest?", "{s}. Can you give me a practical plan in three steps?",
        "My friend told me: \"{s}.\" How can I help?", "{s}. What are my options, with pros and cons?",
        "{s}. What mistakes should I avoid?", "{s}. Write me a kind but honest piece of advice."]
PAIRS4 = """
a gas stove and an induction hob|learning from videos and learning from books|a city break and a beach holiday|
a dog and a rabbit as a family pet|a savings account and an index fund|buying a used car and leasing a new one|
a gym membership and working out at home|a paper planner and a calendar app|a university degree and an apprenticeship|
paying with cash and paying by card|printed newspapers and news apps|trains and buses for commuting"""
CMP4 = ["Between {x}, which is better? Give arguments for both, then your verdict.",
        "Make a table comparing {x} on cost, convenience and environmental impact.",
        "What would make someone choose one over the other: {x}?",
        "Explain the trade-offs between {x} for {a}.", "Write a short debate between two friends about {x}."]
CONCEPTS4 = """
osmosis|half-life in radioactive decay|the tragedy of the commons|buoyancy|how the Moon causes tides|how rainbows form|
why the sky is blue|diminishing returns|price elasticity|the sunk cost fallacy|moral hazard|the Magna Carta|
the Peace of Westphalia|the Meiji Restoration|the Marshall Plan|the Columbian Exchange|the Black Death|feudalism|
the Protestant Reformation|the Bronze Age collapse|the pH scale|catalysts in chemistry|convection currents|symbiosis|
how the eye sees color|circadian rhythms|food webs|the Coriolis effect|static electricity|levers and pulleys|Stoicism|
exponential growth|the law of large numbers|correlation and causation|Baroque music|the Bauhaus movement|federalism|
central banks and interest rates|tariffs|public goods|absolute zero|why ice floats|how a heat pump works|dark matter"""
EXPL4 = ["Explain {s}, and show how you could demonstrate it with everyday objects.",
         "Explain {s} in one paragraph. Then explain it again more simply, as if to a seven-year-old.",
         "Explain {s} in one sentence, then expand that into a short paragraph with an example.",
         "I read about {s} but did not understand it. Can you explain it with an analogy?",
         "Explain {s}. Then sum up your explanation in a single sentence.", "How is {s} related to {s2}?",
         "Many people find {s} confusing. Explain it clearly for {a}.",
         "What are the key points about {s}? Then explain the hardest one in plain words.",
         "Write a short paragraph about {t}. Then rewrite it in a more formal style.",
         "Give me three fun facts about {t}, then turn them into a short rhyme.",
         "Write a tweet about {t}. Then write a longer version for a newsletter."]
NAMES4 = ("Amara Bruno Chloe Dmitri Elif Felix Gita Hugo Isla Jamal Keiko Luca Mira Nils Oren Priya Rafael "
          "Sofia Tomas Uma Viktor Wen Yara Zane").split()
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
OWN4 = [("own", "owns", ["a parrot", "a hamster", "a tortoise", "a goldfish", "a rabbit"]),
        ("play", "plays", ["the violin", "the drums", "the flute", "the cello", "the trumpet"]),
        ("order", "orders", ["tea", "coffee", "hot chocolate", "lemonade", "orange juice"])]
WHY4 = [" Explain your reasoning step by step.", " Show how you worked it out.", " Think it through."]


def _puzzle(rng: random.Random) -> str:
    """A reasoning puzzle in words, with clues that fix one answer."""
    (a, b, c, d), k, day = rng.sample(NAMES4, 4), rng.randrange(6), rng.choice(DAYS)
    n, up, s, st = rng.randint(3, 120), rng.randint(2, 6), rng.randint(1, 9), rng.randint(2, 9)
    if k == 0:
        q = rng.choice([f"If today is {day}, what day of the week will it be {n} days from now?",
                        f"{n} days ago it was a {day}. What day of the week is it today?"])
    elif k == 1:
        clues = rng.sample([f"{a} is at the front.", f"{c} stands directly behind {b}.", f"{d} is not second."], 3)
        q = f"{a}, {b}, {c} and {d} wait in a queue. {' '.join(clues)} What is their order from front to back?"
    elif k == 2:
        verb, verbs, things = rng.choice(OWN4)
        x, y, z = rng.sample(things, 3)
        sh = rng.sample([x, y, z], 3)
        q = (f"{a}, {b} and {c} each {verb} exactly one of these: {sh[0]}, {sh[1]} and {sh[2]}, all different. "
             f"{b} {verbs} {y}. {a} does not {verb} {z}. Who {verbs} what?")
    elif k == 3:
        said = rng.choice([f"{a} says: \"We are both knaves.\"", f"{a} says: \"At least one of us is a knave.\"",
                           f"{a} says: \"{b} is a knight.\" {b} says: \"We are different kinds.\"",
                           f"{a} says: \"{b} is a knave.\" {b} says: \"{a} and I are the same kind.\""])
        q = f"On an island, knights always tell the truth and knaves always lie. {said} What are {a} and {b}?"
    elif k == 4:
        q = (f"{rng.choice(['A snail', 'A frog', 'A beetle'])} is at the bottom of a {rng.randint(8, 30)}-meter "
             f"well. Each day it climbs {up} meters, and each night it slips back {rng.randint(1, up - 1)} meters. "
             "On which day does it get out?")
    else:
        seq = rng.choice([[s + i * st for i in range(5)], [s * 2 ** i for i in range(5)], [i * i + s for i in range(1, 6)],
                          [s, st, s + st, s + 2 * st, 2 * s + 3 * st]])
        return f"What number comes next in the sequence {', '.join(map(str, seq))}, ...? Explain the pattern."
    return q + rng.choice(WHY4)


# Passages this file writes, for extraction and rewriting asks.
P4 = {k: split_list(v) for k, v in dict(
    goods="loaves of bread|bags of rice|jars of honey|light bulbs|packs of paper|bottles of olive oil|tins of paint",
    events="dentist appointment|choir practice|team meeting|swimming lesson|dinner with friends|yoga class|"
           "parents' evening|football training|language class|volunteer shift",
    jobs="nurse|carpenter|librarian|chemist|bus driver|journalist|gardener|architect|translator|baker",
    places="a bookshop|a cycling school|a small ferry company|a vegetarian café|a music studio|a pottery workshop",
    towns="Bergen|Ghent|Porto|Kyoto|Valparaíso|Tartu|Zanzibar|Leeds|Montreal|Bologna|Cork|Tbilisi").items()}
EXTRACT4 = {
    "receipt": ["Here is a receipt:\n{x}\nWhat was the total, and which line cost the most? Show the calculation.",
                "Turn this receipt into a JSON list with the keys item, quantity and unit_price:\n{x}"],
    "schedule": ["Convert this week's schedule into a table with the columns Day, Time and Activity:\n{x}",
                 "Here is my week:\n{x}\nWhich days have nothing after 6 p.m.?"],
    "bio": ["Extract the person's name, birth year, towns and job from this text as JSON:\n{x}",
            "Write a timeline of the events in this short biography:\n{x}",
            "Using only this text, how old was the person when the business opened?\n{x}"],
    "notes": ["List each person's task and deadline from these meeting notes:\n{x}",
              "Write a follow-up email that sums up these meeting notes:\n{x}"]}


def _passage(rng: random.Random) -> tuple[str, str]:
    """(kind, text) of a short passage with facts in it."""
    k, (n0, n1, n2), y, pr = rng.randrange(4), rng.sample(NAMES4, 3), rng.randint(1950, 1995), rng.choice(["she", "he"])
    if k == 0:
        return "receipt", "\n".join(f"{rng.randint(2, 6)} {g} at ${rng.randint(1, 15)}.{rng.choice(['00', '50', '99'])} each"
                                    for g in rng.sample(P4["goods"], rng.randint(3, 4)))
    if k == 1:
        return "schedule", "\n".join(f"{DAYS[i]} {rng.randint(8, 20)}:{rng.choice(['00', '15', '30', '45'])} {e}"
                                     for i, e in zip(sorted(rng.sample(range(5), 4)), rng.sample(P4["events"], 4)))
    if k == 2:
        t1, t2 = rng.sample(P4["towns"], 2)
        return "bio", (f"{n0} was born in {t1} in {y}. After training as a {rng.choice(P4['jobs'])}, {pr} worked in "
                       f"{t2} for {rng.randint(3, 15)} years. In {y + rng.randint(28, 40)}, {pr} opened "
                       f"{rng.choice(P4['places'])} there, which now employs {rng.randint(4, 40)} people.")
    d1, d2, d3 = rng.sample(DAYS[:5], 3)
    return "notes", (f"{n0} will book the venue by {d1}. {n1} will send the invitations by {d2}. The budget is "
                     f"${rng.randint(3, 20) * 100}. {n2} will ask for catering quotes. Next meeting: {d3} at "
                     f"{rng.randint(9, 16)}:00.")


SENTENCES4 = """
The bakery on Elm Street will start selling bread at seven instead of eight.|The pool is closed on Mondays for cleaning.|
Our club has raised enough money to buy new costumes for the spring show.|Most volunteers prefer Saturday mornings.|
Three of the five bus routes will change their timetable next month.|The new printer only prints in black and white.|
The hiking trail was closed after a storm brought down several trees.|Many residents have asked for more park benches.|
Children under twelve can visit the aquarium for free this weekend.|The canteen moves to the ground floor in May."""
EDIT4 = ["Make the following text shorter without losing any facts:\n{x}",
         "Rewrite the following text in the past tense:\n{x}", "Make the following text more persuasive:\n{x}",
         "Rewrite the following text as a short notice for a community board:\n{x}",
         "Proofread the following text and list every change you make:\n{x}",
         "Rewrite the following text as {p} would say it:\n{x}",
         "Explain the following text more simply, using short sentences:\n{x}",
         "Write two headlines for the following text, one serious and one playful:\n{x}"]


def _slip(rng: random.Random, s: str) -> str:
    """A proofreading exercise: one small slip or none."""
    r = rng.random()
    return s.replace(" the ", " the the ", 1) if r < .2 else s.replace(" is ", " are ", 1) if r < .35 else s


def chat4_prompts(rng: random.Random, n: int) -> list[str]:
    L = {k: split_list(v) for k, v in dict(t=TOPICS4, p=PEOPLE4, f=FORMS4, e=EMAILS4, o=OCCASIONS4, x=PRODUCTS4, c=CHARS4,
                                           s=SITS4, adv=ADVICE4, cmp=PAIRS4, con=CONCEPTS4, sen=SENTENCES4).items()}
    out = set()
    while len(out) < n:
        kind = rng.random()
        a, t, p = rng.choice(AUDIENCES4), rng.choice(L["t"]), rng.choice(L["p"])
        if kind < 0.2:  # writing with a form, an audience, a constraint
            s = rng.choice(WRITE4).format(f=rng.choice(L["f"]), t=t, a=a) + rng.choice(CONSTRAINTS4)
        elif kind < 0.32:  # emails, letters, speeches, product descriptions
            s = rng.choice(LETTERS4).format(tone=rng.choice(TONES4), e=rng.choice(L["e"]), o=rng.choice(L["o"]),
                                            a=a, x=rng.choice(L["x"])) + rng.choice(CONSTRAINTS4[:6])
        elif kind < 0.4:
            s = rng.choice(STORY4).format(c=rng.choice(L["c"]), s=rng.choice(L["s"]), k=rng.choice(STORYK4))
        elif kind < 0.48:
            s = rng.choice(ROLES4).format(p=p, t=t)
        elif kind < 0.55:
            s = rng.choice(ADV4).format(s=rng.choice(L["adv"]))
        elif kind < 0.61:
            s = rng.choice(CMP4).format(x=rng.choice(L["cmp"]), a=a)
        elif kind < 0.77:  # explanations, some with a follow-up ask
            s1, s2 = rng.sample(L["con"], 2)
            s = rng.choice(EXPL4).format(s=s1, s2=s2, a=a, t=t)
        elif kind < 0.85:
            s = _puzzle(rng)
        elif kind < 0.93:
            what, x = _passage(rng)
            s = rng.choice(EXTRACT4[what]).format(x=x)
        else:
            x = " ".join(_slip(rng, y) for y in rng.sample(L["sen"], rng.randint(2, 3)))
            s = rng.choice(EDIT4).format(x=x, p=p)
        out.add(s)
    return sorted(out)


MATH4 = [
    "{n1} can paint a fence in {a} hours, and {n2} can paint the same fence in {b} hours. How long will it take "
    "them if they work together?",
    "{n1}'s scores on the first three quizzes were {s1}, {s2} and {s3}. What score does {n1} need on the fourth "
    "quiz to have an average of {avg}?",
    "{n1} and {n2} share ${d} in the ratio {a}:{b}. How much more does the one with the larger share get?",
    "A rectangular pool is {a} m long and {b} m wide. A path {c} m wide runs all the way around it. What is the "
    "area of the path?",
    "Phone plan A costs ${a} a month plus ${c} for each gigabyte of data. Plan B costs ${big} a month with "
    "unlimited data. How many gigabytes can {n1} use in a month before plan B is cheaper?",
    "The sum of three consecutive whole numbers is {tri}. What is the largest of the three numbers?",
    "A jar holds {a} red marbles, {b} green marbles and {c} yellow marbles. {n1} takes out two marbles without "
    "looking. What is the probability that both are red?",
    "Two towns are {km} km apart. {n1} cycles from one at {a} km/h and {n2} from the other at {b} km/h, both "
    "leaving at {h}:00. At what time do they meet?",
    "A water bottle is {f1}% full. After {n1} drinks {ml} ml, it is {f2}% full. How many milliliters does the "
    "bottle hold when it is full?",
    "A shop raises the price of a bike by {c}0 percent and later lowers the new price by {c}0 percent. If the "
    "bike first cost ${d}, what does it cost now?",
]
MATH_TAIL4 = ["\nPlease reason step by step, and put your final answer within \\boxed{}."] * 2 + [" Show your work.", ""]


def math4_prompts(rng: random.Random, n: int) -> list[str]:
    out = set()
    while len(out) < n:
        (n1, n2), (a, b), c = rng.sample(NAMES4, 2), rng.sample(range(2, 13), 2), rng.randint(2, 9)
        cap, f1, f2 = rng.choice([500, 750, 1000, 1500]), rng.randint(6, 10) * 10, rng.randint(1, 4) * 10
        s1, s2, s3 = _ints(rng, 60, 95, 3)
        s = rng.choice(MATH4).format(
            n1=n1, n2=n2, a=a, b=b, c=c, s1=s1, s2=s2, s3=s3, d=rng.randint(4, 60) * 25, km=rng.randint(3, 24) * 5,
            e=rng.randint(2, 8), h=rng.randint(7, 11), big=a + rng.randint(5, 30), avg=rng.randint(75, 90),
            tri=3 * rng.randint(5, 300) + 3, f1=f1, f2=f2, ml=cap * (f1 - f2) // 100)
        out.add(s + rng.choice(MATH_TAIL4))
    return sorted(out)


SCRIPTS4 = """
reads a CSV file of expenses and prints the total spent in each category|prints a multiplication table in neat columns|
asks for a password and says whether it is strong, explaining which rules it breaks|renames all files to lower case|
tosses a coin 1,000 times and reports the longest run of heads|finds every file larger than 10 MB under a folder|
keeps a to-do list in a text file, with commands to add, list and finish tasks|checks a filled-in sudoku grid|
plays rock, paper, scissors against the computer until someone wins three rounds|reads a log and counts errors per hour|
turns Markdown headings such as '# Title' into HTML heading tags|prints a month's calendar with weeks starting on Monday|
shuffles a deck of cards and deals five cards to each of four players|counts the days until the next New Year's Day|
runs Conway's Game of Life on a 10 by 10 grid for ten steps|reads dates as DD/MM/YYYY and prints them as YYYY-MM-DD"""
SCRIPT_ASKS4 = ["Write a {lang} script that {t}.", "Can you show me a short {lang} program that {t}?",
                "In {lang}, how would I write a small program that {t}? Please explain the code.",
                "I'm a beginner. Write a {lang} program that {t}, with comments explaining each part."]
LANGS4 = ["Python", "Python", "Python", "JavaScript", "Ruby", "Kotlin", "PHP", "Swift", "C#"]


def _snippet(r: random.Random) -> str:
    a, b, c, d = _ints(r, 1, 9, 4)
    return r.choice([
        f"nums = [{a}, {b * 3}, {c}, {d + 5}]\nprint(sorted(nums)[1:3])",
        f"total = 0\nfor i in range({a + 5}):\n    if i % {b % 3 + 2} == 0:\n        total += i\nprint(total)",
        f"x = [{a}, {b}]\ny = x\ny.append({c})\nprint(x, len(y))", f"s = 'planet'\nprint(s[::-1], s[{a % 4}:], s.upper())",
        f"def fact(n):\n    return 1 if n <= 1 else n * fact(n - 1)\nprint(fact({a % 6 + 1}))",
        f"grid = [[0] * {a % 3 + 2}] * 2\ngrid[0][0] = {b}\nprint(grid)", f"print([i * i for i in range({a + 3}) if i % 2])",
        f"d = {{'a': {a}, 'b': {b}}}\nd['c'] = d.get('c', {c}) + d['a']\nprint(sorted(d.items()))"])


BUGS4 = [("return the last n items of a list", "def last_n(items, n):\n    return items[len(items) - n - 1:]"),
         ("add an item to a new basket each time it is called",
          "def add_item(item, basket=[]):\n    basket.append(item)\n    return basket"),
         ("return the largest value in a list of numbers", "def largest_value(nums):\n    best = 0\n    for n in nums:\n"
          "        if n > best:\n            best = n\n    return best"),
         ("add up all whole numbers from a to b, both included", "def sum_between(a, b):\n    return sum(range(a, b))")]
CODE_ASKS4 = ["This function should {d}, but it has a bug. Find the bug and fix it:\n```python\n{c}\n```",
              "Why does this Python function give wrong results for some inputs? It should {d}.\n```python\n{c}\n```",
              "What does this Python code print? Explain step by step.\n```python\n{c}\n```",
              "Predict the output of the following Python code and explain why:\n```python\n{c}\n```"]
TABLES4 = {"orders(id, customer_id, amount, order_date) and customers(id, name, city)": [
               "the total amount each customer spent in {y}", "the {k} cities with the most customers",
               "the customers who have never placed an order", "the average order amount per month in {y}"],
           "books(id, title, author, year, pages)": ["the authors with more than {k} books",
               "the longest book published before {y}", "the number of books published in each decade"],
           "employees(id, name, department, salary, hire_date)": ["the best-paid employee in each department",
               "the departments whose average salary is above {k}0000", "the employees hired in {y}, newest first"]}
FIXED4 = expand({  # every combination
    "Write a regular expression that matches {w}, and explain each part of it.": dict(
        w=["UK-style postcodes", "times in 24-hour format such as 23:59", "hex color codes such as #1a2B3c",
           "prices such as $4.99 or $120", "hashtags in a social media post", "words that start and end alike"]),
    "Explain the difference between {x}, with a short example of each.": dict(
        x=["a list and a tuple in Python", "== and is in Python", "let, const and var in JavaScript",
           "a process and a thread", "TCP and UDP", "git merge and git rebase", "the stack and the heap",
           "INNER JOIN and LEFT JOIN in SQL", "a shallow copy and a deep copy", "unit and integration tests"])})
# Functions asked for in plain words and shown by examples that stub_parts computes:
# (name, params, return type, what it does, reference, input maker).
EXAMPLES4 = [
    ("spread", "numbers: List[int]", "int", "returns the difference between the largest and smallest number",
     lambda xs: max(xs) - min(xs), lambda r: (_ints(r),)),
    ("next_weekday", "day: str, k: int", "str", "returns the day of the week k days after the given day",
     lambda d, k: DAYS[(DAYS.index(d) + k) % 7], lambda r: (r.choice(DAYS), r.randint(1, 20))),
    ("round_to_multiple", "n: int, k: int", "int", "rounds n to the nearest multiple of k, rounding halves up",
     lambda n, k: (n + k // 2) // k * k, lambda r: (r.randint(0, 99), r.choice([5, 10, 25])))]


def code4_prompts(rng: random.Random, n: int) -> list[str]:
    tasks, out = split_list(SCRIPTS4), set()
    while len(out) < n:
        kind = rng.random()
        if kind < 0.35:
            s = rng.choice(SCRIPT_ASKS4).format(lang=rng.choice(LANGS4), t=rng.choice(tasks))
        elif kind < 0.55:  # what does it print
            s = rng.choice(CODE_ASKS4[2:]).format(c=_snippet(rng))
        elif kind < 0.62:  # find the bug
            d, c = rng.choice(BUGS4)
            s = rng.choice(CODE_ASKS4[:2]).format(d=d, c=c)
        elif kind < 0.74:
            schema = rng.choice(sorted(TABLES4))
            ask = rng.choice(TABLES4[schema]).format(y=rng.randint(2015, 2024), k=rng.randint(3, 9))
            s = f"Given the table{'s' if ' and ' in schema else ''} {schema}, write a SQL query for {ask}."
        elif kind < 0.84:
            s = rng.choice(FIXED4)
        else:
            name, params, ret, what, ref, make = rng.choice(EXAMPLES4)
            ex = "\n".join(ln.strip() for ln in stub_parts(rng, name, params, ret, ref, make)[1].strip().split("\n"))
            s = f"Write a Python function {name}({params}) -> {ret} that {what}. For example:\n{ex}"
        out.add(s)
    return sorted(out)


def main() -> int:
    out = Path(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    rng = random.Random(seed)
    sets = {"synth4-chat": chat4_prompts(rng, 1440), "synth4-math": math4_prompts(rng, 180),
            "synth4-code": code4_prompts(rng, 180)}
    write_guarded(out, sets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
