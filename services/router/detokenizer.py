"""Incremental detokenization with stop strings.

Turns the stream of committed token ids of one request into text deltas, the
way vLLM does: keep a ``prefix_offset`` / ``read_offset`` pair into the ids,
decode the short window ``ids[prefix_offset:]`` and emit what it adds beyond
``ids[prefix_offset:read_offset]``. While the window's text ends with U+FFFD
(an incomplete UTF-8 sequence split across byte-level tokens) nothing is
emitted and the offsets stay, so deltas are never broken UTF-8.

Stop strings are matched on the text; text that could still grow into a stop
string is held back, so a stop string split across tokens is never partially
emitted. On a match the text is cut before the stop string.

Example::

    detok = IncrementalDetokenizer(tok, stop=("\\n\\n",), stop_token_ids=tok.eos_token_ids)
    for ids in committed_batches:
        delta, stopped = detok.add(ids)
        send(delta)
        if stopped:
            break
    else:
        send(detok.flush())
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

# Prompt tokens kept in front of the output ids so the first output token
# decodes in context (e.g. a leading-space marker); vLLM uses 5.
INITIAL_OFFSET = 5
_REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Streams text deltas of one request's output tokens.

    Args:
      tokenizer: anything with ``decode(ids, skip_special_tokens)``.
      prompt_ids_tail: the last prompt token ids (context for the first
        output token; only the last INITIAL_OFFSET are used). Never emitted.
      stop: stop strings; the text ends before the earliest match.
      stop_token_ids: ids that end the request (EOS, SamplingParams.stop_token_ids);
        they are not rendered, and nothing after them is.
      skip_special_tokens: drop special tokens from the text.

    After ``add`` returns stopped=True, ``stop_reason`` is the matched stop
    string (str) or token id (int), and further ``add`` calls return ("", True).
    """

    def __init__(self, tokenizer: Decoder, prompt_ids_tail: Sequence[int] = (),
                 stop: Sequence[str] = (), stop_token_ids: Iterable[int] = (),
                 skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._stop = tuple(s for s in stop if s)
        self._max_stop = max((len(s) for s in self._stop), default=0)
        self._stop_ids = frozenset(int(i) for i in stop_token_ids)
        tail = list(prompt_ids_tail)[-INITIAL_OFFSET:]
        self._ids: list[int] = tail  # context tail + output tokens rendered so far
        self._prefix_offset = 0
        self._read_offset = len(tail)
        self._text = ""  # decoded output text (complete UTF-8 only)
        self._emitted = 0  # chars of _text already returned
        self._searched = 0  # chars of _text already searched for stop strings
        self.stopped = False
        self.stop_reason: str | int | None = None
        self.num_tokens = 0  # output tokens seen, stop token included

    @property
    def text(self) -> str:
        """All text returned so far (deltas concatenated)."""
        return self._text[:self._emitted]

    def add(self, token_ids: Iterable[int]) -> tuple[str, bool]:
        """Feed newly committed ids; return (delta_text, stopped)."""
        if self.stopped:
            return "", True
        for tid in token_ids:
            self.num_tokens += 1
            if tid in self._stop_ids:
                self.stopped, self.stop_reason = True, int(tid)
                break
            self._ids.append(int(tid))
            self._decode_step()
            if self._stop and self._match_stop():
                break
        if self.stopped:
            # Cut at a stop string, or ended by a stop token: then what was held
            # back as a possible stop-string prefix is plain text.
            return self._take(len(self._text)), True
        return self._take(len(self._text) - self._holdback()), self.stopped

    def flush(self) -> str:
        """Text still held back when the request ends without a stop match.

        Trailing bytes that never formed a complete UTF-8 character are
        dropped (never emitted as U+FFFD).
        """
        if self.stopped:
            return self._take(len(self._text))
        if self._read_offset < len(self._ids):
            tail = self._decode(self._ids[self._prefix_offset:])
            head = self._decode(self._ids[self._prefix_offset:self._read_offset])
            if len(tail) > len(head):
                self._text += tail[len(head):].rstrip(_REPLACEMENT)
            self._prefix_offset = self._read_offset = len(self._ids)
            if self._stop and self._match_stop():
                return self._take(len(self._text))
        self.stopped = True
        return self._take(len(self._text))

    # -- internals ---------------------------------------------------------

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def _decode_step(self) -> None:
        """Move complete text of the window into _text (vLLM's detokenize_incrementally)."""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT):
            self._text += new_text[len(prefix_text):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)

    def _match_stop(self) -> bool:
        """Cut _text at the earliest stop string in the unsearched part; True on a match."""
        start = max(0, self._searched - self._max_stop + 1)
        best = -1
        for s in self._stop:
            i = self._text.find(s, start)
            if i != -1 and (best == -1 or i < best):
                best, self.stop_reason = i, s
        self._searched = len(self._text)
        if best == -1:
            return False
        # best >= _emitted: text that could start a stop string is never emitted.
        self._text = self._text[:best]
        self.stopped = True
        return True

    def _holdback(self) -> int:
        """Length of the longest suffix of _text that is a proper prefix of a stop string."""
        if self.stopped or not self._stop:
            return 0
        longest = 0
        text = self._text
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def _take(self, upto: int) -> str:
        upto = max(upto, self._emitted)
        delta = self._text[self._emitted:upto]
        self._emitted = upto
        return delta
