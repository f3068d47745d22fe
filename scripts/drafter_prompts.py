"""Varied chat prompts for self-distillation and for the speculative benchmarks.

Prompts are built from instruction templates x topics x system prompts (and an optional
earlier turn), so the text the target model writes for them covers explanations, lists,
code, stories, dialogue, arithmetic and short answers. Topics are split once: the
`train` split never sees an `eval` topic, so acceptance measured on `eval` prompts is
held out by subject, not only by wording. Everything is a pure function of the seed.

    from drafter_prompts import chat_prompts
    prompts = chat_prompts("eval", 64, seed=1)   # list of OpenAI-style message lists
"""

from __future__ import annotations

import random

TOPICS = (
    "photosynthesis", "the French Revolution", "black holes", "compound interest",
    "the water cycle", "machine learning", "the Roman Empire", "volcanoes",
    "the immune system", "climate change", "the stock market", "honeybees",
    "the printing press", "plate tectonics", "vaccines", "the internet",
    "the human heart", "electric cars", "the Moon landing", "recycling",
    "sleep", "coffee", "the Great Wall of China", "rainbows", "earthquakes",
    "the solar system", "DNA", "chess", "the Olympic Games", "bread baking",
    "tides", "the piano", "penguins", "the Renaissance", "inflation",
    "solar panels", "friendship", "time management", "public speaking",
    "gardening", "the ocean", "dinosaurs", "the rainforest", "democracy",
    "the theory of evolution", "antibiotics", "the speed of light", "gravity",
    "bicycles", "the Industrial Revolution", "meditation", "the desert",
    "jazz music", "the Eiffel Tower", "wind turbines", "the brain",
    "ancient Egypt", "snowflakes", "the camera", "exercise", "nutrition",
    "trains", "the telephone", "cats", "dogs", "mountains", "rivers",
    "batteries", "the metric system", "libraries", "museums", "the weather",
)

TEMPLATES = (
    "What is {t}?",
    "Explain {t} in simple terms.",
    "Explain {t} to a ten-year-old.",
    "Give me three interesting facts about {t}.",
    "Write a short paragraph about {t}.",
    "Write a short poem about {t}.",
    "Write a haiku about {t}.",
    "Tell me a short story that involves {t}.",
    "List five key ideas related to {t}.",
    "What are the pros and cons of {t}?",
    "Why is {t} important?",
    "How does {t} work?",
    "Summarize the history of {t} in a few sentences.",
    "Write a tweet about {t}.",
    "Write an email to a friend about {t}.",
    "Give me a quiz question about {t} with the answer.",
    "What are common misconceptions about {t}?",
    "Compare {t} with something from everyday life.",
    "Describe {t} in one sentence.",
    "Write a dialogue between a teacher and a student about {t}.",
    "How would you teach {t} in a classroom?",
    "Give a step-by-step explanation of {t}.",
    "What questions do scientists still ask about {t}?",
    "Write a product description inspired by {t}.",
    "Write a limerick about {t}.",
    "What is the future of {t}?",
    "Can you write a short blog post introduction about {t}?",
    "What would happen if {t} did not exist?",
)

# Prompts that need no topic: arithmetic, code, rewriting, short answers.
STANDALONE = (
    "What is {a} + {b}?",
    "What is {a} times {b}? Show your work.",
    "Is {a} a prime number? Explain.",
    "Convert {a} degrees Celsius to Fahrenheit.",
    "Write a Python function that returns the sum of a list of numbers.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that computes the factorial of n.",
    "Write a JavaScript function that reverses a string.",
    "Write a SQL query that selects all users older than {a}.",
    "Explain what a for loop is in Python with an example.",
    "Fix the bug in this code: def add(a, b): return a - b",
    "Translate 'good morning, how are you?' into French.",
    "Rewrite this sentence to be more formal: 'hey, can u send me the file asap?'",
    "Give me a list of {n} healthy breakfast ideas.",
    "Suggest {n} names for a pet goldfish.",
    "What is the capital of {country}?",
    "Tell me a joke about {animal}s.",
    "Write a short motivational message for someone starting a new job.",
    "Plan a one-day trip to {city}.",
    "What should I pack for a weekend camping trip?",
)

COUNTRIES = ("France", "Japan", "Brazil", "Canada", "Egypt", "Italy", "Kenya", "Norway",
             "India", "Mexico", "Spain", "Australia")
CITIES = ("Paris", "Tokyo", "Rome", "New York", "London", "Barcelona", "Cairo", "Sydney",
          "Berlin", "Lisbon")
ANIMALS = ("cat", "dog", "penguin", "elephant", "owl", "frog", "horse", "shark")

SYSTEMS = (
    None, None, None,  # most conversations use the template's default system prompt
    "You are a helpful assistant.",
    "You are a concise assistant. Keep answers short.",
    "You are a friendly teacher who explains things clearly.",
    "You are a creative writer.",
    "You are an expert programmer.",
    "Answer in a cheerful tone.",
)

FOLLOW_UPS = (
    "Can you make it shorter?",
    "Can you give an example?",
    "Thanks! Can you explain that in more detail?",
    "Now summarize that in one sentence.",
    "Can you turn that into a list?",
)

# Every fifth topic (in this fixed order) is held out for evaluation.
EVAL_TOPICS = TOPICS[::5]
TRAIN_TOPICS = tuple(t for t in TOPICS if t not in EVAL_TOPICS)


def _fill(rng: random.Random, template: str, topic: str) -> str:
    return template.format(t=topic, a=rng.randint(2, 997), b=rng.randint(2, 997),
                           n=rng.randint(3, 7), country=rng.choice(COUNTRIES),
                           city=rng.choice(CITIES), animal=rng.choice(ANIMALS))


def chat_prompts(split: str, count: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """`count` message lists for `split` ("train" or "eval"), deterministic in `seed`.

    About one prompt in eight is standalone (arithmetic, code, rewriting); about one in
    ten carries an earlier assistant turn (the assistant text is a fixed placeholder, so
    no model output is needed to build prompts).

    Raises:
        ValueError: an unknown split.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    topics = TRAIN_TOPICS if split == "train" else EVAL_TOPICS
    rng = random.Random(f"{split}:{seed}")
    out: list[list[dict[str, str]]] = []
    for _ in range(count):
        topic = rng.choice(topics)
        if rng.random() < 0.125:
            text = _fill(rng, rng.choice(STANDALONE), topic)
        else:
            text = _fill(rng, rng.choice(TEMPLATES), topic)
        messages: list[dict[str, str]] = []
        system = rng.choice(SYSTEMS)
        if system is not None:
            messages.append({"role": "system", "content": system})
        if rng.random() < 0.1:
            messages.append({"role": "user", "content": f"Tell me about {topic}."})
            messages.append({"role": "assistant",
                             "content": f"Sure. {topic[0].upper() + topic[1:]} is a broad "
                                        "subject; here is a short overview."})
            text = rng.choice(FOLLOW_UPS)
        messages.append({"role": "user", "content": text})
        out.append(messages)
    return out
