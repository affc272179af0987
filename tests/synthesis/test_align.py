"""Alignment of LLM-extracted words back to source words (data_synthesis.align)."""
from __future__ import annotations

import pytest

from data_synthesis.align import align, align_words, content_keys, is_content, key_matches
from effrag.text import words


def kept(src: list[str], labels: list[int]) -> list[str]:
    return [w for w, l in zip(src, labels) if l]


def test_exact_subsequence_and_lengths():
    src = words("Derek Acorah (born 1950) is best known for Most Haunted.")
    labels = align_words(src, "Derek Acorah best known Most Haunted")
    assert len(labels) == len(src)
    assert kept(src, labels) == ["Derek", "Acorah", "best", "known", "Most", "Haunted"]
    rep = align(src, "Derek Acorah best known Most Haunted")
    assert rep.fraction == 1.0 and rep.matched == 6 and rep.in_order == 6 and not rep.unmatched


def test_punctuation_kept_only_next_to_matched_words():
    src = words('He was born in Paris, France, and died in "Lyon".')
    # commas glued to matched words are labeled; a stray comma far from any match is not
    labels = align_words(src, "Paris, France")
    assert kept(src, labels) == ["Paris", ",", "France"]
    assert kept(src, align_words(src, '"Lyon"')) == ['"', "Lyon", '"']
    assert kept(src, align_words(src, "Paris France")) == ["Paris", "France"]
    rep = align(src, ", , Lyon")
    assert rep.total == 1 and rep.fraction == 1.0  # punctuation is not counted


def test_repeated_words_label_the_occurrence_where_the_extraction_continues():
    src = words("The cat saw the dog. The dog, a stray, ran.")
    assert [i for i, l in enumerate(align_words(src, "the dog")) if l] == [3, 4]
    assert [i for i, l in enumerate(align_words(src, "the cat the dog")) if l] == [0, 1, 3, 4]
    src = words("Nike was founded in 1964. By 1980 Nike went public.")
    idx = [i for i, l in enumerate(align_words(src, "1980 Nike went public")) if l]
    assert [src[i] for i in idx] == ["1980", "Nike", "went", "public"]
    assert idx[1] == src.index("Nike", 2)  # the second Nike, not the first


def test_unicode_accents_quotes_and_dashes():
    src = words("Żołnierz zwycięstwa is a café-owner’s film (1892–1975) by Pokémon fans.")
    labels = align_words(src, "zolnierz zwyciestwa cafe-owner's 1892-1975 pokemon")
    assert kept(src, labels) == ["Żołnierz", "zwycięstwa", "café", "-", "owner", "’s", "1892–1975", "Pokémon"]
    assert align(src, "zolnierz zwyciestwa cafe-owner's 1892-1975 pokemon").fraction == 1.0
    # and the other way round: curly quotes / en-dash in the extraction, ASCII in the source
    src2 = words('The "Most Haunted" series ran 2002-2010.')
    assert kept(src2, align_words(src2, "“Most Haunted” 2002–2010")) == ['"', "Most", "Haunted", '"', "2002", "-", "2010"]


def test_words_not_in_source_are_counted_unmatched():
    src = words("Margaret Mead died in New York City.")
    rep = align(src, "Margaret Mead passed away New York")
    assert kept(src, rep.labels) == ["Margaret", "Mead", "New", "York"]
    assert rep.unmatched == ["passed", "away"]
    assert rep.total == 6 and rep.fraction == pytest.approx(4 / 6)


def test_reordered_extraction_uses_fallback():
    src = words("By 1980, Nike had a 50% market share and went public in December.")
    rep = align(src, "went public Nike 1980")
    assert kept(src, rep.labels) == ["1980", "Nike", "went", "public"]
    assert rep.matched == 4 and rep.in_order < 4 and rep.fraction == 1.0


def test_duplicates_are_not_failures():
    src = words("Nike makes shoes.")
    rep = align(src, "Nike Nike Nike shoes")
    assert kept(src, rep.labels) == ["Nike", "shoes"]
    assert rep.duplicates == 2 and rep.unmatched == [] and rep.fraction == 1.0


def test_long_skip_reanchors_in_order():
    filler = " ".join(f"w{i}" for i in range(60))
    src = words(f"alpha beta {filler} gamma alpha beta")
    idx = [i for i, l in enumerate(align_words(src, "gamma alpha beta", window=10)) if l]
    assert idx == [len(src) - 3, len(src) - 2, len(src) - 1]  # not the first alpha/beta
    # a lone far word is still found (by the fallback), a run near the start stays in order
    assert kept(src, align_words(src, "alpha w55", window=10)) == ["alpha", "w55"]


def test_list_input_empty_and_bad_window():
    src = words("Kevin Lima directed 102 Dalmatians.")
    assert kept(src, align_words(src, ["Kevin Lima", "102", "Dalmatians"])) == ["Kevin", "Lima", "102", "Dalmatians"]
    rep = align(src, "")
    assert rep.labels == [0] * len(src) and rep.total == 0 and rep.fraction == 1.0
    assert align_words([], "anything") == []
    with pytest.raises(ValueError, match="window"):
        align(src, "Kevin", window=0)


def test_content_word_helpers():
    assert is_content("US") and not is_content("us") and not is_content("the") and not is_content(",")
    assert is_content("first") and is_content("became")  # meaningful stop words stay content
    assert content_keys(words("Who directed the film Café?")) == {"directed", "film", "cafe"}
    assert key_matches("directed", {"director"}) and key_matches("countries", {"country"})
    assert not key_matches("born", {"birth"}) and not key_matches("art", {"artist"})
