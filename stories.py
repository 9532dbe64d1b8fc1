"""A seeded generator of simple children's stories: the offline fallback corpus.

When TinyStories cannot be downloaded, `python train.py` trains on text made here instead. Every word of
the templates below was written for this project. A story is a hero (a child or a small animal with a name
and a trait) at a place, a plot (a lost toy, a new friend, a fear, sharing, helping, building, a race, a
broken thing, exploring, a rainy day, a seed, getting lost, a surprise, a messy room), dialogue, feelings and a
closing line or moral. Each sentence has
several phrasings, so a few million bytes hold tens of thousands of distinct stories, yet the grammar is
regular enough that a tiny model learns visible structure (names recur, quotes close, stories end).

    python stories.py --out data/stories.txt --num_bytes 4000000 --seed 0   # write a corpus
    python stories.py --print 3 --seed 1                                    # show three stories

An existing --out is refused unless --force.

Format: every story is followed by SEPARATOR = "\\n<|endoftext|>\\n" (as in TinyStories-train.txt), so the
file is SEPARATOR-terminated documents; paragraphs inside a story are separated by a single "\\n".
"""
import argparse
import os
import random
import re
import sys
import time
from types import SimpleNamespace

SEPARATOR = "\n<|endoftext|>\n"

# ----------------------------------------------------------------------------------------------------------
# the cast, the places, the things

GIRL_NAMES = ["Lily", "Mia", "Zoe", "Ella", "Ruby", "Nora", "Ava", "Lucy", "Rosa", "Ivy", "Maya", "Hana",
              "Amara", "Priya", "Sofia", "Chloe", "Daisy", "Grace", "Nina", "Tess", "Lena", "Sara", "Emma",
              "Anna", "Kira", "Molly", "Poppy", "Jade", "Luna", "Wren"]
BOY_NAMES = ["Tom", "Ben", "Max", "Leo", "Sam", "Finn", "Jack", "Omar", "Raj", "Kai", "Theo", "Eli", "Noah",
             "Luca", "Milo", "Arlo", "Jonah", "Pedro", "Kenji", "Ollie", "Toby", "Adam", "Felix", "Hugo",
             "Ravi", "Jamal", "Oscar", "Dan", "Bruno", "Timmy"]
ANIMALS = ["bunny", "puppy", "kitten", "bear cub", "fox", "duck", "mouse", "squirrel", "owl", "turtle",
           "frog", "piglet", "lamb", "elephant", "tiger cub", "penguin", "hedgehog", "raccoon", "deer", "goat",
           "bird", "lion cub", "pony", "otter"]
