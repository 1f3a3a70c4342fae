"""A tiny byte-level BPE tokenizer with a ChatML template, built in-process.

No model files needed: the tokenizer is trained on a few lines that contain
multi-byte UTF-8 characters (é, 中, emoji) so that some merges hold whole
multi-byte characters, while every single byte also has its own token (the
byte-level alphabet), which lets tests split any character across tokens.
"""
from __future__ import annotations

import json

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from dspark.router.tokenizer import Tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = ["héllo wörld café 中文 中国 😀 emoji 😀😀 hello world STOP stop the end\n"] * 20


def build_backend() -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def write_model_dir(path, template: str = CHATML, **config) -> None:
    path.mkdir(parents=True, exist_ok=True)
    build_backend().save(str(path / "tokenizer.json"))
    cfg = {"chat_template": template, "bos_token": "<|im_start|>",
           "eos_token": {"content": "<|im_end|>", "special": True}, **config}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (path / "config.json").write_text(json.dumps({"eos_token_id": 0}))


def byte_ids(tok: Tokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte of ``text`` (splits every multi-byte char)."""
    alphabet = _byte_to_unicode()
    return [tok.token_to_id(alphabet[b]) for b in text.encode("utf-8")]


def _byte_to_unicode() -> dict[int, str]:
    # GPT-2's bytes_to_unicode: the byte-level alphabet.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))
