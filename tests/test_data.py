"""Tests of the data pipeline with real components: the Ding file, sentencepiece, a local server."""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import os
import random
import re
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from dataclasses import replace
from importlib import import_module
from pathlib import Path

import pytest
import torch

from lightning_modules.config import CORPORA, DataConfig
from lightning_modules.data.batching import TokenBucketBatchSampler, batch_shapes, collate, padding_share
from lightning_modules.data.corpora import WMT14_TRAIN_ARCHIVES, load_corpus, read_parallel, subset
from lightning_modules.data.datamodule import TranslationDataModule
from lightning_modules.data.ding import (extract_ding, extract_ding_cached, is_sentence, parse_ding_line,
                                         split_alternatives)
from lightning_modules.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, train_or_load
from foundation.errors import UserError

DING = Path("/usr/share/trans/de-en")
# The embedded default corpus is part of the set-up (make setup): its absence is a failure.
needs_ding = pytest.mark.usefixtures("ding_installed")
WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money story "
         "fact month lot right study book eye job word business issue side kind head house "
         "service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office "
         "door health person art war history party result change morning reason research girl "
         "guy moment air teacher force education").split()


def synthetic_pairs(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Parallel-looking text: the target is the reversed, upper-cased source."""
    rng = random.Random(seed)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 25))) for _ in range(n)]
    return src, [" ".join(reversed(s.split())).upper() for s in src]


def write_lines(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = "".join(f"{line}\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


# ----------------------------------------------------------------------------- Ding

@pytest.fixture(scope="module")
def ding() -> tuple[list, list]:
    if not DING.is_file():
        pytest.fail("the Ding dictionary is missing: run make setup (apt-get install trans-de-en)")
    return extract_ding(DING)


@pytest.fixture(scope="module")
def ding_corpus():
    if not DING.is_file():
        pytest.fail("the Ding dictionary is missing: run make setup (apt-get install trans-de-en)")
    return load_corpus(DataConfig(ding_dictionary=True))


def test_ding_sentences_are_clean_unique_sentences(ding):
    sentences, phrases = ding
    print(f"\nDing: {len(sentences)} sentence pairs, {len(phrases)} word/phrase pairs")
    assert 15_000 <= len(sentences) <= 25_000
    assert 300_000 <= len(phrases) <= 450_000
    for en, de in sentences:
        assert is_sentence(en) and is_sentence(de), (en, de)
        for text in (en, de):
            assert not re.search(r"[{}\[\]<>]", text), text
            assert text == " ".join(text.split())
    assert len(set(sentences)) == len(sentences)
    assert len({en for en, _ in sentences}) == len(sentences)
    assert all(en and de and not re.search(r"[{}\[\]<>]", en + de) for en, de in phrases)
    assert len(set(phrases)) == len(phrases)


def test_ding_splits_disjoint_and_deterministic(ding, ding_corpus):
    corpus = ding_corpus
    assert len(corpus.valid) == 1000 and len(corpus.test) == 1000
    assert len(corpus.train) + 2000 == len(ding[0])
    train, valid, test = set(corpus.train.src), set(corpus.valid.src), set(corpus.test.src)
    assert not train & valid and not train & test and not valid & test
    assert corpus.extra_train is not None and len(corpus.extra_train) > 300_000
    assert not set(corpus.extra_train.src) & (valid | test)
    # English is the source side by default
    assert sum(" the " in s for s in corpus.valid.src) > sum(" the " in t for t in corpus.valid.tgt)
    # an independent load (parse + split) gives the same split, here flipped to de -> en
    flipped = load_corpus(DataConfig(src_lang="de", tgt_lang="en", ding_dictionary=False))
    assert flipped.extra_train is None
    assert flipped.valid.src == corpus.valid.tgt and flipped.valid.tgt == corpus.valid.src
    assert flipped.test.tgt == corpus.test.src and flipped.train.tgt == corpus.train.src


def test_a_texts_digest_tells_apart_lists_that_join_to_the_same_text(monkeypatch):
    """The preparation cache's key of a corpus: a list that differs from another in its order,
    count, content or where its texts split (a text holding the separator) gets another digest."""
    from lightning_modules.data import cache

    monkeypatch.setattr(cache, "TEXT_CHUNK", 2)  # chunk boundaries inside the lists too
    lists = [[], [""], ["", ""], ["a\nb", "c"], ["a", "b\nc"], ["a", "b", "c"], ["b", "a", "c"],
             ["ab", "c"], ["a", "bc"], ["a", "b", "c", "d"], ["a", "b", "c\nd"], ["a", "b", "cd"]]
    digests = [cache.texts_digest(texts) for texts in lists]
    assert len(set(digests)) == len(lists)
    assert cache.texts_digest(["a", "b", "c"]) == digests[5]  # the same list, the same digest


def test_ding_extraction_is_cached_under_the_dictionarys_digest(tmp_path):
    """The cache returns what `extract_ding` returns; an edited dictionary is extracted anew; a
    damaged entry is extracted again and rewritten; an unwritable cache is no error."""
    dictionary = tmp_path / "de-en"
    dictionary.write_bytes(DING.read_bytes()[:2_000_000].rsplit(b"\n", 1)[0] + b"\n")  # 15K lines
    cache = tmp_path / "cache"
    fresh = extract_ding(dictionary)
    assert len(fresh[0]) > 500 and extract_ding_cached(dictionary, cache) == fresh
    sentences, phrases = (next((cache / "ding").glob(f"{kind}-*.json"))
                          for kind in ("sentences", "phrases"))
    assert extract_ding_cached(dictionary, cache, phrases=False) == (fresh[0], None)
    sentences.write_text('[["Read from the cache.", "Aus dem Zwischenspeicher gelesen."]]')
    assert extract_ding_cached(dictionary, cache)[0] == [("Read from the cache.",
                                                          "Aus dem Zwischenspeicher gelesen.")]

    sentences.write_text(sentences.read_text()[:-5])  # cut short
    assert extract_ding_cached(dictionary, cache) == fresh
    assert extract_ding_cached(dictionary, cache) == fresh and len(sentences.read_text()) > 10_000
    phrases.unlink()  # sentences alone are not an entry
    assert extract_ding_cached(dictionary, cache) == fresh and phrases.is_file()

    with dictionary.open("a", encoding="utf-8") as handle:
        handle.write("Der Test läuft heute gut. :: The test runs well today.\n")
    newest = extract_ding_cached(dictionary, cache)[0][-1]
    assert newest == ("The test runs well today.", "Der Test läuft heute gut.")
    assert len(list((cache / "ding").glob("sentences-*.json"))) == 2

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would go")
    assert extract_ding_cached(dictionary, blocked)[0] == extract_ding(dictionary)[0]


def test_ding_line_rules():
    line = ("Blasen bilden {vi} [med.] | Auf meinen Füßen bildeten sich Blasen. | "
            "Benimm dich!; Benehmen Sie sich! :: to blister (sth.) | My feet started to blister. | "
            "Just behave!; Behave yourself!")
    sentences, phrases = parse_ding_line(line)
    assert sentences == [("My feet started to blister.", "Auf meinen Füßen bildeten sich Blasen.")]
    # "Benimm dich!" has two words on both sides: too short for a sentence pair, kept as phrase.
    assert phrases == [("to blister", "Blasen bilden"), ("Just behave!", "Benimm dich!")]
    equal = "Ich komme.; Ich komme gleich wieder. :: I am coming.; I will be right back."
    assert parse_ding_line(equal)[0] == [("I am coming.", "Ich komme."),
                                         ("I will be right back.", "Ich komme gleich wieder.")]
    unequal = "Es liegt in der Natur der Sache.; Es ist halt so. :: It is in the nature of things."
    assert parse_ding_line(unequal)[0] == [("It is in the nature of things.",
                                            "Es liegt in der Natur der Sache.")]
    gloss = "Was meinen Sie (damit)? (Frage) :: What do you mean (by that)? [coll.] (question)"
    assert parse_ding_line(gloss)[0] == [("What do you mean?", "Was meinen Sie?")]
    assert split_alternatives("to seek {sought; sought} sth. <seek> /SK/; to look for") == [
        "to seek sth.", "to look for"]
    template = "Er gibt jdm. etw. zurück. :: He gives sth. back to sb."
    assert parse_ding_line(template)[0] == []
    assert parse_ding_line("# comment :: line") == ([], [])
    swapped = "Sie litt unter der Behandlung. :: Sie litt unter der ungerechten Behandlung."
    assert parse_ding_line(swapped) == ([], [])


def test_ding_missing_file_names_package(tmp_path):
    with pytest.raises(UserError, match="apt-get install trans-de-en"):
        load_corpus(DataConfig(ding_path=str(tmp_path / "nope")))


# ----------------------------------------------------------------------------- files

def test_every_registered_corpus_names_a_loader_of_the_data_package():
    """`config.CORPORA` is the one registry of corpora (docs/corpora.md#adding-a-corpus): each entry
    names a function of lightning_modules/data/ that load_corpus calls, and its disk in GB or None."""
    for name, entry in CORPORA.items():
        module, function = entry.loader.rsplit(".", 1)
        assert callable(getattr(import_module(f"lightning_modules.data.{module}"), function, None)), name
        assert entry.disk_gb is None or entry.disk_gb > 0, name


def test_read_parallel_plain_and_gzip(tmp_path):
    src = write_lines(tmp_path / "a.en.gz", ["Hello world .", "", "Bye"], gz=True)
    tgt = write_lines(tmp_path / "a.de", ["Hallo Welt .", "", "Tschüss"])
    text = read_parallel(src, tgt)
    assert text.src == ["Hello world .", "Bye"] and text.tgt == ["Hallo Welt .", "Tschüss"]
    # gzip detected by magic bytes, whatever the suffix
    plain_named = tmp_path / "b.txt"
    plain_named.write_bytes((tmp_path / "a.en.gz").read_bytes())
    assert read_parallel(plain_named, tgt).src == text.src


def test_read_parallel_errors_name_file_and_line(tmp_path):
    good = write_lines(tmp_path / "good.de", ["a", "b", "c"])
    with pytest.raises(UserError, match=r"missing\.en: file not found"):
        read_parallel(tmp_path / "missing.en", good)
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"ok\nstill ok\n\xff\xfe broken\n")
    with pytest.raises(UserError, match=r"bad\.en: line 3 is not valid UTF-8"):
        read_parallel(bad, good)
    empty = tmp_path / "empty.en"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match=r"empty\.en: file is empty"):
        read_parallel(empty, good)
    short = write_lines(tmp_path / "short.en", ["a", "b"])
    with pytest.raises(UserError, match=r"short\.en has 2 lines but .*good\.de has 3"):
        read_parallel(short, good)
    hole = write_lines(tmp_path / "hole.en", ["a", "", "c"])
    with pytest.raises(UserError, match=r"hole\.en: line 2 is empty but line 2 of .*good\.de"):
        read_parallel(hole, good)


def test_read_parallel_keep_reads_the_same_subset_as_cutting_the_whole_text(tmp_path):
    src, tgt = synthetic_pairs(300, seed=3)
    src[7] = tgt[7] = "  "  # a blank pair: skipped, not counted
    write_lines(tmp_path / "t.en", src, gz=True)
    write_lines(tmp_path / "t.de", tgt)
    whole = read_parallel(tmp_path / "t.en", tmp_path / "t.de")
    assert len(whole) == 299
    cut = read_parallel(tmp_path / "t.en", tmp_path / "t.de", keep=40)
    assert (cut.src, cut.tgt) == (subset(whole, 40).src, subset(whole, 40).tgt) and len(cut) == 40
    assert cut.src != whole.src[:40]  # drawn from all of it, in corpus order
    assert read_parallel(tmp_path / "t.en", tmp_path / "t.de", keep=1000).src == whole.src
    hole = write_lines(tmp_path / "hole.en", src[:250] + [""] + src[251:])
    with pytest.raises(UserError, match=r"hole\.en: line 251 is empty"):  # checked on the counting pass
        read_parallel(hole, tmp_path / "t.de", keep=10)


def test_files_corpus_requires_keys_and_test_is_optional(tmp_path):
    src = write_lines(tmp_path / "t.en", ["a b", "c d"])
    tgt = write_lines(tmp_path / "t.de", ["A B", "C D"])
    with pytest.raises(UserError, match=r"data\.train_src is not set \(needed for --data files\)"):
        load_corpus(DataConfig(corpus="files"))
    with pytest.raises(UserError, match=r"data\.valid_tgt is not set"):
        load_corpus(DataConfig(corpus="files", train_src=str(src), train_tgt=str(tgt),
                               valid_src=str(src)))
    corpus = load_corpus(DataConfig(corpus="files", train_src=str(src), train_tgt=str(tgt),
                                    valid_src=str(src), valid_tgt=str(tgt)))
    assert len(corpus.train) == 2 and len(corpus.test) == 0 and corpus.extra_train is None


def test_train_pairs_takes_the_same_random_subset_in_corpus_order_and_leaves_dev_alone(tmp_path):
    src = write_lines(tmp_path / "t.en", [f"s{i}" for i in range(500)])
    tgt = write_lines(tmp_path / "t.de", [f"t{i}" for i in range(500)])
    dev = write_lines(tmp_path / "d.en", [f"d{i}" for i in range(30)])

    def load(**extra):
        return load_corpus(DataConfig(corpus="files", train_src=str(src), train_tgt=str(tgt),
                                      valid_src=str(dev), valid_tgt=str(dev), **extra))

    first, again = load(train_pairs=100), load(train_pairs=100)
    assert len(first.train) == 100 and first.train == again.train  # the same pairs every time
    numbers = [int(s[1:]) for s in first.train.src]
    assert numbers == sorted(numbers) and numbers != list(range(100))  # random, kept in order
    assert [f"t{n}" for n in numbers] == first.train.tgt  # still aligned
    assert first.valid == load().valid and len(first.valid) == 30
    assert len(load(train_pairs=10_000).train) == 500  # more than there is: all of it
    with pytest.raises(UserError, match="data.train_pairs must be positive"):
        DataConfig(train_pairs=0)


# ----------------------------------------------------------------------------- tokenizer

def test_tokenizer_trains_once_then_reuses(tmp_path):
    src, tgt = synthetic_pairs(2000)
    path = tmp_path / "spm.model"
    sp, origin = train_or_load(path, src + tgt, 300, 100_000)
    assert origin == "trained"
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    assert sp.get_piece_size() == 300
    assert path.with_suffix(".vocab").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".spm-")]
    mtime = path.stat().st_mtime_ns
    again, origin = train_or_load(path, iter(["completely different text"]), 999, 10)
    assert path.stat().st_mtime_ns == mtime and again.get_piece_size() == 300 and origin == "run directory"
    # deterministic: a fresh training on the same input gives the same vocabulary
    train_or_load(tmp_path / "b" / "spm.model", src + tgt, 300, 100_000)
    assert (tmp_path / "b" / "spm.vocab").read_text() == path.with_suffix(".vocab").read_text()
    ids = sp.encode(src[0])
    assert sp.decode(ids) == src[0]


def test_tokenizer_vocab_too_large_is_user_error(tmp_path):
    with pytest.raises(UserError, match=r"vocab_size=5000 is too large .* at most \d+"):
        train_or_load(tmp_path / "spm.model", ["a tiny corpus", "of two lines"], 5000, 100)
    assert not (tmp_path / "spm.model").exists()


# ----------------------------------------------------------------------------- batching

def random_lengths(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    src = [rng.randint(1, 60) for _ in range(n)]
    return src, [max(1, s + rng.randint(-5, 5)) for s in src]


def test_sampler_covers_each_example_once_within_budget():
    src, tgt = random_lengths(3000)
    sampler = TokenBucketBatchSampler(src, tgt, max_tokens=500, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(i for b in batches for i in b) == list(range(3000))
    for batch in batches:
        width = max(max(src[i], tgt[i]) + 1 for i in batch)
        assert len(batch) * width <= 500


def test_sampler_oversized_example_gets_own_batch():
    sampler = TokenBucketBatchSampler([3, 100, 4], [3, 90, 4], max_tokens=50, shuffle=False)
    assert [1] in list(sampler) and sorted(i for b in sampler for i in b) == [0, 1, 2]


def test_sampler_deterministic_and_reshuffles_per_epoch():
    src, tgt = random_lengths(3000)
    a = TokenBucketBatchSampler(src, tgt, max_tokens=500, seed=7)
    b = TokenBucketBatchSampler(src, tgt, max_tokens=500, seed=7)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    second = list(a)
    assert first != second and len(first) == len(second)
    assert {tuple(sorted(x)) for x in first} != {tuple(sorted(x)) for x in second}  # regrouped
    assert list(TokenBucketBatchSampler(src, tgt, 500, seed=8)) != first
    fixed = TokenBucketBatchSampler(src, tgt, 500, shuffle=False)
    epoch0 = list(fixed)
    fixed.set_epoch(5)
    assert list(fixed) == epoch0


def test_sampler_shards_disjoint_and_equal_length():
    src, tgt = random_lengths(3000)
    whole = TokenBucketBatchSampler(src, tgt, 500, seed=1, num_replicas=1, rank=0)
    n_batches = len(whole)
    shards = [list(TokenBucketBatchSampler(src, tgt, 500, seed=1, num_replicas=4, rank=r))
              for r in range(4)]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == -(-n_batches // 4)
    keys = [tuple(b) for s in shards for b in s]
    wrapped = len(keys) - n_batches  # batches repeated from the start to even out the shards
    assert 0 <= wrapped < 4 and len(set(keys)) == n_batches
    assert sorted({i for s in shards for b in s for i in b}) == list(range(3000))
    assert set(map(tuple, shards[0])).isdisjoint(map(tuple, shards[1][:len(shards[1]) - 1]))
    # more replicas than batches still gives every rank a batch
    tiny = [list(TokenBucketBatchSampler([1, 2], [1, 2], 100, num_replicas=3, rank=r))
            for r in range(3)]
    assert all(len(t) == 1 for t in tiny)


def test_padding_share_counts_both_sides():
    assert padding_share([[0, 1]], [1, 3], [2, 2]) == pytest.approx(2 / 14)
    assert padding_share([[0], [1]], [1, 3], [2, 2]) == 0.0


def test_collate_shapes_and_specials():
    batch = collate([([5, 6, 7], [8]), ([9], [10, 11, 12, 13])])
    assert batch["src"].tolist() == [[5, 6, 7, EOS_ID], [9, EOS_ID, PAD_ID, PAD_ID]]
    assert batch["tgt_in"].tolist() == [[BOS_ID, 8, PAD_ID, PAD_ID, PAD_ID],
                                        [BOS_ID, 10, 11, 12, 13]]
    assert batch["tgt_out"].tolist() == [[8, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
                                         [10, 11, 12, 13, EOS_ID]]
    assert all(batch[k].dtype == torch.long for k in ("src", "tgt_in", "tgt_out"))
    # a host-side int: counting tokens never waits for a GPU
    assert batch["n_tokens"] == 7 == int((batch["tgt_out"] != PAD_ID).sum())


@pytest.mark.parametrize("multiple", [1, 8])
def test_bucketed_shapes_keep_budget_and_padding_matches_tensors(multiple):
    src, tgt = random_lengths(3000, seed=4)
    examples = [(list(range(4, 4 + s)), list(range(4, 4 + t))) for s, t in zip(src, tgt)]
    sampler = TokenBucketBatchSampler(src, tgt, max_tokens=500, seed=3, pad_multiple=multiple)
    batches = sampler.global_batches()
    slots = real = 0
    for batch in batches:
        tensors = collate([examples[i] for i in batch], pad_multiple=multiple)
        rows, s_len = tensors["src"].shape
        t_len = tensors["tgt_out"].size(1)
        assert s_len % multiple == 0 and t_len % multiple == 0
        assert rows == 1 or rows * max(s_len, t_len) <= 500  # the budget counts padded widths
        slots += rows * (s_len + t_len)
        real += int((tensors["src"] != PAD_ID).sum() + (tensors["tgt_out"] != PAD_ID).sum())
    share = padding_share(batches, src, tgt, multiple)
    assert share == pytest.approx((slots - real) / slots)
    shapes = batch_shapes(batches, src, tgt, multiple)
    assert len(shapes) == len(batches)
    lengths = {shape[1:] for shape in shapes}
    if multiple == 8:  # rounding leaves only a few (source, target) lengths
        exact = {s[1:] for s in batch_shapes(TokenBucketBatchSampler(src, tgt, 500, seed=3).global_batches(),
                                             src, tgt)}
        assert len(lengths) < len(exact) / 3


def test_collate_matches_a_per_sentence_reference():
    rng = random.Random(5)
    examples = [([rng.randint(4, 99) for _ in range(rng.randint(1, 9))],
                 [rng.randint(4, 99) for _ in range(rng.randint(1, 9))]) for _ in range(50)]
    batch = collate(examples, pad_id=PAD_ID, pad_multiple=4)
    for row, (s, t) in enumerate(examples):
        width_s, width_t = batch["src"].size(1), batch["tgt_in"].size(1)
        assert batch["src"][row].tolist() == s + [EOS_ID] + [PAD_ID] * (width_s - len(s) - 1)
        assert batch["tgt_in"][row].tolist() == [BOS_ID] + t + [PAD_ID] * (width_t - len(t) - 1)
        assert batch["tgt_out"][row].tolist() == t + [EOS_ID] + [PAD_ID] * (width_t - len(t) - 1)


# ----------------------------------------------------------------------------- datamodule

@pytest.fixture(scope="module")
def ding_module(tmp_path_factory):
    if not DING.is_file():
        pytest.fail("the Ding dictionary is missing: run make setup (apt-get install trans-de-en)")
    run_dir = tmp_path_factory.mktemp("run")
    dm = TranslationDataModule(DataConfig(vocab_size=1000, max_tokens=4096), run_dir, seed=1)
    dm.setup("fit")
    return dm


@needs_ding
def test_datamodule_on_ding(ding_module):
    dm = ding_module
    stats = dm.stats
    print(f"\nDing datamodule stats: {stats}")
    assert dm.vocab_size == 1000 and dm.pad_id == 0
    assert stats["valid_pairs"] == stats["test_pairs"] == 1000
    assert stats["train_examples"] == stats["train_pairs"] + stats["extra_train_pairs"] - stats[
        "dropped_for_length"]
    assert stats["train_padding_share"] < 0.10
    batch = next(iter(dm.train_dataloader()))
    assert batch["src"].shape[0] * max(batch["src"].shape[1], batch["tgt_in"].shape[1]) <= 4096
    assert (batch["tgt_in"][:, 0] == BOS_ID).all()
    val = list(dm.val_dataloader())
    assert sum(b["src"].shape[0] for b in val) == 1000
    text = "The weather is nice today."
    ids = dm.encode([text])[0]
    assert BOS_ID not in ids and EOS_ID not in ids
    assert dm.decode([BOS_ID, *ids, EOS_ID, 17, PAD_ID]) == text


@needs_ding
def test_datamodule_setup_reuses_spm_and_is_idempotent(ding_module):
    path = ding_module.run_dir / "spm.model"
    mtime = path.stat().st_mtime_ns
    ding_module.setup("fit")  # idempotent: no work
    again = TranslationDataModule(ding_module.cfg, ding_module.run_dir, seed=1)
    again.setup()
    assert path.stat().st_mtime_ns == mtime
    assert again.encode(["A test sentence."]) == ding_module.encode(["A test sentence."])
    assert again.stats["train_padding_share"] == ding_module.stats["train_padding_share"]


@needs_ding
def test_padding_share_on_ding_sentences(ding_module):
    train = ding_module.train_set
    n = ding_module.stats["train_pairs"]  # the sentence pairs come first
    src, tgt = train.src_lengths[:n], train.tgt_lengths[:n]
    sentences_only = padding_share(TokenBucketBatchSampler(src, tgt, 4096).global_batches(),
                                   src, tgt)
    print(f"\npadding share at max_tokens=4096: train incl. dictionary "
          f"{ding_module.stats['train_padding_share']:.4f}, sentences only {sentences_only:.4f}")
    assert sentences_only < 0.10


def test_a_run_on_a_prepared_corpus_takes_its_bpe_and_encoded_pairs_from_the_cache(tmp_path):
    """The first run trains the BPE and encodes the splits, and keeps them in the cache; the next
    run on the same corpus and settings copies the model and reads the arrays: the same pieces, the
    same ids, the same statistics. A damaged entry is derived and written again; other settings or
    text get their own entries; a resumed run keeps its own model; an unwritable cache is no error."""
    from lightning_modules.data.prepared import TranslationData, read_encoded

    src, tgt = synthetic_pairs(600)
    files = {}
    for split in ("train", "valid"):
        files[f"{split}_src"] = str(write_lines(tmp_path / f"{split}.en", src[:500] if split == "train" else src[500:]))
        files[f"{split}_tgt"] = str(write_lines(tmp_path / f"{split}.de", tgt[:500] if split == "train" else tgt[500:]))
    cache = tmp_path / "cache"
    cfg = DataConfig(corpus="files", vocab_size=200, max_tokens=300, cache_dir=str(cache), **files)

    def prepared(name: str, config: DataConfig = cfg) -> TranslationData:
        data = TranslationData(config, tmp_path / name, seed=3)
        data.setup()
        return data

    def same(a: TranslationData, b: TranslationData) -> None:
        for split in ("train_set", "valid_set"):
            for (name, x), y in zip(getattr(a, split).arrays().items(), getattr(b, split).arrays().values()):
                assert x.dtype == y.dtype and (x == y).all(), (split, name)
        pieces = [[(t.tokenizer.id_to_piece(i), t.tokenizer.get_score(i)) for i in range(t.vocab_size)] for t in (a, b)]
        assert pieces[0] == pieces[1]
        ignore = ("stages", "prepared", "setup_seconds")
        assert {k: v for k, v in a.stats.items() if k not in ignore} == {k: v for k, v in b.stats.items() if k not in ignore}

    first = prepared("first")
    assert first.stats["prepared"] == {"bpe": "trained", "encoded_from_cache": []}
    models, encoded = sorted((cache / "bpe").glob("*.model")), sorted((cache / "encoded").glob("*.npz"))
    assert len(models) == 1 and models[0].with_suffix(".vocab").is_file() and len(encoded) == 2
    second = prepared("second")
    assert second.stats["prepared"] == {"bpe": "cache", "encoded_from_cache": ["train", "valid"]}
    assert (tmp_path / "second" / "spm.model").read_bytes() == models[0].read_bytes()
    assert (tmp_path / "second" / "spm.vocab").is_file()
    same(first, second)
    assert prepared("second").stats["prepared"]["bpe"] == "run directory"  # a resumed run's own model

    # damaged entries: derived again and written again, the same result
    train_entry = max(encoded, key=lambda p: p.stat().st_size)
    train_entry.write_bytes(train_entry.read_bytes()[:-100])
    third = prepared("third")
    assert third.stats["prepared"] == {"bpe": "cache", "encoded_from_cache": ["valid"]}
    same(first, third)
    assert prepared("fourth").stats["prepared"]["encoded_from_cache"] == ["train", "valid"]  # rewritten
    assert read_encoded(train_entry, len(third.corpus.train), vocab_size=50) is None  # ids beyond the vocabulary
    assert read_encoded(train_entry, len(third.corpus.train) + 1, vocab_size=200) is None  # another split
    models[0].write_text("not a model")
    fifth = prepared("fifth")
    assert fifth.stats["prepared"]["bpe"] == "trained" and models[0].stat().st_size > 100
    same(first, fifth)

    # other settings, other text: entries of their own
    assert prepared("vocab", DataConfig(**{**cfg.__dict__, "vocab_size": 150})).stats["prepared"]["bpe"] == "trained"
    write_lines(tmp_path / "valid.de", [t + " X" for t in tgt[500:]])
    assert prepared("edited").stats["prepared"] == {"bpe": "cache", "encoded_from_cache": ["train"]}
    assert len(list((cache / "bpe").glob("*.model"))) == 2

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would go")
    unwritable = prepared("unwritable", DataConfig(**{**cfg.__dict__, "cache_dir": str(blocked)}))
    assert unwritable.stats["prepared"] == {"bpe": "trained", "encoded_from_cache": []}
    assert (unwritable.valid_set.arrays()["tgt_ids"] == prepared("edited").valid_set.arrays()["tgt_ids"]).all()


def test_lightning_advances_sampler_epoch(tmp_path):
    """Lightning's fit loop calls set_epoch on `batch_sampler.sampler`: check it really does."""
    import lightning.pytorch as pl

    src, tgt = synthetic_pairs(600)
    files = {}
    for split in ("train", "valid"):
        files[f"{split}_src"] = str(write_lines(tmp_path / f"{split}.en", src))
        files[f"{split}_tgt"] = str(write_lines(tmp_path / f"{split}.de", tgt))
    cfg = DataConfig(corpus="files", vocab_size=200, max_tokens=300, **files)
    dm = TranslationDataModule(cfg, tmp_path / "run", seed=3)

    class Probe(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(()))
            self.seen: dict[int, list[list[int]]] = {}

        def training_step(self, batch, batch_idx):
            sampler = self.trainer.train_dataloader.batch_sampler
            self.seen.setdefault(sampler.epoch, []).append(batch["src"][:, 0].tolist())
            return (self.weight - 1.0) ** 2

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    probe = Probe()
    trainer = pl.Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=0,
                         use_distributed_sampler=False, logger=False, accelerator="cpu",
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(probe, datamodule=dm)
    assert sorted(probe.seen) == [0, 1]
    assert probe.seen[0] != probe.seen[1]


# ----------------------------------------------------------------------------- downloads

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        type(self).requests.append(self.path)
        super().do_GET()


@pytest.fixture()
def http_root(tmp_path):
    """A directory served on 127.0.0.1 at a random port: yields (directory, base URL, log)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = type("Handler", (_QuietHandler,), {"requests": []})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}/task1/raw", handler.requests
    finally:
        server.shutdown()
        server.server_close()


def make_multi30k(directory: Path, gz: bool) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for stem, n in (("train", 40), ("val", 6), ("test_2016_flickr", 5)):
        src, tgt = synthetic_pairs(n, seed=len(stem))
        write_lines(directory / (f"{stem}.en" + ".gz" * gz), src, gz=gz)
        write_lines(directory / (f"{stem}.de" + ".gz" * gz), tgt, gz=gz)


def test_multi30k_download_from_local_server(http_root, tmp_path):
    root, url, requests = http_root
    make_multi30k(root / "task1" / "raw", gz=True)
    cfg = DataConfig(corpus="multi30k", base_url=url, cache_dir=str(tmp_path / "cache"))
    corpus = load_corpus(cfg)
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (40, 6, 5)
    assert corpus.train.src == synthetic_pairs(40, seed=5)[0]
    cached = sorted(p.name for p in (tmp_path / "cache" / "multi30k").iterdir())
    assert cached == sorted(f"{stem}.{lang}.gz" for stem in ("train", "val", "test_2016_flickr")
                            for lang in ("en", "de"))
    n_requests = len(requests)
    assert load_corpus(cfg).train == corpus.train and len(requests) == n_requests  # reused


def test_multi30k_plain_files_on_server_and_failure(http_root, tmp_path):
    root, url, _ = http_root
    make_multi30k(root / "task1" / "raw", gz=False)
    corpus = load_corpus(DataConfig(corpus="multi30k", base_url=url,
                                    cache_dir=str(tmp_path / "c1")))
    assert len(corpus.valid) == 6
    bad_url = url.replace("/task1/raw", "/nowhere")
    with pytest.raises(UserError, match=re.escape(bad_url)):
        load_corpus(DataConfig(corpus="multi30k", base_url=bad_url,
                               cache_dir=str(tmp_path / "c2")))
    assert not list((tmp_path / "c2" / "multi30k").glob("*.part"))


def test_multi30k_data_dir_mixed_gzip(tmp_path):
    make_multi30k(tmp_path / "m", gz=False)
    for name in ("train.en", "train.de"):
        path = tmp_path / "m" / name
        path.with_name(name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    corpus = load_corpus(DataConfig(corpus="multi30k", data_dir=str(tmp_path / "m")))
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (40, 6, 5)
    (tmp_path / "m" / "val.de").unlink()
    with pytest.raises(UserError, match=r"val\.de .*not found"):
        load_corpus(DataConfig(corpus="multi30k", data_dir=str(tmp_path / "m")))


def test_wmt14_data_dir(tmp_path):
    for stem, n in (("train", 30), ("newstest2013", 4), ("newstest2014", 3)):
        src, tgt = synthetic_pairs(n)
        write_lines(tmp_path / f"{stem}.en", src, gz=stem == "train")
        write_lines(tmp_path / f"{stem}.de", tgt)
    corpus = load_corpus(DataConfig(corpus="wmt14", data_dir=str(tmp_path)))
    assert (corpus.name, len(corpus.train), len(corpus.valid), len(corpus.test)) == (
        "wmt14", 30, 4, 3)


def wmt14_mirror(root: Path, members: dict[str, str] | None = None) -> dict[str, list[str]]:
    """A WMT14 mirror in `root` as `data.base_url` expects it: the three training archives under
    their statmt.org names (each with its pair's members and another language's), newstest2013 and
    2014; returns the training text the archives hold, per language, in archive order."""
    expected: dict[str, list[str]] = {"en": [], "de": []}
    for k, (url, prefix) in enumerate(WMT14_TRAIN_ARCHIVES):
        src, tgt = synthetic_pairs(10 + k, seed=k)
        with tarfile.open(root / url.rsplit("/", 1)[-1], mode="w:gz") as tar:
            for lang, lines in (("en", src), ("de", tgt), ("fr", src)):
                data = "\n".join(lines).encode()  # no final newline: must still concatenate
                info = tarfile.TarInfo(f"{(members or {}).get(prefix, prefix)}.{lang}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        expected["en"] += src
        expected["de"] += tgt
    for stem, n in (("newstest2013", 4), ("newstest2014", 3)):
        src, tgt = synthetic_pairs(n)
        write_lines(root / f"{stem}.en", src)
        write_lines(root / f"{stem}.de", tgt)
    return expected


def test_wmt14_training_archives_from_local_server(http_root, tmp_path):
    """WMT14 as the product fetches it from a mirror: the archives downloaded and extracted once."""
    root, url, _ = http_root
    expected = wmt14_mirror(root)
    config = DataConfig(corpus="wmt14", base_url=url.rsplit("/task1", 1)[0], cache_dir=str(tmp_path / "cache"))
    corpus = load_corpus(config)
    assert corpus.train.src == expected["en"] and corpus.train.tgt == expected["de"]
    assert (len(corpus.valid), len(corpus.test)) == (4, 3)
    train_en = tmp_path / "cache" / "wmt14" / "train.en"
    os.utime(train_en, ns=(0, 0))
    load_corpus(config)  # present: not rebuilt
    assert train_en.stat().st_mtime_ns == 0
    other = tmp_path / "other"
    other.mkdir()
    wmt14_mirror(other, {"commoncrawl.de-en": "commoncrawl.fr-en"})
    for name in os.listdir(other):
        os.replace(other / name, root / name)
    with pytest.raises(UserError, match="training-parallel-commoncrawl.tgz lacks commoncrawl.de-en.de"):
        load_corpus(DataConfig(corpus="wmt14", base_url=config.base_url, cache_dir=str(other / "cache")))


def _tgz(path: Path, members: list[tuple[str, list[str]]]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, lines in members:
            data = "".join(f"{line}\n" for line in lines).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_wmt14_base_url_is_a_mirror_of_the_statmt_archives_and_newstest(http_root, tmp_path):
    """--base-url for wmt14 serves the three statmt.org archives under their own names (members
    extracted as from statmt.org, other language pairs passed over) and newstest2013/2014.LANG; the
    training side is cut to data.train_pairs as it is read, dev and test are whole."""
    root, url, requests = http_root
    expected = {"en": [], "de": []}
    for k, (archive_url, prefix) in enumerate(WMT14_TRAIN_ARCHIVES):
        src, tgt = synthetic_pairs(20 + k, seed=10 + k)
        other = prefix.replace("de-en", "fr-en")
        _tgz(root / archive_url.rsplit("/", 1)[-1],
             [(f"{other}.fr", tgt[:3]), (f"{prefix}.de", tgt), (f"{prefix}.en", src), (f"{other}.en", src[:3])])
        expected["en"] += src
        expected["de"] += tgt
    for stem, n in (("newstest2013", 5), ("newstest2014", 4)):
        src, tgt = synthetic_pairs(n, seed=n)
        write_lines(root / f"{stem}.en.gz", src, gz=True)
        write_lines(root / f"{stem}.de", tgt)
    base = url.rsplit("/task1", 1)[0]
    cfg = DataConfig(corpus="wmt14", base_url=base, cache_dir=str(tmp_path / "cache"), train_pairs=25)
    corpus = load_corpus(cfg)
    whole = read_parallel(tmp_path / "cache" / "wmt14" / "train.en", tmp_path / "cache" / "wmt14" / "train.de")
    assert (whole.src, whole.tgt) == (expected["en"], expected["de"])
    assert corpus.train.src == subset(whole, 25).src and len(corpus.train) == 25
    assert (len(corpus.valid), len(corpus.test)) == (5, 4)
    assert {"/training-parallel-europarl-v7.tgz", "/training-parallel-commoncrawl.tgz",
            "/training-parallel-nc-v9.tgz", "/newstest2013.en.gz", "/newstest2014.de"} <= set(requests)
    served = len(requests)
    load_corpus(cfg)  # all in the cache: nothing fetched again
    assert len(requests) == served


def test_sentence_lengths_counter_sanity(ding):
    """Most Ding sentences are short: the reason small max_tokens batches are large."""
    lengths = Counter(min(len(en.split()), 20) for en, _ in ding[0])
    assert sum(v for k, v in lengths.items() if k <= 12) > 0.7 * len(ding[0])


@pytest.fixture
def ding_installed() -> None:
    if not DING.is_file():
        pytest.fail("the Ding dictionary is missing: run make setup (apt-get install trans-de-en)")


def test_a_gzip_bomb_of_one_endless_line_is_one_line_of_error(tmp_path):
    """A gzipped corpus file that unpacks to one 64 MiB line (a bomb, or a binary file) is refused
    at the cap on a line (1 MiB), read as a stream: never held whole."""
    import gzip
    import tracemalloc

    from lightning_modules.data.corpora import MAX_LINE_BYTES, read_lines

    bomb = tmp_path / "train.en.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as out:
        for _ in range(64):
            out.write(b"a" * 2 ** 20)
    assert bomb.stat().st_size < 2 ** 20
    tracemalloc.start()
    with pytest.raises(UserError) as caught:
        read_lines(bomb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "line 1 is longer than 1 MiB" in str(caught.value) and "\n" not in str(caught.value)
    assert peak < 8 * MAX_LINE_BYTES
    (tmp_path / "ok.en").write_bytes(b"x" * (MAX_LINE_BYTES - 1) + b"\n" + b"short\n")
    assert [len(line) for line in read_lines(tmp_path / "ok.en")] == [MAX_LINE_BYTES - 1, 5]


def test_one_process_at_a_time_prepares_a_corpus_in_a_cache_and_the_others_wait(tmp_path, capfd):
    """A SLURM array's tasks start together on a cold cache (#70: each downloaded and encoded WMT14).
    While another process holds the cache's preparation lock, the data check says it waits, waits,
    and then prepares; a cache folder it cannot write is no error (the check runs unlocked)."""
    from ablations.resolve import resolve
    from lightning_modules.run.preflight import prepare_data

    cache_dir = tmp_path / "cache"
    cfg = resolve("tiny", "base", None, ["data.vocab_size=300", "data.valid_size=50", "data.test_size=50",
                                         f"data.cache_dir={cache_dir}"])
    held = tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import filelock, pathlib, sys, time\n"
        f"lock = filelock.FileLock({str(cache_dir / '.prepare-ding.lock')!r}); lock.acquire()\n"
        f"pathlib.Path({str(held)!r}).touch(); time.sleep(3)\n")])
    try:
        deadline = time.monotonic() + 60
        while not held.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        capfd.readouterr()
        start = time.monotonic()
        digest = prepare_data(cfg)
        waited = time.monotonic() - start
    finally:
        holder.wait(timeout=60)
    err = capfd.readouterr().err
    assert "waiting for another process that prepares the ding corpus in" in err and ".prepare-ding.lock" in err
    assert waited > 1.0 and len(digest) == 32
    assert (cache_dir / "bpe").is_dir()  # prepared once the lock was free
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anyway
        assert prepare_data(replace(cfg, data=replace(cfg.data, cache_dir=str(read_only / "c")))) == digest
