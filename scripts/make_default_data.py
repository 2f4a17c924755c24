#!/usr/bin/env python3
"""Generate the embedded default data set and its tokenizer.

Writes (all committed):
  configs/data/summarize_train.jsonl  {"prompt", "completion"} rows, seed 1
  configs/data/summarize_eval.jsonl   same format, seed 2, no summary shared
                                      with train (summaries carry the key
                                      slots, so no slot combination repeats)
  configs/data/pretrain.jsonl         {"text"} rows: dialogues (half with a recap) plus short
                                      third-person narratives, seed 3
  configs/data/preference_train.jsonl {"prompt", "chosen", "rejected"} rows for
  configs/data/preference_eval.jsonl  objective: dpo, from the first train / eval
                                      examples, seed 4: chosen is the summary,
                                      rejected the same summary with one fact
                                      (a name, speaker, number, day, city, ...)
                                      swapped for another of its kind
  configs/data/toxicity_train.jsonl   {"prompt", "chosen", "rejected"} rows for
  configs/data/toxicity_eval.jsonl    the course's lab 3 (configs/course-lab3.yaml)
                                      reward classifier, from the first train /
                                      eval examples, seed 6: chosen is the
                                      summary, rejected the same summary with an
                                      insult put in
  configs/data/toxic_dialogues_train.jsonl  {"prompt", "completion"} rows, lab 3's
  configs/data/toxic_dialogues_eval.jsonl   PPO prompts, seed 8: SFT rows (train
                                      from its end, eval from its start) where
                                      half the dialogues have one speaker insult
                                      the other, which a summary may copy
  configs/tiny-base/tokenizer.model   SentencePiece BPE trained on pretrain
                                      text with the `spm_train` CLI

The dialogues imitate DialogSum ("#Person1#: ..." lines, everyday scenes) and
the summaries its one-line style. Every summary slot is stated in the dialogue,
and outcome variants (reschedules, refusals, out-of-stock colours ...) make the
summary depend on what is said, not only on the scenario family.

Python standard library only, deterministic: every random draw comes from a
random.Random(seed) and nothing iterates over a set. Run from anywhere:
    python3 scripts/make_default_data.py
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.path.join(ROOT, "configs", "data")
TOKENIZER_DIR = os.path.join(ROOT, "configs", "tiny-base")

PROMPT = "Summarize the following conversation.\n\n{dialogue}\n\nSummary: "
N_TRAIN, N_EVAL, N_PRETRAIN_DIALOGUES, N_NARRATIVES = 4000, 200, 20000, 6000
RECAP_FRACTION = 0.5  # pretraining dialogues followed by an "In short:" recap
SEED_TRAIN, SEED_EVAL, SEED_PRETRAIN = 1, 2, 3
N_PREFERENCE_TRAIN, N_PREFERENCE_EVAL, SEED_PREFERENCE = 1000, 100, 4
N_TOXICITY_TRAIN, N_TOXICITY_EVAL, SEED_TOXICITY = 1000, 100, 6
N_TOXIC_PROMPTS_TRAIN, N_TOXIC_PROMPTS_EVAL, SEED_TOXIC_PROMPTS = 400, 40, 8
VOCAB_SIZE = 1024
SPEAKER_TAGS = ["#Person1#", "#Person2#", "#Person3#", "#Person4#"]
MIN_TURNS, MAX_TURNS = 4, 10

# ---------------------------------------------------------------------------
# Slot values. Lists (not sets) so that choice() is reproducible.
# ---------------------------------------------------------------------------
NAMES = ["Sam", "Lucy", "Tom", "Anna", "Jack", "Mary", "David", "Emma", "Mike",
         "Linda", "Peter", "Kate", "Bill", "Susan", "Steve", "Amy", "Paul",
         "Helen", "Mark", "Julia", "Frank", "Nancy", "Bob", "Lisa", "Eric",
         "Grace", "Tony", "Rose", "Ben", "Jenny", "Dan", "Alice", "Henry",
         "Sarah", "Jim", "Karen", "Leo", "Monica", "Ray", "Tina", "Adam",
         "Betty", "Carl", "Diana", "George", "Hannah", "Kevin", "Laura", "Nick",
         "Olivia", "Sean", "Wendy"]
SURNAMES = ["Smith", "Brown", "Green", "White", "Black", "Lee", "Wang", "Miller",
            "Taylor", "Clark", "Hall", "Young", "King", "Wright", "Hill", "Scott",
            "Adams", "Baker", "Nelson", "Carter", "Turner", "Parker", "Evans",
            "Morris", "Cook", "Reed", "Bell", "Ward", "Gray", "Hughes"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
        "Sunday"]
TIMES = ["9 am", "10 am", "11 am", "12:30 pm", "1 pm", "2 pm", "3 pm", "4 pm",
         "5 pm", "6 pm", "7 pm", "8 pm", "9:30 am", "10:30 am", "2:30 pm",
         "4:30 pm", "6:30 pm", "7:30 pm"]
EVENING_TIMES = ["5 pm", "6 pm", "7 pm", "8 pm", "6:30 pm", "7:30 pm"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July",
          "August", "September", "October", "November", "December"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven",
                "eight", "nine", "ten", "eleven", "twelve"]
COLORS = ["blue", "red", "black", "white", "green", "gray", "brown", "yellow",
          "pink", "dark blue"]
CITIES = ["Boston", "Chicago", "Seattle", "Denver", "London", "Paris", "Tokyo",
          "Sydney", "Toronto", "Berlin", "Madrid", "Rome", "Dallas", "Miami"]
# (first person, third person) so summaries never need pronouns.
REASONS = [("I have to work late", "has to work late"),
           ("I have a dentist appointment", "has a dentist appointment"),
           ("I have a piano lesson", "has a piano lesson"),
           ("I have an exam", "has an exam"),
           ("I'm going to a wedding", "is going to a wedding"),
           ("I'm visiting relatives", "is visiting relatives"),
           ("I have a job interview", "has a job interview"),
           ("I'm helping a friend move", "is helping a friend move"),
           ("I have a team meeting", "has a team meeting"),
           ("I'm on the night shift", "is on the night shift")]


def number_word(n):
    return NUMBER_WORDS[n] if n < len(NUMBER_WORDS) else str(n)


def article(noun):
    """'a' or 'an' plus the noun (enough for the vocabulary used here)."""
    return ("an " if noun[0] in "aeiouAEIOU" else "a ") + noun


def capitalize(text):
    return text[0].upper() + text[1:]


def ordinal(n):
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# ---------------------------------------------------------------------------
# Dialogue builder
# ---------------------------------------------------------------------------
TEMPLATES_USED = {}  # template -> use count; a dict keeps insertion order (stats only)


class Dialogue:
    """Collects turns by abstract role (0..n-1); tags are assigned at the end
    in order of first appearance, so #Person1# is always the first speaker."""

    def __init__(self, rng, n_roles=2):
        self.rng = rng
        self.n = n_roles
        self.names = rng.sample(NAMES, n_roles)
        self.named = [False] * n_roles
        self.friendly = False  # friends may greet each other by name
        self.phone_call = False  # the first line already answers the phone
        self.core = []         # [(role, text)]

    def ref(self, role):
        """Placeholder for a participant in the summary; resolved in finish()."""
        return f"<R{role}>"

    def say(self, role, options, **slots):
        self.core.append((role, pick(self.rng, options, slots)))

    def other(self, role):
        return 1 - role if self.n == 2 else (role + 1) % self.n


def pick(rng, options, slots=None):
    template = rng.choice(options)
    TEMPLATES_USED[template] = TEMPLATES_USED.get(template, 0) + 1
    return template.format(**(slots or {}))


def third_names(rng, d, k):
    """k names for people who are talked about but do not speak."""
    pool = [n for n in NAMES if n not in d.names]
    return rng.sample(pool, k)


# Optional turns: they never touch the summary, which is the point (the model
# must learn to skip greetings and small talk).
GREETINGS = [("Hi{nb}! How are you?", "Fine, thanks{na}. And you?"),
             ("Hello{nb}. How is it going?", "Pretty good{na}."),
             ("Hey{nb}, long time no see.", "Hi{na}! Yes, it's been a while."),
             ("Good morning{nb}.", "Morning{na}."),
             ("Hi{nb}, do you have a minute?", "Sure{na}.")]