TRAITS = {  # trait -> sentences that show it (he/his filled in later)
    "kind": ["{He} always shared {his} snacks with others.", "{He} liked to help anyone who looked sad."],
    "brave": ["{He} was not afraid to try new things.", "{He} liked to climb the tallest rocks."],
    "shy": ["{He} often hid behind {his} mom when new friends came.", "{He} spoke in a very small voice."],
    "curious": ["{He} wanted to know how everything worked.", "{He} asked a hundred questions every day."],
    "silly": ["{He} loved to make funny faces.", "{He} could make everyone laugh with {his} jokes."],
    "clever": ["{He} was good at solving puzzles.", "{He} always had a new idea."],
    "gentle": ["{He} moved slowly and softly so {he} would not scare the birds.",
               "{He} held baby flowers very carefully."],
    "cheerful": ["{He} sang a happy song every morning.", "{He} smiled at everyone {he} met."],
    "grumpy": ["{He} did not like to wake up early.", "{He} frowned when things did not go {his} way."],
    "careful": ["{He} always looked both ways before {he} crossed the path.", "{He} kept {his} toys in neat rows."],
    "playful": ["{He} loved to run, jump and roll in the grass.", "{He} never said no to a game."],
    "quiet": ["{He} liked to sit and listen to the wind.", "{He} did not talk much, but {he} noticed everything."],
    "helpful": ["{He} always asked, \"Can I help?\"", "{He} liked to carry things for {his} grandma."],
    "proud": ["{He} liked to show everyone what {he} could do.", "{He} wanted to be the best at every game."],
    "sleepy": ["{He} yawned a lot, even in the morning.", "{He} could take a nap almost anywhere."],
    "happy": ["{He} laughed at the smallest things.", "{He} was happy most of the time."],
}
PLACES = {  # place -> (features, a sound you hear there)
    "the park": (["the swings", "the big slide", "an old oak tree", "the sandbox", "a green bench"],
                 "children laughing"),
    "the forest": (["a mossy log", "the tall pine trees", "a pile of leaves", "a little stream", "a big rock"],
                   "birds singing"),
    "the beach": (["the soft sand", "a pile of seaweed", "a rock pool", "the blue waves", "a wooden boat"],
                  "waves splashing"),
    "the farm": (["the red barn", "a pile of hay", "the wooden fence", "the chicken coop", "the muddy pond"],
                 "cows mooing"),
    "the garden": (["the tall sunflowers", "the vegetable patch", "a flower pot", "the watering can", "a rose bush"],
                   "bees buzzing"),
    "the meadow": (["the long grass", "a patch of daisies", "a little hill", "a lonely tree", "a butterfly bush"],
                   "crickets chirping"),
    "the river": (["the smooth stones", "the little bridge", "a bend in the water", "the reeds", "a fallen branch"],
                  "water rushing"),
    "the backyard": (["the tree house", "the old shed", "the clothesline", "the dog house", "a bush by the gate"],
                     "a dog barking"),
    "the school yard": (["the climbing frame", "the painted hopscotch", "the bike rack", "a big tree", "the fence"],
                        "a bell ringing"),
    "the town square": (["the fountain", "the flower stand", "the bakery door", "a lamp post", "the old clock"],
                        "people chatting"),
    "the pond": (["the lily pads", "the muddy bank", "a floating log", "the cattails", "a flat rock"],
                 "frogs croaking"),
    "the snowy hill": (["a snow bank", "the sled track", "a frozen bush", "a big pine tree", "a pile of snow"],
                       "the wind whistling"),
    "the kitchen": (["the big table", "the cookie jar", "a shelf of cups", "the warm oven", "a basket of bread"],
                    "a pot bubbling"),
    "the library": (["a tall bookshelf", "a soft chair", "the picture books", "a reading rug", "the window seat"],
                    "pages turning"),
}
THINGS = ["ball", "kite", "teddy bear", "toy boat", "stone", "hat", "music box", "picture book", "drum",
          "bucket", "crown", "toy train", "scarf", "bell", "shell", "crayon", "robot", "doll", "spoon", "whistle",
          "marble", "feather", "umbrella", "blanket"]
COLORS = ["red", "blue", "yellow", "green", "purple", "orange", "pink", "shiny", "little", "striped",
          "spotted", "golden", "soft", "old", "new", "tiny", "big", "silver"]
OPENINGS = ["Once upon a time", "One sunny morning", "One rainy afternoon", "One windy day", "Long ago",
            "Early one spring morning", "One cold winter evening", "One warm summer day", "Not long ago",
            "On a bright autumn day", "One day", "One quiet Sunday"]
SAID = ["said", "said", "said", "said", "said", "shouted", "whispered", "called"]
HAPPY = ["happy", "glad", "proud", "so happy", "very happy", "full of joy"]
SAD = ["sad", "very sad", "upset", "worried", "a little sad", "so sad"]
FOODS = ["apples", "cookies", "berries", "sandwiches", "carrots", "honey cakes", "pears", "nuts", "lemonade", "muffins"]
GAMES = ["tag", "hide and seek", "catch", "jump rope", "a guessing game", "pretend pirates", "hopscotch",
         "follow the leader"]


def _person(r, taken, adult=False):
    """A named character with pronouns. Animals get names too ("a fox named Finn")."""
    girl = r.random() < 0.5
    names = [n for n in (GIRL_NAMES if girl else BOY_NAMES) if n not in taken]
    name = r.choice(names)
    taken.add(name)
    if adult:  # grown-ups are called what a child calls them: Mom, Grandpa, Aunt Rosa, Mr. Omar
        kind = r.choice(["mom", "grandma", "aunt", "teacher"] if girl else ["dad", "grandpa", "uncle", "teacher"])
        if kind in ("aunt", "uncle"):
            name = f"{kind.capitalize()} {name}"
        elif kind == "teacher":
            name = f"{'Ms.' if girl else 'Mr.'} {name}"
        else:
            name = kind.capitalize()
    elif r.random() < 0.5:
        kind = "girl" if girl else "boy"
    else:
        kind = r.choice(ANIMALS)
    he, him, his = ("she", "her", "her") if girl else ("he", "him", "his")
    trait = r.choice(list(TRAITS))
    return SimpleNamespace(name=name, kind=kind, a=_an(kind), he=he, him=him, his=his, He=he.capitalize(),
                           His=his.capitalize(), trait=trait, human=kind in ("girl", "boy"))


