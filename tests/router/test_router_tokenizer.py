from __future__ import annotations

import pytest
from router_tiny_tok import write_model_dir

from dspark.router.tokenizer import Tokenizer
from dspark.shared.config import default_model_dir
from dspark.shared.errors import InvalidArgument


def test_encode_decode_roundtrip_multibyte(tok):
    text = "héllo 中国 😀 café"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids[0] != tok.bos_token_id  # add_bos_token not set: nothing added


def test_special_tokens_recognized_and_skipped(tok):
    ids = tok.encode("hi<|im_end|>")
    assert ids[-1] == tok.token_to_id("<|im_end|>")
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special_tokens=False) == "hi<|im_end|>"


def test_eos_ids_from_tokenizer_config_and_config_json(tok):
    # eos_token is an AddedToken dict in tokenizer_config; config.json adds id 0.
    assert tok.eos_token == "<|im_end|>"
    assert tok.eos_token_ids == (tok.token_to_id("<|im_end|>"), 0)


def test_add_bos_from_config(tmp_path):
    write_model_dir(tmp_path, add_bos_token=True)
    t = Tokenizer.from_dir(tmp_path)
    assert t.encode("hello")[0] == t.bos_token_id
    # Not doubled when the text already starts with BOS (rendered templates).
    assert t.encode("<|im_start|>hello").count(t.bos_token_id) == 1


def test_chat_template_chatml(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "Hi 中"}])
    assert text == ("<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
                    "<|im_start|>user\nHi 中<|im_end|>\n<|im_start|>assistant\n")
    text = tok.apply_chat_template([{"role": "system", "content": "S"},
                                    {"role": "user", "content": "U"},
                                    {"role": "assistant", "content": "A"},
                                    {"role": "user", "content": "U2"}])
    assert text.startswith("<|im_start|>system\nS<|im_end|>\n")
    assert text.endswith("<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("role", ["tool", "", None, "User"])
def test_chat_role_validation_names_index_and_allowed(tok, role):
    msgs = [{"role": "user", "content": "a"}, {"role": role, "content": "b"}]
    with pytest.raises(InvalidArgument) as e:
        tok.apply_chat_template(msgs)
    assert e.value.field == "messages[1].role"
    assert "system, user, assistant" in str(e.value)


def test_empty_messages_rejected(tok):
    with pytest.raises(InvalidArgument, match="messages"):
        tok.apply_chat_template([])


def test_template_raise_exception_and_sandbox(tmp_path):
    tpl = ("{% if messages[0]['role'] == 'assistant' %}"
           "{{ raise_exception('Conversation must not start with assistant') }}{% endif %}"
           "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}")
    write_model_dir(tmp_path, template=tpl)
    t = Tokenizer.from_dir(tmp_path)
    assert t.apply_chat_template([{"role": "user", "content": "x"}]) == \
        "<|im_start|>x<|im_end|>"
    with pytest.raises(InvalidArgument, match="must not start with assistant"):
        t.apply_chat_template([{"role": "assistant", "content": "x"}])
    # Sandboxed: no access to Python internals.
    write_model_dir(tmp_path, template="{{ messages.__class__.__mro__ }}")
    from jinja2.exceptions import SecurityError
    with pytest.raises(SecurityError):
        Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


@pytest.mark.model
def test_default_model_chatml():
    path = default_model_dir()
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"default model not prepared at {path} (run the model preparation step)")
    t = Tokenizer.from_dir(path)
    text = t.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert "<|im_start|>user\nHello<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = t.encode(text)
    assert t.token_to_id("<|im_start|>") in ids
    assert t.decode(t.encode("héllo 中国 😀")) == "héllo 中国 😀"
    assert t.token_to_id("<|im_end|>") in t.eos_token_ids
    # Streaming detokenization with the real byte-level BPE vocabulary.
    from dspark.router.detokenizer import IncrementalDetokenizer
    out_text = "Héllo 中国人 😀🎉 naïve — “quotes”"
    d = IncrementalDetokenizer(t, prompt_ids_tail=ids)
    deltas = [d.add([i])[0] for i in t.encode(out_text)] + [d.flush()]
    assert all("\ufffd" not in x for x in deltas) and "".join(deltas) == out_text