def greeting_turns(rng, d, first):
    """Opening turns; `first` is the role that speaks right after them."""
    second = d.other(first)
    if d.friendly and d.n == 2:
        # Naming someone in a greeting makes the summary use that name.
        # `first` greets the partner, the partner answers, and `first` goes on
        # with the core turns.
        call_second, call_first = rng.random() < 0.6, rng.random() < 0.5
        d.named[second] |= call_second
        d.named[first] |= call_first
        hello, reply = rng.choice(GREETINGS)
        TEMPLATES_USED[hello] = TEMPLATES_USED.get(hello, 0) + 1
        nb = ", " + d.names[second] if call_second else ""
        na = ", " + d.names[first] if call_first else ""
        return [(first, hello.format(nb=nb)), (second, reply.format(na=na))]
    if d.n > 2:
        # The organiser greets the group and goes straight on (turns merge).
        return [(first, pick(rng, ["Hi, everyone.", "Hello, all of you.", "Good to see you all."]))]
    return [(second, pick(rng, ["Good morning.", "Good afternoon.", "Hello."])),
            (first, pick(rng, ["Good morning.", "Hi there.", "Hello."]))]


def small_talk_turns(rng, d, first):
    second = d.other(first)
    day = rng.choice(DAYS)
    name = third_names(rng, d, 1)[0]
    pairs = [("By the way, did you watch the game last night?", "Yes, it was exciting."),
             ("Is it still raining outside?", "No, it stopped an hour ago."),
             ("My brother is coming to visit on {day}.", "That's nice."),
             ("Have you seen {name} recently?", "Yes, I saw {name} on {day}."),
             ("I like your new haircut.", "Thanks!"),
             ("The traffic was terrible this morning.", "It always is on {day}."),
             ("Sorry, my phone is ringing. One second.", "No problem."),
             ("{name} says hello, by the way.", "Say hello to {name} for me."),
             ("It's so hot today.", "Yes, I need a cold drink.")]
    q, a = rng.choice(pairs)
    slots = dict(day=day, name=name)
    TEMPLATES_USED[q] = TEMPLATES_USED.get(q, 0) + 1
    return [(first, q.format(**slots)), (second, a.format(**slots))]


def closing_turns(rng, d, first):
    second = d.other(first)
    pairs = [("Thanks a lot.", "You're welcome."), ("Great, thank you.", "My pleasure."),
             ("See you then.", "See you."), ("OK, bye.", "Bye."),
             ("Thanks for your help.", "Any time.")]
    q, a = rng.choice(pairs)
    TEMPLATES_USED[q] = TEMPLATES_USED.get(q, 0) + 1
    return [(first, q), (second, a)]


def merge_turns(turns):
    """Joins consecutive turns by the same speaker, as in a real transcript."""
    out = []
    for role, text in turns:
        if out and out[-1][0] == role:
            out[-1] = (role, out[-1][1] + " " + text)
        else:
            out.append((role, text))
    return out


def already_greets(d):
    """An extra 'Hello.' before 'Hello, City Clinic.' would read badly."""
    first_word = d.core[0][1].split()[0].strip(",.!")
    return d.phone_call or first_word in ("Hi", "Hello", "Hey", "Good")


def assemble(rng, d):
    """Adds optional greeting / small talk / closing around the core turns,
    keeping MIN_TURNS..MAX_TURNS turns after merging."""
    core = d.core
    for _ in range(20):
        named_before = list(d.named)
        greet = rng.random() < (0.7 if d.friendly else 0.4) and not already_greets(d)
        # Small talk never splits a question from its answer.
        slots = [k for k in range(1, len(core)) if not core[k - 1][1].endswith("?")]
        talk = rng.random() < 0.3 and bool(slots)
        close = rng.random() < 0.35
        turns = []
        if greet:
            turns += greeting_turns(rng, d, core[0][0])
        if talk:
            k = rng.choice(slots)
            body = core[:k] + small_talk_turns(rng, d, d.other(core[k - 1][0])) + core[k:]
        else:
            body = list(core)
        turns += body
        if close:
            turns += closing_turns(rng, d, d.other(turns[-1][0]))
        turns = merge_turns(turns)
        if MIN_TURNS <= len(turns) <= MAX_TURNS:
            return turns
        d.named = named_before  # a rejected greeting must not rename anyone
    raise RuntimeError("cannot fit dialogue into the turn limits: %r" % core)


def finish(rng, d, summary):
    """Returns (dialogue text, summary) with roles mapped to #PersonN# tags."""
    turns = assemble(rng, d)
    order = []
    for role, _ in turns:
        if role not in order:
            order.append(role)
    for role in range(d.n):
        if role not in order:
            order.append(role)
    tag = {role: SPEAKER_TAGS[i] for i, role in enumerate(order)}
    text = "\n".join(f"{tag[role]}: {line}" for role, line in turns)
    for role in range(d.n):
        summary = summary.replace(f"<R{role}>", d.names[role] if d.named[role] else tag[role])
    return text, summary


def join_names(refs):
    return refs[0] if len(refs) == 1 else ", ".join(refs[:-1]) + " and " + refs[-1]


# ---------------------------------------------------------------------------
# Scenario families. Each fills d.core and returns the summary template.
# ---------------------------------------------------------------------------
MEET_PLACES = [("cinema", "see a movie"), ("park", "go for a walk"),
               ("coffee shop", "have a coffee"), ("museum", "see the new exhibition"),
               ("library", "study together"), ("gym", "work out"),
               ("mall", "go shopping"), ("beach", "go swimming"),
               ("stadium", "watch the football game"), ("concert hall", "hear a concert"),
               ("Italian restaurant", "have dinner"), ("bowling alley", "go bowling"),
               ("art gallery", "look at the paintings"), ("zoo", "see the animals"),
               ("bookstore", "look for books"), ("night market", "try the street food")]


def meet_plan(rng, d):
    d.friendly = True
    group = d.n > 2
    a, b = 0, 1
    place, act = rng.choice(MEET_PLACES)
    day, day2 = rng.sample(DAYS, 2)
    time_ = rng.choice(TIMES)
    r1, r3 = rng.choice(REASONS)
    s = dict(place=place, act=act, day=day, day2=day2, time=time_, r1=r1, R1=capitalize(r1))
    d.say(a, ["Are you free on {day}?", "What are you doing on {day}?",
              "Do you have any plans for {day}?", "Got any plans for {day}?"], **s)
    outcome = rng.choice(["agree", "agree", "reschedule", "decline"])
    if group:
        outcome = "agree"
    if outcome == "decline":
        d.say(b, ["Sorry, {r1} on {day}. Why?", "I'm busy that day. {R1}."], **s)
        d.say(a, ["I wanted to {act} at the {place}.", "There is a nice {place} I wanted to show you."], **s)
        d.say(b, ["That sounds great, but I really can't. Maybe next time.",
                  "What a pity. Let's do it another time."], **s)
        return f"{d.ref(a)} invites {d.ref(b)} to the {place} on {day}, but {d.ref(b)} can't go because {d.ref(b)} {r3}."
    if outcome == "reschedule":
        d.say(b, ["Sorry, {r1} on {day}. What's up?", "Well, {r1} that day. Why?"], **s)
        d.say(a, ["I want to {act} at the {place}. How about {day2}?",
                  "Let's {act} at the {place}. Are you free on {day2}?"], **s)
        d.say(b, ["{day2} is fine. What time?", "Yes, {day2} works for me. When?"], **s)
        d.say(a, ["Let's meet at {time}.", "How about {time}?", "Is {time} OK?"], **s)
        d.say(b, ["Sure. See you at the {place} at {time}.", "OK, {time} on {day2} then."], **s)
        return f"{d.ref(b)} {r3} on {day}, so {d.ref(a)} and {d.ref(b)} will meet at the {place} on {day2} at {time_} to {act}."
    d.say(b, ["Nothing special. Why?", "I'm free. What do you have in mind?",
              "Not much. What's up?"], **s)
    d.say(a, ["Let's {act} at the {place}.", "I'd like to {act} at the {place}. Want to come?",
              "How about going to the {place} to {act}?"], **s)
    if group:
        d.say(2, ["Can I come too?", "That sounds fun. Count me in.", "Mind if I join you?"], **s)
        d.say(a, ["Of course. Let's meet at {time}.", "Sure! Is {time} OK for everyone?"], **s)
        d.say(b, ["{time} is perfect.", "Fine with me. See you at the {place}."], **s)
        people = join_names([d.ref(a), d.ref(b), d.ref(2)])
        return f"{people} agree to meet at the {place} on {day} at {time_} to {act}."
    d.say(b, ["Good idea. What time?", "Sounds great. When shall we meet?"], **s)
    d.say(a, ["Let's meet at {time}.", "How about {time} in front of the {place}?",
              "Is {time} OK?"], **s)
    d.say(b, ["Perfect. See you then.", "OK, {time} at the {place}."], **s)
    return f"{d.ref(a)} and {d.ref(b)} agree to meet at the {place} on {day} at {time_} to {act}."