def _fmt(s, p):
    return s.format(He=p.He, he=p.he, his=p.his, His=p.His, him=p.him, name=p.name)


def _say(r, who, words):
    """A line of dialogue, placing the speaker before or after the quote."""
    verb = "asked" if words.endswith("?") else r.choice([v for v in SAID if v != "asked"])
    if r.random() < 0.6:  # quote first: a closing full stop becomes a comma ("Let's go," Tom said.)
        words = words[:-1] + "," if words.endswith(".") else words
        return f"\"{words}\" {who.name} {verb}."
    return f"{who.name} {verb}, \"{words}\""


def _an(word):
    return "an" if word[0] in "aeiou" else "a"


def _the(phrase):
    return re.sub(r"^an? ", "the ", phrase)


def _thing(r):
    return f"{r.choice(COLORS)} {r.choice(THINGS)}"


def _intro(r, h, place, time_):
    trait_line = _fmt(r.choice(TRAITS[h.trait]), h)
    kind = "little girl" if h.kind == "girl" else "little boy" if h.kind == "boy" else h.kind
    a = _an(kind)
    return r.choice([
        f"{time_}, there was {_an(h.trait)} {h.trait} {kind} named {h.name}. {trait_line}",
        f"{time_}, {a} {kind} named {h.name} went to {place}. {h.name} was very {h.trait}. {trait_line}",
        f"{h.name} was {_an(h.trait)} {h.trait} {kind} who lived near {place}. {trait_line}",
        f"{time_}, {h.name + ' the ' + kind if not h.human else 'little ' + h.name} looked out of the window. "
        f"{trait_line} Today {h.he} wanted to go to {place}.",
    ])


# ----------------------------------------------------------------------------------------------------------
# plots: each returns a list of paragraphs after the intro

def _lost(r, h, f, g, place, feats):
    obj = _thing(r)
    spots = r.sample(feats, 3)
    finder = r.choice([f"a bird had taken it to its nest in {spots[2]}", f"it was hiding under {spots[2]}",
                       f"a puppy was sleeping on it next to {spots[2]}", f"it had rolled behind {spots[2]}"])
    return [
        f"{h.name} had {_an(obj)} {obj}. {h.He} loved it more than anything. {h.He} took it everywhere.",
        f"At {place}, {h.name} put the {obj} down to play. When {h.he} came back, it was gone! "
        f"{h.name} felt {r.choice(SAD)}. "
        + _say(r, h, r.choice([f"Where is my {obj}?", "Oh no, I lost it!", "Has anyone seen my toy?"])),
        f"{h.He} looked near {spots[0]}. It was not there. {h.He} looked by {spots[1]}. It was not there either.",
        f"Then {h.his} friend {f.name} came by. "
        + _say(r, f, r.choice(["I will help you look!", "Don't cry. Let's look together.",
                               "Two pairs of eyes are better than one."])),
        f"They looked high and low. At last {f.name} saw that {finder}. "
        + _say(r, h, r.choice(["You found it! Thank you!", "My " + obj.split()[-1] + "! Thank you so much!",
                               "Hooray! You are the best friend ever."])),
        f"{h.name} hugged the {obj} and {f.name}. {h.He} was {r.choice(HAPPY)}. "
        + r.choice(["From then on, {name} kept {his} toys close.",
                    "{He} learned that friends make every problem smaller.",
                    "{He} learned that it is good to ask for help."]).format(name=h.name, his=h.his, He=h.He),
    ]


