"""The Ding dictionary (`data.corpus=ding`, the default): its example sentences cleaned of the
dictionary's annotations and split into train, dev and test; its word and phrase pairs optional."""

from __future__ import annotations

import json
import random
import re
import sys
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from lightning_modules.config import DataConfig
from lightning_modules.data import cache
from lightning_modules.data.corpora import Corpus, ParallelText
from foundation.errors import UserError
from lightning_modules.stopwatch import Stages

_ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>")  # {m} {pl} [coll.] <variant>
_ABBREV_TAG = re.compile(r"(?<!\S)/[^/\s;|]{1,20}/(?=[\s;|,.]|$)")  # /ETD/: an abbreviation
_PAREN = re.compile(r"\([^()]*\)")  # glosses "(zoological family)" and optional words "(so far)"
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.!?;:])")
_STRAY = re.compile(r"[{}\[\]<>()]")
_SENTENCE_END = re.compile(r"[.!?][\"”’'»)]*$")
_SENTENCE_START = tuple("\"„“‚‘'«»¿¡")
# Template words make an entry a pattern ("to give sth. to sb."), not a sentence.
_PLACEHOLDER = re.compile(
    r"(?<!\w)(?:sth|sb|jdm|jdn|jds|jd|etw|jmd|jmdn|jmdm)\.|(?<!\w)sb[’']s(?!\w)")


def _clean_side(side: str) -> str:
    """One side of a line with {...}, [...], <...>, (possibly nested) (...) and /ABBR/ removed."""
    if "{" in side or "[" in side or "<" in side:
        side = _ANNOTATION.sub(" ", side)
    while "(" in side:
        stripped = _PAREN.sub(" ", side)
        if stripped == side:
            break
        side = stripped
    if "/" in side:
        side = _ABBREV_TAG.sub(" ", side)
    return _SPACE_BEFORE_PUNCT.sub(r"\1", side)


def _normalise(alternative: str) -> str:
    """Collapsed whitespace, no leading/trailing separators; "" if brackets are unbalanced."""
    text = " ".join(alternative.split()).strip(" ;,")
    return "" if _STRAY.search(text) else text


def _alternatives(entry: str) -> Iterator[str]:
    """The normalised, non-empty `;`-separated alternatives of an already cleaned entry, lazily."""
    return (alt for alt in map(_normalise, entry.split(";")) if alt)


def split_alternatives(entry: str) -> list[str]:
    """The cleaned, non-empty `;`-separated alternatives of one aligned entry."""
    return list(_alternatives(_clean_side(entry)))


def _first_alternative(alternatives: str) -> str:
    """The first non-empty cleaned alternative of an already cleaned entry (the rest are not read)."""
    return next(_alternatives(alternatives), "")


_EN_WORDS = frozenset("the a is are were be been of to and you i it that this with for he she "
                      "we they my your his her our their have has had not do does did don't "
                      "can't it's i'm what where why how which who would should could".split())
_DE_WORDS = frozenset("der die das den dem des und ist sind waren nicht ich du er sie es wir "
                      "ihr ein eine einen einem einer zu mit sich auf für von habe haben wird "
                      "werden auch noch nur schon wie wo warum wer kann können muss mir mich dir "
                      "dich uns ist's gibt".split())


def _language_score(text: str) -> tuple[int, int]:
    """(English, German) function-word counts: a cheap check for swapped sides."""
    words = [w.strip(".,!?;:\"“”„‚‘’'").lower().replace("’", "'") for w in text.split()]
    return sum(w in _EN_WORDS for w in words), sum(w in _DE_WORDS for w in words)


def is_sentence(text: str) -> bool:
    """A full sentence: capital/digit/quote start, final . ! ?, >= 2 words, no template words."""
    if not text or not (text[0].isupper() or text[0].isdigit() or text.startswith(_SENTENCE_START)):
        return False
    if not _SENTENCE_END.search(text) or "…" in text or "..." in text:
        return False
    return len(text.split()) >= 2 and not _PLACEHOLDER.search(text)


def _wrong_language(en: str, de: str) -> bool:
    """The English side looks German or the German side looks English (by >= 2 words)."""
    en_en, en_de = _language_score(en)
    de_en, de_de = _language_score(de)
    return (en_de > max(en_en, 1)) or (de_en > max(de_de, 1))


def _sentence_pair(en: str, de: str) -> bool:
    """Both sides are sentences, one has >= 3 words, and neither is in the wrong language."""
    return (is_sentence(en) and is_sentence(de) and max(len(en.split()), len(de.split())) >= 3
            and not _wrong_language(en, de))


