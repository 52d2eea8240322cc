"""A synthetic English -> German-like parallel corpus for the translation minis.

Word-by-word translation of it is poor on purpose: German articles and adjective endings agree with
the noun's gender, number and case (accusative objects, dative after mit/bei/in, strong endings
without an article); main clauses are verb-second (a fronted adverb moves the verb before the
subject), clauses after dass/weil are verb-final; separable verbs split in main clauses (ruft ... an)
and join in verb-final ones (anruft); noun-noun phrases become one compound word (house door ->
Haustür) whose gender is the head's; several English synonyms share one German word; an ambiguous
English verb (runs) translates by its context (läuft alone, leitet with a business as object);
prepositions contract with articles (in dem -> im). Sentences are written as raw text, one per line,
capitalised and punctuated, as in the WMT files.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MASC, FEM, NEUT = "m", "f", "n"


@dataclass(frozen=True)
class Noun:
    en: str
    en_plural: str
    de: str
    de_plural: str
    gender: str
    kind: str  # person | animal | thing | place | business | food
    stem: str = ""  # as a compound's first part (Kinder-, Schul-); "" when it is not used so


NOUNS = (
    Noun("man", "men", "Mann", "Männer", MASC, "person"),
    Noun("woman", "women", "Frau", "Frauen", FEM, "person"),
    Noun("child", "children", "Kind", "Kinder", NEUT, "person", "Kinder"),
    Noun("teacher", "teachers", "Lehrer", "Lehrer", MASC, "person"),
    Noun("doctor", "doctors", "Ärztin", "Ärztinnen", FEM, "person"),
    Noun("friend", "friends", "Freund", "Freunde", MASC, "person"),
    Noun("girl", "girls", "Mädchen", "Mädchen", NEUT, "person"),
    Noun("neighbour", "neighbours", "Nachbar", "Nachbarn", MASC, "person"),
    Noun("dog", "dogs", "Hund", "Hunde", MASC, "animal", "Hunde"),
    Noun("cat", "cats", "Katze", "Katzen", FEM, "animal", "Katzen"),
    Noun("horse", "horses", "Pferd", "Pferde", NEUT, "animal", "Pferde"),
    Noun("bird", "birds", "Vogel", "Vögel", MASC, "animal", "Vogel"),
    Noun("mouse", "mice", "Maus", "Mäuse", FEM, "animal"),
    Noun("book", "books", "Buch", "Bücher", NEUT, "thing", "Buch"),
    Noun("table", "tables", "Tisch", "Tische", MASC, "thing", "Tisch"),
    Noun("door", "doors", "Tür", "Türen", FEM, "thing"),
    Noun("car", "cars", "Auto", "Autos", NEUT, "thing", "Auto"),
    Noun("letter", "letters", "Brief", "Briefe", MASC, "thing", "Brief"),
    Noun("key", "keys", "Schlüssel", "Schlüssel", MASC, "thing"),
    Noun("bag", "bags", "Tasche", "Taschen", FEM, "thing"),
    Noun("window", "windows", "Fenster", "Fenster", NEUT, "thing", "Fenster"),
    Noun("chair", "chairs", "Stuhl", "Stühle", MASC, "thing"),
    Noun("lamp", "lamps", "Lampe", "Lampen", FEM, "thing"),
    Noun("garden", "gardens", "Garten", "Gärten", MASC, "place", "Garten"),
    Noun("house", "houses", "Haus", "Häuser", NEUT, "place", "Haus"),
    Noun("school", "schools", "Schule", "Schulen", FEM, "place", "Schul"),
    Noun("city", "cities", "Stadt", "Städte", FEM, "place", "Stadt"),
    Noun("kitchen", "kitchens", "Küche", "Küchen", FEM, "place", "Küchen"),
    Noun("park", "parks", "Park", "Parks", MASC, "place"),
    Noun("shop", "shops", "Laden", "Läden", MASC, "business"),
    Noun("company", "companies", "Firma", "Firmen", FEM, "business"),
    Noun("hotel", "hotels", "Hotel", "Hotels", NEUT, "business", "Hotel"),
    Noun("restaurant", "restaurants", "Restaurant", "Restaurants", NEUT, "business"),
    Noun("apple", "apples", "Apfel", "Äpfel", MASC, "food", "Apfel"),
    Noun("bread", "breads", "Brot", "Brote", NEUT, "food", "Brot"),
    Noun("cake", "cakes", "Kuchen", "Kuchen", MASC, "food"),
    Noun("soup", "soups", "Suppe", "Suppen", FEM, "food"),
)
BY_EN = {n.en: n for n in NOUNS}
# Compound heads: the English two-noun phrase's second noun (its gender is the compound's).
COMPOUND_HEADS = ("door", "garden", "book", "table", "key", "bag", "window", "lamp", "chair", "letter", "shop")

# English synonyms share one German stem: (English words, German stem).
ADJECTIVES = (
    (("big", "large"), "groß"), (("small", "little"), "klein"), (("old",), "alt"), (("new",), "neu"),
    (("red",), "rot"), (("green",), "grün"), (("quick", "fast"), "schnell"), (("quiet", "calm"), "ruhig"),
    (("beautiful", "pretty"), "schön"), (("cheap",), "billig"), (("warm",), "warm"), (("young",), "jung"),
)


@dataclass(frozen=True)
class Verb:
    en: str  # third person singular
    en_plural: str
    de: str  # third person singular, the finite stem in a main clause
    de_plural: str
    particle: str = ""  # separable prefix: sent to the clause's end, or joined in a verb-final clause
    objects: tuple[str, ...] = ("person", "animal", "thing", "place", "business", "food")


TRANSITIVE = (
    Verb("sees", "see", "sieht", "sehen"),
    Verb("finds", "find", "findet", "finden"),
    Verb("likes", "like", "mag", "mögen"),
    Verb("needs", "need", "braucht", "brauchen"),
    Verb("buys", "buy", "kauft", "kaufen", objects=("thing", "food", "animal")),
    Verb("eats", "eat", "isst", "essen", objects=("food",)),
    Verb("calls", "call", "ruft", "rufen", "an", objects=("person",)),
    Verb("rings", "ring", "ruft", "rufen", "an", objects=("person",)),  # a synonym of calls
    Verb("picks up", "pick up", "holt", "holen", "ab", objects=("person", "thing", "animal")),
    Verb("opens", "open", "macht", "machen", "auf", objects=("thing", "business")),
    Verb("closes", "close", "macht", "machen", "zu", objects=("thing", "business")),
    Verb("takes along", "take along", "nimmt", "nehmen", "mit", objects=("person", "thing", "animal", "food")),
    Verb("describes", "describe", "beschreibt", "beschreiben"),
    Verb("visits", "visit", "besucht", "besuchen", objects=("person", "place", "business")),
    Verb("runs", "run", "leitet", "leiten", objects=("business",)),  # ambiguous: see INTRANSITIVE
)
INTRANSITIVE = (
    Verb("sleeps", "sleep", "schläft", "schlafen"), Verb("runs", "run", "läuft", "laufen"),
    Verb("waits", "wait", "wartet", "warten"), Verb("laughs", "laugh", "lacht", "lachen"),
    Verb("arrives", "arrive", "kommt", "kommen", "an"), Verb("goes out", "go out", "geht", "gehen", "aus"),
)
# Prepositions: (English, German, case, (kinds it takes)).
PREPOSITIONS = (
    ("with", "mit", "dat", ("person", "animal", "thing")),
    ("near", "bei", "dat", ("person", "place", "business")),
    ("in", "in", "dat", ("place", "business")),
    ("for", "für", "acc", ("person", "animal")),
    ("without", "ohne", "acc", ("person", "animal", "thing")),
)
CONTRACTIONS = {("in", "dem"): "im", ("bei", "dem"): "beim", ("zu", "dem"): "zum"}
FRONTED = (("today", "heute"), ("tomorrow", "morgen"), ("now", "jetzt"), ("then", "dann"))
MIDDLE = (("often", "oft"), ("always", "immer"), ("rarely", "selten"))
MATRIX = ((("I think", "I believe"), "ich glaube"), (("we know",), "wir wissen"), (("she says",), "sie sagt"),
          (("he hopes",), "er hofft"))
SUBJECT_PRONOUNS = (("he", "er", False), ("she", "sie", False), ("they", "sie", True))

DEFINITE = {("nom", MASC): "der", ("nom", FEM): "die", ("nom", NEUT): "das", ("acc", MASC): "den",
            ("acc", FEM): "die", ("acc", NEUT): "das", ("dat", MASC): "dem", ("dat", FEM): "der",
            ("dat", NEUT): "dem", ("nom", "pl"): "die", ("acc", "pl"): "die", ("dat", "pl"): "den"}
INDEFINITE = {("nom", MASC): "ein", ("nom", FEM): "eine", ("nom", NEUT): "ein", ("acc", MASC): "einen",
              ("acc", FEM): "eine", ("acc", NEUT): "ein", ("dat", MASC): "einem", ("dat", FEM): "einer",
              ("dat", NEUT): "einem"}


def _adjective_ending(article: str, case: str, gender: str) -> str:
    """German adjective declension: weak after the definite article, mixed after the indefinite one,
    strong with no article (plural only here)."""
    if gender == "pl":
        return {"the": "en", "none": "en" if case == "dat" else "e"}[article]
    if article == "the":
        return "e" if case == "nom" or (case == "acc" and gender != MASC) else "en"
    if case == "dat" or (case == "acc" and gender == MASC):
        return "en"
    return {MASC: "er", FEM: "e", NEUT: "es"}[gender]


@dataclass
class Phrase:
    en: list[str]
    de: list[str]
    plural: bool


class Grammar:
    """Draws parallel sentences; `rng` makes a corpus reproducible from a seed."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.heads = [BY_EN[h] for h in COMPOUND_HEADS]
        self.modifiers = [n for n in NOUNS if n.stem]

    def noun_phrase(self, case: str, kinds: tuple[str, ...] | None = None, allow_compound: bool = True
                    ) -> Phrase:
        r = self.rng
        plural = r.random() < 0.25
        if allow_compound and (kinds is None or "thing" in kinds) and r.random() < 0.12:
            head, mod = r.choice(self.heads), r.choice(self.modifiers)
            while mod is head:
                mod = r.choice(self.modifiers)
            en_noun = [mod.en, head.en_plural if plural else head.en]
            de_noun = mod.stem + (head.de_plural if plural else head.de).lower()
            gender = head.gender
        else:
            pool = [n for n in NOUNS if kinds is None or n.kind in kinds]
            noun = r.choice(pool)
            en_noun = [noun.en_plural if plural else noun.en]
            de_noun = noun.de_plural if plural else noun.de
            gender = noun.gender
            if plural and case == "dat" and not de_noun.endswith(("n", "s")):
                de_noun += "n"  # dative plural: den Kindern
        g = "pl" if plural else gender
        article = "the" if plural and r.random() < 0.6 or not plural and r.random() < 0.55 else \
            ("none" if plural else "a")
        en, de = [], []
        if article == "the":
            en.append("the")
            de.append(DEFINITE[(case, g)])
        elif article == "a":
            en.append("a")
            de.append(INDEFINITE[(case, g)])
        if r.random() < 0.4:
            words, stem = r.choice(ADJECTIVES)
            en.append(r.choice(words))
            de.append(stem + _adjective_ending(article, case, g))
        en += en_noun
        if en[0] == "a" and en[1][0] in "aeiou":
            en[0] = "an"
        return Phrase(en, de + [de_noun], plural)

    def prepositional(self) -> Phrase:
        en_prep, de_prep, case, kinds = self.rng.choice(PREPOSITIONS)
        np_ = self.noun_phrase(case, kinds, allow_compound=False)
        de = list(np_.de)
        if de and (de_prep, de[0]) in CONTRACTIONS:
            de = [CONTRACTIONS[(de_prep, de[0])], *de[1:]]
        else:
            de = [de_prep, *de]
        return Phrase([en_prep, *np_.en], de, False)

    def clause(self) -> tuple[list[str], list[str], str, list[str], str]:
        """(English words, German subject, German finite verb, German middle field, particle)."""
        r = self.rng
        if r.random() < 0.2:
            en_pron, de_pron, plural = r.choice(SUBJECT_PRONOUNS)
            subject = Phrase([en_pron], [de_pron], plural)
        else:
            subject = self.noun_phrase("nom", ("person", "animal"))
        transitive = r.random() < 0.75
        verb = r.choice(TRANSITIVE if transitive else INTRANSITIVE)
        en_verb = verb.en_plural if subject.plural else verb.en
        de_verb = verb.de_plural if subject.plural else verb.de
        en, middle = list(subject.en), []
        adverb = r.choice(MIDDLE) if r.random() < 0.15 else None
        if adverb:
            en.append(adverb[0])
        en += en_verb.split()
        if transitive:
            obj = self.noun_phrase("acc", verb.objects)
            en += obj.en
            middle += obj.de
        if adverb:
            middle.append(adverb[1])
        if r.random() < 0.35:
            pp = self.prepositional()
            en += pp.en
            middle += pp.de
        return en, subject.de, de_verb, middle, verb.particle

    def sentence(self) -> tuple[str, str]:
        r = self.rng
        en, subj, verb, middle, particle = self.clause()
        roll = r.random()
        if roll < 0.25:  # fronted adverb: verb second, subject after it
            adv_en, adv_de = r.choice(FRONTED)
            en = [adv_en, *en]
            de = [adv_de, verb, *subj, *middle] + ([particle] if particle else [])
        elif roll < 0.5:  # a matrix clause, then a verb-final clause
            words, matrix = r.choice(MATRIX)
            en = [*r.choice(words).split(), "that", *en]
            de = [*matrix.split(), ",", "dass", *subj, *middle, particle + verb]
        elif roll < 0.65:  # a main clause, then a reason in a verb-final clause
            en2, subj2, verb2, middle2, particle2 = self.clause()
            de = [*subj, verb, *middle] + ([particle] if particle else [])
            de += [",", "weil", *subj2, *middle2, particle2 + verb2]
            en = [*en, "because", *en2]
        else:
            de = [*subj, verb, *middle] + ([particle] if particle else [])
        return _written(en), _written(de)