def _friend(r, h, f, g, place, feats):
    game = r.choice(GAMES)
    return [
        f"At {place}, {h.name} saw {f.a} {f.kind} sitting alone near {r.choice(feats)}. "
        f"The {f.kind} looked {r.choice(['sad', 'lonely', 'shy', 'a little scared'])}.",
        f"{h.name} walked over. "
        + _say(r, h, r.choice(["Hello! What is your name?", "Hi! Do you want to play with me?", "Are you new here?"])),
        _say(r, f, r.choice([f"My name is {f.name}. I just moved here.", f"I am {f.name}. I don't know anyone yet.",
                             f"I'm {f.name}. Nobody asked me to play."])),
        f"{h.name} smiled. " + _say(r, h, r.choice([f"Let's play {game}!", f"You can play {game} with me.",
                                                    f"Do you know how to play {game}? I can show you."])),
        r.choice([f"They played {game} all afternoon. {f.name} laughed and laughed.",
                  f"They played {game} until the sun went down. {f.name} was not lonely anymore.",
                  f"At first {f.name} was quiet, but soon {f.he} was running and laughing too."]),
        r.choice([f"From that day on, {h.name} and {f.name} were best friends.",
                  f"When it was time to go home, {f.name} said, \"Thank you for being my friend.\" "
                  f"{h.name} felt warm inside.",
                  f"{h.name} learned that one kind word can make a new friend."]),
    ]


def _share(r, h, f, g, place, feats):
    obj = _thing(r)
    return [
        f"{h.name} and {f.name} were playing at {place}. They found {_an(obj)} {obj} by {r.choice(feats)}.",
        _say(r, h, r.choice(["It's mine! I saw it first!", "I want it!", "Give it to me!"]))
        + " " + _say(r, f, r.choice(["No, it's mine!", "But I want it too!", "I had it first!"])),
        "They pulled and pulled. "
        + r.choice(["Then they both fell down.", "Nobody was having fun.", f"{f.name} started to cry."])
        + f" {h.name} felt {r.choice(SAD)}.",
        f"{g.name} came over. "
        + _say(r, g, r.choice(["Why don't you take turns?", "What if you play with it together?",
                               "Sharing makes a game twice as fun."])),
        f"So {h.name} and {f.name} took turns with the {obj}. "
        + r.choice(["Then they made up a new game that needed two players.", "Soon they were laughing together.",
                    "It was much more fun than fighting."]),
        r.choice(["They learned that sharing is better than pulling.",
                  f"{h.name} said sorry, and {f.name} said sorry too.",
                  "In the end, the best part of the day was playing together."]),
    ]


def _fear(r, h, f, g, place, feats):
    helper = r.choice([f, g])
    fear, fix = r.choice([("the dark", "{h} turned on a little lamp and told a story."),
                          ("the big slide", "{h} went down first and waved from the bottom."),
                          ("thunder", "They counted slowly between the flash and the boom."),
                          ("the deep water", "{h} held {his} {hand} and they walked in slowly."),
                          ("the big dog next door", "{h} showed {him} how to hold out a {hand} gently."),
                          ("the tall ladder", "{h} stood close behind {him} on every step."),
                          ("the loud music", "{h} gave {him} a hat to cover {his} ears.")])
    fix = fix.format(h=helper.name, his=h.his, him=h.him, hand="hand" if h.human else "paw")
    return [
        f"{h.name} was scared of {fear}. Every time {h.he} thought about it, {h.his} tummy felt funny.",
        f"One day at {place}, {h.name} had to face {fear}. "
        + _say(r, h, r.choice(["I can't do it!", "I'm too scared.", "What if something bad happens?"])),
        f"{helper.name} knelt down next to {h.him}. "
        + _say(r, helper, r.choice(["It's okay to be scared. I am right here.",
                                    "Let's try together, one little step at a time.",
                                    "Being brave means trying even when you are scared."])),
        f"{fix} {h.name} took a deep breath.",
        r.choice([f"It was not so scary after all! {h.name} laughed.",
                  f"{h.name} did it! {h.He} felt {r.choice(HAPPY)}.",
                  f"{h.His} heart was beating fast, but {h.he} did it."])
        + " " + _say(r, h, r.choice(["Can we do it again?", "I was brave!", "That was not so bad."])),
        r.choice([f"{h.name} learned that being brave is not about never being scared.",
                  f"After that day, {h.name} was not scared of {fear} anymore.",
                  f"That night {h.name} slept with a big smile on {h.his} face."]),
    ]


