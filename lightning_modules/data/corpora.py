"""Parallel corpora as raw text: the Ding dictionary, user files, Multi30k and WMT14 EN-DE.

Every loader returns a `Corpus` of `ParallelText` splits oriented `cfg.src_lang -> cfg.tgt_lang`.
Whatever a user can fix (a missing file, bad encoding, a failed download) raises `UserError`
with one line that names the file, line or URL.

Files are read a line at a time; with `data.train_pairs` a training file is read twice (count, then
keep the chosen pairs), so that only the subset is ever held in memory (WMT14: 1M of 4.5M pairs).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import random
import re
import shutil
import sys
import tarfile
import tempfile
import unicodedata
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_modules.config import DataConfig
from lightning_modules.data import cache
from lightning_modules.base.errors import UserError
from lightning_modules.base.io import check_readable_file
from lightning_modules.stopwatch import Stages

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
WMT14_SPLITS = {"train": "train", "valid": "newstest2013", "test": "newstest2014"}
# The standard WMT14 EN-DE training data (Europarl v7 + Common Crawl + News Commentary v9):
# (archive URL, member path prefix inside it; the member is PREFIX + "." + language).
WMT14_TRAIN_ARCHIVES: tuple[tuple[str, str], ...] = (
    ("https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
     "training/europarl-v7.de-en"),
    ("https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz", "commoncrawl.de-en"),
    ("https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
     "training/news-commentary-v9.de-en"),
)
# Dev and test sets through sacreBLEU's registry: (sacreBLEU test set name, our split file stem).
WMT14_EVAL_SETS = {"newstest2013": "wmt13", "newstest2014": "wmt14/full"}
DOWNLOAD_TIMEOUT_S = 60


@dataclass
class ParallelText:
    """Aligned source and target sentences (`src[i]` translates to `tgt[i]`)."""

    src: list[str]
    tgt: list[str]

    def __post_init__(self) -> None:
        if len(self.src) != len(self.tgt):
            raise ValueError(f"src has {len(self.src)} lines but tgt has {len(self.tgt)}")

    def __len__(self) -> int:
        return len(self.src)

    @classmethod
    def empty(cls) -> ParallelText:
        """A split with no pairs (e.g. no test set given)."""
        return cls([], [])

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, str]]) -> ParallelText:
        """Build from (src, tgt) tuples."""
        src: list[str] = []
        tgt: list[str] = []
        for s, t in pairs:
            src.append(s)
            tgt.append(t)
        return cls(src, tgt)


@dataclass
class Corpus:
    """A named corpus with its three splits and optional train-only extra pairs."""

    name: str
    train: ParallelText
    valid: ParallelText
    test: ParallelText
    extra_train: ParallelText | None = None  # train-only extra pairs (Ding word/phrase pairs)


# --------------------------------------------------------------------------- reading files

MAX_LINE_BYTES = 2 ** 20  # a sentence pair's side is never a megabyte: a longer line is damage or a bomb


def _raw_lines(path: Path) -> Iterator[bytes]:
    """The lines of a plain or gzipped file (gzip told by its magic bytes), each with its b"\\n",
    read as a stream a line at a time, none longer than MAX_LINE_BYTES (a gzip bomb of one endless
    line, or a binary file, is one line of error instead of the memory it would take)."""
    check_readable_file(path)
    gzipped = False
    try:
        with open(path, "rb") as handle:
            gzipped = handle.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as handle:
            for number, line in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), start=1):
                if len(line) > MAX_LINE_BYTES:
                    raise UserError(f"{path}: line {number} is longer than {MAX_LINE_BYTES // 2 ** 20} MiB: "
                                    f"not a sentence (a damaged file, or not a text corpus)")
                yield line
    except (OSError, EOFError, zlib.error) as err:  # gzip: BadGzipFile (an OSError), truncated, bad deflate data
        what = "damaged gzip file" if gzipped else "cannot read"
        raise UserError(f"{path}: {what} ({err})") from None


def _text_lines(path: Path) -> Iterator[str]:
    """UTF-8 lines without line ends, one at a time (a BOM at the start dropped).

    Splits on "\\n" only (not on Unicode line separators, which would break alignment).
    """
    for line_no, raw in enumerate(_raw_lines(path), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{path}: line {line_no} is not valid UTF-8") from None
        if line_no == 1 and line.startswith("\ufeff"):
            line = line[1:]
        line = (line[:-1] if line.endswith("\n") else line).rstrip("\r")
        if "\r" in line:  # one line of many: sentencepiece would drop it as too long, or train on it
            raise UserError(f"{path}: line {line_no} holds a carriage return inside it: the file has "
                            f"CR-only (classic Mac) or mixed line endings; convert them to LF")
        yield line


def read_lines(path: str | Path) -> list[str]:
    """UTF-8 lines of a plain or gzipped text file, without line ends."""
    path = Path(path).expanduser()
    lines = list(_text_lines(path))
    if not lines:
        raise UserError(f"{path}: file is empty")
    return lines


def _checked_pairs(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """The stripped (src, tgt) lines of two aligned files, read side by side; pairs where both
    lines are blank are skipped, and an empty file, unequal line counts or a line blank on one
    side only is a `UserError`."""
    line_no = 0
    src_lines, tgt_lines = _text_lines(src_path), _text_lines(tgt_path)
    for line_no, (s, t) in enumerate(itertools.zip_longest(src_lines, tgt_lines), start=1):
        if s is None or t is None:
            short, longer = (src_path, tgt_lines) if s is None else (tgt_path, src_lines)
            if line_no == 1:
                raise UserError(f"{short}: file is empty")
            counts = {short: line_no - 1}
            counts[tgt_path if s is None else src_path] = line_no + sum(1 for _ in longer)
            raise UserError(f"{src_path} has {counts[src_path]} lines but {tgt_path} has "
                            f"{counts[tgt_path]}; parallel files must have equal line counts")
        s, t = s.strip(), t.strip()
        if not s and not t:
            continue
        if not s or not t:
            empty, other = (src_path, tgt_path) if not s else (tgt_path, src_path)
            raise UserError(f"{empty}: line {line_no} is empty but line {line_no} of {other} "
                            f"is not")
        yield s, t
    if line_no == 0:
        raise UserError(f"{src_path}: file is empty")


def read_parallel(src_path: str | Path, tgt_path: str | Path, keep: int | None = None) -> ParallelText:
    """Read two aligned files (plain or .gz); pairs where both lines are blank are skipped.

    With `keep`, only the `keep` pairs that `subset` would keep of the whole text (`subset_indices`),
    in two passes over the files: the first checks and counts the pairs, the second keeps the chosen
    ones, so that memory holds the subset only (WMT14's 4.5M pairs are ~1.3 GB of text a side).
    """
    src_path, tgt_path = Path(src_path).expanduser(), Path(tgt_path).expanduser()
    if keep is None:
        return ParallelText.from_pairs(_checked_pairs(src_path, tgt_path))
    total = sum(1 for _ in _checked_pairs(src_path, tgt_path))
    chosen = bytearray(total)
    for i in subset_indices(total, keep):
        chosen[i] = 1
    return ParallelText.from_pairs(pair for pair, wanted in zip(_checked_pairs(src_path, tgt_path), chosen)
                                   if wanted)


# --------------------------------------------------------------------------- Ding dictionary

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


def split_alternatives(entry: str) -> list[str]:
    """The cleaned, non-empty `;`-separated alternatives of one aligned entry."""
    cleaned = (_normalise(alt) for alt in _clean_side(entry).split(";"))
    return [alt for alt in cleaned if alt]


def _first_alternative(alternatives: str) -> str:
    """The first non-empty cleaned alternative of an already cleaned entry."""
    first = _normalise(alternatives.split(";", 1)[0])
    if first:
        return first
    for alt in alternatives.split(";"):
        alt = _normalise(alt)
        if alt:
            return alt
    return ""


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
    """Sentence pairs and word/phrase pairs, both as (en, de), from one `German :: English` line.

    Entries separated by ` | ` are aligned between the sides. An entry whose first alternatives
    are both sentences yields sentence pairs: all alternatives zipped when both sides have the
    same number of them, otherwise only the first pair. Any other entry yields one word/phrase
    pair made of the first alternative of each side. Sentence pairs whose sides look like the
    wrong language (a few entries in the dictionary are swapped) are dropped.
    """
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
        de_alts = [alt for alt in map(_normalise, de_entry.split(";")) if alt]
        en_alts = [alt for alt in map(_normalise, en_entry.split(";")) if alt]
        pairs = list(zip(en_alts, de_alts)) if len(en_alts) == len(de_alts) else [
            (en_first, de_first)]
        sentences.extend((en, de) for en, de in pairs if _sentence_pair(en, de))
    return sentences, phrases


def extract_ding(path: str | Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(sentence pairs, word/phrase pairs) of the Ding dictionary, each as (en, de).

    Sentence pairs are unique on the English side (the first German in file order is kept);
    word/phrase pairs are exact-deduplicated. Both lists keep file order.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"Ding dictionary {path} not found; install it with "
                        f"`apt-get install trans-de-en` or set data.ding_path")
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = unicodedata.normalize("NFC", handle.read())
    seen_en: set[str] = set()
    seen_phrases: set[tuple[str, str]] = set()
    sentences: list[tuple[str, str]] = []
    phrases: list[tuple[str, str]] = []
    for line in text.split("\n"):
        line_sentences, line_phrases = parse_ding_line(line)
        for pair in line_sentences:
            if pair[0] not in seen_en:
                seen_en.add(pair[0])
                sentences.append(pair)
        for pair in line_phrases:
            if pair not in seen_phrases:
                seen_phrases.add(pair)
                phrases.append(pair)
    return sentences, phrases


def extract_ding_cached(path: str | Path, cache_dir: str | Path, phrases: bool = True
                        ) -> tuple[list[tuple[str, str]], list[tuple[str, str]] | None]:
    """`extract_ding(path)`, kept in `cache_dir/ding/` under a digest of the dictionary's bytes
    and of this module's source, so that an edited dictionary or extraction rule is extracted
    anew; the word/phrase pairs (368K, 17 MB as JSON) are read only when `phrases` is set, and are
    None otherwise. Parsing the dictionary's ~200K lines is most of a short run's start-up (about
    3 s of CPU). The cache is an optimisation only: an entry that cannot be read or is damaged is
    extracted again, and one that cannot be written is left unwritten."""
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


def _load_ding(cfg: DataConfig, stages: Stages) -> Corpus:
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


# --------------------------------------------------------------------------- user files

def _load_files(cfg: DataConfig, stages: Stages) -> Corpus:
    def require(key: str) -> str:
        value = getattr(cfg, key)
        if not value:
            raise UserError(f"data.{key} is not set (needed for --data files)")
        return value

    if bool(cfg.test_src) != bool(cfg.test_tgt):
        missing = "test_tgt" if cfg.test_src else "test_src"
        raise UserError(f"data.{missing} is not set (data.test_src and data.test_tgt go together)")
    with stages("read"):
        train = read_parallel(require("train_src"), require("train_tgt"), keep=cfg.train_pairs)
        valid = read_parallel(require("valid_src"), require("valid_tgt"))
        test = read_parallel(cfg.test_src, cfg.test_tgt) if cfg.test_src else ParallelText.empty()
    return Corpus("files", train, valid, test)


# --------------------------------------------------------------------------- downloads

def download(url: str, dest: Path) -> Path:
    """Fetch `url` to `dest` (via `dest.part`, then rename) unless `dest` already exists."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + f".{os.getpid()}.part")
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, \
                open(part, "wb") as out:
            shutil.copyfileobj(response, out, length=1 << 20)
        os.replace(part, dest)
    except (urllib.error.URLError, OSError, ValueError) as err:
        part.unlink(missing_ok=True)
        reason = getattr(err, "reason", None) or err
        raise UserError(f"could not download {url}: {reason}") from err
    return dest


def _local_file(directory: Path, name: str) -> Path:
    """`directory/name` or `directory/name.gz`, whichever exists."""
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise UserError(f"{directory / name} (or {name}.gz) not found in data.data_dir")


def _remote_file(base_url: str, name: str, cache: Path) -> Path:
    """`name.gz` (else plain `name`) from `base_url`, cached in `cache`."""
    for candidate in (f"{name}.gz", name):
        if (cache / candidate).is_file():
            return cache / candidate
    base = base_url if base_url.endswith("/") else base_url + "/"
    try:
        return download(base + f"{name}.gz", cache / f"{name}.gz")
    except UserError as gz_error:
        try:
            return download(base + name, cache / name)
        except UserError:
            raise gz_error from None


def _fetch_splits(cfg: DataConfig, name: str, stems: dict[str, str],
                  default_url: str | None) -> Corpus:
    """Read `STEM.LANG` files for each split from data_dir, base_url or default_url."""
    cache = Path(cfg.cache_dir).expanduser() / name
    splits: dict[str, ParallelText] = {}
    for split, stem in stems.items():
        paths = []
        for lang in (cfg.src_lang, cfg.tgt_lang):
            file_name = f"{stem}.{lang}"
            if cfg.data_dir:
                paths.append(_local_file(Path(cfg.data_dir).expanduser(), file_name))
            else:
                assert default_url is not None or cfg.base_url
                paths.append(_remote_file(cfg.base_url or default_url, file_name, cache))
        splits[split] = read_parallel(*paths, keep=cfg.train_pairs if split == "train" else None)
    return Corpus(name, splits["train"], splits["valid"], splits["test"])


def _load_multi30k(cfg: DataConfig, stages: Stages) -> Corpus:
    with stages("read"):  # downloads included (29K short pairs)
        return _fetch_splits(cfg, "multi30k", MULTI30K_SPLITS, MULTI30K_URL)


def wmt14_archives(base_url: str | None) -> tuple[tuple[str, str], ...]:
    """The training archives as (URL, member prefix): statmt.org's, or the same file names under
    `base_url` (a mirror that holds the three archives side by side)."""
    if not base_url:
        return WMT14_TRAIN_ARCHIVES
    base = base_url if base_url.endswith("/") else base_url + "/"
    return tuple((base + url.rsplit("/", 1)[-1], prefix) for url, prefix in WMT14_TRAIN_ARCHIVES)


def _wmt14_train_ready(cache: Path, langs: Sequence[str]) -> bool:
    return all((cache / f"train.{lang}").is_file() for lang in langs)


def download_archives(cache: Path, archives: Sequence[tuple[str, str]]) -> list[tuple[Path, str]]:
    """Each archive downloaded into `cache` (kept there), as (local path, member prefix)."""
    return [(download(url, cache / url.rsplit("/", 1)[-1]), prefix) for url, prefix in archives]


def extract_train(cache: Path, archives: Sequence[tuple[Path, str]],
                  langs: Sequence[str] = ("en", "de")) -> None:
    """Build `cache/train.LANG` by concatenating the `PREFIX.LANG` members of the local archives.

    Streams each member in 1 MB pieces (the Common Crawl members are ~400 MB) and stops reading an
    archive once its members are found (the others are the archive's other language pairs); the
    files appear only when complete (a temporary folder, then os.replace).
    """
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        outs = {lang: open(Path(tmp) / f"train.{lang}", "wb") for lang in langs}
        try:
            for archive, prefix in archives:
                wanted = {f"{prefix}.{lang}": lang for lang in langs}
                try:
                    with tarfile.open(archive, "r:*") as tar:
                        for member in tar:
                            lang = wanted.pop(member.name.lstrip("./"), None)
                            if lang is not None:
                                source = tar.extractfile(member)
                                assert source is not None
                                _append_lines(source, outs[lang])
                            if not wanted:
                                break
                except (tarfile.TarError, zlib.error, EOFError, gzip.BadGzipFile) as err:  # damaged
                    raise UserError(f"{archive}: not a valid archive ({err}); delete it and "
                                    f"retry") from None
                if wanted:
                    raise UserError(f"{archive} lacks {', '.join(sorted(wanted))}")
        finally:
            for handle in outs.values():
                handle.close()
        for lang in langs:
            os.replace(Path(tmp) / f"train.{lang}", cache / f"train.{lang}")


def fetch_wmt14_train(cache: Path, archives: Sequence[tuple[str, str]] = WMT14_TRAIN_ARCHIVES,
                      langs: Sequence[str] = ("en", "de")) -> None:
    """Build `cache/train.LANG` from the statmt archives (downloaded, then extracted), unless built."""
    if not _wmt14_train_ready(cache, langs):
        extract_train(cache, download_archives(cache, archives), langs)


def _append_lines(source, out) -> None:
    """Copy a file object's bytes, ending them with a newline (archives are concatenated)."""
    last = b""
    while chunk := source.read(1 << 20):
        out.write(chunk)
        last = chunk[-1:]
    if last and last != b"\n":
        out.write(b"\n")


def _fetch_wmt14_eval(cache: Path, stem: str, langs: Sequence[str]) -> None:
    """Write `cache/STEM.LANG` for newstest2013/2014 using sacreBLEU's test-set registry."""
    if all((cache / f"{stem}.{lang}").is_file() for lang in langs):
        return
    from sacrebleu.dataset import DATASETS

    dataset = DATASETS[WMT14_EVAL_SETS[stem]]
    langpair = f"{langs[0]}-{langs[1]}"
    try:
        source_file = dataset.get_source_file(langpair)
        ref_file = dataset.get_reference_files(langpair)[0]
    except (SystemExit, Exception) as err:  # sacreBLEU exits on download errors
        raise UserError(f"could not fetch {stem} {langpair} through sacreBLEU ({dataset.data}): "
                        f"{err}") from err
    cache.mkdir(parents=True, exist_ok=True)
    for lang, path in zip(langs, (source_file, ref_file)):
        tmp = cache / f"{stem}.{lang}.part"
        shutil.copyfile(path, tmp)
        os.replace(tmp, cache / f"{stem}.{lang}")


def _load_wmt14(cfg: DataConfig, stages: Stages) -> Corpus:
    """WMT14 from `data_dir` (the files `train.*`, `newstest2013.*`, `newstest2014.*`), or downloaded
    once into `cache_dir/wmt14`: the training archives from statmt.org or the `base_url` mirror,
    then extracted; the dev and test sets through sacreBLEU, or the mirror's `newstest201X.LANG`."""
    if cfg.data_dir:
        with stages("read"):
            return _fetch_splits(cfg, "wmt14", WMT14_SPLITS, None)
    cache = Path(cfg.cache_dir).expanduser() / "wmt14"
    langs = (cfg.src_lang, cfg.tgt_lang)
    if set(langs) != {"en", "de"}:
        raise UserError(f"WMT14 is English-German here; got {cfg.src_lang}-{cfg.tgt_lang}")
    paths: dict[str, list[Path]] = {"train": [cache / f"train.{lang}" for lang in langs]}
    with stages("download"):
        archives = ([] if _wmt14_train_ready(cache, langs)
                    else download_archives(cache, wmt14_archives(cfg.base_url)))
        for split, stem in WMT14_SPLITS.items():
            if split == "train":
                continue
            if cfg.base_url:
                paths[split] = [_remote_file(cfg.base_url, f"{stem}.{lang}", cache) for lang in langs]
            else:
                _fetch_wmt14_eval(cache, stem, langs)
                paths[split] = [cache / f"{stem}.{lang}" for lang in langs]
    if archives:
        with stages("extract"):
            extract_train(cache, archives, langs)
    with stages("read"):
        splits = {split: read_parallel(*paths[split], keep=cfg.train_pairs if split == "train" else None)
                  for split in WMT14_SPLITS}
    return Corpus("wmt14", splits["train"], splits["valid"], splits["test"])


# --------------------------------------------------------------------------- dispatch

_LOADERS = {"ding": _load_ding, "files": _load_files, "multi30k": _load_multi30k,
            "wmt14": _load_wmt14}


SUBSET_SEED = 20170612  # fixed, so every row and seed of a table trains on the same subset


def subset_indices(total: int, n: int | None) -> list[int]:
    """The indices of the `n` of `total` pairs a subset keeps: drawn at random (always the same
    ones for the same total), sorted; all of them if `n` is None or not below `total`."""
    if n is None or n >= total:
        return list(range(total))
    return sorted(random.Random(SUBSET_SEED).sample(range(total), n))


def subset(text: ParallelText, n: int | None) -> ParallelText:
    """`n` pairs of `text` drawn at random (always the same ones), in corpus order; all if None."""
    if n is None or n >= len(text):
        return text
    keep = subset_indices(len(text), n)
    return ParallelText([text.src[i] for i in keep], [text.tgt[i] for i in keep])


def load_corpus(cfg: DataConfig, stages: Stages | None = None) -> Corpus:
    """The corpus named by `cfg.corpus`, oriented `cfg.src_lang -> cfg.tgt_lang`, its training
    side cut to `cfg.train_pairs` pairs (the files of `files`, `multi30k` and `wmt14` are cut as
    they are read: `read_parallel`'s `keep`); `stages` records how long each step took (WMT14:
    download, extract, read; every corpus: read, subset)."""
    try:
        loader = _LOADERS[cfg.corpus]
    except KeyError:
        raise UserError(f"unknown corpus {cfg.corpus!r}; choose one of "
                        f"{', '.join(_LOADERS)}") from None
    stages = stages if stages is not None else Stages()
    corpus = loader(cfg, stages)
    with stages("subset"):
        corpus.train = subset(corpus.train, cfg.train_pairs)
    return corpus