def _written(words: list[str]) -> str:
    """Raw text as in the WMT files: the first letter capitalised, commas attached, a full stop."""
    text = " ".join(words).replace(" ,", ",") + "."
    return text[0].upper() + text[1:]


def corpus(count: int, seed: int) -> list[tuple[str, str]]:
    """`count` (English, German) pairs."""
    grammar = Grammar(random.Random(seed))
    return [grammar.sentence() for _ in range(count)]


def _words(text: str) -> list[str]:
    return text.lower().rstrip(".").replace(",", " ,").split()


def dice_table(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Each English word's German word of highest Dice coefficient (sentence co-occurrence): the
    dictionary a word-by-word translator would learn from the training pairs."""
    from collections import Counter

    en_count: Counter[str] = Counter()
    de_count: Counter[str] = Counter()
    both: Counter[tuple[str, str]] = Counter()
    for en, de in pairs:
        e, d = set(_words(en)), set(_words(de))
        en_count.update(e)
        de_count.update(d)
        both.update((a, b) for a in e for b in d)
    best: dict[str, tuple[float, str]] = {}
    for (a, b), c in both.items():
        score = 2 * c / (en_count[a] + de_count[b])
        if score > best.get(a, (0.0, ""))[0]:
            best[a] = (score, b)
    return {a: b for a, (_, b) in best.items()}


def dictionary_translation(english: str, table: dict[str, str]) -> str:
    """The trivial baseline: each English word replaced by its most frequent German word, in order."""
    return _written([table.get(w, w) for w in _words(english)])