def _help(r, h, f, g, place, feats):
    who, trouble, fix = r.choice([
        ("a baby bird", "had fallen out of its nest", "gently lifted it back into the nest"),
        ("an old turtle", "was stuck on its back", "carefully turned it over"),
        ("a little kitten", "was stuck up a tree", "fetched a ladder and called the kitten down softly"),
        ("an old man", "had dropped all his apples", "picked up every apple and put them back in the basket"),
        ("a tiny ant", "could not carry a big crumb", "broke the crumb into small pieces"),
        ("a lost duckling", "could not find its mother", "followed the quacking sound to the pond"),
        ("a sad snail", "could not cross the wet path", "made a little bridge out of a leaf"),
    ])
    return [
        f"{h.name} was playing at {place} when {h.he} heard a small sound near {r.choice(feats)}.",
        f"It was {who}. It {trouble}. "
        + _say(r, h, r.choice(["Don't worry, I will help you!", "Oh, you poor thing.", "How can I help?"])),
        f"{h.name} thought hard. Then {h.he} had an idea. {h.He} {fix}.",
        r.choice([f"It took a long time, but {h.name} did not give up.",
                  f"{f.name} came to help too, and it went much faster.",
                  f"It was hard work, and {h.name} was very careful."]),
        r.choice([f"When it was done, {_the(who)} looked at {h.name} as if to say thank you.",
                  f"The {who.split()[-1]} was safe again. {h.name} felt {r.choice(HAPPY)}.",
                  f"\"Thank you,\" said the {who.split()[-1]}. {h.name} smiled from ear to ear."]),
        r.choice(["Helping others made the whole day better.",
                  f"{h.name} learned that even small hands can do big things.",
                  f"That evening, {h.name} told {g.name} all about it."]),
    ]


def _build(r, h, f, g, place, feats):
    thing, trouble = r.choice([("a sandcastle", "a wave washed it away"),
                               ("a tower of blocks", "it fell down with a crash"),
                               ("a snowman", "its head rolled off"), ("a birdhouse", "the roof would not stay on"),
                               ("a cake", "it came out flat"), ("a paper boat", "it filled with water"),
                               ("a fort of pillows", "it fell flat")])
    return [
        f"{h.name} wanted to make {thing}. {h.He} worked all morning at {place}.",
        f"But then {trouble}. "
        + _say(r, h, r.choice(["Oh no! All my work!", "I will never get it right.", "This is too hard!"])),
        f"{h.name} felt {r.choice(SAD)}. {h.He} sat down by {r.choice(feats)}. {f.name} sat down next to {h.him}.",
        _say(r, f, r.choice(["Let's try again, together.", "Every maker has to start over sometimes.",
                             "I think we can make it even better this time."])),
        r.choice(["This time they worked slowly and carefully.",
                  f"This time {f.name} held it steady while {h.name} worked.",
                  "They tried a new way, step by step."]) + f" At last, {thing} stood finished in front of them.",
        r.choice([f"It was the best one {h.name} had ever made.", "\"We did it!\" they shouted together.",
                  f"{h.name} learned that trying again is how things get made."]),
    ]


def _race(r, h, f, g, place, feats):
    goal = _the(r.choice(feats))
    return [
        f"{h.name} and {f.name} were at {place}. " + _say(r, h, f"Let's race to {goal}!"),
        r.choice(["Ready, set, go!", "One, two, three, go!", "They counted to three and ran."])
        + f" {h.name} ran fast. {f.name} ran fast too.",
        f"Just before the end, {f.name} tripped and fell. "
        + _say(r, f, r.choice(["Ouch! My knee!", "Oh no!", "Ow, that hurts."])),
        f"{h.name} could have won. But {h.he} stopped and ran back. "
        + _say(r, h, r.choice(["Are you okay?", "Let me help you up.", "Here, hold my hand."])),
        f"They walked to {goal} together, side by side. "
        + r.choice(["Nobody won, and nobody lost.", "They crossed the finish at the same time.",
                    f"{f.name} smiled a big smile."]),
        r.choice(["A good friend is worth more than a race.",
                  f"{h.name} learned that helping a friend is the best way to win.",
                  f"{f.name} never forgot what {h.name} did that day."]),
    ]