DISHES = ["chicken salad", "beef noodles", "vegetable soup", "fish and chips",
          "mushroom pizza", "grilled salmon", "fried rice", "tomato pasta",
          "cheeseburger", "steak", "chicken curry", "tuna sandwich", "lamb stew",
          "shrimp tacos"]
DRINKS = ["orange juice", "iced tea", "cola", "lemonade", "coffee", "green tea",
          "sparkling water", "apple juice", "milkshake"]
SIDES = ["french fries", "a green salad", "garlic bread", "rice", "mashed potatoes",
         "onion rings"]
LEAVE_OUT = ["onions", "cheese", "garlic", "peppers", "mushrooms", "tomatoes"]


def order_food(rng, d):
    w, c = 0, 1  # waiter, customer
    dish, dish2 = rng.sample(DISHES, 2)
    drink = rng.choice(DRINKS)
    side = rng.choice(SIDES)
    without = rng.choice([x for x in LEAVE_OUT if x[:-1] not in dish])
    s = dict(dish=dish, dish2=dish2, a_drink=article(drink), A_drink=capitalize(article(drink)),
             side=side, without=without)
    d.say(w, ["Are you ready to order?", "What would you like today?",
              "Good evening. May I take your order?"], **s)
    outcome = rng.choice(["plain", "without", "sold_out"])
    if outcome == "sold_out":
        d.say(c, ["I'd like the {dish}, please.", "Can I have the {dish}?"], **s)
        d.say(w, ["I'm sorry, we have no {dish} left today.", "Sorry, the {dish} is sold out."], **s)
        d.say(c, ["Then I'll have the {dish2} with {side}.", "OK, the {dish2} with {side}, then."], **s)
        d.say(w, ["Anything to drink?", "And to drink?"], **s)
        d.say(c, ["{A_drink}, please.", "I'll have {a_drink}."], **s)
        return f"The {dish} is sold out, so {d.ref(c)} orders the {dish2} with {side} and {article(drink)}."
    if outcome == "without":
        d.say(c, ["I'd like the {dish}, but without {without}, please.",
                  "The {dish}, please. Can you leave out the {without}?"], **s)
        d.say(w, ["No problem. Anything to drink?", "Sure. What would you like to drink?"], **s)
        d.say(c, ["{A_drink}, please.", "I'll have {a_drink}."], **s)
        return f"{d.ref(c)} orders the {dish} without {without} and {article(drink)}."
    d.say(c, ["I'll have the {dish} with {side}.", "Can I get the {dish} and {side}?"], **s)
    d.say(w, ["Good choice. Something to drink?", "Would you like a drink with that?"], **s)
    d.say(c, ["Yes, {a_drink}, please.", "{A_drink} would be nice."], **s)
    d.say(w, ["I'll bring it right away.", "It will be ready in fifteen minutes."], **s)
    return f"{d.ref(c)} orders the {dish} with {side} and {article(drink)}."


ROOMS = ["single", "double", "twin", "family", "sea view"]


def book_hotel(rng, d):
    d.phone_call = True
    r, g = 0, 1  # receptionist, guest
    room = rng.choice(ROOMS)
    nights = rng.randint(1, 7)
    month, date = rng.choice(MONTHS), ordinal(rng.randint(1, 28))
    price = rng.randrange(60, 300, 10)
    breakfast = rng.random() < 0.5
    s = dict(room=room, n=number_word(nights), month=month, date=date, price=price)
    night_s = "night" if nights == 1 else "nights"
    s["nights"] = night_s
    first = rng.choice([r, g])
    if first == r:
        d.say(r, ["Grand Hotel, how can I help you?", "Good afternoon, front desk. Can I help you?"], **s)
    d.say(g, ["I'd like to book a {room} room for {n} {nights}, from {month} {date}.",
              "Do you have a {room} room from {month} {date}? It's for {n} {nights}."], **s)
    d.say(r, ["Yes, we do. It's {price} dollars a night.", "Let me check. Yes, one is free. The rate is {price} dollars per night."], **s)
    if breakfast:
        d.say(g, ["Is breakfast included?", "Does that include breakfast?"], **s)
        d.say(r, ["Yes, breakfast is included.", "Yes, breakfast is served from seven to ten."], **s)
        d.say(g, ["Great, I'll take it.", "OK, please book it for me."], **s)
        return f"{d.ref(g)} books a {room} room for {number_word(nights)} {night_s} from {month} {date} at {price} dollars a night, breakfast included."
    d.say(g, ["That's fine. I'll take it.", "OK, please reserve it."], **s)
    return f"{d.ref(g)} books a {room} room for {number_word(nights)} {night_s} from {month} {date} at {price} dollars a night."


SYMPTOMS = ["a bad cough", "a sore throat", "a headache", "a fever", "back pain",
            "a stomach ache", "an earache", "a skin rash", "a sprained ankle"]


def doctor_appointment(rng, d):
    d.phone_call = True
    r, p = 0, 1
    doc = rng.choice(SURNAMES)
    symptom = rng.choice(SYMPTOMS)
    day, day2 = rng.sample(DAYS[:5], 2)
    time_ = rng.choice(TIMES[:10])
    s = dict(doc=doc, symptom=symptom, day=day, day2=day2, time=time_)
    d.say(r, ["Doctor {doc}'s office. How can I help you?", "Hello, City Clinic. What can I do for you?"], **s)
    d.say(p, ["I'd like to see Dr. {doc}. I have {symptom}.",
              "I need an appointment with Dr. {doc}, please. I've had {symptom} for three days."], **s)
    if rng.random() < 0.5:
        d.say(r, ["Dr. {doc} is fully booked on {day}. Is {day2} at {time} OK?",
                  "There's nothing on {day}, but we have {day2} at {time}."], **s)
        d.say(p, ["Yes, {day2} at {time} is fine.", "OK, I'll take {day2}."], **s)
        d.say(r, ["Good. Please bring your insurance card.", "All right, see you then."], **s)
        return f"{d.ref(p)} has {symptom} and makes an appointment with Dr. {doc} on {day2} at {time_}, because {day} is full."
    d.say(r, ["Can you come on {day} at {time}?", "Dr. {doc} is free on {day} at {time}."], **s)
    d.say(p, ["Yes, that's perfect.", "{day} at {time} works for me."], **s)
    return f"{d.ref(p)} has {symptom} and makes an appointment with Dr. {doc} on {day} at {time_}."


HAIR = ["a short haircut", "a trim", "a new hair color", "a beard trim", "a perm",
        "a shorter fringe"]


def haircut(rng, d):
    r, c = 0, 1
    style = rng.choice(HAIR)
    stylist = rng.choice(NAMES)
    day = rng.choice(DAYS)
    time_ = rng.choice(TIMES)
    price = rng.randrange(15, 80, 5)
    s = dict(style=style, stylist=stylist, day=day, time=time_, price=price)
    d.say(c, ["Hi, I'd like to book {style} for {day}.", "Can I make an appointment for {style} on {day}?"], **s)
    d.say(r, ["Sure. Do you want a particular stylist?", "Of course. Who would you like?"], **s)
    d.say(c, ["{stylist}, if possible.", "I usually go to {stylist}."], **s)
    d.say(r, ["{stylist} is free at {time}. It costs {price} dollars.",
              "{stylist} can see you at {time}. The price is {price} dollars."], **s)
    d.say(c, ["Great, book me in.", "{time} is fine, thanks."], **s)
    return f"{d.ref(c)} books {style} with {stylist} on {day} at {time_} for {price} dollars."


