"""The served model's tokenizer and chat template.

Wraps a ``tokenizers.Tokenizer`` loaded from an HF-style model directory
(tokenizer.json, tokenizer_config.json, optionally config.json and
generation_config.json). The chat template from tokenizer_config.json is
rendered in a sandboxed jinja2 environment, as transformers does, with
``add_generation_prompt=True``.

Example::

    tok = Tokenizer.from_dir("~/.cache/dspark/models/SmolLM2-135M-Instruct")
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    ids = tok.encode(text)
    tok.decode(ids)
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from dspark.shared.errors import InvalidArgument

ALLOWED_ROLES: tuple[str, ...] = ("system", "user", "assistant")


def _token_content(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or an AddedToken dict."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> list[int]:
    """An eos_token_id field of config.json: int, list of ints or null."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


class TemplateError(InvalidArgument):
    """The chat template refused the conversation (its ``raise_exception``)."""


def _raise_exception(message: str) -> None:
    raise TemplateError("messages", str(message))


def _compile_chat_template(source: str):
    """Compile a chat template in a sandboxed jinja2 environment (as transformers)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, **_: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source)


def validate_roles(messages: Sequence[Mapping[str, Any]]) -> None:
    """Raise InvalidArgument naming ``messages[i].role`` for a role outside ALLOWED_ROLES."""
    if not messages:
        raise InvalidArgument("messages", "must contain at least one message")
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, Mapping) else None
        if role not in ALLOWED_ROLES:
            raise InvalidArgument(
                f"messages[{i}].role",
                f"{role!r} is not allowed; must be one of {', '.join(ALLOWED_ROLES)}")
        content = m.get("content")
        if not isinstance(content, str):
            raise InvalidArgument(f"messages[{i}].content",
                                  f"must be a string, got {type(content).__name__}")


class Tokenizer:
    """Encode/decode and chat templating of one served model.

    ``encode`` adds no special tokens unless tokenizer_config.json says
    ``add_bos_token: true`` (then the BOS token is prepended once, unless the
    text already starts with it, as rendered chat templates often do).
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, *, chat_template: str | None = None,
                 bos_token: str | None = None, eos_token: str | None = None,
                 add_bos: bool = False, extra_eos_token_ids: Iterable[int] = ()) -> None:
        self._tok = tokenizer
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = tokenizer.token_to_id(bos_token) if bos_token else None
        self.add_bos = bool(add_bos) and self.bos_token_id is not None
        eos: list[int] = []
        if eos_token and tokenizer.token_to_id(eos_token) is not None:
            eos.append(tokenizer.token_to_id(eos_token))
        for i in extra_eos_token_ids:
            if i not in eos:
                eos.append(int(i))
        self.eos_token_ids: tuple[int, ...] = tuple(eos)
        self.chat_template = chat_template
        self._template = _compile_chat_template(chat_template) if chat_template else None

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load tokenizer.json + tokenizer_config.json (+ config.json EOS ids) from ``path``."""
        path = Path(path).expanduser()
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in model directory {path}")
        tok = tokenizers.Tokenizer.from_file(str(tok_file))
        cfg = _read_json(path / "tokenizer_config.json")
        template = cfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        extra = (_ids(_read_json(path / "config.json").get("eos_token_id"))
                 + _ids(_read_json(path / "generation_config.json").get("eos_token_id")))
        return cls(tok, chat_template=template or None,
                   bos_token=_token_content(cfg.get("bos_token")),
                   eos_token=_token_content(cfg.get("eos_token")),
                   add_bos=bool(cfg.get("add_bos_token", False)),
                   extra_eos_token_ids=extra)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it map to their ids."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if self.add_bos and not (ids and ids[0] == self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; incomplete UTF-8 decodes to U+FFFD."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Render ``messages`` ({"role", "content"} dicts) with add_generation_prompt=True.

        Raises InvalidArgument for a role other than system/user/assistant
        (naming ``messages[i].role``) or when the template itself refuses the
        conversation; ValueError when the model has no chat template.
        """
        if self._template is None:
            raise ValueError("the model has no chat_template in tokenizer_config.json")
        validate_roles(messages)
        msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
        return self._template.render(
            messages=msgs, add_generation_prompt=True,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "")