def _honest(r, h, f, g, place, feats):
    obj = r.choice(["blue cup", "flower vase", "toy plane", "glass jar", "clock", "picture frame", "cookie plate"])
    return [
        f"{h.name} was playing ball near {r.choice(feats)}. The ball bounced and hit {g.name}'s {obj}. Crash!",
        f"The {obj} broke into pieces. {h.name} was scared. {h.He} hid the pieces behind {r.choice(feats)}.",
        f"Later {g.name} came in. " + _say(r, g, f"Has anyone seen my {obj}?"),
        f"{h.name} did not say anything. But {h.he} felt bad inside, like a heavy stone in {h.his} tummy.",
        f"At last {h.name} said, \"I'm sorry. I broke it. I was playing ball.\" "
        + _say(r, g, r.choice(["Thank you for telling me the truth.", "I am glad you told me. Things can be fixed.",
                               "Telling the truth is brave."])),
        r.choice([f"Together they glued the {obj} back together.", f"{g.name} gave {h.name} a big hug.",
                  "The heavy feeling went away."])
        + " " + r.choice(["Being honest made everything better.", f"{h.name} learned to always tell the truth.",
                          ""]).strip(),
    ]


def _explore(r, h, f, g, place, feats):
    found = r.choice(["a hidden pond full of little fish", "a field of purple flowers", "a cave with sparkly rocks",
                      "a tree with a door in its trunk", "a nest with three blue eggs", "a tiny waterfall",
                      "an old wooden swing"])
    return [
        f"{h.name} and {f.name} found a little path behind {r.choice(feats)} at {place}. "
        + _say(r, f, "Where does it go?"),
        _say(r, h, r.choice(["Let's find out!", "Let's be explorers!", "Let's follow it, but not too far."])),
        f"They walked and walked. They heard {PLACES[place][1]}. They saw "
        + r.choice(["a bright butterfly", "a busy squirrel", "a line of ants", "a rabbit hopping away",
                    "big white clouds"]) + ".",
        f"At the end of the path, they found {found}! "
        + _say(r, h, r.choice(["Wow!", "It's so beautiful!", "Look at that!"])),
        "They stayed for a while and looked at everything. When the sun got low, they walked back home.",
        f"{h.name} told {g.name} all about {_the(found.split(' with')[0])}. "
        + r.choice(["It was the best adventure ever.", "They promised to go back another day.",
                    f"That night {h.name} dreamed of new paths."]),
    ]


def _rain(r, h, f, g, place, feats):
    plan = r.choice([f"have a picnic at {place}", f"fly a kite at {place}", f"play {r.choice(GAMES)} at {place}",
                     f"go to {place}"])
    indoor = r.choice(["built a fort out of blankets", "baked cookies with " + g.name, "painted pictures of the sun",
                       "made a puppet show", "read a big book of animals", "played a board game"])
    return [
        f"{h.name} wanted to {plan}. But when {h.he} looked outside, it was raining.",
        _say(r, h, r.choice(["It's not fair!", "Now the whole day is ruined.", "Why does it have to rain today?"]))
        + f" {h.He} felt {r.choice(SAD)}.",
        f"{g.name} smiled. "
        + _say(r, g, r.choice(["Rainy days can be fun too.", "Let's find something fun to do inside.",
                               "I have an idea."])),
        f"So {h.name} and {g.name} {indoor}. {h.name} forgot all about the rain.",
        r.choice(["Later, the rain stopped and a big rainbow filled the sky.",
                  "When the sun came out, the puddles were perfect for jumping.",
                  "The rain kept falling, but nobody minded anymore."]),
        r.choice([f"{h.name} learned that you can make any day a good day.", f"\"Best day ever,\" {h.name} said.",
                  f"The next day, they went to {place} after all."]),
    ]


def _seed(r, h, f, g, place, feats):
    plant, fruit = r.choice([("sunflower", "a tall yellow sunflower"), ("bean", "a plant full of long green beans"),
                             ("pumpkin", "a big orange pumpkin"), ("tomato", "a plant full of red tomatoes"),
                             ("apple", "a little apple tree"), ("carrot", "a row of sweet orange carrots")])
    return [
        f"{g.name} gave {h.name} a tiny {plant} seed. "
        + _say(r, g, r.choice(["Plant it, and take good care of it.", "This little seed can grow into something big.",
                               "Seeds need water, sun and time."])),
        f"{h.name} dug a small hole near {r.choice(feats)} at {place}, put the seed in, and covered it with soil.",
        r.choice([f"Every morning {h.he} gave it water. But nothing happened.",
                  f"{h.He} watched the spot all day. Nothing grew.",
                  f"The next day, {h.name} ran out to look. There was only dirt."])
        + " " + _say(r, h, r.choice(["Why is it not growing?", "Maybe it is broken.", "I want it to grow now!"])),
        _say(r, g, r.choice(["Be patient. Good things take time.",
                             "The seed is busy under the ground. You just can't see it.",
                             "Keep caring for it, and wait."])),
        f"So {h.name} waited. {r.choice(['Days went by.', 'The rain came and went.', 'One week passed, then two.'])} "
        f"Then one morning, {h.he} saw a tiny green leaf! "
        + _say(r, h, r.choice(["It's growing!", "Look, look!", "Hello, little plant!"])),
        f"By the end of the summer, the tiny seed had become {fruit}. "
        + r.choice([f"{h.name} shared it with {f.name} and everyone on the street.",
                    f"{h.name} learned that waiting can be worth it.",
                    f"{h.name} was so proud of {h.his} {plant}."]),
    ]