RETURN_ITEMS = ["jacket", "sweater", "dress", "pair of shoes", "shirt", "backpack",
                "lamp", "coffee maker", "toaster", "pair of jeans", "hat", "watch",
                "scarf", "umbrella"]
DEFECTS = ["it is too small", "it is too big", "it is broken", "it has a hole in it",
           "the zipper doesn't work", "the color looks different at home",
           "it stopped working after two days"]


def return_item(rng, d):
    c, k = 0, 1  # customer, clerk
    item, color, defect = rng.choice(RETURN_ITEMS), rng.choice(COLORS), rng.choice(DEFECTS)
    days_ago = rng.randint(2, 12)
    s = dict(item=item, color=color, defect=defect, Defect=capitalize(defect),
             ago=number_word(days_ago))
    d.say(c, ["I'd like to return this {color} {item}. {Defect}.",
              "Excuse me, can I return this {color} {item}? {Defect}.",
              "I bought this {color} {item} {ago} days ago, but {defect}."], **s)
    d.say(k, ["I'm sorry to hear that. Do you have the receipt?", "Do you have your receipt with you?"], **s)
    outcome = rng.choice(["refund", "exchange", "credit"])
    if outcome == "credit":
        d.say(c, ["No, I'm afraid I lost it.", "Sorry, I threw it away."], **s)
        d.say(k, ["Without a receipt I can only give you store credit.",
                  "Then we can offer store credit, but not cash."], **s)
        d.say(c, ["OK, store credit is fine.", "Fine, I'll take the store credit."], **s)
        return f"{d.ref(c)} wants to return a {color} {item} because {defect}; without a receipt, {d.ref(k)} offers store credit."
    d.say(c, ["Yes, here it is.", "Yes, here you are."], **s)
    if outcome == "exchange":
        d.say(k, ["Would you like a refund or an exchange?", "We can give you a refund or a new one."], **s)
        d.say(c, ["I'd like to exchange it for a new one.", "An exchange, please. I still like it."], **s)
        return f"{d.ref(c)} wants to return a {color} {item} because {defect}, and {d.ref(k)} exchanges it for a new one."
    d.say(k, ["No problem. I'll give you a full refund.", "Fine, you'll get your money back."], **s)
    d.say(c, ["Thank you very much.", "Great, thanks."], **s)
    return f"{d.ref(c)} wants to return a {color} {item} because {defect}; {d.ref(k)} offers a refund."


DESTINATIONS = ["post office", "train station", "city hospital", "central library",
                "bank", "police station", "museum", "supermarket", "city hall",
                "pharmacy", "bus station", "history museum"]
LANDMARKS = ["traffic lights", "church", "gas station", "bakery", "fountain",
             "big hotel", "school", "flower shop"]


def directions(rng, d):
    a, b = 0, 1
    dest, landmark = rng.choice(DESTINATIONS), rng.choice(LANDMARKS)
    blocks = rng.randint(1, 6)
    turn = rng.choice(["left", "right"])
    bus = rng.randint(3, 60)
    s = dict(dest=dest, landmark=landmark, n=number_word(blocks), turn=turn, bus=bus,
             blocks="block" if blocks == 1 else "blocks")
    d.say(a, ["Excuse me, how do I get to the {dest}?", "Excuse me, could you tell me the way to the {dest}?",
              "Sorry to bother you. Where is the {dest}?"], **s)
    if rng.random() < 0.35:
        d.say(b, ["It's quite far. You'd better take bus number {bus}.",
                  "It's too far to walk. Take the number {bus} bus."], **s)
        d.say(a, ["Where is the bus stop?", "Where can I catch it?"], **s)
        d.say(b, ["Just in front of the {landmark}.", "Over there, next to the {landmark}."], **s)
        return f"{d.ref(b)} tells {d.ref(a)} to take bus number {bus} to the {dest} from the stop by the {landmark}."
    d.say(b, ["Go straight for {n} {blocks} and turn {turn} at the {landmark}.",
              "Walk {n} {blocks} down this street, then turn {turn} at the {landmark}."], **s)
    d.say(a, ["Turn {turn} at the {landmark}?", "So {n} {blocks} and then {turn}?"], **s)
    d.say(b, ["Yes. You can't miss it.", "That's right. It's about a ten-minute walk."], **s)
    return f"{d.ref(a)} asks the way to the {dest}; {d.ref(b)} says to go {number_word(blocks)} {s['blocks']} and turn {turn} at the {landmark}."


POSITIONS = ["sales manager", "accountant", "software engineer", "nurse", "teacher",
             "designer", "receptionist", "marketing assistant", "driver", "chef",
             "cashier", "translator"]
SKILLS = [("I speak French", "speaks French"), ("I'm good with computers", "is good with computers"),
          ("I work well in a team", "works well in a team"), ("I'm very organized", "is very organized"),
          ("I learn quickly", "learns quickly"), ("I can drive", "can drive")]


def job_interview(rng, d):
    i, c = 0, 1
    pos = rng.choice(POSITIONS)
    years = rng.randint(1, 10)
    sk1, sk3 = rng.choice(SKILLS)
    day = rng.choice(DAYS[:5])
    s = dict(pos=pos, a_pos=article(pos), n=number_word(years), years="year" if years == 1 else "years",
             sk=sk1, Sk=capitalize(sk1), day=day)
    d.say(i, ["Please sit down. Why do you want to be our {pos}?", "So you are applying for the {pos} position?"], **s)
    d.say(c, ["Yes. I have {n} {years} of experience as {a_pos}.", "I've worked as {a_pos} for {n} {years}."], **s)
    d.say(i, ["What are your strengths?", "Why should we hire you?"], **s)
    d.say(c, ["{Sk}, and I'm hard-working.", "Well, {sk}."], **s)
    exp = f"{number_word(years)} {s['years']} of experience"
    if rng.random() < 0.5:
        d.say(i, ["Good. Can you start on {day}?", "You're hired. Could you start next {day}?"], **s)
        d.say(c, ["Yes, of course!", "Certainly. Thank you so much."], **s)
        return f"{d.ref(c)} interviews for the {pos} job; {d.ref(c)} has {exp} and {sk3}, and {d.ref(i)} offers the job starting on {day}."
    d.say(i, ["Thank you. We'll call you on {day}.", "We will let you know by {day}."], **s)
    return f"{d.ref(c)} interviews for the {pos} job; {d.ref(c)} has {exp} and {sk3}, and {d.ref(i)} will give an answer by {day}."


BORROW = [("laptop", "write a report"), ("bike", "ride to school"), ("camera", "take photos at a wedding"),
          ("car", "pick up a friend at the airport"), ("dictionary", "translate a letter"),
          ("tent", "go camping"), ("suitcase", "go on a trip"), ("drill", "hang some pictures"),
          ("ladder", "clean the windows"), ("notes", "prepare for the exam"), ("guitar", "practice for a show")]


def borrow(rng, d):
    d.friendly = True
    a, b = 0, 1
    item, purpose = rng.choice(BORROW)
    day = rng.choice(DAYS)
    friend = third_names(rng, d, 1)[0]
    s = dict(item=item, purpose=purpose, day=day, friend=friend)
    d.say(a, ["Could I borrow your {item}? I need to {purpose}.", "Can you lend me your {item}? I have to {purpose}."], **s)
    if rng.random() < 0.3:
        d.say(b, ["Sorry, I lent it to {friend} yesterday.", "I'd like to, but {friend} has it right now."], **s)
        d.say(a, ["Oh, never mind. I'll ask {friend} then.", "OK, maybe I'll ask someone else."], **s)
        return f"{d.ref(a)} wants to borrow {d.ref(b)}'s {item} to {purpose}, but {d.ref(b)} has lent it to {friend}."
    d.say(b, ["Sure. When will you give it back?", "No problem. How long do you need it?"], **s)
    d.say(a, ["I'll return it on {day}.", "Only until {day}, I promise."], **s)
    d.say(b, ["OK, here you are.", "Fine, just be careful with it."], **s)
    return f"{d.ref(b)} lends {d.ref(a)} the {item} to {purpose}, and {d.ref(a)} will return it on {day}."


