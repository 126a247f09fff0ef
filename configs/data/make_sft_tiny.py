#!/usr/bin/env python3
"""Writes configs/data/sft-tiny.jsonl: the chat data of configs/sft-tiny.yaml.

Small templated conversations a tiny model can learn in a minute: additions, capitals and
multiplications, in both layouts the `chat` dataset reads ({"messages": [...]} and
{"prompt", "completion"}), some with a system turn and some with two rounds. Deterministic (a
seeded generator): running it again writes the same file.

    python3 configs/data/make_sft_tiny.py
"""
import json
import pathlib
import random

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
    "Egypt": "Cairo", "Peru": "Lima", "Kenya": "Nairobi", "Canada": "Ottawa", "Norway": "Oslo",
    "Chile": "Santiago", "Greece": "Athens", "Poland": "Warsaw", "Cuba": "Havana", "Iran": "Tehran",
    "Mali": "Bamako", "Nepal": "Kathmandu", "Ireland": "Dublin", "Austria": "Vienna", "Portugal": "Lisbon",
}
SYSTEM = "You answer in one short sentence."


def question(rng):
    kind = rng.choice(["add", "add", "mul", "capital"])
    if kind == "add":
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}."
    if kind == "mul":
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        return f"What is {a} times {b}?", f"{a} times {b} is {a * b}."
    country = rng.choice(sorted(CAPITALS))
    return f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}."


def conversation(rng):
    q, a = question(rng)
    layout = rng.random()
    if layout < 0.3:
        return {"prompt": q, "completion": a}
    messages = []
    if layout < 0.5:
        messages.append({"role": "system", "content": SYSTEM})
    messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    if layout >= 0.5 and rng.random() < 0.35:  # a second round (without a system turn: it stays short)
        q2, a2 = question(rng)
        messages += [{"role": "user", "content": q2}, {"role": "assistant", "content": a2}]
    return {"messages": messages}


def main():
    rng = random.Random(13)
    out = pathlib.Path(__file__).with_name("sft-tiny.jsonl")
    with out.open("w") as f:
        for _ in range(600):
            f.write(json.dumps(conversation(rng)) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