def _lost_way(r, h, f, g, place, feats):
    mark = _the(r.choice(feats))
    return [
        f"{h.name} was chasing {r.choice(['a butterfly', 'a red balloon', 'a hopping frog', 'a leaf in the wind'])} "
        f"at {place}. {h.He} ran and ran.",
        f"When {h.he} stopped, nothing looked the same. {h.name} did not know where {h.he} was. "
        + _say(r, h, r.choice(["Where am I?", "I want to go home.", "Which way did I come?"])),
        f"{h.name} felt {r.choice(['scared', 'very small', 'worried'])}. {h.He} wanted to cry. "
        f"Then {h.he} remembered what {g.name} always said: "
        + r.choice(["\"If you are lost, stop and look for something you know.\"", "\"Stay calm and think.\"",
                    "\"Look for a helper.\""]),
        f"{h.name} took a deep breath and looked around. Far away, {h.he} saw {mark}! {h.He} knew that place.",
        f"{h.He} walked toward it, step by step. There was {g.name}, looking for {h.him}. "
        + _say(r, g, r.choice([f"{h.name}! There you are!", "I was so worried!", "I am so glad you are safe."])),
        r.choice([f"{h.name} gave {g.name} the biggest hug.", f"{h.name} promised to stay close next time.",
                  f"{h.name} learned to stop and think when things go wrong."]),
    ]


def _surprise(r, h, f, g, place, feats):
    gift = r.choice(["a painted rock", "a card with a big heart", "a paper crown", "a cake with candles",
                     "a necklace of shells", "a picture of the two of them"])
    return [
        f"It was {f.name}'s birthday. {h.name} wanted to make a surprise. "
        + _say(r, h, r.choice(["What can I give?", "It has to be special.", "I know!"])),
        f"{h.name} worked in secret with {g.name}. They made {gift}. "
        + r.choice(["It took all afternoon.", "It was a little messy, but it was lovely.",
                    "They giggled the whole time."]),
        f"Then {h.name} hid behind {r.choice(feats)} at {place} and waited. {h.His} heart was beating fast.",
        f"When {f.name} came by, {h.name} jumped out. " + _say(r, h, "Surprise! Happy birthday!"),
        f"{f.name} looked at {_the(gift)}. "
        + _say(r, f, r.choice(["You made this for me?", "This is the best present ever!", "Thank you! I love it!"])),
        r.choice([f"{f.name} smiled all day. {h.name} smiled too.", "The best gifts are the ones made with love.",
                  f"{h.name} learned that giving can feel even better than getting."]),
    ]


def _mess(r, h, f, g, place, feats):
    things = r.sample(["blocks", "crayons", "socks", "books", "cars", "puzzle pieces", "dolls", "balls"], 3)
    return [
        f"{h.name}'s room was a big mess. There were {things[0]} on the floor, {things[1]} on the bed and "
        f"{things[2]} everywhere.",
        f"{g.name} came in. "
        + _say(r, g, r.choice(["Time to clean up, please.",
                               "Before we go to " + place + ", this room needs to be tidy.",
                               "Can you put your toys away?"])),
        _say(r, h, r.choice(["But it will take forever!", "I don't want to.", "It's too much!"]))
        + f" {h.name} sat on the floor with a frown.",
        f"Then {h.he} had an idea. {h.He} made it a game. "
        + r.choice([f"{h.He} raced the clock to put the {things[0]} away.",
                    f"{h.He} sang a song and put one thing away for every word.",
                    f"{h.He} pretended the toy box was a hungry monster that ate {things[1]}."]),
        "Soon the room was clean. "
        + _say(r, g, r.choice(["Wow, that was fast!", "Look at that! Well done.", "Now we can go and play."])),
        r.choice([f"They went to {place} and had a lovely time.", "Cleaning up is not so bad when you make it fun.",
                  f"{h.name} found {h.his} favorite {things[2][:-1] if things[2].endswith('s') else things[2]} "
                  "under the bed!"]),
    ]


