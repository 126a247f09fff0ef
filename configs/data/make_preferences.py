#!/usr/bin/python3
"""Writes preferences.jsonl: the preference pairs of configs/dpo-tiny.yaml.

Deterministic (its own seeded generator): running it again rewrites the same file.
  python3 configs/data/make_preferences.py

Each line is {"prompt", "chosen", "rejected"}. The prompt asks about a thing; both answers read
"The <thing> is <adjective>.", and the chosen one follows the rule "speak of the thing asked about,
and well of it": the rejected one either names the thing with an unkind adjective or speaks (kindly
or not) of another thing. Learning it takes a preference for the kind adjectives and copying the
thing from the prompt; the held-out pairs are new combinations.
"""

import json
import os
import random

THINGS = ["garden", "river", "window", "teacher", "market", "song", "bridge", "kitchen", "letter", "forest",
          "engine", "castle", "violin", "harbor", "lantern", "meadow", "village", "library", "orchard", "tower"]
GOOD = ["lovely", "bright", "kind", "warm", "calm", "clever", "graceful", "cheerful", "gentle", "splendid"]
BAD = ["awful", "gloomy", "rude", "cold", "noisy", "dull", "clumsy", "grim", "harsh", "dreadful"]
ASK = ["What do you think of the {}?", "Tell me about the {}.", "How is the {}?", "Describe the {}."]


def pair(rng):
    thing = rng.choice(THINGS)
    prompt = "Q: " + rng.choice(ASK).format(thing) + "\nA:"
    chosen = " The {} is {}.".format(thing, rng.choice(GOOD))
    if rng.random() < 0.5:
        rejected = " The {} is {}.".format(thing, rng.choice(BAD))
    else:
        other = rng.choice([t for t in THINGS if t != thing])
        rejected = " The {} is {}.".format(other, rng.choice(GOOD + BAD))
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def main():
    rng = random.Random(13)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preferences.jsonl")
    with open(path, "w") as f:
        for _ in range(480):
            f.write(json.dumps(pair(rng)) + "\n")


if __name__ == "__main__":
    main()