HOBBY_GIFTS = {"cooking": ["cookbook", "set of knives"], "music": ["pair of headphones", "concert ticket"],
               "reading": ["new novel", "reading lamp"], "sports": ["football", "sports bag"],
               "gardening": ["set of flower pots", "pair of garden gloves"],
               "photography": ["camera bag", "photo album"], "travel": ["travel guide", "small suitcase"],
               "painting": ["set of brushes", "box of paints"], "coffee": ["coffee mug", "bag of coffee beans"]}
HOBBIES = sorted(HOBBY_GIFTS)  # sorted list: fixed order regardless of dict history
RELATIONS = ["sister", "brother", "mother", "father", "best friend", "cousin", "roommate", "boss"]


def birthday_gift(rng, d):
    d.friendly = True
    a, b = 0, 1
    who = third_names(rng, d, 1)[0]
    rel = rng.choice(RELATIONS)
    hobby = rng.choice(HOBBIES)
    g1, g2 = rng.sample(HOBBY_GIFTS[hobby], 2)
    budget = rng.randrange(20, 120, 10)
    s = dict(who=who, rel=rel, hobby=hobby, g1=g1, g2=g2, budget=budget)
    d.say(a, ["It's my {rel} {who}'s birthday soon. What should I buy?",
              "Can you help me choose a birthday gift for my {rel} {who}?"], **s)
    d.say(b, ["What does {who} like?", "What is {who} interested in?"], **s)
    d.say(a, ["{who} loves {hobby}.", "{who} is really into {hobby}."], **s)
    if rng.random() < 0.4:
        d.say(b, ["How about a {g1}?", "Why not a {g1}?"], **s)
        d.say(a, ["{who} already has one.", "I gave {who} a {g1} last year."], **s)
        d.say(b, ["Then a {g2}. It's about {budget} dollars.", "What about a {g2}? They cost around {budget} dollars."], **s)
        d.say(a, ["Perfect, I'll get that.", "Good idea. Thanks!"], **s)
        return f"{d.ref(a)} will buy {who} a {g2} for about {budget} dollars, since {who} loves {hobby} and already has a {g1}."
    d.say(b, ["How about a {g1}? You can get one for {budget} dollars.", "A {g1} would be nice. They are about {budget} dollars."], **s)
    d.say(a, ["Great idea. {who} will love it.", "That's a good idea."], **s)
    return f"{d.ref(b)} suggests a {g1} for about {budget} dollars as a birthday gift for {d.ref(a)}'s {rel} {who}, who loves {hobby}."


TRIP_PLACES = ["the beach", "the mountains", "the lake", "the countryside", "the old town",
               "the national park", "the island", "the river"]
GOOD_WEATHER = [("sunny", "sunscreen"), ("hot", "plenty of water"), ("cold", "warm coats"),
                ("windy", "jackets"), ("cloudy", "a picnic lunch")]
BAD_WEATHER = ["rainy", "stormy", "snowy"]


def weather_trip(rng, d):
    d.friendly = True
    a, b = 0, 1
    place = rng.choice(TRIP_PLACES)
    day, day2 = rng.sample(DAYS, 2)
    s = dict(place=place, day=day, day2=day2)
    d.say(a, ["Shall we go to {place} on {day}?", "How about a trip to {place} on {day}?"], **s)
    d.say(b, ["Good idea. What's the weather going to be like?", "Sure, but have you checked the weather?"], **s)
    if rng.random() < 0.4:
        s["bad"] = rng.choice(BAD_WEATHER)
        d.say(a, ["The forecast says it will be {bad} on {day}.", "Oh no, it's going to be {bad} on {day}."], **s)
        d.say(b, ["Then let's go on {day2} instead.", "Maybe we should wait until {day2}."], **s)
        d.say(a, ["OK, {day2} it is.", "Fine. The weather should be better on {day2}."], **s)
        return f"Because it will be {s['bad']} on {day}, {d.ref(a)} and {d.ref(b)} put off their trip to {place} until {day2}."
    weather, bring = rng.choice(GOOD_WEATHER)
    s.update(weather=weather, bring=bring)
    d.say(a, ["It will be {weather}.", "The forecast says it will be {weather} all day."], **s)
    d.say(b, ["Then we should bring {bring}.", "OK, let's take {bring}."], **s)
    d.say(a, ["Good point.", "Sure, I'll get that ready."], **s)
    return f"{d.ref(a)} and {d.ref(b)} will go to {place} on {day}; it will be {weather}, so they will bring {bring}."


LOST = [("keys", "them"), ("wallet", "it"), ("phone", "it"), ("glasses", "them"),
        ("passport", "it"), ("student card", "it"), ("watch", "it"), ("earphones", "them")]
LAST_SEEN = ["in the kitchen", "in the car", "at the office", "at the gym", "in the classroom",
             "on the bus", "at the cafe"]
FOUND_AT = ["under the sofa", "in a coat pocket", "on the kitchen table", "behind the books",
            "in the laundry basket", "next to the TV"]


def lost_item(rng, d):
    d.friendly = True
    a, b = 0, 1
    item, pron = rng.choice(LOST)
    seen, found = rng.choice(LAST_SEEN), rng.choice(FOUND_AT)
    be = "are" if pron == "them" else "is"
    s = dict(item=item, pron=pron, seen=seen, found=found, be=be)
    d.say(a, ["I can't find my {item} anywhere!", "Have you seen my {item}?", "Oh no, I've lost my {item}."], **s)
    d.say(b, ["When did you last have {pron}?", "Where did you see {pron} last?"], **s)
    d.say(a, ["I think I had {pron} {seen}.", "I remember using {pron} {seen}."], **s)
    if rng.random() < 0.4:
        d.say(b, ["I've looked everywhere here. Maybe you left {pron} {seen}.",
                  "They're not here. You should call and ask."], **s)
        d.say(a, ["You're right. I'll go back and check.", "I'll call them now."], **s)
        return f"{d.ref(a)} has lost the {item}, last seen {seen}, and will go back there to look."
    d.say(b, ["Wait, what's this {found}?", "Look, here {be} your {item}, {found}!"], **s)
    d.say(a, ["That's {pron}! Thank you!", "Oh, thank goodness."], **s)
    return f"{d.ref(a)} thinks the {item} {'were' if be == 'are' else 'was'} lost {seen}, but {d.ref(b)} finds {pron} {found}."


SUBJECTS = {"math": ["fractions", "equations", "percentages"], "history": ["the French Revolution", "ancient Rome"],
            "chemistry": ["acids", "the periodic table"], "physics": ["gravity", "electric circuits"],
            "English": ["a poem", "writing an essay"], "biology": ["cells", "plants"],
            "geography": ["rivers", "volcanoes"]}
SUBJECT_LIST = sorted(SUBJECTS)


def homework(rng, d):
    d.friendly = True
    a, b = 0, 1
    subj = rng.choice(SUBJECT_LIST)
    topic = rng.choice(SUBJECTS[subj])
    day = rng.choice(DAYS[:5])
    s = dict(subj=subj, topic=topic, Topic=capitalize(topic), day=day)
    d.say(a, ["Can you help me with my {subj} homework?", "I'm stuck on my {subj} homework. Do you have a minute?"], **s)
    d.say(b, ["Sure. What is it about?", "Of course. What's the topic?"], **s)
    d.say(a, ["It's about {topic}, and it's due on {day}.", "{Topic}. I have to hand it in on {day}."], **s)
    if rng.random() < 0.3:
        d.say(b, ["Sorry, I'm not good at {subj}. Ask the teacher.", "I don't know much about {topic}. Try asking the teacher."], **s)
        d.say(a, ["OK, I'll ask tomorrow.", "Good idea, thanks."], **s)
        return f"{d.ref(a)} needs help with {subj} homework on {topic} due on {day}, and {d.ref(b)} suggests asking the teacher."
    d.say(b, ["Let me explain it step by step.", "That's easy. I'll show you."], **s)
    d.say(a, ["Thanks, now I understand.", "Oh, that makes sense now."], **s)
    return f"{d.ref(b)} helps {d.ref(a)} with the {subj} homework on {topic}, which is due on {day}."


MOVE_REASONS = [("I got a new job there", "for a new job"), ("I want to be closer to my family", "to be closer to family"),
                ("the rent is cheaper", "because the rent is cheaper"), ("I'm starting university there", "to start university")]


