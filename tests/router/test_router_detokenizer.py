from __future__ import annotations

import pytest
from router_tiny_tok import byte_ids

from dspark.router.detokenizer import IncrementalDetokenizer

TEXTS = ["héllo wörld", "中文 中国", "😀 emoji 😀😀", "café 中 😀 the end"]


def run(detok, ids, batch=1):
    deltas, stopped = [], False
    for i in range(0, len(ids), batch):
        d, stopped = detok.add(ids[i:i + batch])
        deltas.append(d)
        if stopped:
            break
    if not stopped:
        deltas.append(detok.flush())
    return deltas, stopped


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("split", ["bpe", "bytes"])
@pytest.mark.parametrize("batch", [1, 3])
def test_deltas_concat_to_full_decode_no_replacement_char(tok, text, split, batch):
    ids = tok.encode(text) if split == "bpe" else byte_ids(tok, text)
    deltas, stopped = run(IncrementalDetokenizer(tok), ids, batch)
    assert not stopped
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids) == text


def test_split_char_held_until_complete(tok):
    ids = byte_ids(tok, "a😀")  # 'a' + four byte tokens
    d = IncrementalDetokenizer(tok)
    assert d.add(ids[:1]) == ("a", False)
    for i in range(1, 4):
        assert d.add(ids[i:i + 1]) == ("", False)
    assert d.add(ids[4:]) == ("😀", False)


def test_incomplete_tail_dropped_at_flush(tok):
    ids = byte_ids(tok, "ok中")[:-1]  # last char missing a byte
    d = IncrementalDetokenizer(tok)
    out = d.add(ids)[0] + d.flush()
    assert out == "ok"


def test_prompt_tail_not_emitted(tok):
    prompt = tok.encode("hello world")
    d = IncrementalDetokenizer(tok, prompt_ids_tail=prompt)
    assert "".join(run(d, tok.encode(" café"))[0]) == " café"


def test_special_tokens_skipped(tok):
    im_start = tok.token_to_id("<|im_start|>")
    ids = tok.encode("hi") + [im_start] + tok.encode(" there")
    assert "".join(run(IncrementalDetokenizer(tok), ids)[0]) == "hi there"
    d = IncrementalDetokenizer(tok, skip_special_tokens=False)
    assert "".join(run(d, ids)[0]) == "hi<|im_start|> there"


def test_stop_token_not_rendered_and_ends(tok):
    eos = tok.token_to_id("<|im_end|>")
    d = IncrementalDetokenizer(tok, stop_token_ids=[eos])
    assert d.add(tok.encode("hello") + [eos] + tok.encode(" more")) == ("hello", True)
    assert d.stop_reason == eos
    assert d.add(tok.encode("x")) == ("", True)


def test_stop_token_releases_held_stop_prefix(tok):
    eos = tok.token_to_id("<|im_end|>")
    d = IncrementalDetokenizer(tok, stop=("STOP",), stop_token_ids=[eos])
    assert d.add(byte_ids(tok, "ab ST")) == ("ab ", False)  # "ST" might start STOP
    assert d.add([eos]) == ("ST", True)


@pytest.mark.parametrize("batch", [1, 2, 100])
def test_stop_string_split_across_tokens_never_partially_emitted(tok, batch):
    ids = byte_ids(tok, "hello STOP world")
    d = IncrementalDetokenizer(tok, stop=("STOP",))
    deltas, stopped = run(d, ids, batch)
    assert stopped and d.stop_reason == "STOP"
    assert "".join(deltas) == "hello "
    assert not any(c in "".join(deltas) for c in "STOP")


def test_stop_string_within_one_token(tok):
    ids = tok.encode("hello world")
    d = IncrementalDetokenizer(tok, stop=("lo w",))
    assert "".join(run(d, ids)[0]) == "hel"
    d = IncrementalDetokenizer(tok, stop=("ll",))
    assert "".join(run(d, tok.encode("hello"))[0]) == "he"


def test_stop_string_at_very_start(tok):
    d = IncrementalDetokenizer(tok, stop=("hel",))
    deltas, stopped = run(d, tok.encode("hello world"))
    assert stopped and deltas == [""] * len(deltas)
    assert d.stopped and d.text == ""


def test_earliest_stop_string_wins(tok):
    d = IncrementalDetokenizer(tok, stop=("world", "lo"))
    assert "".join(run(d, tok.encode("hello world"), batch=100)[0]) == "hel"
    assert d.stop_reason == "lo"


def test_stop_string_multibyte(tok):
    ids = byte_ids(tok, "café 中国 😀 x")
    d = IncrementalDetokenizer(tok, stop=("中国",))
    deltas, stopped = run(d, ids)
    assert stopped and "".join(deltas) == "café "
    assert all("\ufffd" not in x for x in deltas)


def test_partial_stop_prefix_released_when_not_matching(tok):
    d = IncrementalDetokenizer(tok, stop=("STOP",))
    ids = byte_ids(tok, "aSTOx")
    out = [d.add([i])[0] for i in ids]
    assert out == ["a", "", "", "", "STOx"]
    assert d.flush() == ""


def test_flush_returns_held_back_prefix(tok):
    d = IncrementalDetokenizer(tok, stop=("STOP",))
    assert d.add(byte_ids(tok, "end ST")) == ("end ", False)
    assert d.flush() == "ST"
    assert d.text == "end ST"
