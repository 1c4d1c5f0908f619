"""Parallel corpora as raw text: text files, the loaders of user files, Multi30k and WMT14, and
`load_corpus`, which calls a corpus's loader (`config.CORPORA`); a user's mistake is one line."""

from __future__ import annotations

import gzip
import itertools
import os
import random
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

from lightning_modules.config import CORPORA, DataConfig
from foundation.errors import UserError
from foundation.io import check_readable_file
from lightning_modules.stopwatch import Stages

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
WMT14_SPLITS = {"train": "train", "valid": "newstest2013", "test": "newstest2014"}
# WMT14 EN-DE training data (Europarl v7, Common Crawl, News Commentary v9): (URL, member PREFIX.LANG)
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


MAX_LINE_BYTES = 2 ** 20  # a sentence pair's side is never a megabyte: a longer line is damage or a bomb


def _raw_lines(path: Path) -> Iterator[bytes]:
    """The lines of a plain or gzipped file (told by its magic bytes), each with its b"\\n", streamed,
    none longer than MAX_LINE_BYTES (a gzip bomb of one endless line is one line of error)."""
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
    """UTF-8 lines without line ends, one at a time, a leading BOM dropped; split on "\\n" only
    (Unicode line separators would break the alignment)."""
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
    """The stripped (src, tgt) lines of two aligned files, both-blank pairs skipped, checked."""
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
            raise UserError(f"{empty}: line {line_no} is empty but line {line_no} of {other} is not")
        yield s, t
    if line_no == 0:
        raise UserError(f"{src_path}: file is empty")


def read_parallel(src_path: str | Path, tgt_path: str | Path, keep: int | None = None) -> ParallelText:
    """Two aligned files (plain or .gz); with `keep`, only the pairs `subset` keeps, read in two passes
    (count, then keep) so that memory holds the subset only (WMT14: ~1.3 GB of text a side)."""
    src_path, tgt_path = Path(src_path).expanduser(), Path(tgt_path).expanduser()
    if keep is None:
        return ParallelText.from_pairs(_checked_pairs(src_path, tgt_path))
    total = sum(1 for _ in _checked_pairs(src_path, tgt_path))
    chosen = bytearray(total)
    for i in subset_indices(total, keep):
        chosen[i] = 1
    return ParallelText.from_pairs(pair for pair, wanted in zip(_checked_pairs(src_path, tgt_path), chosen)
                                   if wanted)


def load_files(cfg: DataConfig, stages: Stages) -> Corpus:
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


def load_multi30k(cfg: DataConfig, stages: Stages) -> Corpus:
    with stages("read"):  # downloads included (29K short pairs)
        return _fetch_splits(cfg, "multi30k", MULTI30K_SPLITS, MULTI30K_URL)


def wmt14_archives(base_url: str | None) -> tuple[tuple[str, str], ...]:
    """The training archives as (URL, member prefix): statmt.org's, or the same names under `base_url`."""
    if not base_url:
        return WMT14_TRAIN_ARCHIVES
    base = base_url if base_url.endswith("/") else base_url + "/"
    return tuple((base + url.rsplit("/", 1)[-1], prefix) for url, prefix in WMT14_TRAIN_ARCHIVES)


def extract_train(cache: Path, archives: Sequence[tuple[Path, str]],
                  langs: Sequence[str] = ("en", "de")) -> None:
    """`cache/train.LANG`: the archives' `PREFIX.LANG` members, streamed and concatenated, written whole."""
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
                    raise UserError(f"{archive}: not a valid archive ({err}); delete it and retry") from None
                if wanted:
                    raise UserError(f"{archive} lacks {', '.join(sorted(wanted))}")
        finally:
            for handle in outs.values():
                handle.close()
        for lang in langs:
            os.replace(Path(tmp) / f"train.{lang}", cache / f"train.{lang}")


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


def load_wmt14(cfg: DataConfig, stages: Stages) -> Corpus:
    """WMT14 from `data_dir`, or downloaded once into `cache_dir/wmt14` (from `base_url` if given)."""
    if cfg.data_dir:
        with stages("read"):
            return _fetch_splits(cfg, "wmt14", WMT14_SPLITS, None)
    cache = Path(cfg.cache_dir).expanduser() / "wmt14"
    langs = (cfg.src_lang, cfg.tgt_lang)
    if set(langs) != {"en", "de"}:
        raise UserError(f"WMT14 is English-German here; got {cfg.src_lang}-{cfg.tgt_lang}")
    paths: dict[str, list[Path]] = {"train": [cache / f"train.{lang}" for lang in langs]}
    with stages("download"):
        ready = all(path.is_file() for path in paths["train"])
        archives = [] if ready else [(download(url, cache / url.rsplit("/", 1)[-1]), prefix)  # kept
                                     for url, prefix in wmt14_archives(cfg.base_url)]
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


SUBSET_SEED = 20170612  # fixed, so every row and seed of a table trains on the same subset


def subset_indices(total: int, n: int | None) -> list[int]:
    """The sorted indices of the `n` of `total` pairs a subset keeps, always the same (all: `n` None)."""
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
    """The corpus `cfg.corpus`, its training side cut to `cfg.train_pairs`; `stages` times each step."""
    try:
        module, function = CORPORA[cfg.corpus].loader.rsplit(".", 1)
    except KeyError:
        raise UserError(f"unknown corpus {cfg.corpus!r}; choose one of {', '.join(CORPORA)}") from None
    loader = getattr(import_module(f"lightning_modules.data.{module}"), function)
    stages = stages if stages is not None else Stages()
    corpus = loader(cfg, stages)
    with stages("subset"):
        corpus.train = subset(corpus.train, cfg.train_pairs)
    return corpus