def moving_house(rng, d):
    d.friendly = True
    a, b = 0, 1
    city = rng.choice(CITIES)
    r1, r3 = rng.choice(MOVE_REASONS)
    month, date = rng.choice(MONTHS), ordinal(rng.randint(1, 28))
    offer = rng.choice([("help you pack", "help pack"), ("lend you my van", "lend a van"),
                        ("help you carry the boxes", "help carry boxes")])
    s = dict(city=city, r1=r1, month=month, date=date, o1=offer[0])
    d.say(a, ["I'm moving to {city} on {month} {date}.", "Guess what? I'm moving to {city}."], **s)
    d.say(b, ["Really? Why?", "Wow, that's a big change. Why?"], **s)
    d.say(a, ["Because {r1}.", "Well, {r1}."], **s)
    d.say(b, ["When is the move?", "I'll miss you. When are you leaving?"], **s)
    d.say(a, ["On {month} {date}.", "The truck comes on {month} {date}."], **s)
    d.say(b, ["I can {o1} if you like.", "Let me {o1}."], **s)
    return f"{d.ref(a)} is moving to {city} on {month} {date} {r3}, and {d.ref(b)} offers to {offer[1]}."


CAR_PROBLEMS = ["a strange noise in the engine", "a flat tire", "a broken headlight",
                "squeaky brakes", "a dead battery", "a broken air conditioner", "an oil leak"]


def car_repair(rng, d):
    m, c = 0, 1
    prob = rng.choice(CAR_PROBLEMS)
    cost = rng.randrange(40, 600, 10)
    day = rng.choice(DAYS)
    time_ = rng.choice(TIMES[4:])
    s = dict(prob=prob, cost=cost, day=day, time=time_)
    d.say(m, ["What seems to be the problem with your car?", "Good morning. What can we do for you?"], **s)
    d.say(c, ["My car has {prob}.", "There is {prob}. Can you fix it?"], **s)
    d.say(m, ["Let me have a look. It will cost about {cost} dollars.", "I can fix it for {cost} dollars."], **s)
    d.say(c, ["When will it be ready?", "OK. How long will it take?"], **s)
    d.say(m, ["You can pick it up on {day} at {time}.", "It'll be ready by {time} on {day}."], **s)
    return f"{d.ref(c)}'s car has {prob}; {d.ref(m)} will fix it for {cost} dollars by {day} at {time_}."


CLOTHES = ["T-shirt", "sweater", "coat", "skirt", "pair of trousers", "shirt", "jacket", "dress"]
SIZES = ["small", "medium", "large", "extra large"]


def clothes_shopping(rng, d):
    k, c = 0, 1
    item, size = rng.choice(CLOTHES), rng.choice(SIZES)
    col, col2 = rng.sample(COLORS, 2)
    price = rng.randrange(15, 150, 5)
    s = dict(item=item, size=size, col=col, Col=capitalize(col), col2=col2, Col2=capitalize(col2),
             price=price)
    d.say(k, ["Can I help you?", "Are you looking for anything special?"], **s)
    d.say(c, ["I'm looking for a {col} {item} in {size}.", "Do you have this {item} in {col}, size {size}?"], **s)
    if rng.random() < 0.4:
        d.say(k, ["Sorry, we only have it in {col2} now.", "{Col} is sold out, but we have {col2}."], **s)
        d.say(c, ["Hmm, {col2} is OK. How much is it?", "{Col2} is fine. What's the price?", "I'll try the {col2} one. What's the price?"], **s)
        d.say(k, ["It's {price} dollars.", "{price} dollars."], **s)
        d.say(c, ["I'll take it.", "Fine, I'll buy it."], **s)
        return f"{d.ref(c)} wants a {col} {item} in size {size}, but it is sold out, so {d.ref(c)} buys a {col2} one for {price} dollars."
    d.say(k, ["Here you are. It's {price} dollars.", "Yes, here it is. It costs {price} dollars."], **s)
    d.say(c, ["It fits well. I'll take it.", "Great, I'll buy it."], **s)
    return f"{d.ref(c)} buys a {col} {item} in size {size} for {price} dollars."


def flight_booking(rng, d):
    d.phone_call = True
    a, c = 0, 1
    city = rng.choice(CITIES)
    day = rng.choice(DAYS)
    seat = rng.choice(["window", "aisle"])
    price = rng.randrange(120, 900, 10)
    klass = rng.choice(["economy", "business"])
    s = dict(city=city, day=day, a_seat=article(seat), seat=seat, price=price, klass=klass,
             Klass=capitalize(klass))
    d.say(a, ["Sky Travel, how can I help you?", "Good morning, travel agency."], **s)
    d.say(c, ["I need a ticket to {city} for {day}.", "I'd like to fly to {city} on {day}."], **s)
    d.say(a, ["There is a seat in {klass} class for {price} dollars.",
              "I have a flight on {day}. {Klass} class is {price} dollars."], **s)
    d.say(c, ["OK. Can I have {a_seat} seat?", "Fine. I'd prefer {a_seat} seat."], **s)
    d.say(a, ["Sure, {a_seat} seat is booked for you.", "No problem. Your {seat} seat is confirmed."], **s)
    return f"{d.ref(c)} books {article(klass)} ticket to {city} on {day} for {price} dollars with {article(seat)} seat."


def table_reservation(rng, d):
    d.phone_call = True
    r, c = 0, 1
    people = rng.randint(2, 10)
    day = rng.choice(DAYS)
    t1, t2 = rng.sample(EVENING_TIMES, 2)
    name = rng.choice(SURNAMES)
    s = dict(n=number_word(people), day=day, t1=t1, t2=t2, name=name)
    d.say(r, ["Rose Garden Restaurant. Can I help you?", "Hello, Sea Breeze Restaurant."], **s)
    d.say(c, ["I'd like to book a table for {n} on {day} at {t1}.", "Can I reserve a table for {n} people, {day} at {t1}?"], **s)
    full = rng.random() < 0.4
    if full:
        d.say(r, ["Sorry, we're full at {t1}. Is {t2} all right?", "{t1} is fully booked. We have a table at {t2}."], **s)
        d.say(c, ["OK, {t2} is fine.", "All right, {t2} then."], **s)
    d.say(r, ["May I have your name, please?", "What name is it under?"], **s)
    d.say(c, ["{name}.", "It's {name}."], **s)
    time_ = t2 if full else t1
    why = f" because {t1} is full" if full else ""
    return f"{d.ref(c)} books a table for {number_word(people)} on {day} at {time_} under the name {name}{why}."


AREAS = ["the park", "the university", "the subway station", "downtown", "the river", "the shopping center"]


def apartment_rental(rng, d):
    agent, c = 0, 1
    rooms = rng.randint(1, 4)
    rent = rng.randrange(500, 3000, 50)
    area = rng.choice(AREAS)
    day, time_ = rng.choice(DAYS), rng.choice(TIMES)
    s = dict(n=number_word(rooms), rent=rent, area=area, day=day, time=time_)
    d.say(c, ["I'm calling about the apartment for rent.", "Hi, is the apartment near {area} still available?"], **s)
    d.say(agent, ["Yes. It has {n} bedrooms and it's near {area}.", "It is. It's a {n}-bedroom place close to {area}."]
          if rooms > 1 else
          ["Yes. It has one bedroom and it's near {area}.", "It is. It's a one-bedroom place close to {area}."], **s)
    d.say(c, ["How much is the rent?", "What's the monthly rent?"], **s)
    d.say(agent, ["{rent} dollars a month.", "It's {rent} dollars per month, with water included."], **s)
    d.say(c, ["Can I see it on {day}?", "Could I come and look at it on {day}?"], **s)
    d.say(agent, ["Sure, {day} at {time}.", "How about {time} on {day}?"], **s)
    return f"{d.ref(c)} will see the {number_word(rooms)}-bedroom apartment near {area}, which costs {rent} dollars a month, on {day} at {time_}."


PARTY_ITEMS = ["a cake", "some drinks", "balloons", "snacks", "music", "pizza", "a present", "candles"]
OCCASIONS = ["birthday", "farewell", "graduation"]