def parse_ding_line(line: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Sentence and word/phrase pairs (en, de) of a `German :: English` line, wrong-language ones dropped."""
    line = line.strip()
    if not line or line.startswith("#") or " :: " not in line:
        return [], []
    de_side, en_side = line.split(" :: ", 1)
    de_entries = _clean_side(de_side).split(" | ")
    en_entries = _clean_side(en_side).split(" | ")
    if len(de_entries) != len(en_entries):
        return [], []
    sentences: list[tuple[str, str]] = []
    phrases: list[tuple[str, str]] = []
    for de_entry, en_entry in zip(de_entries, en_entries):
        de_first, en_first = _first_alternative(de_entry), _first_alternative(en_entry)
        if not de_first or not en_first:
            continue
        if not (is_sentence(en_first) and is_sentence(de_first)
                and _sentence_pair(en_first, de_first)):
            if not (is_sentence(en_first) and _wrong_language(en_first, de_first)):
                phrases.append((en_first, de_first))
            continue
        de_alts, en_alts = list(_alternatives(de_entry)), list(_alternatives(en_entry))
        pairs = list(zip(en_alts, de_alts)) if len(en_alts) == len(de_alts) else [
            (en_first, de_first)]
        sentences.extend((en, de) for en, de in pairs if _sentence_pair(en, de))
    return sentences, phrases


def extract_ding(path: str | Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(sentence pairs, word/phrase pairs) of the Ding dictionary as (en, de), deduplicated."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"Ding dictionary {path} not found; install it with "
                        f"`apt-get install trans-de-en` or set data.ding_path")
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = unicodedata.normalize("NFC", handle.read())
    sentences: dict[str, tuple[str, str]] = {}  # by English side, the first kept (dicts keep file order)
    phrases: dict[tuple[str, str], None] = {}
    for line in text.split("\n"):
        line_sentences, line_phrases = parse_ding_line(line)
        for pair in line_sentences:
            sentences.setdefault(pair[0], pair)
        phrases.update(dict.fromkeys(line_phrases))
    return list(sentences.values()), list(phrases)


def extract_ding_cached(path: str | Path, cache_dir: str | Path, phrases: bool = True
                        ) -> tuple[list[tuple[str, str]], list[tuple[str, str]] | None]:
    """`extract_ding(path)`, kept in the cache; the word/phrase pairs only when `phrases` is set."""
    path = Path(path).expanduser()
    if not path.is_file():
        return extract_ding(path)  # its one-line UserError
    name = cache.key(path.read_bytes(), cache.source(sys.modules[__name__]))
    entries = {kind: cache.entry(cache_dir, "ding", f"{kind}-{name}.json") for kind in ("sentences", "phrases")}
    wanted = ("sentences", "phrases") if phrases else ("sentences",)
    try:
        found = [[(en, de) for en, de in json.loads(entries[kind].read_text(encoding="utf-8"))]
                 for kind in wanted]
        if found[0] and all(isinstance(text, str) for pairs in found for pair in pairs for text in pair):
            return found[0], found[1] if phrases else None
    except (OSError, ValueError, TypeError):
        pass  # absent, or not what this function writes: extract again
    sentences, all_phrases = extract_ding(path)
    for kind, pairs in (("phrases", all_phrases), ("sentences", sentences)):  # sentences only beside their phrases
        if not cache.store(entries[kind], json.dumps(pairs, ensure_ascii=False).encode("utf-8")):
            break
    return sentences, all_phrases if phrases else None


def split_ding(sentences: Sequence[tuple[str, str]], valid_size: int,
               test_size: int) -> tuple[list, list, list]:
    """Deterministic train/valid/test split (sorted, then shuffled by random.Random(0))."""
    if valid_size + test_size >= len(sentences):
        raise UserError(f"the Ding dictionary has only {len(sentences)} sentence pairs, too few "
                        f"for data.valid_size={valid_size} + data.test_size={test_size}")
    pairs = sorted(sentences)
    random.Random(0).shuffle(pairs)
    valid, test = pairs[:valid_size], pairs[valid_size:valid_size + test_size]
    return pairs[valid_size + test_size:], valid, test


def load_ding(cfg: DataConfig, stages: Stages) -> Corpus:
    langs = (cfg.src_lang, cfg.tgt_lang)
    if langs not in (("en", "de"), ("de", "en")):
        raise UserError(f"the Ding dictionary is English-German; got data.src_lang="
                        f"{cfg.src_lang!r}, data.tgt_lang={cfg.tgt_lang!r}")
    with stages("read"):
        sentences, phrases = extract_ding_cached(cfg.ding_path, cfg.cache_dir, cfg.ding_dictionary)
    train, valid, test = split_ding(sentences, cfg.valid_size, cfg.test_size)
    flip = langs == ("de", "en")

    def orient(pairs: Iterable[tuple[str, str]]) -> ParallelText:
        return ParallelText.from_pairs((de, en) if flip else (en, de) for en, de in pairs)

    extra = None
    if cfg.ding_dictionary:
        held_out = {en for en, _ in valid} | {en for en, _ in test}
        extra = orient(pair for pair in phrases if pair[0] not in held_out)
    return Corpus("ding", orient(train), orient(valid), orient(test), extra)