PLOTS = [_lost, _friend, _share, _fear, _help, _build, _race, _honest, _explore, _rain, _seed, _lost_way, _surprise,
         _mess]


def make_story(r):
    """One story from the random generator r (a random.Random)."""
    taken = set()
    hero, friend, grown_up = _person(r, taken), _person(r, taken), _person(r, taken, adult=True)
    place = r.choice(list(PLACES))
    paras = r.choice(PLOTS)(r, hero, friend, grown_up, place, PLACES[place][0])
    paras = [_intro(r, hero, place, r.choice(OPENINGS))] + paras
    if r.random() < 0.3:  # some stories end with a closing line, like a bedtime book
        paras.append(r.choice(["The end.", "And that was a very good day.", "Goodnight, " + hero.name + "."]))
    return "\n".join(p.strip() for p in paras if p.strip())


def generate_stories(num_stories, seed=0):
    """num_stories stories, identical for the same seed (one random.Random(seed) drives everything)."""
    r = random.Random(seed)
    return [make_story(r) for _ in range(num_stories)]


def write_corpus(path, num_bytes, seed=0):
    """Write stories, each followed by SEPARATOR, until the file holds at least num_bytes UTF-8 bytes
    (the overshoot is less than one story). Returns (num_stories, num_bytes_written)."""
    if num_bytes <= 0:
        raise ValueError(f"stories.write_corpus: num_bytes must be positive, got {num_bytes}")
    r = random.Random(seed)
    n = written = 0
    tmp = f"{path}.tmp"   # renamed at the end: a run cut short never leaves a file that looks complete
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            while written < num_bytes:
                doc = make_story(r) + SEPARATOR
                fh.write(doc)
                written += len(doc.encode("utf-8"))
                n += 1
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return n, written


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=os.path.expanduser, default="data/stories.txt", help="output text file")
    p.add_argument("--num_bytes", type=int, default=4_000_000, help="size of the corpus in bytes (at least)")
    p.add_argument("--seed", type=int, default=0, help="random seed: the same seed gives the same corpus")
    p.add_argument("--print", type=int, default=0, metavar="N", help="print N stories instead of writing a file")
    p.add_argument("--force", action="store_true", help="write over an --out file that exists")
    p.error = lambda message: p.exit(2, f"{p.prog}: {message} (see --help)\n")   # as bpe.one_line_errors does
    args = p.parse_args()
    if args.seed < 0:   # random.Random(-5) is random.Random(5): two seeds, one corpus
        raise SystemExit(f"stories.py: --seed {args.seed}: expected a seed >= 0")
    if args.print < 0:
        raise SystemExit(f"stories.py: --print {args.print}: expected a number of stories (0: write --out instead)")
    if args.num_bytes <= 0:
        raise SystemExit(f"stories.py: --num_bytes {args.num_bytes}: expected a positive number of bytes")
    if args.print:
        print(SEPARATOR.join(generate_stories(args.print, args.seed)))
        return
    if os.path.isdir(args.out):
        raise SystemExit(f"stories.py: --out {args.out}: is a directory, expected a file name")
    if os.path.exists(args.out) and not args.force:
        raise SystemExit(f"stories.py: --out {args.out}: the file exists (pass --force to write over it)")
    t0 = time.time()
    try:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        n, nbytes = write_corpus(args.out, args.num_bytes, args.seed)
    except OSError as e:
        raise SystemExit(f"stories.py: --out {args.out}: cannot write {e.filename}: {e.strerror}")
    except KeyboardInterrupt:
        raise SystemExit(f"\nstories.py: interrupted; nothing written to {args.out}")
    print(f"wrote {n:,} stories, {nbytes:,} bytes to {args.out} in {time.time() - t0:.2f}s")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:   # the reader went away (`| head`): stop quietly, as cat does (bpe.run_main's copy)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # Python's last flush then fails silently
        sys.exit(1)