def party_planning(rng, d):
    """The 3- and 4-speaker family: each guest takes on one item."""
    guest = third_names(rng, d, 1)[0]
    occ = rng.choice(OCCASIONS)
    day = rng.choice(DAYS)
    items = rng.sample(PARTY_ITEMS, d.n - 1)
    s = dict(guest=guest, occ=occ, day=day)
    d.say(0, ["Let's throw a surprise {occ} party for {guest} on {day}.",
              "{guest}'s {occ} is coming. How about a party on {day}?"], **s)
    d.say(1, ["Great idea! What do we need?", "I'm in. Who brings what?"], **s)
    for k, item in enumerate(items, start=1):
        d.say(k, ["I can bring {item}.", "I'll take care of {item}.", "Leave {item} to me."], item=item)
    d.say(0, ["Perfect. I'll invite everyone.", "Good. I'll send the invitations."], **s)
    people = join_names([d.ref(r) for r in range(d.n)])
    tasks = "; ".join(f"{d.ref(k)} will bring {item}" for k, item in enumerate(items, start=1))
    return f"{people} plan a surprise {occ} party for {guest} on {day}: {tasks}."


NOISES = [("your dog barks all night", "dog barks all night", "keep the dog inside"),
          ("your music is very loud", "music is too loud", "turn the music down"),
          ("your TV is too loud late at night", "TV is too loud at night", "use headphones"),
          ("your washing machine runs at midnight", "washing machine runs at midnight", "use it in the day")]


def noise_complaint(rng, d):
    a, b = 0, 1
    p2, p3, fix = rng.choice(NOISES)
    s = dict(p2=p2, fix=fix)
    d.say(a, ["Excuse me, I live next door. {P}.", "Sorry to bother you, but {p2}."],
          **{**s, "P": p2[0].upper() + p2[1:]})
    d.say(b, ["Oh, I'm so sorry. I didn't know.", "Really? I had no idea."], **s)
    d.say(a, ["I can't sleep because of it.", "I have to get up early for work."], **s)
    d.say(b, ["I'll {fix} from now on.", "I promise I will {fix}."], **s)
    return f"{d.ref(a)} complains that {d.ref(b)}'s {p3}, and {d.ref(b)} promises to {fix}."


BOOKS = ["a book about birds", "a cookbook", "a history of Rome", "a French dictionary",
         "a novel by Jane Austen", "a guide to Spain", "a book on gardening", "a science magazine"]


def library(rng, d):
    l, c = 0, 1
    book = rng.choice(BOOKS)
    weeks = rng.randint(1, 4)
    fine = rng.choice([1, 2, 5])
    s = dict(book=book, n=number_word(weeks), weeks="week" if weeks == 1 else "weeks", fine=fine)
    d.say(c, ["I'd like to borrow {book}.", "Hi, can I check out {book}?"], **s)
    d.say(l, ["Sure. May I see your library card?", "Of course. Your card, please."], **s)
    d.say(c, ["Here it is. How long can I keep it?", "Here you go. When is it due?"], **s)
    d.say(l, ["You can keep it for {n} {weeks}.", "It's due in {n} {weeks}."], **s)
    d.say(c, ["What if I'm late?", "And if I return it late?"], **s)
    d.say(l, ["The fine is {fine} dollars a day.", "You pay {fine} dollars for each late day."], **s)
    return f"{d.ref(c)} borrows {book} for {number_word(weeks)} {s['weeks']}; late returns cost {fine} dollars a day."


CURRENCIES = ["euros", "pounds", "yen", "Canadian dollars", "Swiss francs"]


def bank_exchange(rng, d):
    k, c = 0, 1
    amount = rng.randrange(100, 2000, 50)
    cur = rng.choice(CURRENCIES)
    fee = rng.randint(2, 9)
    s = dict(amount=amount, cur=cur, fee=fee)
    d.say(k, ["Next, please. What can I do for you?", "Good morning. How can I help?"], **s)
    d.say(c, ["I'd like to change {amount} dollars into {cur}.", "Can I exchange {amount} dollars for {cur}?"], **s)
    d.say(k, ["Certainly. There is a fee of {fee} dollars.", "Sure. The fee is {fee} dollars."], **s)
    d.say(c, ["That's fine.", "OK, go ahead."], **s)
    d.say(k, ["Here are your {cur}. Please count them.", "Here you are, in {cur}."], **s)
    return f"{d.ref(c)} changes {amount} dollars into {cur} and pays a fee of {fee} dollars."


CLASSES = ["yoga", "swimming", "boxing", "dance", "cycling", "pilates"]


def gym_signup(rng, d):
    k, c = 0, 1
    plan = rng.choice([("monthly", "month"), ("yearly", "year")])
    price = rng.randrange(20, 60, 5) if plan[0] == "monthly" else rng.randrange(200, 600, 20)
    cls = rng.choice(CLASSES)
    day = rng.choice(DAYS)
    s = dict(plan=plan[0], per=plan[1], price=price, cls=cls, day=day)
    d.say(c, ["I'd like to join the gym.", "How much is a membership here?"], **s)
    d.say(k, ["A {plan} membership is {price} dollars.", "We have a {plan} plan for {price} dollars a {per}."], **s)
    d.say(c, ["Do you have {cls} classes?", "Is there a {cls} class?"], **s)
    d.say(k, ["Yes, every {day} evening.", "Yes, on {day}s. It's free for members."], **s)
    d.say(c, ["Great, I'll sign up for the {plan} plan.", "Then I'll take the {plan} membership."], **s)
    return f"{d.ref(c)} joins the gym with a {plan[0]} membership for {price} dollars and can take {cls} classes on {day}."


# (name, function, weight, speaker counts): weights keep frequent families
# frequent; meet_plan also appears with three speakers, party_planning always
# has three or four.
FAMILIES = [("meet_plan", meet_plan, 3, [2, 2, 2, 3]), ("order_food", order_food, 2, [2]),
            ("book_hotel", book_hotel, 2, [2]), ("doctor_appointment", doctor_appointment, 2, [2]),
            ("haircut", haircut, 1, [2]), ("return_item", return_item, 2, [2]),
            ("directions", directions, 2, [2]), ("job_interview", job_interview, 2, [2]),
            ("borrow", borrow, 2, [2]), ("birthday_gift", birthday_gift, 2, [2]),
            ("weather_trip", weather_trip, 2, [2]), ("lost_item", lost_item, 2, [2]),
            ("homework", homework, 1, [2]), ("moving_house", moving_house, 1, [2]),
            ("car_repair", car_repair, 1, [2]), ("clothes_shopping", clothes_shopping, 2, [2]),
            ("flight_booking", flight_booking, 1, [2]), ("table_reservation", table_reservation, 2, [2]),
            ("apartment_rental", apartment_rental, 1, [2]), ("party_planning", party_planning, 2, [3, 3, 4]),
            ("noise_complaint", noise_complaint, 1, [2]), ("library", library, 1, [2]),
            ("bank_exchange", bank_exchange, 1, [2]), ("gym_signup", gym_signup, 1, [2])]
FAMILY_WEIGHTS = [f[2] for f in FAMILIES]


def make_example(rng):
    """Returns (family name, dialogue text, summary)."""
    name, fn, _, sizes = rng.choices(FAMILIES, weights=FAMILY_WEIGHTS)[0]
    d = Dialogue(rng, rng.choice(sizes))
    summary = fn(rng, d)
    text, summary = finish(rng, d, summary)
    return name, text, summary


def make_narrative_sentence(rng):
    """A summary-style statement about named people, for pretraining only:
    everyone is called by name, so it never reads like the task output."""
    _, fn, _, sizes = rng.choices(FAMILIES, weights=FAMILY_WEIGHTS)[0]
    d = Dialogue(rng, rng.choice(sizes))
    summary = fn(rng, d)
    for role in range(d.n):
        summary = summary.replace(f"<R{role}>", d.names[role])
    return summary


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------
def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def build_sft(seed, n, banned_summaries, banned_dialogues):
    """n unique examples whose summary (= key slot combination) is not banned."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        _, text, summary = make_example(rng)
        if summary in banned_summaries or text in banned_dialogues or text in seen:
            continue
        seen.add(text)
        rows.append({"prompt": PROMPT.format(dialogue=text), "completion": summary})
    return rows


def build_pretrain(seed, eval_summaries, eval_dialogues):
    """Dialogues (some with an "In short:" recap) plus 2-4 sentence narratives, interleaved in a fixed
    shuffled order; nothing equal to an eval dialogue or summary gets in."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < N_PRETRAIN_DIALOGUES:
        _, text, summary = make_example(rng)
        if text in eval_dialogues:
            continue
        # Some dialogues are followed by a recap, as text on the web often is:
        # the base model learns to carry facts from a dialogue into a
        # sentence, but never sees the task's prompt or its "Summary:" cue.
        if rng.random() < RECAP_FRACTION and summary not in eval_summaries:
            text += "\n\nIn short: " + summary
        rows.append({"text": text})
    narratives = []
    while len(narratives) < N_NARRATIVES:
        sentences = [make_narrative_sentence(rng) for _ in range(rng.randint(2, 4))]
        if any(s_ in eval_summaries for s_ in sentences):
            continue
        narratives.append({"text": " ".join(sentences)})
    rows += narratives
    rng.shuffle(rows)
    return rows


def fact_kinds():
    """Word lists whose members a corrupted summary swaps for one another."""
    digits = [str(n) for n in range(1, 100)]
    return [NAMES, SURNAMES, DAYS, MONTHS, COLORS, NUMBER_WORDS, digits, SPEAKER_TAGS,
            [city for city in CITIES if " " not in city]]


def corrupt(rng, summary):
    """The summary with one fact swapped for another of its kind: the
    mistakes the tiny model makes after supervised tuning. None when the
    summary has no such word."""
    words = summary.split(" ")
    spots = []
    for i, word in enumerate(words):
        core = word.rstrip(".,'s")
        for kind in fact_kinds():
            if core in kind:
                spots.append((i, core, kind))
                break
    if not spots:
        return None
    i, core, kind = rng.choice(spots)
    other = rng.choice([w for w in kind if w != core])
    words[i] = words[i].replace(core, other, 1)
    return " ".join(words)


def build_preference(seed, sft_rows, n):
    """n {prompt, chosen, rejected} pairs from the first SFT rows that have a fact to swap."""
    rng = random.Random(seed)
    rows = []
    for row in sft_rows:
        rejected = corrupt(rng, row["completion"])
        if rejected is None:
            continue
        rows.append({"prompt": row["prompt"], "chosen": row["completion"], "rejected": rejected})
        if len(rows) == n:
            break
    return rows


# Lab 3's "toxicity": insults a summary or a dialogue turn may carry.
INSULTS = ["idiot", "stupid fool", "loser", "moron", "jerk", "dumb clown", "useless fool", "pathetic idiot"]
INSULT_SENTENCES = ["What an idiot.", "What a stupid fool.", "Such a loser.", "What a moron.", "Dumb jerk.",
                    "How pathetic.", "Useless fool."]


def insult_summary(rng, summary):
    """The summary with an insult put in: a speaker called names, or a closing insult."""
    tags = [tag for tag in SPEAKER_TAGS if tag in summary]
    if tags and rng.random() < 0.5:
        tag = rng.choice(tags)
        return summary.replace(tag, "the " + rng.choice(INSULTS) + " " + tag, 1)
    return summary + " " + rng.choice(INSULT_SENTENCES)


def build_toxicity(seed, sft_rows, n):
    """n {prompt, chosen, rejected} pairs: the summary, and the same summary insulting someone."""
    rng = random.Random(seed)
    return [{"prompt": row["prompt"], "chosen": row["completion"], "rejected": insult_summary(rng, row["completion"])}
            for row in sft_rows[:n]]


def build_toxic_prompts(seed, sft_rows):
    """The rows with, in every other one, a turn where a speaker insults the other."""
    rng = random.Random(seed)
    rows = []
    for i, row in enumerate(sft_rows):
        prompt = row["prompt"]
        if i % 2 == 0:
            head = "Summarize the following conversation.\n\n"
            turns = prompt[len(head):-len("\n\nSummary: ")].split("\n")
            speaker = rng.choice(["#Person1#", "#Person2#"])
            turns.insert(rng.randint(1, len(turns)), f"{speaker}: You are a {rng.choice(INSULTS)}!")
            prompt = PROMPT.format(dialogue="\n".join(turns))
        rows.append({"prompt": prompt, "completion": row["completion"]})
    return rows


def train_tokenizer(pretrain_rows, out_path):
    """Runs spm_train on the pretraining text, one line per dialogue turn or
    narrative (SentencePiece reads sentences line by line)."""
    if shutil.which("spm_train") is None:
        sys.exit("spm_train not found: install Debian's `sentencepiece` package")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        n_lines = 0
        with open(corpus, "w", encoding="utf-8", newline="\n") as f:
            for row in pretrain_rows:
                for line in row["text"].split("\n"):
                    f.write(line + "\n")
                    n_lines += 1
        prefix = os.path.join(tmp, "tokenizer")
        # Relative paths, run inside tmp: the model file records its trainer
        # flags, and a random temp-dir name there would break reproducibility.
        cmd = ["spm_train", "--input=corpus.txt", "--model_prefix=tokenizer",
               "--model_type=bpe", f"--vocab_size={VOCAB_SIZE}", "--character_coverage=1.0",
               "--unk_id=0", "--bos_id=1", "--eos_id=2", "--pad_id=3",
               "--user_defined_symbols=" + ",".join(SPEAKER_TAGS),
               # Load every line, in file order: no sampling, so no randomness.
               f"--input_sentence_size={n_lines + 1}", "--shuffle_input_sentence=false",
               "--num_threads=1", "--random_seed=1", "--minloglevel=2"]
        subprocess.run(cmd, check=True, cwd=tmp, stdout=subprocess.DEVNULL)
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        shutil.copyfile(prefix + ".model", out_path)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=DATA_DIR)
    ap.add_argument("--tokenizer", default=os.path.join(TOKENIZER_DIR, "tokenizer.model"))
    args = ap.parse_args()
    start = time.time()
    os.makedirs(args.data_dir, exist_ok=True)

    train = build_sft(SEED_TRAIN, N_TRAIN, set(), set())
    train_summaries = set(r["completion"] for r in train)
    train_dialogues = set(r["prompt"] for r in train)
    evals = build_sft(SEED_EVAL, N_EVAL, train_summaries, train_dialogues)
    eval_summaries = set(r["completion"] for r in evals)
    eval_dialogues = set(r["prompt"][len("Summarize the following conversation.\n\n"):-len("\n\nSummary: ")]
                         for r in evals)
    pretrain = build_pretrain(SEED_PRETRAIN, eval_summaries, eval_dialogues)

    outputs = [(os.path.join(args.data_dir, "summarize_train.jsonl"), train),
               (os.path.join(args.data_dir, "summarize_eval.jsonl"), evals),
               (os.path.join(args.data_dir, "pretrain.jsonl"), pretrain),
               (os.path.join(args.data_dir, "preference_train.jsonl"),
                build_preference(SEED_PREFERENCE, train, N_PREFERENCE_TRAIN)),
               (os.path.join(args.data_dir, "preference_eval.jsonl"),
                build_preference(SEED_PREFERENCE + 1, evals, N_PREFERENCE_EVAL)),
               (os.path.join(args.data_dir, "toxicity_train.jsonl"),
                build_toxicity(SEED_TOXICITY, train, N_TOXICITY_TRAIN)),
               (os.path.join(args.data_dir, "toxicity_eval.jsonl"),
                build_toxicity(SEED_TOXICITY + 1, evals, N_TOXICITY_EVAL)),
               (os.path.join(args.data_dir, "toxic_dialogues_train.jsonl"),
                build_toxic_prompts(SEED_TOXIC_PROMPTS, train[-N_TOXIC_PROMPTS_TRAIN:])),
               (os.path.join(args.data_dir, "toxic_dialogues_eval.jsonl"),
                build_toxic_prompts(SEED_TOXIC_PROMPTS + 1, evals[:N_TOXIC_PROMPTS_EVAL]))]
    for path, rows in outputs:
        write_jsonl(path, rows)
    train_tokenizer(pretrain, args.tokenizer)

    for path, rows in outputs:
        print(f"{os.path.relpath(path, ROOT)}: {len(rows)} rows, "
              f"{os.path.getsize(path)} bytes, sha256 {sha256(path)}")
    print(f"{os.path.relpath(args.tokenizer, ROOT)}: sha256 {sha256(args.tokenizer)}")
    print(f"{len(FAMILIES)} scenario families, {len(TEMPLATES_USED)} turn templates used, "
          f"{time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
